"""The README's numbers on the demo are its last run's: docs/results/demo_run.json records `make demo`'s config and every round,
the README quotes `render_markdown` of it, and `recipes.benchmarks.demo_report` writes all of it from a run (issue 27).
No launch: the report is run on the recorded rounds, written back as a run's files."""

import json
import math
import os
import re
import shutil

import pytest
import yaml
from helpers import REPO

from adloco_hf.batch.switch_mode import plan_batch
from recipes.benchmarks import demo_report


def recorded() -> dict:
    with open(os.path.join(REPO, demo_report.RESULTS), encoding="utf-8") as file:
        return json.load(file)


def read(path: str) -> str:
    return open(os.path.join(REPO, path), encoding="utf-8").read()


def test_the_readme_quotes_the_results_file():
    results = recorded()
    assert demo_report.readme_section(read("README.md")) == demo_report.render_markdown(results)
    assert demo_report.highlights(results) == results["highlights"]  # the highlights are the recorded rounds'


def test_the_results_file_is_a_run_of_the_demo_as_make_demo_launches_it():
    results = recorded()
    assert results["config"] == yaml.safe_load(read(demo_report.CONFIG)), "rerun `make demo-report`"
    assert results["workers"] == yaml.safe_load(read(demo_report.ACCELERATE_CONFIG))["num_processes"]
    makefile = re.sub(r"\\\n\s*", "", read("Makefile"))
    assert results["command"] == " ".join(demo_report.DEMO_COMMAND)
    assert re.search(r"^demo:.*\n\t\$\(BIN\)/" + re.escape(results["command"]) + "$", makefile, re.M)
    config, rows = results["config"], results["rounds"]
    assert rows[-1]["global_step"] == config["max_steps"]
    assert rows[-1]["outer_step"] == config["max_steps"] // config["inner_steps"]
    assert {row["instance"] for row in rows if row["outer_step"] == 1} == set(range(config["num_instances"]))


def test_the_recorded_demo_grows_the_batch_switches_mode_and_merges():
    shows_what_adloco_does(recorded())


def shows_what_adloco_does(results: dict) -> None:
    """What the demo is for, in a run's results: each round's micro-batches are switch mode's plan of its request,
    requests grow at least 8-fold, some are capped and some accumulated, before the instances have merged down to one."""
    config, rows, h = results["config"], results["rounds"], results["highlights"]
    limit, gamma = config["max_batch_size"], config["switch_threshold"]
    for row in rows:
        plan = plan_batch(row["batch_size"], limit, gamma)
        assert (row["micro_batch_size"], row["accumulation_steps"]) == (plan.micro_batch_size, plan.accumulation_steps)
    assert h["largest_request"] >= 8 * config["per_device_train_batch_size"]
    assert h["capped_requests"] is not None and h["first_accumulation"] is not None
    assert h["first_accumulation"]["accumulation_steps"] == math.ceil(h["first_accumulation"]["batch_size"] / limit)
    assert [m["instances_after"] for m in h["merges"]] == list(range(config["num_instances"] - 1, 0, -1))
    assert all(m["round"] % config["merge_every"] == 0 for m in h["merges"])
    falls = [m for m in h["merges"] if m["request_after"][0] < m["request_before"][0]]
    assert falls, "preserve_total: a survivor that gains workers runs a smaller per-worker batch"
    assert h["final_perplexity"] < h["first_eval_best_perplexity"]
    # Early enough to be seen: the cap and accumulation come while instances are still merging (the demo of
    # 2026-11-24 stayed in single digits until round 13 of 16, after its last merge at round 6).
    last_merge = h["merges"][-1]["round"]
    assert h["largest_request_round"] <= last_merge and h["first_accumulation"]["outer_step"] <= last_merge


def write_run(results: dict, output_dir) -> None:
    """The recorded rounds and evaluations back as a run's adloco_rounds.jsonl and adloco_eval.jsonl."""
    os.makedirs(output_dir)
    for name, records in (("adloco_rounds.jsonl", results["rounds"]), ("adloco_eval.jsonl", results["evals"])):
        with open(os.path.join(output_dir, name), "w", encoding="utf-8") as file:
            file.writelines(json.dumps(record) + "\n" for record in records)


def test_the_report_writes_the_results_plot_and_readme_section_from_a_run(tmp_path):
    results = recorded()
    write_run(results, tmp_path / "run")
    repo = tmp_path / "repo"
    for path in (demo_report.CONFIG, demo_report.ACCELERATE_CONFIG, "README.md"):
        os.makedirs(repo / os.path.dirname(path), exist_ok=True)
        shutil.copy(os.path.join(REPO, path), repo / path)
    readme = (repo / "README.md").read_text(encoding="utf-8")
    stale = demo_report.replace_readme_section(readme, "3.8 M tokens, perplexity 120.7")
    (repo / "README.md").write_text(stale, encoding="utf-8")

    assert demo_report.main(["--from_run", str(tmp_path / "run"), "--repo", str(repo)]) == 0
    written = json.loads((repo / demo_report.RESULTS).read_text(encoding="utf-8"))
    assert written["rounds"] == results["rounds"] and written["evals"] == results["evals"]
    assert written["highlights"] == results["highlights"]
    assert written["config"] == results["config"]
    assert written["launch_seconds"] is None  # nothing was launched
    assert (repo / demo_report.PLOT).stat().st_size > 10_000
    new_readme = (repo / "README.md").read_text(encoding="utf-8")
    assert demo_report.readme_section(new_readme) == demo_report.render_markdown(written)
    assert "120.7" not in new_readme
    outside = lambda text: text.split(demo_report.README_BEGIN)[0] + text.split(demo_report.README_END)[1]  # noqa: E731
    assert outside(new_readme) == outside(readme)


def test_a_readme_without_the_markers_is_refused_naming_them():
    with pytest.raises(ValueError, match="demo-run:begin"):
        demo_report.readme_section("# adloco_hf\nno demo section\n")

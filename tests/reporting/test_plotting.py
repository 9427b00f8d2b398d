"""`adloco_hf.reporting.plotting`, the run summary and loading it draws on, and `recipes/plot_run.py` on synthetic run logs (no training)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.figure
import matplotlib.image
import pytest

from adloco_hf.reporting.plotting import goodput_series, plot_run
from adloco_hf.reporting.report import format_summary, summarize_run
from adloco_hf.reporting.run_log import load_evals, load_rounds


ROOT = Path(__file__).resolve().parents[2]
SEQ_LEN = 32
BYTES_PER_WORKER = 1_000_000


def synthetic_run() -> tuple[list[dict], list[dict]]:
    """6 rounds of 4 workers: 3 instances; instance 2 merges into 0 after round 2, instance 1 into 0 after 4.

    Instance 1 logs a NaN loss in round 3 (and skips that round); instance 2 has no grad_sq_norm.
    """
    workers = {0: [0, 3], 1: [1], 2: [2]}
    batch = {0: 4, 1: 2, 2: 1}
    merges = {2: (0, [2]), 4: (0, [1])}  # outer_step: (survivor, merged_from)
    rounds, evals, total_tokens = [], [], 0
    for step in range(1, 7):
        lines = []
        for instance in sorted(workers):
            b, w = batch[instance], workers[instance]
            tokens = 10 * b * len(w) * SEQ_LEN
            lines.append(
                {
                    "outer_step": step,
                    "global_step": 10 * step,
                    "instance": instance,
                    "workers": list(w),
                    "batch_size": b,
                    "next_batch_size": 2 * b,
                    "micro_batch_size": min(b, 4),
                    "accumulation_steps": max(1, b // 4),
                    "samples": 10 * b * len(w),
                    "tokens": tokens,
                    "train_loss": float("nan") if (step, instance) == (3, 1) else 5.0 - 0.3 * step + 0.1 * instance,
                    "grad_variance": 1.5,
                    "grad_sq_norm": None if instance == 2 else 0.25,
                    "pseudo_grad_norm": 0.1,
                    "comm_bytes": BYTES_PER_WORKER * len(w) if len(w) > 1 else 0,
                    "comm_seconds": 0.01 * len(w),
                    "merged_from": [],
                    "elapsed_seconds": 12.5 * step + instance,
                    "skipped": (step, instance) == (3, 1),
                }
            )
            total_tokens += tokens
        if step in merges:
            survivor, sources = merges[step]
            next(line for line in lines if line["instance"] == survivor)["merged_from"] = sources
            for source in sources:
                workers[survivor] += workers.pop(source)
                batch.pop(source)
        for instance in sorted(batch):
            batch[instance] *= 2
        for line in lines:
            line["num_instances"] = len(workers)
            line["total_tokens"] = total_tokens
        rounds += lines
        if step % 2 == 0:
            for instance in sorted({line["instance"] for line in lines}):
                loss = 4.0 - 0.2 * step + 0.05 * instance
                evals.append(
                    {
                        "global_step": 10 * step,
                        "outer_step": step,
                        "total_tokens": total_tokens,
                        "instance": instance,
                        "eval_loss": loss,
                        "eval_perplexity": math.exp(loss),
                    }
                )
    evals.append(
        {
            "global_step": 60,
            "outer_step": 6,
            "total_tokens": total_tokens,
            "instance": "merged",
            "eval_loss": 2.7,
            "eval_perplexity": math.exp(2.7),
        }
    )
    return rounds, evals


def write_jsonl(path: Path, records: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records) + tail)


@pytest.fixture
def run_dir(tmp_path):
    rounds, evals = synthetic_run()
    out = tmp_path / "tiny-run"
    out.mkdir()
    # A blank line, and a last line cut in the middle as a crash would leave it.
    truncated = json.dumps(rounds[0])[:40]
    write_jsonl(
        out / "adloco_rounds.jsonl", rounds[:5], "\n" + "".join(json.dumps(r) + "\n" for r in rounds[5:]) + truncated
    )
    write_jsonl(out / "adloco_eval.jsonl", evals)
    return out, rounds, evals


def test_load_skips_blank_and_truncated_last_line(run_dir):
    out, rounds, evals = run_dir
    with pytest.warns(UserWarning, match="truncated last line"):
        loaded = load_rounds(out)
    assert len(loaded) == len(rounds) == 3 + 3 + 2 + 2 + 1 + 1
    assert [(r["outer_step"], r["instance"]) for r in loaded] == [(r["outer_step"], r["instance"]) for r in rounds]
    assert math.isnan(loaded[7]["train_loss"])  # round 3, instance 1
    assert loaded[2]["grad_sq_norm"] is None
    assert load_evals(out) == evals


def test_load_orders_lines_written_by_different_workers(tmp_path):
    rounds, _ = synthetic_run()
    write_jsonl(tmp_path / "adloco_rounds.jsonl", rounds[::-1])
    assert [(r["outer_step"], r["instance"]) for r in load_rounds(tmp_path)] == [
        (r["outer_step"], r["instance"]) for r in rounds
    ]


def test_load_rejects_damage_in_the_middle(tmp_path):
    rounds, _ = synthetic_run()
    write_jsonl(tmp_path / "adloco_rounds.jsonl", rounds[:2], '{"outer_step": 1,\n' + json.dumps(rounds[2]) + "\n")
    with pytest.raises(ValueError, match=r"adloco_rounds.jsonl:3"):
        load_rounds(tmp_path)


def test_missing_files(tmp_path):
    assert load_evals(tmp_path) == []
    with pytest.raises(FileNotFoundError, match="adloco_rounds.jsonl"):
        load_rounds(tmp_path)
    (tmp_path / "adloco_rounds.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no round"):
        summarize_run(tmp_path)


def test_summary_matches_the_lines(run_dir):
    out, rounds, evals = run_dir
    with pytest.warns(UserWarning):
        summary = summarize_run(out)

    assert summary["rounds"] == len({r["outer_step"] for r in rounds}) == 6
    assert summary["global_step"] == 60
    assert summary["initial_instances"] == 3
    assert summary["final_instances"] == 1
    assert summary["merges"] == 2
    assert summary["merge_events"] == [
        {"outer_step": 2, "survivor": 0, "merged_from": [2]},
        {"outer_step": 4, "survivor": 0, "merged_from": [1]},
    ]
    # Start and end: the batches that ran in each instance's first and last round (what switch mode ran: here the
    # requests); next: the request planned after the last round, for the instance that was not merged away.
    assert summary["batch_size_start"] == {0: 4, 1: 2, 2: 1}
    assert summary["batch_size_end"] == {0: 4 * 2**5, 1: 2 * 2**3, 2: 1 * 2}
    assert summary["batch_size_next"] == {0: 2 * 4 * 2**5}
    assert summary["total_tokens"] == sum(r["tokens"] for r in rounds)
    assert summary["total_samples"] == sum(r["samples"] for r in rounds)
    assert summary["comm_bytes"] == sum(r["comm_bytes"] for r in rounds)
    assert summary["comm_seconds"] == pytest.approx(sum(r["comm_seconds"] for r in rounds))
    assert summary["wall_seconds"] == max(r["elapsed_seconds"] for r in rounds)
    assert summary["skipped_rounds"] == 1

    last = [r for r in rounds if r["outer_step"] == 6]
    assert len(last) == 1  # one instance left: its loss
    assert summary["final_train_loss"] == pytest.approx(last[0]["train_loss"])
    assert summary["final_eval_perplexity"] == pytest.approx(math.exp(2.7))
    assert summary["final_eval_instance"] == "merged"
    assert summary["best_eval_perplexity"] == pytest.approx(math.exp(2.7))
    json.dumps(summary)  # plain values only


def test_final_train_loss_is_demand_weighted_and_skips_nan(tmp_path):
    rounds, _ = synthetic_run()
    round_3 = [r for r in rounds if r["outer_step"] == 3]  # instances 0 (2 workers, b=8) and 1 (NaN)
    write_jsonl(tmp_path / "adloco_rounds.jsonl", [r for r in rounds if r["outer_step"] <= 3])
    assert summarize_run(tmp_path)["final_train_loss"] == pytest.approx(round_3[0]["train_loss"])

    round_1 = [r for r in rounds if r["outer_step"] == 1]  # demands 4*2, 2*1, 1*1
    write_jsonl(tmp_path / "adloco_rounds.jsonl", round_1)
    expected = (8 * round_1[0]["train_loss"] + 2 * round_1[1]["train_loss"] + 1 * round_1[2]["train_loss"]) / 11
    summary = summarize_run(tmp_path)
    assert summary["final_train_loss"] == pytest.approx(expected)
    assert summary["final_train_loss"] != pytest.approx(sum(r["train_loss"] for r in round_1) / 3)
    assert summary["final_instances"] == 3 and summary["merges"] == 0
    assert summary["final_eval_perplexity"] is None

    for r in round_1:
        r["train_loss"] = None
    write_jsonl(tmp_path / "adloco_rounds.jsonl", round_1)
    assert summarize_run(tmp_path)["final_train_loss"] is None


def test_final_eval_without_merged_model_is_best_instance_at_last_step(tmp_path):
    rounds, evals = synthetic_run()
    write_jsonl(tmp_path / "adloco_rounds.jsonl", [r for r in rounds if r["outer_step"] <= 2])
    write_jsonl(
        tmp_path / "adloco_eval.jsonl", [e for e in evals if e["global_step"] <= 20 and e["instance"] != "merged"]
    )
    summary = summarize_run(tmp_path)
    assert summary["final_eval_instance"] == 0
    assert summary["final_eval_perplexity"] == pytest.approx(math.exp(4.0 - 0.4))
    assert summary["best_eval_step"] == 20


def test_format_summary(run_dir):
    out, _, _ = run_dir
    with pytest.warns(UserWarning):
        text = format_summary(summarize_run(out))
    lines = text.splitlines()
    assert lines[0] == f"AdLoCo run: {out}"
    assert "3 -> 1 (2 merged away)" in text
    assert "instance 2: 1 -> 2  (merged into 0 at round 2)" in text
    assert "instance 0: 4 -> 128 (next round's request: 256)" in text
    assert "final 14.88 (merged model)" in text
    assert "skipped rounds" in text
    # Every value starts in the same column.
    column = lines[1].index("6 (global step 60)")
    assert all(line[column - 2 : column] == "  " and line[column] != " " for line in lines[1:])


def check_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 20_000
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 400 and image.shape[1] > 400
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_plot_run(run_dir):
    out, _, _ = run_dir
    with pytest.warns(UserWarning):
        written = plot_run(out)
    assert written == str(out / "adloco_run.png")
    check_png(out / "adloco_run.png")


def test_plot_run_one_instance_no_eval_nan_losses(tmp_path):
    rounds, _ = synthetic_run()
    only = [dict(r, workers=[0], num_instances=1, merged_from=[], comm_bytes=0) for r in rounds if r["instance"] == 0]
    for r in only[:2]:
        r["train_loss"] = float("nan")
    write_jsonl(tmp_path / "adloco_rounds.jsonl", only)
    target = tmp_path / "plots" / "one.png"
    assert plot_run(tmp_path, target) == str(target)
    check_png(target)

    for r in only:
        r["train_loss"] = None
    write_jsonl(tmp_path / "adloco_rounds.jsonl", only)
    check_png(Path(plot_run(tmp_path)))


def test_plot_run_draws_the_goodput_of_each_choice_and_of_keeping_the_batch(tmp_path, monkeypatch):
    rounds, _ = synthetic_run()
    only = [dict(r, workers=[0], num_instances=1, merged_from=[], comm_bytes=0) for r in rounds if r["instance"] == 0]
    for step, r in enumerate(only, start=1):
        r.update(goodput=100.0 + step, goodput_kept=90.0 + step, total_tokens=1000 * step)
    only[1].pop("goodput")  # a round without a noise scale yet logs none
    series = goodput_series({0: only}, {r["outer_step"]: r["total_tokens"] for r in only})
    assert series == {0: ([1000, 3000, 4000, 5000, 6000], [101, 103, 104, 105, 106], [91, 93, 94, 95, 96])}
    assert goodput_series({0: rounds[:1]}, {1: 10.0}) == {}  # another target: nothing to draw
    write_jsonl(tmp_path / "adloco_rounds.jsonl", only)
    saved = []
    original = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), original(fig, *a, **k))
    )
    check_png(Path(plot_run(tmp_path)))
    # Panel (b)'s second axis draws both predictions against the tokens.
    (axis,) = [ax for ax in saved[0].axes if ax.get_ylabel().startswith("predicted goodput")]
    drawn = [(list(line.get_xdata()), list(line.get_ydata())) for line in axis.get_lines()]
    xs, chosen, kept = series[0]
    assert drawn == [(xs, chosen), (xs, kept)]


def test_cli(run_dir, tmp_path):
    out, _, _ = run_dir
    target = tmp_path / "cli.png"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, str(ROOT / "recipes" / "plot_run.py"), str(out), "--out", str(target)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "AdLoCo run:" in result.stdout and "3 -> 1" in result.stdout
    assert str(target) in result.stdout
    assert "truncated last line" in result.stderr
    check_png(target)

    missing = subprocess.run(
        [sys.executable, str(ROOT / "recipes" / "plot_run.py"), str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert missing.returncode != 0
    assert "adloco_rounds.jsonl" in missing.stderr


def preserve_total_run() -> list[dict]:
    """2 workers, 2 instances of 8 samples per worker; they merge after round 2 and, with
    `merge_batch_rule="preserve_total"`, the survivor keeps its 8 samples per inner step over its 2 workers (4 each);
    then the test grows its request to 5 per worker (round 4)."""
    rounds = []
    for step in range(1, 5):
        if step <= 2:
            table = [(0, [0], 8, [8]), (1, [1], 8, [8])]
        else:
            table = [(0, [0, 1], 4 + step - 3, [4 + step - 3] * 2)]
        for instance, workers, request, sizes in table:
            rounds.append(
                {
                    "outer_step": step, "global_step": 10 * step, "instance": instance, "workers": workers,
                    "batch_size": request, "next_batch_size": request, "samples": 10 * sum(sizes),
                    "inner_steps": 10, "worker_batch_sizes": sizes, "tokens": 320 * sum(sizes),
                    "total_tokens": 10_000 * step, "train_loss": 5.0 - 0.1 * step, "comm_bytes": 1000 * len(workers),
                    "merged_from": [1] if (step, instance) == (2, 0) else [], "num_instances": 1 if step >= 2 else 2,
                }
            )  # fmt: skip
    return rounds


def test_the_plot_draws_an_instances_whole_batch_so_a_merge_is_no_shrink(tmp_path, monkeypatch):
    """Issue 41: after a `preserve_total` merge the per-worker request fell 8 → 4 and the plot showed it as a batch
    that shrank; its ticks fell on 4.5 samples; the instance count took a quarter of the figure."""
    write_jsonl(tmp_path / "adloco_rounds.jsonl", preserve_total_run())
    saved = []
    original = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), original(fig, *a, **k))
    )
    check_png(Path(plot_run(tmp_path)))
    fig = saved[0]
    (batch,) = [ax for ax in fig.axes if ax.get_title().startswith("(a)")]
    survivor = next(line for line in batch.get_lines() if line.get_label() == "instance 0")
    assert list(survivor.get_ydata()) == [8, 8, 8, 8, 10]  # its whole batch: no drop at the merge
    dashed = [list(line.get_ydata()) for line in batch.get_lines() if line.get_linestyle() == "--"]
    assert dashed == [[8, 8, 8, 4, 5]]  # and its request per worker, which the merge halved
    ticks = [tick for tick in batch.get_yticks() if batch.get_ylim()[0] <= tick <= batch.get_ylim()[1]]
    assert ticks and all(float(tick).is_integer() for tick in ticks), ticks
    (count,) = [ax for ax in fig.axes if ax.get_title().startswith("(c) number of instances")]
    box = count.get_position()
    assert box.width * box.height < 0.15, box  # a strip, not a quarter of the figure

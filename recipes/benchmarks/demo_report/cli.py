"""`python -m recipes.benchmarks.demo_report`: the demo launched as `make demo` launches it (or `--from_run`), then
the results file, the plot and the README's paragraph."""

import argparse
import os
import shutil
import subprocess
import sys
import time

import yaml

from adloco_hf.inspection import atomic_write_text, plot_run
from recipes.benchmarks.demo_report.markdown import README, render_markdown, replace_readme_section
from recipes.benchmarks.demo_report.results import (
    ACCELERATE_CONFIG,
    CONFIG,
    DEMO_COMMAND,
    PLOT,
    RESULTS,
    build_results,
    dump,
)
from recipes.benchmarks.toolkit.paths import REPO


__all__ = ["launch_demo", "main", "parse_args"]

DESCRIPTION = (
    "Run the demo (`make demo`) and write down what it did: docs/results/demo_run.json and .png, the README's lines."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument(
        "--from_run", default=None, help="a finished demo's output_dir: write the files from it instead of launching"
    )
    parser.add_argument("--repo", default=REPO, help=argparse.SUPPRESS)  # where docs/ and README.md are (tests)
    return parser.parse_args(argv)


def launch_demo(repo: str) -> float:
    """`make demo`'s launch into a fresh outputs/demo; the wall seconds it took."""
    with open(os.path.join(repo, CONFIG), encoding="utf-8") as file:
        output_dir = os.path.join(repo, yaml.safe_load(file)["output_dir"])
    if os.path.isdir(output_dir):
        print(f"removing the previous demo run {output_dir}", flush=True)
        shutil.rmtree(output_dir)
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    command = [accelerate if os.path.exists(accelerate) else "accelerate", *DEMO_COMMAND[1:]]
    print("running", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=repo, check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Launch the demo (or read `--from_run`), then write the results file, the plot and the README's paragraph."""
    args = parse_args(argv)
    repo = args.repo
    with open(os.path.join(repo, CONFIG), encoding="utf-8") as file:
        config = yaml.safe_load(file)
    with open(os.path.join(repo, ACCELERATE_CONFIG), encoding="utf-8") as file:
        workers = yaml.safe_load(file)["num_processes"]
    launch_seconds = None
    output_dir = args.from_run
    if output_dir is None:
        launch_seconds = launch_demo(repo)
        output_dir = os.path.join(repo, config["output_dir"])
    results = build_results(output_dir, config, launch_seconds=launch_seconds, workers=workers)
    os.makedirs(os.path.join(repo, os.path.dirname(RESULTS)), exist_ok=True)
    atomic_write_text(os.path.join(repo, RESULTS), dump(results))
    plot_run(output_dir, os.path.join(repo, PLOT))
    readme = os.path.join(repo, README)
    with open(readme, encoding="utf-8") as file:
        text = file.read()
    section = render_markdown(results)
    with open(readme, "w", encoding="utf-8") as file:
        file.write(replace_readme_section(text, section))
    print(section)
    print(f"wrote {RESULTS}, {PLOT} and the demo section of {README}")
    return 0

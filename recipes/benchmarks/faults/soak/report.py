"""Each kill measured (the step reached, the step resumed from, the steps redone, the seconds to the first new step),
the run summarised against the uninterrupted one, and the plot of both runs' steps against time."""

import os
import statistics

import torch

from recipes.benchmarks.faults.progress import Progress
from recipes.benchmarks.faults.soak.soak import Launch
from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.resumed_runs import compared_rounds, merged_weights


__all__ = ["flat_merged", "measure_kills", "plot", "summarize"]


def measure_kills(kills: list[dict], progress: Progress) -> list[dict]:
    """Per kill: the step reached, the step resumed from, the steps redone and the seconds to the first new step."""
    rows = []
    for kill in kills:
        attempt = kill["attempt"]
        reached = progress.reached(attempt)  # kills come after an attempt's first step: never None
        starts = progress.starts.get(attempt + 1, {})
        resumed = min(starts.values()) if starts else None
        first = progress.first_step_time(attempt + 1)
        rows.append(
            {
                **kill,
                "reached_step": reached,
                "resumed_from": resumed,
                "steps_redone": None if resumed is None else reached - resumed,
                "seconds_to_first_step": None if first is None else first - kill["time"],
            }
        )
    return rows


def flat_merged(out: str) -> torch.Tensor | None:
    """The run's merged model, flat (`toolkit.resumed_runs.merged_weights`); None when the run wrote none."""
    return merged_weights(out) if os.path.isdir(os.path.join(out, "merged")) else None


def summarize(rows: list[dict], soak_run: Launch, reference: Launch, save_steps: int) -> dict:
    seconds = [r["seconds_to_first_step"] for r in rows if r["seconds_to_first_step"] is not None]
    redone = [r["steps_redone"] for r in rows if r["steps_redone"] is not None]
    ours, theirs = flat_merged(soak_run.out), flat_merged(reference.out)
    diff = None if ours is None or theirs is None else (ours - theirs).abs().max().item()
    rounds, reference_rounds = compared_rounds(soak_run.out), compared_rounds(reference.out)
    return {
        "kills": len(rows),
        "restarts": soak_run.progress.attempt(),
        "mean_seconds_to_first_step": statistics.fmean(seconds) if seconds else None,
        "max_seconds_to_first_step": max(seconds, default=None),
        "mean_steps_redone": statistics.fmean(redone) if redone else None,
        "max_steps_redone": max(redone, default=None),
        "checkpoint_interval_steps": save_steps,
        "merged_max_difference": diff,
        "merged_equal": diff is not None and diff <= 1e-6,
        "rounds_equal": bool(rounds) and rounds == reference_rounds,
        "rounds": len(rounds),
        "finished_by_itself": soak_run.finished(),
        "exit_code": soak_run.result.returncode,
        "seconds": soak_run.result.seconds,
        "uninterrupted_seconds": reference.result.seconds,
    }


def plot(soak_run: Launch, reference: Launch, rows: list[dict], path: str, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for run, label, style in ((reference, "uninterrupted", "--"), (soak_run, "with kills", "-")):
        points = run.progress.timeline()
        ax.plot(
            [t - run.started for t, _ in points], [s for _, s in points], style, label=label, drawstyle="steps-post"
        )
    for row in rows:
        ax.axvline(row["time"] - soak_run.started, color="tab:red", alpha=0.6, linewidth=1)
        ax.annotate(f"kill rank {row['rank']}", (row["time"] - soak_run.started, row["reached_step"]),
                    textcoords="offset points", xytext=(3, 4), fontsize=8, color="tab:red")  # fmt: skip
    ax.set_xlabel("seconds since the launch")
    ax.set_ylabel("inner step completed (furthest worker)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right")
    save_figure(fig, path)

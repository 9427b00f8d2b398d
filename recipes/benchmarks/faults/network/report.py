"""The network faults' table and figure (pure but for the plot): one row per scenario, the targets checked, and a timeline of
every scenario's steps with its faults shaded."""

import re

from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.results import table


DOC_BEGIN = "<!-- netfaults:begin: written by `faults network --doc` from docs/results/netfaults.json; do not edit -->"
DOC_END = "<!-- netfaults:end -->"


__all__ = [
    "COLUMNS",
    "DETECTION_TARGET_SECONDS",
    "DOC_BEGIN",
    "DOC_END",
    "TOLERANCE",
    "check_targets",
    "doc_section",
    "format_report",
    "plot",
    "rows",
    "write_doc",
]

TOLERANCE = 1e-6  # the merged model against the uninterrupted run's
DETECTION_TARGET_SECONDS = 60.0  # a dead link named within a minute (issue 42)
COLUMNS = [
    "scenario",
    "launcher",
    "what the user saw",
    "restarts",
    "s to named",
    "s to first step",
    "work lost (steps)",
    "merged vs uninterrupted",
    "ended by itself",
]


def _user_saw(result: dict) -> str:
    if result.get("error"):
        return f"BENCHMARK ERROR: {result['error'][:100]}"
    message = result.get("message")
    if message is None:
        text = "nothing: the run rode it out" if not result.get("restarts") else "a restart, no named worker"
    else:
        message = re.sub(r"\b(?:\w+\.)+(\w+Error)\b", r"\1", message)  # the class, not its module path
        text = message if len(message) <= 110 else message[:107] + "..."
    if result.get("restarts"):
        text += f" -> {result['restarts']} restart(s), resumed from checkpoint-{result.get('resumed_from')}"
    failed = [code for code in result.get("exit_codes", []) if code]
    if failed:  # the launchers gave up (their restarts spent): a person must resume it
        text += f" -> the launches failed (exit codes {result['exit_codes']})"
        if result.get("merged_max_difference") is None:
            text += ", no merged model"
        else:
            text += " after training"
    return text


def _merged(result: dict) -> str:
    diff = result.get("merged_max_difference")
    if diff is None:
        return "no merged model"
    verdict = "equal" if diff <= TOLERANCE else "differs"
    explained = result.get("difference_explained")
    return f"{diff:.2e} ({verdict}{': ' + explained if explained and diff > TOLERANCE else ''})"


def rows(results: list[dict]) -> list[dict]:
    return [
        {
            "scenario": r["scenario"],
            "launcher": r.get("launcher"),
            "what the user saw": _user_saw(r),
            "restarts": r.get("restarts"),
            "s to named": r.get("detected_seconds"),
            "s to first step": r.get("first_step_seconds"),
            "work lost (steps)": r.get("work_lost_steps"),
            "merged vs uninterrupted": _merged(r),
            "ended by itself": "yes" if r.get("ended_by_itself") else "NO",
        }
        for r in results
    ]


def check_targets(results: list[dict], checkpoint_interval: int) -> list[dict]:
    """Per scenario, the issue's targets that apply to it: it ended by itself; work lost <= one checkpoint
    interval; the merged model within `TOLERANCE` of the uninterrupted run's (unless the scenario changes the data a
    worker saw: explained); a worker lost for good or for longer than worker_timeout named within
    `DETECTION_TARGET_SECONDS`; a fault shorter than worker_timeout costs no restart."""
    checks = []
    for r in results:
        expect = r.get("expect")
        items = [("ended by itself", bool(r.get("ended_by_itself")))]
        lost = r.get("work_lost_steps")
        items.append(("work lost <= one checkpoint interval", lost is not None and lost <= checkpoint_interval))
        diff = r.get("merged_max_difference")
        if r.get("difference_explained") is None:
            items.append(("merged model within 1e-6", diff is not None and diff <= TOLERANCE))
        if expect in ("restart", "elastic"):
            seconds = r.get("detected_seconds")
            items.append(("named within 60 s", seconds is not None and seconds <= DETECTION_TARGET_SECONDS))
        if expect == "no_restart":
            items.append(("no restart", r.get("restarts") == 0))
        checks += [{"scenario": r["scenario"], "target": name, "holds": holds} for name, holds in items]
    return checks


def format_report(results: list[dict], checks: list[dict], settings: dict) -> str:
    lines = [table(rows(results), COLUMNS), ""]
    lines.append(
        "s to named: from the fault to the first log line naming a lost worker (WorkerTimeoutError). s to first step: "
        "from the fault to the first step of the restarted attempt, or without a restart to the first round's end "
        "completed after it. work lost: steps trained again after the restarts. merged vs uninterrupted: the largest "
        "difference of the final merged model from the same run's without the fault."
    )
    lines.append(
        f"settings: {settings.get('workers')} machines at {settings.get('bandwidth')} per link, worker_timeout "
        f"{settings.get('worker_timeout')} s, checkpoints every {settings.get('save_steps')} steps"
    )
    verdict = {True: "holds", False: "MISSED"}
    for check in checks:
        lines.append(f"target {check['scenario']}: {check['target']}: {verdict[check['holds']]}")
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> str:
    """Each scenario's furthest step against seconds since its launch, the faults shaded."""
    plt = pyplot()
    shown = [r for r in results if r.get("timeline")]
    fig, axes = plt.subplots(len(shown) or 1, 1, figsize=(9, 1.9 * max(1, len(shown))), squeeze=False)
    for ax, r in zip(axes[:, 0], shown):
        seconds, steps = zip(*r["timeline"])
        ax.plot(seconds, steps, drawstyle="steps-post", color="tab:blue", label="this run")
        reference = r.get("reference_timeline")
        if reference:
            ax.plot(*zip(*reference), drawstyle="steps-post", color="tab:gray", linestyle="--", label="uninterrupted")
        for start, end in r.get("fault_spans", []):
            ax.axvspan(start, end if end is not None else max(seconds), color="tab:red", alpha=0.2)
        ax.set_title(f"{r['scenario']}: {r.get('what', '')}", fontsize=8)
        ax.set_ylabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel("seconds since the launch (red: the link fault)")
    if shown:
        axes[0, 0].legend(fontsize=7, loc="lower right")
    return save_figure(fig, path)


def doc_section(report: dict) -> str:
    """The docs page's table, its settings and the targets that missed, from `netfaults.json` alone."""
    settings, results = report["settings"], report["scenarios"]
    missed = [f"{c['scenario']}: {c['target']}" for c in report["checks"] if not c["holds"]]
    lines = [
        table(rows(results), COLUMNS),
        "",
        f"{settings['workers']} machines at {settings['bandwidth']} per link, worker_timeout "
        f"{settings['worker_timeout']:g} s, ddp_timeout {settings['ddp_timeout']:g} s (the peer watch off; "
        "`*_defaults`: the library's default timeouts, worker_timeout 1800 s and peer_timeout 45 s), a checkpoint every "
        f"{settings['save_steps']} steps; {len(results)} scenarios, "
        f"{sum(c['holds'] for c in report['checks'])} of {len(report['checks'])} targets hold.",
    ]
    if missed:
        lines.append("Missed: " + "; ".join(missed) + ".")
    lines += ["", "The scenarios:", ""]
    lines += [f"- `{r['scenario']}` ({r.get('launcher')}): {r.get('what')}" for r in results]
    return "\n".join(lines)


def write_doc(path: str, report: dict) -> None:
    """Replace the text between `DOC_BEGIN` and `DOC_END` of `path` with `doc_section(report)`."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if DOC_BEGIN not in text or DOC_END not in text:
        raise ValueError(
            f"{path} has no network faults section: put the lines {DOC_BEGIN!r} and {DOC_END!r} around it"
        )
    head, rest = text.split(DOC_BEGIN, 1)
    tail = rest.split(DOC_END, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{DOC_BEGIN}\n{doc_section(report)}\n{DOC_END}{tail}")

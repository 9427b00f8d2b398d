"""Fault injection: what each failure does to a real 2-worker AdLoCo run, and whether resuming gives the same model.

Every scenario launches real CPU workers (`accelerate launch --multi_gpu`, gloo) running the test suite's fault-
injecting worker (`tests/scripts/adloco_worker.py`: a tiny Llama with attention dropout, 2 instances that merge,
growing batches, per-worker learning rates), breaks something, then resumes where the library says to, and compares
the final merged model with an uninterrupted run's. Prints one table and writes `faults.json` and `faults.png`.

    python -m recipes.benchmarks.faults                       # every scenario (~10 min on 2 cores)
    python -m recipes.benchmarks.faults --scenarios sigterm_round_end,kill_all --output_dir outputs/faults

Columns: the outcome (what the user sees), the work lost (inner steps every worker has to train again after the
resume) and whether the resumed run ends with the uninterrupted run's merged model (max difference ≤ 1e-6).
"""

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from transformers import AutoModelForCausalLM

from adloco_hf.testing import launch_command, run_workers
from recipes.benchmarks._common import table, write_json


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "scripts", "adloco_worker.py")
CONFIG = dict(
    max_steps=30, inner_steps=5, save_steps=10, num_instances=2, merge_every=4, per_device_train_batch_size=2,
    max_batch_size=4, eta=0.5, seed=3, optim="adamw_torch", learning_rate=3e-3, lr_batch_scaling="sqrt",
    worker_timeout=10,
)  # fmt: skip


@dataclass
class Outcome:
    scenario: str
    what: str
    outcome: str
    work_lost_steps: int | None
    resumed_equal: bool | None
    max_difference: float | None
    seconds: float


def launch(out: str, probe: str, *, config: dict | None = None, timeout: int = 300, **extra) -> tuple[bool, str]:
    """One launch of 2 workers; (succeeded, the workers' output)."""
    spec = {
        "output_dir": out,
        "world_size": 2,
        "probe_dir": probe,
        "config": {"output_dir": out, **CONFIG, **(config or {})},
        "dropout": 0.1,
        **extra,
    }
    command = launch_command(WORKER, json.dumps(spec), num_processes=2)
    tests = os.path.join(REPO, "tests")
    result = run_workers(command, timeout=timeout, cwd=REPO, pythonpath=[REPO, tests], threads=1, check=False)
    return result.returncode == 0, result.stdout + result.stderr


def merged(out: str) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "merged"))
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def checkpoints(out: str) -> list[int]:
    if not os.path.isdir(out):
        return []
    return sorted(int(n.split("-")[1]) for n in os.listdir(out) if n.startswith("checkpoint-") and n[11:].isdigit())


def first_line(output: str, *needles: str) -> str:
    """The first output line holding one of `needles` (what the user reads), shortened for the table."""
    for line in output.splitlines():
        if any(n in line for n in needles):
            text = line.split("]: ", 1)[-1].strip()
            return text if len(text) <= 110 else text[:107] + "..."
    return "(no such line)"


class Bench:
    def __init__(self, root: str):
        self.root = root
        self.reference: torch.Tensor | None = None

    def folder(self, name: str) -> str:
        path = os.path.join(self.root, name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    def uninterrupted(self, config: dict | None = None) -> torch.Tensor:
        key = json.dumps(config or {}, sort_keys=True)
        cache = getattr(self, "_references", {})
        if key not in cache:
            out = self.folder(f"uninterrupted-{len(cache)}")
            ok, output = launch(out, out + "-probe", config=config)
            if not ok:
                raise RuntimeError(f"the uninterrupted run failed:\n{output[-3000:]}")
            cache[key] = merged(out)
            self._references = cache
        return cache[key]

    def resume_and_compare(self, out: str, checkpoint: str | bool, config: dict | None = None) -> tuple[bool, float]:
        ok, output = launch(out, out + "-probe-resume", config=config, resume=checkpoint)
        if not ok:
            raise RuntimeError(f"the resumed run failed:\n{output[-3000:]}")
        difference = (merged(out) - self.uninterrupted(config)).abs().max().item()
        return difference <= 1e-6, difference


def scenario_kill_all(bench: Bench) -> Outcome:
    out = bench.folder("kill_all")
    _, output = launch(out, out + "-probe", fail=["all", 12, 9])
    last = checkpoints(out)[-1]
    equal, diff = bench.resume_and_compare(out, True)
    return Outcome("kill_all", "kill -9 of every worker at step 12", f"exit; checkpoint-{last} intact", 12 - last,
                   equal, diff, 0.0)  # fmt: skip


def scenario_kill_one(bench: Bench) -> Outcome:
    out = bench.folder("kill_one")
    # probes=False: the test probes' own per-step gathers would meet the lost worker before the library does.
    _, output = launch(out, out + "-probe", fail=[1, 12, 9], probes=False)
    message = first_line(output, "WorkerTimeoutError", "did not arrive")
    last = checkpoints(out)[-1]
    equal, diff = bench.resume_and_compare(out, True)
    return Outcome("kill_one", "kill -9 of rank 1 at step 12", message, 12 - last, equal, diff, 0.0)


def scenario_kill_in_save(bench: Bench) -> Outcome:
    out = bench.folder("kill_in_save")
    launch(out, out + "-probe", kill_in_save=20)
    last = checkpoints(out)[-1]
    equal, diff = bench.resume_and_compare(out, True)
    leftovers = [n for n in os.listdir(out) if n.startswith(".tmp-")]
    return Outcome("kill_in_save", "rank 0 killed while writing checkpoint-20",
                   f"checkpoint-{last} intact, staging {'left' if leftovers else 'none'}", 20 - last, equal, diff, 0.0)  # fmt: skip


def scenario_kill_in_merged_save(bench: Bench) -> Outcome:
    out = bench.folder("kill_in_merged_save")
    launch(out, out + "-probe", kill_in_merged_save=True)
    last = checkpoints(out)[-1]
    equal, diff = bench.resume_and_compare(out, True)
    trained_again = checkpoints(out)[-1] != last
    return Outcome("kill_in_merged_save", "rank 0 killed inside the final merged/ save",
                   f"resume from checkpoint-{last} only finishes" + (" (TRAINED AGAIN)" if trained_again else ""),
                   0, equal, diff, 0.0)  # fmt: skip


def _sigterm(bench: Bench, name: str, what: str, sigterm: list, config: dict | None = None, **extra) -> Outcome:
    out = bench.folder(name)
    _, output = launch(out, out + "-probe", config=config, sigterm=sigterm, **extra)
    message = first_line(output, "training was preempted")
    last = checkpoints(out)[-1]
    signal_step = sigterm[1] + 1
    equal, diff = bench.resume_and_compare(out, os.path.join(out, f"checkpoint-{last}"), config=config)
    return Outcome(name, what, message, max(signal_step - last, 0), equal, diff, 0.0)


def scenario_sigterm_round_end(bench: Bench) -> Outcome:
    return _sigterm(bench, "sigterm_round_end", "SIGTERM to rank 1 at step 12 (round ends at 15)", [1, 12, "self"])


def scenario_sigterm_launcher(bench: Bench) -> Outcome:
    return _sigterm(bench, "sigterm_launcher", "SIGTERM to accelerate launch at step 12", [0, 12, "launcher"])


def scenario_sigterm_cut(bench: Bench) -> Outcome:
    config = {"inner_steps": 10, "preemption_grace_seconds": 0}
    return _sigterm(bench, "sigterm_cut", "SIGTERM, no grace: cut inside the round (H=10)", [0, 12, "self"],
                    config=config, probes=False, preemption_poll=0)  # fmt: skip


def scenario_changed_settings(bench: Bench) -> Outcome:
    out = bench.folder("changed_settings")
    launch(out, out + "-probe", fail=["all", 12, 9])
    ok, output = launch(out, out + "-probe-resume", config={"inner_steps": 4, "save_steps": 8}, resume=True)
    message = first_line(output, "inner_steps was")
    return Outcome("changed_settings", "resume with inner_steps 5 → 4",
                   ("RESUMED" if ok else "refused: ") + ("" if ok else message), None, None, None, 0.0)  # fmt: skip


def scenario_truncated_checkpoint(bench: Bench) -> Outcome:
    out = bench.folder("truncated_checkpoint")
    launch(out, out + "-probe", fail=["all", 22, 9])
    newest = os.path.join(out, f"checkpoint-{checkpoints(out)[-1]}", "model.safetensors")
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)
    previous = checkpoints(out)[-2]
    equal, diff = bench.resume_and_compare(out, True)
    return Outcome("truncated_checkpoint", "newest model.safetensors truncated, resume=True",
                   f"checkpoint-20 skipped (named), resumed from checkpoint-{previous}", 22 - previous, equal, diff,
                   0.0)  # fmt: skip


def scenario_deleted_rank_state(bench: Bench) -> Outcome:
    out = bench.folder("deleted_rank_state")
    launch(out, out + "-probe", fail=["all", 12, 9])
    os.remove(os.path.join(out, "checkpoint-10", "adloco", "rank-1.pt"))
    ok, output = launch(out, out + "-probe-resume", resume=os.path.join(out, "checkpoint-10"))
    message = first_line(output, "rank-1.pt")
    return Outcome("deleted_rank_state", "checkpoint-10/adloco/rank-1.pt deleted", ("RESUMED" if ok else message),
                   None, None, None, 0.0)  # fmt: skip


def scenario_hang_in_save(bench: Bench) -> Outcome:
    out = bench.folder("hang_in_save")
    _, output = launch(out, out + "-probe", hang_in_save=[1, 20], timeout=240)
    message = first_line(output, "WorkerTimeoutError", "did not arrive")
    last = checkpoints(out)[-1]
    equal, diff = bench.resume_and_compare(out, True)
    return Outcome("hang_in_save", "rank 1 hangs inside the checkpoint-20 save", message, 20 - last, equal, diff, 0.0)


def scenario_disk_full(bench: Bench) -> Outcome:
    out = bench.folder("disk_full")
    _, output = launch(out, out + "-probe", disk_full=[1, 20, "torch.save"])
    message = first_line(output, "No space", "disk", "free")
    last = checkpoints(out)[-1]
    equal, diff = bench.resume_and_compare(out, True)
    return Outcome(
        "disk_full", "rank 1's disk is full at the checkpoint-20 save", message, 20 - last, equal, diff, 0.0
    )


def scenario_nan_worker(bench: Bench) -> Outcome:
    out = bench.folder("nan_worker")
    config = {"merge_every": 3, "max_steps": 40}  # more than max_skipped_rounds (3) rounds after the merge
    ok, output = launch(out, out + "-probe", nan=[1, 0, "onwards"], probes=False, config=config)
    message = first_line(output, "SkippedRoundsError:")
    return Outcome("nan_worker", "rank 1 NaN for the whole run", ("COMPLETED" if ok else message), None, None, None,
                   0.0)  # fmt: skip


SCENARIOS: dict[str, Callable[[Bench], Outcome]] = {
    name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")
}


def plot(outcomes: list[Outcome], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(outcomes) + 1.2))
    names = [o.scenario for o in outcomes]
    lost = [o.work_lost_steps if o.work_lost_steps is not None else 0 for o in outcomes]
    colors = [
        "tab:green" if o.resumed_equal else ("tab:gray" if o.resumed_equal is None else "tab:red") for o in outcomes
    ]
    ax.barh(names, lost, color=colors)
    ax.invert_yaxis()
    ax.set_xlabel("inner steps trained again after the resume (green: same merged model as uninterrupted)")
    ax.set_title("AdLoCo under faults: 2 CPU workers, 30 steps, rounds of 5, checkpoints every 10")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--output_dir", default="outputs/faults")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    os.makedirs(args.output_dir, exist_ok=True)
    bench = Bench(os.path.join(args.output_dir, "runs"))
    outcomes = []
    for index, name in enumerate(names, 1):
        print(f"[{index}/{len(names)}] {name} ...", flush=True)
        started = time.time()
        try:
            outcome = SCENARIOS[name](bench)
        except Exception as error:  # a scenario that breaks is a finding, not the end of the benchmark
            outcome = Outcome(name, name, f"BENCHMARK ERROR: {str(error).splitlines()[0][:100]}", None, False, None, 0)
        outcome.seconds = round(time.time() - started, 1)
        outcomes.append(outcome)
        print(f"    {outcome.outcome} ({outcome.seconds:.0f} s)", flush=True)
    rows = [
        {
            "scenario": o.scenario,
            "what": o.what,
            "outcome": o.outcome,
            "work lost (steps)": "-" if o.work_lost_steps is None else o.work_lost_steps,
            "resumed = uninterrupted": "n/a" if o.resumed_equal is None else ("yes" if o.resumed_equal else "NO"),
        }
        for o in outcomes
    ]
    print(table(rows, list(rows[0])))
    write_json(
        os.path.join(args.output_dir, "faults.json"), {"config": CONFIG, "scenarios": [asdict(o) for o in outcomes]}
    )
    plot(outcomes, os.path.join(args.output_dir, "faults.png"))
    print(f"wrote {args.output_dir}/faults.json and faults.png")


if __name__ == "__main__":
    main()

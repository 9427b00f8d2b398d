"""The virtual clock against a GPU run (`device_profile/replay.py`): the fit recovers what made the runs, the replay
prices each round with the clock's own code, and the committed H200 launches replay."""

import json
import os

import pytest
from helpers import REPO

from recipes.benchmarks.device_profile import replay
from recipes.benchmarks.toolkit.clock.link_model import Link, control_seconds, ring_all_reduce_seconds


H200_RESULTS = os.path.join(REPO, "docs", "results", "gpu", "nvidia-h200-2026-11-27")
ALPHA, BETA, OUTER, BITS, H, PARAMETERS = 0.030, 0.004, 0.2, 20e9, 5, 1_000_000


def synthetic_run(instances: list[list[int]], batches: list[int], rounds: int, merge: tuple[int, float] | None = None):
    """A launch of 4 workers whose seconds follow the clock's model exactly: passes α + β b, the round end's local
    work, the ring all-reduce of the float32 payload on a link of BITS, in round `merge[0]` instance 0's transfer
    of `merge[1]` bytes; every worker waits for the slowest."""
    link, payload = Link(BITS, replay.LATENCY), 4.0 * PARAMETERS
    marks: dict[int, list] = {w: [] for w in range(4)}  # one mark at each round's end
    rows: dict[int, list[dict]] = {}
    for r in range(1, rounds + 1):
        inner = {}
        for i, (workers, b) in enumerate(zip(instances, batches)):
            m = len(workers)
            rows.setdefault(r, []).append({"outer_step": r, "instance": i, "workers": workers, "batch_size": b,
                                           "worker_batch_sizes": [b] * m, "accumulation_steps": 1,
                                           "comm_bytes": 2 * (m - 1) * payload, "merge_seconds": 0.0})  # fmt: skip
            sent = merge[1] if merge is not None and merge[0] == r and i == 0 else 0.0
            if sent:
                rows[r][-1].update(merge_seconds=1.0, comm_bytes=rows[r][-1]["comm_bytes"] + sent)
            transfer = link.latency_seconds + link.seconds(sent) if sent else 0.0
            for w in workers:
                rest = OUTER + ring_all_reduce_seconds(payload, m, link) + control_seconds(4, link) + transfer
                inner[w] = (H * (ALPHA + BETA * b), rest)
        end = max(a + e for a, e in inner.values())
        for w, (a, _) in inner.items():
            last = marks[w][-1] if marks[w] else [0, 0.0, 0.0, 0.0]
            marks[w].append([r * H, last[1] + end, 0.0, last[3] + a])
    return {"result": {"round_marks_per_rank": [marks[w] for w in range(4)]}, "inner_steps": H, "rounds": rows,
            "payload": payload, "world": 4}  # fmt: skip


def test_the_fit_recovers_the_model_that_made_the_runs_and_the_replay_prices_them_exactly():
    diloco = synthetic_run([[0, 1, 2, 3]], [8], rounds=4)
    alone = synthetic_run([[0], [1], [2], [3]], [8, 16, 16, 32], rounds=4)
    profile, link, fitted = replay.fit([diloco, alone])
    assert fitted["alpha_seconds"] == pytest.approx(ALPHA, rel=1e-6)
    assert fitted["beta_seconds_per_sample"] == pytest.approx(BETA, rel=1e-6)
    assert fitted["outer_seconds"] == pytest.approx(OUTER, rel=1e-6)
    assert link.bandwidth_bits_per_second == pytest.approx(BITS, rel=1e-6)
    assert fitted["samples"] == {"steps": 24, "local_rounds": 3, "all_reduces": 3}  # rounds 2 to 4
    merged = synthetic_run([[0, 1], [2], [3]], [12, 24, 4], rounds=3, merge=(3, 3e8))
    for run in (diloco, alone, merged):
        rounds = replay.replay(run, profile, link)
        assert [r["round"] for r in rounds] == list(range(2, len(run["rounds"]) + 1))
        for r in rounds:
            assert r["virtual"] == pytest.approx(r["measured"], rel=1e-6)
    # A slower device than the profile's: the replay reports the difference, it does not absorb it.
    slow = synthetic_run([[0], [1], [2], [3]], [8, 16, 16, 32], rounds=3)
    for marks in slow["result"]["round_marks_per_rank"]:
        for mark in marks:
            mark[1] *= 1.25
    summary = replay.summary(replay.replay(slow, profile, link))
    assert summary["error"] == pytest.approx(1 / 1.25 - 1, rel=1e-6)


@pytest.mark.skipif(
    not os.path.exists(os.path.join(H200_RESULTS, "headline-launches.json")), reason="no H200 launches"
)
def test_the_h200_headline_launches_replay_and_the_results_file_is_theirs(tmp_path):
    out = replay.main(["--results", H200_RESULTS, "--fit", "headline", "--check", "headline-seed2",
                       "--output", str(tmp_path / "check.json")])  # fmt: skip
    assert os.path.exists(tmp_path / "check.png")
    methods = out["checks"]["headline-seed2"]
    assert set(methods) == {"diloco", "adloco_goodput", "adloco_norm"}
    for s in methods.values():
        assert s["rounds"] >= 20 and s["measured_seconds"] > 0 and s["virtual_seconds"] > 0
    with open(os.path.join(REPO, "docs", "results", "virtual_clock_gpu.json"), encoding="utf-8") as f:
        committed = json.load(f)
    for key in ("alpha_seconds", "beta_seconds_per_sample", "outer_seconds", "link_bits_per_second"):
        assert committed["fitted"][key] == pytest.approx(out["fitted"][key])
    assert committed["checks"]["headline-seed2"]["diloco"]["error"] == pytest.approx(methods["diloco"]["error"])

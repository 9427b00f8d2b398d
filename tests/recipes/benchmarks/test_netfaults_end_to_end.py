"""`netfaults` for real (root only): two machines in network namespaces forming one world under torchrun's c10d
rendezvous, and one scenario: 4 machines, each its own `accelerate launch --max_restarts`, worker 3's link set down
for 5 s one second into a round's outer all-reduce."""

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from adloco_hf.testing import free_port, run_workers
from recipes.benchmarks import netfaults
from recipes.benchmarks.netfaults.launch import machine_env, torchrun_command
from recipes.benchmarks.toolkit import testbed
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.testbed import LinkPlan, unavailable_reason


# Each worker: the default group formed as a user's script forms it (env://, from the MASTER_ADDR that torchrun's
# rendezvous published), one all-reduce over the links, and what it saw written to `<argv[1]>-<rank>`.
ONE_WORLD = """
import datetime, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
total = torch.ones(1)
dist.all_reduce(total)
with open(f"{sys.argv[1]}-{dist.get_rank()}", "w") as f:
    f.write(f"{dist.get_world_size()} {total.item():g} {os.environ['MASTER_ADDR']}")
"""


@pytest.mark.multiprocess
@pytest.mark.skipif(unavailable_reason() is not None, reason=f"no testbed here: {unavailable_reason()}")
def test_machines_in_namespaces_form_one_world_under_torchrun_c10d(tmp_path):
    # In a namespace the host name resolves to the loopback: a rendezvous rank 0 that published it as MASTER_ADDR
    # left every other machine's workers dialling their own loopback (the benchmark's `down_for_good` hung there).
    plan = LinkPlan(workers=2, prefix="adnft", subnet="10.213.93")
    script, seen = tmp_path / "one_world.py", tmp_path / "seen"
    script.write_text(ONE_WORLD)
    port = free_port()
    commands = [
        ["ip", "netns", "exec", plan.namespace(k), *torchrun_command(plan, k, str(seen), port, "one", 0, str(script))]
        for k in range(plan.workers)
    ]
    with testbed.Testbed(plan), ThreadPoolExecutor(plan.workers) as pool:
        options = dict(cwd=REPO, timeout=240, check=False)
        runs = [
            pool.submit(run_workers, c, env=machine_env(plan, k, "torchrun"), **options)
            for k, c in enumerate(commands)
        ]
        results = [run.result() for run in runs]
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    lines = sorted((tmp_path / f"seen-{rank}").read_text().split() for rank in range(plan.workers))
    assert [line[:2] for line in lines] == [["2", "2"], ["2", "2"]]  # a world of 2; the all-reduce summed both
    # one MASTER_ADDR, the rendezvous rank 0's link, not "localhost"
    assert len({line[2] for line in lines}) == 1 and lines[0][2] in (plan.address(0), plan.address(1)), lines
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "adnft-" not in left, left


@pytest.mark.slow  # ~4 minutes on 2 shared cores: the uninterrupted run and the scenario, 40 steps each
@pytest.mark.skipif(unavailable_reason() is not None, reason=f"no testbed here: {unavailable_reason()}")
def test_a_link_down_in_the_outer_all_reduce_costs_no_restart_and_changes_nothing(tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    argv = ["--scenarios", "down_in_allreduce", "--max_steps", "40", "--output_dir", str(out)]
    report = netfaults.main([*argv, "--results_dir", str(results)])
    row = json.loads((out / "scenarios" / "down_in_allreduce.json").read_text())
    assert "error" not in row, row.get("error")
    assert report["settings"]["workers"] == 4 and row["exit_codes"] == [0, 0, 0, 0]  # 4 machines of one worker
    # asserting the world size (the worker's spec says 4) and every launch ended by itself
    assert [e["action"] for e in row["events"]] == ["cut", "restore"] and row["actions_not_applied"] == 0
    assert row["restarts"] == 0 and row["work_lost_steps"] == 0 and row["ended_by_itself"]
    assert row["merged_max_difference"] <= 1e-6
    assert (results / "netfaults.png").stat().st_size > 0
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "adnf-" not in left, left  # the namespaces are gone

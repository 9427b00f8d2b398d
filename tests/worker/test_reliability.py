"""Resume, interrupted saves, non-finite values, dead or hung workers, bad input — with real workers."""

import json
import os
import shutil
import time

import pytest
import safetensors.torch
import torch
from helpers import (
    RESUME_CONFIG,
    SCRIPTS,
    comparable_rounds,
    flat_params,
    free_port,
    launch,
    launch_failing,
    merged_params,
    reports_of,
    root_cause,
    rounds_of,
    sequence_dataset,
    tiny_model,
)
from transformers import AutoModelForCausalLM

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.outer.compression import wire_bytes


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")

# A lost worker is named after `worker_timeout`: long enough that no healthy barrier of these runs (steps of ~50 ms)
# reaches it on a machine doing other work, short enough to keep the tests quick.
LOST_WORKER_TIMEOUT = 12


def spec_for(out, probe, world_size=2, config=None, **extra):
    # Every run here has dropout (0.1 on attention): resuming must restore each worker's random generators too.
    return {
        "output_dir": out,
        "world_size": world_size,
        "probe_dir": probe,
        "config": {"output_dir": out, **(config or RESUME_CONFIG)},
        "dropout": 0.1,
        **extra,
    }


def run_spec(spec, world_size=2, timeout=300, expect_failure=False):
    if not expect_failure:
        return launch(WORKER, json.dumps(spec), num_processes=world_size, timeout=timeout)
    return launch_failing(WORKER, json.dumps(spec), num_processes=world_size, timeout=timeout)


def logged_epochs(out):
    state = json.load(open(os.path.join(out, "checkpoint-30", "trainer_state.json")))
    return [(entry["step"], round(entry["epoch"], 6)) for entry in state["log_history"] if "epoch" in entry]


def test_stop_and_resume_ends_with_the_same_merged_model(tmp_path, resume_reference):
    full = resume_reference
    # Stopped (all workers gone) at step 12, after checkpoint-10; resumed from it.
    part = str(tmp_path / "part")
    run_spec(spec_for(part, str(tmp_path / "p1"), fail=["all", 12, 0]))
    assert os.path.isdir(os.path.join(part, "checkpoint-10")) and not os.path.isdir(os.path.join(part, "merged"))
    for rank in range(2):
        state = torch.load(os.path.join(part, "checkpoint-10", "adloco", f"rank-{rank}.pt"), weights_only=True)
        assert state["world_size"] == 2 and state["outer_step"] == 2 and len(state["instances"]) == 2
    run_spec(spec_for(part, str(tmp_path / "p2"), resume=os.path.join(part, "checkpoint-10")))

    assert (merged_params(part) - merged_params(full)).abs().max().item() <= 1e-6
    full_rounds = rounds_of(full)
    assert comparable_rounds(part) == comparable_rounds(full)
    assert any(line["merged_from"] for line in full_rounds if line["outer_step"] == 4)  # merged after the resume
    # The resumed run logs the epochs the uninterrupted one does (they do not restart from 0 at the resume): the data
    # rank 0 consumed, in passes over its shard of 256 samples.
    consumed = sum(reports_of(os.path.join(os.path.dirname(full), "probe"), 2)[0]["seen_batches"])
    assert logged_epochs(part) == logged_epochs(full) and logged_epochs(full)[-1] == (30, round(consumed / 256, 6))
    assert full_rounds[-1]["batch_size"] > 2  # batches grew along the way

    # Resuming the checkpoint's 2 instances on 1 worker is refused before training: merge down first.
    args = AdLoCoConfig(output_dir=part, use_cpu=True, report_to=[], **RESUME_CONFIG)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(512))
    with pytest.raises(ValueError, match="holds 2 instances but this run has 1 worker.*merge down first"):
        trainer.train(resume_from_checkpoint=os.path.join(part, "checkpoint-10"))


def test_a_save_killed_midway_leaves_the_last_checkpoint_loadable_and_resumable(tmp_path, resume_reference):
    out = str(tmp_path / "out")
    output = run_spec(spec_for(out, str(tmp_path / "p0"), kill_in_save=20), expect_failure=True)
    assert root_cause(output) == (0, 9)  # rank 0, killed (os._exit(9)) inside its save of checkpoint-20
    names = os.listdir(out)
    assert "checkpoint-10" in names and "checkpoint-20" not in names
    assert any(name.startswith(".tmp-checkpoint-20") for name in names)  # the half-written save, never renamed
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "checkpoint-10"))
    assert torch.isfinite(flat_params(model)).all()

    run_spec(spec_for(out, str(tmp_path / "p1"), resume=True))
    names = os.listdir(out)
    assert not any(name.startswith(".tmp-") for name in names)
    assert "checkpoint-30" in names and os.path.isfile(os.path.join(out, "merged", "model.safetensors"))
    # Same result as a run that was never interrupted.
    assert (merged_params(out) - merged_params(resume_reference)).abs().max().item() <= 1e-6


def test_a_nan_on_one_worker_is_kept_out_of_the_global_weights(tmp_path):
    out = str(tmp_path / "out")
    config = dict(RESUME_CONFIG, num_instances=1, save_strategy="no", max_steps=20)
    run_spec(spec_for(out, str(tmp_path / "p"), config=config, nan=[1, 7]))
    lines = rounds_of(out)
    # Rank 1's weights turn NaN at step 7, inside round 2 (steps 6-10): that round is skipped for the instance.
    assert [line["skipped"] for line in lines] == [False, True, False, False]
    assert lines[1]["train_loss"] is None  # NaN in the file is written as null
    assert all(line["train_loss"] is not None for line in lines[2:])  # training recovered
    assert lines[3]["train_loss"] < lines[0]["train_loss"]
    final = safetensors.torch.load_file(os.path.join(tmp_path, "p", "final-rank0.safetensors"))["params"]
    assert torch.isfinite(final).all()
    assert torch.isfinite(merged_params(out)).all()


@pytest.mark.parametrize("how", [0, "hang"], ids=["exits", "hangs"])
def test_a_lost_worker_stops_the_others_with_an_error_naming_it(tmp_path, how):
    out = str(tmp_path / "out")
    config = dict(RESUME_CONFIG, num_instances=1, worker_timeout=LOST_WORKER_TIMEOUT, save_steps=5)
    spec = spec_for(out, str(tmp_path / "p"), config=config, fail=[1, 7, how], probes=False)
    # Bounded by the launch's timeout: the hung worker dies on the launcher's SIGTERM (scripts/adloco_worker.py's
    # `hang`) once rank 0 has stopped, so nothing waits for torchrun's 30 s before SIGKILL.
    output = run_spec(spec, expect_failure=True, timeout=120)
    assert f"AdLoCo, round 2 (step 10): worker rank(s) 1 did not arrive within {LOST_WORKER_TIMEOUT} s" in output
    assert "so this worker (rank 0) stops" in output
    assert "The last checkpoint (" in output and "checkpoint-5) is intact" in output  # it points at the checkpoint
    # The worker that stops with the error is rank 0 (rank 1 either exited with code 0 or hangs until SIGTERM).
    assert root_cause(output)[0] == 0
    assert os.path.isfile(os.path.join(out, "checkpoint-5", "model.safetensors"))


def test_a_rank_0_hung_inside_a_checkpoint_save_is_named_by_the_others(tmp_path):
    # Rank 0 sleeps inside its save of checkpoint-10 (after its model files, in its AdLoCo state): rank 1's own error
    # names it (not "rank 0's log names it": rank 0 is the one stuck), and checkpoint-10 is never published.
    out = str(tmp_path / "out")
    config = dict(RESUME_CONFIG, num_instances=1, worker_timeout=LOST_WORKER_TIMEOUT, save_steps=5)
    spec = spec_for(out, str(tmp_path / "p"), config=config, hang_in_save=[0, 10], probes=False)
    output = run_spec(spec, expect_failure=True, timeout=240)
    assert (
        f"WorkerTimeoutError: AdLoCo, checkpoint-10 (every worker's files): worker rank(s) 0 did not arrive within "
        f"{LOST_WORKER_TIMEOUT} s (dead or hung), so this worker (rank 1) stops" in output
    ), output[-3000:]
    assert "The last checkpoint (" in output and "checkpoint-5) is intact" in output
    assert root_cause(output)[0] == 1  # rank 1 stops with the error; rank 0 dies on the launcher's SIGTERM after
    assert "checkpoint-10" not in os.listdir(out)
    assert os.path.isfile(os.path.join(out, "checkpoint-5", "model.safetensors"))


def test_models_that_differ_across_ranks_are_refused_before_any_broadcast(tmp_path):
    out = str(tmp_path / "out")
    config = dict(RESUME_CONFIG, num_instances=1, save_strategy="no")
    output = run_spec(spec_for(out, str(tmp_path / "p"), config=config, mismatch_rank=1), expect_failure=True)
    assert "the model on rank(s) [1] differs from rank 0's" in output


def test_more_instances_than_workers_is_refused(tmp_path):
    out = str(tmp_path / "out")
    config = dict(RESUME_CONFIG, num_instances=3, save_strategy="no")
    output = run_spec(spec_for(out, str(tmp_path / "p"), config=config), expect_failure=True)
    assert "num_instances=3 exceeds the 2 worker(s)" in output
    assert not os.path.exists(os.path.join(out, "adloco_rounds.jsonl"))


def wait_until_exited(pid: int) -> None:
    """Until process `pid` has exited (gone, or a zombie its parent has not reaped yet): its sockets are closed."""
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)


def _monitor_worker(rank: int, port: int, tmp: str, timeout: float) -> None:
    import torch.distributed as dist

    from adloco_hf.common.distributed import WorkerMonitor, WorkerTimeoutError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    monitor = WorkerMonitor(timeout)
    monitor.check("round 1")
    pid_file = os.path.join(tmp, "rank1.pid")
    if rank == 1:
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        os._exit(0)  # gone for good: its sockets close, so gloo reports a closed connection rather than a timeout
    while not os.path.exists(pid_file):
        time.sleep(0.05)
    wait_until_exited(int(open(pid_file).read()))
    started = time.monotonic()
    try:
        monitor.check("round 2", lambda: "(hint computed on failure)")
        message, cause = "no error", None
    except WorkerTimeoutError as error:
        message, cause = str(error), repr(error.__cause__)
    with open(os.path.join(tmp, "result.json"), "w") as f:
        json.dump({"message": message, "cause": cause, "seconds": time.monotonic() - started}, f)
    os._exit(0)


def test_a_worker_that_has_already_exited_is_named_even_when_gloo_only_sees_a_closed_socket(tmp_path):
    import torch.multiprocessing as mp

    port = free_port()
    mp.spawn(_monitor_worker, args=(port, str(tmp_path), 3.0), nprocs=2)
    result = json.loads((tmp_path / "result.json").read_text())
    # gloo reports the exited worker as a closed connection (no rank in its message: the path this test is about) or,
    # when the machine is busy, as rank 0's barrier timeout at the same deadline (which names the rank). The counters
    # in the store must name rank 1 in both cases.
    assert "Connection closed" in result["cause"] or "Ranks 1 failed to pass monitoredBarrier" in result["cause"], (
        result
    )
    assert "round 2: worker rank(s) 1 did not arrive within 3 s" in result["message"], result
    assert "this worker (rank 0) stops. (hint computed on failure)" in result["message"]
    assert result["seconds"] < 3.0 + 20.0  # bounded by the configured timeout (not gloo's 30 min), with room for load


def test_the_lost_worker_message_says_whether_there_is_a_checkpoint_to_resume(tmp_path):
    out = tmp_path / "out"
    args = AdLoCoConfig(output_dir=str(out), use_cpu=True, report_to=[], **{**RESUME_CONFIG, "num_instances": 1})
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(64))
    assert trainer.worker.resume_hint().startswith("No checkpoint has been saved yet")
    (out / "checkpoint-10").mkdir(parents=True)
    assert f"The last checkpoint ({out / 'checkpoint-10'}) is intact" in trainer.worker.resume_hint()


def checkpoints_of(out):
    return sorted(int(name.split("-")[1]) for name in os.listdir(out) if name.startswith("checkpoint-"))


@pytest.mark.multiprocess
@pytest.mark.parametrize("target", ["self", "launcher"])
def test_sigterm_stops_every_worker_at_the_round_end_saves_and_resumes_exactly(tmp_path, target, resume_reference):
    full = resume_reference
    # SIGTERM to rank 1 (or to the launcher, which forwards it to both workers) at step 12: the round ends at 15,
    # well within the grace, so every worker stops there and saves checkpoint-15 (save_steps is 10).
    part = str(tmp_path / "part")
    output = run_spec(spec_for(part, str(tmp_path / "p1"), sigterm=[1, 12, target]), expect_failure=True)
    assert "training was preempted" in output and os.path.join(part, "checkpoint-15") in output
    assert checkpoints_of(part) == [10, 15] and not os.path.isdir(os.path.join(part, "merged"))
    for rank in range(2):
        state = torch.load(os.path.join(part, "checkpoint-15", "adloco", f"rank-{rank}.pt"), weights_only=True)
        assert state["world_size"] == 2 and state["outer_step"] == 3 and state["round"] is None
    run_spec(spec_for(part, str(tmp_path / "p2"), resume=os.path.join(part, "checkpoint-15")))
    assert (merged_params(part) - merged_params(full)).abs().max().item() <= 1e-6
    assert comparable_rounds(part) == comparable_rounds(full)


@pytest.mark.multiprocess
def test_with_no_grace_the_round_is_cut_at_the_next_step_and_resumes_exactly(tmp_path):
    # Rounds of 10 steps; SIGTERM to rank 0 at step 12, with no grace: both workers stop inside round 2.
    config = dict(RESUME_CONFIG, inner_steps=10, save_steps=10, preemption_grace_seconds=0)
    full = str(tmp_path / "full")
    run_spec(spec_for(full, str(tmp_path / "p0"), config=config))
    part = str(tmp_path / "part")
    # No per-step collectives of the test's own probes (with them the workers could only agree on the round's end),
    # and every worker looks for the request after each step (once a second by default). Rank 0 gets SIGTERM before
    # step 13 and posts its request after it; rank 1 waits before its step 13 until the request is in the store, so
    # both post step 13 whatever the machine's speed (no fallback to the round's end: the wait for posts is long).
    spec = spec_for(
        part,
        str(tmp_path / "p1"),
        config=config,
        sigterm=[0, 12, "self"],
        probes=False,
        preemption_poll=0,
        preemption_agree_seconds=240,
        wait_for_stop_request=[1, 12],
    )
    output = run_spec(spec, expect_failure=True)
    assert "training was preempted" in output
    assert checkpoints_of(part) == [10, 13]  # cut inside round 2
    cut = [13]
    for rank in range(2):
        state = torch.load(os.path.join(part, f"checkpoint-{cut[0]}", "adloco", f"rank-{rank}.pt"), weights_only=True)
        assert state["outer_step"] == 1 and state["round"]["loss_steps"] == cut[0] - 10  # each worker's own round
    run_spec(spec_for(part, str(tmp_path / "p2"), config=config, resume=os.path.join(part, f"checkpoint-{cut[0]}")))
    assert (merged_params(part) - merged_params(full)).abs().max().item() <= 1e-6
    assert comparable_rounds(part) == comparable_rounds(full)


@pytest.mark.parametrize(
    "options",
    [
        {"pseudo_grad_compression": "int4", "outer_overlap": True},
        {"pseudo_grad_compression": "int8"},
        {"outer_overlap": True},
    ],
    ids=lambda options: "+".join(f"{k}={v}" for k, v in options.items()),
)
def test_stop_and_resume_is_exact_with_compression_and_overlap(tmp_path, options):
    """The residual of error feedback and the average in flight are saved per worker, so a resume from a checkpoint
    taken mid-run ends with the same merged model as the uninterrupted run. The two one-worker instances merge at
    round 2 (step 10, before the checkpoint at step 20): the options run on 1-worker and 2-worker instances."""
    config = dict(RESUME_CONFIG, merge_every=2, compression_block_size=32, **options)
    full = str(tmp_path / "full")
    run_spec(spec_for(full, str(tmp_path / "p0"), config=config))
    part = str(tmp_path / "part")
    run_spec(spec_for(part, str(tmp_path / "p1"), config=config, fail=["all", 22, 0]))
    compressed, overlapped = "pseudo_grad_compression" in options, options.get("outer_overlap", False)
    for rank in range(2):
        state = torch.load(os.path.join(part, "checkpoint-20", "adloco", f"rank-{rank}.pt"), weights_only=True)
        assert state["world_size"] == 2 and len(state["instances"]) == 1
        saved = state["global_model"]
        assert (saved["error_feedback"] is not None and saved["error_feedback"]["residual"] is not None) == compressed
        assert (saved["pending"] is not None) == overlapped  # round 4's average, in flight when the save began
        assert (saved["eager"] is not None) == overlapped
    if compressed and overlapped:
        shutil.copytree(part, str(tmp_path / "elastic"))  # resumed on 3 workers below
    run_spec(spec_for(part, str(tmp_path / "p2"), config=config, resume=os.path.join(part, "checkpoint-20")))
    merged = merged_params(part)
    assert (merged - merged_params(full)).abs().max().item() <= 1e-6
    assert comparable_rounds(part) == comparable_rounds(full)
    lines = rounds_of(full)
    assert [line["outer_step"] for line in lines if line["merged_from"]] == [2]
    bits = {"int8": 8, "int4": 4}.get(options.get("pseudo_grad_compression"))
    after = [line for line in lines if line["outer_step"] > 2]
    if bits is not None:  # one instance of 2 workers: each sends bits/8 bytes a value plus one float32 per 32
        expected = 2 * wire_bytes(merged.numel(), bits=bits, block_size=32)
        assert [line["comm_bytes"] for line in after] == [expected] * len(after)
    if compressed and overlapped:
        check_elastic_resume_in_flight(tmp_path, config, merged.numel())


def check_elastic_resume_in_flight(tmp_path, config, numel):
    """The same checkpoint-20 (an int4 residual and an overlapped average in flight) resumed on 3 workers: the
    average in flight is applied and each worker's eager offset and residual (its old ring's) dropped, so all three
    workers of the one instance hold the same φ after every outer step (asserted inside the workers) and the run
    completes."""
    out = str(tmp_path / "elastic")
    checkpoint = os.path.join(out, "checkpoint-20")
    saved = torch.load(os.path.join(checkpoint, "adloco", "rank-0.pt"), weights_only=True)["global_model"]
    spec = spec_for(out, str(tmp_path / "p3"), world_size=3, config=config, resume=checkpoint, probe_resume=True)
    result = run_spec(spec, world_size=3)
    output = result.stdout + result.stderr
    reports = [json.load(open(tmp_path / "p3" / f"report-rank{r}.json")) for r in range(3)]
    assert [r["world_size"] for r in reports] == [3, 3, 3]
    assert all(r["rounds_checked"] == 2 for r in reports)  # rounds 5 and 6, φ shared by the 3 workers after each
    assert "elastic resume: checkpoint-20 was written by 2 workers, this run has 3" in output
    restored = [safetensors.torch.load_file(str(tmp_path / "p3" / f"resume-rank{r}.safetensors")) for r in range(3)]
    assert all(torch.equal(r["phi"], restored[0]["phi"]) for r in restored) and restored[0]["phi"].numel() == numel
    assert not torch.equal(restored[0]["phi"], saved["phi"])  # the average in flight was applied at the resume
    assert [line["workers"] for line in rounds_of(out) if line["outer_step"] > 4] == [[0, 1, 2], [0, 1, 2]]
    assert os.path.isfile(os.path.join(out, "merged", "model.safetensors"))

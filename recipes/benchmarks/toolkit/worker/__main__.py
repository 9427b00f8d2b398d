"""One worker's run: `accelerate launch ... --module recipes.benchmarks.toolkit.worker SPEC_JSON`, a training
method's (`run_method`) or, for a spec of kind "faults", a fault benchmark's (`fault_run.run_faults`)."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from transformers import default_data_collator

from recipes.benchmarks.toolkit.clock.virtual_clock import clock_from_spec
from recipes.benchmarks.toolkit.data import load_data, make_model
from recipes.benchmarks.toolkit.testbeds.cgroups import join_from_environment
from recipes.benchmarks.toolkit.traffic import ring_all_reduce_bytes, socket_bytes_sent
from recipes.benchmarks.toolkit.worker import FAULTS
from recipes.benchmarks.toolkit.worker.arguments import make_arguments
from recipes.benchmarks.toolkit.worker.callbacks import (
    RoundMarks,
    StepClock,
    TimeBudgetStop,
    TokenBudgetStop,
    VirtualRounds,
)
from recipes.benchmarks.toolkit.worker.fault_run import run_faults
from recipes.benchmarks.toolkit.worker.result import shard_epochs, write_result
from recipes.benchmarks.toolkit.worker.trainers import BenchAdLoCoTrainer, DDPTrainer


RUNS = {FAULTS: run_faults}  # by the spec's kind; every other kind is a method (`run_method`)


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    RUNS.get(spec["kind"], run_method)(spec)


def run_method(spec: dict) -> None:
    """Train one method (`spec["kind"]`: "ddp" or an AdLoCo method) and write its result; exits the process."""
    # A method with a slow worker: the benchmark made a cgroup with a CPU quota, and this rank may be the one in it.
    slowed = join_from_environment(int(os.environ.get("RANK", "0")))
    torch.set_num_threads(spec.get("threads_per_worker", 1))
    args = make_arguments(spec)  # initialises the process group
    world = spec["world_size"]
    if args.world_size != world or not dist.is_initialized() or dist.get_world_size() != world:
        raise RuntimeError(
            f"expected {world} workers, this one sees world_size={args.world_size}: launch with "
            "`accelerate launch --multi_gpu --num_processes N` and keep use_cpu=True on a machine without a GPU"
        )
    tokenizer, lm = load_data(spec)
    model = make_model(spec, tokenizer)
    kind = spec["kind"]
    trainer_class = DDPTrainer if kind == "ddp" else BenchAdLoCoTrainer
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=lm["train"],
        eval_dataset=lm["eval"],
        data_collator=default_data_collator,
    )
    clock = StepClock()
    trainer.callback_handler.callbacks.insert(0, clock)  # before AdLoCo's: its on_step_end ends the inner step
    marks = virtual_rounds = None
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    tokens_per_step = world * spec["train"]["batch_size"] * spec["block_size"]
    ddp_step_bytes = ring_all_reduce_bytes(4 * numel, world)  # fp32 gradients, one all-reduce per step
    if kind == "ddp":
        trainer.bench_setup(
            tokens_so_far=lambda: trainer.state.global_step * tokens_per_step,
            bytes_so_far=lambda: trainer.state.global_step * ddp_step_bytes,
            rounds_so_far=lambda: trainer.state.global_step,  # one all-reduce per step
        )
    else:
        virtual = None
        if spec.get("clock") is not None:  # the library's timings priced by a device profile and links
            virtual = clock_from_spec(
                spec["clock"], world=world, statistics=args.batch_size_test != "none", parameters=numel
            )
            trainer.worker.clock = virtual
        trainer.bench_setup(
            tokens_so_far=lambda: trainer.adloco_state.tokens,
            bytes_so_far=lambda: trainer.adloco_state.comm_bytes,
            rounds_so_far=lambda: trainer.adloco_state.rounds,
            virtual_seconds=None if virtual is None else (lambda: virtual.seconds),
        )
        trainer.add_callback(TokenBudgetStop(trainer, spec["budget_tokens"]))
        marks = RoundMarks(trainer, clock)
        trainer.add_callback(marks)
        if virtual is not None:  # after AdLoCo's and the token budget's: the round is priced, the stop decided
            virtual_rounds = VirtualRounds(trainer, virtual, spec["clock"].get("budget_seconds"))
            trainer.add_callback(virtual_rounds)
    time_stop = None
    if spec.get("budget_seconds") is not None and spec.get("clock") is None:
        round_end = (
            None if kind == "ddp" else (lambda: trainer.adloco_state.last_round_step == trainer.state.global_step)
        )
        time_stop = TimeBudgetStop(trainer, spec["budget_seconds"], spec["train"]["inner_steps"], round_end)
        trainer.add_callback(time_stop)

    dist.barrier()
    trainer.bench_start_bytes = socket_bytes_sent()
    start = trainer.bench_start_time = time.perf_counter()
    started_at = time.time()  # wall clock: links cuts its interface counters to the training window
    trainer.train()
    wall = time.perf_counter() - start
    ended_at = time.time()
    sent_end = socket_bytes_sent()
    if kind == "ddp" and (
        not trainer.bench_points or trainer.bench_points[-1]["global_step"] != trainer.state.global_step
    ):
        trainer.evaluate(metric_key_prefix="final")  # not part of the training time
        sent_end = socket_bytes_sent()

    measured = None
    if None not in (trainer.bench_start_bytes, sent_end):
        measured = sent_end - trainer.bench_start_bytes - trainer.bench_eval_bytes
    mine = {
        "rank": args.process_index,
        "pid": os.getpid(),
        "wall": wall,
        "started_at": started_at,
        "ended_at": ended_at,
        "eval_seconds": trainer.bench_eval_seconds,
        "measured": measured,
        "eval_bytes": trainer.bench_eval_bytes,
        "points": [p["measured_bytes_local"] for p in trainer.bench_points],
        "shard_epochs": shard_epochs(trainer.train_sampler),
        "inner_step_seconds": clock.seconds,
        "inner_steps_timed": clock.steps,
        "round_marks": None if marks is None else marks.marks,
        "time_budget_stop": None if time_stop is None else time_stop.stopped_at,
        "virtual_round_ends": None if virtual_rounds is None else virtual_rounds.ends,
        "virtual_budget_stop": None if virtual_rounds is None else virtual_rounds.stopped_at,
        "virtual_compute_seconds": None if virtual_rounds is None else virtual_rounds.clock.compute_seconds,
        "virtual_bytes_scale": None if virtual_rounds is None else virtual_rounds.clock.bytes_scale,
        "slowed": slowed,
    }
    everyone: list[dict] = [None] * world
    dist.all_gather_object(everyone, mine)
    if args.process_index == 0:
        write_result(spec, args, trainer, everyone, tokens_per_step=tokens_per_step, ddp_step_bytes=ddp_step_bytes)
    dist.barrier()
    dist.destroy_process_group()
    # Skip the interpreter's teardown: on torch 2.13 + gloo it now and then aborts one worker ("terminate called
    # without an active exception", DDP runs included) after everything is done, which fails the whole launch.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

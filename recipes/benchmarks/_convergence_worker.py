"""One method of `convergence.py` on every worker: `accelerate launch ... --module <this module> SPEC_JSON`.

The driver (`convergence.py`) writes SPEC_JSON and launches this module, `recipes.benchmarks._convergence_worker`,
from the repository root once per method with the same workers, data, model initialisation, data order and inner
optimizer. Every worker records what it saw; global rank 0 writes `{output_dir}/result.json`, which the driver
collects. Not meant to be run by hand.

- `ddp`: the plain `transformers.Trainer` with real DDP (gloo) over the same workers, fed by the same
  `AdaptiveBatchSampler` shards as the AdLoCo workers (fixed batch), so every method sees the same samples in the
  same order on every rank for as long as their batch sizes agree.
- everything else: `AdLoCoTrainer` with the spec's `AdLoCoConfig` overrides; training stops at the end of the first
  round at which the cumulative training tokens of all instances reach the budget.

With `budget_seconds` in the spec (the GPU benchmark's time to target, `gpu_bench.py`) training also stops at the end
of the first round (DDP: the first multiple of `inner_steps` steps) after that many seconds of training, evaluations
excluded; the workers agree on it with one all-reduce of a flag per round. `bf16`, `optim` and `torch_compile` in the
spec set those `TrainingArguments` fields (default: off, `adamw_torch`, off).
"""

import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.data import build_lm_datasets, load_or_train_tokenizer, load_text_corpus
from adloco_hf.presets import MODEL_PRESETS, build_model
from adloco_hf.reporting.run_log import load_rounds
from adloco_hf.sampling.sampler import AdaptiveBatchSampler
from recipes.benchmarks._common import ring_all_reduce_bytes, socket_bytes_sent, write_json
from recipes.benchmarks._slow_workers import join_from_environment


# What a curve point's perplexity is (`curve_source`): the model the final merge would produce, evaluated while
# several instances train (`eval_merged_model`); the demand-weighted mean of the instances' losses (several
# instances without it: no single model's loss); or one model (one instance, DDP, the final merged model).
CURVE_SOURCES = ("merged", "instances_mean", "model")


class BenchmarkMixin:
    """Times every evaluation and counts its socket bytes, so both can be taken out of the training figures, and
    records one curve point per evaluation: tokens, modelled bytes and measured training bytes so far, perplexity.

    The point's `eval_ppl` is the merged model's (`{prefix}_merged_loss`) where the evaluation has one, else the
    library's `{prefix}_loss`; `instances_mean_ppl` keeps the latter (the instances' demand-weighted mean while
    several train) and `curve_source` says which one `eval_ppl` is (`CURVE_SOURCES`). The merged model's all-reduce
    runs inside the evaluation, so its bytes and seconds are left out of the training figures like the rest of it.

    All ranks evaluate at the same moments, so the per-rank lists line up and are summed at the end.
    """

    def bench_setup(self, *, tokens_so_far, bytes_so_far, rounds_so_far) -> None:
        self.bench_tokens_so_far = tokens_so_far
        self.bench_bytes_so_far = bytes_so_far
        self.bench_rounds_so_far = rounds_so_far
        self.bench_start_time: float | None = None  # set when training starts
        self.bench_eval_seconds = 0.0
        self.bench_eval_bytes = 0
        self.bench_start_bytes: int | None = None
        self.bench_points: list[dict] = []

    def draw_run_plot(self):
        """AdLoCo's plot of the run (global rank 0, at the end of training) is no training either: its seconds are
        taken out of the training figures with the evaluations'."""
        start = time.perf_counter()
        try:
            return super().draw_run_plot()
        finally:
            self.bench_eval_seconds += time.perf_counter() - start

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        sent_before = socket_bytes_sent()
        measured = None  # training bytes so far: everything since the start but earlier evaluations
        if None not in (sent_before, self.bench_start_bytes):
            measured = sent_before - self.bench_start_bytes - self.bench_eval_bytes
        tokens, modelled = self.bench_tokens_so_far(), self.bench_bytes_so_far()
        start = time.perf_counter()
        # Training seconds so far: since training started, earlier evaluations excluded.
        seconds = None if self.bench_start_time is None else start - self.bench_start_time - self.bench_eval_seconds
        try:
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        finally:
            self.bench_eval_seconds += time.perf_counter() - start
            sent_after = socket_bytes_sent()
            if None not in (sent_before, sent_after):
                self.bench_eval_bytes += sent_after - sent_before
        loss = metrics[f"{metric_key_prefix}_loss"]  # several instances: their demand-weighted mean
        merged = metrics.get(f"{metric_key_prefix}_merged_loss")  # eval_merged_model, while several instances train
        instances = {
            key[len(metric_key_prefix) + len("_instance_") : -len("_loss")]: value
            for key, value in metrics.items()
            if key.startswith(f"{metric_key_prefix}_instance_") and key.endswith("_loss")
        }
        source = "merged" if merged is not None else "instances_mean" if len(instances) > 1 else "model"
        curve_loss = merged if merged is not None else loss
        self.bench_points.append(
            {
                "prefix": metric_key_prefix,
                "global_step": self.state.global_step,
                "tokens": tokens,
                "seconds": seconds,
                "inner_steps": self.state.global_step,
                "rounds": self.bench_rounds_so_far(),
                "comm_bytes": modelled,
                "measured_bytes_local": measured,
                "eval_loss": curve_loss,
                "eval_ppl": math.exp(curve_loss),
                "curve_source": source,
                "instances_mean_loss": loss,
                "instances_mean_ppl": math.exp(loss),
                "instance_losses": instances,
                "best_instance_ppl": math.exp(min(instances.values())) if instances else math.exp(loss),
            }
        )
        return metrics


class DDPTrainer(BenchmarkMixin, Trainer):
    """The plain Trainer (DDP), only fed by the same sampler shards as the AdLoCo workers."""

    def get_train_dataloader(self) -> DataLoader:
        # Not prepared by accelerate: each rank already draws its own shard, exactly as an AdLoCo worker does.
        dataset = self._remove_unused_columns(self.train_dataset, description="training")
        sampler = AdaptiveBatchSampler(
            len(dataset),
            batch_size=self.args.per_device_train_batch_size,
            num_workers=self.args.world_size,
            rank=self.args.process_index,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
        )
        self.train_sampler = sampler
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=self.data_collator, num_workers=0)


class BenchAdLoCoTrainer(BenchmarkMixin, AdLoCoTrainer):
    pass


class TokenBudgetStop(TrainerCallback):
    """Stops AdLoCo at the end of the first round whose cumulative training tokens (all instances) reach the budget.

    Added with `trainer.add_callback`, so it runs after AdLoCo's own `on_step_end` has closed the round: at a round's
    last step `trainer.adloco_state` already counts that round (`last_round_step` is this step, `tokens` includes it).
    """

    def __init__(self, trainer: AdLoCoTrainer, budget: int):
        self.trainer, self.budget = trainer, budget

    def on_step_end(self, args, state, control, **kwargs):
        adloco = self.trainer.adloco_state
        if adloco.last_round_step == state.global_step and adloco.tokens >= self.budget:
            control.should_training_stop = True


class TimeBudgetStop(TrainerCallback):
    """Stops training at the end of the first round (every `every` steps) once `budget` seconds of training have
    passed (evaluations excluded). Every worker decides from the slowest one's clock (an all-reduce of one flag per
    round), so all stop at the same step."""

    def __init__(self, trainer: "BenchmarkMixin", budget: float, every: int, is_round_end=None):
        self.trainer, self.budget, self.every, self.is_round_end = trainer, budget, every, is_round_end
        self.stopped_at: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        end = self.is_round_end() if self.is_round_end else state.global_step % self.every == 0
        if not end or trainer.bench_start_time is None:
            return
        seconds = time.perf_counter() - trainer.bench_start_time - trainer.bench_eval_seconds
        shared = dist.is_initialized() and dist.get_world_size() > 1
        device = "cpu" if not shared or dist.get_backend() == "gloo" else args.device
        flag = torch.tensor([1.0 if seconds >= self.budget else 0.0], device=device)
        if shared:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            control.should_training_stop = True
            self.stopped_at = state.global_step


class StepClock(TrainerCallback):
    """The seconds this worker spent in inner steps: from `on_step_begin` to its `on_step_end`, which runs first in
    the callback list (inserted at 0), before AdLoCo's ends the round. Forward, backward (switch mode's micro-batches
    and the statistics step's halves included), clipping and the optimizer step; data loading, the round's end (outer
    step, the round-end all-gather, merges) and evaluations are outside."""

    def __init__(self):
        self.seconds, self.steps, self._start = 0.0, 0, None

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self.steps += 1
            self._start = None


class RoundMarks(TrainerCallback):
    """At the end of every round (added last, so after AdLoCo's `on_step_end` closed the round): `[global_step,
    training seconds since the start, evaluation seconds so far, inner-step seconds so far]` on this worker. The
    Trainer evaluates after `on_step_end`, so an evaluation at a round's end falls in the next mark's interval."""

    def __init__(self, trainer: "BenchAdLoCoTrainer", clock: StepClock):
        self.trainer, self.clock, self.marks = trainer, clock, []

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        if trainer.adloco_state.last_round_step == state.global_step and trainer.bench_start_time is not None:
            seconds = time.perf_counter() - trainer.bench_start_time
            self.marks.append([state.global_step, seconds, trainer.bench_eval_seconds, self.clock.seconds])


def common_arguments(spec: dict) -> dict:
    train = spec["train"]
    on_cpu = spec["device"] == "cpu"
    return {
        "output_dir": spec["output_dir"],
        "per_device_train_batch_size": train["batch_size"],
        "per_device_eval_batch_size": train["eval_batch_size"],
        "learning_rate": train["learning_rate"],
        "weight_decay": train["weight_decay"],
        "adam_beta2": train["adam_beta2"],
        # Constant after warm-up: the methods run different step counts for the same tokens, so a schedule tied
        # to max_steps would differ between them.
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": train["warmup_steps"],
        "max_grad_norm": train["max_grad_norm"],
        "seed": spec["seed"],
        "data_seed": spec["seed"],
        "use_cpu": on_cpu,
        # gloo by default: several workers may share one GPU, which NCCL refuses (`make gpu-check` runs one worker
        # with `--set backend=nccl`).
        "ddp_backend": spec.get("backend", "gloo"),
        "fp16": bool(spec["fp16"]),
        "bf16": bool(spec.get("bf16", False)),
        "optim": spec.get("optim", "adamw_torch"),
        "torch_compile": bool(spec.get("torch_compile", False)),
        "eval_strategy": "steps",
        "prediction_loss_only": True,  # the Trainer would otherwise gather every eval logit across workers
        "save_strategy": "no",
        "logging_steps": train["inner_steps"],
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "average_tokens_across_devices": False,
    }


def max_steps_for(spec: dict) -> int:
    """Steps that reach the token budget: exactly for DDP's fixed batch; an upper bound, in whole rounds, for AdLoCo.

    AdLoCo's requests only grow, and a step uses at least min(initial request, max_batch_size) samples (switch mode
    caps a request above max_batch_size there), so that batch bounds the run; the budget callback ends it earlier.
    With merges under `merge_batch_rule="preserve_total"` (the default) the instances' total batch can fall to one
    instance's (a merged instance keeps its total, spread over more workers): then one worker's batch bounds it.
    The schedule is constant after warm-up, so this bound changes nothing a run does before its budget.
    """
    train, world = spec["train"], spec["world_size"]
    if spec["kind"] == "ddp":
        return math.ceil(spec["budget_tokens"] / (world * train["batch_size"] * spec["block_size"]))
    adloco = spec["adloco"]
    smallest = train["batch_size"]
    if isinstance(adloco.get("max_batch_size"), int):
        smallest = min(smallest, adloco["max_batch_size"])
    merges = adloco.get("num_instances", 1) > 1 and adloco.get("merge_every", 1) != 0
    if merges and adloco.get("merge_batch_rule", "preserve_total") == "preserve_total":
        world = 1
    h = train["inner_steps"]
    return (math.ceil(spec["budget_tokens"] / (world * smallest * spec["block_size"]) / h) + 1) * h


def make_arguments(spec: dict) -> TrainingArguments:
    train = spec["train"]
    eval_steps = train["inner_steps"] * train["eval_every_rounds"]
    kwargs = common_arguments(spec)
    if spec["kind"] == "ddp":
        return TrainingArguments(
            **kwargs, max_steps=max_steps_for(spec), eval_steps=eval_steps, ddp_find_unused_parameters=False
        )
    adloco = dict(spec["adloco"])
    factor = adloco.pop("max_inner_steps_factor", None)  # a growing H: its cap follows inner_steps
    if adloco.get("fragment_sync_delay") == "max":  # Streaming DiLoCo's longest delay for this H
        adloco["fragment_sync_delay"] = train["inner_steps"] // adloco["num_fragments"]
    if factor is not None:
        adloco["max_inner_steps"] = factor * train["inner_steps"]
        eval_steps = math.lcm(eval_steps, adloco["max_inner_steps"])  # evaluations at round ends only
    return AdLoCoConfig(
        **kwargs,
        max_steps=max_steps_for(spec),
        inner_steps=train["inner_steps"],
        eval_steps=eval_steps,
        save_merges=False,
        **adloco,
    )


def load_data(spec: dict):
    data = spec["data"]
    texts = load_text_corpus(data["corpus"])
    tokenizer = load_or_train_tokenizer(None, texts, vocab_size=data["vocab_size"], cache_dir=spec["cache_dir"])
    lm = build_lm_datasets(texts, tokenizer, block_size=spec["block_size"], cache_dir=spec["cache_dir"])
    eval_blocks = data.get("eval_blocks")
    if eval_blocks is not None and len(lm["eval"]) > eval_blocks:
        # The first blocks of the held-out files: evaluating every few rounds stays cheap, and the same for all.
        lm["eval"] = lm["eval"].select(range(eval_blocks))
    return tokenizer, lm


def shard_epochs(sampler) -> float:
    """How many passes over its own shard this worker's sampler has drawn (1.0 = every sample once)."""
    return sampler.epoch + sampler.position / sampler.shard_size


def make_model(spec: dict, tokenizer):
    preset = spec["preset"]
    overrides = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "max_position_embeddings": max(MODEL_PRESETS[preset]["max_position_embeddings"], spec["block_size"]),
    }
    return build_model(preset, vocab_size=len(tokenizer), seed=spec["seed"], config_overrides=overrides)


def adloco_rounds(output_dir: str) -> list[dict]:
    """Per round: tokens so far, instances, per-worker batch sizes, bytes of the round (from adloco_rounds.jsonl)."""
    by_round: dict[int, list[dict]] = {}
    for line in load_rounds(output_dir):
        by_round.setdefault(line["outer_step"], []).append(line)
    rounds, previous_step = [], 0
    for step in sorted(by_round):
        lines = by_round[step]
        workers = sum(len(line["workers"]) for line in lines)
        steps = lines[0]["global_step"] - previous_step
        previous_step = lines[0]["global_step"]
        # What the workers really ran (switch mode caps a request between max_batch_size and γ × max_batch_size).
        used = {str(line["instance"]): line["samples"] / (len(line["workers"]) * steps) for line in lines}
        rounds.append(
            {
                "outer_step": step,
                "global_step": lines[0]["global_step"],
                "total_tokens": lines[0]["total_tokens"],
                "num_instances": lines[0]["num_instances"],
                "instances_trained": len(lines),
                "requested_batch_sizes": {str(line["instance"]): line["batch_size"] for line in lines},
                "batch_sizes": used,
                "mean_batch_size": sum(line["samples"] for line in lines) / (workers * steps),
                "accumulation_steps": {str(line["instance"]): line["accumulation_steps"] for line in lines},
                "comm_bytes": sum(line["comm_bytes"] for line in lines),
                # The library's timings (slowest worker of each instance), the round's slowest instance: the outer
                # step as the worker waited for it (pseudo-gradient, all-reduce, outer SGD; with outer_overlap the
                # wait for the background all-reduce), its whole outer step, and the merge.
                "comm_seconds": max((line.get("comm_seconds") or 0.0) for line in lines),
                "outer_seconds": max((line.get("outer_seconds") or 0.0) for line in lines),
                "merge_seconds": sum((line.get("merge_seconds") or 0.0) for line in lines),
                "merged": any(line["merged_from"] for line in lines),
                # Each instance's workers: the samples each trained per inner step, its seconds per sample.
                "worker_batch_sizes": {str(line["instance"]): line.get("worker_batch_sizes") for line in lines},
                "worker_sample_seconds": {str(line["instance"]): line.get("worker_sample_seconds") for line in lines},
                "elapsed_seconds": lines[0].get("elapsed_seconds"),
            }
        )
    return rounds


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
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
    marks = None
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
        trainer.bench_setup(
            tokens_so_far=lambda: trainer.adloco_state.tokens,
            bytes_so_far=lambda: trainer.adloco_state.comm_bytes,
            rounds_so_far=lambda: trainer.adloco_state.rounds,
        )
        trainer.add_callback(TokenBudgetStop(trainer, spec["budget_tokens"]))
        marks = RoundMarks(trainer, clock)
        trainer.add_callback(marks)
    time_stop = None
    if spec.get("budget_seconds") is not None:
        round_end = (
            None if kind == "ddp" else (lambda: trainer.adloco_state.last_round_step == trainer.state.global_step)
        )
        time_stop = TimeBudgetStop(trainer, spec["budget_seconds"], spec["train"]["inner_steps"], round_end)
        trainer.add_callback(time_stop)

    dist.barrier()
    trainer.bench_start_bytes = socket_bytes_sent()
    start = trainer.bench_start_time = time.perf_counter()
    started_at = time.time()  # wall clock: links.py cuts its interface counters to the training window
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


def write_result(spec, args, trainer, everyone, *, tokens_per_step: int, ddp_step_bytes: int) -> None:
    """Global rank 0: combine every worker's numbers into `{output_dir}/result.json`."""
    kind, world = spec["kind"], spec["world_size"]
    numel = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)

    def total(values):
        return None if any(v is None for v in values) else int(sum(values))

    points = trainer.bench_points
    for i, point in enumerate(points):
        point["measured_bytes"] = total([r["points"][i] for r in everyone])
        del point["measured_bytes_local"]
    final = points[-1]
    steps = trainer.state.global_step
    if kind == "ddp":
        tokens, comm_bytes, comm_rounds, rounds = steps * tokens_per_step, steps * ddp_step_bytes, steps, None
        batch_sizes = [[0, spec["train"]["batch_size"]]]
        instances_curve = [[0, 1]]
    else:
        adloco = trainer.adloco_state  # after train(): the final merge's bytes included
        tokens, comm_bytes = adloco.tokens, adloco.comm_bytes
        rounds = adloco_rounds(args.output_dir)
        final_merge_bytes = comm_bytes - sum(r["comm_bytes"] for r in rounds)
        comm_rounds = sum(1 for r in rounds if r["comm_bytes"] > 0) + (1 if final_merge_bytes > 0 else 0)
        batch_sizes = [[r["total_tokens"], r["mean_batch_size"]] for r in rounds]
        instances_curve = [[r["total_tokens"], r["num_instances"]] for r in rounds]
    walls = [r["wall"] - r["eval_seconds"] for r in everyone]
    result = {
        "method": spec["method"],
        "kind": kind,
        "budget_reached": tokens >= spec["budget_tokens"],
        # The step at which the time budget stopped training (None: the token budget or max_steps did).
        "stopped_by_time_at": everyone[0].get("time_budget_stop"),
        "final_eval_ppl": final["eval_ppl"],
        "tokens": tokens,
        "comm_rounds": comm_rounds,
        "comm_bytes": comm_bytes,
        "wall_seconds": max(walls),
        "curve": [[p["tokens"], p["eval_ppl"]] for p in points],
        "curve_bytes": [[p["comm_bytes"], p["eval_ppl"]] for p in points],
        # The merged model's perplexity where a point has one (`curve_kind`, `CURVE_SOURCES`); the instances'
        # demand-weighted mean (the library's eval_loss) is kept as curve_instances_mean.
        "curve_kind": curve_kind([p["curve_source"] for p in points]),
        "curve_instances_mean": [[p["tokens"], p["instances_mean_ppl"]] for p in points],
        "curve_best_instance": [[p["tokens"], p["best_instance_ppl"]] for p in points],
        "curve_measured_bytes": [[p["measured_bytes"], p["eval_ppl"]] for p in points],
        "measured_bytes_sent": total([r["measured"] for r in everyone]),
        "measured_eval_bytes_sent": int(sum(r["eval_bytes"] for r in everyone)),
        "measured_bytes_per_rank": [r["measured"] for r in everyone],
        "wall_seconds_with_eval": max(r["wall"] for r in everyone),
        "eval_seconds": max(r["eval_seconds"] for r in everyone),
        "steps": steps,
        "rounds": None if rounds is None else len(rounds),
        "tokens_per_second": tokens / max(walls),
        "parameters": numel,
        "batch_sizes": batch_sizes,
        "instances": instances_curve,
        "round_log": rounds,
        "evals": points,
        "world_size": world,
        "train_tokens_available": len(trainer.train_dataset) * spec["block_size"],
        # Tokens trained over the tokens of the train split, and the most passes any worker made over its shard
        # (workers of instances with larger batches draw faster): above 1, some samples were seen twice.
        "epochs": tokens / (len(trainer.train_dataset) * spec["block_size"]),
        "max_worker_epochs": max(r["shard_epochs"] for r in everyone),
        "eval_blocks": len(trainer.eval_dataset),
        "max_batch_size": getattr(getattr(trainer, "worker", None), "max_batch_size", None),
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        # Per worker: seconds in inner steps ([`StepClock`]; DDP's include its gradient all-reduce, which runs inside
        # backward) and, for AdLoCo, one mark per round end ([`RoundMarks`]).
        "inner_step_seconds_per_rank": [r["inner_step_seconds"] for r in everyone],
        "inner_steps_timed_per_rank": [r["inner_steps_timed"] for r in everyone],
        "round_marks_per_rank": None if kind == "ddp" else [r["round_marks"] for r in everyone],
        "slowed_ranks": [r["rank"] for r in everyone if r["slowed"]],  # in the CPU-quota cgroup (_slow_workers.py)
        # time.time() when the first worker started training and the last one stopped (evaluations included)
        "train_started_at": min(r["started_at"] for r in everyone),
        "train_ended_at": max(r["ended_at"] for r in everyone),
    }
    write_json(os.path.join(args.output_dir, "result.json"), result)
    print(
        f"[{spec['method']}] ppl {final['eval_ppl']:.2f} tokens {tokens} steps {steps} bytes {comm_bytes} "
        f"measured {result['measured_bytes_sent']} wall {result['wall_seconds']:.1f}s curve {result['curve_kind']}",
        flush=True,
    )


def curve_kind(sources: list[str]) -> str:
    """What a run's curve follows: `"merged"` when some point is the merged model evaluated while several instances
    trained, else `"instances_mean"` when some point is the instances' mean, else `"model"` (one model throughout)."""
    for kind in CURVE_SOURCES:
        if kind in sources:
            return kind
    return "model"


if __name__ == "__main__":
    main()

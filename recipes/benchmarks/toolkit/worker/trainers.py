"""The Trainers a benchmark worker runs: the plain `Trainer` (DDP) fed by AdLoCo's sampler shards, and
`AdLoCoTrainer`, both timing every evaluation and counting its bytes so that the training figures leave them out."""

import math
import time

from torch.utils.data import DataLoader
from transformers import Trainer

from adloco_hf import AdaptiveBatchSampler, AdLoCoTrainer
from recipes.benchmarks.toolkit.traffic import socket_bytes_sent


__all__ = ["CURVE_SOURCES", "BenchAdLoCoTrainer", "BenchmarkMixin", "DDPTrainer"]

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

    def bench_setup(self, *, tokens_so_far, bytes_so_far, rounds_so_far, virtual_seconds=None) -> None:
        """`virtual_seconds`: with a virtual clock, its seconds on each link so far (a point's `seconds` are then the
        first link's, the one the library's decisions read, and `virtual_seconds` keeps every link's)."""
        self.bench_tokens_so_far = tokens_so_far
        self.bench_bytes_so_far = bytes_so_far
        self.bench_rounds_so_far = rounds_so_far
        self.bench_virtual_seconds = virtual_seconds
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
        # Training seconds so far: since training started, earlier evaluations excluded (virtual: the clock's).
        seconds = None if self.bench_start_time is None else start - self.bench_start_time - self.bench_eval_seconds
        virtual = None if self.bench_virtual_seconds is None else list(self.bench_virtual_seconds())
        if virtual is not None:
            seconds = virtual[0]
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
                "virtual_seconds": virtual,
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

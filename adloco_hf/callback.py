"""`AdLoCoCallback`: the orchestration of rounds, batch sizes, merges and saving around the HF training loop.

The Trainer runs the inner steps; this callback ends every round (`on_step_end` every `inner_steps` steps):

1. outer step inside each instance (`GlobalModel.outer_step`: pseudo-gradient all-reduce, outer SGD, θ ← φ);
2. one small all-gather over the world of every worker's round numbers (loss, statistics, bytes), from which every
   rank takes the same decisions;
3. the batch-size test → each instance's next request → the sampler (through switch mode's plan);
4. every `merge_every` rounds: a merge, redistribution of workers, the merge saved as safetensors;
5. one line per instance in `adloco_rounds.jsonl` and `adloco/*` values in the Trainer's logs.

The Trainer hands itself to the callback (`AdLoCoTrainer.__init__`), since callbacks do not otherwise see it.
"""

import logging
import math
import os
import shutil
import time
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from . import merging
from .batch_size import GradientStatistics, next_batch_size, pool_statistics
from .checkpoint import model_card, save_model_folder, state_dict_with
from .config import AdLoCoConfig
from .distributed import (
    ProcessGroupCache,
    WorkerMonitor,
    all_gather_rows,
    broadcast_tensors,
    destroy_process_groups_at_exit,
    get_rank,
    get_world_size,
    tensors_fingerprint,
)
from .grad_stats import GradientStatisticsCollector
from .instances import Instance, initial_instances, instance_of, merge_is_due, plan_merge, plan_transfers
from .lr_scaling import apply_lr_factor, check_scheduler, lr_factor
from .max_batch import find_max_batch_size
from .outer import DTYPES, GlobalModel, ring_all_reduce_bytes
from .run_log import RunLog
from .switch_mode import BatchPlan, plan_batch


if TYPE_CHECKING:
    from .trainer import AdLoCoTrainer

__all__ = ["AdLoCoCallback"]

logger = logging.getLogger(__name__)

INNER_PRODUCT_TESTS = ("inner_product", "augmented_inner_product")
# Layout of the row every worker contributes to the all-gather at the end of a round.
ROW = (
    "instance",
    *GradientStatistics.FIELDS,
    "loss_sum",
    "loss_steps",
    "samples",
    "tokens",
    "pseudo_grad_norm",
    "payload_bytes",
    "comm_seconds",
    "skipped",
)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class AdLoCoCallback(TrainerCallback):
    """Runs AdLoCo's rounds around the Trainer's inner loop (see the module docstring).

    Args:
        trainer: the [`AdLoCoTrainer`] it belongs to.
    """

    def __init__(self, trainer: "AdLoCoTrainer"):
        self.trainer = trainer
        self.args: AdLoCoConfig = trainer.args
        self.rank = get_rank()
        self.world_size = get_world_size()
        self.groups = ProcessGroupCache(timeout=self.args.worker_timeout)
        self.monitor: WorkerMonitor | None = None
        self.instances: list[Instance] = []
        self.global_model: GlobalModel | None = None
        self.collector: GradientStatisticsCollector | None = None
        self.max_batch_size: int | None = None
        self.plan: BatchPlan | None = None
        self._base_lrs: list[float] | None = None  # the scheduler's, before lr_batch_scaling
        self.run_log = RunLog(self.args.output_dir)
        self.outer_step = 0
        self.last_synced_step = 0
        self.final_merged = False
        self.totals = {"tokens": 0, "comm_bytes": 0, "skipped_rounds": 0, "merges": 0, "elapsed": 0.0}
        self._resume_state: dict[str, Any] | None = None
        self._train_start = time.time()
        self._reset_round()

    # ---- what the trainer asks during a step ----
    @property
    def instance(self) -> Instance:
        return instance_of(self.instances, self.rank)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.trainer.model.parameters() if p.requires_grad]

    def _is_round_end(self, step: int) -> bool:
        return step % self.args.inner_steps == 0 or step >= self.trainer.state.max_steps

    def statistics_plan(self, step: int) -> tuple[str | None, bool]:
        """For the step about to run (0-based `step`): the statistics mode and whether to keep its gradient.

        Modes: "split" (the step's chunks are the groups), "previous" (one-sample batch: the previous step's gradient
        is the second group) or None. Statistics are gathered on the last inner step of each round.
        """
        if self.args.batch_size_test == "none" or self.plan is None:
            return None, False
        one_sample = self.plan.batch_size == 1 and not self.plan.accumulates
        if self._is_round_end(step + 1):
            if not one_sample:
                return "split", False
            return ("previous" if self.collector.has_previous else None), self._is_round_end(step + 2)
        return None, one_sample and self._is_round_end(step + 2)

    def record_step(self, loss: torch.Tensor, samples: int, tokens: torch.Tensor | int) -> None:
        self._round["loss_sum"] = self._round["loss_sum"] + loss.detach().float()
        self._round["loss_steps"] += 1
        self._round["samples"] += samples
        self._round["tokens"] = self._round["tokens"] + tokens

    def record_statistics(self, stats: GradientStatistics | None) -> None:
        self._round["stats"] = stats

    def _reset_round(self) -> None:
        self._round = {"loss_sum": 0.0, "loss_steps": 0, "samples": 0, "tokens": 0, "stats": None}

    # ---- start ----
    def on_train_begin(self, args, state, control, **kwargs):
        model = self.trainer.model
        destroy_process_groups_at_exit()
        self.monitor = WorkerMonitor(self.args.worker_timeout)
        self.monitor.check("start of training")
        if self.rank == 0:
            self._remove_stale_staging()
        self._check_models_match(model)
        self.collector = GradientStatisticsCollector(
            model.parameters(), inner_products=self.args.batch_size_test in INNER_PRODUCT_TESTS
        )
        outer_device = torch.device("cpu") if self.args.outer_state_device == "cpu" else self.args.device
        resume = self._resume_state
        if self.args.lr_batch_scaling != "none":
            check_scheduler(self.trainer.lr_scheduler)
        self._base_lrs = list(getattr(self.trainer.lr_scheduler, "base_lrs", []))
        if resume is None:
            self.instances = initial_instances(
                self.world_size, self.args.num_instances, self.args.per_device_train_batch_size
            )
            self._refresh_groups()
            self._initialise_weights(model)
        else:
            self.instances = [Instance(i, tuple(w), b, d) for i, b, d, w in resume["instances"]]
            self._refresh_groups()
        self.global_model = GlobalModel(
            self.params,
            device=outer_device,
            lr=self.args.outer_lr,
            momentum=self.args.outer_momentum,
            nesterov=self.args.outer_nesterov,
        )
        if resume is None:
            self.max_batch_size = self._resolve_max_batch_size()
            self._train_start = time.time()
        else:
            self._restore(resume)
        self._apply_plan()
        if self.rank == 0:
            self.run_log.start(
                resumed_outer_step=None if resume is None else self.outer_step,
                resumed_global_step=None if resume is None else state.global_step,
            )
        self._log_start()

    def _remove_stale_staging(self) -> None:
        """Staging folders of checkpoints whose save was interrupted: never complete, never loaded."""
        if not os.path.isdir(self.args.output_dir):
            return
        for name in os.listdir(self.args.output_dir):
            if name.startswith((".tmp-checkpoint-", ".old-checkpoint-")):
                shutil.rmtree(os.path.join(self.args.output_dir, name), ignore_errors=True)
                logger.warning("removed %s, left by an interrupted checkpoint save", name)

    def _check_models_match(self, model: torch.nn.Module) -> None:
        """Compare parameter names, shapes and dtypes across ranks before the first broadcast would hang on them."""
        named = list(model.state_dict().items())
        fingerprint = tensors_fingerprint(named)
        rows = all_gather_rows([fingerprint >> 32, fingerprint & 0xFFFFFFFF, len(named)], self.args.device)
        differing = [r for r, row in enumerate(rows) if row != rows[0]]
        if differing:
            raise ValueError(
                f"the model on rank(s) {differing} differs from rank 0's in parameter names, shapes or dtypes "
                f"(rank 0 has {int(rows[0][2])} tensors, rank {differing[0]} has {int(rows[differing[0]][2])}); "
                "every worker must build the same model, e.g. with the same config and seed"
            )

    def _refresh_groups(self) -> None:
        # Every rank creates the groups of every instance, in id order: new_group is collective.
        for inst in sorted(self.instances, key=lambda x: x.id):
            self.groups.get(inst.workers)

    @torch.no_grad()
    def _initialise_weights(self, model: torch.nn.Module) -> None:
        """Shared init: rank 0's weights everywhere. Independent: instance i re-initialised with seed + i."""
        tensors = list({t.data_ptr(): t for t in model.state_dict().values()}.values())
        if self.args.instance_init == "shared":
            broadcast_tensors(tensors, src=0)
            return
        inst = self.instance
        if self.rank == inst.first_worker:
            self._reinitialise(model, self.args.seed + inst.id)
        if len(inst.workers) > 1:
            broadcast_tensors(tensors, src=inst.first_worker, group=self.groups.get(inst.workers))

    @staticmethod
    def _reinitialise(model: torch.nn.Module, seed: int) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if hasattr(model, "config") and hasattr(model, "_init_weights"):
                fresh = type(model)(model.config)
                model.load_state_dict(fresh.state_dict())
            else:
                for module in model.modules():
                    if hasattr(module, "reset_parameters"):
                        module.reset_parameters()

    def _resolve_max_batch_size(self) -> int:
        if self.args.max_batch_size != "auto":
            return int(self.args.max_batch_size)
        params = self.params
        param_bytes = sum(p.numel() * p.element_size() for p in params)
        reserve = 2 * param_bytes  # AdamW's two moments, not allocated before the first step
        if self.args.outer_state_device == "device":
            reserve += 4 * sum(p.numel() for p in params)  # the outer momentum, allocated at the first outer step
        return find_max_batch_size(
            self.trainer.run_probe_step,
            device=self.args.device,
            memory_fraction=self.args.memory_fraction,
            reserve_bytes=reserve,
        )

    def _request_cap(self) -> int:
        """The request never exceeds `batch_size_cap` nor a worker's data shard (a batch would repeat samples)."""
        shard = self.trainer.train_sampler.shard_size
        cap = self.args.batch_size_cap
        return shard if cap is None else min(cap, shard)

    def _apply_plan(self) -> None:
        """The batch of this worker's next round: to the sampler, and to the learning rate if it follows the batch."""
        self.plan = plan_batch(self.instance.batch_size, self.max_batch_size, self.args.switch_threshold)
        self.trainer.train_sampler.batch_size = self.plan.batch_size
        if self.args.lr_batch_scaling != "none":
            factor = self._lr_factor(self.plan)
            apply_lr_factor(self.trainer.optimizer, self.trainer.lr_scheduler, self._base_lrs, factor)

    def _lr_factor(self, plan: BatchPlan) -> float:
        return lr_factor(self.args.lr_batch_scaling, plan.batch_size, self.args.per_device_train_batch_size)

    def _log_start(self) -> None:
        if self.rank != 0:
            return
        logger.info(
            "AdLoCo: %d workers, %d instances, %d inner steps per round, initial batch %d per worker, "
            "max micro-batch %d, batch-size test %s",
            self.world_size,
            len(self.instances),
            self.args.inner_steps,
            self.args.per_device_train_batch_size,
            self.max_batch_size,
            self.args.batch_size_test,
        )

    # ---- end of a round ----
    def on_step_end(self, args, state, control, **kwargs):
        if self._is_round_end(state.global_step) and state.global_step != self.last_synced_step:
            self.end_round()

    def end_round(self) -> None:
        """Outer step, decisions from the all-gathered numbers, merge if due, logs (all ranks, same order)."""
        state = self.trainer.state
        self.monitor.check(f"round {self.outer_step + 1} (step {state.global_step})", self._resume_hint)
        self.outer_step += 1
        inst = self.instance
        result = self.global_model.outer_step(
            group=self.groups.get(inst.workers),
            num_workers=len(inst.workers),
            dtype=DTYPES[self.args.pseudo_grad_dtype],
        )
        if result.skipped:
            self._clean_inner_optimizer()
        stats = self._round["stats"] or GradientStatistics.missing()
        loss_sum = self._round["loss_sum"]
        tokens = self._round["tokens"]
        row = [
            inst.id,
            *stats.as_list(),
            float(loss_sum) if torch.is_tensor(loss_sum) else loss_sum,
            self._round["loss_steps"],
            self._round["samples"],
            float(tokens) if torch.is_tensor(tokens) else tokens,
            result.pseudo_grad_norm,
            result.payload_bytes,
            result.seconds,
            float(result.skipped),
        ]
        rows = [dict(zip(ROW, r)) for r in all_gather_rows(row, self.args.device)]
        lines, decided = self._decide(rows, state)
        merge_info = None
        if merge_is_due(self.outer_step, self.args.merge_every, len(decided)):
            merge_info = self._merge(decided)
            decided = list(merge_info["plan"].after)
            lines[merge_info["plan"].survivor]["merged_from"] = [merge_info["plan"].merged]
            lines[merge_info["plan"].survivor]["comm_bytes"] += merge_info["bytes"]
            lines[merge_info["plan"].survivor]["merge_bytes"] = merge_info["bytes"]
        self.instances = decided
        if merge_info is not None:
            self._refresh_groups()
        round_tokens = sum(r["tokens"] for r in rows)
        self.totals["tokens"] += round_tokens
        self.totals["comm_bytes"] += sum(line["comm_bytes"] for line in lines.values())
        self.totals["skipped_rounds"] += sum(1 for line in lines.values() if line["skipped"])
        elapsed = self.totals["elapsed"] + time.time() - self._train_start
        for line in lines.values():
            line.update(num_instances=len(self.instances), total_tokens=self.totals["tokens"], elapsed_seconds=elapsed)
        if self.args.include_num_input_tokens_seen != "no":
            state.num_input_tokens_seen = self.totals["tokens"]
        self._apply_plan()
        self._reset_round()
        self.last_synced_step = state.global_step
        ordered = [lines[i] for i in sorted(lines)]
        if self.rank == 0:
            self.run_log.write_rounds(ordered)
            self._log_round(ordered, merge_info)
        self._report(ordered)

    def _resume_hint(self) -> str:
        """What to do after a lost worker: named only when it happens (it lists the output folder)."""
        last = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
        if last is None:
            return (
                "No checkpoint has been saved yet; set save_steps to a multiple of inner_steps to be able to resume."
            )
        return f"The last checkpoint ({last}) is intact: resume with train(resume_from_checkpoint=True)."

    def _decide(self, rows: list[dict], state) -> tuple[dict[int, dict], list[Instance]]:
        """The next request of every instance and its round line, from the gathered rows (same on all ranks)."""
        cap = self._request_cap()
        lines, decided = {}, []
        for inst in self.instances:
            members = [rows[r] for r in inst.workers]
            skipped = any(m["skipped"] for m in members)
            pooled = pool_statistics(
                [GradientStatistics.from_list([m[k] for k in GradientStatistics.FIELDS]) for m in members]
            )
            new_batch = inst.batch_size
            if not skipped:
                new_batch = next_batch_size(
                    self.args.batch_size_test,
                    pooled,
                    current=inst.batch_size,
                    num_workers=len(inst.workers),
                    eta=self.args.eta,
                    theta=self.args.theta,
                    nu=self.args.nu,
                    cap=cap,
                )
            plan = plan_batch(inst.batch_size, self.max_batch_size, self.args.switch_threshold)
            steps = sum(m["loss_steps"] for m in members)
            lines[inst.id] = {
                "outer_step": self.outer_step,
                "global_step": state.global_step,
                "instance": inst.id,
                "workers": list(inst.workers),
                "batch_size": inst.batch_size,
                "next_batch_size": new_batch,
                "micro_batch_size": plan.micro_batch_size,
                "accumulation_steps": plan.accumulation_steps,
                "lr_factor": self._lr_factor(plan),
                "samples": int(sum(m["samples"] for m in members)),
                "tokens": int(sum(m["tokens"] for m in members)),
                "train_loss": sum(m["loss_sum"] for m in members) / steps if steps else math.nan,
                "grad_variance": pooled.variance,
                "grad_sq_norm": pooled.grad_sq_norm,
                "grad_ip_variance": pooled.ip_variance,
                "grad_orth_variance": pooled.orth_variance,
                "stats_dof": pooled.dof,
                "pseudo_grad_norm": members[0]["pseudo_grad_norm"],
                "comm_bytes": ring_all_reduce_bytes(int(members[0]["payload_bytes"]), len(inst.workers)),
                "comm_seconds": max(m["comm_seconds"] for m in members),
                "merged_from": [],
                "skipped": skipped,
            }
            decided.append(inst.with_batch_size(new_batch))
        return lines, decided

    def _clean_inner_optimizer(self) -> None:
        """After a skipped round, non-finite inner-optimizer moments would poison every later step: zero them."""
        for values in self.trainer.optimizer.state.values():
            for value in values.values():
                if torch.is_tensor(value) and value.is_floating_point():
                    torch.nan_to_num_(value, nan=0.0, posinf=0.0, neginf=0.0)

    def _merge(self, instances: list[Instance]) -> dict[str, Any]:
        plan = plan_merge(instances, policy=self.args.merge_policy, num_workers=self.world_size)
        transfers = plan_transfers(plan, writer_rank=0, save=self.args.save_merges)
        outcome = merging.execute_merge(
            plan,
            transfers,
            rank=self.rank,
            global_model=self.global_model,
            inner_optimizer=self.trainer.optimizer,
            with_momentum=self.args.outer_momentum > 0,
        )
        if outcome.changed_instance:
            self.collector.forget()
        moved = all_gather_rows([outcome.sent_bytes], self.args.device)
        self.totals["merges"] += 1
        if self.rank == 0 and self.args.save_merges:
            self._save_merge(plan, outcome.merged_phi)
        return {"plan": plan, "bytes": int(sum(r[0] for r in moved)), "transfers": len(transfers)}

    def _save_merge(self, plan, merged_phi: torch.Tensor) -> None:
        folder = os.path.join(self.args.output_dir, "merges", f"outer-{self.outer_step}")
        info = {
            "outer_step": self.outer_step,
            "instances": [plan.survivor, plan.merged],
            "demands": list(plan.demands),
            "weights": list(plan.weights),
            "survivor": plan.survivor,
        }
        self.save_weights(
            folder, merged_phi, title=f"AdLoCo merge at round {self.outer_step}", extra={"adloco_merge.json": info}
        )
        if self.args.push_to_hub:
            self.trainer.push_folder_to_hub(
                folder, path_in_repo=f"merges/outer-{self.outer_step}", message=f"Merge at round {self.outer_step}"
            )

    def save_weights(self, folder: str, phi: torch.Tensor, *, title: str, extra: dict | None = None) -> str:
        """Save flat global weights as a `from_pretrained` folder (on the writing rank)."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        views = self.global_model.views_of(phi)
        card = model_card(title=title, settings=self.args.adloco_settings, summary=self.summary())
        return save_model_folder(
            folder,
            model,
            state_dict=state_dict_with(model, dict(zip(names, views))),
            processing_class=self.trainer.processing_class,
            card=card,
            extra_files=extra,
        )

    def _log_round(self, lines: list[dict], merge_info: dict | None) -> None:
        batches = ", ".join(f"i{line['instance']}={line['batch_size']}→{line['next_batch_size']}" for line in lines)
        losses = [line["train_loss"] for line in lines if line["train_loss"] is not None]
        message = (
            f"round {self.outer_step} (step {lines[0]['global_step']}) | instances {len(self.instances)} | "
            f"batch {batches} | loss {min(losses) if losses else float('nan'):.4f} | "
            f"sent {_human_bytes(sum(line['comm_bytes'] for line in lines))}"
        )
        if merge_info is not None:
            plan = merge_info["plan"]
            message += f" | merged {plan.merged}→{plan.survivor} (weights {plan.weights[0]:.2f}/{plan.weights[1]:.2f})"
        skipped = [line["instance"] for line in lines if line["skipped"]]
        if skipped:
            message += f" | SKIPPED (non-finite) {skipped}"
        logger.info(message)

    def _report(self, lines: list[dict]) -> None:
        """`adloco/*` values through the Trainer's own logging (TensorBoard, W&B, ...), once per round unless
        `logging_strategy="no"`: same call on every rank."""
        if self.args.logging_strategy == "no":
            return
        demand = {inst.id: inst.demand for inst in self.instances}
        logs = {
            "adloco/round": self.outer_step,
            "adloco/num_instances": len(self.instances),
            "adloco/batch_size": sum(i.batch_size * len(i.workers) for i in self.instances) / self.world_size,
            "adloco/comm_bytes": self.totals["comm_bytes"],
            "adloco/tokens": self.totals["tokens"],
            "adloco/skipped_rounds": self.totals["skipped_rounds"],
        }
        variances = [(line["grad_variance"], demand.get(line["instance"], 0.0)) for line in lines]
        finite = [(v, d) for v, d in variances if v is not None and math.isfinite(v)]
        if finite and sum(d for _, d in finite) > 0:
            logs["adloco/grad_variance"] = sum(v * d for v, d in finite) / sum(d for _, d in finite)
        for line in lines:
            prefix = f"adloco/instance_{line['instance']}"
            logs[f"{prefix}/batch_size"] = line["next_batch_size"]
            if line["train_loss"] is not None and math.isfinite(line["train_loss"]):
                logs[f"{prefix}/train_loss"] = line["train_loss"]
        self.trainer.log(logs)

    # ---- end of training ----
    def on_train_end(self, args, state, control, **kwargs):
        if state.global_step != self.last_synced_step:
            self.end_round()  # training stopped inside a round: finish it so the replicas agree
        self.trainer.save_merged_model()
        if self.trainer.eval_dataset is not None and self.args.eval_strategy != "no":
            self.trainer.evaluate(metric_key_prefix="eval_merged")
        if self.args.push_to_hub:
            self.trainer.push_merged_to_hub(commit_message="AdLoCo merged model (end of training)")

    def merge_instances(self) -> None:
        """Turn the surviving instances into one model on every worker (collective; idempotent)."""
        if self.final_merged:
            return
        sent = merging.final_merge(self.instances, rank=self.rank, global_model=self.global_model)
        self.totals["comm_bytes"] += sum(r[0] for r in all_gather_rows([sent], self.args.device))
        self.final_merged = True

    def summary(self) -> dict[str, Any]:
        return {
            "rounds": self.outer_step,
            "inner steps": self.trainer.state.global_step,
            "workers": self.world_size,
            "instances at the end": len(self.instances),
            "final per-worker batch sizes": {i.id: i.batch_size for i in self.instances},
            "merges": self.totals["merges"],
            "tokens": self.totals["tokens"],
            "bytes communicated": self.totals["comm_bytes"],
            "skipped rounds": self.totals["skipped_rounds"],
        }

    # ---- resume ----
    def state_dict(self) -> dict[str, Any]:
        scaler = self.trainer.accelerator.scaler
        elapsed = self.totals["elapsed"] + time.time() - self._train_start
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "outer_step": self.outer_step,
            "last_synced_step": self.last_synced_step,
            "instances": [[i.id, i.batch_size, i.demand, list(i.workers)] for i in self.instances],
            "max_batch_size": self.max_batch_size,
            "base_lrs": self._base_lrs,
            "global_model": self.global_model.state_dict(),
            "inner_optimizer": self.trainer.optimizer.state_dict(),
            "sampler": self.trainer.train_sampler.state_dict(),
            "scaler": None if scaler is None else scaler.state_dict(),
            "totals": {**self.totals, "elapsed": elapsed},
        }

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Keep a worker's saved state until training starts (models and optimizers are set up in between)."""
        if state["world_size"] != self.world_size:
            raise ValueError(
                f"the checkpoint was written by {state['world_size']} workers but this run has {self.world_size}; "
                f"resume with {state['world_size']} processes (per-worker optimizer, data and instance state "
                "cannot be split or joined)"
            )
        self._resume_state = state

    def _restore(self, state: dict[str, Any]) -> None:
        self.outer_step = int(state["outer_step"])
        self.last_synced_step = int(state["last_synced_step"])
        self.max_batch_size = int(state["max_batch_size"])
        # The scheduler was loaded from rank 0's files, scaled for rank 0's batch: start again from the unscaled rates.
        self._base_lrs = list(state.get("base_lrs") or self._base_lrs)
        self.totals = dict(state["totals"])
        self._train_start = time.time()
        self.global_model.load_state_dict(state["global_model"])
        self.global_model.copy_to_params()
        self.trainer.optimizer.load_state_dict(state["inner_optimizer"])
        self.trainer.train_sampler.load_state_dict(state["sampler"])
        scaler = self.trainer.accelerator.scaler
        if scaler is not None and state["scaler"] is not None:
            scaler.load_state_dict(state["scaler"])
        self._resume_state = None

"""`RoundRules`: the settings a round's end depends on, read from `AdLoCoConfig` once, at the start of a run."""

from dataclasses import dataclass

from ..batch.controller import ControllerRules
from ..batch.switch_mode import SwitchMode


__all__ = ["RoundRules", "RoundRulesCache", "SplitRules"]


@dataclass(frozen=True)
class SplitRules:
    """How an instance's total batch is split among its workers: `"equal"`, or `"speed"` (`batch/worker_split.py`)
    with the split kept unless a new one would end a round sooner by more than `hysteresis`."""

    rule: str  # worker_batch_split
    hysteresis: float
    min_share: int  # the smallest share of a worker: G samples (2G with FSDP's two halves per process)
    share_limit: int | None  # the largest share of a worker: its data shard (None for a stream)


@dataclass(frozen=True)
class RoundRules:
    """The settings a round's decision depends on: `AdLoCoConfig`'s, the resolved micro-batch limit and the data
    shard's cap.

    Built by [`RoundRules.from_args`], the one constructor the package uses: no field has a default of its own that
    could disagree with the config's. The batch controller's settings are one `ControllerRules`, built there too and
    passed on as is.
    """

    controller: ControllerRules  # how each instance's request moves from round to round (`batch/controller.py`)
    switch: SwitchMode  # a process's largest micro-batch and γ: every plan of a round goes through it (`plan.py`)
    merge_every: int
    merge_policy: str
    merge_batch_rule: str
    lr_batch_scaling: str
    reference_batch_size: int  # a process's initial batch, which the learning-rate scaling compares with
    max_skipped_rounds: int | None  # None: never stop for skipped rounds
    # How many inner steps the next round has: fixed, or doubled up to max_inner_steps while the workers'
    # pseudo-gradients agree (outer noise <= outer_noise_theta²).
    inner_steps_rule: str
    max_inner_steps: int | None
    outer_noise_theta: float
    processes_per_worker: int  # G: requests are per worker and multiples of G, each process draws 1/G
    split: SplitRules

    @classmethod
    def from_args(cls, args, *, max_batch_size: int, shard_size: int | None) -> "RoundRules":
        """From an `AdLoCoConfig`; a request is capped by `batch_size_cap` and by a worker's data shard (None for a
        stream, which has no shard to exhaust: then only `batch_size_cap` caps it, or nothing). `shard_size` and
        `max_batch_size` are a process's; with G processes per worker the worker's shard is G of them."""
        g = getattr(args, "processes_per_worker", 1)
        fsdp_statistics = g > 1 and args.worker_parallelism == "fsdp" and args.batch_size_test != "none"
        caps = [
            cap for cap in (args.batch_size_cap, None if shard_size is None else g * shard_size) if cap is not None
        ]
        controller = ControllerRules(
            test=args.batch_size_test,
            eta=args.eta,
            theta=args.theta,
            nu=args.nu,
            cap=min(caps) if caps else None,
            smoothing=args.batch_size_smoothing,
            nonpositive_signal=args.nonpositive_signal,
            shrink=args.batch_size_shrink,
            shrink_hysteresis=args.shrink_hysteresis,
            floor=args.batch_size_floor or g * args.per_device_train_batch_size,
            target=args.batch_size_target,
            noise_scale_multiple=args.noise_scale_multiple,
            goodput_hysteresis=args.goodput_hysteresis,
            goodput_timing=args.goodput_timing,
            derived_cap=args.batch_size_cap is None,
        )
        return cls(
            controller=controller,
            switch=SwitchMode(max_batch_size, args.switch_threshold),
            merge_every=args.merge_every,
            merge_policy=args.merge_policy,
            merge_batch_rule=args.merge_batch_rule,
            lr_batch_scaling=args.lr_batch_scaling,
            reference_batch_size=args.per_device_train_batch_size,
            max_skipped_rounds=args.max_skipped_rounds,
            inner_steps_rule=args.inner_steps_rule,
            max_inner_steps=args.max_inner_steps,
            outer_noise_theta=args.outer_noise_theta,
            processes_per_worker=g,
            split=SplitRules(
                rule=args.worker_batch_split,
                hysteresis=args.split_hysteresis,
                # FSDP measures the statistics on two halves of every process's batch (config/checks.py).
                min_share=g * (2 if fsdp_statistics else 1),
                share_limit=None if shard_size is None else g * shard_size,
            ),
        )


class RoundRulesCache:
    """`RoundRules` from a run's config, built again only when its inputs change: the largest micro-batch (known
    once training starts) and a worker's data shard (it changes with the number of workers on an elastic resume).

    Args:
        args: the run's `AdLoCoConfig` (read by `RoundRules.from_args` only).
    """

    def __init__(self, args):
        self._args = args
        self._rules: RoundRules | None = None
        self._inputs: tuple[int | None, int | None] | None = None

    def get(self, *, max_batch_size: int, shard_size: int | None) -> RoundRules:
        """The rules for a process's largest micro-batch `max_batch_size` and data shard `shard_size`."""
        inputs = (max_batch_size, shard_size)
        if self._rules is None or inputs != self._inputs:
            self._rules = RoundRules.from_args(self._args, max_batch_size=max_batch_size, shard_size=shard_size)
            self._inputs = inputs
        return self._rules

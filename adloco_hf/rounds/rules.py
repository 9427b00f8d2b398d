"""The settings of the rounds: `RoundSettings`, what a user sets of a round (the initial request, its floor and cap,
H and its rule, switch mode), read from `AdLoCoConfig` in one place; and `RoundRules`, everything a round's end
depends on, built from them and the rest of the config once, at the start of a run."""

from dataclasses import dataclass

from ..batch.controller import ControllerRules
from ..batch.switch_mode import SwitchMode


__all__ = ["RoundRules", "RoundRulesCache", "RoundSettings", "SplitRules"]


@dataclass(frozen=True)
class RoundSettings:
    """What a user sets of a round: the one reader of these `AdLoCoConfig` fields (`from_args`). The start of
    training (`worker/settings.py`'s `StartSettings`), the round's rules (`RoundRules`) and the training loader
    (`trainer/loaders.py`) read them here; `tests/rounds/test_round_settings.py` checks that no other part of the
    package reads the config's fields.

    Attributes:
        initial_batch_size: `per_device_train_batch_size`: a process's first request (before a startup profile
            moves it), the statistical-efficiency reference and the learning-rate scaling's base.
        batch_size_floor: the smallest request per worker (None: the initial one, G × `initial_batch_size`).
        batch_size_cap: the largest request per worker as configured (None: the data shard, or the goodput rule's
            own bound).
        inner_steps: H of the first round.
        inner_steps_rule: `"fixed"`, or `"outer_noise"`: H doubles up to `max_inner_steps` while the workers agree.
        max_inner_steps: H's ceiling under `"outer_noise"` (None: fixed).
        outer_noise_theta: how closely the workers must agree for H to double (outer noise <= θ²).
        switch_threshold: γ of switch mode.
        max_batch_size: a process's largest micro-batch as configured (None: `"auto"`, probed when training starts).
    """

    initial_batch_size: int
    batch_size_floor: int | None
    batch_size_cap: int | None
    inner_steps: int
    inner_steps_rule: str
    max_inner_steps: int | None
    outer_noise_theta: float
    switch_threshold: float
    max_batch_size: int | None

    @classmethod
    def from_args(cls, args) -> "RoundSettings":
        """From an `AdLoCoConfig`."""
        return cls(
            initial_batch_size=args.per_device_train_batch_size,
            batch_size_floor=args.batch_size_floor,
            batch_size_cap=args.batch_size_cap,
            inner_steps=args.inner_steps,
            inner_steps_rule=args.inner_steps_rule,
            max_inner_steps=args.max_inner_steps,
            outer_noise_theta=args.outer_noise_theta,
            switch_threshold=args.switch_threshold,
            max_batch_size=None if args.max_batch_size == "auto" else int(args.max_batch_size),
        )


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
    def from_args(cls, args, *, settings: RoundSettings, max_batch_size: int, shard_size: int | None) -> "RoundRules":
        """From an `AdLoCoConfig` and its `RoundSettings` (the round's own, read once); a request is capped by
        `batch_size_cap` and by a worker's data shard (None for a stream, which has no shard to exhaust: then only
        `batch_size_cap` caps it, or nothing). `shard_size` and `max_batch_size` are a process's; with G processes
        per worker the worker's shard is G of them."""
        rounds = settings
        g = getattr(args, "processes_per_worker", 1)
        fsdp_statistics = g > 1 and args.worker_parallelism == "fsdp" and args.batch_size_test != "none"
        caps = [
            cap for cap in (rounds.batch_size_cap, None if shard_size is None else g * shard_size) if cap is not None
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
            floor=rounds.batch_size_floor or g * rounds.initial_batch_size,
            target=args.batch_size_target,
            noise_scale_multiple=args.noise_scale_multiple,
            goodput_hysteresis=args.goodput_hysteresis,
            goodput_timing=args.goodput_timing,
            derived_cap=rounds.batch_size_cap is None,
        )
        return cls(
            controller=controller,
            switch=SwitchMode(max_batch_size, rounds.switch_threshold),
            merge_every=args.merge_every,
            merge_policy=args.merge_policy,
            merge_batch_rule=args.merge_batch_rule,
            lr_batch_scaling=args.lr_batch_scaling,
            reference_batch_size=rounds.initial_batch_size,
            max_skipped_rounds=args.max_skipped_rounds,
            inner_steps_rule=rounds.inner_steps_rule,
            max_inner_steps=rounds.max_inner_steps,
            outer_noise_theta=rounds.outer_noise_theta,
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
        settings: the run's `RoundSettings` (the worker's, read once).
    """

    def __init__(self, args, settings: RoundSettings):
        self._args = args
        self._settings = settings
        self._rules: RoundRules | None = None
        self._inputs: tuple[int | None, int | None] | None = None

    def get(self, *, max_batch_size: int, shard_size: int | None) -> RoundRules:
        """The rules for a process's largest micro-batch `max_batch_size` and data shard `shard_size`."""
        inputs = (max_batch_size, shard_size)
        if self._rules is None or inputs != self._inputs:
            self._rules = RoundRules.from_args(
                self._args, max_batch_size=max_batch_size, shard_size=shard_size, settings=self._settings
            )
            self._inputs = inputs
        return self._rules

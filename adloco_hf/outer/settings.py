"""`OuterSettings`: the settings of the outer step, read from `AdLoCoConfig` once, when the worker is made."""

from dataclasses import dataclass


__all__ = ["OuterSettings"]


@dataclass(frozen=True)
class OuterSettings:
    """The outer SGD, what its all-reduce sends, and where its state lives (`GlobalModel.from_settings`).

    Built by [`OuterSettings.from_args`], the one constructor the package uses: no field has a default of its own
    that could disagree with the config's.
    """

    lr: float  # outer_lr
    momentum: float  # outer_momentum
    nesterov: bool  # outer_nesterov
    state_device: str  # outer_state_device: "device" (the worker's device) or "cpu"
    pseudo_grad_dtype: str  # the all-reduce's precision without compression
    compression: str  # pseudo_grad_compression: "none", "int8" or "int4"
    compression_block_size: int
    overlap: bool  # outer_overlap: the all-reduce runs beside the next round (eager updates)
    overlap_local_weight: float | None  # λ of the overlapped step (None: 1 / M)
    num_fragments: int | None  # Streaming DiLoCo's P (None: the whole model at the round's end)
    fragment_sync_delay: int  # τ, inner steps between sending a fragment and applying its average
    fragment_update_alpha: float  # α, the local weights' share when a fragment's average is applied

    @property
    def with_momentum(self) -> bool:
        """Whether the outer optimizer keeps a momentum (a merge then averages it too)."""
        return self.momentum > 0

    @property
    def fragments(self) -> tuple[int, int, float] | None:
        """(P, τ, α) of Streaming DiLoCo, or None without fragments (`GlobalModel`'s `fragments`)."""
        if self.num_fragments is None:
            return None
        return self.num_fragments, self.fragment_sync_delay, self.fragment_update_alpha

    @property
    def background(self) -> bool:
        """Whether the outer all-reduce runs beside the inner steps (overlap or fragments): it then needs process
        groups of its own (`WorkerGroups`)."""
        return self.overlap or self.num_fragments is not None

    @classmethod
    def from_args(cls, args) -> "OuterSettings":
        """From an `AdLoCoConfig`."""
        return cls(
            lr=args.outer_lr,
            momentum=args.outer_momentum,
            nesterov=args.outer_nesterov,
            state_device=args.outer_state_device,
            pseudo_grad_dtype=args.pseudo_grad_dtype,
            compression=args.pseudo_grad_compression,
            compression_block_size=args.compression_block_size,
            overlap=args.outer_overlap,
            overlap_local_weight=args.outer_overlap_local_weight,
            num_fragments=args.num_fragments,
            fragment_sync_delay=args.fragment_sync_delay,
            fragment_update_alpha=args.fragment_update_alpha,
        )

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

    @property
    def with_momentum(self) -> bool:
        """Whether the outer optimizer keeps a momentum (a merge then averages it too)."""
        return self.momentum > 0

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
        )

"""`Worker`: one process's part of AdLoCo (its instance, its round), with DDP or FSDP inside a worker."""

from .core import Worker


__all__ = ["Worker"]

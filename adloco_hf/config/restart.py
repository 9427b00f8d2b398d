"""The default process group of a run the elastic launcher restarted: formed on a store namespace of its own attempt.

Why: `torchrun --max-restarts N` (`--rdzv-backend c10d`) and `accelerate launch --max_restarts N` (static rendezvous)
keep one TCPStore for the whole job, owned by the launcher's agent (`TORCHELASTIC_USE_AGENT_STORE=True`), and every
attempt's workers connect to it. `init_process_group()` (env://) uses that store without an attempt prefix (torch's
`_create_c10d_store` says "We create a new TCPStore for every retry", which the shared store made untrue), so the
restarted workers read the dead attempt's keys: gloo's connectFullMesh dials the dead workers' addresses and fails
("Connection refused"), NCCL reads the old unique id (pytorch/pytorch#135712). The plain `Trainer` fails the same way.

What we do: form the default group ourselves, before accelerate would, on the same store under
`adloco/attempt_<TORCHELASTIC_RESTART_COUNT>/` (the prefix torch itself used before the store was shared). Every
group created later (`new_group` prefixes the default group's store) and every key we post live under it, so an
attempt never sees another's. accelerate finds the group formed and uses it.

Limit: the restart count is each launcher agent's own. On several nodes under `--rdzv-backend c10d`, a node whose
workers were healthy restarts them for a re-joining node without counting, and the nodes would use different
prefixes: there, set `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` on every node (torch's own opt-out: each attempt's rank 0
then hosts a fresh store, `TORCHELASTIC_USE_AGENT_STORE` is False and this module stands aside). We warn.

A CPU world without a shared store (that opt-out, or a scheduler that sets the env:// variables itself) is formed
here too, as accelerate would form it (env://), for one reason: transformers leaves the timeout out of a CPU world's
accelerator state (`TrainingArguments._setup_devices` passes `ddp_timeout` only on an accelerator), so torch's
default, 30 minutes, bounded forming the group and every collective on it, whatever `ddp_timeout` said: a machine
whose link died was waited for half an hour, and one that dialled the wrong address hung silently as long.
"""

import datetime
import os

import torch.distributed as dist

from ..common.logs import get_logger


__all__ = ["attempt_store_prefix", "form_world_for_this_attempt"]

logger = get_logger(__name__)


def attempt_store_prefix() -> str:
    """The store namespace of this launch attempt (`TORCHELASTIC_RESTART_COUNT`: 0 first, then 1, 2, ...)."""
    return f"adloco/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def form_world_for_this_attempt(*, backend: str, timeout: datetime.timedelta, cpu: bool = False) -> bool:
    """Form the default process group on this attempt's own namespace of the launcher's store, when the launcher
    shares its store with the workers and none is formed yet; with `cpu`, a gloo world on a store of the workers' own
    too, with `timeout` (module docstring). True when it formed one. Elsewhere (no launcher, one process, an
    accelerator's world on a store of its own) it leaves the group to accelerate and returns False."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_initialized() or world_size <= 1:
        return False
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return cpu and backend == "gloo" and _form_env_world(backend, timeout)
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1 and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")):
        if os.environ.get("RANK") == "0":
            logger.warning(
                "Restarts on several nodes: each node's launcher counts its own restarts, and under --rdzv-backend "
                "c10d a healthy node can restart its workers without counting, so that the nodes' workers look for "
                "each other under different attempts. Set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every node (each "
                "attempt then gets a fresh store)."
            )
    # A client of the launcher's store, as env:// would open it (torch.distributed.rendezvous._create_c10d_store).
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(attempt_store_prefix(), store),
        rank=int(os.environ["RANK"]),
        world_size=world_size,
        timeout=timeout,
    )
    return True


def _form_env_world(backend: str, timeout: datetime.timedelta) -> bool:
    """The default group formed from the env:// variables with `timeout`, where they are all set (elsewhere accelerate
    works the rank out from MPI's variables: it is left to it)."""
    if not all(os.environ.get(name) for name in ("RANK", "MASTER_ADDR", "MASTER_PORT")):
        return False
    dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
    return True

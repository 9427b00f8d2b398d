"""A worker's replica: how its G processes hold one copy of the model (`replica.py`: `ReplicaParallel`), replicated
with DDP (`ddp.py`) or sharded with FSDP (`fsdp.py`), chosen from `worker_parallelism` when the `Worker` is made."""

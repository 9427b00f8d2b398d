"""`enter_collective` on real gloo groups: workers at the same collective go on; a worker at another one, or one
that never comes, is named with the rule (the trainer's launches are in tests/trainer/test_collective_calls.py)."""

import torch.distributed as dist
from distributed_helpers import run_workers


def _attempt(name: str, timeout: float = 60.0) -> str | None:
    from adloco_hf.common.collectives import CollectiveCallError, enter_collective

    try:
        enter_collective(name, timeout)
    except CollectiveCallError as error:
        return str(error)
    return None


def same_calls(rank, world_size):
    return [_attempt("train()"), _attempt("evaluate()"), _attempt("end()")]


def other_calls(rank, world_size):
    return _attempt("train()"), _attempt("evaluate()" if rank == 0 else "end()")


def one_missing(rank, world_size):
    """Rank 1 waits for rank 0's error before it goes on: it cannot arrive in time, whatever the machine's speed."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        message = _attempt("evaluate()", timeout=0.5)
        store.set("test/rank0_done", "1")
        return message
    store.get("test/rank0_done")  # blocks until rank 0 has raised
    return None


def test_workers_at_the_same_collectives_go_on(tmp_path):
    assert run_workers(same_calls, 2, tmp_path) == [[None, None, None], [None, None, None]]


def test_a_worker_at_another_collective_is_named_on_both_sides(tmp_path):
    (train0, rank0), (train1, rank1) = run_workers(other_calls, 2, tmp_path)
    assert train0 is None and train1 is None
    assert rank0.startswith("evaluate() is collective: every worker must call it"), rank0
    assert "This worker (rank 0) called evaluate() as its collective number 2, but rank 1 called end()." in rank0
    assert "This worker (rank 1) called end() as its collective number 2, but rank 0 called evaluate()." in rank1


def test_a_worker_that_does_not_arrive_is_named_after_the_timeout(tmp_path):
    rank0, rank1 = run_workers(one_missing, 2, tmp_path)
    assert "Rank(s) 1 did not arrive within 0.5 s (worker_timeout), so this worker (rank 0) stops." in rank0, rank0
    assert "if rank == 0:" in rank0
    assert rank1 is None

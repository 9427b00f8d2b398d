"""Streaming DiLoCo's fragments and their schedule (Douillard et al., 2025, arXiv 2501.18512), as pure functions.

`num_fragments` = P cuts the flat model (the trainable parameters in their order, as φ holds them) into P contiguous
fragments whose sizes differ by at most one element. The cut may fall inside a tensor: the outer step, the error
feedback and the mix of local and global weights are all elementwise, so nothing needs a tensor whole, and equal
fragments give equal peaks. (Cutting only between tensors would leave the tiny Llama of the tests and benchmarks with
an embedding and a head of 40 % of the model each: a "fragment" of 0.4 at P = 4.)

Inside a round of H inner steps, counted from its start (offset 1 … H), fragment p ≥ 1 is *sent* (its pseudo-
gradient Δ_p = φ_p − θ_p goes into an all-reduce) after inner step ⌊p·H/P⌋, and fragment 0 at the round's end
(offset H, which is offset 0 of the next round): every fragment is sent exactly once per round, P syncs spaced
⌊H/P⌋ or ⌈H/P⌉ steps apart. Its average is *applied* `fragment_sync_delay` = τ inner steps later (τ = 0: at once):
the fragment's outer SGD steps φ_p, and θ_p ← (1 − α) φ_p + α θ_p with α = `fragment_update_alpha` (θ_p: the local
weights that trained on during the τ steps). τ ≤ ⌊H/P⌋ keeps at most one fragment in flight: an average arrives no
later than the next fragment leaves. With P = 1, τ = 0 and α = 0 this is blocking DiLoCo.

The fragments are cut from the whole model. A process that holds only shards of it (`worker_parallelism="fsdp"`)
finds its part of each fragment with `fragment_pieces`: pieces of its own flat φ, so that it syncs the elements that
the same fragment holds on a process with the whole model.
"""

__all__ = ["fragment_pieces", "fragment_ranges", "fragments_sent_at", "max_sync_delay", "send_offset"]


def fragment_ranges(numel: int, num_fragments: int) -> list[tuple[int, int]]:
    """(start, end) of the P contiguous fragments of a flat tensor of `numel` elements: the first numel mod P
    fragments hold one element more than the others.

    Example:
        >>> fragment_ranges(10, 3)
        [(0, 4), (4, 7), (7, 10)]
    """
    if num_fragments < 1:
        raise ValueError(f"num_fragments={num_fragments}: set an integer >= 1")
    if numel < num_fragments:
        raise ValueError(f"cannot cut {numel} elements into {num_fragments} non-empty fragments")
    size, extra = divmod(numel, num_fragments)
    bounds = [p * size + min(p, extra) for p in range(num_fragments + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def send_offset(fragment: int, num_fragments: int, inner_steps: int) -> int:
    """The offset in its round (1 … H) after which `fragment` is sent: ⌊p·H/P⌋ for p ≥ 1, H (the round's end) for 0.

    Example:
        >>> [send_offset(p, 4, 25) for p in range(4)]
        [25, 6, 12, 18]
    """
    if not 0 <= fragment < num_fragments:
        raise ValueError(f"fragment {fragment} of {num_fragments}")
    if inner_steps < num_fragments:
        raise ValueError(f"{num_fragments} fragments need rounds of at least {num_fragments} inner steps")
    return inner_steps if fragment == 0 else fragment * inner_steps // num_fragments


def fragments_sent_at(offset: int, num_fragments: int, inner_steps: int) -> list[int]:
    """The fragments p ≥ 1 sent after inner step `offset` of a round of `inner_steps` (at most one; fragment 0,
    sent at the round's end, is the round end's own)."""
    return [p for p in range(1, num_fragments) if send_offset(p, num_fragments, inner_steps) == offset]


def max_sync_delay(num_fragments: int, inner_steps: int) -> int:
    """The largest τ that keeps at most one fragment in flight: ⌊H/P⌋, the shortest gap between two sends."""
    return inner_steps // num_fragments


def fragment_pieces(starts: list[int], sizes: list[int], ranges: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Where each fragment of the whole model lies in a process's flat φ, as (start, end) pieces of it.

    Args:
        starts: for each tensor the process holds (in its φ's order), the position of its first element in the whole
            flat model; its elements are contiguous there (a row shard of a row-major parameter is).
        sizes: the number of elements of each tensor the process holds.
        ranges: the fragments of the whole model (`fragment_ranges`).

    Returns one list of pieces per fragment, in the process's order, adjacent pieces joined (so a process holding
    the whole model gets exactly `ranges`); a fragment with nothing on this process gets none.

    Example (two parameters of 6 and 4 elements, this process holds rows 1-2 of 3 of the first and the second half
    of the second; the whole model in 2 fragments of 5):
        >>> fragment_pieces([2, 8], [4, 2], [(0, 5), (5, 10)])
        [[(0, 3)], [(3, 6)]]
    """
    pieces: list[list[tuple[int, int]]] = [[] for _ in ranges]
    local = 0
    for start, size in zip(starts, sizes):
        for p, (a, b) in enumerate(ranges):
            lo, hi = max(a, start), min(b, start + size)
            if lo >= hi:
                continue
            piece = (local + lo - start, local + hi - start)
            if pieces[p] and pieces[p][-1][1] == piece[0]:
                pieces[p][-1] = (pieces[p][-1][0], piece[1])
            else:
                pieces[p].append(piece)
        local += size
    return pieces

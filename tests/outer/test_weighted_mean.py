"""The weighted average of pseudo-gradients (`worker_batch_split="speed"`) on real gloo groups, against hand
computations: Σ_w weight_w Δ_w in float32 and bfloat16, in the int8 ring with error feedback, overlapped, and with
the pseudo-gradient split over a worker's 2 processes (`processes_per_worker`).

One spawn of 4 processes; each returns what it saw, the parent computes the expected average from the workers'
weights and their weights before the outer step.
"""

import pytest
import torch
import torch.distributed as dist
from distributed_helpers import cached_runs, drift, flat

from adloco_hf.common.distributed import ProcessGroupCache
from adloco_hf.common.layout import WorkerLayout
from adloco_hf.outer.reduce import PseudoGradReduce
from adloco_hf.outer.ring import ring_error_bound
from adloco_hf.outer.step import GlobalModel


WORLD = 4
# Each worker's share of its instance's samples in a round (as `Worker.sample_weight` gives them): 4 + 3 + 2 + 1.
WEIGHTS = (0.4, 0.3, 0.2, 0.1)
SECOND_WEIGHTS = (0.1, 0.2, 0.3, 0.4)  # the next round's, for error feedback across a change of split
PAIR_WEIGHTS = (0.75, 0.25)  # two workers of two processes each
BLOCK = 16


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 6), torch.nn.Tanh(), torch.nn.Linear(6, 5))


NUMEL = sum(p.numel() for p in _model().parameters())


def _global_model(params, *, compression="none", dtype=torch.float32, overlap=False):
    reduce = PseudoGradReduce(compression, dtype=dtype, block_size=BLOCK)
    return GlobalModel(
        params,
        device=torch.device("cpu"),
        lr=1.0,
        momentum=0.0,
        nesterov=False,
        reduce=reduce,
        overlap=overlap,
        overlap_local_weight=None,
    )


def _rounds(rank: int, weights_by_round, **options) -> dict:
    """Rounds of drift then a weighted outer step with lr 1 (φ ← φ − Σ_w weight_w Δ_w) over the world."""
    params = list(_model().parameters())
    gm = _global_model(params, **options)
    record = {"phi0": gm.phi.detach().clone(), "theta": [], "phi": [], "residuals": []}
    for round_, weights in enumerate(weights_by_round):
        drift(params, rank, round_)
        record["theta"].append(flat(params))
        gm.outer_step(group=dist.group.WORLD, num_workers=WORLD, weight=weights[rank])
        record["phi"].append(gm.phi.detach().clone())
        residual = gm.reduce.error_feedback.residual if gm.reduce.error_feedback is not None else None
        record["residuals"].append(None if residual is None else residual.clone())
    if gm.overlap:
        gm.settle()  # the average in flight, applied
        record["settled"] = gm.phi.detach().clone()
    return record


def _two_processes_per_worker(rank: int) -> dict:
    """Workers {0, 1} and {2, 3} (2 processes each): local rank l reduces slice l of Δ with the other worker's local
    rank l, weighted by its worker's weight, and the worker's processes all-gather the slices."""
    layout = WorkerLayout(WORLD, 2)
    groups = ProcessGroupCache()
    intra = [groups.get(ranks) for ranks in layout.intra_groups()]  # every rank creates every group, in order
    cross = [groups.get(layout.cross_ranks((0, 1), local)) for local in range(2)]
    worker, local = layout.worker_of(rank), layout.local_rank(rank)
    params = list(_model().parameters())
    gm = _global_model(params)
    gm.split_over(intra[worker], 2, local)
    drift(params, worker, 0)  # a worker's processes hold the same replica (DDP inside it)
    theta = flat(params)
    gm.outer_step(group=cross[local], num_workers=2, weight=PAIR_WEIGHTS[worker])
    return {"phi0": flat(_model().parameters()), "theta": theta, "phi": gm.phi.detach().clone()}


def weighted_worker(rank: int, world_size: int) -> dict:
    return {
        "world_size": dist.get_world_size(),
        "float32": _rounds(rank, [WEIGHTS]),
        "bfloat16": _rounds(rank, [WEIGHTS], dtype=torch.bfloat16),
        "int8": _rounds(rank, [WEIGHTS, SECOND_WEIGHTS], compression="int8"),
        "overlap": _rounds(rank, [WEIGHTS], overlap=True),
        "processes": _two_processes_per_worker(rank),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return cached_runs(weighted_worker, tmp_path_factory, "weighted")(WORLD)


def _hand_weighted(phi, thetas, weights):
    """φ − Σ_w weight_w (φ − θ_w) in float64."""
    return phi.double() - sum(w * (phi.double() - t.double()) for w, t in zip(weights, thetas))


pytestmark = pytest.mark.multiprocess


def test_the_weighted_float32_average_is_the_hand_computed_one(runs):
    assert [r["world_size"] for r in runs] == [WORLD] * WORLD
    records = [r["float32"] for r in runs]
    expected = _hand_weighted(records[0]["phi0"], [r["theta"][0] for r in records], WEIGHTS)
    plain = _hand_weighted(records[0]["phi0"], [r["theta"][0] for r in records], [0.25] * WORLD)
    assert (expected - plain).abs().max() > 1e-3  # the weights matter
    for record in records:
        assert torch.equal(record["phi"][0], records[0]["phi"][0])
        assert (record["phi"][0].double() - expected).abs().max() <= 1e-6


def test_the_weighted_bfloat16_average_is_within_bfloat16_rounding(runs):
    records = [r["bfloat16"] for r in runs]
    phi0 = records[0]["phi0"]
    expected = _hand_weighted(phi0, [r["theta"][0] for r in records], WEIGHTS)
    terms = torch.stack([w * (phi0.double() - r["theta"][0].double()) for w, r in zip(WEIGHTS, records)])
    # Each term is rounded to bfloat16 (2⁻⁸ relative) and so is each partial sum of the all-reduce.
    bound = 2**-8 * (terms.abs().sum(0) * 2 + (phi0.double() - expected).abs()) + 1e-7
    assert ((records[0]["phi"][0].double() - expected).abs() <= bound).all()


def test_the_weighted_int8_ring_is_the_ring_of_pre_scaled_inputs_and_loses_nothing(runs):
    records = [r["int8"] for r in runs]
    phi = records[0]["phi0"].double()
    for round_, weights in enumerate([WEIGHTS, SECOND_WEIGHTS]):
        # The ring averages x_w = M weight_w Δ_w + e_w (e_w: the worker's residual from the round before).
        carried = [torch.zeros(NUMEL) if round_ == 0 else r["residuals"][round_ - 1] for r in records]
        inputs = torch.stack(
            [
                WORLD * w * (phi - r["theta"][round_].double()) + e.double()
                for w, r, e in zip(weights, records, carried)
            ]
        )
        got = records[0]["phi"][round_].double()
        for r in records:
            assert torch.equal(r["phi"][round_], records[0]["phi"][round_])
        bound = ring_error_bound(inputs.abs().sum(0).float(), WORLD, bits=8, block_size=BLOCK).double()
        error = (got - (phi - inputs.mean(0))).abs()
        assert (error <= bound + 1e-7).all() and error.max() > 0
        # Error feedback: residuals + M × the applied mean = the scaled inputs, whatever the round's weights.
        kept = sum(r["residuals"][round_].double() for r in records)
        assert (kept + WORLD * (phi - got) - inputs.sum(0)).abs().max() <= 1e-5
        phi = got
    # Over both rounds nothing is lost: what was applied plus the residuals / M is the exact weighted sum.
    exact, start = 0, records[0]["phi0"].double()
    for round_, weights in enumerate([WEIGHTS, SECOND_WEIGHTS]):
        before = start if round_ == 0 else records[0]["phi"][round_ - 1].double()
        exact = exact + sum(w * (before - r["theta"][round_].double()) for w, r in zip(weights, records))
    applied = records[0]["phi0"].double() - records[0]["phi"][-1].double()
    residuals = sum(r["residuals"][-1].double() for r in records) / WORLD
    assert (applied + residuals - exact).abs().max() <= 1e-5


def test_the_overlapped_step_sends_the_weighted_average(runs):
    records = [r["overlap"] for r in runs]
    expected = _hand_weighted(records[0]["phi0"], [r["theta"][0] for r in records], WEIGHTS)
    for record in records:
        assert torch.equal(record["phi"][0], records[0]["phi0"])  # round 1: nothing arrived yet
        assert (record["settled"].double() - expected).abs().max() <= 1e-6


def test_a_worker_of_two_processes_sends_its_slices_with_its_weight(runs):
    records = [r["processes"] for r in runs]
    thetas = [records[0]["theta"], records[2]["theta"]]  # one per worker
    assert torch.equal(records[0]["theta"], records[1]["theta"]) and not torch.equal(*thetas)
    expected = _hand_weighted(records[0]["phi0"], thetas, PAIR_WEIGHTS)
    for record in records:
        assert (record["phi"].double() - expected).abs().max() <= 1e-6

"""The outer step's communication options on real gloo groups: `pseudo_grad_compression` (int8 / int4 blocks with
error feedback) and `outer_overlap` (eager updates, the average applied one round late).

Workers drift apart like inner steps would, call `GlobalModel.outer_step`, and return what they saw; the parent
checks it against references written out here (the exact mean, the compressed ring's bound, and Kale et al.'s
per-worker eager update with a torch SGD per worker).
"""

import io

import pytest
import torch
import torch.distributed as dist
from distributed_helpers import cached_runs, drift, flat

from adloco_hf.outer.compression import wire_bytes
from adloco_hf.outer.reduce import PseudoGradReduce
from adloco_hf.outer.ring import ring_error_bound
from adloco_hf.outer.step import GlobalModel


LR, MOMENTUM = 0.7, 0.9
ROUNDS = 4
BLOCK = 16


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 6), torch.nn.Tanh(), torch.nn.Linear(6, 5))


NUMEL = sum(p.numel() for p in _model().parameters())


def _global_model(
    params, *, compression="none", overlap=False, lr=LR, momentum=MOMENTUM, nesterov=True, local_weight=1.0
):
    reduce = PseudoGradReduce(compression, dtype=torch.float32, block_size=BLOCK)
    return GlobalModel(
        params,
        device=torch.device("cpu"),
        lr=lr,
        momentum=momentum,
        nesterov=nesterov,
        reduce=reduce,
        overlap=overlap,
        overlap_local_weight=local_weight,
    )


def _run(
    rank,
    group,
    num_workers,
    *,
    compression="none",
    overlap=False,
    rounds=ROUNDS,
    lr=LR,
    momentum=MOMENTUM,
    local_weight=1.0,
    same_drift=False,
):
    params = list(_model().parameters())
    gm = _global_model(
        params, compression=compression, overlap=overlap, lr=lr, momentum=momentum, local_weight=local_weight
    )
    record = {"phi0": gm.phi.detach().clone(), "theta_before": [], "theta_after": [], "phi": [], "results": []}
    record["residuals"] = []  # each round's residual after its outer step (None without compression)
    record["arrived"] = []  # overlapped: the average each round sent (waited for here; wait() may be called again)

    def residual():
        kept = gm.reduce.error_feedback.residual if gm.reduce.error_feedback is not None else None
        return None if kept is None else kept.clone()

    for round_ in range(rounds):
        drift(params, 0 if same_drift else rank, round_)
        record["theta_before"].append(flat(params))
        result = gm.outer_step(group=group, num_workers=num_workers)
        record["theta_after"].append(flat(params))
        record["phi"].append(gm.phi.detach().clone())
        record["results"].append(result)
        if gm.pending is not None:  # the background ring done, so that its residual is final
            record["arrived"].append(gm.pending.wait().detach().clone())
        record["residuals"].append(residual())
    record["residual"] = residual()
    gm.settle()
    record["settled_theta"], record["settled_phi"] = flat(params), gm.phi.detach().clone()
    return record


def _round_trip(rank, group, num_workers, *, compression, overlap) -> dict:
    """Two rounds, a checkpoint (through bytes, with the average in flight and the residual), then two more rounds
    from the original and from a fresh model restored from the checkpoint."""
    params = list(_model().parameters())
    gm = _global_model(params, compression=compression, overlap=overlap)
    for round_ in range(2):
        drift(params, rank, round_)
        gm.outer_step(group=group, num_workers=num_workers)
    buffer = io.BytesIO()
    torch.save(gm.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh_params = list(_model(seed=99).parameters())
    fresh = _global_model(fresh_params, compression=compression, overlap=overlap)
    fresh.load_state_dict(state)
    fresh.copy_to_params()
    out = {"saved_pending": state["pending"] is not None, "saved_residual": state["error_feedback"] is not None}
    for name, model, ps in (("original", gm, params), ("restored", fresh, fresh_params)):
        thetas = []
        for round_ in (2, 3):
            drift(ps, rank, round_)
            model.outer_step(group=group, num_workers=num_workers)
            thetas.append(flat(ps))
        model.settle()
        out[name] = {"thetas": thetas, "phi": model.phi.detach().clone(), "final": flat(ps)}
    return out


def options_worker(rank: int, world_size: int) -> dict:
    world = dist.group.WORLD
    out = {"world_size": dist.get_world_size()}
    for compression in ("int8", "int4"):
        out[compression] = _run(rank, world, world_size, compression=compression, lr=1.0, momentum=0.0)
    out["overlap"] = _run(rank, world, world_size, overlap=True, local_weight=None)  # Kale et al.'s λ = 1 / M
    out["overlap_local"] = _run(rank, world, world_size, overlap=True)  # λ = 1, the default
    # Workers that all drift alike: λ = 1 is then exactly blocking DiLoCo; λ = 1 / M lags a round.
    out["agree_blocking"] = _run(rank, world, world_size, same_drift=True)
    out["agree_local"] = _run(rank, world, world_size, overlap=True, same_drift=True)
    out["agree_eager"] = _run(rank, world, world_size, overlap=True, local_weight=None, same_drift=True)
    out["overlap_int4"] = _run(rank, world, world_size, compression="int4", overlap=True)
    for name, compression, overlap in (("int4", "int4", False), ("overlap", "none", True), ("both", "int4", True)):
        out[f"trip_{name}"] = _round_trip(rank, world, world_size, compression=compression, overlap=overlap)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return cached_runs(options_worker, tmp_path_factory, "outer_options")


# ---- compression ----


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("compression,bits", [("int8", 8), ("int4", 4)])
def test_compressed_outer_step_applies_the_ring_mean_within_its_bound(runs, world_size, compression, bits):
    records = runs(world_size)
    assert [r["world_size"] for r in records] == [world_size] * world_size
    workers = [r[compression] for r in records]
    largest = 0.0
    for round_ in range(ROUNDS):
        phi_before = workers[0]["phi0"] if round_ == 0 else workers[0]["phi"][round_ - 1]
        for w in workers[1:]:
            assert torch.equal(w["phi"][round_], workers[0]["phi"][round_])  # every worker applies the same bytes
        # With lr 1 and no momentum φ ← φ − ring mean of the compensated inputs x_w = Δ_w + e_w (each worker's
        # residual from the round before, recorded): within the ring's bound of their exact mean, element by element,
        # with nothing added for the residuals.
        carried = [torch.zeros(NUMEL) if round_ == 0 else w["residuals"][round_ - 1] for w in workers]
        inputs = torch.stack(
            [phi_before.double() - w["theta_before"][round_].double() + e.double() for w, e in zip(workers, carried)]
        )
        got = workers[0]["phi"][round_].double()
        error = (got - (phi_before.double() - inputs.mean(0))).abs()
        bound = ring_error_bound(inputs.abs().sum(0).float(), world_size, bits=bits, block_size=BLOCK).double()
        assert (error <= bound + 1e-7).all(), (error - bound).max()
        largest = max(largest, error.max().item())
        # Error feedback: what every worker's quantizations dropped is its new residual, so the residuals and M
        # times the mean that was applied add up to the inputs (ring.py's docstring).
        applied = phi_before.double() - got
        kept = sum(w["residuals"][round_].double() for w in workers)
        assert (kept + world_size * applied - inputs.sum(0)).abs().max() <= 1e-5
        for w in workers:
            result = w["results"][round_]
            assert result.payload_bytes == wire_bytes(NUMEL, bits=bits, block_size=BLOCK)
            assert torch.equal(w["theta_after"][round_], w["phi"][round_])
    assert largest > 1e-5  # it really was quantized
    assert all(w["residual"] is not None and w["residual"].abs().max() > 0 for w in workers)


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_error_feedback_loses_nothing_across_rounds_in_the_outer_step(runs, world_size):
    """lr 1, no momentum: φ_R = φ_0 − Σ_r mean_r, and Σ_r mean_r + Σ_w e_w / M = Σ_r mean(Δ_r) exactly (to float)."""
    workers = [r["int4"] for r in runs(world_size)]
    phi0 = workers[0]["phi0"].double()
    total_sent = phi0 - workers[0]["phi"][-1].double()
    phis = [phi0] + [w.double() for w in workers[0]["phi"][:-1]]
    total_input = sum(
        torch.stack([phis[r] - w["theta_before"][r].double() for w in workers]).mean(0) for r in range(ROUNDS)
    )
    residuals = torch.stack([w["residual"].double() for w in workers]).mean(0)
    assert (total_sent + residuals - total_input).abs().max() <= 1e-5
    assert residuals.abs().max() > 1e-4  # without the residual the totals would differ


# ---- overlap (eager updates) ----


def _eager_reference(records, *, lr=LR, momentum=MOMENTUM, nesterov=True, local_weight=None, means=None):
    """The eager update with one torch SGD per worker on its own outer parameters (float64):
    Δ̃_t^m = Δ_(t−1) + λ (Δ_t^m − Δ_(t−1)^m), Δ_t^m measured from the worker's own start point; λ = 1 / M is Kale
    et al.'s. `means[t]`: the average Δ_t that arrived (a compressed ring's), instead of the exact one."""
    num_workers = len(records)
    weight = 1 / num_workers if local_weight is None else local_weight
    params = [records[0]["phi0"].double().clone().requires_grad_() for _ in range(num_workers)]
    optimizers = [torch.optim.SGD([p], lr=lr, momentum=momentum, nesterov=nesterov) for p in params]
    previous = [torch.zeros_like(params[0]) for _ in range(num_workers)]
    previous_mean = torch.zeros_like(params[0])
    starts = []
    for round_ in range(ROUNDS):
        deltas = [params[m].detach() - records[m]["theta_before"][round_].double() for m in range(num_workers)]
        for m in range(num_workers):
            params[m].grad = previous_mean + (deltas[m] - previous[m]) * weight
            optimizers[m].step()
        previous, previous_mean = deltas, torch.stack(deltas).mean(0) if means is None else means[round_]
        starts.append([p.detach().clone() for p in params])
    return starts


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("name,local_weight", [("overlap", None), ("overlap_local", 1.0)])
def test_overlapped_step_is_the_eager_update_and_phi_stays_shared(runs, world_size, name, local_weight):
    records = runs(world_size)
    assert [r["world_size"] for r in records] == [world_size] * world_size
    workers = [r[name] for r in records]
    reference = _eager_reference(workers, local_weight=local_weight)
    for round_ in range(ROUNDS):
        for w in workers[1:]:
            assert torch.equal(w["phi"][round_], workers[0]["phi"][round_])  # φ: the same on every worker
        spread = torch.stack([w["theta_after"][round_] for w in workers])
        assert (spread.max(0).values - spread.min(0).values).max() > 1e-4  # θ = φ + o differs per worker
        for m, w in enumerate(workers):
            assert (w["theta_after"][round_].double() - reference[round_][m]).abs().max() <= 1e-5
        result = workers[0]["results"][round_]
        assert result.payload_bytes == NUMEL * 4 and not result.skipped
        assert (result.pseudo_grad_norm == 0.0) == (round_ == 0)  # nothing arrived before the first round's end
    # Settling applies the last average and drops the offsets: the workers agree again.
    for w in workers[1:]:
        assert torch.equal(w["settled_theta"], workers[0]["settled_theta"])
    assert torch.equal(workers[0]["settled_theta"], workers[0]["settled_phi"])


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_when_the_workers_agree_local_weight_one_is_blocking_diloco_and_kale_lags(runs, world_size):
    records = runs(world_size)
    for record in records:
        blocking, local, eager = record["agree_blocking"], record["agree_local"], record["agree_eager"]
        for round_ in range(ROUNDS):
            assert (local["theta_after"][round_] - blocking["theta_after"][round_]).abs().max() <= 1e-5
        lag = (eager["theta_after"][-1] - blocking["theta_after"][-1]).abs().max()
        assert lag > 1e-2  # λ = 1 / M starts the next round without most of the last one's progress


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_overlap_with_int4_is_the_eager_update_of_the_ring_mean_of_the_compensated_deltas(runs, world_size):
    """int4 with `outer_overlap`: each round's Δ_t^m plus the worker's residual goes round the compressed ring in the
    background; what arrives is within the ring's bound of the exact mean of those inputs, the residuals keep what
    the quantizations dropped, and θ follows the eager update fed the averages that arrived, one round late."""
    records = runs(world_size)
    assert [r["world_size"] for r in records] == [world_size] * world_size
    workers = [r["overlap_int4"] for r in records]
    assert all(len(w["arrived"]) == ROUNDS for w in workers)  # every round sent its Δ (none left unmeasured)
    largest = 0.0
    for round_ in range(ROUNDS):
        for w in workers[1:]:
            assert torch.equal(w["arrived"][round_], workers[0]["arrived"][round_])
            assert torch.equal(w["phi"][round_], workers[0]["phi"][round_])
        starts = [w["phi0"] if round_ == 0 else w["theta_after"][round_ - 1] for w in workers]
        carried = [torch.zeros(NUMEL) if round_ == 0 else w["residuals"][round_ - 1] for w in workers]
        inputs = torch.stack(
            [s.double() - w["theta_before"][round_].double() + e.double() for s, w, e in zip(starts, workers, carried)]
        )
        arrived = workers[0]["arrived"][round_].double()
        error = (arrived - inputs.mean(0)).abs()
        bound = ring_error_bound(inputs.abs().sum(0).float(), world_size, bits=4, block_size=BLOCK).double()
        assert (error <= bound + 1e-7).all(), (error - bound).max()
        largest = max(largest, error.max().item())
        kept = sum(w["residuals"][round_].double() for w in workers)
        assert (kept + world_size * arrived - inputs.sum(0)).abs().max() <= 1e-5
    assert largest > 1e-5  # it really was quantized
    # θ: the eager update (λ = 1) of each worker's own Δ, corrected by the averages that arrived.
    reference = _eager_reference(workers, local_weight=1.0, means=[a.double() for a in workers[0]["arrived"]])
    for round_ in range(ROUNDS):
        for m, w in enumerate(workers):
            assert (w["theta_after"][round_].double() - reference[round_][m]).abs().max() <= 1e-5
    for w in workers[1:]:
        assert torch.equal(w["settled_phi"], workers[0]["settled_phi"])


def test_overlap_with_one_worker_equals_the_blocking_outer_step():
    """M = 1: the eager update is the worker's own Δ at once, so φ + o follows blocking DiLoCo step for step."""
    blocking, overlapped = _run(0, None, 1, rounds=5), _run(0, None, 1, overlap=True, rounds=5)
    for round_ in range(5):
        assert (overlapped["theta_after"][round_] - blocking["theta_after"][round_]).abs().max() <= 1e-6
    assert (overlapped["settled_phi"] - blocking["settled_phi"]).abs().max() <= 1e-6
    assert overlapped["results"][0].payload_bytes == 0


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("name", ["int4", "overlap", "both"])
def test_a_checkpoint_with_a_residual_or_an_average_in_flight_resumes_exactly(runs, world_size, name):
    for record in runs(world_size):
        trip = record[f"trip_{name}"]
        assert trip["saved_residual"] == (name != "overlap")
        assert trip["saved_pending"] == (name != "int4")
        original, restored = trip["original"], trip["restored"]
        for a, b in zip(original["thetas"], restored["thetas"]):
            assert (a - b).abs().max() <= 1e-6
        assert (original["final"] - restored["final"]).abs().max() <= 1e-6


def test_a_nonfinite_local_delta_is_not_applied_eagerly_and_skips_the_next_average():
    params = list(_model().parameters())
    gm = _global_model(params, overlap=True)
    drift(params, 0, 0)
    gm.outer_step(group=None, num_workers=1)
    with torch.no_grad():
        params[0][0, 0] = float("nan")
    spoiled = gm.outer_step(group=None, num_workers=1)
    assert not spoiled.local_finite and not spoiled.skipped  # the first round's average was finite
    assert torch.isfinite(flat(params)).all()  # θ = φ + o kept the NaN out
    after = gm.outer_step(group=None, num_workers=1)
    assert after.skipped and torch.isfinite(gm.phi).all()

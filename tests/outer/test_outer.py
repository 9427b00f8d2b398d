"""The outer step (DESIGN §3.1) on real gloo process groups: pseudo-gradient, bucketed all-reduce, outer SGD, θ ← φ.

Workers start from the same θ, drift apart with different local updates (the inner steps), then call `outer_step`.
They return what they saw; the assertions run in the parent against hand-written references.
"""

import io
import math

import pytest
import torch
import torch.distributed as dist
from distributed_helpers import cached_runs, drift, flat

from adloco_hf.common.distributed import ProcessGroupCache
from adloco_hf.outer import reduce as outer_reduce
from adloco_hf.outer.step import DTYPES, GlobalModel, ring_all_reduce_bytes


ROUNDS = 3
LR, MOMENTUM = 0.7, 0.9
SMALL_BUCKET = 7  # 39 elements: five full buckets and a short one


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


NUMEL = sum(p.numel() for p in _model().parameters())


def _momentum(gm: GlobalModel):
    return None if gm.momentum is None else gm.momentum.clone()


def _step(gm: GlobalModel, group, num_workers: int, dtype=torch.float32) -> dict:
    phi_before = gm.phi.detach().clone()
    result = gm.outer_step(group=group, num_workers=num_workers, dtype=dtype)
    return {
        "phi_before": phi_before,
        "phi": gm.phi.detach().clone(),
        "theta": flat(gm.params),
        "momentum": _momentum(gm),
        "norm": result.pseudo_grad_norm,
        "payload": result.payload_bytes,
        "skipped": result.skipped,
        "phi_dtype": gm.phi.dtype,
    }


def _rounds(rank, group, num_workers, *, dtype, lr, momentum, nesterov, corrupt=None, rounds=ROUNDS) -> dict:
    """`rounds` rounds of drift then outer step; `corrupt(rank, round_, params)` may spoil θ before a step."""
    params = list(_model().parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=lr, momentum=momentum, nesterov=nesterov)
    record = {"phi0": gm.phi.detach().clone(), "theta_before": [], "steps": []}
    for round_ in range(rounds):
        drift(params, rank, round_)
        if corrupt is not None:
            corrupt(rank, round_, params)
        record["theta_before"].append(flat(params))
        record["steps"].append(_step(gm, group, num_workers, dtype))
    return record


@torch.no_grad()
def _corrupt(rank: int, round_: int, params) -> None:
    """Round 1: a NaN on the last worker only; round 2: an inf on worker 0 only."""
    if round_ == 1 and rank == dist.get_world_size() - 1:
        params[0][0, 0] = math.nan
    if round_ == 2 and rank == 0:
        params[1][0] = math.inf


def _state_round_trip(rank: int, world_size: int) -> dict:
    """Two rounds, a checkpoint of the global model (through bytes), then one more round from both copies."""
    world = dist.group.WORLD
    params = list(_model().parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=LR, momentum=MOMENTUM, nesterov=True)
    for round_ in range(2):
        drift(params, rank, round_)
        gm.outer_step(group=world, num_workers=world_size, dtype=torch.float32)
    buffer = io.BytesIO()
    torch.save(gm.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh_params = list(_model(seed=99).parameters())  # different weights: everything must come from the state
    fresh = GlobalModel(fresh_params, device=torch.device("cpu"), lr=LR, momentum=MOMENTUM, nesterov=True)
    fresh.load_state_dict(state)
    fresh.copy_to_params()
    out = {}
    for name, model, ps in (("original", gm, params), ("restored", fresh, fresh_params)):
        drift(ps, rank, 2)
        out[name] = _step(model, world, world_size)
    return out


def _singleton_in_world(rank: int, world_size: int) -> dict:
    """Instances {0, 1} and {2} in a world of 3: the pair averages over its own group, rank 2 sends nothing."""
    groups = ProcessGroupCache()
    members = (0, 1) if rank < 2 else (2,)
    group = groups.get(members)
    params = list(_model().parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=1.0, momentum=0.0, nesterov=False)
    drift(params, rank, 0)
    theta = flat(params)
    collectives = ("all_reduce", "broadcast", "send", "recv", "all_gather", "reduce_scatter")
    saved = {name: getattr(dist, name) for name in collectives}
    if rank == 2:

        def forbidden(*args, **kwargs):
            raise AssertionError("a group of one must not communicate")

        for name in collectives:
            setattr(dist, name, forbidden)
    try:
        # bfloat16 is asked for, but a single worker must keep Δ in float32 (no round trip through bf16).
        step = _step(gm, group, len(members), torch.bfloat16 if rank == 2 else torch.float32)
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
    return {"group_is_none": group is None, "theta_before": theta, "step": step}


def outer_worker(rank: int, world_size: int) -> dict:
    world = dist.group.WORLD
    out = {}
    for name, dtype, bucket in (
        ("float32", torch.float32, outer_reduce.BUCKET_NUMEL),
        ("float32_buckets", torch.float32, SMALL_BUCKET),
        ("bfloat16", torch.bfloat16, outer_reduce.BUCKET_NUMEL),
        ("bfloat16_buckets", torch.bfloat16, SMALL_BUCKET),
    ):
        default, outer_reduce.BUCKET_NUMEL = outer_reduce.BUCKET_NUMEL, bucket
        try:
            out[name] = _rounds(rank, world, world_size, dtype=dtype, lr=1.0, momentum=0.0, nesterov=False)
        finally:
            outer_reduce.BUCKET_NUMEL = default
    for nesterov in (False, True):
        out[f"momentum_nesterov={nesterov}"] = _rounds(
            rank, world, world_size, dtype=torch.float32, lr=LR, momentum=MOMENTUM, nesterov=nesterov
        )
    out["nonfinite"] = _rounds(
        rank,
        world,
        world_size,
        dtype=torch.float32,
        lr=LR,
        momentum=MOMENTUM,
        nesterov=True,
        corrupt=_corrupt,
        rounds=4,
    )
    out["state"] = _state_round_trip(rank, world_size)
    if world_size == 3:
        out["singleton"] = _singleton_in_world(rank, world_size)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`runs(world_size)`: every worker's record, in rank order (one spawn per world size, shared by the tests)."""
    return cached_runs(outer_worker, tmp_path_factory, "outer")


def _sgd_reference(phi0, thetas_per_round, *, lr, momentum, nesterov):
    """torch.optim.SGD written out (float64) on the averaged pseudo-gradient, round after round."""
    phi, buf, out = phi0.double(), None, []
    for thetas in thetas_per_round:
        delta = torch.stack([phi - t.double() for t in thetas]).mean(0)
        buf = delta.clone() if buf is None else momentum * buf + delta
        phi = phi - lr * (delta + momentum * buf if nesterov else buf)
        out.append((phi, buf))
    return out


def _assert_replicas_identical(records, key="phi"):
    for rank, record in enumerate(records[1:], start=1):
        assert torch.equal(record[key], records[0][key]), f"rank {rank}'s {key} differs from rank 0's"


# ---- multi-process ----


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("variant", ["float32", "float32_buckets"])
def test_outer_lr_one_without_momentum_is_exactly_the_mean_of_the_workers(runs, world_size, variant):
    workers = [r[variant] for r in runs(world_size)]
    for round_ in range(ROUNDS):
        thetas = torch.stack([w["theta_before"][round_] for w in workers])
        assert (thetas.max(0).values - thetas.min(0).values).max() > 1e-2  # the workers really drifted apart
        mean = thetas.double().mean(0)
        steps = [w["steps"][round_] for w in workers]
        _assert_replicas_identical(steps, "phi")
        for step in steps:
            assert step["phi_dtype"] == torch.float32
            assert (step["phi"].double() - mean).abs().max() <= 1e-6
            assert torch.equal(step["theta"], step["phi"])  # θ ← φ
            assert not step["skipped"]
            assert step["payload"] == NUMEL * 4
            expected_norm = torch.linalg.vector_norm(step["phi_before"].double() - mean).item()
            assert step["norm"] == pytest.approx(expected_norm, rel=1e-5)


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("variant", ["bfloat16", "bfloat16_buckets"])
def test_bfloat16_all_reduce_gives_the_mean_within_bfloat16_rounding(runs, world_size, variant):
    workers = [r[variant] for r in runs(world_size)]
    largest_error = 0.0
    for round_ in range(ROUNDS):
        steps = [w["steps"][round_] for w in workers]
        _assert_replicas_identical(steps, "phi")  # every worker applies the same reduced bf16 values
        phi_before = steps[0]["phi_before"].double()
        deltas = torch.stack([phi_before - w["theta_before"][round_].double() for w in workers])
        mean = phi_before - deltas.mean(0)
        # Each Δ_w / M is rounded to bf16 (unit roundoff 2⁻⁸), then M − 1 bf16 additions round again.
        tolerance = 2 * world_size * 2**-8 * deltas.abs().max(0).values + 1e-6
        for step in steps:
            assert step["phi_dtype"] == torch.float32  # φ itself stays float32
            error = (step["phi"].double() - mean).abs()
            assert (error <= tolerance).all(), (error - tolerance).max()
            assert torch.equal(step["theta"], step["phi"])
            assert step["payload"] == NUMEL * 2  # half the bytes of float32
            largest_error = max(largest_error, error.max().item())
    assert largest_error > 1e-6  # the all-reduce really ran in bf16


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_and_nesterov_match_sgd_on_the_averaged_pseudo_gradient(runs, world_size, nesterov):
    workers = [r[f"momentum_nesterov={nesterov}"] for r in runs(world_size)]
    thetas = [[w["theta_before"][round_] for w in workers] for round_ in range(ROUNDS)]
    reference = _sgd_reference(workers[0]["phi0"], thetas, lr=LR, momentum=MOMENTUM, nesterov=nesterov)
    for round_, (phi, buf) in enumerate(reference):
        steps = [w["steps"][round_] for w in workers]
        _assert_replicas_identical(steps, "phi")
        _assert_replicas_identical(steps, "momentum")
        for step in steps:
            assert (step["phi"].double() - phi).abs().max() <= 1e-5
            assert (step["momentum"].double() - buf).abs().max() <= 1e-5
            assert torch.equal(step["theta"], step["phi"])
    # Nesterov really changes the step (the two runs share their drift, so they differ only by the rule).
    other = [r[f"momentum_nesterov={not nesterov}"] for r in runs(world_size)]
    assert not torch.allclose(workers[0]["steps"][-1]["phi"], other[0]["steps"][-1]["phi"], atol=1e-4)


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_non_finite_pseudo_gradient_on_one_worker_skips_the_step_on_all(runs, world_size):
    workers = [r["nonfinite"] for r in runs(world_size)]
    # Round 1 has a NaN on the last worker only, round 2 an inf on worker 0 only; rounds 0 and 3 are clean.
    assert [[w["steps"][i]["skipped"] for i in range(4)] for w in workers] == [[False, True, True, False]] * world_size
    for i in (1, 2):
        steps = [w["steps"][i] for w in workers]
        before = [w["steps"][i - 1] for w in workers]
        for step, previous in zip(steps, before):
            assert not math.isfinite(step["norm"])
            assert torch.equal(step["phi"], step["phi_before"])  # φ unchanged...
            assert torch.equal(step["momentum"], previous["momentum"])  # ...and so is the momentum
            assert torch.equal(step["theta"], step["phi"])  # θ ← φ: the spoiled local weights are gone
            assert torch.isfinite(step["theta"]).all()
    # The clean round after the skips is an ordinary step from the restored weights.
    thetas = [[w["theta_before"][i] for w in workers] for i in range(4)]
    steps = [w["steps"][3] for w in workers]
    _assert_replicas_identical(steps, "phi")
    phi_before = steps[0]["phi_before"].double()
    delta = torch.stack([phi_before - t.double() for t in thetas[3]]).mean(0)
    buf = MOMENTUM * workers[0]["steps"][2]["momentum"].double() + delta
    expected = phi_before - LR * (delta + MOMENTUM * buf)
    for step in steps:
        assert not step["skipped"]
        assert (step["phi"].double() - expected).abs().max() <= 1e-5


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_state_dict_round_trip_gives_the_same_next_step(runs, world_size):
    for rank, record in enumerate(runs(world_size)):
        original, restored = record["state"]["original"], record["state"]["restored"]
        for key in ("phi_before", "phi", "theta", "momentum"):
            assert torch.equal(original[key], restored[key]), (rank, key)
        assert original["norm"] == restored["norm"]


@pytest.mark.multiprocess
def test_a_group_of_one_does_not_communicate_and_is_exact(runs):
    records = [r["singleton"] for r in runs(3)]
    assert [r["group_is_none"] for r in records] == [False, False, True]
    # The pair averaged over its own group only...
    mean = torch.stack([records[0]["theta_before"], records[1]["theta_before"]]).double().mean(0)
    for record in records[:2]:
        assert (record["step"]["phi"].double() - mean).abs().max() <= 1e-6
        assert record["step"]["payload"] == NUMEL * 4
    # ...and the worker alone sent nothing (collectives raised there) and kept Δ in float32 although bf16 was asked.
    alone = records[2]
    step = alone["step"]
    assert step["payload"] == 0
    assert not step["skipped"]
    expected = step["phi_before"] - (step["phi_before"] - alone["theta_before"])  # φ − 1·Δ in float32
    assert torch.equal(step["phi"], expected)
    assert (step["phi"] - alone["theta_before"]).abs().max() <= 1e-6
    assert torch.equal(step["theta"], step["phi"])


# ---- single process ----


@pytest.mark.parametrize(
    ("payload", "workers", "expected"), [(100, 1, 0), (100, 2, 200), (100, 3, 400), (1000, 4, 6000)]
)
def test_ring_all_reduce_bytes(payload, workers, expected):
    assert ring_all_reduce_bytes(payload, workers) == expected
    # Each of the M workers sends 2 (M − 1) / M of the payload.
    assert ring_all_reduce_bytes(payload, workers) == pytest.approx(workers * 2 * (workers - 1) / workers * payload)


def test_dtypes_names_the_pseudo_gradient_dtypes():
    assert DTYPES == {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def test_phi_is_a_float32_flat_copy_with_views_in_parameter_order():
    model = _model().to(torch.bfloat16)
    params = list(model.parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=1.0, momentum=0.0, nesterov=False)
    assert gm.phi.dtype == torch.float32 and gm.phi.shape == (NUMEL,) and gm.numel == NUMEL
    assert torch.equal(gm.phi.detach(), flat(params))
    assert [v.shape for v in gm.views] == [p.shape for p in params]
    assert gm.momentum is None
    # θ ← φ casts back to the parameters' dtype.
    gm.load_flat(torch.linspace(-1, 1, NUMEL), None)
    gm.copy_to_params()
    assert all(p.dtype == torch.bfloat16 for p in params)
    assert torch.equal(flat(params), torch.linspace(-1, 1, NUMEL).to(torch.bfloat16).float())


def test_nesterov_without_momentum_is_plain_sgd():
    gm = GlobalModel(list(_model().parameters()), device=torch.device("cpu"), lr=1.0, momentum=0.0, nesterov=True)
    assert gm.optimizer.param_groups[0]["nesterov"] is False  # torch.optim.SGD rejects Nesterov without momentum


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_worker_without_a_process_group_is_exact_and_sends_nothing(dtype):
    params = list(_model().parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=1.0, momentum=0.0, nesterov=False)
    for round_ in range(ROUNDS):
        phi = gm.phi.detach().clone()
        drift(params, 0, round_)
        theta = flat(params)
        result = gm.outer_step(group=None, num_workers=1, dtype=dtype)
        assert result.payload_bytes == 0 and not result.skipped
        assert torch.equal(gm.phi.detach(), phi - (phi - theta))  # float32 all the way, whatever `dtype`
        assert (gm.phi.detach() - theta).abs().max() <= 1e-6
        assert torch.equal(flat(params), gm.phi.detach())
        assert result.pseudo_grad_norm == pytest.approx(torch.linalg.vector_norm(phi - theta).item(), rel=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
def test_one_worker_momentum_matches_sgd(nesterov):
    params = list(_model().parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=LR, momentum=MOMENTUM, nesterov=nesterov)
    phi0, thetas = gm.phi.detach().clone(), []
    for round_ in range(ROUNDS):
        drift(params, 0, round_)
        thetas.append([flat(params)])
        gm.outer_step(group=None, num_workers=1, dtype=torch.float32)
    phi, buf = _sgd_reference(phi0, thetas, lr=LR, momentum=MOMENTUM, nesterov=nesterov)[-1]
    assert (gm.phi.detach().double() - phi).abs().max() <= 1e-5
    assert (gm.momentum.double() - buf).abs().max() <= 1e-5


def test_one_worker_non_finite_step_is_skipped():
    params = list(_model().parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=LR, momentum=MOMENTUM, nesterov=False)
    drift(params, 0, 0)
    gm.outer_step(group=None, num_workers=1, dtype=torch.float32)
    phi, momentum = gm.phi.detach().clone(), gm.momentum.clone()
    with torch.no_grad():
        params[0][1, 2] = math.nan
    result = gm.outer_step(group=None, num_workers=1, dtype=torch.float32)
    assert result.skipped and math.isnan(result.pseudo_grad_norm)
    assert torch.equal(gm.phi.detach(), phi) and torch.equal(gm.momentum, momentum)
    assert torch.equal(flat(params), phi)


def test_state_dict_without_momentum_round_trips():
    params = list(_model().parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=1.0, momentum=0.0, nesterov=False)
    drift(params, 0, 0)
    gm.outer_step(group=None, num_workers=1, dtype=torch.float32)
    state = gm.state_dict()
    assert state["momentum"] is None
    other = GlobalModel(
        list(_model(seed=5).parameters()), device=torch.device("cpu"), lr=1.0, momentum=0.0, nesterov=False
    )
    other.load_state_dict(state)
    assert torch.equal(other.phi.detach(), gm.phi.detach()) and other.momentum is None


def test_load_state_dict_rejects_a_model_of_another_size():
    gm = GlobalModel(list(_model().parameters()), device=torch.device("cpu"), lr=1.0, momentum=0.0, nesterov=False)
    with pytest.raises(ValueError, match=f"have {NUMEL + 1} elements but the model has {NUMEL}"):
        gm.load_state_dict({"phi": torch.zeros(NUMEL + 1), "momentum": None})


def test_state_dict_phi_is_a_snapshot():
    params = list(_model().parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=LR, momentum=MOMENTUM, nesterov=False)
    drift(params, 0, 0)
    gm.outer_step(group=None, num_workers=1, dtype=torch.float32)
    state = gm.state_dict()
    phi = state["phi"].clone()
    drift(params, 0, 1)
    gm.outer_step(group=None, num_workers=1, dtype=torch.float32)
    assert torch.equal(state["phi"], phi)


def test_state_dict_momentum_is_a_snapshot():
    params = list(_model().parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=LR, momentum=MOMENTUM, nesterov=False)
    drift(params, 0, 0)
    gm.outer_step(group=None, num_workers=1, dtype=torch.float32)
    state = gm.state_dict()
    momentum = state["momentum"].clone()
    drift(params, 0, 1)
    gm.outer_step(group=None, num_workers=1, dtype=torch.float32)
    assert torch.equal(state["momentum"], momentum)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_between_rounds_the_instance_holds_phi_and_the_momentum_only(dtype):
    """8 bytes a parameter between outer steps (issue 38): φ and the momentum. The pseudo-gradient, 4 more, lives only
    during the outer step, when the inner step's activations are freed (it was φ.grad, held for the whole run)."""
    params = list(_model().to(dtype).parameters())
    gm = GlobalModel(params, device=torch.device("cpu"), lr=LR, momentum=MOMENTUM, nesterov=True)
    phi0, thetas = gm.phi.detach().clone(), []
    for round_ in range(ROUNDS):
        drift(params, 0, round_)
        thetas.append([flat(params)])
        gm.outer_step(group=None, num_workers=1, dtype=torch.float32)
        assert gm.phi.grad is None
        held = [gm.phi.detach()] + [t for s in gm.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        assert sum(t.untyped_storage().nbytes() for t in held) == 8 * NUMEL
    phi, buf = _sgd_reference(phi0, thetas, lr=LR, momentum=MOMENTUM, nesterov=True)[-1]
    assert (gm.phi.detach().double() - phi).abs().max() <= 1e-5  # the same outer SGD as before
    assert (gm.momentum.double() - buf).abs().max() <= 1e-5

"""Streaming DiLoCo's outer step (`outer/streaming_diloco.py`) on real gloo process groups.

Workers drift apart a little after every inner step (`drift`), and call the fragments' schedule as the worker does
(`after_step` after every step, `end_round` at the round's end); they return what they saw. The parent checks it
against blocking DiLoCo (bit for bit for one fragment, no delay, α = 0) and against a reference written out here in
float64 with one `torch.optim.SGD` per fragment (the outer optimizer state per fragment).
"""

import io
import math

import pytest
import torch
import torch.distributed as dist
from distributed_helpers import cached_runs, drift, flat

from adloco_hf.outer.compression import wire_bytes
from adloco_hf.outer.fragments import fragment_ranges
from adloco_hf.outer.reduce import PseudoGradReduce
from adloco_hf.outer.step import GlobalModel


LR, MOMENTUM = 0.7, 0.9
H = 6  # inner steps per round
ROUNDS = 3
BLOCK = 16
STREAMED = (3, 1, 0.3)  # P, τ, α of the reference checks: fragments cut inside tensors, a delay, a mix


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 6), torch.nn.Tanh(), torch.nn.Linear(6, 5))


NUMEL = sum(p.numel() for p in _model().parameters())  # 83


def _global_model(params, *, fragments, compression="none", dtype=torch.float32):
    reduce = PseudoGradReduce(compression, dtype=dtype, block_size=BLOCK)
    return GlobalModel(
        params,
        device=torch.device("cpu"),
        lr=LR,
        momentum=MOMENTUM,
        nesterov=True,
        reduce=reduce,
        fragments=fragments,
    )


def _step(gm, step: int, group, num_workers: int):
    """What the worker does after inner step `step`: the fragments due, or at a round's end fragment 0 (streamed) /
    the blocking outer step. Returns the round's tally at a round's end (streamed), else None."""
    offset = (step - 1) % H + 1
    if gm.streaming is None:
        if offset == H:
            gm.outer_step(group=group, num_workers=num_workers)
        return None
    gm.streaming.after_step(step, offset=offset, inner_steps=H, group=group, num_workers=num_workers)
    if offset == H:
        return gm.streaming.end_round(step, group=group, num_workers=num_workers)[0]
    return None


def _run(rank, group, num_workers, *, fragments, compression="none", dtype=torch.float32, corrupt_at=None):
    """ROUNDS rounds of H inner steps; records θ before and after every step's sync, φ, and the round tallies.
    `corrupt_at`: (step, rank, index): that worker's θ[index] turns NaN before that step's sync."""
    params = list(_model().parameters())
    gm = _global_model(params, fragments=fragments, compression=compression, dtype=dtype)
    record = {"phi0": gm.phi.detach().clone(), "before": [], "after": [], "phi": [], "momentum": [], "tallies": []}
    for step in range(1, ROUNDS * H + 1):
        drift(params, rank, step, scale=0.02)
        if corrupt_at is not None and corrupt_at[:2] == (step, rank):
            with torch.no_grad():
                params[0].view(-1)[corrupt_at[2]] = math.nan
        record["before"].append(flat(params))
        tally = _step(gm, step, group, num_workers)
        if tally is not None:
            record["tallies"].append(tally.state_dict())
        record["after"].append(flat(params))
        record["phi"].append(gm.phi.detach().clone())
        record["momentum"].append(None if gm.momentum is None else gm.momentum.clone())
    if gm.streaming is not None:
        record["sent"], record["applied"] = list(gm.streaming.sent), list(gm.streaming.applied)
        record["in_flight_at_end"] = gm.streaming.in_flight is not None
        done = gm.streaming.flush(ROUNDS * H, group=group, num_workers=num_workers)
        record["flushed_bytes"], record["round_tally_kept"] = done.payload_bytes, gm.streaming.tally.payload_bytes
        record["flushed"] = list(gm.streaming.sent[len(record["sent"]) :])
        record["flushed_theta"], record["flushed_phi"] = flat(params), gm.phi.detach().clone()
    return record


def _round_trip(rank, group, num_workers) -> dict:
    """P = 2, τ = 2, int4 with error feedback: stopped after step 7 with fragment 0 in flight (sent at step 6, due
    at 8), saved through bytes and restored into a fresh model; both continue to the end of round 3."""
    fragments = (2, 2, 0.5)
    params = list(_model().parameters())
    gm = _global_model(params, fragments=fragments, compression="int4")
    for step in range(1, 8):
        drift(params, rank, step, scale=0.02)
        _step(gm, step, group, num_workers)
    buffer = io.BytesIO()
    torch.save(gm.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh_params = list(_model(seed=99).parameters())
    fresh = _global_model(fresh_params, fragments=fragments, compression="int4")
    fresh.load_state_dict(state)
    fresh.restore_params()
    out = {"in_flight": state["fragments"]["in_flight"], "residuals": state["fragments"]["error_feedback"]}
    for name, model, ps in (("original", gm, params), ("restored", fresh, fresh_params)):
        thetas = []
        for step in range(8, ROUNDS * H + 1):
            drift(ps, rank, step, scale=0.02)
            _step(model, step, group, num_workers)
            thetas.append(flat(ps))
        model.settle()  # fragment 0's average of step 18: in flight until here (the next run's rings would cross it)
        out[name] = {"thetas": thetas, "phi": model.phi.detach().clone(), "settled": flat(ps)}
    return out


def streaming_worker(rank: int, world_size: int) -> dict:
    world = dist.group.WORLD
    out = {"world_size": dist.get_world_size()}
    for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        out[f"blocking_{dtype_name}"] = _run(rank, world, world_size, fragments=None, dtype=dtype)
        out[f"one_{dtype_name}"] = _run(rank, world, world_size, fragments=(1, 0, 0.0), dtype=dtype)
    out["blocking_int4"] = _run(rank, world, world_size, fragments=None, compression="int4")
    out["one_int4"] = _run(rank, world, world_size, fragments=(1, 0, 0.0), compression="int4")
    out["streamed"] = _run(rank, world, world_size, fragments=STREAMED)
    out["streamed_int4"] = _run(rank, world, world_size, fragments=STREAMED, compression="int4")
    # A NaN in fragment 1 (elements 28-55: params[0] holds elements 0-41) on the last worker before step 4, when
    # fragment 1 is sent (offset ⌊6/3⌋ = 2 of round 1 has passed: it is sent at step 8 of round 2).
    out["nan"] = _run(rank, world, world_size, fragments=(3, 0, 0.0), corrupt_at=(4, world_size - 1, 30))
    out["trip"] = _round_trip(rank, world, world_size)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    spawned = cached_runs(streaming_worker, tmp_path_factory, "streaming")

    def get(world_size: int) -> list:
        records = spawned(world_size)
        assert [r["world_size"] for r in records] == [world_size] * world_size  # every test: the world it expected
        return records

    return get


def _reference(records, *, fragments, means=None):
    """Streaming DiLoCo written out in float64 from every worker's θ before each step's sync: fragment p sent after
    offset ⌊p·H/P⌋ (0 at H), its exact mean applied τ steps later by its own `torch.optim.SGD`, then θ_p ← (1 − α)
    φ_p + α θ_p. Returns φ and every worker's θ after each step."""
    num_fragments, delay, alpha = fragments
    ranges = fragment_ranges(NUMEL, num_fragments)
    pieces = [records[0]["phi0"].double()[a:b].clone().requires_grad_() for a, b in ranges]
    optimizers = [torch.optim.SGD([x], lr=LR, momentum=MOMENTUM, nesterov=True) for x in pieces]
    offsets = {p * H // num_fragments if p else H: p for p in range(num_fragments)}
    flights, phis, thetas = {}, [], []
    for t in range(ROUNDS * H):
        step = t + 1
        theta = [w["before"][t].double().clone() for w in records]
        fragment_sends = [offsets[(step - 1) % H + 1]] if (step - 1) % H + 1 in offsets else []
        due = [p for p, (at, _) in flights.items() if at == step]
        for p in due + fragment_sends:
            if p in fragment_sends:  # send: Δ_p = φ_p − θ_p on every worker
                a, b = ranges[p]
                deltas = torch.stack([pieces[p].detach() - th[a:b] for th in theta])
                flights[p] = (step + delay, deltas.mean(0))
            if flights.get(p, (None,))[0] == step:  # apply (τ = 0: right after the send)
                _, mean = flights.pop(p)
                pieces[p].grad = mean
                optimizers[p].step()
                a, b = ranges[p]
                for th in theta:
                    th[a:b] = (1 - alpha) * pieces[p].detach() + alpha * th[a:b]
        phis.append(torch.cat([x.detach() for x in pieces]))
        thetas.append(theta)
    return phis, thetas


# ---- one fragment, no delay, α = 0: blocking DiLoCo ----


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("reduce", ["float32", "bfloat16", "int4"])
def test_one_fragment_without_delay_is_blocking_diloco_bit_for_bit(runs, world_size, reduce):
    records = runs(world_size)
    assert [r["world_size"] for r in records] == [world_size] * world_size
    for record in records:
        blocking, one = record[f"blocking_{reduce}"], record[f"one_{reduce}"]
        for t in range(ROUNDS * H):
            assert torch.equal(one["after"][t], blocking["after"][t]), t
            assert torch.equal(one["phi"][t], blocking["phi"][t]), t
        assert torch.equal(one["momentum"][-1], blocking["momentum"][-1])
        assert [step for step, _ in one["applied"]] == [H, 2 * H, 3 * H]  # at the rounds' ends only
        assert not torch.equal(one["phi"][-1], one["phi0"])  # it really trained


# ---- several fragments, a delay, a mix ----


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_fragments_follow_the_reference_and_phi_is_the_same_on_every_worker_after_every_step(runs, world_size):
    records = runs(world_size)
    workers = [r["streamed"] for r in records]
    phis, thetas = _reference(workers, fragments=STREAMED)
    for t in range(ROUNDS * H):
        for w in workers[1:]:
            assert torch.equal(w["phi"][t], workers[0]["phi"][t]), t  # φ: identical on every worker, every step
        assert (workers[0]["phi"][t].double() - phis[t]).abs().max() <= 1e-5, t
        for m, w in enumerate(workers):
            assert (w["after"][t].double() - thetas[t][m]).abs().max() <= 1e-5, (t, m)
    spread = torch.stack([w["after"][-1] for w in workers])
    assert (spread.max(0).values - spread.min(0).values).max() > 1e-3  # θ differs between workers between syncs
    # Every round pays exactly one model's worth of float32 payload, and reports the averages it applied.
    tallies = workers[0]["tallies"]
    assert [t["payload_bytes"] for t in tallies] == [NUMEL * 4] * ROUNDS
    assert [len(t["norms"]) for t in tallies] == [2, 3, 3]  # round 1: fragment 0's average is still in flight
    assert all(not t["skipped"] for t in tallies)


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("name", ["streamed", "streamed_int4"])
def test_every_fragment_is_sent_once_per_round_and_applied_after_the_delay(runs, world_size, name):
    num_fragments, delay, _ = STREAMED
    for record in runs(world_size):
        run = record[name]
        for round_ in range(ROUNDS):
            steps = range(round_ * H + 1, (round_ + 1) * H + 1)
            assert sorted(p for s, p in run["sent"] if s in steps) == list(range(num_fragments)), round_
        assert run["applied"] == [(s + delay, p) for s, p in run["sent"][:-1]]  # the last one is still in flight
        assert run["in_flight_at_end"]
        # The end of training: the average in flight applied, and every fragment that trained on since it was sent
        # (all but fragment 0, sent at the last step) synced once more; then θ = φ.
        assert [p for _, p in run["flushed"]] == [1, 2]
        assert torch.equal(run["flushed_theta"], run["flushed_phi"])
    finals = [r[name]["flushed_phi"] for r in runs(world_size)]
    assert all(torch.equal(f, finals[0]) for f in finals)


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_int4_fragments_send_each_fragment_in_blocks_with_a_residual_each(runs, world_size):
    records = runs(world_size)
    ranges = fragment_ranges(NUMEL, STREAMED[0])
    expected = sum(wire_bytes(b - a, bits=4, block_size=BLOCK) for a, b in ranges)
    for record in records:
        run = record["streamed_int4"]
        assert [t["payload_bytes"] for t in run["tallies"]] == [expected] * ROUNDS
        assert run["flushed_bytes"] == sum(wire_bytes(b - a, bits=4, block_size=BLOCK) for a, b in ranges[1:])
        assert run["round_tally_kept"] == 0  # the flush reports its own bytes, not the round's
    exact, compressed = records[0]["streamed"], records[0]["streamed_int4"]
    gap = (compressed["phi"][-1] - exact["phi"][-1]).abs().max()
    assert 0 < gap <= 0.25 * (exact["phi"][-1] - exact["phi0"]).abs().max()  # quantized, yet it moved the same way


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_non_finite_fragment_average_is_skipped_and_every_worker_restarts_from_phi(runs, world_size):
    records = [r["nan"] for r in runs(world_size)]
    # Fragment 1 (elements 28-55) is sent and applied after step 2, 8 and 14; the NaN arrives before step 4, so the
    # sync of step 8 is skipped: φ keeps its value, and every worker's θ is φ again, NaN gone.
    assert [[t["skipped"] for t in r["tallies"]] for r in records] == [[False, True, False]] * world_size
    for r in records:
        assert math.isnan(r["before"][7][30]) == (r is records[-1])
        assert torch.equal(r["phi"][7][28:56], r["phi"][6][28:56])
        assert torch.equal(r["after"][7], r["phi"][7])
        assert torch.isfinite(r["after"][-1]).all() and torch.isfinite(r["phi"][-1]).all()
    assert all(torch.equal(r["phi"][-1], records[0]["phi"][-1]) for r in records)


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_checkpoint_with_a_fragment_in_flight_resumes_exactly(runs, world_size):
    for record in runs(world_size):
        trip = record["trip"]
        assert trip["in_flight"]["fragment"] == 0 and trip["in_flight"]["apply_step"] == 8
        assert all(saved["residual"] is not None for saved in trip["residuals"])  # one residual per fragment
        original, restored = trip["original"], trip["restored"]
        for a, b in zip(original["thetas"], restored["thetas"]):
            assert (a - b).abs().max() <= 1e-6
        assert torch.equal(original["phi"], restored["phi"])
        assert torch.equal(original["settled"], original["phi"])  # settled: θ = φ


# ---- one process ----


def test_a_worker_alone_sends_nothing_and_flushes_to_its_own_weights():
    params = list(_model().parameters())
    gm = _global_model(params, fragments=(2, 1, 0.0))
    for step in range(1, H + 1):
        drift(params, 0, step, scale=0.02)
        _step(gm, step, None, 1)
    assert gm.streaming.tally.payload_bytes == 0
    for step in range(H + 1, H + 3):
        drift(params, 0, step, scale=0.02)
        _step(gm, step, None, 1)
    theta = flat(params)
    assert gm.streaming.flush(H + 2, group=None, num_workers=1).payload_bytes == 0
    # One worker, outer lr 0.7 with momentum: φ moved towards θ, and θ is φ after the flush.
    assert torch.equal(flat(params), gm.phi.detach())
    assert not torch.equal(theta, gm.phi.detach())


def test_a_checkpoint_of_another_number_of_fragments_is_refused():
    gm = _global_model(list(_model().parameters()), fragments=(2, 0, 0.0))
    state = gm.state_dict()
    other = _global_model(list(_model().parameters()), fragments=(3, 0, 0.0))
    with pytest.raises(ValueError, match="num_fragments=2, this run has 3"):
        other.load_state_dict(state)

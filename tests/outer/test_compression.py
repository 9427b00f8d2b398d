"""Blockwise int8 / int4 quantization and error feedback (`adloco_hf.outer.compression`), single process."""

import io
import math

import pytest
import torch

from adloco_hf.outer.compression import (
    DEFAULT_BLOCK_SIZE,
    ErrorFeedback,
    Quantized,
    dequantize,
    quantization_error_bound,
    quantize,
    wire_bytes,
)


SHAPES = [(1000,), (7,), (1,), (257,), (13, 17), (4, 256), (3, 5, 19), (2, 3, 4, 5)]


def _heavy_tailed(shape, seed: int = 0) -> torch.Tensor:
    """Pseudo-gradient-like values: Student-t with 3 degrees of freedom (heavy tails), scaled to ~1e-3."""
    generator = torch.Generator().manual_seed(seed)
    normal = torch.randn(shape, generator=generator)
    chi2 = torch.randn((3, *shape), generator=generator).pow(2).sum(0)
    return normal / (chi2 / 3).sqrt() * 1e-3


def _block_absmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    flat = x.reshape(-1).double()
    return torch.stack([flat[i : i + block_size].abs().max() for i in range(0, flat.numel(), block_size)])


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block_size", [DEFAULT_BLOCK_SIZE, 64])
def test_round_trip_error_is_within_half_a_step_per_block(bits, shape, block_size):
    x = _heavy_tailed(shape)
    q = quantize(x, bits, block_size)
    y = dequantize(q)
    assert y.shape == x.shape and y.dtype == torch.float32
    error = (y.double() - x.double()).abs()
    bound = quantization_error_bound(x, bits, block_size)
    assert (error <= bound).all(), (error - bound).max()
    # The bound is the stated one: half a step, step = block absmax / q_max, with a float32 allowance of 2⁻¹⁴.
    q_max = 127 if bits == 8 else 7
    half_steps = (_block_absmax(x, block_size) / q_max / 2).repeat_interleave(block_size)[: x.numel()]
    assert torch.allclose(bound.reshape(-1), half_steps * (1 + 2**-14), rtol=1e-12, atol=0)
    # The absmax of every block is represented exactly up to float rounding (it maps to ±q_max).
    assert (y.reshape(-1).abs().max() - x.abs().max()).abs() <= 1e-6 * x.abs().max()


@pytest.mark.parametrize("bits", [8, 4])
def test_values_on_the_grid_round_trip_exactly(bits):
    q_max = 127 if bits == 8 else 7
    x = torch.arange(-q_max, q_max + 1, dtype=torch.float32) * 0.5  # one block, scale 0.5
    assert torch.equal(dequantize(quantize(x, bits, 256)), x)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape", [(0,), (300,), (3, 0, 2), (5, 300)])
def test_zeros_and_empty_tensors_are_exact(bits, shape):
    x = torch.zeros(shape)
    q = quantize(x, bits)
    y = dequantize(q)
    assert y.shape == x.shape and torch.equal(y, x) and not torch.isnan(y).any()
    if x.numel():
        assert torch.equal(q.scales, torch.zeros_like(q.scales))
    else:
        assert q.nbytes == 0 and q.payload.numel() == 0 and q.scales.numel() == 0


@pytest.mark.parametrize("bits", [8, 4])
def test_a_zero_block_next_to_a_nonzero_one_is_exact(bits):
    x = torch.cat([torch.zeros(256), torch.randn(256), torch.zeros(10)])
    y = dequantize(quantize(x, bits))
    assert torch.equal(y[:256], x[:256]) and torch.equal(y[512:], x[512:])


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_non_finite_value_turns_its_block_into_nan_and_leaves_the_others(bits, bad):
    x = torch.randn(3 * 256 + 5)
    x[256 + 17] = bad
    q = quantize(x, bits)
    y = dequantize(q)
    assert torch.isnan(q.scales[1]) and torch.isfinite(q.scales[[0, 2, 3]]).all()
    assert torch.isnan(y[256:512]).all()  # the whole block: no half-finite block can pass for a valid value
    for block in (slice(0, 256), slice(512, None)):
        assert torch.isfinite(y[block]).all()
        assert (y[block] - x[block]).abs().max() <= quantization_error_bound(x[block], bits).max()


def test_payload_sizes_and_nbytes_count_the_payload_and_float32_scales():
    for numel in (0, 1, 2, 255, 256, 257, 1001):
        x = torch.randn(numel)
        blocks = math.ceil(numel / 256)
        int8, int4 = quantize(x, 8), quantize(x, 4)
        assert int8.payload.dtype == int4.payload.dtype == torch.uint8
        assert int8.payload.numel() == numel
        assert int4.payload.numel() == math.ceil(numel / 2)  # really two values a byte
        assert int8.scales.dtype == int4.scales.dtype == torch.float32 and int8.scales.numel() == blocks
        assert int8.nbytes == numel + 4 * blocks == wire_bytes(numel, bits=8)
        assert int4.nbytes == math.ceil(numel / 2) + 4 * blocks == wire_bytes(numel, bits=4)
        assert int8.to_wire().numel() == int8.nbytes and int4.to_wire().numel() == int4.nbytes


@pytest.mark.parametrize("bits", [8, 4])
def test_the_wire_buffer_reads_back_to_the_same_values(bits):
    x = torch.randn(1001)
    q = quantize(x, bits)
    back = Quantized.from_wire(q.to_wire().clone(), x.numel(), bits=bits, block_size=256)
    assert torch.equal(dequantize(back), dequantize(q))
    with pytest.raises(ValueError, match="cannot hold"):
        Quantized.from_wire(q.to_wire()[:-1], x.numel(), bits=bits, block_size=256)


def test_int4_packs_two_values_a_byte_low_nibble_first():
    x = torch.tensor([7.0, -7.0, 1.0])  # scale 1: values 7, −7, 1 → nibbles 15, 1, 9 (+ a padding 8)
    q = quantize(x, 4)
    assert q.payload.tolist() == [15 | (1 << 4), 9 | (8 << 4)]


def test_bytes_ratio_to_bfloat16_meets_the_issue_targets():
    numel = 1 << 20
    bf16 = 2 * numel
    assert wire_bytes(numel, bits=8) / bf16 <= 0.52
    assert wire_bytes(numel, bits=4) / bf16 <= 0.27


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="bits"):
        quantize(torch.randn(4), 2)
    with pytest.raises(ValueError, match="block_size"):
        quantize(torch.randn(4), 8, 255)
    with pytest.raises(TypeError, match="floating-point"):
        quantize(torch.arange(4), 8)


@pytest.mark.parametrize("bits", [8, 4])
def test_error_feedback_sums_to_the_unquantized_total(bits):
    feedback = ErrorFeedback(bits=bits, block_size=64)
    inputs = [_heavy_tailed((9, 37), seed) for seed in range(20)]
    sent = torch.zeros(9, 37, dtype=torch.float64)
    for x in inputs:
        target = feedback.compensate(x)
        sent += dequantize(feedback.compress(x)).double()
        # The residual is one quantization error of x + the previous residual: it does not accumulate.
        assert (feedback.residual.abs() <= quantization_error_bound(target, bits, 64)).all()
    total = torch.stack(inputs).double().sum(0)
    assert (sent + feedback.residual.double() - total).abs().max() <= 1e-6 * total.abs().max()
    # Without feedback the error of the sum grows with the rounds; with it the sum is off by one residual only.
    plain = sum(dequantize(quantize(x, bits, 64)).double() for x in inputs)
    assert (sent - total).abs().max() < (plain - total).abs().max()


def test_error_feedback_keeps_its_residual_when_a_round_is_not_finite():
    feedback = ErrorFeedback(bits=4)
    feedback.compress(torch.randn(300))
    before = feedback.residual.clone()
    spoiled = torch.randn(300)
    spoiled[3] = math.nan
    assert torch.isnan(dequantize(feedback.compress(spoiled))).any()
    assert torch.equal(feedback.residual, before)
    with pytest.raises(ValueError, match="same tensor every round"):
        feedback.compress(torch.randn(301))


@pytest.mark.parametrize("bits", [8, 4])
def test_error_feedback_state_dict_round_trip_gives_the_same_next_rounds(bits):
    original = ErrorFeedback(bits=bits)
    assert original.state_dict()["residual"] is None
    for seed in range(3):
        original.compress(_heavy_tailed((500,), seed))
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    restored = ErrorFeedback(bits=bits)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(restored.residual, original.residual)
    for seed in range(3, 6):
        x = _heavy_tailed((500,), seed)
        a, b = original.compress(x), restored.compress(x)
        assert torch.equal(a.payload, b.payload) and torch.equal(a.scales, b.scales)
    assert torch.equal(restored.residual, original.residual)

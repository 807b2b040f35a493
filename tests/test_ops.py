"""The reference custom ops: schemas, fake kernels, exactness and rounding statistics."""

from __future__ import annotations

import math

import pytest
import torch

import hotcompile  # noqa: F401
from hotcompile.hadamard import block_hadamard, hadamard_matrix
from hotcompile.hla import hla_rows, hla_transform, sequency, to_blocks
from hotcompile.quant import dequantize, quantize, sawb_scale

ops = torch.ops.hotcompile
LP_L1 = [0, 2, 3, 8, 10, 11, 12, 14]


# ----------------------------------------------------------------------------- opcheck

OPCHECK_CASES = {
    "hadamard": lambda: (torch.randn(5, 40), 1, 16),
    "hla:seq": lambda: (torch.randn(3, 21, 8), 0, LP_L1, 16),
    "hla:grid": lambda: (torch.randn(2, 30, 8), 6, LP_L1, 16),
    "quantize:token": lambda: (torch.randn(7, 9), 4, True, "pseudo_stochastic", "maxabs"),
    "quantize:tensor": lambda: (torch.randn(7, 9), 8, False, "nearest", "sawb"),
    "int_gemm": lambda: (
        torch.randint(-127, 128, (6, 20), dtype=torch.int8),
        torch.randint(-127, 128, (5, 20), dtype=torch.int8),
    ),
    "abc_compress": lambda: (torch.randn(2, 19, 12), 0, LP_L1, 16, 8, "pseudo_stochastic"),
    "abc_compress:plain": lambda: (torch.randn(1, 19, 12), 0, [], 16, 8, "nearest"),
    "hq_conv_grad_input": lambda: (
        torch.randn(2, 5, 6, 6),
        torch.randn(5, 3, 3, 3),
        [12, 12],
        [2, 2],
        [1, 1],
        [1, 1],
        4,
        "per_token",
        "pseudo_stochastic",
        "sawb",
        16,
        "c",
        "",
        True,
    ),
    "hq_grad_input": lambda: (
        torch.randn(11, 24),
        torch.randn(24, 10),
        4,
        "per_tensor",
        "pseudo_stochastic",
        "sawb",
        16,
        "layer",
        "",
        True,
    ),
    "hla_grad_weight": lambda: (
        torch.randn(2, 19, 24),
        *ops.abc_compress(torch.randn(2, 19, 12), 0, LP_L1, 16, 8, "nearest"),
        0,
        LP_L1,
        16,
        8,
        "nearest",
        "layer",
        True,
    ),
    "hla_grad_weight_dense": lambda: (
        torch.randn(2, 19, 24),
        torch.randn(2, 19, 12),
        0,
        LP_L1,
        16,
        8,
        "nearest",
        "l",
        True,
    ),
}


@pytest.mark.parametrize("case", sorted(OPCHECK_CASES))
def test_opcheck(case):
    name = case.split(":")[0]
    op = getattr(ops, name)
    torch.library.opcheck(op, OPCHECK_CASES[case]())


def test_ops_run_under_autocast_and_cast_data_inputs_only():
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        codes, scale = ops.quantize(x, 8, False, "nearest", "maxabs")
        w = torch.randn(32, 16)
        gx = ops.hq_grad_input(x, w, 4, "per_token", "nearest", "maxabs", 16, "l", "", True)
    assert codes.dtype == torch.int8 and scale.dtype == torch.float32
    assert gx.dtype == torch.bfloat16  # its data inputs were cast to the autocast dtype
    ref, _ = ops.quantize(x.bfloat16(), 8, False, "nearest", "maxabs")
    assert torch.equal(codes, ref)


# ----------------------------------------------------------------------------- Hadamard


def test_hadamard_matrix_is_sylvester_and_orthogonal():
    h = hadamard_matrix(16)
    assert torch.equal(h @ h, 16 * torch.eye(16))
    for i in range(16):
        for j in range(16):
            assert h[i, j] == (-1) ** bin(i & j).count("1")


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_block_hadamard_matches_matrix_and_pads(dim):
    x = torch.randn(37, 45)
    y = block_hadamard(x, dim, 16)
    xm = x.movedim(dim, -1)
    pad = (-xm.shape[-1]) % 16
    xp = torch.nn.functional.pad(xm, (0, pad))
    ref = (xp.reshape(*xp.shape[:-1], -1, 16) @ hadamard_matrix(16)).reshape(xp.shape)
    torch.testing.assert_close(y, ref.movedim(-1, dim), rtol=1e-6, atol=1e-5)
    # orthogonal up to n: applying it twice gives n·x on the padded tensor
    twice = block_hadamard(y, dim, 16) / 16
    torch.testing.assert_close(twice.narrow(dim, 0, x.shape[dim]), x, rtol=1e-5, atol=1e-5)


def test_hq_is_exact_without_quantization():
    gy, w = torch.randn(33, 40, dtype=torch.float64), torch.randn(40, 24, dtype=torch.float64)
    g_hat = block_hadamard(gy.float(), 1, 16).double()
    w_hat = block_hadamard(w.float(), 0, 16).double()
    torch.testing.assert_close(g_hat @ w_hat / 16, gy @ w, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- HLA


def test_lp_l1_row_set_and_variants():
    assert hla_rows("lp_l1", 8) == tuple(LP_L1)
    assert hla_rows("lp_l1", 6) == (0, 2, 3, 8, 10, 12)
    official = hla_rows("lp_l1", 10)  # u + v <= 3, the official training code's 10 rows
    assert set(official) > set(LP_L1) and len(official) == 10
    assert sorted(sequency(r, 16) for r in hla_rows("sequency", 8)) == list(range(8))
    assert hla_rows((14, 0), 2) == (0, 14)


def test_hla_with_all_rows_is_exact():
    gy, x = torch.randn(3, 37, 20), torch.randn(3, 37, 12)
    rows = tuple(range(16))
    for grid_w in (0,):
        gw = hla_transform(gy, grid_w, rows).double().t() @ hla_transform(x, grid_w, rows).double()
        ref = gy.reshape(-1, 20).double().t() @ x.reshape(-1, 12).double()
        torch.testing.assert_close(gw / 16, ref, rtol=1e-5, atol=1e-5)
    # spatial 4x4 patches of a 7x5 map
    gy, x = torch.randn(2, 35, 6), torch.randn(2, 35, 4)
    gw = hla_transform(gy, 5, rows).double().t() @ hla_transform(x, 5, rows).double()
    ref = gy.reshape(-1, 6).double().t() @ x.reshape(-1, 4).double()
    torch.testing.assert_close(gw / 16, ref, rtol=1e-5, atol=1e-5)


def test_hla_is_an_orthogonal_projection_of_rank_half():
    x = torch.randn(1, 32, 8).double()
    t = hla_transform(x.float(), 0, tuple(LP_L1)).double()  # [16, 8]
    assert t.shape == (16, 8)
    # energy kept is at most the input's (projection), and exactly half on average
    assert (t.norm() ** 2 / 16) <= x.norm() ** 2 * (1 + 1e-6)


def test_spatial_blocks_are_4x4_patches():
    grid = torch.arange(8 * 8, dtype=torch.float32).reshape(1, 64, 1)
    blocks = to_blocks(grid, 8)[0, :, :, 0]  # [4 blocks, 16]
    assert blocks[0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27]
    assert blocks[1, 0] == 4 and blocks[2, 0] == 32


def test_hla_keeps_smooth_signals():
    """On a smooth token sequence, HLA's low-pass rows keep almost all of the product."""
    t = torch.linspace(0, 1, 64)
    x = torch.stack([torch.sin(2 * math.pi * f * t) for f in (0.5, 1, 1.5)], -1)[None]
    gy = torch.stack([torch.cos(2 * math.pi * f * t) for f in (0.25, 0.75)], -1)[None]
    approx = hla_transform(gy, 0, tuple(LP_L1)).t() @ hla_transform(x, 0, tuple(LP_L1)) / 16
    exact = gy[0].t() @ x[0]
    assert (approx - exact).norm() / exact.norm() < 0.05


# ----------------------------------------------------------------------------- integer GEMM


def test_int_gemm_is_exact_integer_arithmetic():
    a = torch.randint(-127, 128, (33, 70), dtype=torch.int8)
    b = torch.randint(-127, 128, (17, 70), dtype=torch.int8)
    out = ops.int_gemm(a, b)
    assert out.dtype == torch.int32
    ref = [
        [sum(int(a[i, k]) * int(b[j, k]) for k in range(70)) for j in range(17)] for i in range(33)
    ]
    assert out.tolist() == ref
    # extremes: a K where every product is 127*127 stays exact
    big = torch.full((2, 4096), 127, dtype=torch.int8)
    assert ops.int_gemm(big, big)[0, 0].item() == 127 * 127 * 4096


def test_int_gemm_rejects_bad_input():
    with pytest.raises(TypeError, match="int8"):
        ops.int_gemm(torch.randn(2, 2), torch.randn(2, 2))
    with pytest.raises(ValueError, match="shapes"):
        ops.int_gemm(torch.zeros(2, 3, dtype=torch.int8), torch.zeros(2, 4, dtype=torch.int8))


# ----------------------------------------------------------------------------- quantizers


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "pseudo_stochastic"])
@pytest.mark.parametrize("per_token", [False, True])
def test_quantize_range_and_error_bound(bits, rounding, per_token):
    x = torch.randn(64, 48) * torch.logspace(-3, 2, 64)[:, None]
    codes, scale = quantize(x, bits, per_token, rounding)
    q = 2 ** (bits - 1) - 1
    assert codes.dtype == torch.int8 and codes.abs().max() <= q
    assert scale.shape == ((64,) if per_token else (1,))
    err = (dequantize(codes, scale) - x).abs()
    step = scale[:, None] if per_token else scale
    # one quantization step at most; half a step when rounding to nearest
    limit = step * (0.5 if rounding == "nearest" else 1.0) * (1 + 1e-5)
    assert bool((err <= limit).all())


def test_per_token_scales_follow_rows():
    x = torch.randn(4, 32) * torch.tensor([1e-3, 1.0, 10.0, 1e3])[:, None]
    _, s = quantize(x, 4, True)
    torch.testing.assert_close(s, x.abs().amax(1) / 7)


def test_sawb_scale_clips_and_falls_back():
    w = torch.randn(256, 256)
    s = sawb_scale(w, 4)
    alpha = 12.1 * w.square().mean().sqrt() - 12.2 * w.abs().mean()
    torch.testing.assert_close(s, alpha / 7)
    assert s * 7 < w.abs().max()  # SAWB clips the tails
    spike = torch.zeros(64)
    spike[0] = 1.0  # alpha <= 0 for a single spike -> max-abs
    torch.testing.assert_close(sawb_scale(spike, 4), torch.tensor(1 / 7))
    torch.testing.assert_close(sawb_scale(w, 8), w.abs().max() / 127)


def _rounding_bias(rounding: str, frac: float, bits: int, n: int = 200_000) -> tuple[float, float]:
    """Mean rounding error at a fixed fractional part, and its standard error."""
    g = torch.Generator().manual_seed(1)
    # scale is exactly 1 (max-abs = qmax); the bits below 2^-m (m = 10 for INT4, 8 for INT8:
    # pseudo-stochastic rounding's "random number") vary randomly, as they do in real data
    jitter = torch.rand(n, generator=g) * 2.0 ** -(10 if bits == 4 else 8)
    v = 2.0 + frac + jitter
    x = torch.cat([torch.tensor([float(2 ** (bits - 1) - 1)]), v])[None]
    codes, scale = quantize(x, bits, False, rounding)
    assert scale.item() == 1.0
    err = codes[0, 1:].double() - (2.0 + frac)
    return err.mean().item(), math.sqrt(frac * (1 - frac) / n)


@pytest.mark.parametrize("rounding", ["stochastic", "pseudo_stochastic"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("frac", [0.1, 0.37, 0.5, 0.83])
def test_stochastic_roundings_are_unbiased(rounding, bits, frac):
    bias, se = _rounding_bias(rounding, frac, bits)
    # the jitter moves the mean by up to 2^-m; pseudo-stochastic resolves probabilities to 2^-m
    resolution = 2 * 2.0 ** -(10 if bits == 4 else 8)
    assert abs(bias) < 5 * se + resolution, (bias, se)


def test_nearest_is_biased_where_stochastic_is_not():
    bias, se = _rounding_bias("nearest", 0.37, 4)
    assert abs(bias) > 100 * se  # sanity check that the statistical test can fail


def test_pseudo_stochastic_is_deterministic_and_unbiased_on_gaussian_data():
    x = torch.randn(512, 256)
    a = quantize(x, 4, True, "pseudo_stochastic")
    b = quantize(x, 4, True, "pseudo_stochastic")
    assert torch.equal(a[0], b[0])
    err = dequantize(*a) - x
    # mean error is ~0 relative to the step (a biased rule like ceil would give ~0.5 step)
    step = a[1].mean()
    assert abs(err.mean().item()) < 0.01 * step


@pytest.mark.parametrize("per_token", [False, True])
def test_nonfinite_values_stay_nonfinite(per_token):
    x = torch.randn(6, 16)
    x[2, 3] = float("nan")
    x[4, 1] = float("inf")
    d = dequantize(*quantize(x, 4, per_token, "pseudo_stochastic"))
    if per_token:
        assert not torch.isfinite(d[2]).any() and not torch.isfinite(d[4]).any()
        assert torch.isfinite(d[0]).all()
    else:
        assert not torch.isfinite(d).any()


def test_abc_codes_are_column_major_in_the_real_and_fake_op():
    """The saved ABC codes are written K-major once in the forward (the g_w GEMM reduces over
    R): the real op and its fake agree on strides, so inductor plans the same layout."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(2, 37, 24)
    q, s = torch.ops.hotcompile.abc_compress(x, 0, [0, 2, 3, 8, 10, 11, 12, 14], 16, 8, "nearest")
    R = q.shape[0]
    assert q.shape == (2 * 3 * 8, 24) and q.stride() == (1, R)
    ref, _ = quantize(hla_transform(x, 0, (0, 2, 3, 8, 10, 11, 12, 14)), 8, False, "nearest")
    assert torch.equal(q, ref)
    with FakeTensorMode() as mode:
        fq, _ = torch.ops.hotcompile.abc_compress(
            mode.from_tensor(x), 0, [0, 2, 3, 8, 10, 11, 12, 14], 16, 8, "nearest"
        )
    assert fq.shape == q.shape and fq.stride() == q.stride()


@pytest.mark.parametrize(
    "rounding,bits", [("nearest", 4), ("pseudo_stochastic", 8), ("fp8_e4m3", 8)]
)
@pytest.mark.parametrize("per_token", [True, False])
def test_a_tiny_tensor_quantizes_with_a_finite_reciprocal_scale(rounding, bits, per_token):
    """Codes are ``x · (1/s)``: a max-abs so small that max-abs/qmax is subnormal would make
    ``1/s`` infinite and every code saturate. The scale is raised to the smallest normal float
    instead, so the codes still dequantize to x; zero rows keep a zero scale. (With the CPU's
    flush-to-zero on — the demo and the accuracy runs set it — such a scale is flushed to 0
    before it can be raised: the row then gets zero codes, as it did with the division.)"""
    flushing = bool((torch.tensor([1e-39]) * 1.0 == 0).all())  # other tests leave it on
    torch.set_flush_denormal(False)
    try:
        _check_tiny_tensor(rounding, bits, per_token)
    finally:
        torch.set_flush_denormal(flushing)


def _check_tiny_tensor(rounding: str, bits: int, per_token: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 32) * 1e-37
    x[2] = 0.0
    codes, scale = quantize(x, bits, per_token, rounding)
    assert torch.isfinite(1 / scale[scale > 0]).all()
    if per_token:
        assert scale[2] == 0 and (codes[2].float() == 0).all()
    deq = codes.double() * (scale.double()[:, None] if per_token else scale.double())
    err = (deq - x.double()).norm() / x.double().norm()
    assert err < 0.2, err  # INT4's step at a raised scale: coarse, never saturated or NaN
    assert (scale[scale > 0] >= 2.0**-126).all()

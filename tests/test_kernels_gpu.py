"""Triton kernels of the g_x path (hotcompile.kernels) against the CPU reference. Needs CUDA.

Run on a GPU machine: ``python -m pytest tests/test_kernels_gpu.py -q``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import skip_module_without_cuda_triton

from hotcompile.hadamard import block_hadamard
from hotcompile.quant import quantize

#: these tests exercise the ops path (torch.ops.hotcompile and its CUDA kernels) with HOT on
#: every layer; on CUDA the defaults are the native lowering behind the speed gate
#: (tests/test_lowering_gpu.py covers those)
OPS = {"lowering": "ops", "prefer": "paper"}

pytestmark = [pytest.mark.gpu]
skip_module_without_cuda_triton()

from hotcompile import kernels  # noqa: E402
from hotcompile.kernels import hq_cuda, hq_triton  # noqa: E402
from hotcompile.ops import hq_grad_input  # noqa: E402

ops = torch.ops.hotcompile
FP8 = torch.cuda.get_device_capability() >= (8, 9)
CODE_DTYPES = [torch.int8] + ([torch.float8_e4m3fn] if FP8 else [])
#: both implementations of the fused quantize (the CUDA one when its JIT build works here)
IMPLS = ["triton", "cuda"]


def _impl(name):
    if name == "cuda":
        if not hq_cuda.available():
            pytest.skip(f"CUDA quantize kernel not built: {hq_cuda.error()}")
        return hq_cuda.hq_quantize
    return hq_triton.hq_quantize_triton


def _gy(L, O, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(L, O, generator=g) * torch.rand(L, 1, generator=g).add(0.1) * 3
    x[:, O // 3] *= 20  # an outlier channel
    return x.to(dtype)


def _ref(gy, bits, per_token, rounding):
    return quantize(block_hadamard(gy.cpu(), 1, 16), bits, per_token, rounding)


@pytest.mark.parametrize(
    "L,O", [(1, 16), (37, 50), (256, 768), (130, 2304), (33, 4100), (4, 14336)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("rounding", ["nearest", "pseudo_stochastic"])
@pytest.mark.parametrize("impl", IMPLS)
def test_fused_quantize_bit_exact(L, O, dtype, per_token, rounding, impl):
    fn = _impl(impl)
    gy = _gy(L, O, dtype, seed=L * 7 + O)
    for bits in (4, 8):
        rc, rs = _ref(gy, bits, per_token, rounding)
        for code_dtype in CODE_DTYPES if bits == 4 else [torch.int8]:
            c, s = fn(gy.cuda(), bits, per_token, rounding, code_dtype, 16)
            c = c.float().to(torch.int8).cpu()
            s = s.cpu()
            assert (c[L:] == 0).all()
            assert torch.equal(c[:L], rc), (bits, code_dtype, (c[:L] != rc).sum().item())
            assert torch.equal(s[:L] if per_token else s, rs), bits


@pytest.mark.parametrize("block_o", [16, 128, 512])
def test_chunked_walk_is_bit_exact(block_o):
    gy = _gy(45, 1000, torch.bfloat16)
    for per_token in (True, False):
        rc, rs = _ref(gy, 4, per_token, "pseudo_stochastic")
        c, s = hq_triton.hq_quantize(
            gy.cuda(), 4, per_token, "pseudo_stochastic", torch.int8, block_o=block_o
        )
        assert torch.equal(c.cpu(), rc) and torch.equal(s.cpu(), rs)


@pytest.mark.parametrize("impl", IMPLS)
def test_strided_rows(impl):
    big = _gy(64, 200, torch.float32).cuda()
    gy = big[:, 10:150]  # rows not 16-byte aligned: the CUDA kernel's scalar loads
    c, s = _impl(impl)(gy, 4, True, "nearest", torch.int8)
    rc, rs = _ref(gy, 4, True, "nearest")
    assert torch.equal(c.cpu(), rc) and torch.equal(s.cpu(), rs)


@pytest.mark.parametrize("impl", IMPLS)
def test_nonfinite_scales_and_codes_match(impl):
    fn = _impl(impl)
    gy = _gy(40, 70, torch.float32)
    gy[3, 5] = float("nan")
    gy[7, 9] = float("inf")
    gy[8, 1] = -float("inf")
    for per_token in (True, False):
        for rounding in ("nearest", "pseudo_stochastic"):
            rc, rs = _ref(gy, 4, per_token, rounding)
            c, s = fn(gy.cuda(), 4, per_token, rounding, torch.int8)
            assert torch.equal(c.cpu(), rc)
            s = s.cpu()
            assert not rs.isfinite().all()
            assert torch.equal(s.isnan(), rs.isnan()) and torch.equal(s.isinf(), rs.isinf())
            fin = rs.isfinite()
            assert torch.equal(s[fin], rs[fin]) and torch.equal(s[rs.isinf()], rs[rs.isinf()])


def test_stochastic_is_unbiased():
    gy = _gy(64, 256, torch.float32).cuda()
    draws = []
    for _ in range(200):
        c, s = hq_triton.hq_quantize(gy, 4, True, "stochastic", torch.int8)
        draws.append(c.float())
    v = (block_hadamard(gy, 1, 16) / s[:, None]).clamp(-7, 7)
    d = torch.stack(draws)
    assert ((d - v.floor()) >= 0).all() and ((d - v.ceil()) <= 0).all()  # neighbours only
    frac = v - v.floor()
    interior = (frac > 0.05) & (frac < 0.95)
    bias = (d.mean(0) - v)[interior]
    se = (frac * (1 - frac) / len(draws)).sqrt()[interior]
    z = bias / se
    assert z.mean().abs() < 0.1 and z.abs().mean() < 1.0  # |N(0,1)| has mean 0.80
    assert (bias.abs() < 6 * se + 1e-6).float().mean() > 0.999
    assert not torch.equal(draws[0], draws[1])  # fresh randomness per call


def test_registered_as_cuda_kernel():
    assert kernels.register()
    gy, w = torch.randn(64, 64, device="cuda"), torch.randn(64, 32, device="cuda")
    ops.hq_grad_input(gy, w, 4, "per_token", "nearest", "sawb", 16, "l", "", False)
    assert kernels.REGISTERED


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("L,O,I", [(256, 768, 768), (197, 2304, 768), (40, 50, 24), (8, 64, 48)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scaling", ["per_token", "per_tensor"])
@pytest.mark.parametrize("bits", [4, 8])
def test_hq_grad_input_cuda_matches_reference(L, O, I, dtype, scaling, bits):
    gy = _gy(L, O, dtype, seed=L + O + I).cuda()
    w = (torch.randn(O, I) * 0.05).to(dtype).cuda()
    args = (bits, scaling, "pseudo_stochastic", "sawb", 16, "l", "", False)
    out = ops.hq_grad_input(gy, w, *args)
    ref = hq_grad_input._init_fn(gy, w, *args)  # the reference on the same CUDA tensors
    assert out.shape == ref.shape == (L, I) and out.dtype == dtype
    # fp32: the SAWB scale's sums run in another order (float32 rounding); bf16: one output
    # rounding apart (the scales are applied in _scaled_mm's epilogue)
    tol = 1e-3 if dtype == torch.float32 else 4e-3
    assert _rel(out, ref) < tol
    # sanity against the exact product (the method's error: per-tensor INT4 is coarse here,
    # rows differ in scale by up to 30x)
    exact = gy.float() @ w.float()
    bound = {(4, "per_token"): 0.5, (4, "per_tensor"): 2.0, (8, "per_token"): 0.05}
    assert _rel(out.float(), exact) < bound.get((bits, scaling), 0.15)


@pytest.mark.parametrize("O,I", [(70, 24), (768, 768), (2304, 768), (3072, 4100)])
@pytest.mark.parametrize("bits,weight_scale", [(4, "sawb"), (4, "maxabs"), (8, "sawb")])
def test_weight_quantize_matches_reference(O, I, bits, weight_scale):
    w = (torch.randn(O, I) * 0.05).bfloat16()
    rc, rs = quantize(block_hadamard(w, 0, 16), bits, False, "nearest", weight_scale)
    wt, sw = hq_triton.quantize_weight(w.cuda(), bits, weight_scale, False)
    assert wt.shape == (I, rc.shape[0])
    if weight_scale == "sawb" and bits == 4:  # Σx², Σ|x| summed with atomics
        assert abs(sw.item() / rs.item() - 1) < 1e-5
        assert (wt.t().cpu() != rc).float().mean() < 1e-4
    else:
        assert torch.equal(sw.cpu(), rs) and torch.equal(wt.t().cpu(), rc)


def test_hq_grad_input_lqs_preamble_matches_reference():
    from hotcompile import lqs

    gy = _gy(128, 256, torch.bfloat16).cuda()
    w = (torch.randn(256, 64) * 0.05).bfloat16().cuda()
    outs = {}
    lqs.reset()
    for impl in ("cuda", "ref"):
        lqs.state(f"k{impl}", name="l", calibration_steps=1)
        f = ops.hq_grad_input if impl == "cuda" else hq_grad_input._init_fn
        args = (4, "lqs", "pseudo_stochastic", "sawb", 16, "l", f"k{impl}", False)
        outs[impl] = [f(gy, w, *args) for _ in range(3)]
    assert torch.equal(outs["cuda"][0], outs["ref"][0])  # calibration step: exact product
    for a, b in zip(outs["cuda"][1:], outs["ref"][1:]):
        assert _rel(a, b) < 4e-3
    assert lqs._STATES["kcuda"].decision == lqs._STATES["kref"].decision


@pytest.mark.parametrize("scaling", ["per_token", "per_tensor"])
def test_nan_in_gy_gives_nonfinite_gx(scaling):
    gy = _gy(64, 128, torch.bfloat16).cuda()
    gy[5, 7] = float("nan")
    w = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    out = ops.hq_grad_input(gy, w, 4, scaling, "pseudo_stochastic", "sawb", 16, "l", "", False)
    if scaling == "per_token":
        assert out[5].isnan().all() and out[torch.arange(64) != 5].isfinite().all()
    else:
        assert out.isnan().all()


def test_under_torch_compile_inductor():
    """A small MLP compiled with the hot backend (inductor) on CUDA, bf16 autocast: the
    gradients through the Triton path match those through the reference implementation."""
    import hotcompile  # noqa: F401

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    m = m.cuda()
    x = torch.randn(8, 32, 64, device="cuda")
    m(x).pow(2).mean().backward()
    exact = [p.grad.clone() for p in m.parameters()]
    c = torch.compile(m, backend="hot", options={**OPS, "gx_scaling": "per_token", "abc": False})
    grads = {}
    calls = []
    orig = hq_triton.hq_quantize

    def counting(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    for impl in ("triton", "reference"):
        m.zero_grad()
        hq_triton.hq_quantize = counting
        try:
            with hq_grad_input.set_kernel_enabled("cuda", impl == "triton"):
                with torch.autocast("cuda", torch.bfloat16):
                    c(x).float().pow(2).mean().backward()
        finally:
            hq_triton.hq_quantize = orig
        grads[impl] = [p.grad.clone() for p in m.parameters()]
        if impl == "triton":
            n_triton = len(calls)
            assert n_triton >= 1  # g_y of the second layer (W goes through the HLA kernel)
    assert len(calls) == n_triton  # nothing through the kernels with them disabled
    for g, r, e in zip(grads["triton"], grads["reference"], exact):
        assert g.isfinite().all()
        assert _rel(g, r) < 2e-2  # bf16 rounding of g_x apart
        assert _rel(g, e) < 1.0

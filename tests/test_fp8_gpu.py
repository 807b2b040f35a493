"""The FP8 forward on a CUDA GPU with FP8 tensor cores (issue 34): ``torch._scaled_mm`` against
``hotcompile.fp8.linear_reference``, and a compiled HOT block (inductor, native lowering)
against the same block with the bf16 forward — the backward must not change with the
forward's precision, and the forward must stay FP8-accurate. Skipped without such a GPU."""

from __future__ import annotations

import pytest
import torch
from conftest import rel

from hotcompile import HotBackend, fp8
from hotcompile.demo import Block
from hotcompile.quant import has_fp8_gemm

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not has_fp8_gemm(torch.device("cuda")),
        reason="needs a CUDA GPU with FP8 GEMMs (compute capability 8.9+)",
    ),
]


@pytest.mark.parametrize("scaling", ["rowwise", "tensorwise"])
def test_scaled_mm_matches_the_reference(scaling):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 1024, device="cuda", generator=g)
    w = torch.randn(2048, 1024, device="cuda", generator=g) * 0.02
    b = torch.randn(2048, device="cuda", generator=g)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fast = fp8.linear(x, w, b, scaling)
        ref = fp8.linear_reference(x, w, b, scaling)
        exact = torch.nn.functional.linear(x, w, b)
    assert fast.dtype == torch.bfloat16
    assert rel(fast, ref) < 1e-2
    assert rel(ref, exact) < 0.06
    # Hopper's fast accumulation (HotConfig.fp8_fast_accum on the forward, by default, as
    # torchao's forward): the same GEMM up to its narrower running sum, far inside e4m3's error
    with torch.autocast("cuda", dtype=torch.bfloat16):
        quick = fp8.linear(x, w, b, scaling, fast_accum=True)
    assert rel(quick, ref) < 1e-2 and rel(quick, fast) < 5e-3, (rel(quick, ref), rel(quick, fast))


def test_fast_accum_g_x_for_fp8_values_only():
    """``fp8_fast_accum="all"``: HQ's g_x GEMM on FP8 values (the text recipe) takes the fast
    accumulation and stays within a small fraction of its quantization error; INT4-grid codes
    (the vision recipe) ignore it — their g_x is bit for bit the float32-accumulated one."""
    from hotcompile.lowering import hot
    from hotcompile.quant import FP8_E4M3

    g = torch.Generator(device="cuda").manual_seed(0)
    gy = torch.randn(4096, 2048, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(2048, 1024, device="cuda", generator=g) * 0.02
    exact = (gy.float() @ w.to(torch.bfloat16).float()).float()
    for bits, rounding, same in ((8, FP8_E4M3, False), (4, "pseudo_stochastic", True)):
        scale = "maxabs" if rounding == FP8_E4M3 else "sawb"
        wq, sw = hot.weight_codes(w.to(torch.bfloat16), bits, rounding, scale)
        plain = hot.grad_input_codes(gy, wq, sw, bits, True, rounding)[0]
        quick = hot.grad_input_codes(gy, wq, sw, bits, True, rounding, fast_accum=True)[0]
        if same:
            assert torch.equal(plain, quick)
        else:
            err = rel(plain, exact)
            assert rel(quick, plain) < 0.1 * err, (rel(quick, plain), err)


def _block_grads(backend, x: torch.Tensor, gy: torch.Tensor):
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block(256, 4, 1024).cuda()
    xs = x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = torch.compile(block, backend=backend)(xs)
    y.backward(gy)
    names = ["x"] + [n for n, _ in block.named_parameters()]
    grads = [xs.grad] + [p.grad for p in block.parameters()]
    return y.detach().float(), dict(zip(names, grads))


def test_compiled_block_fp8_forward():
    """The FP8 forward composed with HOT's backward: each gradient's error against the exact
    step (inductor, bf16) stays close to what HOT with the bf16 forward gives. The FP8 forward
    does reach the backward through the activations the backward's nonlinearities read
    (attention's probabilities, GELU's input, LayerNorm's statistics), so the gradients are
    not bit-identical to HOT's with a bf16 forward; they must not be much further from exact."""
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(8, 128, 256, device="cuda", generator=g)
    gy = torch.randn(8, 128, 256, device="cuda", generator=g).to(torch.bfloat16)
    y_exact, g_exact = _block_grads("inductor", x, gy)
    y0, g0 = _block_grads(HotBackend(prefer="paper", rounding="nearest"), x, gy)
    be = HotBackend(prefer="paper", forward="fp8", rounding="nearest")
    y1, g1 = _block_grads(be, x, gy)
    fwd = {p.name: p.forward for p in be.layers}
    assert fwd["qkv"] == "fp8 rowwise" and fwd["fc1"] == "fp8 rowwise", fwd
    assert fwd["fc2"] == "fp8 rowwise"  # the block's graph ends in the residual stream
    assert rel(y0, y_exact) < 1e-2  # HOT leaves the bf16 forward as it was
    assert 1e-3 < rel(y1, y_exact) < 0.06
    errs = {n: (rel(g0[n], g_exact[n]), rel(g1[n], g_exact[n])) for n in g_exact}
    print("gradient rel. error vs exact (hot bf16 forward, hot fp8 forward):")
    for n, (e0, e1) in errs.items():
        print(f"  {n:14s} {e0:.4f} {e1:.4f}")
    worse = {n: e for n, e in errs.items() if e[1] > 1.5 * e[0] + 0.03}
    assert not worse, worse


def test_swiglu_codes_kernel_matches_the_quantizers():
    """The lean plan's SwiGLU forward kernel on the GPU, at the 8B MLP's width (a 16384-wide
    tile, masked) and an odd one: a's and b's rowwise FP8 codes and scales bit for bit the
    quantizer's (``lowering.hot.swiglu_codes``); the product's against ``quantize`` of the
    product rounded to bf16, where the GPU's sigmoid may round a rare value the other way."""
    from hotcompile.kernels import swiglu_triton
    from hotcompile.lowering.hot import swiglu_codes
    from hotcompile.quant import FP8_E4M3, quantize

    g = torch.Generator(device="cuda").manual_seed(0)
    u8 = torch.uint8
    for L, O in ((300, 14336), (257, 1000)):
        a, b = ((torch.randn(L, O, device="cuda", generator=g) * 3).bfloat16() for _ in range(2))
        ca, sa, cb, sb, y, sy = swiglu_triton.swiglu_codes(a, b, "fp8")
        (ra, rsa), (rb, rsb) = swiglu_codes(a), swiglu_codes(b)
        assert torch.equal(ca.view(u8), ra.view(u8)) and torch.equal(sa, rsa)
        assert torch.equal(cb.view(u8), rb.view(u8)) and torch.equal(sb, rsb)
        prod = (torch.nn.functional.silu(a.float()) * b.float()).bfloat16()
        ry, rsy = quantize(prod, 8, True, FP8_E4M3)
        assert (y.view(u8) != ry.view(u8)).float().mean().item() < 1e-3
        torch.testing.assert_close(sy, rsy, rtol=1e-2, atol=0)


def test_abc_codes_from_the_swiglu_codes_match_the_quantizer_of_the_product():
    """The lean plan's backward kernel (``swiglu_triton.swiglu_abc``: down's ABC codes made
    from the SwiGLU's saved codes, the product never written) at the Llama's width and the
    8B MLP's, in the text recipe's plain rows with FP8 codes, and with INT8 codes over
    samples padded to 16 rows: against ``hla_quantize`` of the product of the dequantized
    codes rounded to bf16 — the same scale, and codes equal but where the GPU's sigmoid
    rounds a rare product the other way."""
    from hotcompile.kernels import hla_triton, swiglu_triton
    from hotcompile.lowering.hot import swiglu_codes
    from hotcompile.quant import FP8_E4M3, dequantize

    g = torch.Generator(device="cuda").manual_seed(0)
    u8 = torch.uint8
    for N, S, D, rounding in ((2, 256, 8192, FP8_E4M3), (1, 304, 14336, FP8_E4M3),
                              (3, 150, 1000, "nearest")):  # fmt: skip
        a, b = ((torch.randn(N * S, D, device="cuda", generator=g) * 3).bfloat16()
                for _ in range(2))  # fmt: skip
        (ca, sa), (cb, sb) = swiglu_codes(a), swiglu_codes(b)
        c, sc = swiglu_triton.swiglu_abc(ca, sa, cb, sb, N, 8, rounding, torch.bfloat16)
        prod = (torch.nn.functional.silu(dequantize(ca, sa)) * dequantize(cb, sb)).bfloat16()
        rc, rsc = hla_triton.hla_quantize(prod.view(N, S, D), 0, (), 8, rounding,
                                          out_dtype=c.dtype)  # fmt: skip
        assert c.shape == rc.shape and c.dtype == rc.dtype
        torch.testing.assert_close(sc, rsc, rtol=1e-6, atol=0)
        assert (c.view(u8) != rc.view(u8)).float().mean().item() < 1e-3


def test_lean_step_runs_the_swiglu_codes_kernel(monkeypatch):
    """The lean plan (``forward="fp8"``, ``abc_swiglu="fp8"``, ``abc_recompute="unary"``): the
    forward's SwiGLU is one launch of ``_swiglu_codes_kernel`` and no inductor kernel of the
    forward computes silu (the bf16 product is never written). Its gradients are as close to
    the exact step's as those of the step whose down projection casts the product itself.
    (Not bit for bit: the product's rounding differs from inductor's in rare values, and
    HOT's codes downstream then round a few values the other way: 3% apart on gate's weight
    gradient at this size, H200 session 29.)"""
    import re
    import sys

    from test_abc_swiglu import ResidualSwiGLU
    from test_lowering_gpu import _swiglu_step

    from hotcompile.lowering import hot as native

    rewrite = sys.modules["hotcompile.passes.rewrite"]
    opts = {"lowering": "native", "prefer": "paper", "recipe": "text", "forward": "fp8",
            "abc_swiglu": "fp8", "abc_recompute": "unary"}  # fmt: skip

    def step(options=opts):
        code, grads = _swiglu_step(options, ResidualSwiGLU)
        return code[:2], grads

    # the backward's kernel at this small width too (the step takes it past 8192 wide)
    monkeypatch.setattr(native, "SWIGLU_ABC_ATEN_MAX_WIDTH", 0)
    (forward, backward), grads = step()
    launches = re.findall(r"^\s+(\w+)\.run\(", forward, re.M)
    assert sum(n.startswith("_swiglu_codes_kernel") for n in launches) == 1, launches
    assert not any("silu" in n for n in re.findall(r"def (triton_\w+)\(", forward))
    # the backward re-derives down's ABC codes from a's and b's codes in one kernel of its
    # own (swiglu_abc): no inductor kernel makes the product there either. (The one inductor
    # kernel with silu there sums gate's and up's g_y for their biases, which this model
    # has: the SwiGLU backward stores no g_y since it makes their g_w codes itself, so the
    # bias gradients recompute it as they sum it; session 35's probe,
    # experiments/results/swiglu_gw_probe.md.)
    silu = [n for n in re.findall(r"def (triton_\w+)\(", backward) if "silu" in n]
    assert all(n.startswith("triton_") and "silu_backward_sum" in n for n in silu), silu
    assert re.search(r"^\s+_swiglu_abc_kernel\w*\.run\(", backward, re.M), "no ABC kernel"
    monkeypatch.setattr(rewrite, "_fp8_forward_reader", lambda node: False)
    _, own = step()
    _, exact = step({"exact": True})
    for k in own:
        err, err_own = rel(grads[k], exact[k]), rel(own[k], exact[k])
        assert err < 1.25 * err_own + 0.01, (k, err, err_own)

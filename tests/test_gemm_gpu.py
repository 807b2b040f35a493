"""The scaled low-precision GEMMs (hotcompile.kernels.gemm_triton) and their dispatcher
(hotcompile.kernels.dispatch) against exact references.

Needs CUDA and Triton (FP8 cases: sm_89+). Run on a GPU machine:
``python -m pytest tests/test_gemm_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import skip_module_without_cuda_triton

pytestmark = [pytest.mark.gpu]
skip_module_without_cuda_triton()

from hotcompile.kernels import dispatch, gemm_triton  # noqa: E402

FP8 = torch.cuda.get_device_capability() >= (8, 9)
# M, N, K: aligned, odd (masking in every dimension), one row, the real shapes at reduced M
SHAPES = [(256, 128, 256), (37, 24, 200), (1, 40, 48), (512, 768, 1232), (300, 2304, 768)]


def _ints(M, N, K, hi, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-hi, hi + 1, (M, K), generator=g, dtype=torch.int8)
    b = torch.randint(-hi, hi + 1, (N, K), generator=g, dtype=torch.int8)
    exact = (a.long() @ b.long().t()).to(torch.float32)  # |Σ| < 2^24 here: exact in fp32
    return a.cuda(), b.cuda(), exact.cuda()


def _scales(M, N, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(M, generator=g) + 0.5).cuda(), (torch.rand(N, generator=g) + 0.5).cuda()


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("config", range(len(gemm_triton.TILES)))
def test_int8_bit_exact_with_the_reference_dequantization(M, N, K, config):
    a, b, exact = _ints(M, N, K, 127, seed=M + N + K)
    sa, sb = _scales(M, N, seed=K)
    # per-row × per-column, fp32 out: (acc·s_a)·s_b, the order of hq_grad_input's reference
    out = gemm_triton.scaled_gemm(a, b, sa, sb, torch.float32, config=config)
    assert torch.equal(out, exact * sa[:, None] * sb[None, :])
    # one scale (the g_w path): acc·s
    s = sa[:1]
    assert torch.equal(gemm_triton.scaled_gemm(a, b, s, None, config=config), exact * s)
    # bf16 out: one rounding of the fp32 value
    out = gemm_triton.scaled_gemm(a, b, sa, sb[:1], torch.bfloat16, config=config)
    assert torch.equal(out, (exact * sa[:, None] * sb[:1]).bfloat16())
    # accumulate into an existing fp32 gradient (the add may fuse into an FMA: 1 ulp)
    acc = torch.randn(M, N, device="cuda")
    got = acc.clone()
    gemm_triton.scaled_gemm(a, b, s, sb, out=got, config=config)
    prod = exact * s * sb[None, :]
    ulp = (prod.abs() + acc.abs()) * 2.0**-23
    assert ((got - (acc + prod)).abs() <= ulp).all()


@pytest.mark.skipif(not FP8, reason="FP8 needs sm_89+")
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_fp8_int4_grid_products_are_exact(M, N, K):
    """INT4-grid codes (integers in [-7, 7]) are exact in e4m3 and their products sum exactly
    in the fp32 accumulator (|Σ| ≤ 49·K < 2^24): the g_x path keeps INT4 numerics on FP8."""
    a, b, exact = _ints(M, N, K, 7, seed=K)
    a8, b8 = a.float().to(torch.float8_e4m3fn), b.float().to(torch.float8_e4m3fn)
    sa, sb = _scales(M, N, seed=M)
    for config in range(len(gemm_triton.TILES)):
        out = gemm_triton.scaled_gemm(a8, b8, sa, sb, torch.float32, config=config)
        assert torch.equal(out, exact * sa[:, None] * sb[None, :]), config


@pytest.mark.skipif(not FP8, reason="FP8 needs sm_89+")
@pytest.mark.parametrize("K", [4096, 14336])
def test_fp8_int4_grid_sums_stay_exact_at_llm_depth(K):
    """The LLM layers' g_x has K = 14336: sums of INT4-grid products up to 49·K ≈ 7·10^5 need
    20 bits. Same-sign codes make every partial sum large, so an accumulator that keeps fewer
    bits than fp32 (Hopper's FP8 MMA without promotion) loses the low ones. The default
    (``precise=True``) promotes once per K tile and stays exact."""
    g = torch.Generator().manual_seed(K)
    a = torch.randint(4, 8, (128, K), generator=g, dtype=torch.int8)
    b = torch.randint(4, 8, (64, K), generator=g, dtype=torch.int8)
    exact = (a.long() @ b.long().t()).float().cuda()
    a8, b8 = a.float().to(torch.float8_e4m3fn).cuda(), b.float().to(torch.float8_e4m3fn).cuda()
    one = torch.ones(1, device="cuda")
    for config in range(len(gemm_triton.TILES)):
        out = gemm_triton.scaled_gemm(a8, b8, one, None, torch.float32, config=config)
        assert torch.equal(out, exact), (config, (out - exact).abs().max().item())


def test_rejects_what_it_cannot_take():
    a = torch.zeros(16, 32, dtype=torch.int8, device="cuda")
    with pytest.raises(ValueError, match="K-major"):
        gemm_triton.scaled_gemm(a, a.t().contiguous().t(), torch.ones(1, device="cuda"))
    with pytest.raises(ValueError, match="K-major"):
        gemm_triton.scaled_gemm(a.float(), a.float(), torch.ones(1, device="cuda"))
    with pytest.raises(ValueError, match="scale_a"):
        gemm_triton.scaled_gemm(a, a, torch.ones(3, device="cuda"))


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_dispatch_measures_once_and_matches(dtype, tmp_path, monkeypatch):
    if dtype == "fp8" and not FP8:
        pytest.skip("FP8 needs sm_89+")
    monkeypatch.setenv("HOTCOMPILE_CACHE", str(tmp_path))
    monkeypatch.setattr(dispatch, "_disk", None)
    dispatch.clear()
    M, N, K = 512, 256, 1024
    a, b, exact = _ints(M, N, K, 7, seed=1)
    if dtype == "fp8":
        a, b = a.float().to(torch.float8_e4m3fn), b.float().to(torch.float8_e4m3fn)
    sa, sb = _scales(M, N, seed=2)
    ref = (exact * sa[:, None] * sb[:1]).bfloat16()
    out = dispatch.scaled_gemm(a, b, sa, sb[:1], torch.bfloat16)
    torch.testing.assert_close(out.float(), ref.float(), rtol=8e-3, atol=0)
    ((key, choice),) = dispatch.choices().items()
    assert choice.source == "measured" and len(choice.timings_us) >= 2
    assert choice.impl in choice.timings_us
    # cached in memory, and on disk for the next process
    dispatch.scaled_gemm(a, b, sa, sb[:1], torch.bfloat16)
    assert dispatch.choices()[key] is choice
    assert (tmp_path / "gemm_dispatch.json").exists()
    dispatch.clear()
    monkeypatch.setattr(dispatch, "_disk", None)
    dispatch.scaled_gemm(a, b, sa, sb[:1], torch.bfloat16)
    assert dispatch.choices()[key].source == "disk cache"
    # accumulate: timing runs must not leak into the caller's gradient
    dispatch.clear()
    monkeypatch.setattr(dispatch, "_disk", {})
    acc = torch.randn(M, N, device="cuda")
    got = acc.clone()
    dispatch.scaled_gemm(a, b, sa, sb, out=got)
    torch.testing.assert_close(got, acc + exact * sa[:, None] * sb[None, :], rtol=1e-5, atol=1e-5)


def test_preference_overrides_and_validates(monkeypatch):
    dispatch.clear()
    a, b, exact = _ints(64, 32, 64, 127, seed=3)
    s = torch.ones(1, device="cuda")
    try:
        for impl in ("triton", "torch"):
            dispatch.set_preference(impl)
            dispatch.clear()
            out = dispatch.scaled_gemm(a, b, s)
            assert torch.equal(out, exact)
            (c,) = dispatch.choices().values()
            assert c.impl.split(":")[0] == impl and c.source == "preference"
        with pytest.raises(ValueError, match="one of"):
            dispatch.set_preference("cublas")
    finally:
        dispatch.set_preference("auto")
        dispatch.clear()


def test_no_timing_while_a_cuda_graph_is_captured():
    """Under CUDA-graph capture (``mode="reduce-overhead"``) a new shape takes the first
    candidate without timing (events and syncs are illegal while capturing), and replays."""
    dispatch.clear()
    a, b, exact = _ints(96, 48, 64, 127, seed=4)
    s = torch.full((1,), 0.5, device="cuda")
    torch.cuda.synchronize()
    # warm the kernel up outside the capture (compilation launches are not capturable)
    dispatch.set_preference("triton")
    dispatch.scaled_gemm(a, b, s)
    dispatch.set_preference("auto")
    dispatch.clear()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = dispatch.scaled_gemm(a, b, s)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, exact * 0.5)
    (c,) = dispatch.choices().values()
    assert c.source == "capture"
    dispatch.clear()

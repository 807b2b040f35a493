"""The backend on CUDA: inductor, CUDA tensors, bf16 autocast. Skipped without a GPU.

Run on a GPU machine with ``python tools/gpu_tests.py`` (writes tools/results/gpu_tests.md).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import MLPBlock, SmallCNN, load_tool, rel

import hotcompile
from hotcompile import HotBackend

#: these tests exercise the ops path (torch.ops.hotcompile and its CUDA kernels) with HOT on
#: every layer; on CUDA the defaults are the native lowering behind the speed gate
#: (tests/test_lowering_gpu.py covers those)
OPS = {"lowering": "ops", "prefer": "paper"}

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
ops = torch.ops.hotcompile
LP_L1 = [0, 2, 3, 8, 10, 11, 12, 14]


def test_reference_ops_on_cuda_match_cpu_bit_exactly():
    """Deterministic roundings: the same codes and scales on CUDA and CPU."""
    gy = torch.randn(300, 200)
    x = torch.randn(4, 75, 96)
    for rounding in ("nearest", "pseudo_stochastic"):
        for per_token in (True, False):
            a = ops.quantize(gy, 4, per_token, rounding, "maxabs")
            b = ops.quantize(gy.cuda(), 4, per_token, rounding, "maxabs")
            assert torch.equal(a[0], b[0].cpu()) and torch.equal(a[1], b[1].cpu())
        a = ops.abc_compress(x, 0, LP_L1, 16, 8, rounding)
        b = ops.abc_compress(x.cuda(), 0, LP_L1, 16, 8, rounding)
        mismatch = (a[0] != b[0].cpu()).float().mean().item()
        # the FWHT butterfly is the same sequence of fp32 adds on both devices
        assert mismatch == 0.0 and torch.equal(a[1], b[1].cpu())
    ai = torch.randint(-127, 128, (64, 320), dtype=torch.int8)
    bi = torch.randint(-127, 128, (48, 320), dtype=torch.int8)
    assert torch.equal(ops.int_gemm(ai, bi), ops.int_gemm(ai.cuda(), bi.cuda()).cpu())


@pytest.mark.parametrize("model,shape", [(MLPBlock, (8, 64, 64)), (SmallCNN, (8, 1, 16, 16))])
def test_exact_mode_inductor_cuda_matches_eager(model, shape):
    m, x = model().cuda(), torch.randn(*shape, device="cuda")
    m1, m2 = copy.deepcopy(m), copy.deepcopy(m)
    m1(x).pow(2).mean().backward()
    c = torch.compile(m2, backend="hot", options={"exact": True})
    c(x).pow(2).mean().backward()
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
        assert rel(p2.grad, p1.grad) < 1e-4, n


def test_hot_inductor_cuda_bf16_training_and_abc():
    torch.manual_seed(0)
    m = MLPBlock(256, 1024).cuda()
    target = torch.nn.Linear(256, 256).cuda()
    be = HotBackend(**OPS)
    c = torch.compile(m, backend=be)
    opt = torch.optim.AdamW(m.parameters(), 1e-3)
    losses = []
    for _ in range(40):
        x = torch.randn(16, 128, 256, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.mse_loss(c(x).float(), target(x).detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.path == "hot" for p in be.layers)
    # saved activations: HOT vs plain inductor, same model, bf16 autocast
    x = torch.randn(16, 128, 256, device="cuda")
    plain = torch.compile(copy.deepcopy(m), backend="inductor")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        b_plain = hotcompile.saved_activation_bytes(plain(x), m)
        y = c(x)
        b_hot = hotcompile.saved_activation_bytes(y, m)
        assert any(s.dtype == torch.int8 for s in hotcompile.saved_tensors(y))
    assert b_hot < 0.75 * b_plain, (b_hot, b_plain)


def test_dynamic_batch_on_cuda_compiles_once():
    be = HotBackend(**OPS)
    m = MLPBlock().cuda()
    c = torch.compile(m, backend=be, dynamic=True)
    counts = []
    for b in (2, 3, 6):
        c(torch.randn(b, 40, 64, device="cuda")).sum().backward()
        counts.append(len(be.records))
    assert counts[1:] == [counts[0]] * 2
    assert torch.isfinite(m.fc1.weight.grad).all()


def test_conv_model_inductor_cuda_bf16():
    m = SmallCNN().cuda()
    c = torch.compile(m, backend="hot", options=OPS)
    x = torch.randn(16, 1, 16, 16, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(c(x), torch.randint(0, 10, (16,), device="cuda"))
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


@pytest.mark.parametrize("opts", [{"gx_scaling": "per_token", "weight_scale": "maxabs"}, {}])
def test_reduce_overhead_cuda_graphs(opts):
    """``mode="reduce-overhead"``: inductor records the HOT backward into CUDA graphs (no host
    syncs in the HOT ops, nothing skipped) and the replayed gradients equal those of the default
    mode. Stateless options compare exactly; with LQS (defaults) the first backward calibrates
    eagerly during cudagraph warm-up, later steps replay."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    m = MLPBlock(256, 1024).cuda()
    m1, m2 = copy.deepcopy(m), copy.deepcopy(m)
    c1 = torch.compile(m1, backend="hot", options={**OPS, **opts})
    c2 = torch.compile(m2, backend="hot", options={**OPS, **opts, "mode": "reduce-overhead"})
    counters.clear()
    for _ in range(4):
        x = torch.randn(16, 128, 256, device="cuda")
        for mm, cc in ((m1, c1), (m2, c2)):
            torch.compiler.cudagraph_mark_step_begin()
            mm.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                cc(x).float().pow(2).mean().backward()
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
        assert p2.grad.isfinite().all(), n
        assert rel(p2.grad, p1.grad) < (1e-5 if opts else 1e-2), n


def _gpt2_grads(options: dict | None, repeats: int = 1) -> list[dict[str, torch.Tensor]]:
    """Gradients of a small GPT-2 (2 blocks, 64 wide, the tied 50257-wide head) on one fixed
    batch, compiled with inductor: plain (``options=None``) or ``backend="hot"`` — the
    function of ``experiments/int8_head_check.py``, which prints what this test asserts."""
    return load_tool("int8_head_check.py", "experiments").grads(options, repeats)


def test_gpt2_tied_head_gradients_under_inductor_cuda():
    """The regression test of GPT-2's NaN (experiments/results/gpt2_nan_gpu/README.md): with
    inductor's comprehensive padding, the copy feeding the tied head's ``hq_grad_input`` read
    the cross-entropy gradient at a padded row stride it was not written with, so HOT's
    gradients were ~100% off and changed from one backward to the next. With INT8 on both
    paths (warm-up g_x, no HLA) HOT's gradients must be close to plain inductor's — on the
    H100 (torch 2.11) the worst parameter, ln_f.weight, was 0.18 off (0.18 on the CPU too:
    a sum over 256 tokens of INT8-rounded head g_x), every parameter 1.4-1.45 off with the
    padding bug — and the same on a second backward up to the SAWB sums' float order.
    Inductor's padding is on (its default): ``hotcompile.passes.layout`` pins the buffers
    HOT's ops touch (ln_f.weight 0.183 off with padding on at fd0f2f9, as without padding)."""
    exact = _gpt2_grads(None)[0]
    opts = {**OPS, "gx_scaling": "per_token", "warmup_steps": 1000, "hla": False}
    hot = _gpt2_grads(opts, repeats=2)
    for n, g in exact.items():
        assert torch.isfinite(hot[0][n]).all(), n
        assert rel(hot[0][n], g) < 0.4, (n, rel(hot[0][n], g))
        assert rel(hot[1][n], hot[0][n]) < 0.02, (n, rel(hot[1][n], hot[0][n]))


def test_fp8_weight_gradient_on_cuda_matches_the_cpu_reference():
    """``gw_format="fp8"`` on CUDA (the fused HLA kernel writes e4m3 codes, an FP8 GEMM
    multiplies them): the same e4m3 codes as on the CPU and the same weight gradient."""
    from hotcompile.quant import FP8_E4M3

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, 48, generator=g)
    gy = torch.randn(2, 64, 80, generator=g) * 1e-3
    out = {}
    for dev in ("cpu", "cuda"):
        xq, sx = ops.abc_compress(x.to(dev), 0, LP_L1, 16, 8, FP8_E4M3)
        gw = ops.hla_grad_weight(gy.to(dev), xq, sx, 0, LP_L1, 16, 8, FP8_E4M3, "t", True)
        out[dev] = (xq.cpu(), sx.cpu(), gw.cpu())
    assert out["cuda"][0].dtype == torch.float8_e4m3fn
    assert torch.equal(out["cuda"][0].float(), out["cpu"][0].float())
    assert torch.equal(out["cuda"][1], out["cpu"][1])
    # Hopper's FP8 MMA accumulates with fewer bits than float32 (tests/test_kernels_hla_gpu.py
    # ::test_fp8_hla_grad_weight_matches_reference measured up to 2.7e-4): norm-relative bound
    assert rel(out["cuda"][2], out["cpu"][2]) < 2e-3


def test_hla_signs_on_cuda_inductor_match_cpu_aot_eager():
    """``hla_signs=True`` compiled by inductor on CUDA gives the weight gradients of the CPU
    aot_eager pipeline: the sign hash is integer arithmetic, so both devices and both
    compilers draw the same signs (unquantized paths, so only the signs could make them
    differ — one flipped sign moves g_w far more than float rounding). Then the fused path
    (INT4 g_x, INT8 HLA) with signs trains a bf16 step to finite gradients."""
    from torch import nn

    x = torch.randn(2, 64, 32)
    grads = {}
    for compiler, dev in (("aot_eager", "cpu"), ("inductor", "cuda")):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 32))
        m = m.to(dev)
        opts = {"compiler": compiler, "hla_signs": True, "gx_bits": None, "gw_bits": None}
        torch.compile(m, backend="hot", options={**OPS, **opts})(
            x.to(dev)
        ).square().mean().backward()
        grads[dev] = [p.grad.cpu() for p in m.parameters()]
    for a, b in zip(grads["cpu"], grads["cuda"]):
        assert rel(b, a) < 1e-4
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = MLPBlock(256, 1024).cuda()
    c = torch.compile(m, backend="hot", options={**OPS, "hla_signs": True})
    for _ in range(2):
        m.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            c(torch.randn(8, 128, 256, device="cuda")).float().pow(2).mean().backward()
    assert all(p.grad.isfinite().all() and p.grad.abs().sum() > 0 for p in m.parameters())

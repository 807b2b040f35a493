"""Every element a kernel returns is written by the kernel: outputs come from ``torch.empty``,
and memory freshly taken from the driver is often zero, so a kernel that skips a pad column
or a pad row can pass the bit-exactness tests and still return garbage inside a training run,
where the caching allocator hands back memory that held other tensors. These tests fill the
allocator's free memory with NaN bytes first (``_poison``) and then compare with the
reference on shapes with ragged edges (O, L, I not multiples of 16; GPT-2's 50257-wide head).
Needs CUDA.
"""

from __future__ import annotations

import pytest
import torch
from conftest import rel, skip_module_without_cuda_triton

from hotcompile.hadamard import block_hadamard
from hotcompile.quant import quantize

#: these tests exercise the ops path (torch.ops.hotcompile and its CUDA kernels) with HOT on
#: every layer; on CUDA the defaults are the native lowering behind the speed gate
#: (tests/test_lowering_gpu.py covers those)
OPS = {"lowering": "ops", "prefer": "paper"}

pytestmark = [pytest.mark.gpu]
skip_module_without_cuda_triton()

from hotcompile.kernels import hq_cuda, hq_triton, shadow  # noqa: E402
from hotcompile.ops import abc_compress, hla_grad_weight, hq_grad_input  # noqa: E402

ops = torch.ops.hotcompile
FP8 = torch.cuda.get_device_capability() >= (8, 9)


def _poison() -> None:
    """Fill cached free blocks of both allocator pools with 0xFF (NaN in every float type and
    in float8_e4m3fn, -1 in int8), so an unwritten output element shows."""
    torch.cuda.synchronize()
    big = [torch.full((n,), 0xFF, dtype=torch.uint8, device="cuda") for n in (1 << 28, 1 << 26)]
    small = [torch.full((1 << 19,), 0xFF, dtype=torch.uint8, device="cuda") for _ in range(64)]
    torch.cuda.synchronize()
    del big, small


def _gy(L, O, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(L, O, generator=g) * torch.rand(L, 1, generator=g).add(0.1)).to(dtype)


QUANTIZERS = ["triton", "cuda"]
SHAPES = [(8192, 50257), (64, 1000), (37, 17), (16, 50)]


@pytest.mark.parametrize("impl", QUANTIZERS)
@pytest.mark.parametrize("L,O", SHAPES)
@pytest.mark.parametrize("per_token", [True, False])
def test_quantize_writes_every_code(impl, L, O, per_token):
    gy = _gy(L, O, seed=O).cuda()
    fn = hq_triton.hq_quantize_triton
    if impl == "cuda":
        if not (hq_cuda.available() and hq_cuda.supported(gy, "pseudo_stochastic", torch.int8)):
            pytest.skip("the CUDA quantize kernel does not take this shape (or is not built)")
        fn = hq_cuda.hq_quantize
    rc, rs = quantize(block_hadamard(gy.cpu(), 1, 16), 4, per_token, "pseudo_stochastic")
    for dtype, pad in [(torch.int8, 1)] + ([(torch.float8_e4m3fn, 16)] if FP8 else []):
        _poison()
        codes, scales = fn(gy, 4, per_token, "pseudo_stochastic", dtype, pad)
        assert torch.isfinite(codes.float()).all() and torch.isfinite(scales).all()
        assert torch.equal(codes[:L].cpu().float(), rc.float()), "codes differ from reference"
        assert torch.equal(scales[: rs.numel()].cpu(), rs)
        assert (codes[L:] == 0).all() and (scales[rs.numel() :] == 0).all()  # pad rows


@pytest.mark.parametrize("O,I", [(50257, 768), (1000, 768), (50, 24)])
@pytest.mark.parametrize("fp8", [False] + ([True] if FP8 else []))
def test_weight_quantize_writes_every_code(O, I, fp8):
    w = (torch.randn(O, I) * 0.05).bfloat16()
    rc, rs = quantize(block_hadamard(w, 0, 16), 4, False, "nearest", "maxabs")
    _poison()
    wt, sw = hq_triton.quantize_weight(w.cuda(), 4, "maxabs", fp8)
    assert torch.isfinite(wt.float()).all()
    assert torch.equal(wt.t().cpu().float(), rc.float()) and torch.equal(sw.cpu(), rs)


@pytest.mark.parametrize("L,O,I", [(8192, 50257, 768), (200, 1000, 768), (40, 50, 24)])
@pytest.mark.parametrize("scaling", ["per_token", "per_tensor"])
def test_hq_grad_input_in_reused_memory(L, O, I, scaling):
    gy = (_gy(L, O, seed=1) * 1e-4).cuda()
    w = (torch.randn(O, I) * 0.02).bfloat16().cuda()
    args = (4, scaling, "pseudo_stochastic", "sawb", 16, "l", "", False)
    ref = hq_grad_input._init_fn(gy, w, *args)
    _poison()
    out = ops.hq_grad_input(gy, w, *args)
    assert torch.isfinite(out).all()
    assert rel(out, ref) < 4e-3


@pytest.mark.parametrize("N,S,D", [(2, 197, 768), (3, 50, 24), (1, 8192, 40)])
def test_abc_and_hla_grad_weight_in_reused_memory(N, S, D):
    x = torch.randn(N, S, D).bfloat16().cuda()
    gy = (torch.randn(N, S, 72) * 1e-3).bfloat16().cuda()
    rows = [0, 1, 2, 4, 8, 3, 5, 6]
    rc, rs = abc_compress._init_fn(x, 0, rows, 16, 8, "pseudo_stochastic")
    _poison()
    codes, scale = ops.abc_compress(x, 0, rows, 16, 8, "pseudo_stochastic")
    assert torch.equal(codes.cpu(), rc.cpu()) and torch.equal(scale.cpu(), rs.cpu())
    ref = hla_grad_weight._init_fn(gy, rc, rs, 0, rows, 16, 8, "pseudo_stochastic", "l", False)
    _poison()
    out = ops.hla_grad_weight(gy, codes, scale, 0, rows, 16, 8, "pseudo_stochastic", "l", False)
    assert torch.isfinite(out).all() and rel(out, ref) < 1e-5


def test_shadow_checks_a_compiled_step():
    """shadow.enabled() sees every HOT op of a compiled step, each within float rounding of
    the reference (a step of a model with a ragged 1000-wide head)."""
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 1000)
    ).cuda()
    c = torch.compile(model, backend="hot", options={**OPS, "gx_scaling": "per_tensor"})
    shadow.clear()
    with shadow.enabled():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = c(torch.randn(4, 50, 64, device="cuda")).float().pow(2).mean()
        loss.backward()
    recs = shadow.records()
    ops_seen = {r.op.split("[")[0] for r in recs}
    assert {"hq_grad_input", "hla_grad_weight"} <= ops_seen or "hla_grad_weight_dense" in ops_seen
    assert not [r for r in recs if r.bad], shadow.table()
    # disabled again: calls are no longer checked
    n = sum(r.calls for r in shadow.records())
    ops.abc_compress(torch.randn(1, 32, 16, device="cuda"), 0, [0, 1], 16, 8, "nearest")
    assert sum(r.calls for r in shadow.records()) == n

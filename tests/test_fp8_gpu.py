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


def _block_grads(forward: str, x: torch.Tensor, gy: torch.Tensor):
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block(256, 4, 1024).cuda()
    be = HotBackend(prefer="paper", forward=forward, rounding="nearest")
    xs = x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = torch.compile(block, backend=be)(xs)
    y.backward(gy)
    grads = [xs.grad] + [p.grad for p in block.parameters()]
    return y.detach().float(), grads, be


def test_compiled_block_fp8_forward():
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(8, 128, 256, device="cuda", generator=g)
    gy = torch.randn(8, 128, 256, device="cuda", generator=g).to(torch.bfloat16)
    y0, g0, _ = _block_grads("bf16", x, gy)
    y1, g1, be = _block_grads("fp8", x, gy)
    fwd = {p.name: p.forward for p in be.layers}
    assert fwd["qkv"] == "fp8 rowwise" and fwd["fc1"] == "fp8 rowwise", fwd
    assert fwd["fc2"] == "fp8 rowwise"  # the block's graph ends in the residual stream
    assert 1e-3 < rel(y1, y0) < 0.06
    # the backward reads g_y and ABC's codes of x, not y: the gradients of the layers after
    # the first FP8 layer see different inputs only through x itself (none here: y.backward
    # with a fixed g_y), so they agree up to the FP8 forward's effect on saved activations
    for a, b in zip(g0, g1):
        assert rel(b, a) < 0.1

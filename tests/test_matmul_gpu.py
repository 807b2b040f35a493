"""Weight matmuls as models write them, on CUDA with HOT's defaults (the native lowering):
HF ``Conv1D`` (``addmm``), ``x @ W``, a checkpointed block, an empty batch (issue 15).

Skipped without CUDA + Triton. Run on the GPU machine (tools/results/gpu_tests.md).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import hotcompile
from hotcompile.lowering import available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not available(), reason="needs CUDA and Triton"),
]

D, H = 256, 512


class Forms(nn.Module):
    """Four layers written four ways (``linear=True``: the same weights as ``nn.Linear``
    calls), the middle two inside a checkpointed region."""

    def __init__(self, linear: bool = False) -> None:
        super().__init__()
        self.linear = linear
        g = torch.Generator().manual_seed(0)
        # stored [in, out] like HF Conv1D; the nn.Linear twin uses their transposes
        self.w1 = nn.Parameter(torch.randn(D, H, generator=g) / D**0.5)
        self.w2 = nn.Parameter(torch.randn(H, H, generator=g) / H**0.5)
        self.w3 = nn.Parameter(torch.randn(H, D, generator=g) / H**0.5)
        self.w4 = nn.Parameter(torch.randn(D, D, generator=g) / D**0.5)
        self.b = nn.Parameter(torch.zeros(H))

    def _mid(self, h: torch.Tensor) -> torch.Tensor:
        if self.linear:
            return F.linear(F.gelu(F.linear(h, self.w2.t())), self.w3.t())
        return F.gelu(h.matmul(self.w2)) @ self.w3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.linear:
            h = F.linear(x, self.w1.t(), self.b)
        else:
            h = torch.addmm(self.b, x.view(-1, D), self.w1).view(*x.shape[:-1], H)
        h = checkpoint(self._mid, F.gelu(h), use_reentrant=False)
        return F.linear(h, self.w4.t()) if self.linear else h @ self.w4


def _grads(options: dict, linear: bool, x: torch.Tensor) -> tuple[dict, list]:
    torch._dynamo.reset()
    model = Forms(linear).cuda()
    backend = hotcompile.HotBackend(**options)
    with torch.autocast("cuda", torch.bfloat16):
        out = torch.compile(model, backend=backend)(x)
    target = torch.linspace(-1, 1, D, device="cuda")
    (out.float() * target).square().sum().backward()
    return {n: p.grad.float().clone() for n, p in model.named_parameters()}, backend.layers


def test_matmul_forms_are_hot_on_cuda_and_as_close_as_linear() -> None:
    """Every form, the checkpointed ones included, is a HOT layer on the native path, and its
    gradients are as close to the exact ones as the ``nn.Linear`` twin's."""
    x = torch.randn(8, 128, D, device="cuda")
    opts = {"prefer": "paper"}
    exact, _ = _grads({"exact": True}, False, x)
    forms, plans = _grads(opts, False, x)
    twin, _ = _grads(opts, True, x)
    assert len(plans) == 4 and all(p.path == "hot" for p in plans), [
        (p.name, p.path, p.reason) for p in plans
    ]
    assert sum(p.region == "checkpoint" for p in plans) == 2
    for k in exact:
        e_forms = ((forms[k] - exact[k]).norm() / exact[k].norm()).item()
        e_twin = ((twin[k] - exact[k]).norm() / exact[k].norm()).item()
        assert e_forms < 1.25 * e_twin + 0.02, (k, e_forms, e_twin)


def test_matmul_forms_generated_code_has_no_python_op() -> None:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model = Forms().cuda()
    compiled = torch.compile(model, backend="hot", options={"prefer": "paper"})
    x = torch.randn(8, 128, D, device="cuda", requires_grad=True)

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            out = compiled(x)
        out.float().sum().backward()

    _, codes = run_and_get_code(step)
    src = "\n".join(codes)
    assert "torch.ops.hotcompile." not in src
    assert "_hq_quant_kernel" in src


def test_empty_batch_trains_on_cuda() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, backend="hot")
    for rows in (0, 64, 0, 64):
        x = torch.randn(rows, D, device="cuda")
        with torch.autocast("cuda", torch.bfloat16):
            loss = compiled(x).float().square().sum()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)

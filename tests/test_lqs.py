"""LQS: per-layer per-token / per-tensor choice from real gradients, plans, warm-up."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from conftest import AOT, MLPBlock, rel

import hotcompile
from hotcompile import HotBackend, HotConfig, HotConfigError, Plan, lqs


@pytest.fixture(autouse=True)
def _fresh_lqs():
    lqs.reset()
    yield
    lqs.reset()


def _grad_pattern(kind: str, L: int = 256, O: int = 128) -> torch.Tensor:
    g = torch.randn(L, O)
    if kind == "token_scales":  # rows spanning five orders of magnitude
        g = g * torch.logspace(-3, 2, L)[:, None]
    elif kind == "few_huge_tokens":  # Gaussian, except two tokens 1000x larger
        g[[3, 100]] *= 1000.0
    return g


def _linear_with_grad(kind: str):
    """A linear layer and a loss whose gradient w.r.t. the layer output is ``pattern``."""
    lin = nn.Linear(64, 128)
    pattern = _grad_pattern(kind)
    x = torch.randn(256, 64, requires_grad=True)
    return lin, x, (lambda y: (y * pattern).sum())


@pytest.mark.parametrize(
    "kind,expected",
    [("token_scales", "per_token"), ("gaussian", "per_tensor"), ("few_huge_tokens", "per_tensor")],
)
def test_calibrate_picks_quantizer_from_real_gradients(kind, expected):
    lin, x, loss_fn = _linear_with_grad(kind)
    plan = hotcompile.calibrate(lin, x, loss_fn)
    (entry,) = plan.entries
    assert entry.quantizer == expected, entry
    # the rule: per-token iff e_token < 0.5 * e_tensor, with both errors recorded
    assert (entry.e_token < 0.5 * entry.e_tensor) == (expected == "per_token")
    assert "e_token" in entry.rule
    assert lin.weight.grad is None  # calibration leaves gradients as they were


def test_automatic_calibration_then_frozen_without_recompiles():
    lin, x, loss_fn = _linear_with_grad("token_scales")
    exact_gx = torch.autograd.grad(loss_fn(lin(x)), x)[0]
    be = HotBackend(compiler="aot_eager")
    c = torch.compile(lin, backend=be)
    compiled_graphs = []
    grads = []
    for _ in range(4):
        x.grad = None
        loss_fn(c(x)).backward()
        grads.append(x.grad.clone())
        compiled_graphs.append(len(be.records))
    assert compiled_graphs == [compiled_graphs[0]] * 4  # no recompile, ever
    (plan,) = be.layers
    assert plan.quantizer == "per_token" and "e_token" in plan.quantizer_rule
    torch.testing.assert_close(grads[0], exact_gx)  # calibration step: exact g_x
    assert 0 < rel(grads[1], exact_gx) < 0.5  # afterwards: HQ INT4 per-token
    torch.testing.assert_close(grads[1], grads[2])  # decision frozen, deterministic rounding


def test_per_layer_decisions_differ_in_one_model():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(32, 128), nn.Linear(32, 128)

        def forward(self, x):
            return self.a(x), self.b(x)

    m, x = Two(), torch.randn(256, 32, requires_grad=True)  # g_x is what LQS quantizes
    ga, gb = _grad_pattern("token_scales"), _grad_pattern("gaussian")
    plan = hotcompile.calibrate(m, x, lambda out: (out[0] * ga).sum() + (out[1] * gb).sum())
    assert {e.layer: e.quantizer for e in plan.entries} == {"a": "per_token", "b": "per_tensor"}


def test_plan_round_trips_through_json_and_applies_without_calibration(tmp_path):
    lin, x, loss_fn = _linear_with_grad("token_scales")
    plan = hotcompile.calibrate(lin, x, loss_fn)
    path = tmp_path / "plan.json"
    plan.save(path)
    assert json.loads(path.read_text())["layers"][0]["quantizer"] == "per_token"
    loaded = Plan.load(path)
    assert loaded == plan
    lqs.reset()
    exact_gx = torch.autograd.grad(loss_fn(lin(x)), x)[0]
    be = HotBackend(compiler="aot_eager", plan=str(path))
    c = torch.compile(lin, backend=be)
    x.grad = None
    loss_fn(c(x)).backward()
    assert rel(x.grad, exact_gx) > 1e-3  # quantized from the first step: no calibration
    (p,) = be.layers
    assert p.quantizer == "per_token" and p.quantizer_rule.startswith("plan:")
    assert not lqs._STATES  # no runtime state was needed


def test_metric_option_and_warmup():
    lin, x, loss_fn = _linear_with_grad("gaussian")
    exact_gx = torch.autograd.grad(loss_fn(lin(x)), x)[0]
    c = torch.compile(
        lin,
        backend=HotBackend(
            compiler="aot_eager", lqs_metric="raw", warmup_steps=2, gx_scaling="per_tensor"
        ),
    )
    errs = []
    for _ in range(4):
        x.grad = None
        loss_fn(c(x)).backward()
        errs.append(rel(x.grad, exact_gx))
    # warm-up: INT8 for the first two backward steps, then INT4
    assert errs[0] < 0.05 and errs[1] < 0.05 and errs[2] > 0.1 and errs[3] > 0.1


def test_lqs_default_trains_a_block():
    m = MLPBlock()
    be = HotBackend(compiler="aot_eager")
    c = torch.compile(m, backend=be)
    for _ in range(3):
        c(torch.randn(4, 32, 64)).pow(2).mean().backward()
    assert all(p.quantizer in ("per_token", "per_tensor") for p in be.layers)
    plan = be.lqs_plan()
    assert {e.layer for e in plan.entries} == {"fc1", "fc2"}
    assert "e_tensor" in plan.table()


@pytest.mark.parametrize(
    "bad",
    [
        {"lqs_threshold": 2.0},
        {"lqs_calibration_steps": 0},
        {"plan": "/nonexistent/plan.json"},
        {"lqs_metric": "fro"},
    ],
)
def test_invalid_lqs_options(bad):
    with pytest.raises(HotConfigError, match=list(bad)[0]):
        HotConfig(**bad)


def test_plan_option_in_torch_compile_options():
    lin, x, loss_fn = _linear_with_grad("gaussian")
    plan = hotcompile.calibrate(lin, x, loss_fn)
    c = torch.compile(lin, backend="hot", options={**AOT, "plan": plan.to_json()})
    loss_fn(c(x)).backward()
    assert hotcompile.plans()[-1].quantizer == "per_tensor"

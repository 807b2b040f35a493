"""Gradient numerics of HOT's backward: exact mode, derived error bounds, NaN/Inf handling.

The error bounds are derived in docs/numerics.md: with independent, zero-mean rounding errors
of variance ``c·s²`` per element (c = 1/12 round-to-nearest, at most 1/4 for stochastic and
pseudo-stochastic rounding), the expected squared error of a quantized product ``A·B`` is
``c_A·Σ_rows s_A,r²·‖B‖_F² + c_B·s_B²·N·‖A‖_F²`` (per-token scales of A summed over rows).
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import AOT, MLPBlock, SmallCNN, rel, run_step

import hotcompile
from hotcompile.autograd import LayerSpec, hot_conv2d, hot_linear
from hotcompile.hadamard import block_hadamard
from hotcompile.hla import hla_transform
from hotcompile.quant import quantize

ops = torch.ops.hotcompile
LP_L1 = (0, 2, 3, 8, 10, 11, 12, 14)


# ----------------------------------------------------------------------------- exact mode


@pytest.mark.parametrize("shape", [(6, 20), (3, 7, 20), (2, 3, 5, 20)])
@pytest.mark.parametrize("bias", [True, False])
def test_exact_linear_equals_autograd(shape, bias):
    x = torch.randn(*shape, requires_grad=True)
    lin = nn.Linear(20, 24, bias=bias)
    spec = LayerSpec("l", exact=True)
    y = hot_linear(x, lin.weight, lin.bias, spec)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, lin.weight] + ([lin.bias] if bias else []), g)
    ref = torch.autograd.grad(lin(x), [x, lin.weight] + ([lin.bias] if bias else []), g)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride,padding,dilation", [(1, 1, 1), (2, 0, 1), (1, 2, 2), (2, 1, 1)])
def test_exact_conv_equals_autograd(stride, padding, dilation):
    x = torch.randn(2, 3, 11, 9, requires_grad=True)
    conv = nn.Conv2d(3, 5, 3, stride, padding, dilation)
    spec = LayerSpec(
        "c",
        kind="conv2d",
        exact=True,
        stride=(stride,) * 2,
        padding=(padding,) * 2,
        dilation=(dilation,) * 2,
    )
    y = hot_conv2d(x, conv.weight, conv.bias, spec)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, conv.weight, conv.bias], g)
    ref = torch.autograd.grad(conv(x), [x, conv.weight, conv.bias], g)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model,shape", [(MLPBlock, (4, 24, 64)), (SmallCNN, (4, 1, 12, 12))])
def test_exact_mode_compiled_model_equals_autograd(model, shape):
    m, x = model(), torch.randn(*shape)
    y0, g0, _ = run_step(m, x)
    y1, g1, _ = run_step(m, x, backend="hot", options={**AOT, "exact": True})
    torch.testing.assert_close(y1, y0)
    assert g0.keys() == g1.keys()
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- bounds


def _expected_product_error(a_codes, a_scale, a_c, b_codes, b_scale, b_c, a, b) -> float:
    """sqrt of E‖ΔAB‖² for A [M,K] (row scales) · B [K,N] (scalar scale), see module doc."""
    sa = a_scale if a_scale.numel() > 1 else a_scale.expand(a.shape[0])
    term_a = a_c * (sa.double() ** 2).sum() * b.double().norm() ** 2
    term_b = b_c * b_scale.double().item() ** 2 * b.shape[1] * a.double().norm() ** 2
    return math.sqrt(term_a + term_b)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("rounding", ["pseudo_stochastic", "stochastic", "nearest"])
def test_gx_error_within_derived_bound(bits, per_token, rounding):
    L, O, I = 256, 192, 96
    gy = torch.randn(L, O) * torch.logspace(-1, 1, L)[:, None]  # tokens of varied scale
    w = torch.randn(O, I) / math.sqrt(O)
    scaling = "per_token" if per_token else "per_tensor"
    gx = ops.hq_grad_input(gy, w, bits, scaling, rounding, "maxabs", 16, "l", "", True)
    exact = gy.double() @ w.double()
    g_hat, w_hat = block_hadamard(gy, 1), block_hadamard(w, 0)
    gq, sg = quantize(g_hat, bits, per_token, rounding)
    wq, sw = quantize(w_hat, bits, False, "nearest")
    c = 1 / 12 if rounding == "nearest" else 1 / 4
    bound = _expected_product_error(gq, sg, c, wq, sw, 1 / 12, g_hat, w_hat) / 16
    err = (gx.double() - exact).norm().item()
    assert err <= 1.2 * bound, (err, bound)
    assert err >= 0.05 * bound  # the bound is not vacuous: quantization does cost this much
    # on tokens spanning 100x in scale, per-tensor INT4 loses the small tokens (LQS's reason)
    expected_rel = {(4, True): 0.4, (4, False): 0.7, (8, True): 0.02, (8, False): 0.04}
    assert rel(gx, exact) < expected_rel[bits, per_token]


@pytest.mark.parametrize("rounding", ["pseudo_stochastic", "nearest"])
def test_gw_quantization_error_within_derived_bound(rounding):
    N, S, O, I = 4, 64, 48, 40
    gy, x = torch.randn(N, S, O), torch.randn(N, S, I)
    xq, sx = ops.abc_compress(x, 0, list(LP_L1), 16, 8, rounding)
    gw = ops.hla_grad_weight(gy, xq, sx, 0, list(LP_L1), 16, 8, rounding, "l", True)
    g_t, x_t = hla_transform(gy, 0, LP_L1), hla_transform(x, 0, LP_L1)
    hla_exact = g_t.double().t() @ x_t.double() / 16  # HLA without quantization
    gq, sg = quantize(g_t, 8, False, rounding)
    c = 1 / 12 if rounding == "nearest" else 1 / 4
    bound = _expected_product_error(gq, sg, c, xq, sx, c, g_t.t(), x_t) / 16
    err = (gw.double() - hla_exact).norm().item()
    assert err <= 1.2 * bound, (err, bound)
    assert rel(gw, hla_exact) < 0.02  # INT8 costs ~1% on top of the projection


def test_hadamard_helps_int4_on_outlier_channels():
    """The reason for HQ: an outlier column of g_y ruins naive INT4 per-token scales."""
    L, O, I = 512, 256, 64
    gy = torch.randn(L, O)
    gy[:, 7] *= 50.0  # one outlier channel
    w = torch.randn(O, I) / 16
    exact = gy.double() @ w.double()
    hq = ops.hq_grad_input(gy, w, 4, "per_token", "nearest", "maxabs", 16, "l", "", True)
    naive_q = quantize(gy, 4, True, "nearest")
    naive_w = quantize(w.t().contiguous(), 4, False, "nearest")
    naive = (naive_q[0].double() * naive_q[1][:, None]) @ (naive_w[0].double() * naive_w[1]).t()
    assert rel(hq, exact) < 0.85 * rel(naive, exact)


# ----------------------------------------------------------------------------- NaN / Inf


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_gradient_propagates_and_is_reported_once(bad, caplog):
    m = MLPBlock()
    c = torch.compile(m, backend="hot", options=AOT)
    x = torch.randn(2, 16, 64)
    with caplog.at_level(logging.WARNING, logger="hotcompile"):
        for _ in range(2):
            y = c(x)
            (y * torch.tensor(bad)).sum().backward()
    assert not torch.isfinite(m.fc1.weight.grad).all()
    assert not torch.isfinite(m.fc2.weight.grad).all()
    msgs = [r.getMessage() for r in caplog.records if "NaN/Inf" in r.getMessage()]
    assert sum("'fc2'" in msg for msg in msgs) == 1  # once per layer, named
    assert sum("'fc1'" in msg for msg in msgs) == 1
    assert set(hotcompile.nonfinite_layers()) == {"fc1", "fc2"}


def test_finite_training_reports_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="hotcompile"):
        run_step(MLPBlock(), torch.randn(2, 16, 64), backend="hot", options=AOT)
    assert not [r for r in caplog.records if "NaN/Inf" in r.getMessage()]


# ----------------------------------------------------------------------------- whole layers


class _Device:
    """A fake device clock for the CUDA check's events: work queued up to ``done`` ran."""

    def __init__(self) -> None:
        self.queued = self.done = 0
        self.waits = 0

    def event(self):
        self.queued += 1
        device, ticket = self, self.queued

        class Event:
            def query(self) -> bool:
                return device.done >= ticket

            def synchronize(self) -> None:
                device.waits += 1
                device.done = max(device.done, ticket)

        return Event()


@pytest.fixture
def fake_cuda_check(monkeypatch):
    """``numerics.check_scale``'s CUDA path on the CPU: the copies land at once, the events
    complete when the fake device says so."""
    from hotcompile import numerics

    device = _Device()
    numerics.reset()
    monkeypatch.setattr(numerics, "_flags", None)
    monkeypatch.setattr(numerics, "_cursor", 0)
    monkeypatch.setattr(numerics, "RING", 8)
    monkeypatch.setattr(numerics, "_deferred", lambda scale: True)
    monkeypatch.setattr(numerics, "_capturing", lambda: False)
    monkeypatch.setattr(numerics, "_host_buffer", lambda n: torch.empty(n))
    monkeypatch.setattr(numerics, "_recorded_event", device.event)
    yield numerics, device
    numerics.reset()


def test_deferred_check_reports_once_the_copy_has_landed(fake_cuda_check, caplog):
    numerics, device = fake_cuda_check
    with caplog.at_level(logging.WARNING, logger="hotcompile"):
        numerics.check_scale(torch.tensor([1.0, float("nan")]), "fc1", "g_x")  # per token
        numerics.check_scale(torch.tensor([2.0]), "fc2", "g_w")
        assert not caplog.records  # still in flight: nothing read yet
        device.done = device.queued  # the device catches up
        numerics.check_scale(torch.tensor([float("inf")]), "fc1", "g_w")  # polls first
        assert [r.getMessage().count("'fc1'") for r in caplog.records] == [1]
        assert numerics.nonfinite_layers() == {"fc1": "g_x"}  # once, the first path
    assert device.waits == 0  # a finished event is never waited on


def test_a_full_ring_waits_for_the_oldest_check_and_misses_nothing(fake_cuda_check):
    numerics, device = fake_cuda_check
    for i in range(numerics.RING):
        numerics.check_scale(torch.tensor([1.0]), f"ok{i}", "g_x")  # the device never catches up
    numerics.check_scale(torch.tensor([float("nan")]), "late", "g_w")  # slot 0 is still busy
    assert device.waits > 0  # so the host waited instead of overwriting an unread slot
    assert numerics.nonfinite_layers() == {"late": "g_w"}


def test_poll_stops_at_the_oldest_check_still_in_flight(fake_cuda_check):
    numerics, device = fake_cuda_check
    numerics.check_scale(torch.tensor([1.0]), "a", "g_x")
    numerics.check_scale(torch.tensor([float("nan")]), "b", "g_x")
    numerics._poll()  # neither landed: both stay pending, in order
    assert [p[0] for p in numerics._pending] == ["a", "b"]
    device.done = 1  # only the first landed
    numerics._poll()
    assert [p[0] for p in numerics._pending] == ["b"] and not numerics._reported


def test_hot_gradients_track_exact_gradients():
    """Default HOT on a smooth sequence model: gradients point the same way as autograd's."""
    torch.manual_seed(0)
    t = torch.linspace(0, 1, 64)
    base = torch.stack(
        [torch.sin(2 * math.pi * f * t + p) for f, p in [(0.5, 0), (1, 1), (2, 2), (0.3, 3)] * 16],
        -1,
    )  # [64, 64] smooth tokens
    x = base[None].repeat(4, 1, 1) + 0.01 * torch.randn(4, 64, 64)
    m = MLPBlock()
    _, g0, _ = run_step(m, x)
    _, g1, _ = run_step(m, x, backend="hot", options=AOT)
    for k in ("fc1.weight", "fc2.weight", "fc1.bias", "ln.weight"):
        cos = F.cosine_similarity(g0[k].flatten(), g1[k].flatten(), dim=0)
        assert cos > 0.9, (k, cos)
    torch.testing.assert_close(g1["fc2.bias"], g0["fc2.bias"])  # bias gradients stay exact


def test_hadamard_off_is_the_naive_int4_ablation():
    """``hadamard=False`` quantizes g_y and W directly: worse g_x on outlier channels."""
    torch.manual_seed(0)
    lin = nn.Linear(256, 64)
    x = torch.randn(512, 256, requires_grad=True)
    pattern = torch.randn(512, 64)
    pattern[:, 7] *= 50.0  # an outlier output channel of g_y
    exact = torch.autograd.grad((lin(x) * pattern).sum(), x)[0]
    errs = {}
    for hadamard in (True, False):
        be = hotcompile.HotBackend(compiler="eager", hadamard=hadamard, gx_scaling="per_token")
        x.grad = None
        (torch.compile(lin, backend=be)(x) * pattern).sum().backward()
        errs[hadamard] = rel(x.grad, exact)
        torch._dynamo.reset()
        assert ("HQ" in be.layers[0].describe()["g_x"]) == hadamard
    assert errs[True] < 0.85 * errs[False], errs

"""FP8-e4m3 codes on the g_w path (``gw_format="fp8"``): the configurable alternative to INT8.

The reference quantizer is the specification: a max-abs/448 scale, round-to-nearest-even onto
e4m3, NaN/Inf kept visible through the scale. The ops carry the format where the rounding
goes (``quant.FP8_E4M3``); the ABC buffer then holds ``float8_e4m3fn`` codes, and the weight
gradient multiplies them in float32 (e4m3 products are exact there).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import hotcompile
from hotcompile import ops, quant
from hotcompile.config import HotConfigError
from hotcompile.hla import hla_transform
from hotcompile.memory import saved_tensors

ROWS = [0, 2, 3, 8, 10, 11, 12, 14]


def test_fp8_codes_are_the_rounded_e4m3_values_of_x_over_the_scale():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=g) * torch.logspace(-3, 1, 48)  # wide dynamic range
    codes, scale = quant.quantize(x, 8, False, quant.FP8_E4M3)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (1,)
    assert scale.item() == pytest.approx(x.abs().max().item() / 448.0, rel=1e-6)
    # exactly torch's round-to-nearest-even cast of x / s; the largest magnitude lands on 448
    assert torch.equal(codes.float(), (x / scale).to(torch.float8_e4m3fn).float())
    assert codes.float().abs().max().item() == 448.0
    # e4m3 keeps 3 mantissa bits: relative error at most 2^-4 for normal values
    deq = quant.dequantize(codes, scale)
    normal = (x / scale).abs() >= 2.0**-6
    assert ((deq - x).abs()[normal] <= x.abs()[normal] * 2.0**-4 * 1.0001).all()


def test_fp8_keeps_small_values_int8_flushes():
    """Why one would pick FP8: entries 1000x below the max-abs survive with ~6% error, where
    INT8's uniform grid rounds them to zero."""
    x = torch.tensor([[100.0, 0.1, -0.07, 0.05]])
    fp8 = quant.dequantize(*quant.quantize(x, 8, False, quant.FP8_E4M3))
    int8 = quant.dequantize(*quant.quantize(x, 8, False, "nearest"))
    assert torch.allclose(fp8[0, 1:], x[0, 1:], rtol=2.0**-4)
    assert torch.equal(int8[0, 1:], torch.zeros(3))


def test_fp8_nonfinite_and_bad_arguments():
    x = torch.ones(4, 4)
    x[1, 2] = float("nan")
    _, s = quant.quantize(x, 8, False, quant.FP8_E4M3)
    assert not torch.isfinite(s).all()  # the NaN is not quantized away
    with pytest.raises(ValueError, match="8 bits"):
        quant.quantize(torch.ones(2, 2), 4, False, quant.FP8_E4M3)
    with pytest.raises(HotConfigError, match="gw_bits=8"):
        hotcompile.config.HotConfig(gw_format="fp8", gw_bits=4)
    with pytest.raises(HotConfigError, match="gw_format"):
        hotcompile.config.HotConfig(gw_format="fp16")


@pytest.mark.parametrize("rows", [ROWS, []])
def test_fp8_weight_gradient_equals_its_dequantized_product(rows):
    """``abc_compress`` + ``hla_grad_weight`` with FP8 codes = s_g·s_x·(Ĝᵀ·X̂)/block from the
    dequantized operands, and the codes keep their dtype through the saved buffer."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, 24, generator=g)
    gy = torch.randn(2, 32, 40, generator=g) * 1e-3
    xq, sx = ops.abc_compress(x, 0, rows, 16, 8, quant.FP8_E4M3)
    assert xq.dtype == torch.float8_e4m3fn and xq.stride() == (1, xq.shape[0])
    gw = ops.hla_grad_weight(gy, xq, sx, 0, rows, 16, 8, quant.FP8_E4M3, "t", False)
    tg = hla_transform(gy, 0, tuple(rows), 16) if rows else gy.reshape(-1, 40)
    gq, sg = quant.quantize(tg, 8, False, quant.FP8_E4M3)
    want = (gq.double().t() @ xq.double()) * (sg * sx).double() / (16 if rows else 1)
    torch.testing.assert_close(gw.double(), want, rtol=1e-5, atol=0)
    exact = gy.reshape(-1, 40).t() @ x.reshape(-1, 24)
    if not rows:  # no projection: only FP8 rounding separates it from the exact g_w
        assert ((gw - exact).norm() / exact.norm()).item() < 0.05
    with pytest.raises(TypeError, match="codes"):  # INT8 x codes with FP8 g_y codes
        xi, si = ops.abc_compress(x, 0, rows, 16, 8, "nearest")
        ops.hla_grad_weight(gy, xi, si, 0, rows, 16, 8, quant.FP8_E4M3, "t", False)


def test_backend_saves_fp8_codes_and_trains():
    """``options={"gw_format": "fp8"}``: the forward saves e4m3 codes (as many bytes as INT8),
    and without HLA the weight gradients stay within FP8's error of the exact ones."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16))
    x = torch.randn(8, 16, 32)

    def run(options):
        torch._dynamo.reset()
        model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16))
        model.load_state_dict(base.state_dict())
        compiled = torch.compile(model, backend="hot", options=options) if options else model
        for _ in range(3):  # past LQS calibration
            model.zero_grad()
            loss = compiled(x).square().mean()
            loss.backward()
        loss = compiled(x).square().mean()
        dtypes = {s.dtype for s in saved_tensors(loss)}
        model.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in model.parameters()], dtypes

    exact, _ = run(None)
    opts = {"compiler": "aot_eager", "hla": False, "gx_bits": None}
    fp8, dtypes = run({**opts, "gw_format": "fp8"})
    int8, dtypes_int8 = run(opts)
    assert torch.float8_e4m3fn in dtypes and torch.float8_e4m3fn not in dtypes_int8
    for w in (0, 2):  # the two weight gradients
        err = ((fp8[w] - exact[w]).norm() / exact[w].norm()).item()
        assert err < 0.05, (w, err)
        assert not torch.equal(fp8[w], int8[w])


def test_cost_report_names_the_fp8_g_w_path():
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16))
    x = torch.randn(8, 16, 32)
    fp8 = hotcompile.report(model, x, {"gw_format": "fp8"})
    assert [lay["gw_format"] for lay in fp8.to_json()["layers"]] == ["fp8", "fp8"]
    assert "4/fp8" in fp8.table()
    default = hotcompile.report(model, x)
    assert {lay["gw_format"] for lay in default.to_json()["layers"]} == {"int8"}
    assert "4/fp8" not in default.table() and "4/8" in default.table()


@pytest.mark.parametrize(("rows", "signs"), [(ROWS, False), (ROWS, True), ([], False)])
def test_native_fp8_gemm_takes_the_two_scales_as_they_are(rows, signs):
    """The native g_w GEMM on FP8 codes (``torch._scaled_mm``; torch runs it on the CPU too)
    passes g_y's and x's per-tensor scales to the GEMM as they are (x's over 16 with HLA:
    exact), not their product made by a kernel of its own (a launch a layer on CUDA): the
    same g_w as the float32 product of the codes times both scales, for HLA rows, plain rows
    and hla_signs' n/r."""
    from hotcompile.lowering import hot

    assert quant.has_fp8_gemm(torch.device("cpu"))  # (else this would test the float path)
    g = torch.Generator().manual_seed(2)
    x3 = torch.randn(2, 32, 48, generator=g)
    gy3 = torch.randn(2, 32, 64, generator=g) * 1e-3
    sgn = torch.where(torch.rand(2, 32, 1, generator=g) < 0.5, -1.0, 1.0) if signs else None
    xq, sx = hot.compress(x3, 0, tuple(rows), 8, quant.FP8_E4M3, sgn)
    got = hot.grad_weight(gy3, xq, sx, 0, tuple(rows), 8, quant.FP8_E4M3, sgn)
    gq, sg = hot.hla_codes(gy3, 0, tuple(rows), 8, quant.FP8_E4M3, sgn)
    want = (gq.double() @ xq.double()) * (sg * sx).double() / (16 if rows else 1)
    want = want * (16 / len(rows)) if signs else want
    assert got.dtype == torch.float32 and got.shape == (64, 48)
    # (float32 accumulation against float64: near-zero sums differ in their last bits)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max())

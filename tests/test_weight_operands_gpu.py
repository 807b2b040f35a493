"""``hotcompile.kernels.weight_triton.weight_operands`` on CUDA against the two quantizers it
fuses (the CPU checks it through Triton's interpreter: tests/test_kernels_interpret.py).

Needs CUDA and Triton: ``python -m pytest tests/test_weight_operands_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import skip_module_without_cuda_triton

from hotcompile.quant import FP8_E4M3, quantize

pytestmark = [pytest.mark.gpu]
skip_module_without_cuda_triton()

from hotcompile.kernels.hla_triton import hla_quantize  # noqa: E402
from hotcompile.kernels.weight_triton import weight_operands  # noqa: E402


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.float().nan_to_num(7.0), b.float().nan_to_num(7.0))


@pytest.mark.parametrize(
    ("bits", "rounding", "sawb", "dtype"),
    [(4, "nearest", True, torch.float8_e4m3fn), (8, "nearest", False, torch.int8),
     (8, FP8_E4M3, False, torch.float8_e4m3fn)],
)  # fmt: skip
@pytest.mark.parametrize(("O", "I"), [(40, 24), (2048, 8192), (8192, 2048), (1000, 1040)])
def test_weight_operands_are_hq_and_the_fp8_copy(bits, rounding, sawb, dtype, O, I):
    """HQ's codes and scale as ``hla_quantize`` with every row kept, the rowwise e4m3 copy and
    row scales as ``quantize``, all of autocast's bf16 copy of the fp32 weight (rounded in
    the kernel's registers, ties to even as torch's cast), bit for bit; INT4 SAWB's scale
    comes from atomic float sums (their order), so its scale may differ by an ulp: within
    1e-6 relative, and the codes then may differ in a few places."""
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (
        torch.randn(O, I, device="cuda", generator=g)
        * torch.logspace(-2, 1, O, device="cuda")[:, None]
    )
    w[3] = 0.0
    w[5, 7] = float("nan")
    w[9, :4] = 1 + 2.0**-8  # a bfloat16 tie
    hq, hs, w8, ws = weight_operands(w, bits, rounding, sawb, dtype, True)
    wb = w.to(torch.bfloat16)
    rc, rs = hla_quantize(wb[None], 0, list(range(16)), bits, rounding, sawb=sawb, out_dtype=dtype)
    fc, fs = quantize(wb, 8, True, FP8_E4M3)
    assert _same(w8, fc) and _same(ws, fs)
    if sawb:
        assert torch.allclose(hs, rs, rtol=1e-6, equal_nan=True)
        assert (hq.float() != rc.float()).float().mean() < 1e-3
    else:
        assert _same(hq, rc) and _same(hs, rs)
    # with scale_row (the compiled step's call) the scale comes as s/16 over [1, I], the g_x
    # GEMM's rowwise scale_b, from the same pass; the codes are the same. A finite weight
    # (w's NaN makes every value of the row NaN); SAWB: another launch's atomic sums
    wf = w.clone()
    wf[5, 7] = 0.0
    fq, fs, _, _ = weight_operands(wf, bits, rounding, sawb, dtype, True)
    hq2, row, _, _ = weight_operands(wf, bits, rounding, sawb, dtype, True, scale_row=True)
    assert row.shape == (1, I) and row.is_contiguous() and bool(torch.isfinite(fs).all())
    want = (fs / 16).expand(1, I)
    assert torch.equal(row, want) if not sawb else torch.allclose(row, want, rtol=1e-6)
    if not sawb:
        assert _same(hq2, fq)

"""The FP8 forward GEMM of a HOT layer (``HotConfig.forward="fp8"``).

HOT's paper keeps the forward in full precision; with a bf16 forward the forward's GEMMs are
the largest cost HOT leaves (a Llama-style step cannot pass ~1.16× inductor's even with free
quantizers, ``experiments/results/llama_ceiling.md``). This module runs ``y = x Wᵀ`` on FP8-e4m3
operands instead, as torchao's float8 training does, so that it composes with HOT's backward
and ABC in one layer:

- **rowwise** (default): one scale per token of x and one per output channel of W, each the
  row's max-abs / 448 (e4m3's largest finite value) — the scales sit on the GEMM's M and N
  dims, so ``torch._scaled_mm`` applies them in its epilogue;
- **tensorwise**: one max-abs scale for x and one for W.

No delayed scaling: every scale is the current tensor's max-abs, as HOT's own quantizers
(:func:`hotcompile.quant.quantize` with ``FP8_E4M3`` is the quantizer here too).

:func:`linear_reference` is the specification: codes dequantized and multiplied in float32.
:func:`linear` is what a compiled step runs: the casts as ATen (inductor computes them in the
kernel that produces x — RMSNorm, SwiGLU, a residual add — and the weight's in one pass over
the parameter) and the GEMM as ``torch._scaled_mm``, which inductor lowers itself; where the
device has no FP8 GEMM, the reference. Both are tested against each other
(``tests/test_fp8.py``); HOT's backward does not depend on which forward ran (it reads g_y
and ABC's codes of x, never y).
"""

from __future__ import annotations

import torch

from hotcompile.quant import FP8_E4M3, dequantize, has_fp8_gemm, quantize

#: ``torch._scaled_mm`` needs both dims of the second operand (K and N) to be multiples of 16
ALIGN = 16
SCALINGS = ("rowwise", "tensorwise")


def unsupported(in_features: int, out_features: int) -> str:
    """Why a layer of this shape cannot take the FP8 forward ("" when it can)."""
    bad = [f"{n}={v}" for n, v in (("in", in_features), ("out", out_features)) if v % ALIGN]
    if bad:
        return (
            f"forward: {', '.join(bad)} not a multiple of {ALIGN} (the FP8 GEMM's alignment): "
            "bf16 forward"
        )
    return ""


def out_dtype(x: torch.Tensor) -> torch.dtype:
    """What ``F.linear`` would return: the autocast dtype inside an autocast region, else x's."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def operands(
    x2: torch.Tensor, w: torch.Tensor, scaling: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """e4m3 codes and float32 scales of x ``[M, K]`` and W ``[N, K]``: rowwise ``[M, 1]`` and
    ``[1, N]`` (the shapes ``torch._scaled_mm`` takes), tensorwise 0-dim.

    Each operand is quantized from the dtype the bf16 forward's GEMM would read (autocast's
    copy inside an autocast region), so the FP8 forward's only departure from it is e4m3's
    rounding."""
    return (*_operand(x2, scaling, out_dtype(x2), True), *_operand(w, scaling, out_dtype(x2)))


def _operand(
    t: torch.Tensor, scaling: str, dtype: torch.dtype, left: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 codes of ``t.to(dtype)`` and their scales as ``torch._scaled_mm`` takes them for
    the ``left`` (x: ``[M, 1]``) or right (W: ``[1, N]``) operand, or 0-dim (tensorwise)."""
    if scaling not in SCALINGS:
        raise ValueError(f"FP8 forward scaling is one of {SCALINGS}, got {scaling!r}")
    q, s = quantize(t.to(dtype), 8, scaling == "rowwise", FP8_E4M3)
    if scaling == "tensorwise":
        return q, s.reshape(())
    return q, (s[:, None] if left else s[None, :])


def scaled_gemm(
    xq: torch.Tensor,
    sx: torch.Tensor,
    wq: torch.Tensor,
    sw: torch.Tensor,
    scaling: str,
    dtype: torch.dtype,
    fast_accum: bool = False,
) -> torch.Tensor:
    """``torch._scaled_mm`` of :func:`operands`' codes and scales, ``[M, N]`` in ``dtype``.
    Rowwise scales come out of the GEMM in bf16 only (torch's kernels), then cast.
    ``fast_accum``: Hopper's fast accumulation (``HotConfig.fp8_fast_accum``)."""
    gemm_dtype = torch.bfloat16 if scaling == "rowwise" else dtype
    y = torch._scaled_mm(
        xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=gemm_dtype, use_fast_accum=fast_accum
    )
    return y.to(dtype)


def linear_reference(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, scaling: str = "rowwise"
) -> torch.Tensor:
    """The specification: ``x Wᵀ (+ bias)`` from the dequantized e4m3 codes, in float32, then
    cast to what ``F.linear`` would return."""
    x2 = x.reshape(-1, x.shape[-1])
    xq, sx, wq, sw = operands(x2, w, scaling)
    y = dequantize(xq, sx.reshape(-1)) @ dequantize(wq, sw.reshape(-1)).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype(x)).reshape(*x.shape[:-1], w.shape[0])


def takes_gemm(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether :func:`linear` runs ``torch._scaled_mm`` for these operands (else the
    reference): an FP8 GEMM on the device, an aligned shape, a non-empty input."""
    return not unsupported(x.shape[-1], w.shape[0]) and has_fp8_gemm(x.device) and x.numel() > 0


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    scaling: str = "rowwise",
    w_operand: tuple[torch.Tensor, torch.Tensor] | None = None,
    fast_accum: bool = False,
    x_operand: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``x Wᵀ (+ bias)`` with FP8 operands: ``torch._scaled_mm`` where the device multiplies
    FP8 (Hopper/Ada GPUs, torch's CPU kernel) and the shape is aligned, else the reference.
    The output is bf16 from the GEMM (its accumulation is float32), then the bias is added in
    the output dtype, as ``F.linear`` under autocast does. ``w_operand``: the weight's codes
    and scales as :func:`operands` makes them, made already (rowwise: by the kernel that
    also writes HQ's codes of W, :func:`hotcompile.lowering.hot.weight_operands`); only
    where :func:`takes_gemm`. ``fast_accum``: the GEMM's ``use_fast_accum`` (the reference,
    in float32, has no such mode). ``x_operand``: x's codes ``[M, K]`` and row scales
    ``[M]``, made already as :func:`operands` makes them (rowwise: by the SwiGLU kernel that
    also writes the codes its backward reads,
    :func:`hotcompile.lowering.hot.swiglu_forward`); used where :func:`takes_gemm`, else the
    reference reads x."""
    K, N = x.shape[-1], w.shape[0]
    if not takes_gemm(x, w):
        if w_operand is not None:
            raise ValueError("a weight operand made already needs the FP8 GEMM (takes_gemm)")
        return linear_reference(x, w, bias, scaling)
    x2 = x.reshape(-1, K)
    if x_operand is not None:  # no pass over x here
        if scaling != "rowwise":
            raise ValueError("an x operand made already is rowwise (one scale per token)")
        xq, sx = x_operand[0], x_operand[1].reshape(-1, 1)
    else:
        xq, sx = _operand(x2, scaling, out_dtype(x2), True)
    wq, sw = w_operand if w_operand is not None else _operand(w, scaling, out_dtype(x2))
    dtype = out_dtype(x)
    y = scaled_gemm(xq, sx, wq, sw, scaling, dtype, fast_accum)
    if bias is not None:
        y = y + bias.to(dtype)
    return y.reshape(*x.shape[:-1], N)

"""HOT's fused quantize kernels as ``torch.library.triton_op``: launched by inductor's wrapper.

The kernels are the ones in ``hotcompile.kernels`` (bit-exact with the reference ops, tested
there); what changes is who launches them. Through a ``torch.library.custom_op`` every call
went through Python — the op layer, LQS lookups, the dispatcher, Triton's launcher — about
0.2–0.6 ms per call on the H100 machine's host, more than the kernels themselves
(``experiments/host_overhead.py``). A ``triton_op`` body is traced by inductor: the
allocations become graph buffers and each ``wrap_triton`` launch is emitted into inductor's
generated wrapper, like the kernels inductor writes itself. Nothing here runs Python per call.

Only traceable host code is allowed in the bodies: shapes, no ``.item()``, no RNG seeds drawn on
the host (so no ``"stochastic"`` rounding: the native path takes ``nearest`` and
``pseudo_stochastic``), no scratch pools: the HLA kernel's statistics and the raw max-abs of
HQ's per-token and the SwiGLU backward's kernels go to a slot per program of a ``torch.empty``
buffer; the other quantizers' atomics (HQ per tensor, ``swiglu_abc``, ``weight_operands``)
take a ``torch.zeros`` word, which inductor, after CSE has made every such word one node,
clones for each kernel that writes it (a one-element launch each).

Importing this module needs Triton; ``hotcompile.lowering.available()`` says whether it can.
"""

from typing import Optional

import torch
from torch.library import triton_op, wrap_triton

from hotcompile.hadamard import padded
from hotcompile.kernels import swiglu_triton
from hotcompile.kernels.hla_triton import _hla_quant_kernel, launch_hla_quantize
from hotcompile.kernels.hq_triton import _hq_quant_kernel, launch_hq_quantize, raw_slots
from hotcompile.kernels.swiglu_triton import (
    _swiglu_abc_kernel,
    _swiglu_codes_kernel,
    _swiglu_gw_kernel,
    _swiglu_hq_kernel,
    launch_swiglu_hq,
)
from hotcompile.kernels.weight_triton import _weight_operands_kernel
from hotcompile.kernels.weight_triton import weight_operands as launch_weight_operands
from hotcompile.lowering import ttir_cache
from hotcompile.quant import FP8_E4M3

LIB = "hotcompile_lowering"
# compile time: torch re-generates a launched kernel's TTIR at every trace and lowering of it
ttir_cache.install(
    (
        _hq_quant_kernel, _hla_quant_kernel, _swiglu_hq_kernel, _swiglu_codes_kernel,
        _swiglu_abc_kernel, _swiglu_gw_kernel, _weight_operands_kernel,
    )
)  # fmt: skip


def _code_dtype(fp8: bool) -> torch.dtype:
    return torch.float8_e4m3fn if fp8 else torch.int8


@triton_op(f"{LIB}::hq_quantize", mutates_args=())
def hq_quantize(
    gy: torch.Tensor,
    bits: int,
    per_token: bool,
    rounding: str,
    fp8: bool,
    pad_rows_to: int,
    raw_amax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``quantize(block_hadamard(gy, 1, 16), bits, per_token, rounding)`` of ``gy [L, O]``:
    codes ``[padded(L, pad_rows_to), padded(O, 16)]`` (e4m3 INT-grid values when ``fp8``,
    else int8; padded rows are zero codes with zero scale) and fp32 scales ``[L_out]`` or
    ``[1]``. One launch per token, two per tensor (max-abs by atomics, then the codes).
    Third output: the max-abs bits of g_y itself when ``raw_amax`` (for
    :func:`hla_quantize`'s ``amax``), int32 — per token one slot per program, which that
    kernel reduces; per tensor one word — else an empty tensor (no fill kernel)."""
    if gy.stride(-1) != 1:
        gy = gy.contiguous()
    L, O = gy.shape
    l_out, o_pad = padded(L, pad_rows_to), padded(O, 16)
    codes = torch.empty((l_out, o_pad), dtype=_code_dtype(fp8), device=gy.device)
    scales = torch.empty((l_out if per_token else 1,), dtype=torch.float32, device=gy.device)
    words = None if per_token else torch.zeros((1,), dtype=torch.int32, device=gy.device)
    raw = launch_hq_quantize(
        wrap_triton(_hq_quant_kernel), gy, codes, scales, words, bits, rounding, 0, raw=raw_amax
    )
    if raw is None:
        raw = torch.empty((0,), dtype=torch.int32, device=gy.device)
    return codes, scales, raw


@triton_op(f"{LIB}::hla_quantize", mutates_args=())
def hla_quantize(
    x: torch.Tensor,
    grid_w: int,
    rows: list[int],
    bits: int,
    rounding: str,
    sawb: bool,
    fp8_codes: bool,
    signs: Optional[torch.Tensor] = None,  # noqa: UP045 (schema inference)
    amax: Optional[torch.Tensor] = None,  # noqa: UP045
    round_bf16: bool = False,
    scale_row: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize(hla_transform(signed(x, signs), grid_w, rows), bits, False, rounding)`` for
    ``x [N, S, D]``, per tensor: codes written K-major as ``[D, R]`` (what the weight-gradient
    GEMM and HQ's weight operand want) and the fp32 scale ``[1]``.

    With ``rows = range(16)`` over a weight ``W[None]`` this is HQ's weight quantizer along O
    (``sawb``: the SAWB scale, 4-bit). ``rounding=FP8_E4M3`` gives e4m3 codes with the
    max-abs/448 scale (``gw_format="fp8"``); ``fp8_codes`` stores INT-grid codes as e4m3.
    ``amax`` (no HLA, no signs, token blocks): x's max-abs bits, already taken by another
    kernel (:func:`hq_quantize`'s ``raw_amax`` over the same g_y): one pass, the codes.
    ``round_bf16`` (float32 x): the codes of ``x.to(torch.bfloat16)``, rounded in registers
    (HQ's weight codes from the fp32 parameter, without autocast's copy written and read).
    ``scale_row``: the second output is ``scale/16`` over ``[1, D]`` (HQ's weight scale as
    the g_x GEMM's rowwise ``scale_b``), written by the codes pass: no expand kernel a layer.
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    N, S, D = x.shape
    fp8 = rounding == FP8_E4M3
    flat = signs.reshape(N * S) if signs is not None else None
    return launch_hla_quantize(
        wrap_triton(_hla_quant_kernel), x, grid_w, rows, bits, rounding, True, sawb,
        _code_dtype(fp8 or fp8_codes), flat, amax, 0, round_bf16=round_bf16, scale_row=scale_row,
    )  # fmt: skip


@triton_op(f"{LIB}::swiglu_abc", mutates_args=())
def swiglu_abc(
    ca: torch.Tensor,
    sa: torch.Tensor,
    cb: torch.Tensor,
    sb: torch.Tensor,
    samples: int,
    bits: int,
    rounding: str,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ABC's codes (K-major ``[D, R]``, plain token rows) and scale ``[1]`` of a SwiGLU's
    product ``(silu(ca·sa) · (cb·sb)).to(dtype)`` from its rowwise FP8 codes ``[L, D]`` and
    row scales ``[L]`` (``HotConfig.abc_swiglu``), as :func:`hla_quantize` of the product over
    ``samples`` sequences, without the product ever written
    (``hotcompile.kernels.swiglu_triton.swiglu_abc``: two passes over the codes)."""
    words = torch.zeros((1,), dtype=torch.int32, device=ca.device)
    return swiglu_triton.swiglu_abc(
        ca, sa, cb, sb, samples, bits, rounding, dtype, kernel=wrap_triton(_swiglu_abc_kernel),
        words=words,
    )  # fmt: skip


@triton_op(f"{LIB}::weight_operands", mutates_args=())
def weight_operands(
    w: torch.Tensor, bits: int, rounding: str, sawb: bool, fp8_codes: bool, round_bf16: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A weight ``w [O, I]``'s two per-step operands under ``forward="fp8"`` from one pair of
    passes (:mod:`hotcompile.kernels.weight_triton`): HQ's codes ``[I, padded(O, 16)]`` and
    scale over 16 as a row ``[1, I]`` (as :func:`hla_quantize` with every row kept and
    ``scale_row``; ``rounding`` HQ's weight
    rounding, ``fp8_codes`` INT-grid codes stored as e4m3) and the rowwise e4m3 copy
    ``[O, I]`` with its row scales ``[O]``, each of ``w`` rounded to bf16 with
    ``round_bf16``."""
    fp8 = rounding == FP8_E4M3
    words = torch.zeros((3 + w.shape[0],), dtype=torch.int32, device=w.device)
    return launch_weight_operands(
        w, bits, rounding, sawb, _code_dtype(fp8 or fp8_codes), round_bf16, words,
        kernel=wrap_triton(_weight_operands_kernel), scale_row=True,
    )  # fmt: skip


@triton_op(f"{LIB}::swiglu_backward_hq", mutates_args=())
def swiglu_backward_hq(
    a: torch.Tensor,
    b: torch.Tensor,
    g: torch.Tensor,
    bits: int,
    rounding: str,
    fp8: bool,
    pad_rows_to: int,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    values: bool = True,
) -> tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
    torch.Tensor, torch.Tensor,
]:  # fmt: skip
    """The SwiGLU backward of ``silu(a) * b`` for the product's gradient ``g`` (all ``[L, O]``)
    and HQ's per-token codes of both gradients (``hotcompile.kernels.swiglu_triton``):
    ``g_a, g_b`` (``g``'s dtype), then for each of them what :func:`hq_quantize` returns with
    ``raw_amax`` (codes ``[padded(L, pad_rows_to), O]``, scales, the raw max-abs slots). One
    launch. ``a_scale``/``b_scale``: ``a`` and ``b`` are FP8 codes with these float32 row
    scales (``HotConfig.abc_swiglu``). ``values`` False: ``g_a``, ``g_b`` are not written and
    come back ``[0, O]`` (:func:`swiglu_gw` makes their g_w codes)."""
    a, b, g = (t if t.is_contiguous() else t.contiguous() for t in (a, b, g))
    L, O = a.shape
    l_out = padded(L, pad_rows_to)
    if values:
        ga, gb = torch.empty_like(g), torch.empty_like(g)
    else:
        ga, gb = (g.new_empty((0, O)) for _ in range(2))
    ca = torch.empty((l_out, O), dtype=_code_dtype(fp8), device=a.device)
    cb = torch.empty((l_out, O), dtype=_code_dtype(fp8), device=a.device)
    sa = torch.empty((l_out,), dtype=torch.float32, device=a.device)
    sb = torch.empty((l_out,), dtype=torch.float32, device=a.device)
    slots = raw_slots(l_out)  # the raw max-abs of g_a / g_b: a slot a program
    ra = torch.empty((slots,), dtype=torch.int32, device=a.device)
    rb = torch.empty((slots,), dtype=torch.int32, device=a.device)
    launch_swiglu_hq(
        wrap_triton(_swiglu_hq_kernel), a, b, g, ga, gb, ca, sa, cb, sb, ra, rb, bits, rounding,
        a_scale=a_scale, b_scale=b_scale, values=values,
    )  # fmt: skip
    return ga, gb, ca, sa, ra, cb, sb, rb


@triton_op(f"{LIB}::swiglu_gw", mutates_args=())
def swiglu_gw(
    a: torch.Tensor,
    b: torch.Tensor,
    g: torch.Tensor,
    raw_a: torch.Tensor,
    raw_b: torch.Tensor,
    samples: int,
    bits: int,
    rounding: str,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The g_w operands (codes K-major ``[O, R]``, scale ``[1]``) of a SwiGLU's g_a and g_b
    ``[L, O]``, as :func:`hla_quantize` writes them for the plain rows of ``samples``
    sequences with the raw max-abs slots ``raw_a``/``raw_b`` of :func:`swiglu_backward_hq`,
    recomputed from that op's inputs (``hotcompile.kernels.swiglu_triton.swiglu_gw``)."""
    a, b, g = (t if t.is_contiguous() else t.contiguous() for t in (a, b, g))
    return swiglu_triton.swiglu_gw(
        a, b, g, a_scale, b_scale, raw_a, raw_b, samples, bits, rounding,
        kernel=wrap_triton(_swiglu_gw_kernel),
    )  # fmt: skip


@triton_op(f"{LIB}::swiglu_codes", mutates_args=())
def swiglu_codes(
    a: torch.Tensor, b: torch.Tensor, product: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward of ``silu(a) * b`` under ``abc_swiglu="fp8"``, one launch
    (``hotcompile.kernels.swiglu_triton``): the rowwise e4m3 codes ``[L, O]`` and float32
    scales ``[L]`` of ``a`` and of ``b``, then by ``product``: ``"fp8"``, the product's own
    rowwise codes and scales (the down projection's FP8 forward operand); ``"values"``, the
    product in ``a``'s dtype and an empty scale; ``""``, two empty tensors."""
    kernel = wrap_triton(_swiglu_codes_kernel)
    return swiglu_triton.swiglu_codes(a, b, product or None, kernel=kernel)

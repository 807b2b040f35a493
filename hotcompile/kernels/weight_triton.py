"""Both per-step operands of a HOT layer's weight under ``forward="fp8"``, from one pair of
passes over the weight.

With the FP8 forward a HOT layer makes two operands of its weight ``W [O, I]`` every step:
HQ's ``Q(B_O·W)`` for the g_x GEMM (the 16-point Hadamard along O, one per-tensor scale;
:func:`hotcompile.lowering.hot.quantize_weight`) and the forward's rowwise FP8 copy (e4m3,
one max-abs/448 scale per output channel; :func:`hotcompile.fp8.operands`), each from W as the
forward's GEMM reads it (autocast's bf16 copy of the fp32 parameter). Made apart, the step
writes the bf16 copy, reads it twice for HQ's codes and once more for the FP8 copy: ~16 bytes
a parameter, ~4.6 ms of the 0.67B Llama's step at the H100's measured pass rates, where
torchao's casts move ~11–14 (``tools/results/fp8_forward_h200.md``: the stage that holds the
issue's speed target). Here the fp32 parameter is read twice and nothing else: the first
launch reduces HQ's per-tensor max-abs (and SAWB's sums) and each row's max-abs, the second
writes both sets of codes and the row scales — ~10 bytes a parameter.

Per program: ``BLOCK_B`` blocks of 16 rows of W (the Hadamard's blocks along O) × ``BLOCK_D``
input channels; the butterfly, the kept coefficients' order and the rounding are
:mod:`hotcompile.kernels.hla_triton`'s (``hla_quantize`` with every row kept is HQ's weight
quantizer today), so HQ's codes are the same bits. ``ROUND_BF16``: the values are rounded to
bfloat16 in registers as they are loaded (autocast's copy, ties to even as torch's cast, by
the float's bits), so the fp32 parameter is read without its bf16 copy being written. The
reference is the two quantizers one after the other (``tests/test_kernels_interpret.py``
checks every bit through Triton's interpreter and compiles it for sm_90;
``tests/test_weight_operands_gpu.py`` on CUDA). The compiled step calls it through
:func:`hotcompile.lowering.hot.weight_operands` (a ``triton_op``). Written without a GPU at
hand (session 25); on an H200 (session 26) it beats the passes apart where W's rows are long
(I ≥ 4096: 1.2–1.4×) and loses where they are short, so the step takes it by shape
(:func:`hotcompile.lowering.hot.weight_operands_pay`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotcompile.kernels.hla_triton import (
    _fwht16,
    _kept,
    _load_pos,
    _tensor_codes,
    _tensor_scale,
    _tensor_stats,
    quantizer_constexprs,
)
from hotcompile.kernels.rounding import FP8, ROUNDING_CODES, codes, normal_scale
from hotcompile.quant import FP8_E4M3

#: default program tile: BLOCK_B blocks of 16 rows × BLOCK_D input channels; the fastest of
#: 14 tiles at each of the benchmark Llamas' seven weight shapes on an H200 (session 26,
#: ``experiments/weight_operands.py --sweep``), 3–10% ahead of session 25's first 8 × 64
BLOCK_B = 4
BLOCK_D = 128
#: every coefficient of a block kept, slot k = coefficient k (5 bits each; see ``_pick``)
_ALL = tl.constexpr(sum(k << (5 * k) for k in range(16)))


@triton.jit
def _load_w(w_ptr, g, gmask, d, dmask, I, O, P: tl.constexpr, ROUND_BF16: tl.constexpr):
    """Row ``16·g + P`` of W, ``[BLOCK_B, BLOCK_D]`` float32 (bf16-rounded with ROUND_BF16)."""
    zero = g * 0
    return _load_pos(w_ptr, zero.to(tl.int64), g, gmask, d, dmask, I, O, 0, 0, 1, w_ptr, zero,
                     P, False, False, ROUND_BF16)  # fmt: skip


@triton.jit
def _row_pass(
    y, g, gmask, d, dmask, pid_d, rmax_ptr, fp8_ptr, rscale_ptr, O, I, seed,
    P: tl.constexpr, MODE: tl.constexpr,
):  # fmt: skip
    """Row ``16·g + P``'s share of the rowwise FP8 copy: MODE 1 its max-abs (atomic max on
    the float's bits, NaN propagates), MODE 2 its e4m3 codes and (one program per row) scale."""
    row = g * 16 + P
    ok = gmask & (row < O)
    if MODE == 1:
        bits = tl.max(tl.abs(y).to(tl.int32, bitcast=True), axis=1)
        tl.atomic_max(rmax_ptr + row, bits, mask=ok)
    else:
        amax = tl.load(rmax_ptr + row, mask=ok, other=0).to(tl.float32, bitcast=True)
        scale = normal_scale(amax * (1.0 / 448.0))
        if pid_d == 0:
            tl.store(rscale_ptr + row, scale, mask=ok)
        offs = row[:, None].to(tl.int64) * I + d[None, :]
        c = codes(y, scale[:, None], offs.to(tl.int32), seed, FP8, 448, 8)
        tl.store(fp8_ptr + offs, c.to(fp8_ptr.dtype.element_ty), mask=ok[:, None] & dmask[None, :])


@triton.jit
def _weight_operands_kernel(
    w_ptr, hq_ptr, hq_scale_ptr, amax_ptr, stats_ptr, rmax_ptr, fp8_ptr, rscale_ptr, row_ptr,
    G, O, I, R, seed, numel,
    MODE: tl.constexpr, SAWB: tl.constexpr, ROUND_BF16: tl.constexpr,
    ROUNDING: tl.constexpr, QMAX: tl.constexpr, PM: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, SCALE_ROW: tl.constexpr,
):  # fmt: skip
    """MODE 1: HQ's max-abs (and SAWB's Σt², Σ|t|) into ``amax_ptr``/``stats_ptr``, each row's
    max-abs into ``rmax_ptr``. MODE 2: HQ's codes K-major ``[I, R]`` and scale, the rowwise
    e4m3 copy ``[O, I]`` and its row scales ``[O]``; with SCALE_ROW also HQ's scale/16 over
    ``row_ptr [I]`` (the g_x GEMM's rowwise scale of W)."""
    pid_b = tl.program_id(0)
    pid_d = tl.program_id(1)
    g = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    gmask = g < G
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < I
    a = (w_ptr, g, gmask, d, dmask, I, O)
    y0 = _load_w(*a, 0, ROUND_BF16)
    y1 = _load_w(*a, 1, ROUND_BF16)
    y2 = _load_w(*a, 2, ROUND_BF16)
    y3 = _load_w(*a, 3, ROUND_BF16)
    y4 = _load_w(*a, 4, ROUND_BF16)
    y5 = _load_w(*a, 5, ROUND_BF16)
    y6 = _load_w(*a, 6, ROUND_BF16)
    y7 = _load_w(*a, 7, ROUND_BF16)
    y8 = _load_w(*a, 8, ROUND_BF16)
    y9 = _load_w(*a, 9, ROUND_BF16)
    y10 = _load_w(*a, 10, ROUND_BF16)
    y11 = _load_w(*a, 11, ROUND_BF16)
    y12 = _load_w(*a, 12, ROUND_BF16)
    y13 = _load_w(*a, 13, ROUND_BF16)
    y14 = _load_w(*a, 14, ROUND_BF16)
    y15 = _load_w(*a, 15, ROUND_BF16)
    # the rowwise FP8 copy reads the rows as they are
    r = (g, gmask, d, dmask, pid_d, rmax_ptr, fp8_ptr, rscale_ptr, O, I, seed)
    _row_pass(y0, *r, 0, MODE)
    _row_pass(y1, *r, 1, MODE)
    _row_pass(y2, *r, 2, MODE)
    _row_pass(y3, *r, 3, MODE)
    _row_pass(y4, *r, 4, MODE)
    _row_pass(y5, *r, 5, MODE)
    _row_pass(y6, *r, 6, MODE)
    _row_pass(y7, *r, 7, MODE)
    _row_pass(y8, *r, 8, MODE)
    _row_pass(y9, *r, 9, MODE)
    _row_pass(y10, *r, 10, MODE)
    _row_pass(y11, *r, 11, MODE)
    _row_pass(y12, *r, 12, MODE)
    _row_pass(y13, *r, 13, MODE)
    _row_pass(y14, *r, 14, MODE)
    _row_pass(y15, *r, 15, MODE)
    # HQ's operand: the 16-point butterfly along O, every coefficient kept, as hla_quantize
    y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15 = _fwht16(
        y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15
    )
    t = _kept(y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15, _ALL, 16)
    t = tl.reshape(t, [BLOCK_B, BLOCK_D, 16])
    if MODE == 1:
        _tensor_stats(t, amax_ptr, stats_ptr, SAWB)
    else:  # K-major [I, R], as hla_quantize writes HQ's weight operand
        scale = _tensor_scale(amax_ptr, stats_ptr, numel, SAWB, QMAX)
        _tensor_codes(
            t, g, gmask, d, dmask, pid_b, pid_d, hq_ptr, hq_scale_ptr, scale, row_ptr, I, R,
            seed, True, 16, 16, ROUNDING, QMAX, PM, SCALE_ROW,
        )  # fmt: skip


def weight_operands(
    w: torch.Tensor,
    bits: int,
    rounding: str,
    sawb: bool,
    hq_dtype: torch.dtype,
    round_bf16: bool,
    words: torch.Tensor | None = None,
    block_b: int = BLOCK_B,
    block_d: int = BLOCK_D,
    num_warps: int = 4,
    kernel=None,
    scale_row: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hq_codes [I, O_pad], hq_scale [1], w_fp8 [O, I], w_scale [O])`` of ``w [O, I]``
    (float32 or bfloat16, unit last stride): HQ's operand as ``hla_quantize(w[None], 0,
    range(16), bits, rounding, sawb=sawb, out_dtype=hq_dtype)`` makes it (``rounding``: HQ's
    weight rounding, "nearest" or FP8), and the forward's rowwise e4m3 copy as
    ``quantize(w, 8, True, FP8_E4M3)`` (both of ``w.to(torch.bfloat16)`` with
    ``round_bf16``). ``words``: zeroed int32 scratch of ``3 + O`` words (HQ's max-abs, SAWB's
    two sums, the rows' max-abs); ``kernel``: the jitted kernel or its ``wrap_triton``.
    ``scale_row``: ``hq_scale/16`` over ``[1, I]`` in place of ``hq_scale`` (as
    :func:`hotcompile.kernels.hla_triton.launch_hla_quantize`)."""
    if w.dim() != 2 or w.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"weight_operands takes a 2-D float32/bfloat16 weight, got {w.shape} "
                         f"{w.dtype}")  # fmt: skip
    if rounding not in ROUNDING_CODES or (rounding == FP8_E4M3 and bits != 8):
        raise ValueError(f"HQ's weight rounding {rounding!r} with {bits} bits is not supported")
    if w.stride(-1) != 1:
        w = w.contiguous()
    O, I = w.shape
    G = triton.cdiv(O, 16)
    R = G * 16
    if words is None:
        words = torch.zeros((3 + O,), dtype=torch.int32, device=w.device)
    hq = torch.empty((I, R), dtype=hq_dtype, device=w.device)
    hq_scale = torch.empty((1,), dtype=torch.float32, device=w.device)
    w8 = torch.empty((O, I), dtype=torch.float8_e4m3fn, device=w.device)
    w_scale = torch.empty((O,), dtype=torch.float32, device=w.device)
    row = torch.empty((1, I), dtype=torch.float32, device=w.device) if scale_row else hq_scale
    block_d = min(block_d, triton.next_power_of_2(I))
    grid = (triton.cdiv(G, block_b), triton.cdiv(I, block_d))
    args = (
        w, hq, hq_scale, words[:1], words[1:3].view(torch.float32), words[3:], w8, w_scale, row,
        G, O, I, R, 0, float(R * I),
    )  # fmt: skip
    common = dict(
        SCALE_ROW=scale_row,
        ROUND_BF16=round_bf16 and w.dtype != torch.bfloat16,
        **quantizer_constexprs(bits, rounding, sawb, block_b, block_d, num_warps),
    )
    kernel = kernel or _weight_operands_kernel
    kernel[grid](*args, MODE=1, **common)
    kernel[grid](*args, MODE=2, **common)
    return hq, row, w8, w_scale

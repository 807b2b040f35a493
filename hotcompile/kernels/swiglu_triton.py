"""The SwiGLU backward with HQ's codes of both its gradients, in one pass (Triton).

A gated MLP (``down(silu(gate(x)) * up(x))``: Llama, Mistral, Qwen) makes the g_y of gate and
up in one elementwise kernel, the SwiGLU backward, and HQ then reads each g_y again for its
per-token codes. HQ's scale is per token — the max over one whole transformed row — so a kernel
that holds whole rows can write the codes where g_y is made: ``_swiglu_hq_kernel`` reads
gate's output ``a``, up's ``b`` and the product's gradient ``g`` once, writes
``g_a = g·b·silu'(a)`` and ``g_b = g·silu(a)`` in ``a``'s dtype, and HQ's codes, scales and raw
max-abs word of each, as ``hq_triton._hq_quant_kernel`` writes them
(``hotcompile.lowering.hot.quantize_gy`` of the kernel's own g_a / g_b, bit for bit). The
gate and up layers' g_w codes (per tensor: they wait for the whole g_y's max-abs) are made by
a second kernel from the same inputs and those max-abs words (:func:`swiglu_gw`, since
session 35), so the step stores neither g_a nor g_b (``VALUES=False``).

Measured on the H100 (``experiments/swiglu_hq.py`` → ``experiments/results/swiglu_hq_h100.md``,
the Llama's 8192 × 8192): 301.7 µs against 371.4 for inductor's SwiGLU backward then HQ twice;
floor 268.4. One row per program, held in registers: widths that are powers of two up to
``hq_triton.ONE_WALK``; other widths keep the two steps (:func:`supported`).

The forward has a kernel of its own under ``HotConfig.abc_swiglu="fp8"`` (the lean plan:
the forward saves ``a`` and ``b`` as rowwise FP8 codes, and the down projection's ABC codes
are re-derived from them in the backward). Written as ATen, inductor made the codes of
``a``, of ``b`` and, with ``forward="fp8"``, down's FP8 operand of ``silu(a)·b`` in one
kernel with three looped row reductions: 385 µs a layer on an H200 where the bytes are worth
~170 (``tools/results/fp8_forward_h200_s28.md``). ``_swiglu_codes_kernel`` holds each row in
registers, reads ``a`` and ``b`` once and writes the three sets of codes
(:func:`supported_codes`: any width up to ``MAX_CODES_ROW``): 175 µs against inductor's 369 at
the Llama's 8192 × 8192, 383 against 758 at the 8B widths (H200,
``experiments/results/swiglu_codes_h200.md``). Its ``"values"`` product (the bf16 product with
the codes, what ``prefer="memory"`` with the bf16 forward needs) measured 163 µs against
inductor's 233 there; the step does not use it yet.

The lean backward re-derives the down projection's ABC codes (per tensor, K-major) from the
forward's codes of ``a`` and ``b``: ``_swiglu_abc_kernel`` (:func:`swiglu_abc`) makes the
product from the codes in registers in both of its passes (max-abs, codes), never writing it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotcompile.hadamard import padded
from hotcompile.kernels import scratch
from hotcompile.kernels.hla_triton import _partials_scale, _tensor_scale, reduce_chunk
from hotcompile.kernels.hq_triton import ONE_WALK, _amax_bits, _ht16, _quant_store
from hotcompile.kernels.rounding import (
    FP8,
    ROUNDING_CODES,
    _round_bf16,
    code_constexprs,
    codes,
    normal_scale,
)
from hotcompile.quant import FP8_E4M3

#: warps per program (one 8192-wide row): 16 took 301.7 µs, 8 303.8, 4 359.0; two rows per
#: program spill (368-1241 µs) (H100, ``experiments/results/swiglu_hq_h100.json``)
WARPS = 16


@triton.jit
def _hq_rows(
    x, codes_ptr, scale_ptr, rows, rows64, cols, L_OUT, O_PAD, stride_c,
    ROUNDING: tl.constexpr, QMAX: tl.constexpr, PM: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_O: tl.constexpr,
):  # fmt: skip
    """HQ of a whole-row tile ``x`` (float32 of the stored g_y): the 16-block butterfly, the
    per-row scale and the codes, as ``_hq_quant_kernel`` MODE 0; returns the tile's raw
    max-abs bits (g_y's own, for the plain g_w codes)."""
    INV_Q: tl.constexpr = 1.0 / QMAX
    raw = tl.max(_amax_bits(x), axis=0)
    y = _ht16(x, BLOCK_L, BLOCK_O)
    scale = normal_scale(_amax_bits(y).to(tl.float32, bitcast=True) * INV_Q)
    tl.store(scale_ptr + rows, scale, mask=rows < L_OUT)
    _quant_store(y, scale[:, None], codes_ptr, stride_c, rows, rows64, cols, L_OUT, O_PAD, 0,
                 ROUNDING, QMAX, PM)  # fmt: skip
    return raw


@triton.jit
def _swiglu_hq_kernel(
    a_ptr, b_ptr, g_ptr, ga_ptr, gb_ptr, ca_ptr, cb_ptr, sa_ptr, sb_ptr, ra_ptr, rb_ptr,
    xa_ptr, xb_ptr, L, O, L_OUT, O_PAD, stride, stride_c, NRB,
    ROUNDING: tl.constexpr, QMAX: tl.constexpr, PM: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_O: tl.constexpr, SCALED: tl.constexpr,
    VALUES: tl.constexpr = True,
):  # fmt: skip
    """SwiGLU backward (``a``: gate's output, ``b``: up's, ``g``: the product's gradient) and
    HQ's codes of both gradients, ``BLOCK_L`` whole rows at a time: program ``p`` takes the
    row blocks ``p, p + grid, …`` of ``NRB`` and leaves the raw max-abs bits of the g_a and
    g_b it made in slot ``p`` of ``ra_ptr``/``rb_ptr`` (nothing to zero first; the g_w codes'
    kernels reduce the slots). ``SCALED``: ``a`` and
    ``b`` are FP8 codes saved by the forward (``HotConfig.abc_swiglu``), their values
    ``code · scale`` with one float32 scale per row (``xa_ptr``, ``xb_ptr``). ``VALUES``
    False: g_a and g_b are not stored (:func:`swiglu_gw` makes their g_w codes instead);
    ``ga_ptr``/``gb_ptr`` then only give their dtype."""
    pid = tl.program_id(0)
    ta = tl.zeros([], dtype=tl.int32)
    tb = tl.zeros([], dtype=tl.int32)
    cols = tl.arange(0, BLOCK_O)
    for blk in range(pid, NRB, tl.num_programs(0)):
        rows = blk * BLOCK_L + tl.arange(0, BLOCK_L)
        rows64 = rows.to(tl.int64)
        mask = (rows < L)[:, None] & (cols < O)[None, :]
        off = rows64[:, None] * stride + cols[None, :]
        a = tl.load(a_ptr + off, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + off, mask=mask, other=0.0).to(tl.float32)
        if SCALED:
            a = a * tl.load(xa_ptr + rows, mask=rows < L, other=0.0)[:, None]
            b = b * tl.load(xb_ptr + rows, mask=rows < L, other=0.0)[:, None]
        g = tl.load(g_ptr + off, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(a)
        ga = (g * b * (sig * (1.0 + a * (1.0 - sig)))).to(ga_ptr.dtype.element_ty)
        gb = (g * (a * sig)).to(gb_ptr.dtype.element_ty)
        if VALUES:
            tl.store(ga_ptr + off, ga, mask=mask)
            tl.store(gb_ptr + off, gb, mask=mask)
        ra = _hq_rows(ga.to(tl.float32), ca_ptr, sa_ptr, rows, rows64, cols, L_OUT, O_PAD,
                      stride_c, ROUNDING, QMAX, PM, BLOCK_L, BLOCK_O)  # fmt: skip
        rb = _hq_rows(gb.to(tl.float32), cb_ptr, sb_ptr, rows, rows64, cols, L_OUT, O_PAD,
                      stride_c, ROUNDING, QMAX, PM, BLOCK_L, BLOCK_O)  # fmt: skip
        ta = tl.maximum(ta, ra)
        tb = tl.maximum(tb, rb)
    tl.store(ra_ptr + pid, ta)
    tl.store(rb_ptr + pid, tb)


#: widest row of FP8 codes (``abc_swiglu``) the backward kernel takes, in a masked
#: power-of-two tile at :func:`hq_warps` warps (sm_90: 64 registers a thread, no spills)
MAX_CODES_BACKWARD_ROW = 16384


def supported(a: torch.Tensor, rounding: str) -> bool:
    """Shapes and settings the kernel takes: rows of a power-of-two width up to ONE_WALK (a
    multiple of 16), unit column stride, 16-bit floats (or FP8 codes with row scales), the
    roundings HQ's kernel has. FP8 codes (``abc_swiglu``) also take any multiple of 16 up
    to :data:`MAX_CODES_BACKWARD_ROW` (the 8B MLP's 14336): there the other way is an opaque
    dequantization to float32 tensors (H200 session 29, 8B widths: the lean step 4 ms slower
    than hot_fp8's and its peak 0.7 GiB higher), where for 16-bit inputs it is inductor's
    own fused kernel."""
    O = a.shape[-1]
    if a.dim() != 2 or rounding not in ROUNDING_CODES or rounding == "stochastic" or O < 16:
        return False
    if a.dtype == torch.float8_e4m3fn:
        return O % 16 == 0 and O <= MAX_CODES_BACKWARD_ROW
    return a.dtype in (torch.bfloat16, torch.float16) and O <= ONE_WALK and O & (O - 1) == 0


def hq_warps(O: int) -> int:
    """Warps per program of the backward kernel for rows ``O`` wide: ``WARPS``, and 32 past
    one walk (16 spill there on sm_90)."""
    return WARPS if triton.next_power_of_2(O) <= ONE_WALK else 32


def launch_swiglu_hq(
    kernel, a, b, g, ga, gb, ca, sa, cb, sb, raw_a, raw_b, bits: int, rounding: str,
    block_l: int = 1, warps: int | None = None, a_scale=None, b_scale=None, values: bool = True,
) -> None:  # fmt: skip
    """Launch ``_swiglu_hq_kernel`` (or its ``wrap_triton``) over ``[L, O]`` rows into the
    given outputs: ``ga``/``gb`` like ``g``; codes ``[L_out, O]`` and scales ``[L_out]``
    (``L_out >= L``: padded rows get zero codes and scales); ``raw_a``/``raw_b`` int32 slots
    for the gradients' raw max-abs bits, one per program: their length is the number of
    programs (``hq_triton.raw_slots``, each looping over row blocks). All row-major with a unit
    column stride, ``a``/``b``/``g`` with one row stride.
    ``a_scale``/``b_scale`` (both or neither): float32 ``[L]``, ``a``/``b`` then FP8 codes.
    A row is one tile, masked to the next power of two; ``warps``: :func:`hq_warps`.
    ``values`` False: ``ga``/``gb`` are not written (any tensors of their dtype)."""
    L, O = a.shape
    l_out = ca.shape[0]
    nrb = triton.cdiv(l_out, block_l)
    if raw_a.numel() != raw_b.numel() or not 0 < raw_a.numel() <= nrb:
        raise ValueError(f"{raw_a.numel()}/{raw_b.numel()} raw slots for {nrb} row blocks")
    grid = (raw_a.numel(),)
    scaled = a_scale is not None
    kernel[grid](
        a, b, g, ga, gb, ca, cb, sa, sb, raw_a, raw_b,
        a_scale if scaled else sa, b_scale if scaled else sb,
        L, O, l_out, O, a.stride(0), ca.stride(0), nrb,
        **code_constexprs(bits, rounding),
        BLOCK_L=block_l, BLOCK_O=triton.next_power_of_2(O), SCALED=scaled, VALUES=values,
        num_warps=warps or hq_warps(O),
    )  # fmt: skip


# ----------------------------------------------------------------------------- the forward

#: widest row :func:`_swiglu_codes_kernel` holds in registers (a Llama-3-8B MLP is 14336 wide)
MAX_CODES_ROW = 16384
#: what the kernel makes of the product ``silu(a)·b`` besides the codes of ``a`` and ``b``
PRODUCTS = {None: 0, "fp8": 1, "values": 2}


@triton.jit
def _fp8_rows(x, codes_ptr, scale_ptr, rows, rows64, cols, L, O):
    """Rowwise e4m3 codes ``[L, O]`` of a whole-row tile ``x`` (float32) and the max-abs/448
    scale of each row: ``hotcompile.quant.quantize(x, 8, True, FP8_E4M3)``, bit for bit."""
    scale = normal_scale(_amax_bits(x).to(tl.float32, bitcast=True) * (1.0 / 448.0))
    tl.store(scale_ptr + rows, scale, mask=rows < L)
    c = codes(x, scale[:, None], cols[None, :], 0, FP8, 448, 8)  # (offs, seed: unused)
    mask = (rows < L)[:, None] & (cols < O)[None, :]
    tl.store(codes_ptr + rows64[:, None] * O + cols[None, :], c.to(codes_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


@triton.jit
def _swiglu_codes_kernel(
    a_ptr, b_ptr, ca_ptr, cb_ptr, sa_ptr, sb_ptr, y_ptr, sy_ptr, L, O, stride_a, stride_b,
    PRODUCT: tl.constexpr, ROUND_BF16: tl.constexpr, BLOCK_L: tl.constexpr,
    BLOCK_O: tl.constexpr,
):  # fmt: skip
    """The forward of ``silu(a) * b`` under ``abc_swiglu="fp8"``: rowwise FP8 codes of ``a``
    and ``b`` (what the backward reads), and by ``PRODUCT`` (:data:`PRODUCTS`): 1, the
    product's rowwise FP8 codes (the down projection's FP8 forward operand) of the product
    as ``F.linear`` reads it; 2, the product itself; 0, nothing. The product is float32
    arithmetic rounded once to ``a``'s dtype (``ROUND_BF16``: bfloat16, by the float's bits,
    so that Triton's interpreter, which truncates, agrees). ``BLOCK_L`` rows per program."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_L + tl.arange(0, BLOCK_L)
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_O)
    mask = (rows < L)[:, None] & (cols < O)[None, :]
    a = tl.load(a_ptr + rows64[:, None] * stride_a + cols[None, :], mask=mask, other=0.0)
    b = tl.load(b_ptr + rows64[:, None] * stride_b + cols[None, :], mask=mask, other=0.0)
    a = a.to(tl.float32)
    b = b.to(tl.float32)
    _fp8_rows(a, ca_ptr, sa_ptr, rows, rows64, cols, L, O)
    _fp8_rows(b, cb_ptr, sb_ptr, rows, rows64, cols, L, O)
    if PRODUCT != 0:
        y = a * tl.sigmoid(a) * b
        if ROUND_BF16:
            y = _round_bf16(y)  # (then the store's cast to bfloat16 is exact)
        else:
            y = y.to(a_ptr.dtype.element_ty).to(tl.float32)
        if PRODUCT == 1:
            _fp8_rows(y, y_ptr, sy_ptr, rows, rows64, cols, L, O)
        else:
            tl.store(y_ptr + rows64[:, None] * O + cols[None, :],
                     y.to(y_ptr.dtype.element_ty), mask=mask)  # fmt: skip


def supported_codes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Operands :func:`_swiglu_codes_kernel` takes: 2-D, one shape and 16-bit float dtype,
    unit column strides, rows of at most :data:`MAX_CODES_ROW` (a whole row in registers)."""
    return (
        a.dim() == 2
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.dtype in (torch.bfloat16, torch.float16)
        and 0 < a.shape[-1] <= MAX_CODES_ROW
        and a.stride(-1) == 1
        and b.stride(-1) == 1
    )


def codes_warps(O: int) -> int:
    """Warps per program for rows ``O`` wide: ~16 float32 values a thread per operand."""
    return max(4, min(32, triton.next_power_of_2(O) // 512))


def launch_swiglu_codes(
    kernel, a, b, ca, sa, cb, sb, y, sy, product: str | None, warps: int | None = None,
    block_l: int = 1,
) -> None:  # fmt: skip
    """Launch ``_swiglu_codes_kernel`` (or its ``wrap_triton``) over ``a``, ``b`` ``[L, O]``
    (:func:`supported_codes`) into the given outputs: e4m3 codes ``[L, O]`` and float32
    scales ``[L]`` of each, and by ``product`` (a key of :data:`PRODUCTS`) ``y`` ``[L, O]``
    (e4m3 with ``sy`` ``[L]``, or the product's dtype; unused for ``None``)."""
    L, O = a.shape
    block_o = triton.next_power_of_2(O)
    kernel[(triton.cdiv(L, block_l),)](
        a, b, ca, cb, sa, sb, y, sy, L, O, a.stride(0), b.stride(0),
        PRODUCT=PRODUCTS[product], ROUND_BF16=a.dtype == torch.bfloat16,
        BLOCK_L=block_l, BLOCK_O=block_o, num_warps=warps or codes_warps(O),
    )  # fmt: skip


def swiglu_codes(
    a: torch.Tensor,
    b: torch.Tensor,
    product: str | None = None,
    warps: int | None = None,
    kernel=_swiglu_codes_kernel,
) -> tuple[torch.Tensor, ...]:
    """``(ca, sa, cb, sb, y, sy)`` of :func:`launch_swiglu_codes` in new tensors (``y``:
    ``[0, O]`` and ``sy`` ``[0]`` without a product, ``sy`` ``[0]`` for ``"values"``).
    ``kernel``: ``wrap_triton``'s in the compiled step
    (``hotcompile.lowering.triton_ops.swiglu_codes``), the jitted one in tests and
    benchmarks."""
    if not supported_codes(a, b):
        raise ValueError(f"swiglu_codes takes two 2-D 16-bit float tensors of one shape, rows "
                         f"up to {MAX_CODES_ROW} wide; got {tuple(a.shape)} {a.dtype}, "
                         f"{tuple(b.shape)} {b.dtype}")  # fmt: skip
    L, O = a.shape
    e4m3 = torch.float8_e4m3fn
    ca, cb = (torch.empty((L, O), dtype=e4m3, device=a.device) for _ in range(2))
    sa, sb = (torch.empty((L,), dtype=torch.float32, device=a.device) for _ in range(2))
    y_dtype = {None: e4m3, "fp8": e4m3, "values": a.dtype}[product]
    y = torch.empty((L if product else 0, O), dtype=y_dtype, device=a.device)
    sy = torch.empty((L if product == "fp8" else 0,), dtype=torch.float32, device=a.device)
    launch_swiglu_codes(kernel, a, b, ca, sa, cb, sb, y, sy, product, warps)
    return ca, sa, cb, sb, y, sy


# ----------------------------------------------------------------------------- the backward's
# re-derivation of the down projection's ABC codes from the forward's codes of a and b

#: default tile of :func:`_swiglu_abc_kernel`: padded tokens × channels, warps, and tiles a
#: program walks — the fastest of 12 at both of the benchmark Llamas' widths on an H200
#: (``experiments/results/swiglu_abc_h200.md``: tiles of 16 tokens ran 30–60% slower, their
#: K-major stores 16 bytes long)
ABC_BLOCK_T = 64
ABC_BLOCK_D = 128
ABC_WARPS = 8
ABC_LOOP = 2
#: the dtype the product is rounded to (``_swiglu_abc_kernel``'s PRODUCT_ROUND)
PRODUCT_ROUND = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}


@triton.jit
def _abc_product(ca_ptr, cb_ptr, sa_ptr, sb_ptr, t, d, dm, T_PAD, S, S_PAD, D,
                 PRODUCT_ROUND: tl.constexpr):  # fmt: skip
    """``silu(a')·b'`` over padded rows ``t`` × channels ``d`` (float32; zeros in the padding
    rows and masked channels), rounded once to the GEMM's dtype (``PRODUCT_ROUND``)."""
    s = t % S_PAD
    ok = (t < T_PAD) & (s < S)
    tok = (t // S_PAD) * S + s  # (int32: supported_abc keeps every offset below 2^31)
    m = ok[:, None] & dm[None, :]
    offs = tok[:, None] * D + d[None, :]
    a = tl.load(ca_ptr + offs, mask=m, other=0.0).to(tl.float32)
    a = a * tl.load(sa_ptr + tok, mask=ok, other=0.0)[:, None]
    b = tl.load(cb_ptr + offs, mask=m, other=0.0).to(tl.float32)
    b = b * tl.load(sb_ptr + tok, mask=ok, other=0.0)[:, None]
    y = a * tl.sigmoid(a) * b
    if PRODUCT_ROUND == 1:
        y = _round_bf16(y)
    elif PRODUCT_ROUND == 2:
        y = y.to(tl.float16).to(tl.float32)
    return y


@triton.jit
def _swiglu_abc_kernel(
    ca_ptr, cb_ptr, sa_ptr, sb_ptr, codes_ptr, scale_ptr, amax_ptr, T_PAD, S, S_PAD, D, R,
    numel,
    MODE: tl.constexpr, PRODUCT_ROUND: tl.constexpr, ROUNDING: tl.constexpr,
    QMAX: tl.constexpr, PM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
    LOOP: tl.constexpr,
):  # fmt: skip
    """ABC's codes of a SwiGLU's product ``y = silu(a')·b'`` in the g_w path's plain token
    rows, from the SwiGLU's rowwise FP8 codes (``a' = ca·sa``, ``b' = cb·sb``, ``[N·S, D]``):
    MODE 1, y's max-abs into ``amax_ptr`` (atomic max on the float's bits: NaN propagates);
    MODE 2, the per-tensor codes of y written K-major ``[D, R]``, R = N·S_PAD (each sample
    padded with zero rows to a multiple of 16, as ``hla_triton.hla_quantize`` writes the
    plain rows), and the scale. y is float32 arithmetic rounded once to the GEMM's dtype
    (PRODUCT_ROUND: :data:`PRODUCT_ROUND`, bfloat16 by the float's bits), never stored.
    A program walks ``LOOP`` tiles of ``[BLOCK_T, BLOCK_D]`` padded rows × channels: small
    tiles keep the registers low, and one atomic per program keeps the max-abs word cool."""
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    t0 = tl.program_id(0) * (BLOCK_T * LOOP)
    if MODE == 1:
        top = tl.zeros((), dtype=tl.int32)
        for i in range(LOOP):
            t = t0 + i * BLOCK_T + tl.arange(0, BLOCK_T)
            y = _abc_product(ca_ptr, cb_ptr, sa_ptr, sb_ptr, t, d, dm, T_PAD, S, S_PAD, D,
                             PRODUCT_ROUND)  # fmt: skip
            bits = tl.abs(y).to(tl.int32, bitcast=True)
            top = tl.maximum(top, tl.max(tl.max(bits, axis=1), axis=0))
        tl.atomic_max(amax_ptr, top)
    else:
        scale = _tensor_scale(amax_ptr, scale_ptr, numel, False, QMAX)
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(scale_ptr, scale)
        for i in range(LOOP):
            t = t0 + i * BLOCK_T + tl.arange(0, BLOCK_T)
            y = _abc_product(ca_ptr, cb_ptr, sa_ptr, sb_ptr, t, d, dm, T_PAD, S, S_PAD, D,
                             PRODUCT_ROUND)  # fmt: skip
            out = d[None, :] * R + t[:, None]
            c = codes(y, scale, out, 0, ROUNDING, QMAX, PM)
            mask = (t < T_PAD)[:, None] & dm[None, :]
            tl.store(codes_ptr + out, c.to(codes_ptr.dtype.element_ty), mask=mask)


def supported_abc(
    ca: torch.Tensor, cb: torch.Tensor, samples: int, rows, bits: int, rounding: str,
    dtype: torch.dtype,
) -> bool:  # fmt: skip
    """Whether :func:`swiglu_abc` takes a SwiGLU's codes ``ca``, ``cb`` ``[L, D]`` over
    ``samples`` sequences of ``L / samples`` tokens: contiguous e4m3 codes of one shape whose
    padded codes have fewer than 2^31 elements (the kernel's offsets are int32), the g_w
    path's plain rows (no HLA rows: the text recipe), the per-tensor roundings without
    host seeds, and a product dtype the kernel rounds to."""
    return (
        ca.dim() == 2
        and ca.shape == cb.shape
        and ca.dtype == cb.dtype == torch.float8_e4m3fn
        and ca.is_contiguous()
        and cb.is_contiguous()
        and _plain_codes_fit(ca, samples, rows, bits, rounding)
        and dtype in PRODUCT_ROUND
    )


def _plain_rows(L: int, samples: int) -> tuple[int, int, int]:
    """``(S, S_PAD, R)`` of ``L`` tokens as ``samples`` sequences: tokens a sample, padded to a
    multiple of 16, and the padded rows in all (the g_w path's plain-row layout)."""
    S = L // samples
    s_pad = padded(S, 16)
    return S, s_pad, samples * s_pad


def _plain_codes(D: int, R: int, rounding: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty K-major codes ``[D, R]`` (e4m3 for ``FP8_E4M3``, else int8) and a float32
    scale ``[1]``, as ``hla_triton.hla_quantize`` writes the g_w path's operands."""
    out = torch.float8_e4m3fn if rounding == FP8_E4M3 else torch.int8
    return (torch.empty((D, R), dtype=out, device=device),
            torch.empty((1,), dtype=torch.float32, device=device))  # fmt: skip


def _plain_codes_fit(t: torch.Tensor, samples: int, rows, bits: int, rounding: str) -> bool:
    """``t`` ``[L, D]`` (2-D) as ``samples`` sequences of ``L / samples`` tokens takes the
    per-tensor codes of the g_w path's plain rows, K-major with each sample padded to 16
    rows: fewer than 2^31 padded codes (the kernels' offsets are int32), no HLA rows, a
    per-tensor rounding without host seeds."""
    return (
        0 < t.numel()
        and samples > 0
        and t.shape[0] % samples == 0
        and t.shape[1] * samples * padded(t.shape[0] // samples, 16) < 2**31
        and len(rows) == 0
        and bits in (4, 8)
        and rounding in ROUNDING_CODES
        and rounding != "stochastic"
        and (rounding != FP8_E4M3 or bits == 8)
    )


def swiglu_abc(
    ca: torch.Tensor, sa: torch.Tensor, cb: torch.Tensor, sb: torch.Tensor, samples: int,
    bits: int, rounding: str, dtype: torch.dtype, kernel=_swiglu_abc_kernel,
    words: torch.Tensor | None = None, block_t: int = ABC_BLOCK_T, block_d: int = ABC_BLOCK_D,
    warps: int = ABC_WARPS, loop: int = ABC_LOOP,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """ABC's codes of a SwiGLU's product from the SwiGLU's saved codes
    (:func:`supported_abc`): ``hla_codes`` of ``(silu(a')·b').to(dtype)`` in plain token
    rows, ``a' = ca·sa``, ``b' = cb·sb`` (rowwise e4m3 codes ``[L, D]`` of gate's and up's
    outputs, float32 scales ``[L]``): codes K-major ``[D, R]`` (e4m3 for ``FP8_E4M3``, else
    int8) and the float32 scale ``[1]``, as ``hla_triton.hla_quantize``
    writes them for the product itself. Two launches: max-abs, then the codes.

    Why: the lean plan re-derives down's ABC codes in the backward. Made as ATen, inductor
    writes the bf16 product for the quantizer to read back; here both passes read the 1-byte
    codes and the product lives in registers. H200 (``experiments/results/swiglu_abc_h200.md``):
    336 µs against inductor's 599 at the 8B MLP's 8192 × 14336, but 200 against 165 at
    8192 × 8192 (the product made twice costs more than one written and read back), so the
    step takes it past 8192 wide only (``lowering.hot.SWIGLU_ABC_ATEN_MAX_WIDTH``).
    ``kernel``: ``wrap_triton``'s under a ``triton_op``; ``words``: a zeroed int32 word there
    (else a scratch one)."""
    L, D = ca.shape
    S, s_pad, R = _plain_rows(L, samples)
    c, scale = _plain_codes(D, R, rounding, ca.device)
    words = words if words is not None else scratch.zeroed(ca.device, 1)
    grid = (triton.cdiv(R, block_t * loop), triton.cdiv(D, block_d))
    for mode in (1, 2):
        kernel[grid](
            ca, cb, sa, sb, c, scale, words, R, S, s_pad, D, R, float(R * D),
            MODE=mode, PRODUCT_ROUND=PRODUCT_ROUND[dtype], **code_constexprs(bits, rounding),
            BLOCK_T=block_t, BLOCK_D=block_d, LOOP=loop, num_warps=warps,
        )  # fmt: skip
    return c, scale


# ----------------------------------------------------------------------------- the backward's
# g_w codes of g_a and g_b, made from what the SwiGLU backward reads instead of from g_a / g_b


@triton.jit
def _swiglu_gw_kernel(
    a_ptr, b_ptr, g_ptr, xa_ptr, xb_ptr, ra_ptr, rb_ptr, qa_ptr, qb_ptr, sa_ptr, sb_ptr,
    T_PAD, S, S_PAD, D, R, numel, stride, stride_g, NPART,
    SCALED: tl.constexpr, ROUNDING: tl.constexpr, QMAX: tl.constexpr, PM: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, LOOP: tl.constexpr, RED: tl.constexpr,
):  # fmt: skip
    """The g_w path's per-tensor codes of g_a and g_b, K-major ``[D, R]`` in plain token rows
    (each sample padded with zero rows to ``S_PAD``), with the scales from the ``NPART``
    max-abs slots ``ra_ptr``/``rb_ptr`` that ``_swiglu_hq_kernel`` took of the very same
    values: g_a and g_b are recomputed here from ``a``, ``b`` (values, or ``SCALED`` FP8
    codes with row scales ``xa_ptr``/``xb_ptr``) and ``g`` with that kernel's float32
    formulas and its one rounding to ``g``'s dtype, tiles of ``[BLOCK_T, BLOCK_D]`` as
    ``_swiglu_abc_kernel``."""
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    t0 = tl.program_id(0) * (BLOCK_T * LOOP)
    scale_a = _partials_scale(ra_ptr, sa_ptr, NPART, numel, False, QMAX, RED)
    scale_b = _partials_scale(rb_ptr, sb_ptr, NPART, numel, False, QMAX, RED)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(sa_ptr, scale_a)
        tl.store(sb_ptr, scale_b)
    for i in range(LOOP):
        t = t0 + i * BLOCK_T + tl.arange(0, BLOCK_T)
        s = t % S_PAD
        ok = (t < T_PAD) & (s < S)
        tok = ((t // S_PAD) * S + s).to(tl.int64)
        m = ok[:, None] & dm[None, :]
        a = tl.load(a_ptr + tok[:, None] * stride + d[None, :], mask=m, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + tok[:, None] * stride + d[None, :], mask=m, other=0.0).to(tl.float32)
        if SCALED:
            a = a * tl.load(xa_ptr + tok, mask=ok, other=0.0)[:, None]
            b = b * tl.load(xb_ptr + tok, mask=ok, other=0.0)[:, None]
        g = tl.load(g_ptr + tok[:, None] * stride_g + d[None, :], mask=m, other=0.0)
        dt = g.dtype
        g = g.to(tl.float32)
        sig = tl.sigmoid(a)
        ga = (g * b * (sig * (1.0 + a * (1.0 - sig)))).to(dt).to(tl.float32)
        gb = (g * (a * sig)).to(dt).to(tl.float32)
        out = d[None, :] * R + t[:, None]
        mask = (t < T_PAD)[:, None] & dm[None, :]
        ca = codes(ga, scale_a, out, 0, ROUNDING, QMAX, PM)
        tl.store(qa_ptr + out, ca.to(qa_ptr.dtype.element_ty), mask=mask)
        cb = codes(gb, scale_b, out, 0, ROUNDING, QMAX, PM)
        tl.store(qb_ptr + out, cb.to(qb_ptr.dtype.element_ty), mask=mask)


def supported_gw(
    a: torch.Tensor, g: torch.Tensor, samples: int, rows, bits: int, rounding: str
) -> bool:
    """Whether :func:`swiglu_gw` takes these rows: ``a`` (like ``b``) and ``g`` 2-D ``[L, D]``
    with unit column strides over ``samples`` sequences of ``L / samples`` tokens whose padded
    codes have fewer than 2^31 elements, the g_w path's plain rows, the per-tensor roundings
    without host seeds."""
    return (
        a.dim() == 2
        and g.dim() == 2
        and a.shape == g.shape
        and a.stride(-1) == 1
        and g.stride(-1) == 1
        and _plain_codes_fit(a, samples, rows, bits, rounding)
    )


def swiglu_gw(
    a: torch.Tensor, b: torch.Tensor, g: torch.Tensor, a_scale, b_scale, raw_a: torch.Tensor,
    raw_b: torch.Tensor, samples: int, bits: int, rounding: str, kernel=_swiglu_gw_kernel,
    block_t: int = ABC_BLOCK_T, block_d: int = ABC_BLOCK_D, warps: int = ABC_WARPS,
    loop: int = ABC_LOOP,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The g_w operands of a SwiGLU's two gradients, ``(qa, sa, qb, sb)``: what
    ``hla_triton.hla_quantize`` writes for g_a and for g_b ``[L, D]`` as ``samples``
    sequences in plain rows, given their raw max-abs slots ``raw_a``/``raw_b`` (the
    ``_swiglu_hq_kernel`` outputs): codes K-major ``[D, R]`` (e4m3 for ``FP8_E4M3``, else
    int8) and float32 scales ``[1]``. One launch (:func:`supported_gw`); ``a``, ``b``: values
    like ``g``, or FP8 codes with float32 row scales ``a_scale``/``b_scale``.

    Why: with it the SwiGLU backward never writes g_a and g_b. They were stored (2 × 2 bytes
    an element) only for the gate and up layers' g_w codes to read back, because the
    per-tensor scale waits for the whole tensor's max-abs; here those codes are made from the
    1-byte (lean plan) or 2-byte inputs the backward reads anyway. At the 8B MLP's widths
    the two bf16 gradients were 448 MiB alive at the step's peak
    (``experiments/backward_liveness.py`` on the lean plan's backward)."""
    L, D = a.shape
    S, s_pad, R = _plain_rows(L, samples)
    qa, sa = _plain_codes(D, R, rounding, a.device)
    qb, sb = _plain_codes(D, R, rounding, a.device)
    scaled = a_scale is not None
    grid = (triton.cdiv(R, block_t * loop), triton.cdiv(D, block_d))
    kernel[grid](
        a, b, g, a_scale if scaled else sa, b_scale if scaled else sb, raw_a, raw_b,
        qa, qb, sa, sb, R, S, s_pad, D, R, float(R * D), a.stride(0), g.stride(0),
        raw_a.numel(), SCALED=scaled, **code_constexprs(bits, rounding), BLOCK_T=block_t,
        BLOCK_D=block_d, LOOP=loop, RED=reduce_chunk(raw_a.numel()),
        num_warps=warps,
    )  # fmt: skip
    return qa, sa, qb, sb

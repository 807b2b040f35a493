"""Triton kernels of HQ's g_x path, and its CUDA implementation of ``hq_grad_input``.

``hq_quantize`` reads ``g_y [L, O]`` once from device memory and writes the INT4/INT8-grid codes
of ``Ĝ = g_y·(I ⊗ H16)`` (float8_e4m3fn for ``torch._scaled_mm`` or int8) and their fp32
scales. Per program: a block of rows, the 16-block butterfly in float32 in the order of
``hotcompile.hadamard.fwht_last``, the row max-abs, then the rounding of
``hotcompile.quant.quantize`` (times the scale's reciprocal, NITI rule, round-half-even).
Codes and scales are bit-identical to the CPU reference for ``nearest`` and ``pseudo_stochastic``.

- per-token: one launch. When O (padded to 16, then to a power of two) fits one tile, each
  row block is loaded once and kept in registers; otherwise the row block is walked twice
  (max-abs, then quantize): the second walk re-reads the same few KiB from L2.
- per-tensor: two launches, no host sync: the first reduces max-abs into one int32 word with
  an atomic max on the float's bits (non-negative floats order like their bits, NaN above
  Inf, so NaN propagates), the second quantizes with the global scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotcompile import lqs, numerics
from hotcompile.kernels import dispatch, hq_cuda, scratch
from hotcompile.kernels.hla_triton import hla_quantize as _hla_quantize
from hotcompile.kernels.rounding import code_constexprs, codes, normal_scale, sawb_scale
from hotcompile.quant import FP8_E4M3, has_fp8_gemm, qmax

#: roundings the ops path's ``hq_grad_input_cuda`` runs through this kernel; FP8-e4m3 values
#: (``gx_format="fp8"``, QMAX 448), which the kernel also rounds (``ROUNDING_CODES``), only
#: the native lowering asks of it: the ops path sends them to the reference
ROUNDINGS = ("nearest", "pseudo_stochastic", "stochastic")
#: tile size (elements) of one program; rows per program = TILE // BLOCK_O
TILE = 4096
#: widest row one walk keeps in registers (one row per program past TILE). H100, FP8 values
#: over a [8192, 8192] g_y: one walk 82 µs, two walks of 2048-wide chunks 103 µs
#: (experiments/results/plain_gw_h100.md)
ONE_WALK = 8192
#: widest O chunk of the two-walk path
CHUNK_O = 2048
#: the per-token launch with g_y's raw max-abs: at most this many programs (one slot each,
#: which the g_w codes pass reduces: 4 KiB a program), each looping over row blocks
MAX_RAW_SLOTS = 1024
#: HQ's Hadamard keeps every coefficient of a 16-block
ALL_ROWS = tuple(range(16))


# ----------------------------------------------------------------------------- device code


@triton.jit
def _bfly(y, R: tl.constexpr, H: tl.constexpr):
    """One butterfly stage on ``[R, 16]``: pairs (j, j+H) of each 2H-run -> (a+b, a-b)."""
    z = tl.reshape(y, [R, 8 // H, 2, H])
    z = tl.permute(z, [0, 1, 3, 2])
    a, b = tl.split(z)
    z = tl.join(a + b, a - b)
    z = tl.permute(z, [0, 1, 3, 2])
    return tl.reshape(z, [R, 16])


@triton.jit
def _ht16(x, BLOCK_L: tl.constexpr, BLOCK_O: tl.constexpr):
    """``x·(I ⊗ H16)`` of a float32 tile ``[BLOCK_L, BLOCK_O]``: the 16-block butterfly in the
    order of ``hotcompile.hadamard.fwht_last`` (shared with kernels that make g_y themselves,
    ``experiments/swiglu_hq.py``)."""
    R: tl.constexpr = BLOCK_L * BLOCK_O // 16
    y = tl.reshape(x, [R, 16])
    y = _bfly(y, R, 1)
    y = _bfly(y, R, 2)
    y = _bfly(y, R, 4)
    y = _bfly(y, R, 8)
    return tl.reshape(y, [BLOCK_L, BLOCK_O])


@triton.jit
def _load_ht(
    gy_ptr, stride_g, rows64, rmask, cols, O, BLOCK_L: tl.constexpr, BLOCK_O: tl.constexpr
):
    """The transformed tile ``[BLOCK_L, BLOCK_O]`` of g_y at columns ``cols``. The caller
    computes ``cols``: a store address derived from a value this function returns would make
    ``torch.library.triton_op``'s mutation analysis (which walks back from each store through
    the call's arguments) count ``gy_ptr`` as written, and inductor would clone g_y.
    Also returns the tile's max-abs of g_y itself (int32 bits; dropped where unused)."""
    mask = rmask[:, None] & (cols < O)[None, :]
    x = tl.load(gy_ptr + rows64[:, None] * stride_g + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    raw = tl.max(tl.max(tl.abs(x).to(tl.int32, bitcast=True), axis=1), axis=0)
    return _ht16(x, BLOCK_L, BLOCK_O), raw


@triton.jit
def _amax_bits(x):
    """Row max-abs as int32 bits (NaN-propagating: abs clears the sign, NaN bits > Inf bits)."""
    return tl.max(tl.abs(x).to(tl.int32, bitcast=True), axis=1)


@triton.jit
def _quant_store(
    x, s, codes_ptr, stride_c, rows, rows64, cols, L_OUT, O_PAD, seed,
    ROUNDING: tl.constexpr, QMAX: tl.constexpr, PM: tl.constexpr,
):  # fmt: skip
    offs = rows[:, None] * O_PAD + cols[None, :]
    code = codes(x, s, offs, seed, ROUNDING, QMAX, PM)
    mask = (rows < L_OUT)[:, None] & (cols < O_PAD)[None, :]
    ptrs = codes_ptr + rows64[:, None] * stride_c + cols[None, :]
    tl.store(ptrs, code.to(codes_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _hq_quant_kernel(
    gy_ptr, codes_ptr, scale_ptr, amax_ptr, stats_ptr, raw_ptr, L, O, L_OUT, O_PAD, stride_g,
    stride_c, seed, numel, NRB,
    MODE: tl.constexpr, ROUNDING: tl.constexpr, QMAX: tl.constexpr, PM: tl.constexpr,
    NCHUNK: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_O: tl.constexpr, SAWB: tl.constexpr,
    RAW: tl.constexpr,
):  # fmt: skip
    """MODE 0: per-token, all in one launch. MODE 1: per-tensor max-abs (atomic, int bits);
    with SAWB also Σx² and Σ|x| (atomic fp32 adds). MODE 2: per-tensor quantize with the
    max-abs (or SAWB scale) of MODE 1. Program ``p`` takes the row blocks ``p, p + grid, …``
    of ``NRB``. RAW (modes 0, 1): also the max-abs of g_y itself, untransformed — the
    per-tensor scale of the g_w path's plain FP8 codes of the same g_y (text recipe), so that
    kernel need not read g_y a second time for it — in MODE 0 one slot per program of
    ``raw_ptr`` (the launcher caps the grid so the slots stay few; nothing to zero first, so
    inductor clones no zeroed word for it), in MODE 1 an atomic max into the word
    ``raw_ptr``."""
    INV_Q: tl.constexpr = 1.0 / QMAX
    pid = tl.program_id(0)
    raw_top = tl.zeros([], dtype=tl.int32)
    for rb in range(pid, NRB, tl.num_programs(0)):
        rows = rb * BLOCK_L + tl.arange(0, BLOCK_L)
        rmask = rows < L
        rows64 = rows.to(tl.int64)
        if MODE != 2:
            ssq = tl.zeros([BLOCK_L], dtype=tl.float32)
            sab = tl.zeros([BLOCK_L], dtype=tl.float32)
            if NCHUNK == 1:
                cols = tl.arange(0, BLOCK_O)
                x, raw = _load_ht(gy_ptr, stride_g, rows64, rmask, cols, O, BLOCK_L, BLOCK_O)
                bits = _amax_bits(x)
                raw_top = tl.maximum(raw_top, raw)
                if SAWB:
                    ssq = tl.sum(x * x, axis=1)
                    sab = tl.sum(tl.abs(x), axis=1)
            else:
                bits = tl.zeros([BLOCK_L], dtype=tl.int32)
                for c in range(NCHUNK):
                    cc = c * BLOCK_O + tl.arange(0, BLOCK_O)
                    xc, raw = _load_ht(gy_ptr, stride_g, rows64, rmask, cc, O, BLOCK_L, BLOCK_O)
                    bits = tl.maximum(bits, _amax_bits(xc))
                    raw_top = tl.maximum(raw_top, raw)
                    if SAWB:
                        ssq += tl.sum(xc * xc, axis=1)
                        sab += tl.sum(tl.abs(xc), axis=1)
            if MODE == 1:
                tl.atomic_max(amax_ptr, tl.max(bits, axis=0))
                if SAWB:
                    tl.atomic_add(stats_ptr, tl.sum(ssq, axis=0))
                    tl.atomic_add(stats_ptr + 1, tl.sum(sab, axis=0))
            else:
                scale = normal_scale(bits.to(tl.float32, bitcast=True) * INV_Q)
                tl.store(scale_ptr + rows, scale, mask=rows < L_OUT)
                s = scale[:, None]
        else:
            amax = tl.load(amax_ptr).to(tl.float32, bitcast=True)
            if SAWB:
                scale = sawb_scale(amax, tl.load(stats_ptr), tl.load(stats_ptr + 1), numel, QMAX)
            else:
                scale = amax * INV_Q
            scale = normal_scale(scale)
            if rb == 0:
                tl.store(scale_ptr, scale)
            s = scale
        if MODE != 1:
            if NCHUNK == 1:
                cols = tl.arange(0, BLOCK_O)
                if MODE == 2:
                    x, _ = _load_ht(gy_ptr, stride_g, rows64, rmask, cols, O, BLOCK_L, BLOCK_O)
                _quant_store(
                    x, s, codes_ptr, stride_c, rows, rows64, cols, L_OUT, O_PAD, seed,
                    ROUNDING, QMAX, PM,
                )  # fmt: skip
            else:
                for c in range(NCHUNK):
                    cc = c * BLOCK_O + tl.arange(0, BLOCK_O)
                    xc, _ = _load_ht(gy_ptr, stride_g, rows64, rmask, cc, O, BLOCK_L, BLOCK_O)
                    _quant_store(
                        xc, s, codes_ptr, stride_c, rows, rows64, cc, L_OUT, O_PAD, seed,
                        ROUNDING, QMAX, PM,
                    )  # fmt: skip
    if RAW:
        if MODE == 0:
            tl.store(raw_ptr + pid, raw_top)
        if MODE == 1:  # one atomic per program: the word is contended by every program
            tl.atomic_max(raw_ptr, raw_top)


# ----------------------------------------------------------------------------- host code


def _config(o_pad: int, block_o: int | None, fp8_values: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_L, BLOCK_O, NCHUNK, num_warps) for a padded width.

    Measured on an H200 (docs/kernels.md, tile sweep): one tile per row when the
    padded width is a power of two up to TILE (up to ONE_WALK, measured on an H100), else
    chunks that divide it exactly (the largest power of two, 256 to CHUNK_O), never a tile
    mostly masked. FP8 values (``fp8_values``, the text recipe) take :func:`fp8_block_o`'s
    tiles where it has one.
    """
    p = triton.next_power_of_2(o_pad)
    if block_o is None and fp8_values:
        block_o = fp8_block_o(o_pad)
    if block_o is None:
        if p == o_pad and p <= ONE_WALK:
            block_o = p
        else:
            block_o = min(o_pad & -o_pad, CHUNK_O)
            block_o = max(block_o, 256)
    block_o = min(block_o, p)
    nchunk = triton.cdiv(o_pad, block_o)
    block_l = max(1, min(64, TILE // block_o))
    return block_l, block_o, nchunk, 4 if block_l * block_o <= 2048 else 8


#: FP8 values (the text recipe's HQ) on a width that is not a power of two: one masked walk
#: of this width for widths just below it (the measured 2304 and 3072), chunks of
#: FP8_CHUNK_O for rows wider than that where they waste at most 1/32
FP8_MASKED_WALK = 4096
FP8_CHUNK_O = 16384


def fp8_block_o(o_pad: int) -> int | None:
    """BLOCK_O for HQ's FP8-values codes (``rounding="fp8_e4m3"``) where it differs from
    :func:`_config`'s rule, else None.

    :func:`_config` walks a width that is not a power of two in chunks that divide it, twice,
    because a masked walk over the next power of two was measured slower on the H200 with the
    INT4 kernel of the time. With today's FP8-values kernel the H100 measures the opposite
    (``experiments/results/hq_wide_rows_h100.md``, same codes bit for bit): one masked walk of 4096
    over ViT's 2304 / 3072 wide g_y in 92 / 95 µs against 102 / 105, two chunks of 16384 over
    the Llama head's 32000 in 330 µs against 459 (125 chunks of 256). Only those measured
    patterns change; GPT-2's head (50272 padded: 16384-wide chunks would waste 23%, and took
    1547 µs) and every INT recipe keep the old rule: at INT4 the masked walk is slower on
    ViT's widths (qkv 145 against 118 µs, ``experiments/results/hq_wide_rows_int4_h100.md``)."""
    p = triton.next_power_of_2(o_pad)
    if p == o_pad:
        return None
    if p == FP8_MASKED_WALK:
        return p
    if o_pad >= FP8_CHUNK_O and triton.cdiv(o_pad, FP8_CHUNK_O) * FP8_CHUNK_O * 31 <= o_pad * 32:
        return FP8_CHUNK_O
    return None


def hq_quantize(
    gy: torch.Tensor,
    bits: int = 4,
    per_token: bool = True,
    rounding: str = "pseudo_stochastic",
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    pad_rows_to: int = 1,
    block_o: int | None = None,
    sawb: bool = False,
    layer: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``quantize(block_hadamard(gy, 1, 16), bits, per_token, rounding)`` on CUDA by the
    faster of the CUDA C++ kernel (``hq_cuda``, when built) and the Triton kernel
    (:func:`hq_quantize_triton`), measured per shape by ``hotcompile.kernels.dispatch``; both
    return the same codes and scales. ``block_o``/``sawb``/``stochastic``: Triton only."""
    if (
        block_o is None
        and not sawb
        and gy.dim() == 2
        and hq_cuda.supported(gy, rounding, out_dtype)
        and hq_cuda.available()
    ):
        args = (gy, bits, per_token, rounding, out_dtype, pad_rows_to)
        impls = {"cuda": hq_cuda.hq_quantize, "triton": hq_quantize_triton}
        scaling = "token" if per_token else "tensor"
        dt = str(gy.dtype).replace("torch.", "")
        key = f"hq_quantize {dt} {gy.shape[0]}×{gy.shape[1]} per-{scaling} INT{bits}"
        name = dispatch.settled(key)
        if name is None:
            cands = [(n, lambda f=f: f(*args)) for n, f in impls.items()]
            with dispatch._lock:
                name = dispatch.choose(key, cands, gy.device)
        dispatch.note(layer, "g_x quantize", key)
        return impls[name](*args)
    dispatch.note(layer, "g_x quantize", "triton")
    return hq_quantize_triton(gy, bits, per_token, rounding, out_dtype, pad_rows_to, block_o, sawb)


def hq_quantize_triton(
    gy: torch.Tensor,
    bits: int = 4,
    per_token: bool = True,
    rounding: str = "pseudo_stochastic",
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    pad_rows_to: int = 1,
    block_o: int | None = None,
    sawb: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``quantize(block_hadamard(gy, 1, 16), bits, per_token, rounding)``, Triton.

    Returns ``(codes [L_out, O_pad] out_dtype, scales fp32 [L_out] or [1])`` with
    ``L_out = padded(L, pad_rows_to)`` (rows past L are zero codes with zero scale) and
    ``O_pad = padded(O, 16)``. Codes are INT-grid integers in ``out_dtype``. ``sawb``
    (per-tensor, 4-bit): the SAWB scale of ``hotcompile.quant.sawb_scale`` from Σx², Σ|x| summed
    with atomics (equal to the reference's to float32 rounding, not bit for bit).
    """
    if gy.dim() != 2:
        raise ValueError(f"hq_quantize expects [L, O], got {tuple(gy.shape)}")
    q = qmax(bits)
    if out_dtype == torch.float8_e4m3fn and q > 16:
        raise ValueError("INT8 codes are not exact in float8_e4m3fn: use int8")
    gy, codes, scales = hq_cuda.outputs(gy, per_token, out_dtype, pad_rows_to)
    l_out, o_pad = codes.shape
    if l_out == 0 or o_pad == 0:
        if not per_token:
            scales.zero_()
        return codes, scales
    if per_token and sawb:
        raise ValueError("SAWB scales are per tensor")
    seed = int(torch.randint(0, 2**31 - 1, ())) if rounding == "stochastic" else 0
    words = None if per_token else scratch.zeroed(gy.device, 3 if sawb else 1)
    launch_hq_quantize(_hq_quant_kernel, gy, codes, scales, words, bits, rounding, seed, sawb,
                       block_o)  # fmt: skip
    return codes, scales


def raw_slots(rows: int, block_l: int = 1, cap: int = MAX_RAW_SLOTS) -> int:
    """Programs (one raw max-abs slot each) of a per-token launch that also takes g_y's raw
    max-abs over ``rows`` output rows in blocks of ``block_l``: one per row block, at most
    ``cap`` (the programs then loop over row blocks). Shared by this kernel and the SwiGLU
    backward's (``swiglu_triton.launch_swiglu_hq``)."""
    return min(triton.cdiv(rows, block_l), cap)


def launch_hq_quantize(
    kernel,
    gy: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    words: torch.Tensor | None,
    bits: int,
    rounding: str,
    seed: int,
    sawb: bool = False,
    block_o: int | None = None,
    raw: bool = False,
    max_raw_slots: int | None = None,
) -> torch.Tensor | None:
    """Launch ``_hq_quant_kernel`` into ``codes`` / ``scales``: once per token (``words`` None),
    twice per tensor (max-abs into the zeroed int32 ``words``, 3 with ``sawb``, then codes).
    ``raw``: also g_y's own max-abs bits, returned as int32 — per token one slot per program
    (at most ``max_raw_slots``, default ``MAX_RAW_SLOTS``, programs, each looping over row
    blocks: what a consumer reduces; :func:`hotcompile.kernels.hla_triton.launch_hla_quantize`
    takes them as its ``amax``), per tensor one word; else None.
    The one copy of the launch arithmetic, shared by :func:`hq_quantize_triton` (the ops
    path) and the ``triton_op`` of ``hotcompile.lowering.triton_ops`` (``kernel`` wrapped by
    ``wrap_triton``). ``gy`` has a unit column stride; the outputs are non-empty."""
    L, O = gy.shape
    l_out, o_pad = codes.shape
    block_l, bo, nchunk, warps = _config(o_pad, block_o, rounding == FP8_E4M3)
    nrb = triton.cdiv(l_out, block_l)
    per_token = words is None
    slots = raw_slots(l_out, block_l, max_raw_slots or MAX_RAW_SLOTS)
    grid = (slots if raw and per_token else nrb,)
    common = dict(
        **code_constexprs(bits, rounding),
        NCHUNK=nchunk,
        BLOCK_L=block_l,
        BLOCK_O=bo,
        SAWB=sawb,
        RAW=raw,
        num_warps=warps,
    )
    args = (L, O, l_out, o_pad, gy.stride(0), codes.stride(0), seed, float(L * o_pad), nrb)
    out = None
    if raw:
        shape = (grid[0],) if per_token else (1,)
        make = torch.empty if per_token else torch.zeros  # slots, or a word for atomics
        out = make(shape, dtype=torch.int32, device=gy.device)
    rp = out if out is not None else scales  # any pointer when RAW is off
    if per_token:
        kernel[grid](gy, codes, scales, scales, scales, rp, *args, MODE=0, **common)
    else:
        amax = words[:1]
        stats = words[1:].view(torch.float32) if sawb else scales  # SAWB's Σx², Σ|x|
        kernel[grid](gy, codes, scales, amax, stats, rp, *args, MODE=1, **common)
        kernel[grid](gy, codes, scales, amax, stats, rp, *args, MODE=2, **common)
    return out


def quantize_weight(w: torch.Tensor, bits: int, weight_scale: str, fp8: bool):
    """``Ŵq = Q(B·W)`` per tensor, nearest, as the GEMM's column-major B operand ``[I, O_pad]``.

    The 16-blocks run along O, W's slow dimension: that is HLA's geometry with all 16 rows
    kept, so the HLA kernel does it — 16 coalesced row loads per block, the butterfly in
    registers, the codes stored transposed (K-major, as ``_scaled_mm``/``_int_mm`` want) —
    reading W twice (SAWB statistics / max-abs, then codes) with no transpose copy.
    """
    if weight_scale not in ("sawb", "maxabs"):
        raise ValueError(f"unknown scale mode {weight_scale!r}")
    dtype = torch.float8_e4m3fn if fp8 else torch.int8
    sawb = weight_scale == "sawb" and bits == 4
    return _hla_quantize(w[None], 0, ALL_ROWS, bits, "nearest", True, sawb=sawb, out_dtype=dtype)


def _reference(*args):
    from hotcompile.ops import hq_grad_input

    return hq_grad_input._init_fn(*args)


def hq_grad_input_cuda(
    gy: torch.Tensor,
    w: torch.Tensor,
    bits: int,
    scaling: str,
    rounding: str,
    weight_scale: str,
    block: int,
    layer: str,
    key: str,
    check: bool,
) -> torch.Tensor:
    """CUDA ``hotcompile::hq_grad_input``: fused Hadamard-quantize of g_y and W, then one GEMM
    with the dequantization in its epilogue (``hotcompile.kernels.dispatch`` picks CUTLASS,
    Triton or torch per shape).

    INT4 with I % 16 == 0 on sm_89+: e4m3 codes (INT4-grid integers are exact in e4m3). INT8
    (warm-up) or other shapes: int8 codes. Block sizes other than 16 and unknown roundings fall
    back to the reference.
    """
    # LQS / warm-up: the same call as the reference, once per call
    scaling, bits = lqs.resolve(key, scaling, gy, bits, block)
    if scaling == "exact":  # LQS is calibrating this layer
        return gy @ w.to(gy.dtype)
    args = (bits, scaling, rounding, weight_scale, block, layer, "", check)
    if block != 16 or rounding not in ROUNDINGS or gy.dim() != 2 or w.dim() != 2:
        return _reference(gy, w, *args)
    per_token = scaling == "per_token"
    L, I = gy.shape[0], w.shape[1]
    fp8 = bits == 4 and I % 16 == 0 and I > 0 and has_fp8_gemm(gy.device)
    codes, sg = hq_quantize(
        gy, bits, per_token, rounding, torch.float8_e4m3fn if fp8 else torch.int8,
        16 if fp8 else 1, layer=layer,
    )  # fmt: skip
    wt, sw = quantize_weight(w, bits, weight_scale, fp8)
    if check:
        numerics.check_scale(sg[:L], layer, "g_x")
    # the reference's dequantization (acc · s_row) · (s_w / block), fused in the GEMM's epilogue
    out = dispatch.scaled_gemm(codes, wt, sg, sw / block, gy.dtype, layer=layer, stage="g_x GEMM")
    return out[:L]

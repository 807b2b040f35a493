"""Triton kernels of HOT's g_w path (HLA + INT8 quantize along L), and the CUDA implementations
of ``abc_compress``, ``hla_grad_weight`` and ``hla_grad_weight_dense``.

``hla_quantize`` reads ``x: [N, S, D]`` (an activation or g_y) once per pass and writes the
codes of ``Q(T x)``, ``T = I ⊗ H_16`` restricted to the kept ``rows``: the HLA blocks of
``hotcompile.hla.to_blocks`` (16 consecutive positions of one sample, or 4x4 patches of an
H×W map when ``grid_w > 0``; zero-padded), the butterfly of ``hotcompile.hadamard.fwht_last``
in float32, stage by stage in the same order (so the coefficients are bit-identical), then the
per-tensor max-abs scale and the rounding of ``hotcompile.quant.quantize``.

Per program: ``BLOCK_B`` HLA blocks × ``BLOCK_D`` channels. The 16 positions of a block are 16
coalesced row loads (one ``[BLOCK_B, BLOCK_D]`` tile each), so the butterfly runs inside each
thread on 16 register tiles: no shuffles, no layout conversions. Two launches, no host sync:
the first writes each program's max-abs of the kept coefficients (int32 of the float's bits:
NaN propagates) into a slot of its own, the second reduces the slots, recomputes the
coefficients and quantizes them.
Codes come out either ``[R, D]`` (the layout ``abc_compress`` returns) or transposed,
``[D, R]`` (K-major, what ``torch._int_mm`` takes for ``g̃qᵀ·x̃q``), with R = N·nb·r and row
``(n·nb + b)·r + k`` holding coefficient ``rows[k]`` of block b of sample n.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotcompile import numerics
from hotcompile.hla import patch_side
from hotcompile.kernels import dispatch
from hotcompile.kernels.rounding import (
    ROUNDING_CODES,
    _round_bf16,
    code_constexprs,
    codes,
    normal_scale,
    sawb_scale,
)
from hotcompile.quant import FP8_E4M3, code_dtype, qmax

#: ``rows=()`` (no HLA): every position of a block, untransformed — the plain rows of x in
#: block order, zero rows where S is not a multiple of 16 (they add nothing to a GEMM over L)
IDENTITY_ROWS = tuple(range(16))

#: the statistics pass's programs (each one slot of partial statistics) where the channel
#: blocks allow, and how many slots the codes pass reduces at a time (``launch_hla_quantize``)
MAX_PARTIALS = 1024
REDUCE_BLOCK = 1024

#: default program tile: BLOCK_B blocks × BLOCK_D channels (× 16 positions in registers)
BLOCK_B = 8
BLOCK_D = 64


# ----------------------------------------------------------------------------- device code


@triton.jit
def _load_pos(
    x_ptr, base, bidx, gmask, d, dmask, stride_s, S, H, W, NBW, sign_ptr, n,
    P: tl.constexpr, PATCH: tl.constexpr, SIGNS: tl.constexpr, ROUND_BF16: tl.constexpr,
):  # fmt: skip
    """Position P of each HLA block ``bidx`` (per sample): ``[BLOCK_B, BLOCK_D]`` float32;
    with SIGNS times the token's ±1 (``sign_ptr[n·S + s]``: hla_signs, exact in float32);
    with ROUND_BF16 rounded to bfloat16 as loaded (a float32 x read as its bf16 copy)."""
    if PATCH:
        hh = (bidx // NBW) * 4 + P // 4
        ww = (bidx % NBW) * 4 + P % 4
        ok = gmask & (hh < H) & (ww < W)
        s = hh * W + ww
    else:
        s = bidx * 16 + P
        ok = gmask & (s < S)
    ptrs = x_ptr + base[:, None] + s.to(tl.int64)[:, None] * stride_s + d[None, :]
    v = tl.load(ptrs, mask=ok[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    if ROUND_BF16:
        v = _round_bf16(v)
    if SIGNS:
        sgn = tl.load(sign_ptr + n.to(tl.int64) * S + s, mask=ok, other=0.0).to(tl.float32)
        v = v * sgn[:, None]
    return v


@triton.jit
def _bf(a, b):
    return a + b, a - b


@triton.jit
def _pick(
    y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15,
    ROWS: tl.constexpr, K: tl.constexpr,
):  # fmt: skip
    """Coefficient ``rows[K]`` (ROWS packs the kept rows, 5 bits each; 16 = none: zeros)."""
    J: tl.constexpr = (ROWS >> (5 * K)) & 31
    if J == 0:
        r = y0
    elif J == 1:
        r = y1
    elif J == 2:
        r = y2
    elif J == 3:
        r = y3
    elif J == 4:
        r = y4
    elif J == 5:
        r = y5
    elif J == 6:
        r = y6
    elif J == 7:
        r = y7
    elif J == 8:
        r = y8
    elif J == 9:
        r = y9
    elif J == 10:
        r = y10
    elif J == 11:
        r = y11
    elif J == 12:
        r = y12
    elif J == 13:
        r = y13
    elif J == 14:
        r = y14
    elif J == 15:
        r = y15
    else:
        r = y0 * 0.0
    return r


@triton.jit
def _ilv2(a, b):
    return tl.join(a, b)


@triton.jit
def _fwht16(
    y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15,
):  # fmt: skip
    """The 16-point Walsh-Hadamard butterfly, stage by stage as ``fwht_last``."""
    y0, y1 = _bf(y0, y1)
    y2, y3 = _bf(y2, y3)
    y4, y5 = _bf(y4, y5)
    y6, y7 = _bf(y6, y7)
    y8, y9 = _bf(y8, y9)
    y10, y11 = _bf(y10, y11)
    y12, y13 = _bf(y12, y13)
    y14, y15 = _bf(y14, y15)
    y0, y2 = _bf(y0, y2)
    y1, y3 = _bf(y1, y3)
    y4, y6 = _bf(y4, y6)
    y5, y7 = _bf(y5, y7)
    y8, y10 = _bf(y8, y10)
    y9, y11 = _bf(y9, y11)
    y12, y14 = _bf(y12, y14)
    y13, y15 = _bf(y13, y15)
    y0, y4 = _bf(y0, y4)
    y1, y5 = _bf(y1, y5)
    y2, y6 = _bf(y2, y6)
    y3, y7 = _bf(y3, y7)
    y8, y12 = _bf(y8, y12)
    y9, y13 = _bf(y9, y13)
    y10, y14 = _bf(y10, y14)
    y11, y15 = _bf(y11, y15)
    y0, y8 = _bf(y0, y8)
    y1, y9 = _bf(y1, y9)
    y2, y10 = _bf(y2, y10)
    y3, y11 = _bf(y3, y11)
    y4, y12 = _bf(y4, y12)
    y5, y13 = _bf(y5, y13)
    y6, y14 = _bf(y6, y14)
    y7, y15 = _bf(y7, y15)
    return y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15


@triton.jit
def _kept(
    y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15,
    ROWS: tl.constexpr, RP: tl.constexpr,
):  # fmt: skip
    """The kept coefficients of 16, slot k = rows[k] (``ROWS`` packed as in :func:`_pick`,
    ``RP`` slots, a power of two), as one ``[BLOCK_B, BLOCK_D, RP]`` tile (to reshape):
    joins interleave, so the leaves go in bit-reversed order."""
    ys = (y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15)
    if RP == 1:
        t = _pick(*ys, ROWS, 0)[:, :, None]
    elif RP == 2:
        t = _ilv2(_pick(*ys, ROWS, 0), _pick(*ys, ROWS, 1))
    elif RP == 4:
        t = _ilv2(
            _ilv2(_pick(*ys, ROWS, 0), _pick(*ys, ROWS, 2)),
            _ilv2(_pick(*ys, ROWS, 1), _pick(*ys, ROWS, 3)),
        )
    elif RP == 8:
        t = _ilv2(
            _ilv2(
                _ilv2(_pick(*ys, ROWS, 0), _pick(*ys, ROWS, 4)),
                _ilv2(_pick(*ys, ROWS, 2), _pick(*ys, ROWS, 6)),
            ),
            _ilv2(
                _ilv2(_pick(*ys, ROWS, 1), _pick(*ys, ROWS, 5)),
                _ilv2(_pick(*ys, ROWS, 3), _pick(*ys, ROWS, 7)),
            ),
        )
    else:
        t = _ilv2(
            _ilv2(
                _ilv2(
                    _ilv2(_pick(*ys, ROWS, 0), _pick(*ys, ROWS, 8)),
                    _ilv2(_pick(*ys, ROWS, 4), _pick(*ys, ROWS, 12)),
                ),
                _ilv2(
                    _ilv2(_pick(*ys, ROWS, 2), _pick(*ys, ROWS, 10)),
                    _ilv2(_pick(*ys, ROWS, 6), _pick(*ys, ROWS, 14)),
                ),
            ),
            _ilv2(
                _ilv2(
                    _ilv2(_pick(*ys, ROWS, 1), _pick(*ys, ROWS, 9)),
                    _ilv2(_pick(*ys, ROWS, 5), _pick(*ys, ROWS, 13)),
                ),
                _ilv2(
                    _ilv2(_pick(*ys, ROWS, 3), _pick(*ys, ROWS, 11)),
                    _ilv2(_pick(*ys, ROWS, 7), _pick(*ys, ROWS, 15)),
                ),
            ),
        )
    return t


@triton.jit
def _tile_stats(t, SAWB: tl.constexpr):
    """A tile's max-abs bits (int32 of the float's bits: NaN orders above every number) and,
    with SAWB, its Σt² and Σ|t| (zeros without)."""
    top = tl.max(tl.max(tl.max(tl.abs(t).to(tl.int32, bitcast=True), axis=2), axis=1), axis=0)
    if SAWB:
        s2 = tl.sum(tl.sum(tl.sum(t * t, axis=2), axis=1), axis=0)
        s1 = tl.sum(tl.sum(tl.sum(tl.abs(t), axis=2), axis=1), axis=0)
    else:
        s2 = 0.0
        s1 = 0.0
    return top, s2, s1


@triton.jit
def _tensor_stats(t, amax_ptr, stats_ptr, SAWB: tl.constexpr):
    """A tile's share of the per-tensor scale (:func:`_tile_stats`) by atomics: its max-abs
    into ``amax_ptr`` (atomic max on the float's bits: NaN propagates; padded slots and
    masked positions hold zeros, which never raise it), with SAWB also Σt², Σ|t| into
    ``stats_ptr`` (atomic fp32 adds)."""
    top, s2, s1 = _tile_stats(t, SAWB)
    tl.atomic_max(amax_ptr, top)
    if SAWB:
        tl.atomic_add(stats_ptr, s2)
        tl.atomic_add(stats_ptr + 1, s1)


@triton.jit
def _tensor_scale(amax_ptr, stats_ptr, numel, SAWB: tl.constexpr, QMAX: tl.constexpr):
    """The per-tensor scale from :func:`_tensor_stats`' words: max-abs / QMAX, or SAWB's."""
    INV_Q: tl.constexpr = 1.0 / QMAX
    amax = tl.load(amax_ptr).to(tl.float32, bitcast=True)
    if SAWB:
        scale = sawb_scale(amax, tl.load(stats_ptr), tl.load(stats_ptr + 1), numel, QMAX)
    else:
        scale = amax * INV_Q
    return normal_scale(scale)


@triton.jit
def _partials_scale(
    amax_ptr, stats_ptr, npart, numel,
    SAWB: tl.constexpr, QMAX: tl.constexpr, RED: tl.constexpr,
):  # fmt: skip
    """The per-tensor scale from ``npart`` partial statistics: max-abs bits ``amax_ptr[i]``
    and, with SAWB, Σt² ``stats_ptr[i]`` and Σ|t| ``stats_ptr[npart + i]`` (one of each per
    program of the statistics pass, so nothing needs zeroing first), reduced ``RED`` at a
    time: max-abs / QMAX, or SAWB's."""
    INV_Q: tl.constexpr = 1.0 / QMAX
    top = tl.zeros([], dtype=tl.int32)
    s2 = tl.zeros([], dtype=tl.float32)
    s1 = tl.zeros([], dtype=tl.float32)
    for i in range(0, npart, RED):
        k = i + tl.arange(0, RED)
        m = k < npart
        top = tl.maximum(top, tl.max(tl.load(amax_ptr + k, mask=m, other=0), axis=0))
        if SAWB:
            s2 += tl.sum(tl.load(stats_ptr + k, mask=m, other=0.0), axis=0)
            s1 += tl.sum(tl.load(stats_ptr + npart + k, mask=m, other=0.0), axis=0)
    amax = top.to(tl.float32, bitcast=True)
    if SAWB:
        scale = sawb_scale(amax, s2, s1, numel, QMAX)
    else:
        scale = amax * INV_Q
    return normal_scale(scale)


@triton.jit
def _tensor_codes(
    t, g, gmask, d, dmask, pid_b, pid_d, codes_ptr, scale_ptr, scale, row_ptr, D, R, seed,
    TRANS: tl.constexpr, NR: tl.constexpr, RP: tl.constexpr,
    ROUNDING: tl.constexpr, QMAX: tl.constexpr, PM: tl.constexpr, SCALE_ROW: tl.constexpr,
):  # fmt: skip
    """The codes of a ``[BLOCK_B, BLOCK_D, RP]`` tile (slot k of block g is row ``g·NR + k``,
    slots ≥ NR padding) with the per-tensor ``scale`` (:func:`_tensor_scale` or
    :func:`_partials_scale`), stored ``[R, D]`` or (TRANS) ``[D, R]``; the scale itself by the
    first program. SCALE_ROW: the programs of
    the first row block also write ``scale/16`` at each of their D positions of ``row_ptr``
    (HQ's weight scale as the g_x GEMM's rowwise ``scale_b``: no kernel of its own to expand
    it; a power of two, so the same bits as the host's ``scale / 16``)."""
    if (pid_b == 0) & (pid_d == 0):
        tl.store(scale_ptr, scale)
    if SCALE_ROW:
        if pid_b == 0:
            tl.store(row_ptr + d, tl.zeros_like(d).to(tl.float32) + scale * 0.0625, mask=dmask)
    k = tl.arange(0, RP)
    row = g[:, None, None] * NR + k[None, None, :]  # [BLOCK_B, 1, RP]
    mask = gmask[:, None, None] & dmask[None, :, None] & (k < NR)[None, None, :]
    if TRANS:
        offs = d[None, :, None].to(tl.int64) * R + row
    else:
        offs = row.to(tl.int64) * D + d[None, :, None]
    c = codes(t, scale, offs.to(tl.int32), seed, ROUNDING, QMAX, PM)
    tl.store(codes_ptr + offs, c.to(codes_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tile_index(pid_b, pid_d, G, D, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr):
    """Tile ``(pid_b, pid_d)``'s HLA blocks and channels with their masks. Computed by the
    kernel, not by :func:`_hla_tile`: ``torch.library.triton_op``'s mutation analysis walks
    back from each store's address through the TTIR, and counts every pointer a function
    call takes as the source of everything it returns — codes stored at indices returned
    with the tile would mark x (a weight: "a leaf Variable … in-place"; an activation:
    cloned) as written (session 39, ``tests/test_kernels_interpret.py``'s mutation check)."""
    g = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    return g, g < G, d, d < D


@triton.jit
def _hla_tile(
    x_ptr, sign_ptr, g, gmask, d, dmask, nb, S, H, W, NBW, stride_n, stride_s,
    PATCH: tl.constexpr, SIGNS: tl.constexpr, TRANSFORM: tl.constexpr, ROWS: tl.constexpr,
    RP: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, ROUND_BF16: tl.constexpr,
):  # fmt: skip
    """The kept coefficients ``[BLOCK_B, BLOCK_D, RP]`` of blocks ``g`` × channels ``d``
    (:func:`_tile_index`): 16 coalesced row loads, the butterfly in registers."""
    n = g // nb
    bidx = g % nb
    base = n.to(tl.int64) * stride_n
    a = (x_ptr, base, bidx, gmask, d, dmask, stride_s, S, H, W, NBW, sign_ptr, n)
    y0 = _load_pos(*a, 0, PATCH, SIGNS, ROUND_BF16)
    y1 = _load_pos(*a, 1, PATCH, SIGNS, ROUND_BF16)
    y2 = _load_pos(*a, 2, PATCH, SIGNS, ROUND_BF16)
    y3 = _load_pos(*a, 3, PATCH, SIGNS, ROUND_BF16)
    y4 = _load_pos(*a, 4, PATCH, SIGNS, ROUND_BF16)
    y5 = _load_pos(*a, 5, PATCH, SIGNS, ROUND_BF16)
    y6 = _load_pos(*a, 6, PATCH, SIGNS, ROUND_BF16)
    y7 = _load_pos(*a, 7, PATCH, SIGNS, ROUND_BF16)
    y8 = _load_pos(*a, 8, PATCH, SIGNS, ROUND_BF16)
    y9 = _load_pos(*a, 9, PATCH, SIGNS, ROUND_BF16)
    y10 = _load_pos(*a, 10, PATCH, SIGNS, ROUND_BF16)
    y11 = _load_pos(*a, 11, PATCH, SIGNS, ROUND_BF16)
    y12 = _load_pos(*a, 12, PATCH, SIGNS, ROUND_BF16)
    y13 = _load_pos(*a, 13, PATCH, SIGNS, ROUND_BF16)
    y14 = _load_pos(*a, 14, PATCH, SIGNS, ROUND_BF16)
    y15 = _load_pos(*a, 15, PATCH, SIGNS, ROUND_BF16)
    # the stages of fwht_last: h = 1, 2, 4, 8; (j, j+h) -> (a+b, a-b). Without TRANSFORM
    # (no HLA) the "coefficients" are the 16 positions themselves: the plain rows of x
    if TRANSFORM:
        y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15 = _fwht16(
            y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15
        )
    t = _kept(y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15, ROWS, RP)
    return tl.reshape(t, [BLOCK_B, BLOCK_D, RP])


@triton.jit
def _hla_quant_kernel(
    x_ptr, codes_ptr, scale_ptr, amax_ptr, stats_ptr, sign_ptr, row_ptr,
    G, D, R, nb, S, H, W, NBW, stride_n, stride_s, seed, numel, NPB, npart,
    MODE: tl.constexpr, TRANS: tl.constexpr, PATCH: tl.constexpr, SAWB: tl.constexpr,
    SIGNS: tl.constexpr, TRANSFORM: tl.constexpr,
    ROWS: tl.constexpr, NR: tl.constexpr, RP: tl.constexpr,
    ROUNDING: tl.constexpr, QMAX: tl.constexpr, PM: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, ROUND_BF16: tl.constexpr,
    SCALE_ROW: tl.constexpr, RED: tl.constexpr,
):  # fmt: skip
    """MODE 1 (grid ``[nb1, nd]``): program ``(i, j)`` takes the row blocks ``i, i + nb1, …``
    (of ``NPB``) of channel block j and stores its statistics at ``i·nd + j``: the max-abs
    bits of the kept coefficients in ``amax_ptr`` and, with SAWB, Σt², Σ|t| in ``stats_ptr``
    (``npart`` of each). A slot per program, not atomics into a zeroed word: under inductor
    a zeroed word is one ``torch.zeros`` for every quantizer of the graph after CSE, cloned
    for each kernel that writes it — a launch each, which FSDP2's host-bound step paid ~104
    times a step on the 0.67B Llama (session 38). MODE 2 (grid ``[NPB, nd]``): reduce the
    ``npart`` statistics (``RED`` at a time) to the scale and quantize; codes ``[R, D]`` or
    (TRANS) ``[D, R]``, in the codes tensor's dtype. ROUND_BF16: x is float32 and is read as
    its bfloat16 copy would be (HQ's weight codes from the fp32 parameter, as autocast's copy,
    without the copy written). SCALE_ROW (MODE 2): ``scale/16`` over ``row_ptr [D]`` as well
    (:func:`_tensor_codes`)."""
    pid_b = tl.program_id(0)
    pid_d = tl.program_id(1)
    geo = (nb, S, H, W, NBW, stride_n, stride_s)
    if MODE == 1:
        top = tl.zeros([], dtype=tl.int32)
        s2 = tl.zeros([], dtype=tl.float32)
        s1 = tl.zeros([], dtype=tl.float32)
        for b in range(pid_b, NPB, tl.num_programs(0)):
            g, gmask, d, dmask = _tile_index(b, pid_d, G, D, BLOCK_B, BLOCK_D)
            t = _hla_tile(
                x_ptr, sign_ptr, g, gmask, d, dmask, *geo,
                PATCH, SIGNS, TRANSFORM, ROWS, RP, BLOCK_B, BLOCK_D, ROUND_BF16,
            )  # fmt: skip
            t_top, t_s2, t_s1 = _tile_stats(t, SAWB)
            top = tl.maximum(top, t_top)
            s2 += t_s2
            s1 += t_s1
        slot = pid_b * tl.num_programs(1) + pid_d
        tl.store(amax_ptr + slot, top)
        if SAWB:
            tl.store(stats_ptr + slot, s2)
            tl.store(stats_ptr + npart + slot, s1)
    else:
        g, gmask, d, dmask = _tile_index(pid_b, pid_d, G, D, BLOCK_B, BLOCK_D)
        t = _hla_tile(
            x_ptr, sign_ptr, g, gmask, d, dmask, *geo,
            PATCH, SIGNS, TRANSFORM, ROWS, RP, BLOCK_B, BLOCK_D, ROUND_BF16,
        )  # fmt: skip
        scale = _partials_scale(amax_ptr, stats_ptr, npart, numel, SAWB, QMAX, RED)
        _tensor_codes(
            t, g, gmask, d, dmask, pid_b, pid_d, codes_ptr, scale_ptr, scale, row_ptr, D, R,
            seed, TRANS, NR, RP, ROUNDING, QMAX, PM, SCALE_ROW,
        )  # fmt: skip


# ----------------------------------------------------------------------------- host code


def hla_rows_count(S: int, grid_w: int) -> tuple[int, int, int, int]:
    """(nb, H, W, NBW) of ``to_blocks`` for a sample of S positions (16-blocks)."""
    if grid_w:
        H, W = S // grid_w, grid_w
        nbw = (W + 3) // 4
        return ((H + 3) // 4) * nbw, H, W, nbw
    return (S + 15) // 16, 0, 0, 1


def supported(x: torch.Tensor, grid_w: int, rows, block: int, bits: int, rounding: str) -> bool:
    """Whether ``hla_quantize`` takes this case (else the callers run the reference)."""
    return (
        block == 16
        and 0 < len(rows) <= 16
        and all(0 <= int(j) < 16 for j in rows)
        and bits in (4, 8)
        and rounding in ROUNDING_CODES
        and (rounding != FP8_E4M3 or bits == 8)
        and x.dim() == 3
        and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and x.numel() > 0
        and (grid_w == 0 or (grid_w > 0 and x.shape[1] % grid_w == 0 and patch_side(block) == 4))
    )


def hla_quantize(
    x: torch.Tensor,
    grid_w: int,
    rows,
    bits: int,
    rounding: str,
    transposed: bool = True,
    block_b: int = BLOCK_B,
    block_d: int = BLOCK_D,
    num_warps: int = 4,
    sawb: bool = False,
    out_dtype: torch.dtype = torch.int8,
    signs: torch.Tensor | None = None,
    round_bf16: bool = False,
    scale_row: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``quantize(hla_transform(x, grid_w, rows), bits, False, rounding)`` on CUDA.

    Returns ``(codes, scale float32 [1])``; codes are ``[D, R]`` when ``transposed``
    (K-major for the weight-gradient GEMM), else ``[R, D]`` like the reference, as
    ``out_dtype`` (int8, or float8_e4m3fn for INT4-grid codes). ``sawb`` (4-bit): the SAWB
    scale of ``hotcompile.quant.sawb_scale`` from atomic sums (equal to the reference's to
    float32 rounding) — with ``rows = range(16)`` this is HQ's weight quantizer along O.
    ``rounding=FP8_E4M3`` (bits 8): e4m3 codes with the max-abs/448 scale (the g_w path's FP8
    format); ``out_dtype`` is then float8_e4m3fn whatever is passed. ``signs`` (``[N, S, 1]``
    or ``[N, S]``, ±1): x is read as ``x · signs`` (hla_signs) without a signed copy of x —
    which for an LM head's g_y (N·S × vocab) was most of a GiB of peak memory.
    ``round_bf16`` (float32 x): the codes of ``x.to(torch.bfloat16)`` without that copy.
    ``scale_row``: ``scale/16`` over ``[1, D]`` in place of the scale (:func:`launch_hla_quantize`).
    """
    fp8 = rounding == FP8_E4M3
    if fp8:
        if bits != 8:
            raise ValueError(f"FP8 codes are 8 bits wide, got bits={bits}")
        out_dtype = torch.float8_e4m3fn
    elif out_dtype == torch.float8_e4m3fn and qmax(bits) > 16:
        raise ValueError("INT8 codes are not exact in float8_e4m3fn: use int8")
    if x.stride(-1) != 1:
        x = x.contiguous()
    N, S, D = x.shape
    if signs is not None and signs.numel() != N * S:
        raise ValueError(f"signs has {signs.numel()} elements for {N}x{S} tokens")
    seed = int(torch.randint(0, 2**31 - 1, ())) if rounding == "stochastic" else 0
    signs = signs.reshape(N * S).contiguous() if signs is not None else None
    return launch_hla_quantize(
        _hla_quant_kernel, x, grid_w, rows, bits, rounding, transposed, sawb, out_dtype,
        signs, None, seed, block_b, block_d, num_warps, round_bf16=round_bf16,
        scale_row=scale_row,
    )  # fmt: skip


def quantizer_constexprs(
    bits: int, rounding: str, sawb: bool, block_b: int, block_d: int, num_warps: int
) -> dict:
    """The launch arguments of a per-tensor quantizer kernel's codes (``_tensor_stats`` /
    ``_tensor_codes``): SAWB (4-bit only), the rounding, the largest code, the pseudo-random
    bits, the tile and the warps."""
    return dict(
        SAWB=sawb and bits == 4,
        **code_constexprs(bits, rounding),
        BLOCK_B=block_b,
        BLOCK_D=block_d,
        num_warps=num_warps,
    )


def reduce_chunk(npart: int, cap: int = REDUCE_BLOCK) -> int:
    """How many of ``npart`` statistics slots :func:`_partials_scale` loads at a time (its
    ``RED``): all of them, to the next power of two, up to ``cap``."""
    return min(triton.next_power_of_2(npart), cap)


def launch_hla_quantize(
    kernel,
    x: torch.Tensor,
    grid_w: int,
    rows,
    bits: int,
    rounding: str,
    transposed: bool,
    sawb: bool,
    out_dtype: torch.dtype,
    signs: torch.Tensor | None,
    amax: torch.Tensor | None,
    seed: int,
    block_b: int = BLOCK_B,
    block_d: int = BLOCK_D,
    num_warps: int = 4,
    round_bf16: bool = False,
    scale_row: bool = False,
    max_partials: int = MAX_PARTIALS,
    reduce_block: int = REDUCE_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate the outputs and launch ``_hla_quant_kernel`` twice (statistics, then codes):
    the one copy of the launch arithmetic, shared by :func:`hla_quantize` (the ops path:
    ``kernel`` the jitted function) and the ``triton_op`` of
    ``hotcompile.lowering.triton_ops`` (``kernel`` wrapped by ``wrap_triton``). ``x``:
    ``[N, S, D]`` with unit last stride; ``signs``: flat ``[N·S]`` or None.

    The statistics pass writes one slot per program (at most ``max_partials`` programs where
    the channel blocks allow, each looping over row blocks) into an uninitialised buffer the
    codes pass reduces ``reduce_block`` at a time: nothing to zero before the launch (the
    two knobs exist for the tests, which need loops and several chunks at small shapes).

    ``amax`` (no HLA, token blocks, no signs, K-major, no SAWB: the plain rows of x): int32
    already holding x's max-abs bits, one word or slots to reduce (HQ's kernel took them from
    the same g_y, :func:`hotcompile.kernels.hq_triton.launch_hq_quantize`), so only the
    codes pass runs (H100: 78 vs 131 µs over an 8192² g_y,
    ``experiments/results/plain_codes_pass_h100.md``).

    ``round_bf16`` (float32 x): the codes of ``x.to(torch.bfloat16)``, each value rounded as
    it is loaded, so that the bf16 copy is neither written nor read back.

    ``scale_row``: the second output is ``scale/16`` repeated over ``[1, D]`` in place of the
    scale ``[1]`` (HQ's weight codes, ``rows = range(16)`` over ``W[None]``: the g_x GEMM's
    rowwise ``scale_b``, written by the codes pass instead of a kernel that expands it)."""
    N, S, D = x.shape
    nb, H, W, nbw = hla_rows_count(S, grid_w)
    transform = len(rows) > 0
    plain = not transform and grid_w == 0 and signs is None and transposed and not sawb
    given = amax is not None
    if given and not plain:
        raise ValueError("a given max-abs needs the plain case (no HLA, signs or patches)")
    rows = rows if transform else IDENTITY_ROWS
    nr = len(rows)
    rp = triton.next_power_of_2(nr)
    G = N * nb
    R = G * nr
    packed = 0
    for k in range(rp):
        packed |= (int(rows[k]) if k < nr else 16) << (5 * k)
    codes = torch.empty((D, R) if transposed else (R, D), dtype=out_dtype, device=x.device)
    scale = torch.empty((1,), dtype=torch.float32, device=x.device)
    block_d = min(block_d, triton.next_power_of_2(D))
    npb, nd = triton.cdiv(G, block_b), triton.cdiv(D, block_d)
    nb1 = min(npb, max(1, max_partials // nd))  # statistics programs along the row blocks
    if given:  # the given max-abs bits: a word, or the slots of HQ's per-token kernel
        npart, stats = amax.numel(), scale  # no SAWB here
    else:
        npart = nb1 * nd
        # a buffer of its own for each, not views of one: inductor clones every written view
        # of a base that two arguments of one launch alias (session 39: SAWB's slots cloned)
        amax = torch.empty((npart,), dtype=torch.int32, device=x.device)
        stats = (  # SAWB's Σt², Σ|t|
            torch.empty((2 * npart,), dtype=torch.float32, device=x.device) if sawb else scale
        )
    sp = signs if signs is not None else scale  # any pointer when SIGNS is off
    row = torch.empty((1, D), dtype=torch.float32, device=x.device) if scale_row else scale
    args = (
        x, codes, scale, amax, stats, sp, row, G, D, R, nb, S, H, W, nbw, x.stride(0),
        x.stride(1), seed, float(R * D), npb, npart,
    )  # fmt: skip
    common = dict(
        TRANS=transposed,
        PATCH=grid_w > 0,
        SIGNS=signs is not None,
        TRANSFORM=transform,
        ROWS=packed,
        NR=nr,
        RP=rp,
        ROUND_BF16=round_bf16 and x.dtype == torch.float32,
        SCALE_ROW=scale_row,
        RED=reduce_chunk(npart, reduce_block),
        **quantizer_constexprs(bits, rounding, sawb, block_b, block_d, num_warps),
    )
    if not given:
        kernel[(nb1, nd)](*args, MODE=1, **common)
    kernel[(npb, nd)](*args, MODE=2, **common)
    return codes, row


def _ref(name: str, *args):
    from hotcompile import ops

    return getattr(ops, name)._init_fn(*args)


def abc_compress_cuda(x, grid_w, rows, block, bits, rounding, signs=None):
    """CUDA ``hotcompile::abc_compress``: codes ``[R, D]`` int8, or e4m3 for ``FP8_E4M3``
    (column-major: written as ``[D, R]``, K-major for the g_w GEMM) and the fp32 scale, as the
    reference returns them (bit-identical for nearest, pseudo_stochastic and FP8)."""
    if not supported(x, grid_w, rows, block, bits, rounding):
        return _ref("abc_compress", x, grid_w, rows, block, bits, rounding, signs)
    codes, scale = hla_quantize(x, grid_w, rows, bits, rounding, transposed=True, signs=signs)
    return codes.t(), scale


def _gw(gqt, sg, xqt, sx, block, layer, check):
    if check:  # as the reference (ops.hla_grad_weight): x's scale, then g_y's
        numerics.check_scale(sx, layer, "x")
        numerics.check_scale(sg, layer, "g_w")
    # the reference's acc.float() · (s_g·s_x/16), the scale applied in the GEMM's epilogue
    s = sg * sx / block
    return dispatch.scaled_gemm(gqt, xqt, s, None, torch.float32, layer=layer, stage="g_w GEMM")


def hla_grad_weight_cuda(gy, xq, sx, grid_w, rows, block, bits, rounding, layer, check, signs=None):
    """CUDA ``hotcompile::hla_grad_weight``: fused HLA + quantize of g_y written K-major, then
    the INT8 GEMM ``g̃qᵀ·x̃q`` (FP8-e4m3 with ``FP8_E4M3`` codes, float32 accumulation) with the
    reference's dequantization ``s_g·s_x/16`` in its epilogue. The saved codes are
    column-major (``abc_compress``), so ``xq.t()`` is K-major without a copy."""
    args = (gy, xq, sx, grid_w, rows, block, bits, rounding, layer, check, signs)
    if (
        not supported(gy, grid_w, rows, block, bits, rounding)
        or xq.dim() != 2
        or xq.dtype != code_dtype(rounding)  # the reference says what is wrong
    ):
        return _ref("hla_grad_weight", *args)
    gqt, sg = hla_quantize(gy, grid_w, rows, bits, rounding, transposed=True, signs=signs)
    if gqt.shape[1] != xq.shape[0]:
        raise ValueError(f"hla_grad_weight: {gqt.shape[1]} HLA rows of g_y, xq has {xq.shape[0]}")
    return _gw(gqt, sg, xq.t().contiguous(), sx, block, layer, check)


def hla_grad_weight_dense_cuda(
    gy, x, grid_w, rows, block, bits, rounding, layer, check, signs=None
):
    """CUDA ``hotcompile::hla_grad_weight_dense``: both operands through the fused kernel,
    both written K-major (no transpose copy)."""
    args = (gy, x, grid_w, rows, block, bits, rounding, layer, check, signs)
    if not (
        supported(gy, grid_w, rows, block, bits, rounding)
        and supported(x, grid_w, rows, block, bits, rounding)
    ):
        return _ref("hla_grad_weight_dense", *args)
    xqt, sx = hla_quantize(x, grid_w, rows, bits, rounding, transposed=True, signs=signs)
    gqt, sg = hla_quantize(gy, grid_w, rows, bits, rounding, transposed=True, signs=signs)
    return _gw(gqt, sg, xqt, sx, block, layer, check)

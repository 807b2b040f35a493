"""A Triton scaled GEMM for HOT's low-precision products, dequantization in the epilogue.

``scaled_gemm(a, b, scale_a, scale_b)`` computes ``(a·bᵀ as fp32) · scale_a · scale_b`` for
int8 × int8 (exact int32 accumulation) or float8_e4m3fn × float8_e4m3fn (fp32 accumulation)
operands, both K-major — the layout the Hopper tensor cores (wgmma) read 8-bit operands in.
The scales are device tensors (a per-row vector or one value; a per-column vector or one
value), so nothing is read back to the host: the op is CUDA-graph safe.

Why it exists: ``torch._int_mm`` has no epilogue, so every INT8 GEMM of the g_w path paid a
second pass over its fp32 output to dequantize (222 µs on an LLM-sized layer, H200), and
cuBLAS INT8 is barely faster than bf16 on Hopper. Here the dequantization is two multiplies
on the accumulator tile before the one store, in the order of the reference
(``(acc · scale_a) · scale_b``), so the result is bit-identical to
``int_gemm(a, b).float() * scale_a * scale_b``; ``out`` (fp32) makes it accumulate into an
existing gradient.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: tile configurations (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps) for Hopper-class GPUs;
#: ``config=None`` autotunes over them per (M, N, K, dtype), an index fixes one
TILES = (
    (128, 128, 128, 4, 8),
    (128, 256, 128, 3, 8),
    (256, 128, 128, 3, 8),
    (128, 128, 64, 5, 4),
    (64, 128, 128, 4, 4),
)


def _config(t: tuple[int, int, int, int, int]) -> triton.Config:
    bm, bn, bk, stages, warps = t
    meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    return triton.Config(meta, num_stages=stages, num_warps=warps)


@triton.jit
def _scaled_gemm_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, stride_am, stride_bn, stride_cm,
    SA_VEC: tl.constexpr, SB_VEC: tl.constexpr, HAS_SB: tl.constexpr, ACCUM: tl.constexpr,
    IS_INT: tl.constexpr, PRECISE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped order: GROUP_M row tiles share the B column tiles they read while in L2
    width = GROUP_M * num_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    am = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    bn = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    a_ptrs = a_ptr + am[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + bn[:, None] * stride_bn + offs_k[None, :]
    if IS_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        kmask = offs_k[None, :] < K - k
        if IS_INT:
            a = tl.load(a_ptrs, mask=kmask, other=0)
            b = tl.load(b_ptrs, mask=kmask, other=0)
        else:
            a = tl.load(a_ptrs, mask=kmask, other=0.0)
            b = tl.load(b_ptrs, mask=kmask, other=0.0)
        # b is [BLOCK_N, BLOCK_K] K-major: its transpose is what wgmma reads for 8-bit types
        if IS_INT:
            acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
        elif PRECISE:
            # promote the tensor cores' partial sum into the fp32 accumulator once per K tile
            # (Hopper's FP8 MMA accumulates with fewer mantissa bits than fp32; Triton's sm_90
            # default never promotes — see docs/kernels.md, "FP8 accumulation on Hopper")
            acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=BLOCK_K)
        else:
            acc = tl.dot(a, tl.trans(b), acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    out = acc.to(tl.float32)
    mmask = offs_m < M
    nmask = offs_n < N
    if SA_VEC:
        out = out * tl.load(sa_ptr + offs_m, mask=mmask, other=0.0)[:, None]
    else:
        out = out * tl.load(sa_ptr)
    if HAS_SB:
        if SB_VEC:
            out = out * tl.load(sb_ptr + offs_n, mask=nmask, other=0.0)[None, :]
        else:
            out = out * tl.load(sb_ptr)
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    cmask = mmask[:, None] & nmask[None, :]
    if ACCUM:
        out = out + tl.load(c_ptrs, mask=cmask, other=0.0)
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=cmask)


_tuned = triton.autotune(
    configs=[_config(t) for t in TILES], key=["M", "N", "K", "IS_INT", "PRECISE"]
)(_scaled_gemm_kernel)


def supported(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Operand dtypes and layouts the kernel takes (the callers fall back otherwise)."""
    return (
        a.dim() == 2
        and b.dim() == 2
        and a.dtype == b.dtype
        and a.dtype in (torch.int8, torch.float8_e4m3fn)
        and a.shape[1] == b.shape[1]
        and a.stride(1) == 1
        and b.stride(1) == 1
        and a.shape[0] > 0
        and b.shape[0] > 0
    )


def scaled_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
    config: int | None = None,
    precise: bool = True,
) -> torch.Tensor:
    """``(a·bᵀ).float() · scale_a · scale_b`` in ``out_dtype``; added into ``out`` if given.

    ``a [M, K]``, ``b [N, K]``: both int8 or both float8_e4m3fn, K contiguous.
    ``scale_a``: float32 ``[M]`` (per row) or one element; ``scale_b``: float32 ``[N]`` (per
    column), one element, or None. ``config``: an index into ``TILES`` (fixed tiles), or
    None to autotune on the first call per shape (not while a CUDA graph is being captured).
    ``precise`` (FP8 only): promote the tensor cores' partial sums into fp32 once per K tile,
    as CUTLASS's non-FastAccum schedules do, so INT4-grid products sum exactly at any K;
    ``False`` is Triton's sm_90 default (the MMA's narrower accumulator over all of K).
    Raises ``ValueError`` for operands it does not take
    (check :func:`supported` first).
    """
    if not supported(a, b):
        raise ValueError(
            f"scaled_gemm takes K-major int8/e4m3 operands, got {a.dtype}{tuple(a.shape)} "
            f"and {b.dtype}{tuple(b.shape)}"
        )
    M, K = a.shape
    N = b.shape[0]
    accumulate = out is not None
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    elif out.shape != (M, N) or out.stride(1) != 1 or out.dtype != torch.float32:
        raise ValueError(f"out must be a row-major float32 [{M}, {N}] tensor")
    sa = scale_a.reshape(-1)
    sb = scale_b.reshape(-1) if scale_b is not None else sa
    if sa.numel() not in (1, M) or (scale_b is not None and sb.numel() not in (1, N)):
        raise ValueError("scale_a must have 1 or M elements, scale_b 1 or N")

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    if config is None:
        kernel, meta = _tuned, {}
    else:
        c = _config(TILES[config])
        kernel, meta = _scaled_gemm_kernel, {**c.kwargs, "num_stages": c.num_stages}
        meta["num_warps"] = c.num_warps
    kernel[grid](
        a, b, out, sa, sb, M, N, K, a.stride(0), b.stride(0), out.stride(0),
        SA_VEC=sa.numel() > 1, SB_VEC=sb.numel() > 1, HAS_SB=scale_b is not None,
        ACCUM=accumulate, IS_INT=a.dtype == torch.int8,
        PRECISE=bool(precise) and a.dtype != torch.int8, **meta,
    )  # fmt: skip
    return out

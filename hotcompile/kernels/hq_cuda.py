"""The CUDA C++ fused Hadamard + quantize of HQ's g_x operand (``csrc/hq_quantize.cu``).

Same contract and bit-identical results as :func:`hotcompile.kernels.hq_triton.hq_quantize` for
``nearest`` and ``pseudo_stochastic`` rounding (the Triton kernel keeps ``stochastic``). Why a
second implementation: here each thread owns whole 16-blocks, so the butterfly stays in
registers and the codes leave as one 16-byte store per block; Triton splits a 16-block across
threads and pays layout conversions (its kernel ran at about a third of the HBM roofline).

Built just-in-time (``hotcompile.kernels.jit``; no CUTLASS needed: seconds) for the current
GPU's architecture, cached like the CUTLASS GEMMs. :func:`available` never raises; a failed
build is warned once and the Triton kernel runs.
"""

from __future__ import annotations

import torch

from hotcompile.hadamard import padded
from hotcompile.kernels import jit, scratch
from hotcompile.quant import PSEUDO_BITS, qmax

NAME = "hotcompile_hq_quantize"
SOURCES = ("hq_quantize.cu", "hq_quantize_bindings.cpp")
HEADERS = ("hq_quantize.h",)
ROUNDINGS = {"nearest": 0, "pseudo_stochastic": 1}
#: the kernel keeps a row in registers: 256 threads × 4 blocks × 16 columns (wider: Triton)
MAX_COLUMNS = 256 * 4 * 16
STATUS = {1: "arguments refused", 2: "row too long", 3: "kernel launch failed"}


def _flags() -> list[str]:
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
    return ["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}"]


EXTENSION = jit.Extension(
    NAME,
    "the CUDA quantize kernel",
    SOURCES,
    HEADERS,
    nvcc_flags=_flags,
    unavailable=jit.cuda_unavailable,
    duration="seconds",
)


def build(verbose: bool = False) -> bool:
    """Build (or load from the cache) the extension; True when usable. Failures are final."""
    return EXTENSION.build(verbose)


def available() -> bool:
    """True when the kernel can run here (builds it on the first call); never raises."""
    return EXTENSION.available()


def error() -> str | None:
    """Why :func:`available` returned False (None if it did not, or was not asked yet)."""
    return EXTENSION.error


def supported(gy: torch.Tensor, rounding: str, out_dtype: torch.dtype) -> bool:
    return (
        gy.is_cuda
        and gy.dim() == 2
        and gy.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and rounding in ROUNDINGS
        and out_dtype in (torch.float8_e4m3fn, torch.int8)
        and padded(gy.shape[1], 16) <= MAX_COLUMNS
    )


def outputs(
    gy: torch.Tensor, per_token: bool, out_dtype: torch.dtype, pad_rows_to: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(gy with unit column stride, codes [padded(L, pad_rows_to), padded(O, 16)], scales
    [L_out] or [1])``: the output contract both quantize implementations fill."""
    if gy.stride(-1) != 1:
        gy = gy.contiguous()
    L, O = gy.shape
    o_pad, l_out = padded(O, 16), padded(L, pad_rows_to)
    codes = torch.empty((l_out, o_pad), dtype=out_dtype, device=gy.device)
    scales = torch.empty((l_out if per_token else 1,), dtype=torch.float32, device=gy.device)
    return gy, codes, scales


def hq_quantize(
    gy: torch.Tensor,
    bits: int,
    per_token: bool,
    rounding: str,
    out_dtype: torch.dtype,
    pad_rows_to: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes [L_out, O_pad], scales)`` exactly as ``hq_triton.hq_quantize`` returns them."""
    gy, codes, scales = outputs(gy, per_token, out_dtype, pad_rows_to)
    amax = scratch.zeroed(gy.device)  # the per-tensor max-abs word (unused per token)
    mod = EXTENSION.module
    if mod is None or not supported(gy, rounding, out_dtype):
        raise ValueError(f"hq_cuda.hq_quantize does not take {gy.dtype}{tuple(gy.shape)}")
    q, r, pm = float(qmax(bits)), ROUNDINGS[rounding], PSEUDO_BITS[bits]
    status = mod.hq_quantize(gy, codes, scales, amax, per_token, q, r, pm)
    if status:
        raise RuntimeError(f"hq_quantize CUDA kernel: {STATUS.get(status, status)}")
    return codes, scales

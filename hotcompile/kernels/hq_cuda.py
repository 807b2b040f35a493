"""The CUDA C++ fused Hadamard + quantize of HQ's g_x operand (``csrc/hq_quantize.cu``).

Same contract and bit-identical results as :func:`hotcompile.kernels.hq_triton.hq_quantize` for
``nearest`` and ``pseudo_stochastic`` rounding (the Triton kernel keeps ``stochastic``). Why a
second implementation: here each thread owns whole 16-blocks, so the butterfly stays in
registers and the codes leave as one 16-byte store per block; Triton splits a 16-block across
threads and pays layout conversions (its kernel ran at about a third of the HBM roofline).

Built just-in-time with ``torch.utils.cpp_extension`` (no CUTLASS needed: seconds to a minute),
cached like the CUTLASS GEMMs (``hotcompile.kernels.cutlass.cache_dir``), for the current GPU's
architecture. :func:`available` never raises; a failed build is warned once and the Triton
kernel runs.
"""

from __future__ import annotations

import hashlib
import pathlib
import sys
import threading
import time
import warnings
from types import ModuleType

import torch

from hotcompile.hadamard import padded
from hotcompile.quant import PSEUDO_BITS, qmax

NAME = "hotcompile_hq_quantize"
SOURCES = ("hq_quantize.cu", "hq_quantize_bindings.cpp")
HEADERS = ("hq_quantize.h",)
ROUNDINGS = {"nearest": 0, "pseudo_stochastic": 1}
#: the kernel keeps a row in registers: 256 threads × 4 blocks × 16 columns (wider: Triton)
MAX_COLUMNS = 256 * 4 * 16
STATUS = {1: "arguments refused", 2: "row too long", 3: "kernel launch failed"}

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None


def _src() -> pathlib.Path | None:
    from hotcompile.kernels import cutlass

    d = cutlass.csrc_dir()
    if d is not None and all((d / f).is_file() for f in SOURCES + HEADERS):
        return d
    return None


def _flags() -> list[str]:
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
    return ["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def _fail(reason: str) -> None:
    global _error
    if _error is None:
        _error = reason
        warnings.warn(
            f"hotcompile: CUDA quantize kernel unavailable ({reason}); using the Triton kernel",
            RuntimeWarning,
            stacklevel=3,
        )


def build(verbose: bool = False) -> bool:
    """Build (or load from the cache) the extension; True when usable. Failures are final."""
    global _module
    with _lock:
        if _module is not None or _error is not None:
            return _module is not None
        try:
            from hotcompile.kernels import cutlass

            if not torch.cuda.is_available() or torch.version.cuda is None:
                _fail("no CUDA device (or a CPU-only torch)")
                return False
            if cutlass.nvcc_path() is None:
                _fail("nvcc not found (set CUDA_HOME)")
                return False
            src = _src()
            if src is None:
                _fail("csrc/hq_quantize*.{cu,cpp,h} are not installed with hotcompile")
                return False
            from torch.utils.cpp_extension import load

            h = hashlib.sha256()
            for f in SOURCES + HEADERS:
                h.update((src / f).read_bytes())
            for part in (*_flags(), torch.__version__, sys.version):
                h.update(part.encode())
            bdir = cutlass.cache_dir() / f"{NAME}-{h.hexdigest()[:16]}"
            cached = any(bdir.glob(f"{NAME}*.so"))
            bdir.mkdir(parents=True, exist_ok=True)
            if not cached:
                print(
                    f"hotcompile: building the CUDA quantize kernel in {bdir} ...", file=sys.stderr
                )
            t0 = time.perf_counter()
            _module = load(
                name=NAME,
                sources=[str(src / f) for f in SOURCES],
                extra_include_paths=[str(src)],
                extra_cuda_cflags=_flags(),
                build_directory=str(bdir),
                verbose=verbose,
            )
            if not cached:
                dt = time.perf_counter() - t0
                print(f"hotcompile: CUDA quantize kernel built in {dt:.0f} s", file=sys.stderr)
            return True
        except Exception as e:  # noqa: BLE001 - a failed build means "fall back"
            msg = str(e).strip().splitlines()
            _fail(f"build failed: {type(e).__name__}: {msg[-1] if msg else ''}")
            return False


def available() -> bool:
    """True when the kernel can run here (builds it on the first call); never raises."""
    return _module is not None or (_error is None and build())


def supported(gy: torch.Tensor, rounding: str, out_dtype: torch.dtype) -> bool:
    return (
        gy.is_cuda
        and gy.dim() == 2
        and gy.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and rounding in ROUNDINGS
        and out_dtype in (torch.float8_e4m3fn, torch.int8)
        and padded(gy.shape[1], 16) <= MAX_COLUMNS
    )


def hq_quantize(
    gy: torch.Tensor,
    bits: int,
    per_token: bool,
    rounding: str,
    out_dtype: torch.dtype,
    pad_rows_to: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes [L_out, O_pad], scales)`` exactly as ``hq_triton.hq_quantize`` returns them."""
    if gy.stride(-1) != 1:
        gy = gy.contiguous()
    L, O = gy.shape
    o_pad, l_out = padded(O, 16), padded(L, pad_rows_to)
    codes = torch.empty((l_out, o_pad), dtype=out_dtype, device=gy.device)
    scales = torch.empty((l_out if per_token else 1,), dtype=torch.float32, device=gy.device)
    amax = torch.zeros((1,), dtype=torch.int32, device=gy.device)
    if _module is None or not supported(gy, rounding, out_dtype):
        raise ValueError(f"hq_cuda.hq_quantize does not take {gy.dtype}{tuple(gy.shape)}")
    q, r, pm = float(qmax(bits)), ROUNDINGS[rounding], PSEUDO_BITS[bits]
    status = _module.hq_quantize(gy, codes, scales, amax, per_token, q, r, pm)
    if status:
        raise RuntimeError(f"hq_quantize CUDA kernel: {STATUS.get(status, status)}")
    return codes, scales

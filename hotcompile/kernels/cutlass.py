"""CUTLASS sm_90a scaled GEMMs (FP8 e4m3 and INT8) with the dequantization in the epilogue.

Why: HOT's backward multiplies quantized codes and then rescales the product by per-row /
per-column / per-tensor scales. ``torch._int_mm`` is barely faster than bf16 on Hopper and needs
a separate dequant pass over the int32 result; ``torch._scaled_mm`` covers FP8 only. The kernels
in ``csrc/`` (CUTLASS 3.x, warp-specialized TMA + wgmma) compute
``alpha * scale_a[m] * scale_b[n] * (a @ b.T)`` in one pass for both dtypes, write bf16 or fp32,
and can accumulate into an fp32 gradient.

They are built just-in-time with ``torch.utils.cpp_extension.load`` on first use (or by
``hotcompile build``) and cached under ``$HOTCOMPILE_CACHE_DIR`` (default
``~/.cache/hotcompile``) in a directory keyed by a hash of the sources and flags. Nothing here
is required: :func:`available` is False (never raises) without CUDA, on a GPU other than sm_90,
without nvcc or the CUTLASS headers (``pip install nvidia-cutlass``), or when the build fails;
callers then use the Triton / torch kernels.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

import torch

from hotcompile.kernels import jit
from hotcompile.kernels.jit import cache_dir, nvcc_path  # noqa: F401  (part of this API)

NAME = "hotcompile_cutlass"

#: translation units, in build order (the four instance files are the slow ones; ninja builds
#: them in parallel)
SOURCES = (
    "hot_gemm.cu",
    "hot_gemm_fp8_bf16.cu",
    "hot_gemm_fp8_f32.cu",
    "hot_gemm_int8_bf16.cu",
    "hot_gemm_int8_f32.cu",
    "hot_gemm_bindings.cpp",
)
HEADERS = ("hot_gemm.cuh",)

#: nvcc flags of the kernels. -DNDEBUG matters for speed: device asserts are function calls
#: that make ptxas serialize the wgmma pipeline (warning C7510).
NVCC_FLAGS = (
    "-gencode=arch=compute_90a,code=sm_90a",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-O3",
    "-DNDEBUG",
)
CXX_FLAGS = ("-O3", "-DNDEBUG")

#: valid ``config`` ids per A/B dtype, for a dispatcher that times them and keeps the fastest:
#: 0 cooperative 128x128x128 cluster 2x1 with CUTLASS's stream-K/split-K heuristic (good for
#: long K and few output tiles, e.g. g_w), 1 ping-pong 128x128x128 cluster 2x1 (FP8:
#: 64x128x128; short K, many tiles, e.g. g_x), 2 the cooperative kernel without stream-K.
CONFIGS: dict[str, list[int]] = {"float8_e4m3fn": [0, 1, 2], "int8": [0, 1, 2]}

#: rough first-build time: 4 instance files of ~1-1.5 CPU-minutes each, built in parallel
BUILD_MINUTES = {"2 cores": 4, "16 cores": 2}


def cutlass_include_dirs() -> list[str] | None:
    """CUTLASS's ``include/`` and ``tools/util/include/``, or None when they are missing.

    ``$CUTLASS_PATH`` (a CUTLASS checkout) wins; otherwise the headers that the
    ``nvidia-cutlass`` wheel ships under ``cutlass_library/source``. The module is located with
    ``find_spec`` rather than imported: importing it pulls in cuda-python for nothing.
    """
    roots = []
    if os.environ.get("CUTLASS_PATH"):
        roots.append(pathlib.Path(os.environ["CUTLASS_PATH"]))
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        roots.append(pathlib.Path(spec.origin).parent / "source")
    for root in roots:
        inc, util = root / "include", root / "tools" / "util" / "include"
        if (inc / "cutlass" / "cutlass.h").is_file() and (
            util / "cutlass" / "util" / "packed_stride.hpp"
        ).is_file():
            return [str(inc), str(util)]
    return None


def unavailable_reason() -> str | None:
    """Why the kernels cannot be built or run here (None when they can). Never raises."""
    try:
        reason = jit.cuda_unavailable()
        if reason is not None:
            return reason
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) != (9, 0):
            return f"the GPU is sm_{major}{minor}; the kernels are built for sm_90a (H100/H200)"
        if cutlass_include_dirs() is None:
            return "CUTLASS headers not found (pip install nvidia-cutlass, or set CUTLASS_PATH)"
        if csrc_dir() is None:
            return "the CUDA sources (csrc/hot_gemm*.cu) are not installed with hotcompile"
    except Exception as e:  # noqa: BLE001 - availability must never raise
        return f"{type(e).__name__}: {e}"
    return None


def csrc_dir() -> pathlib.Path | None:
    """The directory holding ``hot_gemm.cu`` and its siblings (see :func:`jit.csrc_dir`)."""
    return jit.csrc_dir(SOURCES + HEADERS)


def build_dir(src: pathlib.Path, includes: list[str]) -> pathlib.Path:
    """Build directory keyed by the sources, flags, CUTLASS headers, torch and Python versions,
    so an edit or an upgrade rebuilds and an unchanged setup loads the cached module."""
    return EXTENSION.build_dir(src, [str(src), *includes])


EXTENSION = jit.Extension(
    NAME,
    "CUTLASS kernels",
    SOURCES,
    HEADERS,
    nvcc_flags=lambda: NVCC_FLAGS,
    cxx_flags=CXX_FLAGS,
    include_dirs=lambda: cutlass_include_dirs() or [],
    unavailable=unavailable_reason,
    duration=f"~{BUILD_MINUTES['16 cores']}-{BUILD_MINUTES['2 cores']} min",
)


def build(verbose: bool = False) -> bool:
    """Build (or load from the cache) the extension now; True when it is usable.

    Called lazily by :func:`available`; call it up front (or run ``hotcompile build``) to pay
    the one-off compile time before training rather than inside the first backward. A failure
    is remembered for the process, so it is reported once and never retried per call.
    """
    return EXTENSION.build(verbose)


def available() -> bool:
    """True when the CUTLASS kernels can run here (builds them on the first call).

    Never raises; the reason for False is warned once and kept in :func:`error`.
    """
    return EXTENSION.available()


def error() -> str | None:
    """Why :func:`available` returned False (None if it did not, or was not asked yet)."""
    return EXTENSION.error


def config_names() -> list[str]:
    """Human-readable description of every config id (needs the built module)."""
    return list(EXTENSION.module.config_names()) if available() and EXTENSION.module else []


_AB_DTYPES = (torch.float8_e4m3fn, torch.int8)
_OUT_DTYPES = (torch.bfloat16, torch.float32)


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


def _scale(s: torch.Tensor | float, n: int, device: torch.device) -> torch.Tensor | None:
    """Scale as a 16-byte aligned contiguous fp32 tensor of 1 or n entries, or None."""
    if not isinstance(s, torch.Tensor):
        return torch.full((1,), float(s), dtype=torch.float32, device=device)
    if s.device != device or not (s.numel() == 1 or s.numel() == n):
        return None
    s = s.reshape(-1).to(torch.float32).contiguous()
    return s if _aligned(s) else s.clone()


def unsupported_reason(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    config: int = 0,
    require_cuda: bool = True,
) -> str | None:
    """Why :func:`scaled_gemm` cannot take these operands, or None when it can.

    Pure checks that build nothing. The rules are the kernels' own (TMA wants 16-byte aligned
    rows and bases), so the C++ side never raises on a call that passed here.
    ``require_cuda=False`` checks everything but the device (used by the CPU tests).
    """
    if a.dim() != 2 or b.dim() != 2:
        return "a and b must be 2-D"
    if a.dtype not in _AB_DTYPES or b.dtype != a.dtype:
        return f"a and b must both be float8_e4m3fn or both int8, got {a.dtype} and {b.dtype}"
    if require_cuda and (a.device.type != "cuda" or b.device != a.device):
        return "a and b must be on one CUDA device"
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        return f"a is [M, K] and b is [N, K]; got {tuple(a.shape)} and {tuple(b.shape)}"
    if min(m, n, k) <= 0 or m % 16 or n % 16 or k % 16 or max(m, n, k) >= 2**31:
        return f"M, N, K must be positive multiples of 16; got {m}, {n}, {k}"
    if not (a.is_contiguous() and b.is_contiguous()):
        return "a [M, K] and b [N, K] must be contiguous"
    if not (_aligned(a) and _aligned(b)):
        return "a and b must start 16-byte aligned"
    if config not in CONFIGS[str(a.dtype).removeprefix("torch.")]:
        return f"config {config} is not one of {CONFIGS[str(a.dtype).removeprefix('torch.')]}"
    if out is None:
        return None if out_dtype in _OUT_DTYPES else f"out_dtype {out_dtype} not bf16/fp32"
    if out.dtype != torch.float32 or tuple(out.shape) != (m, n):
        return "out (accumulate) must be a float32 [M, N] tensor"
    if out.device != a.device or not out.is_contiguous() or not _aligned(out):
        return "out must be contiguous, 16-byte aligned, on the device of a"
    return None


def scaled_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | float,
    scale_b: torch.Tensor | float,
    alpha: float = 1.0,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    config: int = 0,
) -> torch.Tensor | None:
    """``alpha * scale_a[:, None] * scale_b[None, :] * (a.float() @ b.float().T)`` in one kernel.

    a ``[M, K]`` and b ``[N, K]`` are both K-contiguous and both ``float8_e4m3fn`` (fp32
    accumulation, promoted per 128-deep k-tile, so INT4-grid codes are exact while
    ``|sum| < 2**24``) or both ``int8`` (exact int32 accumulation). scale_a holds M entries or
    one, scale_b N entries or one (fp32 tensors on the same device, or Python floats).
    Returns a new ``[M, N]`` tensor of ``out_dtype`` (bf16 or fp32); with ``out`` (fp32,
    contiguous ``[M, N]``) the product is added into it (gradient accumulation) and ``out`` is
    returned. Returns None, doing nothing, when the shapes, dtypes or device are not supported
    (M, N, K multiples of 16, 16-byte aligned bases) or the kernels are unavailable, so the
    caller falls back to its own path.
    """
    if unsupported_reason(a, b, out_dtype, out, config) is not None:
        return None
    m, n = a.shape[0], b.shape[0]
    sa = _scale(scale_a, m, a.device)
    sb = _scale(scale_b, n, a.device)
    if sa is None or sb is None or not available():
        return None
    accumulate = out is not None
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    assert EXTENSION.module is not None
    # the extension reports a refused call as a message built without iostreams (on the
    # device machine any ostringstream in a JIT-built extension, so any TORCH_CHECK message,
    # killed the process: experiments/extension_iostream_probe.py)
    why = EXTENSION.module.scaled_gemm(a, b, sa, sb, float(alpha), out, accumulate, int(config))
    if why:
        raise RuntimeError(why)
    return out

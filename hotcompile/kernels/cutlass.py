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

import hashlib
import importlib.util
import os
import pathlib
import shutil
import sys
import threading
import time
import warnings
from types import ModuleType

import torch

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

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None  # why the kernels are unavailable; set once, never retried


def csrc_dir() -> pathlib.Path | None:
    """The directory holding ``hot_gemm.cu``.

    Looked up (in order) in ``$HOTCOMPILE_CSRC``, the installed package data
    (``hotcompile/csrc``, see pyproject.toml) and the repository root (editable installs).
    """
    here = pathlib.Path(__file__).resolve()
    candidates = []
    if os.environ.get("HOTCOMPILE_CSRC"):
        candidates.append(pathlib.Path(os.environ["HOTCOMPILE_CSRC"]))
    candidates += [here.parents[1] / "csrc", here.parents[2] / "csrc"]
    for c in candidates:
        if all((c / f).is_file() for f in SOURCES + HEADERS):
            return c
    return None


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


def nvcc_path() -> str | None:
    """nvcc from ``$CUDA_HOME`` (as torch finds it) or ``PATH``."""
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def cache_dir() -> pathlib.Path:
    """Root of the build cache (``$HOTCOMPILE_CACHE_DIR``, else ``~/.cache/hotcompile``)."""
    if os.environ.get("HOTCOMPILE_CACHE_DIR"):
        return pathlib.Path(os.environ["HOTCOMPILE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "hotcompile"


def build_dir(src: pathlib.Path, includes: list[str]) -> pathlib.Path:
    """Build directory keyed by the sources, flags, CUTLASS headers, torch and Python versions,
    so an edit or an upgrade rebuilds and an unchanged setup loads the cached module."""
    h = hashlib.sha256()
    for f in SOURCES + HEADERS:
        h.update(f.encode() + b"\0" + (src / f).read_bytes())
    for part in (*NVCC_FLAGS, *CXX_FLAGS, *includes, torch.__version__, sys.version):
        h.update(part.encode() + b"\0")
    return cache_dir() / f"{NAME}-{h.hexdigest()[:16]}"


def unavailable_reason() -> str | None:
    """Why the kernels cannot be built or run here (None when they can). Never raises."""
    try:
        if not torch.cuda.is_available() or torch.version.cuda is None:
            return "no CUDA device (or a CPU-only torch)"
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) != (9, 0):
            return f"the GPU is sm_{major}{minor}; the kernels are built for sm_90a (H100/H200)"
        if nvcc_path() is None:
            return "nvcc not found (set CUDA_HOME)"
        if cutlass_include_dirs() is None:
            return "CUTLASS headers not found (pip install nvidia-cutlass, or set CUTLASS_PATH)"
        if csrc_dir() is None:
            return "the CUDA sources (csrc/hot_gemm*.cu) are not installed with hotcompile"
    except Exception as e:  # noqa: BLE001 - availability must never raise
        return f"{type(e).__name__}: {e}"
    return None


def _fail(reason: str) -> None:
    global _error
    if _error is None:
        _error = reason
        warnings.warn(
            f"hotcompile: CUTLASS kernels unavailable ({reason}); using the Triton/torch kernels",
            RuntimeWarning,
            stacklevel=3,
        )


def build(verbose: bool = False) -> bool:
    """Build (or load from the cache) the extension now; True when it is usable.

    Called lazily by :func:`available`; call it up front (or run ``hotcompile build``) to pay
    the one-off compile time before training rather than inside the first backward. A failure
    is remembered for the process, so it is reported once and never retried per call.
    """
    global _module
    with _lock:
        if _module is not None:
            return True
        if _error is not None:
            return False
        reason = unavailable_reason()
        if reason is not None:
            _fail(reason)
            return False
        try:
            from torch.utils.cpp_extension import load

            src = csrc_dir()
            includes = cutlass_include_dirs()
            assert src is not None and includes is not None
            bdir = build_dir(src, includes)
            cached = any(bdir.glob(f"{NAME}*.so"))
            bdir.mkdir(parents=True, exist_ok=True)
            if not cached:
                print(
                    "hotcompile: building CUTLASS kernels for sm_90a (first use, ~"
                    f"{BUILD_MINUTES['16 cores']}-{BUILD_MINUTES['2 cores']} min) in {bdir} ...",
                    file=sys.stderr,
                    flush=True,
                )
            t0 = time.perf_counter()
            _module = load(
                name=NAME,
                sources=[str(src / f) for f in SOURCES],
                extra_include_paths=[str(src), *includes],
                extra_cflags=list(CXX_FLAGS),
                extra_cuda_cflags=list(NVCC_FLAGS),
                build_directory=str(bdir),
                with_cuda=True,
                verbose=verbose,
            )
            if not cached:
                print(
                    f"hotcompile: CUTLASS kernels built in {time.perf_counter() - t0:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            return True
        except Exception as e:  # noqa: BLE001 - a failed build means "fall back", not a crash
            msg = str(e).strip().splitlines()
            _fail(f"build failed: {type(e).__name__}: {msg[-1] if msg else ''}")
            return False


def available() -> bool:
    """True when the CUTLASS kernels can run here (builds them on the first call).

    Never raises; the reason for False is warned once and kept in :func:`error`.
    """
    if _module is not None:
        return True
    if _error is not None:
        return False
    return build()


def error() -> str | None:
    """Why :func:`available` returned False (None if it did not, or was not asked yet)."""
    return _error


def config_names() -> list[str]:
    """Human-readable description of every config id (needs the built module)."""
    return list(_module.config_names()) if available() and _module is not None else []


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
    assert _module is not None
    return _module.scaled_gemm(a, b, sa, sb, float(alpha), out, accumulate, int(config))

"""Just-in-time builds of hotcompile's C++/CUDA extensions (``csrc/``), shared by every one.

Each extension (the CUTLASS GEMMs, the CUDA quantize kernel) is an :class:`Extension`: built
with ``torch.utils.cpp_extension.load`` on first use, cached in a directory keyed by a hash of
its sources, flags, torch and Python versions (an edit or an upgrade rebuilds, an unchanged
setup loads the cached module in a second), built at most once per process, and never fatal:
when it cannot be built the reason is warned once, remembered, and callers fall back to the
Triton / torch kernels.
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
from collections.abc import Callable, Sequence
from types import ModuleType

import torch


def csrc_dir(files: Sequence[str] = ()) -> pathlib.Path | None:
    """The directory holding the C++/CUDA sources (all of ``files``, when given).

    Looked up (in order) in ``$HOTCOMPILE_CSRC``, the installed package data
    (``hotcompile/csrc``, see pyproject.toml) and the repository root (editable installs).
    """
    here = pathlib.Path(__file__).resolve()
    candidates = []
    if os.environ.get("HOTCOMPILE_CSRC"):
        candidates.append(pathlib.Path(os.environ["HOTCOMPILE_CSRC"]))
    candidates += [here.parents[1] / "csrc", here.parents[2] / "csrc"]
    for c in candidates:
        if c.is_dir() and all((c / f).is_file() for f in files):
            return c
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


class Extension:
    """One JIT-built extension. ``unavailable()`` says why it cannot be built here (None when
    it can: checked before any compiler runs); ``nvcc_flags()``/``include_dirs()`` are called
    at build time (they may depend on the GPU)."""

    def __init__(
        self,
        name: str,
        what: str,
        sources: Sequence[str],
        headers: Sequence[str] = (),
        nvcc_flags: Callable[[], Sequence[str]] = tuple,
        cxx_flags: Sequence[str] = (),
        include_dirs: Callable[[], Sequence[str]] = tuple,
        unavailable: Callable[[], str | None] = lambda: None,
        duration: str = "",
        with_cuda: bool = True,
    ) -> None:
        self.name, self.what, self.duration = name, what, duration
        self.sources, self.headers = tuple(sources), tuple(headers)
        self.nvcc_flags, self.cxx_flags = nvcc_flags, tuple(cxx_flags)
        self.include_dirs, self.unavailable = include_dirs, unavailable
        self.with_cuda = with_cuda
        self.module: ModuleType | None = None
        self.error: str | None = None  # why it is unavailable; set once, never retried
        self._lock = threading.Lock()

    def src(self) -> pathlib.Path | None:
        return csrc_dir(self.sources + self.headers)

    def build_dir(self, src: pathlib.Path, includes: Sequence[str]) -> pathlib.Path:
        """The cache directory of this source/flag/toolchain combination."""
        h = hashlib.sha256()
        for f in self.sources + self.headers:
            h.update(f.encode() + b"\0" + (src / f).read_bytes())
        flags = (*self.nvcc_flags(), *self.cxx_flags, *includes, torch.__version__, sys.version)
        for part in flags:
            h.update(part.encode() + b"\0")
        return cache_dir() / f"{self.name}-{h.hexdigest()[:16]}"

    def fail(self, reason: str) -> None:
        if self.error is None:
            self.error = reason
            warnings.warn(
                f"hotcompile: {self.what} unavailable ({reason}); using the Triton/torch kernels",
                RuntimeWarning,
                stacklevel=4,
            )

    def build(self, verbose: bool = False) -> bool:
        """Build (or load from the cache) now; True when usable. A failure is final."""
        with self._lock:
            if self.module is not None or self.error is not None:
                return self.module is not None
            try:
                reason = self.unavailable()
                src = self.src()
                if reason is None and src is None:
                    reason = f"the sources ({', '.join(self.sources)}) are not installed"
                if reason is not None:
                    self.fail(reason)
                    return False
                from torch.utils.cpp_extension import load

                includes = [str(src), *self.include_dirs()]
                bdir = self.build_dir(src, includes)
                built = sorted(bdir.glob(f"{self.name}*.so"), key=lambda f: f.stat().st_mtime)
                cached = bool(built)
                if cached and self._import(built[-1]):
                    return True
                bdir.mkdir(parents=True, exist_ok=True)
                if not cached:
                    took = f" (first use, {self.duration})" if self.duration else ""
                    print(f"hotcompile: building {self.what}{took} in {bdir} ...", file=sys.stderr)
                t0 = time.perf_counter()
                self.module = load(
                    name=self.name,
                    sources=[str(src / f) for f in self.sources],
                    extra_include_paths=includes,
                    extra_cflags=list(self.cxx_flags),
                    extra_cuda_cflags=list(self.nvcc_flags()),
                    build_directory=str(bdir),
                    with_cuda=self.with_cuda,
                    verbose=verbose,
                )
                if not cached:
                    dt = time.perf_counter() - t0
                    print(f"hotcompile: {self.what} built in {dt:.0f} s", file=sys.stderr)
                return True
            except Exception as e:  # noqa: BLE001 - a failed build means "fall back"
                msg = str(e).strip().splitlines()
                self.fail(f"build failed: {type(e).__name__}: {msg[-1] if msg else ''}")
                return False

    def _import(self, so: pathlib.Path) -> bool:
        """Load an already built library straight from the cache. ``bdir`` is keyed by the
        sources, flags, torch and Python, so a library there was built from exactly these; this
        skips ninja's up-to-date check (a second or two per process) and lets a cache directory
        that holds only the ``.so`` (copied from another machine) be used without a rebuild.
        False (then ``load`` rebuilds) if the file cannot be imported, e.g. a half-written one."""
        try:
            # torch names a rebuild in the same process ``name_v1``: the module is the file's stem
            spec = importlib.util.spec_from_file_location(so.stem, so)
            if spec is None or spec.loader is None:
                return False
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - any failure means "build it again"
            return False
        self.module = module
        return True

    def available(self) -> bool:
        """True when the extension can run here (builds it on the first call); never raises."""
        return self.module is not None or (self.error is None and self.build())


def cuda_unavailable() -> str | None:
    """Why no CUDA extension can be built or run here (None when it can). Never raises."""
    try:
        if not torch.cuda.is_available() or torch.version.cuda is None:
            return "no CUDA device (or a CPU-only torch)"
        if nvcc_path() is None:
            return "nvcc not found (set CUDA_HOME)"
    except Exception as e:  # noqa: BLE001 - availability must never raise
        return f"{type(e).__name__}: {e}"
    return None

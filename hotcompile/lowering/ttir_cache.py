"""Compile time: each HOT kernel's Triton IR is generated once per argument signature.

To functionalize a ``wrap_triton`` launch and to lower it, torch asks which of the kernel's
tensor arguments it reads and writes, and answers by compiling the kernel to Triton IR (TTIR)
and walking it (``torch._higher_order_ops.triton_kernel_wrap.generate_ttir``), with no cache:
once per launch in AOT's trace, again in inductor's lowering. A HOT layer launches HOT's two
quantize kernels 3-4 times, so a model of 85 HOT layers asked for several hundred identical
compilations (``experiments/results/compile_time_h100.md``: ~6 s of compile per HOT layer, mostly in
``aot_trace_joint_graph`` and ``GraphLowering.run``).

What ``generate_ttir`` builds depends only on the kernel and on its arguments' *signature*:
it replaces every fake tensor / inductor buffer by ``torch.empty(2, dtype)`` and every
symbolic size by 2 before compiling, and passes the other values (ints, floats, constexprs)
as they are. So a key of (kernel, dtypes of the tensors, the other values) determines the
result exactly, and a hit returns what a fresh call would have built. The cache is applied
only to HOT's own kernels (other Triton kernels a model launches go through torch
untouched), never to launches with real tensors (Triton specializes on their addresses) or
TMA descriptors, and can be turned off with ``HOTCOMPILE_TTIR_CACHE=0``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch

_LOCK = threading.Lock()
_KERNELS: dict[int, Any] = {}  # id -> JITFunction (kept alive: the ids stay valid)
_CACHE: dict[tuple, tuple[Any, list[str], tuple[str, ...]]] = {}
STATS = {"hits": 0, "misses": 0, "bypassed": 0}


def enabled() -> bool:
    """``HOTCOMPILE_TTIR_CACHE=0`` turns the cache off (for A/B timing or if in doubt)."""
    return os.environ.get("HOTCOMPILE_TTIR_CACHE", "1") != "0"


def _arg_key(value: Any) -> tuple | None:
    """What ``generate_ttir`` keeps of one argument, or None where it keeps more (a real
    tensor, whose address Triton specializes on) or the value is not hashable."""
    import sympy
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, sympy.Expr)):
        return ("sym",)
    if isinstance(value, FakeTensor):
        return ("tensor", str(value.dtype))
    if isinstance(value, torch.Tensor):
        return None
    if type(value).__name__ == "TensorBox" and hasattr(value, "get_dtype"):
        return ("tensor", str(value.get_dtype()))
    try:
        hash(value)
    except TypeError:
        return None
    return ("value", type(value).__name__, value)


def _key(kernel: Any, kwargs: dict[str, Any], rest: tuple) -> tuple | None:
    if any(r for r in rest):  # TMA descriptor metadata: not cached
        return None
    parts = []
    for name in sorted(kwargs):
        k = _arg_key(kwargs[name])
        if k is None:
            return None
        parts.append((name, k))
    return (id(kernel), tuple(parts))


def _base(kernel: Any) -> Any:
    """The JITFunction behind an Autotuner (``generate_ttir`` unwraps it the same way)."""
    return getattr(kernel, "fn", kernel) if hasattr(kernel, "configs") else kernel


def _wrap(original: Callable) -> Callable:
    def generate_ttir(kernel: Any, kwargs: dict[str, Any], *rest: Any) -> Any:
        base = _base(kernel)
        key = _key(base, kwargs, rest) if enabled() and id(base) in _KERNELS else None
        if key is None:
            STATS["bypassed"] += 1
            return original(kernel, kwargs, *rest)
        with _LOCK:
            hit = _CACHE.get(key)
        if hit is None:
            before = set(kwargs)
            module, names = original(kernel, kwargs, *rest)
            popped = tuple(sorted(before - set(kwargs)))
            with _LOCK:
                _CACHE[key] = (module, list(names), popped)
            STATS["misses"] += 1
            return module, names
        module, names, popped = hit
        for name in popped:  # the uncached call drops backend options from kwargs in place
            kwargs.pop(name, None)
        STATS["hits"] += 1
        return module, list(names)

    generate_ttir.__wrapped__ = original  # type: ignore[attr-defined]
    generate_ttir._hotcompile_ttir_cache = True  # type: ignore[attr-defined]
    return generate_ttir


def install(kernels: Iterable[Any]) -> bool:
    """Cache the TTIR of ``kernels`` (Triton JITFunctions). Idempotent; returns False (and
    changes nothing) on a torch without ``triton_kernel_wrap.generate_ttir``."""
    try:
        from torch._higher_order_ops import triton_kernel_wrap as tkw
    except ImportError:
        return False
    original = getattr(tkw, "generate_ttir", None)
    if original is None:
        return False
    with _LOCK:
        for k in kernels:
            _KERNELS[id(_base(k))] = _base(k)
        if not getattr(original, "_hotcompile_ttir_cache", False):
            tkw.generate_ttir = _wrap(original)
    return True


def clear() -> None:
    """Drop the cached modules (tests; the cache is otherwise per process)."""
    with _LOCK:
        _CACHE.clear()
        for k in STATS:
            STATS[k] = 0

"""What a training graph keeps alive for its backward: the saved tensors, measured.

The partitioner decides what the compiled forward saves; the honest measure is to run the
forward and read the tensors the autograd graph holds. ``saved_tensors`` walks the autograd
graph from an output and lists every saved tensor once (by storage); parameters and buffers
are excluded by ``saved_activation_bytes`` since they are alive anyway.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch


@dataclasses.dataclass(frozen=True)
class SavedTensor:
    """One tensor saved for the backward."""

    node: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    storage: int


def _storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:  # pragma: no cover - tensors without storage
        return id(t)


def saved_tensors(outputs: torch.Tensor | Iterable[torch.Tensor]) -> list[SavedTensor]:
    """Every distinct tensor saved by the autograd graph behind ``outputs``."""
    if isinstance(outputs, torch.Tensor):
        outputs = [outputs]
    stack = [o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn]
    seen_fn: set[int] = set()
    seen_storage: set[int] = set()
    found: list[SavedTensor] = []
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen_fn:
            continue
        seen_fn.add(id(fn))
        tensors: list[torch.Tensor] = []
        try:
            tensors = [t for t in fn.saved_tensors if isinstance(t, torch.Tensor)]
        except (AttributeError, RuntimeError):
            for attr in dir(fn):  # eager autograd nodes expose _saved_<name>
                if attr.startswith("_saved_"):
                    v = getattr(fn, attr, None)
                    if isinstance(v, torch.Tensor):
                        tensors.append(v)
        for t in tensors:
            key = _storage_key(t)
            if key in seen_storage:
                continue
            seen_storage.add(key)
            nbytes = t.untyped_storage().nbytes()
            found.append(SavedTensor(type(fn).__name__, tuple(t.shape), t.dtype, nbytes, key))
        stack.extend(f for f, _ in fn.next_functions if f is not None)
    return found


def saved_activation_bytes(
    outputs: torch.Tensor | Iterable[torch.Tensor], module: torch.nn.Module | None = None
) -> int:
    """Bytes of saved tensors, excluding ``module``'s parameters and buffers."""
    exclude: set[int] = set()
    if module is not None:
        for t in [*module.parameters(), *module.buffers()]:
            exclude.add(_storage_key(t))
    return sum(s.nbytes for s in saved_tensors(outputs) if s.storage not in exclude)

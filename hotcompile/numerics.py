"""NaN/Inf guards of the HOT backward.

Quantization must never turn a NaN or Inf gradient into a finite number (a max-abs scale of
NaN/Inf makes every dequantized value non-finite, see ``quant``), and the user must learn
which layer it reached first. ``check_scale`` is called by the backward ops with the scale of
each quantized operand they read: a non-finite scale means a non-finite operand. What is
watched, exactly (the scales already exist, so watching costs no extra pass over the data):

- ``"g_x"``: the layer's incoming gradient g_y, as the HQ g_x path quantizes it;
- ``"g_w"``: g_y again, as the HLA g_w path quantizes it;
- ``"x"``: the layer's input x, as the g_w path reads it (the codes ABC saved in the forward,
  or x compressed in the backward with ``abc=False``). A NaN/Inf in the model's input shows
  up here at the first HOT layer that computes g_w from it, even where the gradient flowing
  back is finite (a ReLU, or a loss that ignores the row, stops it in g_y).

Not watched: layers on the native lowering (``HotConfig.lowering``: linear layers compiled
for CUDA by default), whose backward has no host code to check from; the weight; the g_w path
of a ``gx_only`` layer (it has none) and of ``exact`` layers or ``gw_bits=None`` (no
quantized g_w operand); and anything outside HOT layers. Each layer is reported once per
process (``reset`` forgets).

On CUDA the check must not stall the GPU: reading a device value on the host waits for all
queued work, so a per-layer check in every backward would serialise host and device (and is
illegal while a CUDA graph is being captured). There the largest scale is copied into a slot
of a pinned host ring without blocking and read once its event has completed — at a later
HOT backward or when :func:`nonfinite_layers` is asked — so a report can arrive a step late.
Inside CUDA-graph capture nothing is checked (replays run no Python); the NaN/Inf still
propagates.
"""

from __future__ import annotations

import collections
import logging
import math

import torch

log = logging.getLogger("hotcompile")

_reported: dict[str, str] = {}
#: pinned float32 slots the CUDA checks copy their largest scale into (allocated once: a pinned
#: allocation per check cost ~100 µs of host time)
RING = 1024
_flags: torch.Tensor | None = None
_cursor = 0
#: CUDA checks in flight, oldest first: (layer, path, slot, event after its copy)
_pending: collections.deque[tuple[str, str, int, torch.cuda.Event]] = collections.deque()
_busy: set[int] = set()


def _report(layer: str, path: str) -> None:
    if layer in _reported:
        return
    _reported[layer] = path
    if path == "x":
        log.warning(
            "hotcompile: a NaN/Inf in the input x of layer %r reached its HOT backward (the g_w "
            "path reads x's codes); its weight gradient is NaN/Inf. Later occurrences in this "
            "layer are not reported.",
            layer,
        )
        return
    log.warning(
        "hotcompile: a NaN/Inf gradient reached the HOT backward of layer %r (%s path); it "
        "propagates as NaN/Inf. Later occurrences in this layer are not reported.",
        layer,
        path,
    )


def _poll(wait: bool = False) -> None:
    """Report the CUDA checks whose copies have landed (all of them with ``wait``), oldest
    first, stopping at the first still in flight: checks complete in the order they were
    queued on a stream, so each call looks at few events, not all of them."""
    while _pending:
        layer, path, slot, event = _pending[0]
        if wait:
            event.synchronize()
        elif not event.query():
            return
        _pending.popleft()
        _busy.discard(slot)
        if not math.isfinite(float(_flags[slot])):
            _report(layer, path)


# the device-facing steps of the CUDA check, one function each (tests/test_numerics.py runs
# the ring's bookkeeping on the CPU through fakes of these four)
def _deferred(scale: torch.Tensor) -> bool:
    """Whether ``scale`` is checked without a host sync (on CUDA) or right away."""
    return scale.device.type == "cuda"


def _capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


def _host_buffer(n: int) -> torch.Tensor:
    return torch.empty((n,), dtype=torch.float32, pin_memory=True)


def _recorded_event() -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record()
    return event


def check_scale(scale: torch.Tensor, layer: str, path: str) -> None:
    """Warn once per layer when ``scale`` is NaN/Inf (on CUDA without a host sync: see the
    module docstring). ``path``: which operand it scales: ``"g_x"`` or ``"g_w"`` (g_y as that
    path quantizes it) or ``"x"`` (the layer's input, as the g_w path reads it)."""
    global _flags, _cursor
    if not _deferred(scale):
        if layer not in _reported and not bool(torch.isfinite(scale).all()):
            _report(layer, path)
        return
    if _capturing():
        return  # no event queries, no host copies while a CUDA graph is recorded
    if _pending:
        _poll()
    if layer in _reported or scale.numel() == 0:
        return
    if _flags is None:
        _flags = _host_buffer(RING)
    slot = _cursor
    if slot in _busy:  # RING checks in flight: wait for the oldest (only if the host runs
        _poll(wait=True)  # that far ahead of the device)
    _cursor = (slot + 1) % RING
    # the largest scale is non-finite iff one is (amax propagates NaN): one reduction, none
    # for a per-tensor scale, then one 4-byte copy into pinned memory, read when it has landed
    top = scale.reshape(()) if scale.numel() == 1 else scale.amax()
    _flags[slot].copy_(top, non_blocking=True)
    event = _recorded_event()
    _busy.add(slot)
    _pending.append((layer, path, slot, event))


def nonfinite_layers() -> dict[str, str]:
    """Layers whose HOT backward has seen a NaN/Inf, each with what it was seen in first:
    ``"g_x"`` / ``"g_w"`` (the incoming gradient, on that path) or ``"x"`` (the layer's input,
    read by the g_w path). Waits for the CUDA checks still in flight.

    Only layers on the ``ops`` lowering are watched (linear layers compiled for CUDA run the
    native lowering by default and are never listed: pass ``lowering="ops"`` to watch them),
    and only with ``check_nonfinite="once"``; the module docstring lists what else is not."""
    _poll(wait=True)
    return dict(_reported)


def reset() -> None:
    """Forget which layers were reported (and the checks in flight)."""
    _reported.clear()
    _pending.clear()
    _busy.clear()

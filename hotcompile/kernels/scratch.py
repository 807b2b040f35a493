"""Zeroed device scratch words for the quantize kernels' atomics, without a fill per call.

The per-tensor quantize kernels reduce their max-abs (and SAWB's sums) with atomics into a
few int32 words that must start at zero. ``torch.zeros`` per call is one more kernel launch
(~15 µs of host time on the H100 machine, three per layer per step; see
``tools/repros/host_overhead.py``). Instead, slots are handed out from one zeroed ring per
device and stream; when the ring is used up it is zeroed again with a single ``zero_()``,
enqueued on the same stream behind every kernel that used it, so a slot is never reused
before the kernel that dirtied it has run.

Inside CUDA-graph capture a slot would be baked into the graph and never re-zeroed between
replays (the atomic max would start from the last replay's value), so there every call gets a
fresh ``torch.zeros``, which the graph records as a memset that runs at each replay.
"""

from __future__ import annotations

import torch

#: slots per ring (each ``SLOT`` int32 words): one zero_() per this many calls
SLOTS = 1024
#: int32 words per slot: the max-abs bits and SAWB's two float32 sums
SLOT = 4

#: (device index, stream id) -> [ring, next free slot]
_rings: dict[tuple[int, int], list] = {}


def zeroed(device: torch.device, words: int = 1) -> torch.Tensor:
    """``words`` (<= ``SLOT``) zeroed int32 words on ``device``, valid for kernels enqueued on
    the current stream before the next ``SLOTS`` calls."""
    if words > SLOT:
        raise ValueError(f"at most {SLOT} scratch words, asked for {words}")
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.zeros((words,), dtype=torch.int32, device=device)
    stream = torch.cuda.current_stream(device)
    key = (stream.device_index, stream.stream_id)
    ring = _rings.get(key)
    if ring is None:
        ring = _rings[key] = [torch.zeros((SLOTS, SLOT), dtype=torch.int32, device=device), 0]
    buf, i = ring
    if i == SLOTS:
        buf.zero_()  # stream-ordered after every kernel that used a slot
        i = 0
    ring[1] = i + 1
    return buf[i, :words]


def clear() -> None:
    """Drop the rings (tests; a process that changes devices)."""
    _rings.clear()

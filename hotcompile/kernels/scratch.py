"""Zeroed device scratch words for the quantize kernels' atomics.

The per-tensor quantize kernels reduce their max-abs (and SAWB's two sums) with atomics into a
few int32 words that must start at zero: one ``torch.zeros`` per call (a fill launch, ~15 µs
of host time on the H100 machine; ``experiments/host_overhead.py``), all words of a call in
one allocation.

Why not a persistent zeroed ring handed out slot by slot (tried, 2026-11-22): under
``mode="reduce-overhead"`` inductor's CUDA-graph trees run their warm-up with every allocation
of the stream routed into the graphs' private pool, so a ring created there is a live tensor
in the pool that no graph output owns, and the trees refuse it ("Detected 1 tensor(s) in the
cudagraph pool not tracked as outputs", tests/test_gpu.py::test_reduce_overhead_cuda_graphs).
A fresh allocation per call is also what a captured graph needs: its memset is recorded and
re-zeroes the words at every replay.
"""

from __future__ import annotations

import torch


def zeroed(device: torch.device, words: int = 1) -> torch.Tensor:
    """``words`` zeroed int32 words on ``device``: the max-abs word, then SAWB's Σx², Σ|x|
    (read as float32 through ``.view(torch.float32)``: zero bits are 0.0)."""
    return torch.zeros((words,), dtype=torch.int32, device=device)

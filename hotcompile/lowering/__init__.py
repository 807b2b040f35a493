"""The inductor-native path of HOT's backward (``HotConfig.lowering="native"``).

Layout of the pipeline: the rewrite pass (``hotcompile.passes``) → the autograd Functions
(``hotcompile.autograd``) → either the reference custom ops (``hotcompile.ops``, their CUDA
kernels behind a Python dispatcher in ``hotcompile.kernels``) or this package:

- :mod:`hotcompile.lowering.hot` — HOT's g_x / g_w / ABC computations written with nodes
  inductor compiles itself (``torch._scaled_mm``, ``torch._int_mm``, ATen, and the fused
  quantize kernels as ``triton_op``);
- :mod:`hotcompile.lowering.triton_ops` — those ``triton_op`` registrations (CUDA + Triton);
- :mod:`hotcompile.lowering.gate` — the per-layer choice between HOT and the exact bf16
  backward: HOT only where it is faster on this GPU (measured per shape, cached).
- :mod:`hotcompile.lowering.ttir_cache` — compile time: the TTIR torch builds to analyse each
  launch of HOT's kernels, generated once per argument signature instead of per launch.

Nothing here initialises CUDA at import.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Triton is importable and a CUDA device is present: the ``triton_op`` kernels can run."""
    import torch
    from torch.utils._triton import has_triton

    if not (torch.cuda.is_available() and has_triton()):
        return False
    try:
        from hotcompile.lowering import triton_ops  # noqa: F401
    except Exception:  # noqa: BLE001 - an old Triton/torch without triton_op: ATen path
        return False
    return True

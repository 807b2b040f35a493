"""GPU kernels of hotcompile (Triton), registered as CUDA implementations of the ops.

Importing this package registers them when CUDA and Triton are available; nothing here runs
at ``import hotcompile``: ``hotcompile.ops`` imports it on the first CUDA call of an op.
"""

from __future__ import annotations

import torch

REGISTERED = False


def available() -> bool:
    """CUDA and Triton are both there (initialises CUDA: call it only with CUDA work ahead)."""
    from torch.utils._triton import has_triton

    return torch.cuda.is_available() and has_triton()


def register() -> bool:
    """Register the Triton-backed CUDA implementations; returns whether they are registered."""
    global REGISTERED
    if not REGISTERED and available():
        from hotcompile.kernels.hq_triton import hq_grad_input_cuda
        from hotcompile.ops import hq_grad_input

        hq_grad_input.register_kernel("cuda")(hq_grad_input_cuda)
        REGISTERED = True
    return REGISTERED


register()

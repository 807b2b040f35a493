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
        from hotcompile import ops
        from hotcompile.kernels import hla_triton
        from hotcompile.kernels.hq_triton import hq_grad_input_cuda

        ops.hq_grad_input.register_kernel("cuda")(hq_grad_input_cuda)
        # the g_w path (HLA + INT8); ops.py has no CUDA stub for these: they switch to the
        # kernels once anything has called register() (the first CUDA hq_grad_input does)
        ops.abc_compress.register_kernel("cuda")(hla_triton.abc_compress_cuda)
        ops.hla_grad_weight.register_kernel("cuda")(hla_triton.hla_grad_weight_cuda)
        ops.hla_grad_weight_dense.register_kernel("cuda")(hla_triton.hla_grad_weight_dense_cuda)
        REGISTERED = True
    return REGISTERED


register()

"""GPU kernels of hotcompile (Triton), registered as CUDA implementations of the ops.

Importing this package registers them when CUDA and Triton are available; nothing here runs
at ``import hotcompile``: ``hotcompile.ops`` imports it on the first CUDA call of an op.
"""

from __future__ import annotations

import torch

REGISTERED = False
#: op name -> its CUDA implementation, filled by ``register()``
CUDA_IMPLS: dict = {}


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

        CUDA_IMPLS.update(
            hq_grad_input=hq_grad_input_cuda,
            abc_compress=hla_triton.abc_compress_cuda,
            hla_grad_weight=hla_triton.hla_grad_weight_cuda,
            hla_grad_weight_dense=hla_triton.hla_grad_weight_dense_cuda,
        )
        for name, impl in CUDA_IMPLS.items():
            getattr(ops, name).register_kernel("cuda")(impl)
        REGISTERED = True
    return REGISTERED


register()

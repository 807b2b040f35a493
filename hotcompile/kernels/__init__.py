"""GPU kernels of hotcompile (Triton), registered as CUDA implementations of the ops.

Importing this package registers them when CUDA and Triton are available; nothing here runs
at ``import hotcompile``: the backend imports it when it compiles a graph (for the dispatcher),
``hotcompile.ops`` on the first CUDA call of an op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

REGISTERED = False


def available() -> bool:
    """CUDA and Triton are both there (initialises CUDA: call it only with CUDA work ahead)."""
    from torch.utils._triton import has_triton

    return torch.cuda.is_available() and has_triton()


def cuda_kernels() -> dict[str, Callable]:
    """Op name -> its CUDA implementation (importing them imports Triton)."""
    from hotcompile.kernels import hla_triton
    from hotcompile.kernels.hq_triton import hq_grad_input_cuda

    # the g_w path (HLA + INT8) has no CUDA stub in ops.py: it switches to the kernels once
    # anything has called register() (the first CUDA hq_grad_input does)
    return {
        "hq_grad_input": hq_grad_input_cuda,
        "abc_compress": hla_triton.abc_compress_cuda,
        "hla_grad_weight": hla_triton.hla_grad_weight_cuda,
        "hla_grad_weight_dense": hla_triton.hla_grad_weight_dense_cuda,
    }


def install(impls: dict[str, Callable]) -> None:
    """Register ``impls`` (op name -> function) as the ops' CUDA kernels."""
    from hotcompile import ops

    for name, fn in impls.items():
        getattr(ops, name).register_kernel("cuda")(fn)


def register() -> bool:
    """Register the Triton-backed CUDA implementations; returns whether they are registered."""
    global REGISTERED
    if not REGISTERED and available():
        install(cuda_kernels())
        REGISTERED = True
    return REGISTERED


register()

"""The first-CUDA-call hook of ``torch.ops.hotcompile``: registers the fused kernels lazily.

Kept out of ``hotcompile.ops`` so that the dependency runs one way: ``hotcompile.kernels``
imports the ops (to register implementations into their schemas), the ops never import the
kernels. Importing the ``hotcompile`` package imports this module; nothing here imports
Triton or touches CUDA until an op is first called on a CUDA tensor.
"""

from __future__ import annotations

from hotcompile.ops import hq_grad_input


@hq_grad_input.register_kernel("cuda")
def _hq_grad_input_cuda(*args, **kwargs):
    """First CUDA call: register the Triton kernels (they replace this), else the reference."""
    try:
        from hotcompile import kernels
    except ImportError:  # a build without hotcompile.kernels
        kernels = None
    if kernels is not None and kernels.register():
        return kernels.hq_triton.hq_grad_input_cuda(*args, **kwargs)
    return hq_grad_input._init_fn(*args, **kwargs)

"""hotcompile: HOT (Hadamard-based Optimized Training) as a torch.compile backend.

``torch.compile(model, backend="hot")`` keeps the forward in full precision and gives every
linear and conv2d layer HOT's backward: an INT4-grade Hadamard-quantized g_x path, an HLA +
INT8 g_w path, and a compressed saved activation (ABC).

Importing this package registers the ``torch.ops.hotcompile`` operators; it never initialises
CUDA and needs no compiler.
"""

import hotcompile.ops_cuda  # noqa: F401  (the lazy CUDA registration of the ops' kernels)
from hotcompile.autograd import LayerSpec, hot_conv2d, hot_linear
from hotcompile.backend import HotBackend, calibrate, clear_plans, hot_backend, plans
from hotcompile.config import HotConfig, HotConfigError
from hotcompile.eager import eager_frames
from hotcompile.graphdiff import diff
from hotcompile.inplace import compile_model
from hotcompile.lqs import Plan, PlanEntry
from hotcompile.memory import saved_activation_bytes, saved_tensors
from hotcompile.numerics import nonfinite_layers
from hotcompile.plantable import PlanTable
from hotcompile.report import report

__version__ = "0.1.0"

__all__ = [
    "HotBackend",
    "HotConfig",
    "HotConfigError",
    "LayerSpec",
    "Plan",
    "PlanEntry",
    "PlanTable",
    "calibrate",
    "clear_plans",
    "compile_model",
    "diff",
    "eager_frames",
    "hot_backend",
    "hot_conv2d",
    "hot_linear",
    "nonfinite_layers",
    "plans",
    "report",
    "saved_activation_bytes",
    "saved_tensors",
]

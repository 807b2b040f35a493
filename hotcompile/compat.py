"""Importing the model libraries (timm, transformers) next to a CPU-only torch.

On a CPU machine ``pip install torch==2.13.0 timm`` installs PyPI's torchvision, a CUDA build
whose C++ ops cannot load next to the CPU torch: its import raises ``RuntimeError: operator
torchvision::nms does not exist`` (from the fake kernels it registers unconditionally), and so
do ``import timm`` and transformers' model classes, which import torchvision's pure Python
parts (``FrozenBatchNorm2d``, transforms) and never call its ops on these paths.
:func:`import_module` declares the two op schemas those registrations need, then imports
torchvision without its ops — as torchvision is built to do when its ops fail to load.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

import torch

#: what importing needed here (None: nothing special), for reports that state their setup
TORCHVISION_NOTE: str | None = None
_KEEP: list[object] = []  # torch.library fragments must outlive their registrations


def torchvision_without_ops() -> None:
    """Make ``import torchvision`` work where its C++ ops cannot load (see the module doc)."""
    global TORCHVISION_NOTE
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision  # noqa: F401
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _KEEP.append(lib)
        import torchvision  # noqa: F401, F811

        TORCHVISION_NOTE = (
            f"torchvision's C++ ops do not load with this torch ({e}); imported without them "
            "(timm uses none)"
        )


def import_module(name: str) -> ModuleType:
    """``importlib.import_module(name)`` after :func:`torchvision_without_ops`."""
    torchvision_without_ops()
    return importlib.import_module(name)

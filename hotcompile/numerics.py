"""NaN/Inf guards of the HOT backward.

Quantization must never turn a NaN or Inf gradient into a finite number (a max-abs scale of
NaN/Inf makes every dequantized value non-finite, see ``quant``), and the user must learn
which layer it reached first. ``check_scale`` is called by the backward ops with the scale of
the incoming gradient: a non-finite scale means a non-finite gradient. Each layer is reported
once per process (``reset`` forgets).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("hotcompile")

_reported: dict[str, str] = {}


def check_scale(scale: torch.Tensor, layer: str, path: str) -> None:
    """Warn once per layer when ``scale`` (of a gradient operand) is NaN/Inf. Syncs on CUDA."""
    if layer in _reported or bool(torch.isfinite(scale).all()):
        return
    _reported[layer] = path
    log.warning(
        "hotcompile: a NaN/Inf gradient reached the HOT backward of layer %r (%s path); it "
        "propagates as NaN/Inf. Later occurrences in this layer are not reported.",
        layer,
        path,
    )


def nonfinite_layers() -> dict[str, str]:
    """Layers whose HOT backward has seen a NaN/Inf gradient, with the path that saw it first."""
    return dict(_reported)


def reset() -> None:
    """Forget which layers were reported."""
    _reported.clear()

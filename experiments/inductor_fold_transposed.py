"""Minimal repro of an inductor (CPU) miscompile seen with torch 2.13.0+cpu on 2026-11-21.

``F.fold`` of a transposed operand followed by a pointwise op returns wrong values (3x3
kernel, dilation 2) or corrupts the heap (1x1 kernel: "double free or corruption"). Eager is
right. hotcompile works around it by keeping col2im inside ``hotcompile::hq_conv_grad_input``.

Run: ``python experiments/inductor_fold_transposed.py 3`` (or ``1`` to see the crash).
"""

import sys

import torch
import torch.nn.functional as F

k = int(sys.argv[1]) if len(sys.argv) > 1 else 3
d, p = (2, 2) if k == 3 else (1, 0)


def f(a):
    return F.fold(a.transpose(1, 2), (6, 6), k, d, p, 1) * 2


cols = F.unfold(torch.randn(2, 16, 6, 6), k, d, p, 1).transpose(1, 2).contiguous()
print("max |compiled - eager| =", (torch.compile(f)(cols) - f(cols)).abs().max().item())

"""Block Walsh-Hadamard transforms (reference implementation).

HOT multiplies by ``I_{D/n} ⊗ H_n``: each run of n consecutive indices along a dimension is
transformed on its own with the unnormalised Sylvester matrix (entries ±1, ``H H = n·I``).
The reference computes it with the fast butterfly (log2 n add/sub stages in float32, in a
fixed order) rather than a matmul: it is cheaper, and a GPU kernel that performs the same
stages in the same order produces bit-identical results, so quantized codes can be compared
exactly between the reference and the kernels.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=16)
def _hadamard_cpu(n: int) -> torch.Tensor:
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hadamard_matrix(
    n: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """The n×n Sylvester Hadamard matrix in natural order: ``H[i, j] = (-1)^popcount(i & j)``."""
    return _hadamard_cpu(n).to(dtype=dtype, device=device)


def padded(size: int, multiple: int) -> int:
    """``size`` rounded up to a multiple of ``multiple`` (works on SymInts)."""
    return (size + multiple - 1) // multiple * multiple


def fwht_last(x: torch.Tensor, n: int) -> torch.Tensor:
    """Butterfly Walsh-Hadamard transform of each run of n along the last dim (size % n == 0).

    Stage h pairs indices (j, j+h) inside every 2h-run: ``(a, b) -> (a+b, a-b)``. After the
    log2 n stages the result equals ``x @ H_n`` in natural (Sylvester) order.
    """
    shape = x.shape
    h = 1
    while h < n:
        y = x.reshape(-1, shape[-1] // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        x = torch.stack([a + b, a - b], dim=2)
        h *= 2
    return x.reshape(shape)


def block_hadamard(x: torch.Tensor, dim: int, n: int = 16) -> torch.Tensor:
    """``x`` multiplied by ``I ⊗ H_n`` along ``dim``, computed in float32.

    ``dim`` is zero-padded to a multiple of n first (padding is exact for HOT's products:
    padded rows/columns meet zeros in the other operand), so the result's ``dim`` has the
    padded size.
    """
    dim = dim % x.dim()
    xf = x.to(torch.float32).movedim(dim, -1)
    size = xf.shape[-1]
    pad = padded(size, n) - size
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    return fwht_last(xf.contiguous(), n).movedim(-1, dim)

"""HLA: Hadamard low-rank approximation along the token/position dimension L.

Blocks of n=16 positions are Walsh-Hadamard transformed and only r of the n coefficients
are kept (``T = I_{L/n} ⊗ H_r``). Applied to both operands of the weight gradient,
``g_w ≈ (T g_y)ᵀ (T x) / n``: the reduction length halves for r = 8, and the forward only
needs to keep ``T x`` (ABC). With all n rows it is exact.

Geometry: any fixed permutation of L is allowed, since T acts on both operands. Sequences use
blocks of n consecutive positions of one sample; spatial maps (conv outputs, 4-D linear
inputs) use √n×√n patches, so that the kept "low-pass" coefficients are spatially smooth.
"""

from __future__ import annotations

import functools
import math

import torch

from hotcompile.hadamard import fwht_last, hadamard_matrix, padded

_NATURAL_OF_SEQUENCY_4 = (0, 2, 3, 1)  # H_4 in natural order has sequencies 0, 3, 1, 2


def sequency(row: int, n: int) -> int:
    """Number of sign changes along row ``row`` of the natural-order H_n."""
    h = hadamard_matrix(n)[row]
    return int((h[1:] != h[:-1]).sum())


@functools.lru_cache(maxsize=64)
def hla_rows(scheme: str | tuple[int, ...], rank: int, n: int = 16) -> tuple[int, ...]:
    """Indices (natural order of H_n) of the Walsh-Hadamard rows HLA keeps, sorted.

    ``"lp_l1"`` reads a block of 16 as a 4x4 patch and keeps the 2-D Walsh functions (u, v)
    (u, v = sequency along each axis) of lowest L1 sequency u+v, ties broken by max(u, v)
    then u: r=6 is u+v≤2, r=8 adds (1,2),(2,1) giving {0,2,3,8,10,11,12,14}, r=10 is the
    official code's u+v≤3. ``"sequency"`` keeps the 1-D sequencies 0..r-1.
    """
    if isinstance(scheme, tuple):
        return tuple(sorted(scheme))
    if scheme == "lp_l1":
        if n != 16:
            raise ValueError("the lp_l1 row set is defined for 16-blocks")
        uv = sorted(
            ((u, v) for u in range(4) for v in range(4)), key=lambda t: (t[0] + t[1], max(t), t[0])
        )
        nat = _NATURAL_OF_SEQUENCY_4
        return tuple(sorted(4 * nat[u] + nat[v] for u, v in uv[:rank]))
    if scheme == "sequency":
        return tuple(sorted(sorted(range(n), key=lambda i: sequency(i, n))[:rank]))
    raise ValueError(f"unknown HLA row scheme {scheme!r}")


def patch_side(n: int) -> int:
    """Side of the square patch a spatial block of n positions covers (0: not a square)."""
    s = math.isqrt(n)
    return s if s * s == n else 0


def to_blocks(x: torch.Tensor, grid_w: int, n: int = 16) -> torch.Tensor:
    """Arrange ``x: [N, S, D]`` as ``[N, nb, n, D]``: the HLA blocks, zero-padded.

    ``grid_w == 0``: S is a sequence, blocks are n consecutive positions (S padded to a
    multiple of n). ``grid_w > 0``: S = H·W is a raster-ordered H×W map with W = grid_w; blocks
    are √n×√n patches (H and W padded to multiples of √n), in-patch index ``√n·dy + dx``.
    """
    N, S, D = x.shape
    p = patch_side(n)
    if grid_w and p:
        H = S // grid_w
        xs = x.reshape(N, H, grid_w, D)
        xs = torch.nn.functional.pad(xs, (0, 0, 0, padded(grid_w, p) - grid_w, 0, padded(H, p) - H))
        hb, wb = xs.shape[1] // p, xs.shape[2] // p
        xs = xs.reshape(N, hb, p, wb, p, D).permute(0, 1, 3, 2, 4, 5)
        return xs.reshape(N, hb * wb, n, D)
    xs = torch.nn.functional.pad(x, (0, 0, 0, padded(S, n) - S))
    return xs.reshape(N, xs.shape[1] // n, n, D)


def signed(x: torch.Tensor, signs: torch.Tensor | None) -> torch.Tensor:
    """``x [N, S, D]`` times HLA's per-token ±1 (``hla_signs``; ``signs`` ``[N, S, 1]`` or
    ``[N, S]``: exact in any float dtype), or x itself without signs."""
    if signs is None:
        return x
    if signs.numel() != x.shape[0] * x.shape[1]:
        raise ValueError(f"signs has {signs.numel()} elements for {x.shape[0]}x{x.shape[1]} tokens")
    return x * signs.reshape(x.shape[0], x.shape[1], 1).to(x.dtype)


def hla_transform(x: torch.Tensor, grid_w: int, rows: tuple[int, ...], n: int = 16) -> torch.Tensor:
    """``T x`` in float32: ``x: [N, S, D]`` -> ``[N·nb·r, D]`` (r = len(rows)).

    Rows of the result are the kept Walsh-Hadamard coefficients of every block; both operands
    of the weight gradient must be transformed with the same ``grid_w``, ``rows`` and ``n``.
    """
    blocks = to_blocks(x.to(torch.float32), grid_w, n)  # [N, nb, n, D]
    coeffs = fwht_last(blocks.transpose(-1, -2).contiguous(), n)  # [N, nb, D, n]
    kept = coeffs[..., list(rows)]  # [N, nb, D, r]
    return kept.transpose(-1, -2).reshape(-1, x.shape[-1])


def hla_operand(x: torch.Tensor, grid_w: int, rows, n: int = 16) -> torch.Tensor:
    """The g_w path's operand before quantization, float32: HLA's ``T x`` (``rows``
    non-empty) or, without HLA, the plain row matrix ``[N·S, D]`` of ``x: [N, S, D]``."""
    if rows:
        return hla_transform(x, grid_w, tuple(rows), n)
    return x.reshape(-1, x.shape[-1]).to(torch.float32)

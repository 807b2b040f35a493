"""Run every CUDA implementation of the HOT ops once on ragged, model-sized shapes, for
``compute-sanitizer --tool memcheck`` to catch out-of-bounds reads and writes.

The caching allocator packs tensors into shared segments, where an out-of-bounds write lands
in a neighbouring tensor instead of faulting; run with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` so
every tensor is its own allocation and memcheck sees every stray access::

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        python3 experiments/memcheck_ops.py [--small]

It also times every GEMM candidate once (the dispatcher measures them all on a new shape), so
the CUTLASS, Triton and torch GEMMs are all exercised. Exit status 0 means every op ran; the
sanitizer's own summary says whether any access was out of bounds.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="fewer tokens (faster under memcheck)")
    args = ap.parse_args(argv)
    from hotcompile import kernels
    from hotcompile.kernels import hq_triton

    if not kernels.register():
        print("needs CUDA and Triton")
        return 1
    ops = torch.ops.hotcompile
    dev = "cuda"
    n = 1 if args.small else 2
    rows = [0, 1, 2, 4, 8, 3, 5, 6]
    # (tokens per sample S, in I, out O): GPT-2's head, a ViT head, a ragged toy layer
    shapes = [(1024, 768, 50257), (197, 768, 1000), (50, 24, 40)]
    for S, I, O in shapes:
        print(f"--- S={S} I={I} O={O}", flush=True)
        x = torch.randn(n, S, I, device=dev, dtype=torch.bfloat16)
        gy = torch.randn(n, S, O, device=dev, dtype=torch.bfloat16) * 1e-4
        w = torch.randn(O, I, device=dev, dtype=torch.bfloat16) * 0.02
        xq, sx = ops.abc_compress(x, 0, rows, 16, 8, "pseudo_stochastic")
        gw = ops.hla_grad_weight(gy, xq, sx, 0, rows, 16, 8, "pseudo_stochastic", "l", True)
        gw2 = ops.hla_grad_weight_dense(gy, x, 0, rows, 16, 8, "pseudo_stochastic", "l", True)
        for scaling in ("per_token", "per_tensor"):
            for bits in (4, 8):
                gx = ops.hq_grad_input(
                    gy.reshape(-1, O), w, bits, scaling, "pseudo_stochastic", "sawb", 16, "l",
                    "", True,
                )  # fmt: skip
                assert torch.isfinite(gx).all(), (scaling, bits)
        for sawb in (False, True):
            for fp8 in (False, True):
                hq_triton.quantize_weight(w, 4, "sawb" if sawb else "maxabs", fp8)
        torch.cuda.synchronize()
        assert torch.isfinite(gw).all() and torch.isfinite(gw2).all()
        print("    ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

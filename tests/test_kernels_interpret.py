"""The Triton kernels' quantize on the CPU through Triton's interpreter: bit-exact codes and
scales against the reference. Skipped where Triton is absent (the CPU torch wheel has none);
run it after any change to hotcompile/kernels/ on a machine with ``pip install triton``.

A subprocess, because ``TRITON_INTERPRET`` is read when Triton is first imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

CHECK = textwrap.dedent("""
    import torch
    from hotcompile.hadamard import block_hadamard
    from hotcompile.hla import hla_transform
    from hotcompile.kernels.hla_triton import hla_quantize
    from hotcompile.kernels.hq_triton import hq_quantize
    from hotcompile.quant import quantize

    torch.manual_seed(0)
    LP_L1 = (0, 2, 3, 8, 10, 11, 12, 14)
    n = bad = 0
    for L, O in [(37, 40), (20, 128)]:
        gy = torch.randn(L, O) * torch.logspace(-2, 1, L)[:, None]
        for rounding in ("nearest", "pseudo_stochastic"):
            for bits in (4, 8):
                for per_token in (True, False):
                    c, s = hq_quantize(gy, bits, per_token, rounding, out_dtype=torch.int8)
                    rc, rs = quantize(block_hadamard(gy, 1, 16), bits, per_token, rounding)
                    n += 1
                    bad += not (torch.equal(c[:L], rc)
                                and torch.equal(s[:L] if per_token else s, rs))
                x = torch.randn(2, 35, 24)
                for grid_w in (0, 5):
                    c, s = hla_quantize(x, grid_w, LP_L1, bits, rounding, transposed=False)
                    rc, rs = quantize(hla_transform(x, grid_w, LP_L1), bits, False, rounding)
                    n += 1
                    bad += not (torch.equal(c, rc) and torch.equal(s, rs))
    print(f"{n - bad}/{n}")
""")


def test_interpreted_kernels_match_reference_bit_exactly():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    done, total = out.stdout.split()[-1].split("/")
    assert done == total, out.stdout

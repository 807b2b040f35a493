"""CPU checks of the CUDA fused Hadamard + quantize kernel (csrc/hq_quantize.cu).

Without a GPU this compiles the kernel for sm_90a with nvcc (it needs only the CUDA toolkit,
not torch's CUDA headers) and checks that ptxas keeps every kernel's 16-blocks in registers —
no stack frame, no spills — which is what makes it faster than the Triton kernel. It runs
nothing: bit-exactness against the reference is tests/test_kernels_gpu.py (the ``cuda``
implementation), on a GPU machine. Skipped without nvcc.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import torch

from hotcompile.kernels import hq_cuda, jit


def test_unavailable_without_cuda_does_not_raise():
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    assert hq_cuda.available() is False
    assert "CUDA" in (hq_cuda.error() or "")
    assert not hq_cuda.supported(torch.zeros(4, 16), "nearest", torch.int8)


def test_nvcc_compiles_for_sm90a_with_everything_in_registers(tmp_path):
    nvcc = jit.nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    src = hq_cuda.EXTENSION.src()
    assert src is not None, "csrc/hq_quantize* not found"
    cmd = [
        nvcc, "-c", str(src / "hq_quantize.cu"), "-o", str(tmp_path / "hq.o"), "-std=c++17",
        "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-I" + str(src), "-Xptxas", "-v",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
    assert len(frames) >= 12, log[-2000:]  # 3 input × 2 output types × (4 row + 1 amax) kernels
    assert all(f == ("0", "0") for f in frames), f"local memory in a kernel: {frames}"

"""CPU tests of the CUTLASS GEMM module (hotcompile/kernels/cutlass.py, csrc/hot_gemm*.cu).

What this covers without a GPU:
- the pure-Python parts: shape/dtype/alignment/config checks, ``scaled_gemm`` returning None
  (so callers fall back) on anything unsupported, ``available()`` being False without CUDA
  without raising (and the reason remembered), the ``hotcompile build`` CLI;
- a compile check of every CUDA translation unit in csrc/ for sm_90a with nvcc and the flags
  of the JIT build (torch's own nvcc defines included): this proves the CUTLASS templates
  instantiate and ptxas accepts them, and that no kernel has the C7510 "wgmma serialized"
  performance warning or register spills (ptxas -v). It does not run anything: correctness
  is tests/test_cutlass_gpu.py.
  The kernel check takes ~3-5 minutes on 2 cores (four instance files built two at a time)
  and is skipped when nvcc or the CUTLASS headers (``pip install nvidia-cutlass``) are
  missing. The torch bindings are only syntax-checked (test_bindings_compile_and_use_no_streams):
  a CPU-only torch wheel lacks one generated c10/cuda header and the CUDA libraries to link.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import help_text

from hotcompile.kernels import cutlass


def _ab(m: int, n: int, k: int, dtype: torch.dtype = torch.int8):
    a = torch.zeros(m, k, dtype=dtype)
    b = torch.zeros(n, k, dtype=dtype)
    return a, b


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_supported_shapes_pass_the_checks(dtype):
    a, b = _ab(32, 48, 64, dtype)
    assert cutlass.unsupported_reason(a, b, require_cuda=False) is None
    assert cutlass.unsupported_reason(a, b, torch.float32, require_cuda=False) is None
    out = torch.zeros(32, 48)
    assert cutlass.unsupported_reason(a, b, out=out, require_cuda=False) is None
    for c in cutlass.CONFIGS[str(dtype).removeprefix("torch.")]:
        assert cutlass.unsupported_reason(a, b, config=c, require_cuda=False) is None


@pytest.mark.parametrize(
    "case",
    [
        "m_not_16",
        "n_not_16",
        "k_not_16",
        "k_mismatch",
        "empty",
        "mixed_dtype",
        "float_inputs",
        "non_contiguous",
        "misaligned",
        "bad_config",
        "fp16_out",
        "bf16_accumulate",
        "wrong_out_shape",
        "three_d",
    ],
)
def test_unsupported_is_rejected(case):
    a, b = _ab(32, 48, 64)
    kw: dict = {}
    if case == "m_not_16":
        a = torch.zeros(33, 64, dtype=torch.int8)
    elif case == "n_not_16":
        b = torch.zeros(40, 64, dtype=torch.int8)
    elif case == "k_not_16":
        a, b = _ab(32, 48, 72)
    elif case == "k_mismatch":
        b = torch.zeros(48, 32, dtype=torch.int8)
    elif case == "empty":
        a, b = _ab(0, 48, 64)
    elif case == "mixed_dtype":
        b = b.to(torch.float8_e4m3fn)
    elif case == "float_inputs":
        a, b = a.float(), b.float()
    elif case == "non_contiguous":
        a = torch.zeros(64, 32, dtype=torch.int8).t()
    elif case == "misaligned":
        a = torch.zeros(32 * 64 + 8, dtype=torch.int8)[8:].view(32, 64)
    elif case == "bad_config":
        kw["config"] = 99
    elif case == "fp16_out":
        kw["out_dtype"] = torch.float16
    elif case == "bf16_accumulate":
        kw["out"] = torch.zeros(32, 48, dtype=torch.bfloat16)
    elif case == "wrong_out_shape":
        kw["out"] = torch.zeros(48, 32)
    elif case == "three_d":
        a = a.view(2, 16, 64)
    reason = cutlass.unsupported_reason(a, b, require_cuda=False, **kw)
    assert isinstance(reason, str) and reason
    # the public entry point never raises on these: None means "fall back"
    assert cutlass.scaled_gemm(a, b, 1.0, 1.0, **kw) is None


def test_cpu_tensors_fall_back():
    a, b = _ab(32, 48, 64)
    assert cutlass.unsupported_reason(a, b) is not None  # not CUDA
    assert cutlass.scaled_gemm(a, b, torch.ones(32), torch.ones(48)) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_available_false_without_cuda_and_does_not_raise():
    assert "CUDA" in (cutlass.unavailable_reason() or "")
    with pytest.warns(RuntimeWarning, match="CUTLASS kernels unavailable"):
        assert cutlass.available() is False
    assert cutlass.error() is not None
    # remembered: no second warning, no retry
    assert cutlass.available() is False
    assert cutlass.build() is False
    assert cutlass.config_names() == []


def test_sources_and_configs_are_found():
    src = cutlass.csrc_dir()
    assert src is not None and (src / "hot_gemm.cu").is_file()
    assert set(cutlass.CONFIGS) == {"float8_e4m3fn", "int8"}
    assert all(ids == sorted(set(ids)) and ids for ids in cutlass.CONFIGS.values())
    inc = cutlass.cutlass_include_dirs()
    if inc is not None:
        d = cutlass.build_dir(src, inc)
        assert d.name.startswith(cutlass.NAME) and d == cutlass.build_dir(src, inc)


def test_cli_build_help_and_unavailable():
    out = help_text(("hotcompile", "build"))
    assert "sm_90a" in out and "cache" in out.lower() and "Triton" in out
    if not torch.cuda.is_available():
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        res = subprocess.run(
            [sys.executable, "-m", "hotcompile.cli", "build"],
            capture_output=True,
            text=True,
            env=env,
        )
        assert res.returncode == 1 and "unavailable" in res.stdout


def _torch_nvcc_defines() -> list[str]:
    try:
        from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

        return [f for f in COMMON_NVCC_FLAGS if f.startswith("-D")]
    except ImportError:  # pragma: no cover
        return []


#: the .cu files the default suite compiles (see the test below)
NVCC_REPRESENTATIVES = ("hot_gemm.cu", "hot_gemm_fp8_bf16.cu", "hot_gemm_int8_f32.cu")


@pytest.mark.slow
def test_nvcc_compiles_the_kernels_for_sm90a():
    """nvcc -c of csrc/hot_gemm*.cu for sm_90a (instantiation + ptxas): no C7510/spills.

    By default the host file and two of the four instantiations, which between them take both
    operand types (FP8, INT8) and both outputs (bf16, float32) of the one template
    (``hot_gemm.cuh``): all five took 143 s of the suite on two cores. All five with
    ``HOTCOMPILE_NVCC_ALL=1``."""
    nvcc = cutlass.nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    inc = cutlass.cutlass_include_dirs()
    if inc is None:
        pytest.skip("CUTLASS headers not found: pip install nvidia-cutlass==4.2.0.0")
    src = cutlass.csrc_dir()
    assert src is not None
    cus = [f for f in cutlass.SOURCES if f.endswith(".cu")]
    if os.environ.get("HOTCOMPILE_NVCC_ALL") != "1":
        cus = [f for f in cus if f in NVCC_REPRESENTATIVES]
        assert len(cus) == len(NVCC_REPRESENTATIVES), cus
    flags = [*cutlass.NVCC_FLAGS, *_torch_nvcc_defines(), "-Xptxas=-v", "-I" + str(src)]
    flags += ["-I" + d for d in inc]

    with tempfile.TemporaryDirectory() as tmp:

        def compile_one(name: str) -> tuple[str, subprocess.CompletedProcess]:
            obj = os.path.join(tmp, name + ".o")
            cmd = [nvcc, "-c", str(src / name), "-o", obj, *flags]
            return name, subprocess.run(cmd, capture_output=True, text=True, timeout=900)

        with ThreadPoolExecutor(max_workers=max(1, min(len(cus), os.cpu_count() or 1))) as ex:
            results = list(ex.map(compile_one, cus))
        for name, res in results:
            log = res.stdout + res.stderr
            assert res.returncode == 0, f"{name} failed to compile:\n{log[-4000:]}"
            assert "C7510" not in log, f"{name}: wgmma serialized (C7510):\n{log[-2000:]}"
            spills = re.findall(r"(\d+) bytes spill stores", log)
            assert all(s == "0" for s in spills), f"{name}: register spills:\n{log[-3000:]}"
            assert os.path.getsize(os.path.join(tmp, name + ".o")) > 0


@pytest.mark.slow
@pytest.mark.parametrize("binding", ["hot_gemm_bindings.cpp", "hq_quantize_bindings.cpp"])
def test_bindings_compile_and_use_no_streams(binding):
    """The torch bindings of both extensions pass the host compiler (``-fsyntax-only``: the
    CPU wheel lacks one generated c10/cuda header, stubbed here, and the CUDA libraries to
    link), and never touch an iostream: on the device machine any ``std::ostringstream`` in a
    JIT-built extension segfaults the process — ``c10::str`` is one, and so is the message of
    every ``TORCH_CHECK`` (tools/results/gpu_tests.md, fifth session). Bad calls are reported as
    return values built by plain string concatenation instead."""
    import shutil
    import sysconfig

    from torch.utils import cpp_extension

    from hotcompile.kernels import jit

    src = cutlass.csrc_dir()
    assert src is not None
    text = (src / binding).read_text()
    code = re.sub(r"//[^\n]*", "", text)  # comments may mention what the code must not do
    banned = r"\b(TORCH_CHECK|C10_CUDA_CHECK|throw|c10::str|\w*stringstream|ostream|cout|cerr)\b"
    assert not re.search(banned, code), binding
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    nvcc = jit.nvcc_path()
    homes = [cpp_extension.CUDA_HOME, os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    homes += [os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None]
    homes += ["/usr/local/cuda"]  # nvcc may be a wrapper script outside the toolkit
    cands = [os.path.join(h, "include") for h in homes if h]
    cuda_inc = next((d for d in cands if os.path.exists(os.path.join(d, "cuda_runtime.h"))), None)
    if cxx is None or cuda_inc is None:
        pytest.skip("needs a host C++ compiler and the CUDA toolkit's headers")
    with tempfile.TemporaryDirectory() as tmp:
        stub = os.path.join(tmp, "c10", "cuda", "impl")
        os.makedirs(stub)
        with open(os.path.join(stub, "cuda_cmake_macros.h"), "w") as f:
            f.write("#pragma once\n")
        incs = [tmp, *cpp_extension.include_paths(), cuda_inc, sysconfig.get_paths()["include"]]
        # C++20: what torch.utils.cpp_extension compiles extensions with (torch >= 2.13 headers
        # need it)
        cmd = [cxx, "-std=c++20", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=hotcompile_check"]
        cmd += ["-I" + d for d in [*incs, str(src)]] + [str(src / binding)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]

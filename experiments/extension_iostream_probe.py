"""Which C++ constructs crash a JIT-built torch extension on this machine (one process per case).

On the device machine (H100, torch 2.11.0+cu130, g++ 13.3, 2026-11-22) the CUTLASS bindings
segfaulted the process whenever they *returned* an error message (no exception thrown), as a
failing ``TORCH_CHECK`` had before. This probe builds a five-function extension with
``torch.utils.cpp_extension.load_inline`` and calls each function in its own process:

    str_plain    std::string + std::to_string              -> worked
    str_c10      c10::str("got ", n)  (an ostringstream)    -> SIGSEGV
    str_stream   std::ostringstream directly                -> SIGSEGV
    catch_throw  throw std::runtime_error, caught, .what()  -> worked
    str_scalar   c10::str of a ScalarType and sizes         -> SIGSEGV

On the CPU machine (torch 2.13.0+cpu, g++ 12) every case works: it is that machine's
toolchain and torch build together, not the code. So iostreams are what crash (``TORCH_CHECK``
formats its message with ``c10::str``), not C++ exceptions. csrc/hot_gemm_bindings.cpp builds
its messages without streams since, and tests/test_cutlass_build.py rejects any stream use in
the bindings. Output of the run: tools/results/gpu_logs/s5_probe_iostream_probe.txt (it ran as
an uncommitted probe.py with the same extension source and cases, plus two cases calling the
CUTLASS module that never got it built).

    python3 experiments/extension_iostream_probe.py          # every case, one process each
    python3 experiments/extension_iostream_probe.py str_c10  # one case in this process
"""

from __future__ import annotations

import subprocess
import sys

CASES = ("str_plain", "str_c10", "str_stream", "catch_throw", "str_scalar")

SOURCE = r"""
#include <torch/extension.h>
#include <sstream>
#include <stdexcept>
std::string str_plain(int64_t n) { return std::string("got ") + std::to_string(n); }
std::string str_c10(int64_t n) { return c10::str("got ", n); }
std::string str_stream(int64_t n) { std::ostringstream s; s << "got " << n; return s.str(); }
std::string catch_throw(int64_t n) {
  try { throw std::runtime_error("x"); } catch (std::exception const& e) { return e.what(); }
}
std::string str_scalar(torch::Tensor t) {
  return c10::str("dtype ", t.scalar_type(), " sizes ", t.sizes());
}
"""


def run_case(case: str) -> None:
    import torch
    from torch.utils.cpp_extension import load_inline

    mod = load_inline("probe_ext", cpp_sources=SOURCE, functions=list(CASES), verbose=False)
    fn = getattr(mod, case)
    print(repr(fn(torch.zeros(2, 3)) if case == "str_scalar" else fn(5)))


def main() -> int:
    if len(sys.argv) > 1:
        run_case(sys.argv[1])
        return 0
    run_case("str_plain")  # builds the extension once, outside the per-case processes
    for case in CASES:
        p = subprocess.run(
            [sys.executable, __file__, case], capture_output=True, text=True, timeout=300
        )
        last = (p.stdout + p.stderr).strip().splitlines()[-1:]
        print(case, "rc", p.returncode, last)  # rc -11: SIGSEGV
    return 0


if __name__ == "__main__":
    sys.exit(main())

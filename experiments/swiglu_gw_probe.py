"""One-off probe (session 35): which backward kernel computes silu in the lean step's GPU test
(tests/test_fp8_gpu.py::test_lean_step_runs_the_swiglu_codes_kernel) once the SwiGLU backward
makes gate's and up's g_w codes itself. Result: experiments/results/swiglu_gw_probe.md.

    python3 experiments/swiglu_gw_probe.py OUT_DIR   (a GPU; the driver's part ``probe``)

Writes the generated forward and backward of that test's step with the g_w codes made by the
SwiGLU backward (``gw_*.py``) and by the layers (``nogw_*.py``) and prints the backward's
inductor kernels that compute silu, and its launches.
"""

from __future__ import annotations

import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import hotcompile.autograd as ag  # noqa: E402
from hotcompile.lowering import hot as native  # noqa: E402


def main() -> None:
    from test_abc_swiglu import ResidualSwiGLU
    from test_lowering_gpu import _swiglu_step

    native.SWIGLU_ABC_ATEN_MAX_WIDTH = 0  # the test's setting: swiglu_abc at this width too
    opts = {"lowering": "native", "prefer": "paper", "recipe": "text", "forward": "fp8",
            "abc_swiglu": "fp8", "abc_recompute": "unary"}  # fmt: skip
    out = pathlib.Path(sys.argv[1])
    for name, request in (("gw", ag._swiglu_gw_request), ("nogw", lambda spec, g: None)):
        ag._swiglu_gw_request = request
        code, _ = _swiglu_step(opts, ResidualSwiGLU)
        (out / f"{name}_fwd.py").write_text(code[0])
        (out / f"{name}_bwd.py").write_text(code[1])
        names = re.findall(r"def (triton_\w+)\(", code[1])
        print(name, [n for n in names if "silu" in n])
        print(name, re.findall(r"^\s+(\w+)\.run\(", code[1], re.M))


if __name__ == "__main__":
    main()

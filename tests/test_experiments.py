"""The experiment scripts (experiments/) the GPU tests load run on the CPU too (a renamed helper
once broke one of them, and only the GPU machine noticed)."""

from __future__ import annotations

import torch
from conftest import load_tool


def test_int8_head_check_runs_on_the_cpu() -> None:
    """``tests/test_gpu.py``'s GPT-2 regression test calls this function on CUDA."""
    mod = load_tool("int8_head_check.py", "experiments")
    options = {"gx_scaling": "per_token", "warmup_steps": 1000, "hla": False}
    hot = mod.grads({**options, "compiler": "aot_eager"})[0]
    assert hot and all(torch.isfinite(g).all() for g in hot.values())

"""Every maintained tool in tools/ answers ``--help`` on a CPU-only machine (no CUDA, no Triton)
with a description and examples: a user learns to run it there before reaching a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

TOOLS = [
    "accuracy.py",
    "bench_distributed.py",
    "bench_gemm.py",
    "bench_layers.py",
    "bench_models.py",
    "bench_train.py",
    "coverage.py",
    "gpu_tests.py",
    "readme_tables.py",
]


def test_every_tool_is_listed() -> None:
    """A new script in tools/ is either a maintained tool (listed here) or an experiment
    (experiments/, indexed in experiments/README.md)."""
    assert sorted(p.name for p in (ROOT / "tools").glob("*.py")) == TOOLS


@pytest.mark.slow  # a Python process per tool, each importing torch (~10 s on 2 cores)
@pytest.mark.parametrize("tool", TOOLS)
def test_tool_help_teaches(tool: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / tool), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("usage:") and "examples:" in out.stdout, out.stdout[-2000:]

"""Every maintained tool in tools/ answers ``--help`` on a CPU-only machine (no CUDA, no Triton)
with a description and examples: a user learns to run it there before reaching a GPU."""

from __future__ import annotations

import pytest
from conftest import ROOT, help_text

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


@pytest.mark.slow  # a Python process per tool, each importing torch (~4 s on 2 cores), shared
@pytest.mark.parametrize("tool", TOOLS)  # with test_docs through conftest.help_text
def test_tool_help_teaches(tool: str) -> None:
    out = help_text((f"tools/{tool}",))
    assert out.startswith("usage:") and "examples:" in out, out[-2000:]

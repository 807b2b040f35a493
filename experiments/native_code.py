"""Inductor's generated code for a HOT native backward: what runs, and nothing hidden.

    python3 experiments/native_code.py [--out DIR]

Compiles a two-layer MLP (bf16 autocast) with ``backend="hot", options={"prefer": "paper"}``,
runs one training step, writes every generated module into ``DIR/native_code.py.txt`` and
prints a summary of the backward's wrapper: the kernels it launches (inductor's and HOT's
``triton_op`` kernels), extern GEMMs, and any copy/clone of a full activation or gradient
(a sign that ``triton_op``'s mutation analysis fell back to "every input is mutated").
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import re

import torch
from torch._inductor.utils import run_and_get_code

import hotcompile  # noqa: F401


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    handler = Warnings()
    logging.getLogger("torch").addHandler(handler)
    model = torch.nn.Sequential(
        torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768)
    ).cuda()
    compiled = torch.compile(model, backend="hot", options={"prefer": "paper"})
    x = torch.randn(32, 197, 768, device="cuda", requires_grad=True)

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            y = compiled(x)
        y.float().square().mean().backward()

    _, codes = run_and_get_code(step)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "native_code.py.txt").write_text("\n\n# ====== next module\n\n".join(codes))
    for i, src in enumerate(codes):
        calls = re.findall(r"^\s+(\w+)\.run\(|extern_kernels\.(\w+)\(|(aten\.\w+)", src, re.M)
        names = [next(c for c in t if c) for t in calls]
        clones = re.findall(r".*(?:clone|copy_|as_strided_scatter).*", src)
        print(f"module {i}: {len(names)} launches: {', '.join(names)}")
        print(f"  copies/clones: {len(clones)}")
        for c in clones[:8]:
            print("   ", c.strip()[:150])
    mut = [m for m in handler.seen if "mutat" in m.lower()]
    print("mutation-analysis warnings:", mut[:5] or "none")


if __name__ == "__main__":
    main()

"""The small-GPT-2 check behind test_gpu.py::test_gpt2_tied_head_gradients_under_inductor_cuda.

HOT with INT8 on both paths (g_x in warm-up INT8, no HLA) on a 2-block, 64-wide GPT-2 with the
tied 50257-wide head, one fixed batch, against plain compile's gradients; on CUDA also with
inductor's ``comprehensive_padding`` turned back on, which shows the layout bug of
experiments/results/gpt2_nan_gpu/README.md. Prints, per option set, the four parameters
furthest from the exact gradients (relative difference, and between two backward passes of the
same batch). Run on the H100 on 2026-11-22 (commit a08c548, as ``gp_check.py`` from the
repository root, the same code); its output tail is
experiments/results/gpt2_nan_gpu/run13_int8_head_check_tail.txt.

    python3 experiments/int8_head_check.py     # CUDA: default + padding on; CPU: default only
"""

from __future__ import annotations

import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

import bench_models  # noqa: E402
import bench_train as bench  # noqa: E402
from conftest import rel  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def grads(options: dict | None, repeats: int = 1) -> list[dict[str, torch.Tensor]]:
    """Gradients of ``repeats`` backward passes of the fixed batch; ``options=None``: plain
    compile (inductor on CUDA, aot_eager on the CPU), else ``backend="hot"``."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = bench.WithLoss(bench_models.GPT2(ctx=128, dim=64, depth=2, heads=4)).to(DEV)
    if options is None:
        c = torch.compile(m, backend="aot_eager" if DEV == "cpu" else "inductor")
    else:
        c = torch.compile(m, backend="hot", options=options)
    g = torch.Generator().manual_seed(0)
    tok = torch.randint(50257, (2, 129), generator=g).to(DEV)
    out = []
    for _ in range(repeats):
        m.zero_grad(set_to_none=True)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            c(tok[:, :-1], tok[:, 1:]).backward()
        out.append({n: p.grad.float().clone() for n, p in m.named_parameters()})
    return out


def main() -> int:
    exact = grads(None)[0]
    base = {"gx_scaling": "per_token", "warmup_steps": 1000, "hla": False}
    extra = [{}] if DEV == "cpu" else [{}, {"inductor_config": {"comprehensive_padding": True}}]
    for e in extra:
        o = {**base, **e, **({"compiler": "aot_eager"} if DEV == "cpu" else {})}
        hot = grads(o, 2)
        worst = sorted(
            ((rel(hot[0][n], g), rel(hot[1][n], hot[0][n]), n) for n, g in exact.items()),
            reverse=True,
        )
        print(e, "worst vs exact:", [(f"{a:.3g}", f"{b:.3g}", n) for a, b, n in worst[:4]])
        print(e, "worst repeat:", max(b for a, b, n in worst))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The lowest peak any backend can reach on a benchmark Llama (issue 34's peak targets).

A training step's peak holds the fp32 weights, their gradients and AdamW's two moments
(16 bytes a parameter), the head's logits and what the loss makes of them, plus the blocks'
saved activations. HOT (and torchao) change only the last. This script measures the rest:
the same model with no blocks (``num_hidden_layers=0``: embedding → final norm → head →
cross-entropy), compiled by inductor and trained as ``tools/bench_train.py`` trains it (bf16
autocast, fused AdamW, ``zero_grad(set_to_none=True)``, peak = ``max_memory_allocated`` over
steps after warm-up), then adds 16 bytes for each parameter of the blocks. The sum is a floor:
the full model's step holds all of it at the loss (the weights and optimizer state always,
the logits and their gradient while the blocks' activations are still saved), and blocks that
saved nothing would add nothing more.

Run on a GPU: ``python3 experiments/peak_floor.py --out experiments/results/peak_floor_h200.md``.
"""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
import gpu_script  # noqa: E402  (experiments/, this script's directory)
from bench_models import MODELS  # noqa: E402
from bench_train import WithLoss  # noqa: E402

GiB = 2**30


def blockless(name: str) -> tuple[torch.nn.Module, int]:
    """The benchmark model ``name`` with its config's ``num_hidden_layers`` set to 0, and the
    full model's parameter count."""
    full = MODELS[name].build(False)
    cfg = full.config
    cfg.num_hidden_layers = 0
    return type(full)(cfg), sum(p.numel() for p in full.parameters())


def measure(name: str, steps: int = 3) -> dict:
    spec = MODELS[name]
    model, full_params = blockless(name)
    model = WithLoss(model).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    step_fn = torch.compile(model)
    x, t = spec.batch(spec.default_batch, False, torch.Generator().manual_seed(0))
    x, t = x.cuda(), t.cuda()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, t)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    peak0 = torch.cuda.max_memory_allocated()
    block_params = full_params - params
    return {
        "model": name,
        "params": full_params,
        "block_params": block_params,
        "peak_no_blocks_GiB": peak0 / GiB,
        "static_GiB": 16 * full_params / GiB,
        "floor_GiB": (peak0 + 16 * block_params) / GiB,
    }


def main() -> None:
    args = gpu_script.parse(__doc__)
    rows, results = [], []
    for name in ("llama", "llama8b"):
        r = measure(name)
        results.append(r)
        rows.append(
            f"| {name} | {r['params'] / 1e6:.0f}M | {r['static_GiB']:.2f} | "
            f"{r['peak_no_blocks_GiB']:.2f} | **{r['floor_GiB']:.2f}** |"
        )
    gpu_script.write(
        args.out,
        "Peak floor of the benchmark Llamas (experiments/peak_floor.py)",
        gpu_script.provenance("peak_floor.py", "inductor, bf16 autocast, fused AdamW, 3 steps"),
        [
            "| model | parameters | 16 B each (GiB) | peak without blocks (GiB) | floor (GiB) |",
            "|---|---|---|---|---|",
        ],
        rows,
        results,
    )


if __name__ == "__main__":
    main()

"""The lowest peak any backend can reach on a benchmark Llama (issue 34's peak targets).

HOT (and torchao) change only what the blocks save for the backward. Two moments of a step
hold memory none of them touches:

- the optimizer step: the fp32 weights, their gradients and AdamW's two moments, 16 bytes a
  parameter, with every activation freed;
- the loss, at the forward's end: the weights and moments (12 bytes a parameter: the
  gradients are not allocated yet, ``zero_grad(set_to_none=True)``), the head's logits and
  what the loss makes of them, and the blocks' saved activations.

The second is measured on the same model with no blocks (``num_hidden_layers=0``: embedding →
final norm → head → cross-entropy), compiled by inductor and trained as
``tools/bench_train.py`` trains it (bf16 autocast, fused AdamW, peak = ``max_memory_allocated``
over steps after warm-up), plus 12 bytes for each parameter of the blocks. The floor is the
larger of the two: a step whose blocks saved nothing would still reach it. The difference
between a target and the loss moment's floor is what the blocks may save at most.

Run on a GPU: ``python3 experiments/peak_floor.py --out experiments/results/peak_floor_h200.md``;
``--from FILE.json`` rebuilds the table from a run's measured peaks (no GPU).
"""

from __future__ import annotations

import json
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
    """:func:`floors` of benchmark model ``name`` from its blockless step's measured peak."""
    spec = MODELS[name]
    model, full_params = blockless(name)
    model = WithLoss(model).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    step_fn = torch.compile(model)
    x, t = spec.batch(spec.default_batch, False, torch.Generator().manual_seed(0))
    x, t = x.cuda(), t.cuda()

    step = gpu_script.training_step(step_fn, opt, x, t)
    gpu_script.warm_up(step)
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    peak0 = torch.cuda.max_memory_allocated()
    return floors(name, full_params, full_params - params, peak0 / GiB)


def floors(name: str, params: int, block_params: int, peak0_gib: float) -> dict:
    """The two moments' floors (GiB) from the measured peak without blocks."""
    optimizer = 16 * params / GiB
    loss = peak0_gib + 12 * block_params / GiB
    return {
        "model": name,
        "params": params,
        "block_params": block_params,
        "peak_no_blocks_GiB": peak0_gib,
        "optimizer_step_GiB": optimizer,
        "loss_without_activations_GiB": loss,
        "floor_GiB": max(optimizer, loss),
    }


def main() -> None:
    args = gpu_script.parse(__doc__, rebuild=True)
    if args.rebuild:  # the table again from a run's measured peaks
        measured = json.loads(pathlib.Path(args.rebuild).read_text())
        results = [
            floors(m["model"], m["params"], m["block_params"], m["peak_no_blocks_GiB"])
            for m in measured
        ]
        meta = measured_meta(args.out)
    else:
        results = [measure(name) for name in ("llama", "llama8b")]
        meta = gpu_script.provenance(
            "peak_floor.py", "inductor, bf16 autocast, fused AdamW, peak over 3 steps"
        )
    rows = [
        f"| {r['model']} | {r['params'] / 1e6:.0f}M | {r['optimizer_step_GiB']:.2f} | "
        f"{r['peak_no_blocks_GiB']:.2f} | {r['loss_without_activations_GiB']:.2f} | "
        f"**{r['floor_GiB']:.2f}** |"
        for r in results
    ]
    gpu_script.write(
        args.out,
        "Peak floor of the benchmark Llamas (experiments/peak_floor.py)",
        meta,
        [
            "| model | parameters | optimizer step: 16 B a parameter | peak without blocks "
            "| loss: that + 12 B a block parameter | floor (GiB) |",
            "|---|---|---|---|---|---|",
        ],
        rows,
        results,
    )


def measured_meta(out: str) -> str:
    """The provenance line of the file being rebuilt (its first line after the title)."""
    path = pathlib.Path(out)
    lines = path.read_text().splitlines() if out and path.exists() else []
    return lines[2] if len(lines) > 2 else "rebuilt from measured peaks"


if __name__ == "__main__":
    main()

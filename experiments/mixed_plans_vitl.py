#!/usr/bin/env python3
"""Issue 36's repro on the GPU: does a mixed plan (HOT on the ``fc2`` layers only, bf16 on the
rest) train timm's ViT-L/16 worse than bf16 and than HOT everywhere, or was the one seed that
said so the chaos of memorising a single batch?

The issue's setting, over several seeds: ViT-L/16 (timm, random init, 1000 classes), one fixed
batch of 64 random images with random labels (drawn from the seed), bf16 autocast, fused AdamW
lr 1e-4, 25 steps, the loss of every step. Variants, each compiled once and re-initialised per
seed (the parameters are copied in place, so no recompile; the speed gate's verdicts of
``hot_default`` are cached after the first seed):

- ``bf16``: plain ``torch.compile`` (inductor);
- ``hot_all``: ``prefer="paper"``, HOT on every eligible layer;
- ``hot_fc2``: ``prefer="paper", include=("*fc2",)``: the H200 gate's plan of the issue;
- ``hot_fc2_exact``: the same plan with ``exact=True`` (every transform and quantizer off):
  the control that separates "the mixed-plan machinery changes the gradient" from "HOT's
  numerics on fc2 do";
- ``hot_default``: the speed gate's own plan on this GPU (recorded).

Writes ``OUT/mixed_plans_vitl.json`` (losses per step, plans) and ``.md`` (a table of the loss
at steps 5, 10, 15, 25 and the steps to reach 0.1, mean over seeds). A CUDA GPU is needed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import sys
import time

import torch

VARIANTS: dict[str, dict | None] = {
    "bf16": None,
    "hot_all": {"prefer": "paper"},
    "hot_fc2": {"prefer": "paper", "include": ("*fc2",)},
    "hot_fc2_exact": {"prefer": "paper", "include": ("*fc2",), "exact": True},
    "hot_default": {},
}


def fresh_state(seed: int) -> dict[str, torch.Tensor]:
    """ViT-L/16's initial weights for ``seed`` (timm's own init, on the CPU)."""
    import timm

    torch.manual_seed(seed)
    return timm.create_model("vit_large_patch16_224", num_classes=1000).state_dict()


def train(compiled, model, seed: int, steps: int, batch: int, device) -> list[float]:
    """``steps`` AdamW steps on one fixed batch drawn from ``seed``; the loss of each step."""
    with torch.no_grad():
        for k, v in fresh_state(seed).items():
            model.state_dict()[k].copy_(v)
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(batch, 3, 224, 224, generator=g).to(device)
    y = torch.randint(0, 1000, (batch,), generator=g).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    losses = []
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(compiled(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def steps_to(curve: list[float], level: float) -> int | None:
    """First step (1-based) whose loss is at or below ``level``; None if never."""
    return next((i + 1 for i, v in enumerate(curve) if v <= level), None)


def markdown(doc: dict) -> str:
    seeds = doc["seeds"]
    lines = [
        "# Mixed plans on ViT-L/16, one fixed batch (issue 36)",
        "",
        f"- device: {doc['device']}; torch {doc['torch']}; date {doc['date']}; "
        f"command: `{doc['command']}`",
        f"- one fixed batch of {doc['batch']} random images / labels per seed, bf16 autocast, "
        f"fused AdamW lr 1e-4, {doc['steps']} steps; seeds {seeds}",
        "",
        "| variant | HOT layers | loss @5 | @10 | @15 | @25 (per seed) | steps to 0.1 (per seed) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in doc["variants"].items():
        curves = [r["losses"][str(s)] for s in seeds if str(s) in r["losses"]]
        if not curves:
            continue

        def at(i: int, curves=curves) -> str:
            return f"{statistics.fmean(c[i - 1] for c in curves):.3g}"

        last = ", ".join(f"{c[-1]:.3g}" for c in curves)
        reach = ", ".join(str(steps_to(c, 0.1) or "–") for c in curves)
        lines.append(f"| {name} | {r.get('hot_layers', '–')} | {at(5)} | {at(10)} | {at(15)} | "
                     f"{at(doc['steps'])} ({last}) | {reach} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: pathlib.Path) -> None:
    """Loss per step of each variant (mean over seeds, log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, r in doc["variants"].items():
        curves = list(r["losses"].values())
        mean = [statistics.fmean(c[i] for c in curves) for i in range(len(curves[0]))]
        ax.plot(range(1, len(mean) + 1), mean, lw=1.3, label=f"{name} ({len(curves)} seeds)")
    ax.set(yscale="log", xlabel="step", ylabel="training loss (one fixed batch)",
           title=f"ViT-L/16, mixed plans ({doc['device']})")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("."))
    p.add_argument("--replot", type=pathlib.Path, metavar="JSON",
                   help="train nothing: write the table and plot of this result file")  # fmt: skip
    args = p.parse_args(argv)
    if args.replot:
        doc = json.loads(args.replot.read_text())
        args.replot.with_suffix(".md").write_text(markdown(doc))
        plot(doc, args.replot.with_suffix(".png"))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import timm

    from hotcompile import HotBackend

    device = torch.device("cuda")
    doc = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
        "seeds": args.seeds, "steps": args.steps, "batch": args.batch, "variants": {},
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.variants:
        torch._dynamo.reset()
        model = timm.create_model("vit_large_patch16_224", num_classes=1000).to(device)
        options = VARIANTS[name]
        backend = None if options is None else HotBackend(**options)
        compiled = torch.compile(model, backend=backend or "inductor")
        entry: dict = {"options": {k: list(v) if isinstance(v, tuple) else v
                                   for k, v in (options or {}).items()}, "losses": {}}  # fmt: skip
        for seed in args.seeds:
            t0 = time.perf_counter()
            entry["losses"][str(seed)] = train(compiled, model, seed, args.steps, args.batch,
                                               device)  # fmt: skip
            print(f"{name} seed {seed}: loss @25 {entry['losses'][str(seed)][-1]:.4g} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
            if backend is not None and "plan" not in entry:
                rows = {}
                for lp in backend.layers:
                    d = lp.describe()
                    rows.setdefault(d["layer"], {k: str(v) for k, v in d.items()})
                entry["plan"] = list(rows.values())
                entry["hot_layers"] = sum(r["path"] == "hot" for r in rows.values())
            doc["variants"][name] = entry
            (args.out / "mixed_plans_vitl.json").write_text(json.dumps(doc, indent=1) + "\n")
            (args.out / "mixed_plans_vitl.md").write_text(markdown(doc))
        del model, compiled
        torch.cuda.empty_cache()
    plot(doc, args.out / "mixed_plans_vitl.png")
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

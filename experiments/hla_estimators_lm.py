"""Is HLA's damage to a language model its bias or its noise? Weight-gradient estimators compared.

The byte LM of ``tools/accuracy.py`` loses ~17% validation loss with HOT's defaults, and the
ablations pin it on HLA (docs/accuracy.md). HLA's weight gradient ``g_yᵀ Π x`` (Π: projection
onto 8 of the 16 Walsh–Hadamard coefficients of each block of 16 consecutive tokens) is
*biased*: for token sequences that look like white noise, ``E[g_yᵀ Π x] ≈ ½·g_yᵀ x`` plus
cross-token terms ``Π_ij g_i x_jᵀ`` of the same order. Two ways to make it unbiased, at the same
rank and cost, each drawn afresh per layer and step and applied to g_y and x alike:

- ``random_rows``: a random 8 of the 16 rows, times 2 (``E[2·Π_S] = I``);
- ``random_signs``: random ±1 per token before the fixed rows, times 2 (``E[D Π D] = ½·I``).

If the unbiased estimators train as well as the exact gradient, the bias is the problem (and an
unbiased HLA is the fix); if they train no better than HLA, the cross-token noise is, and no
rank-8 projection along the tokens will do for text. ``half`` (½ · exact) checks that the scale
alone is harmless under AdamW. Everything in float32, no quantization, exact g_x: only the g_w
estimator differs. Eager PyTorch on the CPU (the estimators need a fresh draw per step, which a
compiled graph's constant row list cannot take).

    python3 experiments/hla_estimators_lm.py [--steps 200] [--seeds 0 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
import accuracy  # noqa: E402  (the LM, its data and settings: one definition)

from hotcompile.hla import hla_rows, hla_transform  # noqa: E402

LP_L1 = hla_rows("lp_l1", 8)
ESTIMATORS = ("exact", "hla", "random_rows", "random_signs", "half")


def weight_grad(
    gy3: torch.Tensor, x3: torch.Tensor, how: str, gen: torch.Generator
) -> torch.Tensor:
    """``g_w`` ``[O, I]`` from ``gy3 [N, S, O]`` and ``x3 [N, S, I]`` by estimator ``how``."""
    if how == "exact":
        return gy3.flatten(0, 1).t() @ x3.flatten(0, 1)
    if how == "half":
        return 0.5 * (gy3.flatten(0, 1).t() @ x3.flatten(0, 1))
    rows, scale = LP_L1, 1.0
    if how == "random_rows":
        rows = tuple(sorted(torch.randperm(16, generator=gen)[:8].tolist()))
        scale = 2.0
    elif how == "random_signs":
        signs = torch.randint(0, 2, (gy3.shape[0], gy3.shape[1], 1), generator=gen).float() * 2 - 1
        gy3, x3, scale = gy3 * signs, x3 * signs, 2.0
    elif how != "hla":
        raise ValueError(f"unknown estimator {how!r}")
    g_t, x_t = hla_transform(gy3, 0, rows), hla_transform(x3, 0, rows)
    return scale * (g_t.t() @ x_t) / 16  # H_16's rows have norm 4: Π = Tᵀ T / 16


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, how, gen):
        ctx.save_for_backward(x, w)
        ctx.how, ctx.gen, ctx.has_b = how, gen, b is not None
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        gx = gy @ w
        gy3 = gy.reshape(-1, x.shape[-2], gy.shape[-1])
        x3 = x.reshape(-1, x.shape[-2], x.shape[-1])
        gw = weight_grad(gy3, x3, ctx.how, ctx.gen)
        gb = gy.flatten(0, -2).sum(0) if ctx.has_b else None
        return gx, gw, gb, None, None


class EstLinear(nn.Module):
    """``nn.Linear`` (same parameters) whose weight gradient comes from an estimator."""

    def __init__(self, lin: nn.Linear, how: str, gen: torch.Generator) -> None:
        super().__init__()
        self.weight, self.bias, self.how, self.gen = lin.weight, lin.bias, how, gen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Linear.apply(x, self.weight, self.bias, self.how, self.gen)


def swap_linears(model: nn.Module, how: str, gen: torch.Generator) -> int:
    """Every ``nn.Linear`` (blocks and head, what HOT rewrites) -> :class:`EstLinear`."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, EstLinear(child, how, gen))
                n += 1
    return n


def train(how: str, seed: int, steps: int, s: accuracy.Settings) -> dict:
    """One run: the accuracy study's LM, data, optimizer and schedule; returns val loss."""
    torch.manual_seed(seed)
    model = accuracy.ByteLM(s.lm_dim, s.lm_depth, ctx=s.lm_ctx)
    n = swap_linears(model, how, torch.Generator().manual_seed(1000 + seed))
    train_text = accuracy.load_text("lib", "train", s.text_bytes)
    val = accuracy.val_windows(accuracy.load_text("lib", "val", s.text_bytes), s.lm_ctx,
                               s.val_windows)  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    curve = accuracy._fit(
        model, model, "fp32", accuracy.batches(train_text, s.lm_ctx, s.lm_batch, gen), steps,
        2e-3, accuracy._lm_loss, s.log_every, lambda k: None,
    )  # fmt: skip
    return {
        "estimator": how,
        "seed": seed,
        "linears": n,
        "val_loss": accuracy.lm_val_loss(model, val),
        "final_train_loss": curve[-1],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="experiments/hla_estimators_lm.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=ESTIMATORS)
    ap.add_argument("--out", type=pathlib.Path, default=None, help="write the table here too")
    a = ap.parse_args(argv)
    torch.set_flush_denormal(True)
    s = accuracy.Settings()
    runs = []
    for how in a.estimators:
        for seed in a.seeds:
            r = train(how, seed, a.steps, s)
            runs.append(r)
            print(json.dumps(r), flush=True)
    exact = [r["val_loss"] for r in runs if r["estimator"] == "exact"]
    ref = sum(exact) / len(exact) if exact else None
    lines = [
        f"# g_w estimators on the byte LM (experiments/hla_estimators_lm.py), torch "
        f"{torch.__version__}, {accuracy._cpu_model()}, {datetime.date.today().isoformat()}, "
        f"{a.steps} steps, seeds {a.seeds}",
        "",
        "| estimator | val loss (mean) | per seed | vs exact |",
        "|---|---|---|---|",
    ]
    for how in a.estimators:
        vals = [r["val_loss"] for r in runs if r["estimator"] == how]
        mean = sum(vals) / len(vals)
        rel = f"{100 * (mean / ref - 1):+.2f}%" if ref else "-"
        lines.append(f"| {how} | {mean:.4f} | {', '.join(f'{v:.4f}' for v in vals)} | {rel} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n\n```\n" + "\n".join(json.dumps(r) for r in runs) + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

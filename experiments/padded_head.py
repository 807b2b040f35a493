"""The GPT-2 gradient bug narrowed to one layer: a tied, 50257-wide head under ``backend="hot"``.

experiments/grad_consistency.py found (H100, torch 2.11, 2026-11-22) that HOT's gradients on the
GPU under inductor are neither repeatable nor close to HOT's gradients elsewhere, while the same
model under ``aot_eager`` on the GPU, under inductor with ``comprehensive_padding=False``, or
with the head excluded, behaves like the CPU. Inductor pads the row stride of a
``[tokens, 50257]`` buffer (50257 is not a multiple of the alignment); this script isolates that:
embedding -> LayerNorm -> tied head -> cross-entropy, one backward, compared against the same
graph under ``aot_eager`` with the pure-PyTorch reference ops, for

- the compiler: ``aot_eager``, inductor, inductor with ``comprehensive_padding`` off;
- the ops' CUDA implementation: hotcompile's kernels, or the references installed as the CUDA
  kernels (which separates a kernel bug from a graph bug).

Inductor's generated code (what the backward passes to ``hq_grad_input`` /
``hla_grad_weight``): run with ``TORCH_LOGS=output_code``.

    python3 experiments/padded_head.py [--device cuda] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import torch
import torch.nn.functional as F
from grad_consistency import reference_kernels, rel

import hotcompile

OPTS = {"gx_scaling": "per_token", "rounding": "pseudo_stochastic"}


class TiedHead(torch.nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight
        torch.nn.init.normal_(self.emb.weight, std=0.02)  # GPT-2's initialisation

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.ln(self.emb(x)))
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def grads(model, x, y, device: str, compiler: str, pad: bool, ref_ops: bool) -> dict:
    torch._dynamo.reset()
    opts = dict(OPTS, compiler=compiler)
    if compiler == "inductor":
        opts["inductor_config"] = {"comprehensive_padding": pad, "disable_padding_cpu": not pad}
    c = torch.compile(model, backend="hot", options=opts)
    out = []
    with reference_kernels(ref_ops):
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = c(x, y)
            loss.backward()
            out.append({n: p.grad.detach().float().cpu() for n, p in model.named_parameters()})
    return {"loss": loss.item(), "grads": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256, help="batch 2 × tokens/2")
    ap.add_argument("--out", default=None, help="directory for padded_head.{json,md}")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dev = args.device
    model = TiedHead(args.vocab, args.dim).to(dev)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(args.vocab, (2, args.tokens // 2), generator=g).to(dev)
    y = torch.randint(args.vocab, (2, args.tokens // 2), generator=g).to(dev)
    runs = [  # (name, compiler, padding, reference ops as the CUDA kernels)
        ("aot_eager, reference ops", "aot_eager", False, True),
        ("aot_eager, kernels", "aot_eager", False, False),
        ("inductor padded, reference ops", "inductor", True, True),
        ("inductor padded, kernels", "inductor", True, False),
        ("inductor unpadded, reference ops", "inductor", False, True),
        ("inductor unpadded, kernels", "inductor", False, False),
    ]
    res = {}
    for name, comp, pad, ref in runs:
        res[name] = grads(model, x, y, dev, comp, pad, ref)
        print(f"{name}: loss {res[name]['loss']:.6f}", flush=True)
    base = res["aot_eager, reference ops"]["grads"][0]
    md = [
        "# Tied 50257-wide head under HOT: compilers × kernels (padded_head.py)",
        "",
        f"- device: {torch.cuda.get_device_name() if dev == 'cuda' else dev}; torch "
        f"{torch.__version__}; hotcompile {hotcompile.__version__}; "
        f"{datetime.date.today().isoformat()}",
        f"- vocab {args.vocab}, dim {args.dim}, {args.tokens} tokens, bf16 autocast, HOT {OPTS}",
        "- columns: relative gradient difference against `aot_eager` + reference ops (run 1), "
        "and between the run's two backward passes",
        "",
        "| run | loss | " + " | ".join(f"{n} vs base" for n in base)
        + " | " + " | ".join(f"{n} repeat" for n in base) + " |",
        "|---|---|" + "---|" * (2 * len(base)),
    ]  # fmt: skip
    rows = []
    for name, r in res.items():
        vs = {n: rel(r["grads"][0][n], base[n]) for n in base}
        rep = {n: rel(r["grads"][1][n], r["grads"][0][n]) for n in base}
        rows.append({"run": name, "loss": r["loss"], "vs_base": vs, "repeat": rep})
        md.append(
            f"| {name} | {r['loss']:.6f} | "
            + " | ".join(f"{v:.2e}" for v in vs.values())
            + " | "
            + " | ".join(f"{v:.2e}" for v in rep.values())
            + " |"
        )
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "padded_head.md").write_text(text)
        info = {"device": dev, "torch": torch.__version__, "argv": sys.argv[1:], "rows": rows}
        (out / "padded_head.json").write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

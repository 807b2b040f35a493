"""Bisect the NaN of GPT-2 small under ``backend="hot"`` (tools/results/bench_train.md).

On an H200 (torch 2.11, 2026-11-22) the HOT variant of tools/bench_train.py's GPT-2 small
(tied 50257-wide head, batch 8 × 1024, bf16 autocast, AdamW lr 1e-4) reached a NaN loss within
13 steps; the first non-finite gradient appeared between the head's HOT g_x and the last block.
This script trains the same model for a few steps under several option sets and reports, per
set, the first step whose loss or gradients are non-finite and the first such parameter. The
failure turned out intermittent (the same set finite in one process, NaN in another:
experiments/results/gpt2_nan_gpu/README.md), so ``--repeat N`` runs each set N times in fresh
processes and reports failure rates, and ``--shadow`` checks the HOT kernels on the real
inputs of the failing step.

    python3 experiments/gpt2_nan.py --out DIR            # on a CUDA GPU, ~3-5 minutes
    python3 experiments/gpt2_nan.py --small --device cpu # a small model on CPU (smoke test)
    python3 experiments/gpt2_nan.py --repeat 5 --steps 3 --variants hot,hot_kernels_torch
                                                          # failure rates, fresh process each
    python3 experiments/gpt2_nan.py --shadow --steps 3   # which layer's kernel departs from
                                                          # the reference (kernels.shadow)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import pathlib
import sys
import time
from collections.abc import Callable

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from bench_models import GPT2  # noqa: E402  (moved there from bench_train)
from bench_train import WithLoss  # noqa: E402

import hotcompile  # noqa: E402,F401
from hotcompile import lqs  # noqa: E402

#: name -> hotcompile options (None: plain inductor, the reference)
VARIANTS: dict[str, dict | None] = {
    "inductor": None,
    "hot": {},
    "hot_exact": {"exact": True},
    "hot_no_head": {"exclude": ["model.head"]},
    "hot_per_token": {"gx_scaling": "per_token"},
    "hot_per_tensor": {"gx_scaling": "per_tensor"},
    "hot_no_abc": {"abc": False},
    "hot_maxabs_w": {"weight_scale": "maxabs"},
    "hot_no_hla": {"hla": False},
    "hot_kernels_triton": {"kernels": "triton"},
    "hot_kernels_torch": {"kernels": "torch"},
    "hot_kernels_cuda": {"kernels": "cuda"},
}


def setup(
    opts: dict | None, small: bool, batch: int, device: str, compiler: str | None = None
) -> tuple[torch.nn.Module, Callable, torch.Tensor, torch.Tensor]:
    """GPT-2 (with its loss) from seed 0, compiled, and its fixed batch ``(x, y)`` of random
    tokens. ``opts=None``: plain ``torch.compile``; else ``backend="hot"`` with ``opts``.
    ``small``: 2 blocks, 64 wide, context 128, the 50257-wide tied head kept. ``compiler``: the
    inner compiler of both (default: inductor, HOT on the CPU aot_eager)."""
    torch._dynamo.reset()
    lqs.reset()  # the layer names repeat across runs: each starts from a fresh LQS state
    torch.manual_seed(0)
    dev = torch.device(device)
    if small:
        model, ctx = GPT2(vocab=50257, ctx=128, dim=64, depth=2, heads=4), 128
    else:
        model, ctx = GPT2(), 1024
    m = WithLoss(model).to(dev)
    if opts is None:
        c = torch.compile(m) if compiler is None else torch.compile(m, backend=compiler)
    else:
        o = dict(opts)
        if compiler is not None:
            o["compiler"] = compiler
        elif dev.type == "cpu":
            o.setdefault("compiler", "aot_eager")
        c = torch.compile(m, backend="hot", options=o)
    g = torch.Generator().manual_seed(0)
    tok = torch.randint(50257, (batch, ctx + 1), generator=g).to(dev)
    return m, c, tok[:, :-1].contiguous(), tok[:, 1:].contiguous()


def run(name: str, opts: dict | None, args: argparse.Namespace) -> dict:
    dev = torch.device(args.device)
    m, c, x, y = setup(opts, args.small, 4 if args.small else args.batch, args.device)
    opt = torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.05)
    res = {"variant": name, "options": opts, "first_bad_step": None, "first_bad": None}
    shadowing = args.shadow and opts is not None and dev.type == "cuda"
    if shadowing:  # every CUDA kernel call of the HOT ops also runs the reference
        from hotcompile.kernels import shadow

        shadow.clear()
        shadow.enable()
    losses: list[float] = []
    gmax: list[float] = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = c(x, y)
        loss.backward()
        losses.append(loss.item())
        # the largest finite gradient entry per step: a blow-up before the NaN shows here
        gmax.append(
            max(
                (p.grad.float().nan_to_num(0, 0, 0).abs().max().item() for p in m.parameters()
                 if p.grad is not None),
                default=0.0,
            )
        )  # fmt: skip
        bad = [
            n for n, p in m.named_parameters() if p.grad is not None and not p.grad.isfinite().all()
        ]
        if not torch.isfinite(loss) or bad:
            res["first_bad_step"] = step
            res["first_bad"] = (
                "loss" if not torch.isfinite(loss) else bad[-1]
            )  # last = nearest the loss
            res["nonfinite_params"] = len(bad)
            res["nonfinite_first_last"] = bad[:3] + bad[-3:]
            break
        opt.step()
    if shadowing:
        shadow.disable()
        res["shadow"] = [dataclasses.asdict(r) for r in shadow.records()]
        res["shadow_table"] = shadow.table(24)
        print(f"--- {name}: kernels vs reference, worst first\n{res['shadow_table']}", flush=True)
    res["losses"] = losses
    res["max_abs_grad"] = gmax
    res["seconds"] = time.perf_counter() - t0
    del m, c, opt
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def _write(out: pathlib.Path, args: argparse.Namespace, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    info = {
        "device": str(args.device),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "command": "python3 experiments/gpt2_nan.py " + " ".join(sys.argv[1:]),
        "rows": rows,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    (out / "gpt2_nan.json").write_text(json.dumps(info, indent=1, default=str))


def _repeated(name: str, args: argparse.Namespace, argv: list[str]) -> dict:
    """``name`` run ``args.repeat`` times, each in a fresh process (its own allocator, kernel
    caches and dispatcher state); the rows of every run and how many went non-finite."""
    import subprocess
    import tempfile

    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            # the same flags; argparse keeps the last of a repeated option
            cmd = [sys.executable, __file__, *argv, "--variants", name, "--repeat", "0"]
            cmd += ["--out", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            try:
                doc = json.loads((pathlib.Path(tmp) / "gpt2_nan.json").read_text())
                runs.append(doc["rows"][0])
            except (OSError, ValueError, IndexError, KeyError):
                runs.append({"variant": name, "error": (proc.stderr or "no output")[-500:]})
    bad = sum(r.get("first_bad_step") is not None for r in runs)
    return {"variant": name, "options": VARIANTS[name], "repeat": args.repeat,
            "nonfinite_runs": bad, "runs": runs}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=None, help="directory for gpt2_nan.json (default: print only)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--batch", type=int, default=8, help="sequences of 1024 tokens (default 8)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument(
        "--small", action="store_true", help="a 2-block, 64-wide GPT-2 (CPU smoke test)"
    )
    ap.add_argument(
        "--shadow",
        action="store_true",
        help="run every CUDA kernel call next to the reference (hotcompile.kernels.shadow) "
        "and report per layer how far the kernels are from it",
    )
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    ap.add_argument(
        "--repeat",
        type=int,
        default=0,
        help="run every variant N times, each in a fresh Python process, and report how many "
        "went non-finite (the NaN is intermittent: one run per setting proves little)",
    )
    args = ap.parse_args(argv)
    rows: list[dict] = []
    for name in args.variants.split(","):
        if args.repeat:
            r = _repeated(name, args, argv if argv is not None else sys.argv[1:])
        else:
            try:
                r = run(name, VARIANTS[name], args)
            except Exception as e:  # noqa: BLE001 - a failing variant is a finding
                r = {"variant": name, "error": f"{type(e).__name__}: {e}"[:500]}
        rows.append(r)
        bad = r.get("first_bad_step")
        what = r.get("error") or (
            f"non-finite at step {bad}: {r['first_bad']}" if bad is not None else "finite"
        )
        if args.repeat:
            what = f"{r['nonfinite_runs']}/{args.repeat} runs non-finite (first bad steps: "
            what += f"{[x.get('first_bad_step') for x in r['runs']]})"
        print(f"{name:20s} {what}", flush=True)
        if args.out:  # after every variant: a run cut short keeps what it found
            _write(pathlib.Path(args.out), args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

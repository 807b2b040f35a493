"""Are HOT's gradients on the GPU the gradients HOT computes on the CPU — and the same every time?

The GPT-2 NaN of experiments/results/gpt2_nan_gpu/README.md is intermittent, and even the GPU runs
that stay finite learned less in their first step than the same model under HOT on the CPU
(step-1 loss 10.94 on the H200 vs 10.73 on the CPU, batch 8; inductor: 10.69). With
deterministic rounding (``pseudo_stochastic``) and a fixed quantizer per layer (no LQS), HOT's
backward is a fixed function of the weights and the batch, so:

1. **repeatability** — the same forward/backward on the device, ``--repeats`` times on the same
   weights and batch (no optimizer step), must give the same gradients up to the float order of
   atomics (SAWB sums, ~1e-7). A parameter whose gradient changes between repeats is being
   computed from memory that something else writes;
2. **device vs CPU** — the device's HOT gradients against the CPU's HOT gradients (the
   pure-PyTorch reference ops, ``aot_eager``) for the same weights and batch: equal up to bf16
   rounding (~1e-2 relative). The parameter with the largest gap names where to look;
3. for scale, each side's HOT gradients against its own exact (plain compile) gradients — the
   method's own error, which should be alike on both sides.

    python3 experiments/grad_consistency.py --out DIR                # GPT-2 small, batch 2
    python3 experiments/grad_consistency.py --small --device cpu     # smoke test (CPU only)

Writes ``grad_consistency.json`` and ``grad_consistency.md`` (worst parameters first).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import pathlib
import sys
import time
from collections.abc import Callable

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "experiments"))

from gpt2_nan import setup  # noqa: E402

#: a fixed quantizer per layer (LQS would calibrate with exact g_x first); deterministic rounding
HOT_OPTIONS = {"gx_scaling": "per_token", "rounding": "pseudo_stochastic"}


@contextlib.contextmanager
def reference_kernels(on: bool):
    """The ops' pure-PyTorch references installed as their CUDA kernels (``on``), restored
    to hotcompile's kernels afterwards."""
    if not on or not torch.cuda.is_available():
        yield
        return
    from hotcompile import kernels, ops

    kernels.register()
    names = kernels.cuda_kernels()
    kernels.install({n: getattr(ops, n)._init_fn for n in names})
    try:
        yield
    finally:
        kernels.install(kernels.cuda_kernels())


def _fingerprint(t: torch.Tensor) -> tuple:
    """What identifies a tensor's contents across repeats: shape, strides, dtype, the float64
    sum and absolute sum of its finite entries, and its non-finite count."""
    f = t.detach().double()
    fin = torch.isfinite(f)
    z = torch.where(fin, f, 0.0)
    return (
        tuple(t.shape),
        tuple(t.stride()),
        str(t.dtype).replace("torch.", ""),
        z.sum().item(),
        z.abs().sum().item(),
        int((~fin).sum().item()),
    )


class Tracer:
    """Records every CUDA call of the HOT ops in order: the op, its layer, and a fingerprint of
    each tensor input and output. Two repeats of the same step must give the same trace; the
    first call whose *inputs* differ names the stretch of the graph (between the previous HOT
    call and this one) that computed from changed memory, and a call whose inputs agree but
    whose *outputs* differ names a kernel that is not a function of its inputs."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def wrap(self, name: str, fn: Callable) -> Callable:
        def run(*args):
            ins = [_fingerprint(a) for a in args if isinstance(a, torch.Tensor)]
            out = fn(*args)
            outs = [_fingerprint(o) for o in (out if isinstance(out, tuple) else (out,))]
            layer = next((a for a in reversed(args) if isinstance(a, str) and a), "")
            self.calls.append({"op": name, "layer": layer, "in": ins, "out": outs})
            return out

        return run

    def __enter__(self) -> Tracer:
        from hotcompile import kernels

        if not kernels.register():
            raise RuntimeError("--trace needs the CUDA kernels (CUDA and Triton)")
        kernels.install({n: self.wrap(n, f) for n, f in kernels.cuda_kernels().items()})
        return self

    def __exit__(self, *exc) -> None:
        from hotcompile import kernels

        kernels.install(kernels.cuda_kernels())


def _close(a: tuple, b: tuple) -> bool:
    """Same shape/strides/dtype/non-finite count and sums equal up to atomics' float order."""
    if a[:3] != b[:3] or a[5] != b[5]:
        return False
    return all(abs(x - y) <= 1e-5 * max(abs(x), abs(y), 1e-30) for x, y in zip(a[3:5], b[3:5]))


def trace_diff(traces: list[list[dict]]) -> list[str]:
    """Markdown lines: per call of the first trace, whether later repeats saw the same inputs
    and produced the same outputs (the first divergences first)."""
    lines = [
        "| # | op | layer | inputs: shape / strides | inputs equal in every repeat | outputs equal "
        "| first input / output (sum, abs sum, non-finite), repeat 1 vs the first differing "
        "repeat |",
        "|---|---|---|---|---|---|---|",
    ]
    first = traces[0]
    shown = 0
    for i, call in enumerate(first):
        others = [t[i] for t in traces[1:] if i < len(t)]
        bad_in = [j for j in range(len(call["in"])) if any(
            not _close(call["in"][j], o["in"][j]) for o in others)]  # fmt: skip
        bad_out = [j for j in range(len(call["out"])) if any(
            not _close(call["out"][j], o["out"][j]) for o in others)]  # fmt: skip
        detail = ""
        if bad_in or bad_out:
            k, which = (bad_in[0], "in") if bad_in else (bad_out[0], "out")
            o = next(o for o in others if not _close(call[which][k], o[which][k]))
            detail = f"{which}[{k}] {call[which][k][0]}: {call[which][k][3:]} vs {o[which][k][3:]}"
        if detail or shown < 3 or i == len(first) - 1:
            geo = ", ".join(f"{f[0]} / {f[1]}" for f in call["in"])
            lines.append(
                f"| {i} | {call['op']} | {call['layer']} | {geo} | "
                f"{'no: ' + str(bad_in) if bad_in else 'yes'} | "
                f"{'no: ' + str(bad_out) if bad_out else 'yes'} | {detail} |"
            )
            shown += 1
    return lines


def grads_of(
    device: str,
    options: dict | None,
    small: bool,
    batch: int,
    repeats: int,
    cpu_threads: int,
    compiler: str | None = None,
    traces: list | None = None,
) -> tuple[list[dict[str, torch.Tensor]], list[float]]:
    """Gradients (on the CPU, float32) of ``repeats`` forward/backward passes of the same
    weights and batch on ``device``; ``options=None``: plain ``torch.compile``. ``compiler``:
    inductor or aot_eager (default: inductor on CUDA, aot_eager on the CPU). ``traces``: a
    list that receives each repeat's :class:`Tracer` calls (CUDA, HOT only)."""
    compiler = compiler or ("aot_eager" if device == "cpu" else "inductor")
    if device == "cpu":
        torch.set_num_threads(cpu_threads)
    m, c, x, y = setup(options, small, batch or 2, device, compiler)
    out, losses = [], []
    tracing = traces is not None and options is not None and device == "cuda"
    for _ in range(repeats):
        m.zero_grad(set_to_none=True)
        with contextlib.ExitStack() as stack:
            tracer = stack.enter_context(Tracer()) if tracing else None
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = c(x, y)
            loss.backward()
            if device == "cuda":
                torch.cuda.synchronize()
        if tracer is not None:
            traces.append(tracer.calls)
        losses.append(loss.item())
        out.append({n: p.grad.detach().float().cpu() for n, p in m.named_parameters()})
    return out, losses


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ over the entries finite in both; inf when either has a non-finite entry."""
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    d = (a.double() - b.double()).norm().item()
    n = b.double().norm().item()
    return d / n if n > 0 else (0.0 if d == 0 else float("inf"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="a 2-block, 64-wide GPT-2")
    ap.add_argument("--batch", type=int, default=0, help="sequences (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="device passes on the same batch")
    ap.add_argument("--cpu-threads", type=int, default=max(1, torch.get_num_threads()))
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU reference (2. and 3.)")
    ap.add_argument(
        "--compiler",
        default=None,
        help="the device side's compiler (default inductor on CUDA, aot_eager on the CPU); "
        "--device cpu --compiler inductor compares CPU inductor against CPU aot_eager",
    )
    ap.add_argument("--out", default=None, help="directory for the JSON and markdown")
    ap.add_argument(
        "--options",
        default=None,
        help="HOT options as JSON, merged over the fixed ones, "
        'e.g. \'{"exclude": ["model.head"]}\'',
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="fingerprint every HOT kernel call's inputs and outputs in each device repeat and "
        "report the first call where the repeats differ",
    )
    ap.add_argument(
        "--reference-kernels",
        action="store_true",
        help="install the ops' pure-PyTorch references as their CUDA kernels (device side): "
        "separates a kernel bug from a graph bug",
    )
    args = ap.parse_args(argv)
    if args.trace and args.reference_kernels:  # the tracer wraps hotcompile's own kernels
        ap.error("--trace cannot be combined with --reference-kernels")
    opts = {**HOT_OPTIONS, **(json.loads(args.options) if args.options else {})}
    t0 = time.perf_counter()
    runs = {}
    traces: list | None = [] if args.trace else None
    with reference_kernels(args.reference_kernels and args.device == "cuda"):
        runs["hot_dev"], loss_hot = grads_of(
            args.device,
            opts,
            args.small,
            args.batch,
            args.repeats,
            args.cpu_threads,
            args.compiler,
            traces,
        )
    runs["exact_dev"], loss_exact = grads_of(
        args.device, None, args.small, args.batch, 1, args.cpu_threads, args.compiler
    )
    if not args.no_cpu:
        runs["hot_cpu"], loss_hot_cpu = grads_of(
            "cpu", opts, args.small, args.batch, 1, args.cpu_threads
        )
        runs["exact_cpu"], _ = grads_of("cpu", None, args.small, args.batch, 1, args.cpu_threads)
    rows = []
    first = runs["hot_dev"][0]
    for name, g in first.items():
        row = {
            "param": name,
            "norm": g.norm().item(),
            "nonfinite": int((~torch.isfinite(g)).sum()),
            "repeat_rel": max((rel(r[name], g) for r in runs["hot_dev"][1:]), default=0.0),
            "hot_vs_exact_dev": rel(g, runs["exact_dev"][0][name]),
        }
        if not args.no_cpu:
            row["dev_vs_cpu_hot"] = rel(g, runs["hot_cpu"][0][name])
            row["hot_vs_exact_cpu"] = rel(runs["hot_cpu"][0][name], runs["exact_cpu"][0][name])
        rows.append(row)
    key = "dev_vs_cpu_hot" if not args.no_cpu else "repeat_rel"
    rows.sort(key=lambda r: (-r["repeat_rel"], -r.get(key, 0.0)))
    info = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "command": "python3 experiments/grad_consistency.py " + " ".join(sys.argv[1:]),
        "reference_kernels": args.reference_kernels,
        "options": opts,
        "losses": {"hot_dev": loss_hot, "exact_dev": loss_exact}
        | ({} if args.no_cpu else {"hot_cpu": loss_hot_cpu}),
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }
    cols = ["repeat_rel", "hot_vs_exact_dev"] + (
        [] if args.no_cpu else ["dev_vs_cpu_hot", "hot_vs_exact_cpu"]
    )
    md = [
        "# HOT gradients: repeatability on the device, device vs CPU (grad_consistency.py)",
        "",
        f"- device: {info['device']}; torch {info['torch']}; {info['date']}",
        f"- command: `{info['command']}`; HOT options {opts}",
        f"- losses: {info['losses']}",
        "",
        "| parameter | ‖g‖ | non-finite | " + " | ".join(cols) + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for r in rows[:40]:
        md.append(
            f"| {r['param']} | {r['norm']:.3g} | {r['nonfinite']} | "
            + " | ".join(f"{r[c]:.2e}" for c in cols)
            + " |"
        )
    if traces:
        md += ["", f"## Trace of the HOT kernel calls ({len(traces[0])} per repeat)", ""]
        md += trace_diff(traces)
        info["trace_calls"] = len(traces[0])
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "grad_consistency.json").write_text(json.dumps(info, indent=1))
        (out / "grad_consistency.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

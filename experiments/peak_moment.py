"""Which tensors are alive at a training step's peak, and where in the step it falls (issue 34).

The 8B-width Llama's lean plan (``hot_fp8_lean``) saves 1.87 GiB for the backward against
hot_fp8's 2.74, yet its peak is only 0.28 GiB lower (11.13 against 11.41 GiB, session 34's
first bench): its peak is no longer at the loss, where the saved tensors count, but later,
in the backward. Which tensors make it there is what a cut must act on.

Per variant (each in a process of its own, built, compiled and trained as
``tools/bench_train.py`` does: bf16 autocast, fused AdamW, 3 warm-up steps) this records
one more step with ``torch.cuda.memory._record_memory_history`` and replays the allocator's
trace: the allocated bytes after each event, the event that reaches the peak, and the
tensors alive then. Each tensor is named by the line of inductor's generated code that
allocated it, the call that first writes it and that call's "Source Nodes" comment
(which FX nodes the kernel computes), and by the step's phase (forward, backward,
optimizer) from the Python frames of the allocation.

    python3 experiments/peak_moment.py --model llama8b \\
        --variants torchao_float8,hot_fp8,hot_fp8_lean --out experiments/results/peak_moment_h200.md
"""

from __future__ import annotations

import argparse
import collections
import json
import linecache
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "experiments"))
MiB = 2**20
GiB = 2**30
#: live tensors listed per variant (the rest are summed)
TOP = 24


#: inductor's generated modules: ``<cache dir>/xx/c<52 base-32 characters>.py``, whatever
#: TORCHINDUCTOR_CACHE_DIR names the cache dir (session 34's first run looked for
#: "torchinductor" in the path and missed them under /tmp/inductor_cache)
GENERATED = re.compile(r"/c[a-z0-9]{40,}\.py$")


def _generated(frames: list[dict]) -> dict | None:
    """The innermost frame in inductor's generated code."""
    for f in frames:
        if GENERATED.search(f.get("filename", "")):
            return f
    return None


def _phase(frames: list[dict]) -> str:
    names = " ".join(f"{f.get('filename', '')}:{f.get('name', '')}" for f in frames)
    if "torch/optim" in names:
        return "optimizer"
    if "backward" in names or "engine" in names:
        return "backward"
    return "forward"


def _label(frames: list[dict]) -> dict:
    """The generated line that allocated a tensor, the call that writes it and that call's
    source nodes; or the innermost Python frame outside torch when no generated code."""
    f = _generated(frames)
    if f is None:
        outer = [x for x in frames if "/torch/" not in x.get("filename", "")]
        g = outer[0] if outer else (frames[0] if frames else {})
        return {"alloc": f"{pathlib.Path(g.get('filename', '?')).name}:{g.get('line', 0)} "
                         f"{g.get('name', '')}", "call": "", "nodes": ""}  # fmt: skip
    path, line = f["filename"], int(f["line"])
    text = linecache.getline(path, line).strip()
    out = {"alloc": text[:160], "call": "", "nodes": ""}
    m = re.match(r"(buf\d+)\s*=", text)
    if not m:  # an op that allocates its own output (extern kernel, _scaled_mm, ...)
        out["call"] = text[:200]
        nodes_from = line
    else:
        buf, nodes_from = m.group(1), line
        for k in range(line + 1, line + 40):
            nxt = linecache.getline(path, k).strip()
            if re.search(rf"\b{buf}\b", nxt) and ("(" in nxt) and not nxt.startswith("del "):
                out["call"] = nxt[:200]
                nodes_from = k
                break
    for k in range(nodes_from - 1, max(nodes_from - 12, 0), -1):
        prev = linecache.getline(path, k).strip()
        if not prev.startswith("#"):  # only the comments right above the call
            break
        if "Source Nodes" in prev:
            out["nodes"] = prev.split(":", 1)[-1].strip()[:240]
            break
    return out


def replay(snapshot: dict, baseline: int) -> dict:
    """The allocator's trace replayed from ``baseline`` allocated bytes: the peak, the event
    at it and the blocks (allocated inside the trace) alive then."""
    trace = snapshot["device_traces"][0]
    live: dict[int, tuple[int, dict]] = {}
    running = peak = baseline
    at = -1
    best: dict[int, tuple[int, dict]] = {}
    pre_freed = 0
    for i, e in enumerate(trace):
        act = e["action"]
        if act == "alloc":
            running += e["size"]
            live[e["addr"]] = (e["size"], e)
            if running > peak:
                peak, at, best = running, i, dict(live)
        elif act == "free_completed":
            running -= e["size"]
            if live.pop(e["addr"], None) is None:
                pre_freed += e["size"]
    return {"peak": peak, "at": at, "live": best, "events": len(trace),
            "pre_freed_at_end": pre_freed, "trace": trace}  # fmt: skip


def _copy_modules(trace: list[dict], variant: str, where: str) -> list[str]:
    """Copy the generated modules the recorded step ran (named in its trace's frames) to
    ``where`` as ``<variant>__<name>.py``, for ``experiments/backward_liveness.py`` to replay
    here, without a GPU."""
    frames = (_generated(e.get("frames", [])) for e in trace)
    paths = sorted({f["filename"] for f in frames if f is not None})
    os.makedirs(where, exist_ok=True)
    for p in paths:
        shutil.copy(p, os.path.join(where, f"{variant}__{pathlib.Path(p).name}"))
    return [pathlib.Path(p).name for p in paths]


def child(model: str, variant: str, out: str, modules: str = "") -> None:
    import bench_train as bt
    import gpu_script
    from bench_models import MODELS

    import hotcompile  # noqa: F401

    device = torch.device("cuda")
    spec = MODELS[model]
    torch.manual_seed(0)
    with torch.device(device):
        net = spec.build(False).to(device)
    x, y = (t.to(device) for t in spec.batch(spec.default_batch, False,
                                              torch.Generator().manual_seed(1)))  # fmt: skip
    if variant in bt.TORCHAO_VARIANTS:
        bt.convert_float8(net, spec.classifier, emulate=False,
                          recipe=bt.TORCHAO_RECIPES.get(variant, "tensorwise"))  # fmt: skip
    module = bt.WithLoss(net)
    compiled = bt.compile_variant(module, variant, "inductor")
    opt, _ = bt._fused_adamw(list(module.parameters()), device)

    step = gpu_script.training_step(compiled, opt, x, y)
    gpu_script.warm_up(step)
    baseline = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=1_000_000)
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    measured = torch.cuda.max_memory_allocated()
    r = replay(snap, baseline)
    trace = r.pop("trace")
    copied = _copy_modules(trace, variant, modules) if modules else []
    phases = collections.Counter()
    rows = []
    for size, e in sorted(r["live"].values(), key=lambda t: -t[0]):
        frames = e.get("frames", [])
        ph = _phase(frames)
        phases[ph] += size
        rows.append({"bytes": size, "phase": ph, **_label(frames)})
    peak_event = trace[r["at"]] if r["at"] >= 0 else {}
    # the allocations and frees just before the peak: where in the backward it falls
    lead = []
    for e in trace[max(r["at"] - 40, 0) : r["at"] + 1]:
        if e["action"] in ("alloc", "free_completed") and e["size"] >= MiB:
            lab = _label(e.get("frames", [])) if e["action"] == "alloc" else {}
            lead.append({"action": e["action"], "bytes": e["size"], **lab})
    n_alloc = sum(1 for e in trace if e["action"] == "alloc")
    n_before = sum(1 for e in trace[: r["at"] + 1] if e["action"] == "alloc")
    res = {
        "model": model,
        "variant": variant,
        "measured_peak": measured,
        "replayed_peak": r["peak"],
        "baseline": baseline,
        "allocs": n_alloc,
        "peak_after_allocs": n_before,
        "peak_phase": _phase(peak_event.get("frames", [])),
        "peak_event": _label(peak_event.get("frames", [])),
        "live_by_phase": dict(phases),
        "live": rows,
        "lead": lead,
        "modules": copied,
    }
    pathlib.Path(out).write_text(json.dumps(res))


def _md(results: list[dict], meta: str) -> str:
    lines = ["# Tensors alive at a training step's peak (experiments/peak_moment.py)", "", meta, ""]
    lines += [
        "| model | variant | peak GiB (measured / replayed) | held before the step | peak in | "
        "after alloc # of # | alive at the peak, made in the step: forward / backward / "
        "optimizer GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ph = r["live_by_phase"]
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['measured_peak'] / GiB:.2f} / "
            f"{r['replayed_peak'] / GiB:.2f} | {r['baseline'] / GiB:.2f} | {r['peak_phase']} | "
            f"{r['peak_after_allocs']} of {r['allocs']} | "
            f"{ph.get('forward', 0) / GiB:.2f} / {ph.get('backward', 0) / GiB:.2f} / "
            f"{ph.get('optimizer', 0) / GiB:.2f} |"
        )
    for r in results:
        lines += ["", f"## {r['model']} {r['variant']}", "",
                  f"Peak reached at: `{r['peak_event'].get('alloc', '')}` "
                  f"(nodes: {r['peak_event'].get('nodes', '') or '-'})", "",
                  "| MiB | phase | allocated by | written by | source nodes |",
                  "|---|---|---|---|---|"]  # fmt: skip
        rest = 0
        for i, t in enumerate(r["live"]):
            if i >= TOP:
                rest += t["bytes"]
                continue
            cells = [t["alloc"], t["call"], t["nodes"]]
            cells = [c.replace("|", "\\|") for c in cells]
            lines.append(f"| {t['bytes'] / MiB:.1f} | {t['phase']} | `{cells[0]}` | "
                         f"`{cells[1]}` | {cells[2]} |")  # fmt: skip
        if rest:
            lines.append(f"| {rest / MiB:.1f} | | {len(r['live']) - TOP} more | | |")
        lines += ["", "Allocations (and frees) of ≥ 1 MiB just before the peak:", "",
                  "| event | MiB | allocated by | source nodes |", "|---|---|---|---|"]  # fmt: skip
        for e in r.get("lead", []):
            a = e.get("alloc", "").replace("|", "\\|")
            n = e.get("nodes", "")
            lines.append(f"| {e['action']} | {e['bytes'] / MiB:.1f} | `{a}` | {n} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="llama8b", help="a tools/bench_models.py model")
    ap.add_argument("--variants", default="torchao_float8,hot_fp8,hot_fp8_lean",
                    help="tools/bench_train.py variants, comma-separated")  # fmt: skip
    ap.add_argument("--out", default="", help="write the markdown here (and .json)")
    ap.add_argument("--modules", default="",
                    help="copy the generated modules each variant's step ran into this folder "
                         "(for experiments/backward_liveness.py)")  # fmt: skip
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "VARIANT", "JSON"),
                    help=argparse.SUPPRESS)  # fmt: skip
    args = ap.parse_args()
    if args.child:
        child(*args.child, modules=args.modules)
        return
    if not torch.cuda.is_available():
        raise SystemExit("needs a GPU")
    import gpu_script

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in args.variants.split(","):
            path = os.path.join(tmp, f"{v}.json")
            rc = subprocess.call([sys.executable, __file__, "--child", args.model, v, path,
                                  "--modules", args.modules])  # fmt: skip
            if rc != 0 or not os.path.exists(path):
                print(f"{v}: failed (rc {rc})", flush=True)
                continue
            results.append(json.loads(pathlib.Path(path).read_text()))
            r = results[-1]
            print(f"{v}: peak {r['measured_peak'] / GiB:.2f} GiB in the {r['peak_phase']}",
                  flush=True)  # fmt: skip
    meta = gpu_script.provenance(
        "peak_moment.py", "one recorded step after 3 warm-up steps, as tools/bench_train.py trains"
    )
    md = _md(results, meta)
    print(md)
    if args.out:
        pathlib.Path(args.out).write_text(md)
        pathlib.Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

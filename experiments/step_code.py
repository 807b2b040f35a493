"""Inductor's code and kernel times for a few blocks of the benchmark's Llama, per variant.

Where a training step's time goes kernel by kernel, and the generated code behind each kernel,
for ``inductor`` and ``hot`` (and any hotcompile options) on the Llama of
``tools/bench_train.py`` cut to ``--layers`` blocks (hidden 2048, MLP 8192, 16 heads, vocab
32000, 4 × 2048 tokens, bf16 autocast, fused AdamW). For each variant it captures the
generated modules of the first step (``run_and_get_code``), times ``--steps`` steps, profiles
``--profile`` more and writes:

- ``DIR/code_<label>_<variant>.py.txt``: every module inductor generated (forward, backward);
- ``DIR/kernels_<label>.md``: per variant, device µs per step of each kernel, and the kernels
  whose per-step time differs most between the variants (a kernel that got slower under HOT
  is found by name in both code files).

    python3 experiments/step_code.py --variants inductor,hot --layers 1 --out DIR [--label new]

Two source trees side by side: run it once per tree (``PYTHONPATH=<tree>``) with distinct
``--label``s into one DIR.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))


def build(layers: int) -> nn.Module:
    """The benchmark's Llama (``tools/bench_models.py``) with ``layers`` blocks, its loss
    compiled with it (``bench_train.WithLoss``)."""
    import bench_models
    from bench_train import WithLoss

    torch.manual_seed(0)
    return WithLoss(bench_models._llama(False, layers))


def run(variant: str, options: dict, a: argparse.Namespace, out: pathlib.Path) -> dict:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model = build(a.layers).cuda()
    if variant == "inductor":
        compiled = torch.compile(model)
    else:
        import hotcompile  # noqa: F401

        compiled = torch.compile(model, backend="hot", options=options)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, 32000, (4, 2049), generator=g).cuda()
    x, t = tok[:, :-1], tok[:, 1:]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16):
            loss = compiled(x, t)
        loss.backward()
        opt.step()

    _, codes = run_and_get_code(step)
    sep = "\n\n# ====== next module\n\n"
    (out / f"code_{a.label}_{variant}.py.txt").write_text(sep.join(codes))
    for _ in range(2):
        step()
    times = []
    for _ in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.profile):
            step()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name].append(e.device_time)
    kernels = {k: (sum(v) / a.profile, len(v) / a.profile) for k, v in per.items()}
    return {"step_ms": statistics.median(times), "kernels": kernels}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variants", default="inductor,hot")
    ap.add_argument("--options", default="{}", help="hotcompile options (JSON) for hot")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile", type=int, default=3)
    ap.add_argument("--label", default="new")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {v: run(v, json.loads(a.options), a, out) for v in a.variants.split(",")}
    import hotcompile

    lines = [f"# {a.label}: {a.layers} Llama block(s), {torch.cuda.get_device_name()}, "
             f"torch {torch.__version__}, hotcompile from {hotcompile.__file__}, options "
             f"{a.options}", ""]  # fmt: skip
    for v, r in res.items():
        top = sorted(r["kernels"].items(), key=lambda kv: -kv[1][0])[:40]
        lines += [f"## {v}: step {r['step_ms']:.2f} ms", "", "| µs/step | calls | kernel |",
                  "|---|---|---|"]  # fmt: skip
        lines += [f"| {us:.0f} | {c:g} | `{k[:110]}` |" for k, (us, c) in top]
        lines.append("")
    text = "\n".join(lines)
    with open(out / f"kernels_{a.label}.md", "w") as f:
        f.write(text)
    (out / f"kernels_{a.label}.json").write_text(json.dumps(res))
    print(text)


if __name__ == "__main__":
    main()

"""Where the first training step's compile time goes, HOT against plain inductor.

Measured on the H100 (2026-11-24): ``tools/bench_train.py --models gpt2 --hot-options
'{"prefer": "paper"}'`` (all 49 layers of GPT-2 small HOT) spent 345 s compiling against
inductor's 4-40 s. This script times one forward + backward of HF GPT-2 (GPT-2 small's width,
``--layers`` blocks) per configuration, each in a fresh process with empty inductor and Triton
caches, and prints Dynamo's per-phase compile times (``torch._dynamo.utils.compile_times``) so
that the scaling with the number of HOT layers and the phase that grows are visible.

    python experiments/compile_time.py --layers 2 6 12 --out $OUT/compile_time.md
    # HOT with and without hotcompile.lowering.ttir_cache (each launch's TTIR built anew)
    python experiments/compile_time.py --layers 6 --backends hot hot_no_ttir_cache
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()


def _child(backend: str, layers: int, options: dict) -> dict:
    import torch

    from hotcompile.compat import import_module

    tf = import_module("transformers")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = tf.GPT2Config(n_layer=layers, use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, attn_implementation="sdpa")  # fmt: skip
    model = tf.GPT2LMHeadModel(cfg).to(dev)
    ids = torch.randint(0, cfg.vocab_size, (2, 128), device=dev)
    if backend.startswith("hot"):  # hot_no_ttir_cache: the parent set HOTCOMPILE_TTIR_CACHE=0
        import hotcompile

        be = hotcompile.HotBackend(**options)
    else:
        be = "inductor"
    compiled = torch.compile(model, backend=be)
    t0 = time.perf_counter()
    with torch.autocast(dev, torch.bfloat16, enabled=dev == "cuda"):
        out = compiled(ids).logits
    t_fw = time.perf_counter() - t0
    out.float().sum().backward()
    if dev == "cuda":
        torch.cuda.synchronize()
    total = time.perf_counter() - t0
    hot, ttir = None, None
    if backend.startswith("hot"):
        hot = sum(p.path != "skipped" for p in be.layers)
        from hotcompile.lowering import ttir_cache

        ttir = dict(ttir_cache.STATS)
    return {
        "backend": backend, "layers": layers, "options": options, "hot_layers": hot, "ttir": ttir,
        "first_step_s": total, "forward_s": t_fw, "backward_s": total - t_fw,
        "phases": torch._dynamo.utils.compile_times(repr="str"),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 12])
    p.add_argument("--options", default='{"prefer": "paper"}', help="HOT options (JSON)")
    p.add_argument("--backends", nargs="+", default=["inductor", "hot"],
                   choices=["inductor", "hot", "hot_no_ttir_cache"],
                   help="hot_no_ttir_cache: HOT with HOTCOMPILE_TTIR_CACHE=0")  # fmt: skip
    p.add_argument("--out", help="write the report here (markdown)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        backend, layers = a.child.split(":")
        print(json.dumps(_child(backend, int(layers), json.loads(a.options))))
        return 0
    rows, lines = [], []
    for layers in a.layers:
        for backend in a.backends:
            with tempfile.TemporaryDirectory() as tmp:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
                       "TRITON_CACHE_DIR": f"{tmp}/triton"}  # fmt: skip
                if backend == "hot_no_ttir_cache":
                    env["HOTCOMPILE_TTIR_CACHE"] = "0"
                cmd = [sys.executable, str(HERE), "--child", f"{backend}:{layers}",
                       "--options", a.options]  # fmt: skip
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode:
                print(r.stderr[-3000:], file=sys.stderr)
                return 1
            row = json.loads(r.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{backend} {layers} blocks: {row['first_step_s']:.1f} s", flush=True)
            lines += [f"### {backend}, {layers} blocks ({row['hot_layers']} HOT layers)", "",
                      "```", row["phases"], "```", ""]  # fmt: skip
    import torch

    head = [
        f"# First-step compile time, HF GPT-2 (width 768), seq 128, batch 2, "
        f"torch {torch.__version__}, "
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}",
        "", f"HOT options: {a.options}; fresh inductor/Triton caches per run.", "",
        "| backend | blocks | HOT layers | first step (s) | forward (s) | backward (s) | "
        "TTIR of HOT's kernels: generated / from the cache |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    head += [
        f"| {r['backend']} | {r['layers']} | {r['hot_layers'] or '-'}"
        f" | {r['first_step_s']:.1f} | {r['forward_s']:.1f} | {r['backward_s']:.1f} | "
        + (f"{r['ttir']['misses']} / {r['ttir']['hits']}" if r.get("ttir") else "-")
        + " |"
        for r in rows
    ]
    text = "\n".join(head + ["", "## Dynamo's compile phases", ""] + lines)
    print(text)
    if a.out:
        pathlib.Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

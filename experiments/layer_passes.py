"""HOT's per-layer backward and its memory-bound passes, two versions of hotcompile side by side.

What a change to the quantize kernels or to where the weight is quantized buys per layer, as
the speed gate sees it (``gate._graph_us``: CUDA graphs, median of 5 replays of 3 calls), for
the layer shapes of the training benchmark (Llama-style h 2048 / MLP 8192, 4 × 2048 tokens;
GPT-2 small, 8 × 1024; ViT-B/16, 128 × 197). Per layer and version:

- ``bf16 GEMMs``: the two exact GEMMs alone (the gate's exact side until MEASURE_VERSION 3);
- ``bf16 + g_w cast``: the same with g_w cast to the fp32 master weight's dtype, as autograd
  does under autocast (inductor runs that cast as a kernel of its own);
- ``HOT``: the version's own ``gate._hot_fn`` — the layer's HOT work as that version runs it
  (forward ABC and, from MEASURE_VERSION 3, the weight's codes; backward g_x, g_w);
- the passes: HQ over g_y (+ g_y's raw max-abs for the text recipe), g_w codes of g_y, ABC of
  x, the weight's codes from the fp32 weight and from its bf16 copy;
- where the tree has ``HotConfig.abc_max_abs`` (text recipe, in the JSON only): HOT with
  ``"producer"`` (x's max-abs given, as the step computes it in x's producer), ABC's codes
  pass with it given, and that max-abs alone run eagerly.

Usage (on the GPU; ``--versions`` runs each tree in a subprocess with it first on the path):

    python3 experiments/layer_passes.py --versions old=.old new=. --out DIR

writes ``DIR/layer_passes.json`` and ``DIR/layer_passes.md``. One version alone:
``python3 experiments/layer_passes.py --one LABEL`` (prints one JSON line per layer).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import subprocess
import sys

FP8 = "fp8_e4m3"
#: name, L, O, I, N, recipe ("text": FP8 g_x values, plain-rows FP8 g_w; "vision": INT4 HQ
#: per token + HLA FP8 g_w)
SHAPES = [
    ("llama.q/k/v/o", 8192, 2048, 2048, 4, "text"),
    ("llama.gate/up", 8192, 8192, 2048, 4, "text"),
    ("llama.down", 8192, 2048, 8192, 4, "text"),
    ("gpt2.c_attn", 8192, 2304, 768, 8, "text"),
    ("gpt2.c_fc", 8192, 3072, 768, 8, "text"),
    ("gpt2.mlp.c_proj", 8192, 768, 3072, 8, "text"),
    ("vit.qkv", 25216, 2304, 768, 128, "vision"),
    ("vit.fc1", 25216, 3072, 768, 128, "vision"),
    ("vit.fc2", 25216, 768, 3072, 128, "vision"),
]
LP_L1 = (0, 2, 3, 8, 10, 11, 12, 14)


def shape_of(gate, L, O, I, N, recipe):  # noqa: E741
    if recipe == "text":
        return gate.Shape(L=L, O=O, I=I, N=N, S=L // N, gx_bits=8, per_token=True, rounding=FP8,
                          gw_rounding=FP8, weight_scale="maxabs")  # fmt: skip
    return gate.Shape(L=L, O=O, I=I, N=N, S=L // N, rows=LP_L1, gw_rounding=FP8)


def probe(name: str, L: int, O: int, I: int, N: int, recipe: str) -> dict:  # noqa: E741
    import torch

    from hotcompile.lowering import gate, hot

    T = gate._graph_us
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    gy = torch.randn((L, O), device=dev, generator=g).bfloat16()
    x = torch.randn((L, I), device=dev, generator=g).bfloat16()
    w = torch.randn((O, I), device=dev, generator=g) * 0.02
    wb = w.bfloat16()
    s = shape_of(gate, L, O, I, N, recipe)
    x3, gy3 = x.view(N, L // N, I), gy.view(N, L // N, O)
    text = recipe == "text"
    bits, rounding = (8, FP8) if text else (4, "pseudo_stochastic")
    wscale = "maxabs" if text else "sawb"
    rows = () if text else LP_L1

    r: dict = {"layer": name, "L": L, "O": O, "I": I, "recipe": recipe}
    r["bf16 GEMMs"] = T(lambda: (torch.mm(gy, wb), torch.mm(gy.t(), x)))
    r["bf16 + g_w cast"] = T(lambda: (torch.mm(gy, wb), torch.mm(gy.t(), x).float()))
    r["HOT"] = T(gate._hot_fn(s, gy, w, x))
    r["HQ g_y"] = T(lambda: hot.quantize_gy(gy, bits, True, rounding, True, 16, text))
    if text:
        raw = hot.quantize_gy(gy, bits, True, rounding, True, 16, True)[2]
        r["g_w codes of g_y"] = T(lambda: hot.hla_codes(gy3, 0, (), 8, FP8, None, raw))
    else:
        r["g_w codes of g_y"] = T(lambda: hot.hla_codes(gy3, 0, rows, 8, FP8, None))
    r["ABC x"] = T(lambda: hot.compress(x3, 0, rows, 8, FP8, None))
    if text and hasattr(hot, "amax_bits"):  # abc_max_abs="producer" (this session's option)
        amax = hot.amax_bits(x3)
        r["HOT, abc_max_abs=producer"] = T(
            gate._hot_fn(dataclasses.replace(s, x_amax_given=True), gy, w, x)
        )
        r["ABC x, max-abs given"] = T(lambda: hot.compress(x3, 0, rows, 8, FP8, None, amax))
        r["x max-abs alone (eager ATen)"] = T(lambda: hot.amax_bits(x3))
    r["weight codes from fp32"] = T(lambda: hot.quantize_weight(w, bits, wscale, True, rounding))
    r["weight codes from bf16"] = T(lambda: hot.quantize_weight(wb, bits, wscale, True, rounding))
    r["floor: one pass over g_y (µs)"] = L * O * 3 / 3.0e12 * 1e6
    return r


def run_one(label: str, only: str = "") -> None:
    import torch

    import hotcompile

    for shape in [s for s in SHAPES if s[0].startswith(only)]:
        r = probe(*shape)
        r["version"] = label
        r["module"] = hotcompile.__file__
        print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()


def markdown(rows: list[dict], meta: dict) -> str:
    versions = list(dict.fromkeys(r["version"] for r in rows))
    by = {(r["version"], r["layer"]): r for r in rows}
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    a, b = versions[0], versions[-1]
    out = [
        "# HOT's layer backward and its passes, two versions side by side",
        "",
        f"Device: {meta['device']}; torch {meta['torch']}; {meta['date']}. Versions: "
        + "; ".join(f"`{v}` = {meta['trees'][v]}" for v in versions)
        + ". Generated by `experiments/layer_passes.py` (JSON beside this file).",
        "µs under CUDA graphs (median of 5 replays of 3 calls), bf16 g_y / x, fp32 W (×0.02).",
        "",
        "Speed-up = exact side / HOT: the GEMMs + g_w's cast to fp32 (what autograd runs, and "
        "the gate's exact side since MEASURE_VERSION 3) over HOT's work.",
        "",
        f"| layer | recipe | bf16 GEMMs | + g_w cast | HOT {a} | HOT {b} | speed-up {a} → {b} "
        f"| {b} vs GEMMs alone | HQ g_y {a} → {b} | g_w codes of g_y | ABC x "
        f"| weight codes fp32 → bf16 ({b}) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in layers:
        ra, rb = by[(a, name)], by[(b, name)]
        out.append(
            f"| {name} | {ra['recipe']} | {rb['bf16 GEMMs']:.0f} | {rb['bf16 + g_w cast']:.0f} "
            f"| {ra['HOT']:.0f} | {rb['HOT']:.0f} "
            f"| {ra['bf16 + g_w cast'] / ra['HOT']:.2f}× "
            f"→ {rb['bf16 + g_w cast'] / rb['HOT']:.2f}× "
            f"| {rb['bf16 GEMMs'] / rb['HOT']:.2f}× "
            f"| {ra['HQ g_y']:.0f} → {rb['HQ g_y']:.0f} "
            f"| {ra['g_w codes of g_y']:.0f} → {rb['g_w codes of g_y']:.0f} "
            f"| {ra['ABC x']:.0f} → {rb['ABC x']:.0f} "
            f"| {rb['weight codes from fp32']:.0f} → {rb['weight codes from bf16']:.0f} |"
        )
    out += [
        "",
        "Pass columns: `old → new` is the same pass in the two versions (the codes kernels' "
        "arithmetic changed between them); the weight column is the new version's kernel from "
        "the fp32 master weight and from the forward's bf16 copy. One-pass floors over g_y "
        "(read bf16, write one byte, 3.0 TB/s): "
        + ", ".join(f"{n} {by[(b, n)]['floor: one pass over g_y (µs)']:.0f}" for n in layers)
        + " µs.",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--one", help="measure the hotcompile on sys.path, label its rows so")
    ap.add_argument("--versions", nargs="*", default=[], help="LABEL=TREE (a repository root)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--only", default="", help="layers whose name starts with this (e.g. llama)")
    ap.add_argument("--markdown", help="rewrite the markdown of this layer_passes.json")
    a = ap.parse_args(argv)
    if a.markdown:
        data = json.loads(pathlib.Path(a.markdown).read_text())
        rows = data.pop("rows")
        (pathlib.Path(a.markdown).with_suffix(".md")).write_text(markdown(rows, data))
        return 0
    if a.one:
        run_one(a.one, a.only)
        return 0
    rows, trees = [], {}
    for spec in a.versions:
        label, tree = spec.split("=", 1)
        trees[label] = tree
        env = {**os.environ, "PYTHONPATH": os.path.abspath(tree), "HOTCOMPILE_CACHE": "/tmp/hc"}
        p = subprocess.run([sys.executable, __file__, "--one", label, "--only", a.only], env=env,
                           capture_output=True, text=True, check=False)  # fmt: skip
        if p.returncode:
            print(p.stderr[-4000:])
            return p.returncode
        rows += [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        print(p.stdout, flush=True)
    import torch

    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "trees": {k: os.environ.get(f"TREE_{k.upper()}", v) for k, v in trees.items()},
    }
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "layer_passes.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    write_markdown(out, rows, meta)
    return 0


def write_markdown(out: pathlib.Path, rows: list[dict], meta: dict) -> None:
    md = markdown(rows, meta)
    (out / "layer_passes.md").write_text(md)
    print(md)


if __name__ == "__main__":
    raise SystemExit(main())

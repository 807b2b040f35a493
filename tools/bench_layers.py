"""Per-layer backward timing on a CUDA GPU: HOT's CUDA path vs bf16 (and FP32) ``torch.mm``.

For each layer (ViT-B at batch 128: L = 25216; two LLM layers: L = 8192) it times, side by side
in one run, with CUDA events (warm-up, then the median of several repetitions; inputs rotated
among a few sets so no timing runs from L2; a ``torch.cuda._sleep`` before each timed region
lets the host queue the whole region, so the numbers are GPU time, not Python overhead):

- the baselines ``g_x = g_y·W`` and ``g_w = g_yᵀ·x`` with ``torch.mm`` in bf16 (and FP32,
  the paper's comparison, fewer repetitions);
- HOT's g_x (``hotcompile::hq_grad_input``) and g_w (``hotcompile::hla_grad_weight`` from the
  ABC-compressed x) end to end through the ops — every Hadamard, quantize, GEMM and
  dequantization included — and each stage alone:
  ``gx.quant_gy`` (fused Hadamard + INT4 quantize of g_y, per token), ``gx.quant_w`` (fused
  Hadamard + SAWB quantize of W, K-major), ``gx.gemm`` (FP8 GEMM, dequantization in the
  epilogue), ``gw.quant_gy`` (fused HLA + INT8 quantize of g_y, two passes), ``gw.gemm`` (INT8
  GEMM over the halved L, dequantization in the epilogue); ``glue`` is what the end-to-end op
  spends beyond its stages (small ops, launches);
- the forward's ABC compression (``abc_compress``), reported apart (a forward cost).

Each stage gets its roofline bound — bytes it must move / HBM bandwidth for the
memory-bound stages, FLOPs / tensor-core peak for the GEMMs (data-sheet peaks of the device) —
and its distance from it. The GEMMs run through ``hotcompile.kernels.dispatch`` (CUTLASS,
Triton or torch, whichever measured fastest for the shape; the choice and every candidate's
time are recorded).

Writes ``bench_layers.json`` and ``bench_layers.md`` into ``--out`` (default tools/results).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics

import torch

import hotcompile  # noqa: F401  (registers the ops)
from hotcompile import kernels
from hotcompile.hadamard import padded

# hotcompile.kernels' dispatch, hla_triton and hq_triton import Triton: main() imports them after
# the arguments are parsed, so that --help works on a machine without Triton
dispatch = hla_triton = hq_triton = None

ops = torch.ops.hotcompile
LP_L1 = [0, 2, 3, 8, 10, 11, 12, 14]
ROUNDING = "pseudo_stochastic"
RESULTS = pathlib.Path(__file__).resolve().parent / "results"

# name, N (sequences), S (tokens per sequence), O, I
LAYERS = [
    ("vitb.qkv", 128, 197, 2304, 768),
    ("vitb.proj", 128, 197, 768, 768),
    ("vitb.fc1", 128, 197, 3072, 768),
    ("vitb.fc2", 128, 197, 768, 3072),
    ("llm.up", 4, 2048, 14336, 4096),
    ("llm.down", 4, 2048, 4096, 14336),
]

#: data-sheet peaks (dense): HBM TB/s, FP8/INT8 tensor TFLOP/s, bf16 tensor TFLOP/s
PEAKS = {
    "H200": dict(hbm_TBps=4.8, fp8_TFLOPs=1979.0, int8_TOPs=1979.0, bf16_TFLOPs=989.0),
    "H100": dict(hbm_TBps=3.35, fp8_TFLOPs=1979.0, int8_TOPs=1979.0, bf16_TFLOPs=989.0),
}
MEMORY_STAGES = ("gx.quant_gy", "gx.quant_w", "gw.quant_gy", "glue")
TARGETS = dict(mean_speedup_vitb=1.6, speedup_llm=1.7, memory_share=0.35)


def peaks(name: str) -> dict[str, float]:
    for k, v in PEAKS.items():
        if k in name:
            return v
    return PEAKS["H100"]


def timed(fn, sets, reps=20, warmup=3, sleep_cycles=3_000_000):
    """Median GPU time (µs) of ``fn(sets[i % len(sets)])``."""
    for i in range(warmup):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    evs = []
    for i in range(reps):
        torch.cuda._sleep(sleep_cycles)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(sets[i % len(sets)])
        e.record()
        evs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in evs)


def bench_layer(name, N, S, O, I, pk, nsets=3, reps=20, fp32_reps=3, sweep=False):
    L = N * S
    kernels.register()
    sets = []
    for _ in range(nsets):
        gy = (torch.randn(L, O, device="cuda") * 1e-3).bfloat16()
        w = (torch.randn(O, I, device="cuda") * O**-0.5).bfloat16()
        x = torch.randn(L, I, device="cuda").bfloat16()
        xq, sx = ops.abc_compress(x.view(N, S, I), 0, LP_L1, 16, 8, ROUNDING)
        codes, sg = hq_triton.hq_quantize(gy, 4, True, ROUNDING, torch.float8_e4m3fn, 16)
        wt, sw = hq_triton.quantize_weight(w, 4, "sawb", True)
        gqt, sgw = hla_triton.hla_quantize(gy.view(N, S, O), 0, LP_L1, 8, ROUNDING)
        d = dict(gy=gy, w=w, x=x, xq=xq, sx=sx, codes=codes, sg=sg, wt=wt, sb=sw / 16, gqt=gqt)
        d["sgw"] = sgw * sx / 16
        sets.append(d)
    hq_args = (4, "per_token", ROUNDING, "sawb", 16, name, "", False)
    gw_args = (0, LP_L1, 16, 8, ROUNDING, name, False)
    T = {}
    T["bf16.gx"] = timed(lambda d: torch.mm(d["gy"], d["w"]), sets, reps)
    T["bf16.gw"] = timed(lambda d: torch.mm(d["gy"].t(), d["x"]), sets, reps)
    T["fp32.gx"] = timed(lambda d: torch.mm(d["gy"].float(), d["w"].float()), sets[:1], fp32_reps)
    T["fp32.gw"] = timed(
        lambda d: torch.mm(d["gy"].float().t(), d["x"].float()), sets[:1], fp32_reps
    )
    T["hot.gx"] = timed(lambda d: ops.hq_grad_input(d["gy"], d["w"], *hq_args), sets, reps)
    T["hot.gw"] = timed(
        lambda d: ops.hla_grad_weight(d["gy"].view(N, S, O), d["xq"], d["sx"], *gw_args),
        sets,
        reps,
    )
    T["gx.quant_gy"] = timed(
        lambda d: hq_triton.hq_quantize(d["gy"], 4, True, ROUNDING, torch.float8_e4m3fn, 16),
        sets,
        reps,
    )
    T["gx.quant_w"] = timed(
        lambda d: hq_triton.quantize_weight(d["w"], 4, "sawb", True), sets, reps
    )
    T["gx.gemm"] = timed(
        lambda d: dispatch.scaled_gemm(d["codes"], d["wt"], d["sg"], d["sb"], torch.bfloat16),
        sets,
        reps,
    )
    T["gw.quant_gy"] = timed(
        lambda d: hla_triton.hla_quantize(d["gy"].view(N, S, O), 0, LP_L1, 8, ROUNDING),
        sets,
        reps,
    )
    T["gw.gemm"] = timed(
        lambda d: dispatch.scaled_gemm(d["gqt"], d["xq"].t(), d["sgw"], None, torch.float32),
        sets,
        reps,
    )
    T["abc_fwd"] = timed(
        lambda d: ops.abc_compress(d["x"].view(N, S, I), 0, LP_L1, 16, 8, ROUNDING), sets, reps
    )
    if sweep:
        # tile candidates of the memory-bound kernels (default first), for tuning _config
        p2 = 1 << (padded(O, 16) - 1).bit_length()
        for bo in sorted({256, 512, 1024, 2048, 4096, p2} & set(range(256, p2 + 1))):
            T[f"sweep.gx.quant_gy.block_o{bo}"] = timed(
                lambda d, bo=bo: hq_triton.hq_quantize(
                    d["gy"], 4, True, ROUNDING, torch.float8_e4m3fn, 16, block_o=bo
                ),
                sets,
                reps,
            )
        for bb, bd, nw in ((8, 64, 4), (4, 128, 4), (8, 128, 4), (16, 64, 4), (16, 128, 8)):
            T[f"sweep.gw.quant_gy.b{bb}d{bd}w{nw}"] = timed(
                lambda d, t=(bb, bd, nw): hla_triton.hla_quantize(
                    d["gy"].view(N, S, O), 0, LP_L1, 8, ROUNDING, True, *t
                ),
                sets,
                reps,
            )
            T[f"sweep.gx.quant_w.b{bb}d{bd}w{nw}"] = timed(
                lambda d, t=(bb, bd, nw): hla_triton.hla_quantize(
                    d["w"][None], 0, hq_triton.ALL_ROWS, 4, "nearest", True, *t, sawb=True,
                    out_dtype=torch.float8_e4m3fn,
                ),
                sets,
                reps,
            )  # fmt: skip
    stage_sum = sum(T[k] for k in ("gx.quant_gy", "gx.quant_w", "gx.gemm", "gw.quant_gy"))
    stage_sum += T["gw.gemm"]
    hot = T["hot.gx"] + T["hot.gw"]
    T["glue"] = max(hot - stage_sum, 0.0)

    # roofline bounds (µs): bytes / HBM bandwidth, FLOPs / tensor-core peak
    Lp, Op, R = padded(L, 16), padded(O, 16), N * ((S + 15) // 16) * len(LP_L1)
    bw = pk["hbm_TBps"] * 1e6  # bytes per µs
    bound = {
        "gx.quant_gy": (L * O * 2 + Lp * Op + Lp * 4) / bw,
        "gx.quant_w": (2 * O * I * 2 + Op * I) / bw,
        "gx.gemm": 2 * Lp * Op * I / (pk["fp8_TFLOPs"] * 1e6),
        "gw.quant_gy": (2 * L * O * 2 + R * O) / bw,
        "gw.gemm": 2 * O * R * I / (pk["int8_TOPs"] * 1e6),
        "glue": 0.0,
        "bf16.gx": 2 * L * O * I / (pk["bf16_TFLOPs"] * 1e6),
        "bf16.gw": 2 * L * O * I / (pk["bf16_TFLOPs"] * 1e6),
    }
    bf16 = T["bf16.gx"] + T["bf16.gw"]
    mem = sum(T[k] for k in MEMORY_STAGES)
    ideal = sum(bound[k] for k in ("gx.quant_gy", "gx.quant_w", "gx.gemm", "gw.quant_gy"))
    ideal += bound["gw.gemm"]
    row = dict(
        name=name, L=L, O=O, I=I, bf16_us=bf16, hot_us=hot, speedup_vs_bf16=bf16 / hot,
        fp32_us=T["fp32.gx"] + T["fp32.gw"],
        speedup_vs_fp32=(T["fp32.gx"] + T["fp32.gw"]) / hot,
        speedup_gx_vs_bf16=T["bf16.gx"] / T["hot.gx"],
        speedup_gw_vs_bf16=T["bf16.gw"] / T["hot.gw"],
        memory_bound_us=mem, memory_share=mem / hot,
        hot_roofline_us=ideal, speedup_bound_vs_bf16=bf16 / ideal,
        stages_us=T, roofline_us=bound,
    )  # fmt: skip
    del sets
    torch.cuda.empty_cache()
    return row


def layer_table(rows) -> str:
    head = (
        "| layer | L | O | I | FP32 | bf16 | HOT | vs bf16 | vs FP32 | g_x vs bf16 "
        "| g_w vs bf16 | memory-bound share | roofline-bound HOT | best possible vs bf16 |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['L']} | {r['O']} | {r['I']} | {r['fp32_us']:.0f} "
            f"| {r['bf16_us']:.1f} | {r['hot_us']:.1f} | **{r['speedup_vs_bf16']:.2f}x** "
            f"| {r['speedup_vs_fp32']:.1f}x | {r['speedup_gx_vs_bf16']:.2f}x "
            f"| {r['speedup_gw_vs_bf16']:.2f}x | {100 * r['memory_share']:.0f}% "
            f"| {r['hot_roofline_us']:.1f} | {r['speedup_bound_vs_bf16']:.2f}x |"
        )
    return "\n".join(lines)


STAGES = ("gx.quant_gy", "gx.quant_w", "gx.gemm", "gw.quant_gy", "gw.gemm", "glue")


def stage_table(rows) -> str:
    head = "| layer | " + " | ".join(STAGES) + " | ABC fwd |"
    lines = [head, "|" + "---|" * (len(STAGES) + 2)]
    for r in rows:
        cells = []
        for k in STAGES:
            t, b = r["stages_us"][k], r["roofline_us"][k]
            cells.append(f"{t:.1f} ({t / b:.1f}x)" if b > 0 else f"{t:.1f}")
        lines.append(
            f"| {r['name']} | " + " | ".join(cells) + f" | {r['stages_us']['abc_fwd']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n"
        "  python3 tools/bench_layers.py --out /tmp/res   # about 1 minute on an H200; needs CUDA\n"
        "  python3 tools/bench_layers.py --quick          # the ViT-B layers only, fewer reps\n"
        "  python3 tools/bench_layers.py --sweep --out /tmp/res  # + quantize-kernel tiles",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="ViT-B layers only, fewer reps")
    ap.add_argument("--out", default=str(RESULTS), help="directory for the JSON and markdown")
    ap.add_argument(
        "--sweep", action="store_true", help="also time tile candidates of the quantize kernels"
    )
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the Triton/CUTLASS kernels are CUDA-only)")
    global dispatch, hla_triton, hq_triton
    from hotcompile.kernels import dispatch, hla_triton, hq_triton

    layers = LAYERS[:4] if a.quick else LAYERS
    props = torch.cuda.get_device_properties(0)
    pk = peaks(props.name)
    rows = []
    try:
        from tqdm import tqdm

        it = tqdm(layers, desc="layers", unit="layer")
    except ImportError:
        it = layers
    for spec in it:
        rows.append(bench_layer(*spec, pk, reps=10 if a.quick else 20, sweep=a.sweep))
    import triton

    vit = [r for r in rows if r["name"].startswith("vitb")]
    llm = [r for r in rows if r["name"].startswith("llm")]
    mean_vit = statistics.mean(r["speedup_vs_bf16"] for r in vit)
    mem_share = sum(r["memory_bound_us"] for r in rows) / sum(r["hot_us"] for r in rows)
    res = dict(
        device=props.name,
        torch=torch.__version__,
        triton=triton.__version__,
        date=datetime.date.today().isoformat(),
        method="CUDA events; median of 20 (FP32: 3) after 3 warm-ups; 3 input sets rotated; "
        "GPU queued ahead with torch.cuda._sleep; microseconds. Roofline: data-sheet peaks "
        f"{pk}",
        layers=rows,
        mean_speedup_vitb=mean_vit,
        mean_speedup_gx_vitb=statistics.mean(r["speedup_gx_vs_bf16"] for r in vit),
        mean_speedup_gw_vitb=statistics.mean(r["speedup_gw_vs_bf16"] for r in vit),
        memory_bound_share=mem_share,
        targets=TARGETS,
        targets_met=dict(
            mean_speedup_vitb=mean_vit >= TARGETS["mean_speedup_vitb"],
            speedup_llm=bool(llm) and all(r["speedup_vs_bf16"] >= 1.7 for r in llm),
            memory_share=mem_share <= TARGETS["memory_share"],
        ),
        gemm_dispatch={
            k: dict(impl=c.impl, source=c.source, timings_us=c.timings_us, errors=c.errors)
            for k, c in dispatch.choices().items()
        },
    )
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_layers.json").write_text(json.dumps(res, indent=1) + "\n")
    gemms = "\n".join(
        f"| {k} | {c['impl']} | "
        + ", ".join(f"{n} {t:.1f}" for n, t in sorted(c["timings_us"].items(), key=lambda x: x[1]))
        + " |"
        for k, c in res["gemm_dispatch"].items()
    )
    llm_txt = ", ".join(f"{r['name']} {r['speedup_vs_bf16']:.2f}x" for r in llm) or "not run"
    md = f"""# Per-layer backward: HOT vs bf16 (tools/bench_layers.py)

Device: {res["device"]}; torch {res["torch"]}, triton {res["triton"]}; {res["date"]}.
{res["method"]}.

HOT = g_x (`hq_grad_input`) + g_w (`hla_grad_weight` from the saved ABC codes), end to end
through the CUDA ops; bf16 / FP32 = the two `torch.mm` of the same backward.

{layer_table(rows)}

- Mean speed-up over bf16, ViT-B layers: **{mean_vit:.2f}x** (target ≥ 1.6x; g_x alone
  {res["mean_speedup_gx_vitb"]:.2f}x, g_w alone {res["mean_speedup_gw_vitb"]:.2f}x).
- LLM layers: {llm_txt} (target ≥ 1.7x each).
- Memory-bound stages: {100 * mem_share:.0f}% of HOT's backward time over all layers
  (target ≤ 35%).
- "roofline-bound HOT" is the sum of the stages' bounds: no implementation of these stages,
  as separate passes, beats it; "best possible vs bf16" is bf16 over that bound.

## Stages (µs, and × their roofline bound)

{stage_table(rows)}

Bounds: quantize stages = bytes read + written / {pk["hbm_TBps"]} TB/s (g_x: g_y read once,
FP8 codes written; W: read twice, codes written; HLA: g_y read twice — max-abs, then codes —
INT8 codes of half the rows written); GEMMs = FLOPs / {pk["fp8_TFLOPs"]:.0f} TFLOP/s (FP8 and
INT8 dense peak). ABC fwd is the forward's compression of x (not in HOT's backward).

## GEMM implementations chosen (hotcompile.kernels.dispatch; candidates' µs at first call)

| GEMM | chosen | candidates (µs) |
|---|---|---|
{gemms}
"""
    if a.sweep:
        md += "\n## Tile sweep of the quantize kernels (µs; --sweep)\n\n"
        for r in rows:
            sw = {k[6:]: round(v, 1) for k, v in r["stages_us"].items() if k.startswith("sweep.")}
            md += f"- {r['name']}: {sw}\n"
    (out / "bench_layers.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

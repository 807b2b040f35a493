"""Per-layer backward timing on a CUDA GPU: bf16 ``torch.mm`` vs HOT (issue 4, first slice).

For each layer (ViT-B at batch 128, two LLM layers) it times, with CUDA events (warm-up, then
the median of several repetitions, inputs rotated among a few sets so that no timing runs from
L2; a ``torch.cuda._sleep`` before each timed region lets the host queue the whole region, so
the numbers are GPU time, not Python launch overhead):

- bf16: ``g_x = g_y·W`` and ``g_w = g_yᵀ·x`` with ``torch.mm``;
- HOT g_x through the CUDA op (``torch.ops.hotcompile.hq_grad_input``: fused Triton
  Hadamard+quantize of g_y, weight quantize, FP8 ``torch._scaled_mm``), and its stages alone;
- HOT g_x through the reference implementation (pure PyTorch on CUDA tensors);
- HOT g_w through the CUDA op (``hla_grad_weight`` from the ABC-compressed x: fused Triton
  HLA+INT8 quantize of g_y written K-major, transpose of the saved x codes, ``torch._int_mm``,
  dequantize), its stages alone, and the reference (pure PyTorch on CUDA tensors);
- the forward's ABC compression (``abc_compress``, Triton), reported apart (forward cost).

Writes tools/results/bench_layers.json and .md and prints the table.
Usage: ``python tools/bench_layers.py [--sweep] [--quick]``.
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
from hotcompile.kernels import hla_triton, hq_triton
from hotcompile.ops import abc_compress, hla_grad_weight, hq_grad_input

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


def timed(fn, sets, reps=20, warmup=3, sleep_cycles=3_000_000):
    """Median GPU time (µs) of ``fn(*sets[i % len(sets)])``."""
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    evs = []
    for i in range(reps):
        torch.cuda._sleep(sleep_cycles)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*sets[i % len(sets)])
        e.record()
        evs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in evs)


def bench_layer(name, N, S, O, I, nsets=3, reps=20, ref_reps=5, sweep=False, sweep_hla=False):
    L = N * S
    dev = "cuda"
    kernels.register()
    sets = []
    for _ in range(nsets):
        gy = (torch.randn(L, O, device=dev) * 1e-3).bfloat16()
        w = (torch.randn(O, I, device=dev) * O**-0.5).bfloat16()
        x = torch.randn(L, I, device=dev).bfloat16()
        xq, sx = ops.abc_compress(x.view(N, S, I), 0, LP_L1, 16, 8, ROUNDING)
        codes, sg = hq_triton.hq_quantize(gy, 4, True, ROUNDING, torch.float8_e4m3fn, 16)
        wt, sw = hq_triton.quantize_weight(w, 4, "sawb", True)
        sb = (sw / 16).expand(1, I).contiguous()
        gqt, sgw = hla_triton.hla_quantize(gy.view(N, S, O), 0, LP_L1, 8, ROUNDING)
        xqt = xq.t().contiguous()
        acc = torch._int_mm(gqt, xqt.t())
        sets.append(
            dict(gy=gy, w=w, x=x, xq=xq, sx=sx, codes=codes, sg=sg, wt=wt, sb=sb, gqt=gqt,
                 sgw=sgw, xqt=xqt, acc=acc)
        )  # fmt: skip
    hq_args = (4, "per_token", ROUNDING, "sawb", 16, name, "", False)
    T = {}
    T["bf16_gx_us"] = timed(lambda d: torch.mm(d["gy"], d["w"]), [(d,) for d in sets], reps)
    T["bf16_gw_us"] = timed(lambda d: torch.mm(d["gy"].t(), d["x"]), [(d,) for d in sets], reps)
    one = [(d,) for d in sets]
    T["hot_gx_us"] = timed(lambda d: ops.hq_grad_input(d["gy"], d["w"], *hq_args), one, reps)
    T["quant_gy_us"] = timed(
        lambda d: hq_triton.hq_quantize(d["gy"], 4, True, ROUNDING, torch.float8_e4m3fn, 16),
        [(d,) for d in sets],
        reps,
    )
    T["quant_gy_per_tensor_us"] = timed(
        lambda d: hq_triton.hq_quantize(d["gy"], 4, False, ROUNDING, torch.float8_e4m3fn, 16),
        [(d,) for d in sets],
        reps,
    )
    T["quant_w_us"] = timed(
        lambda d: hq_triton.quantize_weight(d["w"], 4, "sawb", True), [(d,) for d in sets], reps
    )
    T["gemm_fp8_us"] = timed(
        lambda d: torch._scaled_mm(
            d["codes"], d["wt"].t(), scale_a=d["sg"][:, None], scale_b=d["sb"],
            out_dtype=torch.bfloat16,
        ),
        [(d,) for d in sets],
        reps,
    )  # fmt: skip
    T["ref_gx_us"] = timed(
        lambda d: hq_grad_input._init_fn(d["gy"], d["w"], *hq_args), [(d,) for d in sets], ref_reps
    )
    gw_args = (0, LP_L1, 16, 8, ROUNDING, name, False)
    T["gw_hla_ref_us"] = timed(
        lambda d: hla_grad_weight._init_fn(d["gy"].view(N, S, O), d["xq"], d["sx"], *gw_args),
        one,
        ref_reps,
    )
    T["hot_gw_us"] = timed(
        lambda d: ops.hla_grad_weight(d["gy"].view(N, S, O), d["xq"], d["sx"], *gw_args),
        one,
        reps,
    )
    T["gw_quant_gy_us"] = timed(
        lambda d: hla_triton.hla_quantize(d["gy"].view(N, S, O), 0, LP_L1, 8, ROUNDING), one, reps
    )
    T["gw_xq_t_us"] = timed(lambda d: d["xq"].t().contiguous(), one, reps)
    T["gw_gemm_int8_us"] = timed(lambda d: torch._int_mm(d["gqt"], d["xqt"].t()), one, reps)
    T["gw_dequant_us"] = timed(lambda d: d["acc"] * (d["sgw"] * d["sx"] / 16), one, reps)
    T["abc_fwd_us"] = timed(
        lambda d: ops.abc_compress(d["x"].view(N, S, I), 0, LP_L1, 16, 8, ROUNDING), one, reps
    )
    T["abc_fwd_ref_us"] = timed(
        lambda d: abc_compress._init_fn(d["x"].view(N, S, I), 0, LP_L1, 16, 8, ROUNDING),
        one,
        ref_reps,
    )
    # bytes the two passes of the fused g_y kernel must move: g_y read twice, codes written
    T["gw_quant_gy_TBps"] = (2 * L * O * 2 + L // 2 * O) / T["gw_quant_gy_us"] / 1e6
    if sweep_hla:
        for bb, bd, nw in ((4, 64, 4), (8, 64, 4), (8, 128, 4), (16, 64, 4), (16, 128, 8)):
            T[f"sweep_hla_b{bb}_d{bd}_w{nw}_us"] = timed(
                lambda d, bb=bb, bd=bd, nw=nw: hla_triton.hla_quantize(
                    d["gy"].view(N, S, O), 0, LP_L1, 8, ROUNDING, True, bb, bd, nw
                ),
                one,
                reps,
            )
    o_pad = padded(O, 16)
    qbytes = L * O * 2 + padded(L, 16) * o_pad + L * 4
    T["quant_gy_TBps"] = qbytes / T["quant_gy_us"] / 1e6
    if sweep:
        for bo in (128, 256, 512, 1024, 2048, 4096):
            if bo > triton_next_pow2(o_pad):
                continue
            T[f"sweep_quant_gy_block_o_{bo}_us"] = timed(
                lambda d, bo=bo: hq_triton.hq_quantize(
                    d["gy"], 4, True, ROUNDING, torch.float8_e4m3fn, 16, block_o=bo
                ),
                [(d,) for d in sets],
                reps,
            )
    bf16 = T["bf16_gx_us"] + T["bf16_gw_us"]
    hot = T["hot_gx_us"] + T["hot_gw_us"]
    row = dict(name=name, L=L, O=O, I=I, bf16_us=bf16, hot_us=hot, speedup_vs_bf16=bf16 / hot)
    row["speedup_gx_vs_bf16"] = T["bf16_gx_us"] / T["hot_gx_us"]
    row["speedup_gx_vs_ref"] = T["ref_gx_us"] / T["hot_gx_us"]
    row["speedup_gw_vs_bf16"] = T["bf16_gw_us"] / T["hot_gw_us"]
    row["speedup_gw_vs_ref"] = T["gw_hla_ref_us"] / T["hot_gw_us"]
    row.update(T)
    del sets
    torch.cuda.empty_cache()
    return row


def triton_next_pow2(n):
    return 1 << (n - 1).bit_length()


def table(rows):
    head = (
        "| layer | L | O | I | bf16 g_x | bf16 g_w | HOT g_x | = quant g_y | + quant W "
        "| + FP8 GEMM "
        "| quant g_y TB/s | ref g_x | HOT g_w | g_x speed-up | bf16 total | HOT total "
        "| total speed-up |\n|" + "---|" * 17
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['L']} | {r['O']} | {r['I']} | {r['bf16_gx_us']:.1f} "
            f"| {r['bf16_gw_us']:.1f} | {r['hot_gx_us']:.1f} | {r['quant_gy_us']:.1f} "
            f"| {r['quant_w_us']:.1f} | {r['gemm_fp8_us']:.1f} | {r['quant_gy_TBps']:.2f} "
            f"| {r['ref_gx_us']:.0f} | {r['hot_gw_us']:.1f} | {r['speedup_gx_vs_bf16']:.2f}x "
            f"| {r['bf16_us']:.1f} | {r['hot_us']:.1f} | {r['speedup_vs_bf16']:.2f}x |"
        )
    return "\n".join(lines)


def gw_table(rows):
    head = (
        "| layer | bf16 g_w | HOT g_w | = HLA+quant g_y | + xq transpose | + INT8 GEMM "
        "| + dequant | HLA+quant TB/s | g_w ref | g_w vs bf16 | g_w vs ref | ABC fwd "
        "| ABC fwd ref |\n|" + "---|" * 13
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['bf16_gw_us']:.1f} | {r['hot_gw_us']:.1f} "
            f"| {r['gw_quant_gy_us']:.1f} | {r['gw_xq_t_us']:.1f} | {r['gw_gemm_int8_us']:.1f} "
            f"| {r['gw_dequant_us']:.1f} | {r['gw_quant_gy_TBps']:.2f} "
            f"| {r['gw_hla_ref_us']:.0f} | {r['speedup_gw_vs_bf16']:.2f}x "
            f"| {r['speedup_gw_vs_ref']:.1f}x | {r['abc_fwd_us']:.1f} | {r['abc_fwd_ref_us']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="also time hq_quantize tile widths")
    ap.add_argument("--sweep-hla", action="store_true", help="also time hla_quantize tiles")
    ap.add_argument("--quick", action="store_true", help="ViT-B layers only, fewer reps")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    layers = LAYERS[:4] if a.quick else LAYERS
    rows = []
    for spec in layers:
        rows.append(
            bench_layer(*spec, reps=10 if a.quick else 20, sweep=a.sweep, sweep_hla=a.sweep_hla)
        )
        print(f"{spec[0]}: done", flush=True)
    vit = [r for r in rows if r["name"].startswith("vitb")]
    props = torch.cuda.get_device_properties(0)
    import triton

    res = dict(
        device=props.name,
        torch=torch.__version__,
        triton=triton.__version__,
        date=datetime.date.today().isoformat(),
        method="CUDA events, median of 20 (reference paths: 5) after 3 warm-ups, 3 input sets "
        "rotated, GPU queued ahead with torch.cuda._sleep; times in microseconds",
        note="g_x: Triton fused Hadamard+quantize, FP8 _scaled_mm with row-wise scales. g_w: "
        "hla_grad_weight on CUDA (Triton fused HLA+INT8 quantize of g_y, K-major codes; the "
        "saved ABC codes transposed; torch._int_mm; dequantize). hot_us = hot_gx_us + "
        "hot_gw_us; bf16_us = bf16_gx_us + bf16_gw_us; gw_hla_ref_us is the pure-PyTorch "
        "reference of the same op; abc_fwd_us (the forward's ABC compression) is not in "
        "hot_us. "
        "The weight quantize (quant_w_us: W transposed, then the same fused kernel with a SAWB "
        "scale) runs on every call; it could be cached per optimizer step.",
        layers=rows,
        mean_speedup_vitb=statistics.mean(r["speedup_vs_bf16"] for r in vit),
        mean_speedup_gx_vitb=statistics.mean(r["speedup_gx_vs_bf16"] for r in vit),
        mean_speedup_gw_vitb=statistics.mean(r["speedup_gw_vs_bf16"] for r in vit),
    )
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_layers.json").write_text(json.dumps(res, indent=1) + "\n")
    md = (
        f"# Per-layer backward timing (tools/bench_layers.py)\n\n"
        f"Device: {res['device']}; torch {res['torch']}, triton {res['triton']}; {res['date']}.\n"
        f"{res['method']}.\n\n{res['note']}\n\n{table(rows)}\n\n"
        f"Mean total speed-up over bf16, ViT-B layers: {res['mean_speedup_vitb']:.2f}x "
        f"(g_x alone: {res['mean_speedup_gx_vitb']:.2f}x, "
        f"g_w alone: {res['mean_speedup_gw_vitb']:.2f}x).\n\n"
        f"## g_w path stages\n\n{gw_table(rows)}\n"
    )
    (out / "bench_layers.md").write_text(md)
    if a.sweep_hla:
        pre = "sweep_hla_"
        for r in rows:
            sw = {k[len(pre) : -3]: round(v, 1) for k, v in r.items() if k.startswith(pre)}
            print(r["name"], "hla default", round(r["gw_quant_gy_us"], 1), "by tile", sw)
    if a.sweep:
        pre = "sweep_quant_gy_block_o_"
        for r in rows:
            sw = {k[len(pre) : -3]: round(v, 1) for k, v in r.items() if k.startswith(pre)}
            print(r["name"], "default", round(r["quant_gy_us"], 1), "by block_o", sw)
    print(md)


if __name__ == "__main__":
    main()

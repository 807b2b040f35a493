"""Probe of the native lowering on a GPU: per-layer gate timings and a whole ViT-B step.

    python3 tools/repros/native_probe.py [--out DIR] [--steps 10] [--models vit,llama]

1. The gate (``hotcompile.lowering.gate.measure``) on ViT-B/16 (batch 128) and Llama-style
   (h 2048, MLP 8192, batch 4 × 2048) layer shapes: HOT's native backward vs bf16, device time
   under CUDA graphs, with the roofline model's estimate beside it.
2. Whole training steps (bf16 autocast, fused AdamW, median of ``--steps``): inductor,
   ``backend="hot"`` (defaults) and ``backend="hot"`` with ``prefer="paper"`` (HOT on every
   layer), each with and without CUDA graphs, plus the GPU-busy share of one profiled step.

Prints tables; writes ``probe.json`` into ``--out``. A development probe: the committed
benchmark is tools/bench_train.py.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

import hotcompile
from hotcompile.lowering import gate

VIT = [("qkv", 2304, 768), ("proj", 768, 768), ("fc1", 3072, 768), ("fc2", 768, 3072)]
LLAMA = [("qkv", 6144, 2048), ("o", 2048, 2048), ("gate_up", 8192, 2048), ("down", 2048, 8192)]


def gate_table(rows: list[dict]) -> None:
    for name, n, s, layers in (("vit", 128, 197, VIT), ("llama", 4, 2048, LLAMA)):
        for lname, O, I in layers:
            shape = gate.Shape(L=n * s, O=O, I=I, N=n, S=s, rows=(0, 2, 3, 8, 10, 11, 12, 14),
                               signs=name == "llama")  # fmt: skip
            t0 = time.perf_counter()
            m = gate.measure(shape, torch.device("cuda"))
            e = gate.estimate(shape)
            rows.append({"model": name, "layer": lname, "L": n * s, "O": O, "I": I,
                         "bf16_us": m.bf16_us, "hot_us": m.hot_us, "speedup": m.speedup,
                         "model_bf16_us": e.bf16_us, "model_hot_us": e.hot_us,
                         "measure_s": time.perf_counter() - t0})  # fmt: skip
            r = rows[-1]
            print(f"{name:6s} {lname:8s} L={r['L']:6d} O={O:5d} I={I:5d}  bf16 {m.bf16_us:7.1f}"
                  f"  hot {m.hot_us:7.1f}  {m.speedup:5.2f}x   model {e.bf16_us:7.1f}/"
                  f"{e.hot_us:7.1f} {e.speedup:5.2f}x", flush=True)  # fmt: skip


def stages(rows: list[dict]) -> None:
    """Device time of each stage of HOT's native backward for a few shapes (CUDA graphs)."""

    for name, n, s, O, I in (("vit.qkv", 128, 197, 2304, 768), ("vit.fc1", 128, 197, 3072, 768),
                             ("llama.down", 4, 2048, 2048, 8192)):  # fmt: skip
        _stages_of(rows, name, n, s, O, I)


def _stages_of(rows: list[dict], name: str, n: int, s: int, O: int, I: int) -> None:
    from hotcompile.lowering import hot

    dev = torch.device("cuda")
    hla = (0, 2, 3, 8, 10, 11, 12, 14)
    if True:
        L = n * s
        gy = torch.randn(L, O, device=dev, dtype=torch.bfloat16)
        x = torch.randn(L, I, device=dev, dtype=torch.bfloat16)
        w = torch.randn(O, I, device=dev)
        wb = w.bfloat16()
        gq, sg = hot.quantize_gy(gy, 4, True, "pseudo_stochastic", True, 16)
        wq, sw = hot.quantize_weight(w, 4, "sawb", True)
        xq, sx = hot.compress(x.view(n, s, I), 0, hla, 8, "pseudo_stochastic", None)
        gqt, sgg = hot.hla_codes(gy.view(n, s, O), 0, hla, 8, "pseudo_stochastic", None)
        xf, sxf = hot.compress(x.view(n, s, I), 0, hla, 8, "fp8_e4m3", None)
        gf, sgf = hot.hla_codes(gy.view(n, s, O), 0, hla, 8, "fp8_e4m3", None)
        one = torch.ones((), device=dev)
        swb = (sw / 16).expand(1, I).contiguous()
        pieces = {
            "bf16 g_x mm": lambda: torch.mm(gy, wb),
            "bf16 g_w mm": lambda: torch.mm(gy.t(), x),
            "hq_quantize g_y": lambda: hot.quantize_gy(gy, 4, True, "pseudo_stochastic", True, 16),
            "weight quantize": lambda: hot.quantize_weight(w, 4, "sawb", True),
            "g_x _scaled_mm rowwise": lambda: torch._scaled_mm(
                gq, wq.t(), scale_a=sg[:, None], scale_b=swb, out_dtype=torch.bfloat16),
            "hla codes g_y (int8)": lambda: hot.hla_codes(
                gy.view(n, s, O), 0, hla, 8, "pseudo_stochastic", None),
            "abc compress x (int8)": lambda: hot.compress(
                x.view(n, s, I), 0, hla, 8, "pseudo_stochastic", None),
            "g_w _int_mm": lambda: torch._int_mm(gqt.contiguous(), xq),
            "g_w _scaled_mm fp8": lambda: torch._scaled_mm(
                gf.contiguous(), xf, scale_a=one, scale_b=one, out_dtype=torch.float32),
            "HOT total (int8 g_w)": gate._hot_fn(gate.Shape(L, O, I, n, s, rows=hla), gy, w, x),
            "HOT total (fp8 g_w)": gate._hot_fn(
                gate.Shape(L, O, I, n, s, rows=hla, gw_rounding="fp8_e4m3"), gy, w, x),
        }  # fmt: skip
        for k, fn in pieces.items():
            us = gate._graph_us(fn)
            rows.append({"shape": name, "stage": k, "us": us})
            print(f"{name:11s} {k:26s} {us:8.1f} us", flush=True)


def build(model: str):
    if model == "vit":
        import timm

        m = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000)
        x = torch.randn(128, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (128,), device="cuda")
        return m.cuda(), (lambda mm: torch.nn.functional.cross_entropy(mm(x), y))
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                      max_position_embeddings=2048)  # fmt: skip
    m = LlamaForCausalLM(cfg).cuda()
    ids = torch.randint(0, 32000, (4, 2048), device="cuda")
    return m, (lambda mm: mm(input_ids=ids, labels=ids).loss)


def step_time(model_name: str, variant: str, steps: int) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    m, loss_of = build(model_name)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    cg = variant.endswith("_cg")
    base = variant.removesuffix("_cg")
    if base == "inductor":
        c = torch.compile(m, mode="reduce-overhead" if cg else None)
        backend = None
    else:
        opts = {"prefer": "paper"} if base == "hot_paper" else {}
        if cg:
            opts["mode"] = "reduce-overhead"
        backend = hotcompile.HotBackend(**opts)
        c = torch.compile(m, backend=backend)

    def step():
        if cg:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", torch.bfloat16):
            loss = loss_of(c)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    peak = torch.cuda.max_memory_allocated() / 2**30
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) * 1e6
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)  # fmt: skip
    busy, end = 0.0, -1.0
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    res = {"ms": statistics.median(times), "peak_gib": peak, "compile_s": compile_s,
           "gpu_busy": busy / wall, "loss": float(loss)}  # fmt: skip
    if backend is not None:
        res["layers"] = {
            "hot": sum(p.path == "hot" for p in backend.layers),
            "skipped": sum(p.path == "skipped" for p in backend.layers),
            "reasons": sorted({p.reason[:90] for p in backend.layers if p.reason}),
        }
    step = c = m = opt = None  # free the model before the next variant
    torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=".")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default="vit")
    ap.add_argument("--variants", default="inductor,hot,hot_paper,inductor_cg,hot_cg,hot_paper_cg")
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--stages", action="store_true", help="time each stage of HOT's backward")
    a = ap.parse_args()
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "gate": []}
    if not a.no_gate:
        gate_table(res["gate"])
    if a.stages:
        res["stages"] = []
        stages(res["stages"])
    for model in filter(None, a.models.split(",")):
        for v in a.variants.split(","):
            try:
                r = step_time(model, v, a.steps)
            except Exception as e:  # noqa: BLE001
                r = {"error": f"{type(e).__name__}: {e}"[:500]}
            res[f"{model}/{v}"] = r
            print(model, v, json.dumps(r), flush=True)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        if "/" in k and "ms" in v:
            print(f"{k:24s} {v['ms']:8.2f} ms  peak {v['peak_gib']:6.2f} GiB  busy "
                  f"{v['gpu_busy']:.0%}  {v.get('layers', {}).get('hot', '')}")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()

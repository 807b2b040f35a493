"""Probe of the native lowering on a GPU, layer by layer.

    python3 experiments/native_probe.py [--out DIR] [--no-gate] [--stages]

1. The gate (``hotcompile.lowering.gate.measure``) on ViT-B/16 (batch 128) and Llama-style
   (h 2048, MLP 8192, batch 4 × 2048) layer shapes: HOT's native backward vs bf16, device time
   under CUDA graphs, with the roofline model's estimate beside it.
2. ``--stages``: each stage of HOT's native backward timed alone for three shapes
   (experiments/results/native_stages_h100.md).

Prints tables; writes ``probe.json`` into ``--out``. Whole training steps are
tools/bench_train.py's (``--hot-options '{"prefer": "paper"}'`` for HOT on every layer).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

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
    L = n * s
    gy = torch.randn(L, O, device=dev, dtype=torch.bfloat16)
    x = torch.randn(L, I, device=dev, dtype=torch.bfloat16)
    w = torch.randn(O, I, device=dev)
    wb = w.bfloat16()
    gq, sg, _ = hot.quantize_gy(gy, 4, True, "pseudo_stochastic", True, 16)
    wq, sw = hot.quantize_weight(w, 4, "sawb", True)
    xq, sx = hot.compress(x.view(n, s, I), 0, hla, 8, "pseudo_stochastic", None)
    gqt, sgg = hot.hla_codes(gy.view(n, s, O), 0, hla, 8, "pseudo_stochastic", None)
    xf, sxf = hot.compress(x.view(n, s, I), 0, hla, 8, "fp8_e4m3", None)
    gf, sgf = hot.hla_codes(gy.view(n, s, O), 0, hla, 8, "fp8_e4m3", None)
    one = torch.ones((), device=dev)
    swb = sw  # quantize_weight's scale row s/16 over [1, I] (session 37)
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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=".")
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--stages", action="store_true", help="time each stage of HOT's backward")
    a = ap.parse_args()
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "gate": []}
    if not a.no_gate:
        gate_table(res["gate"])
    if a.stages:
        res["stages"] = []
        stages(res["stages"])
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(res, indent=1))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

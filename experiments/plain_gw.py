"""The text recipe's g_w quantizers before and after sharing HQ's max-abs of g_y (H100).

The text recipe (no HLA) quantizes x (ABC, in the forward) and g_y (backward) for the g_w GEMM
``g_yᵀ·x``: plain rows, one FP8 scale per tensor, codes written K-major. Until now the HLA
kernel did it with ``TRANSFORM`` off (16 register tiles per block, interleaving joins), at
~2.4× one pass over the tensor. Now the g_y side takes its max-abs from HQ's kernel, which
reads the same g_y (``raw_amax``): one pass instead of two. (The committed table came from
this script at 932e0a3, when a separate plain-rows kernel, since removed as no faster —
``plain_codes_pass_h100.md`` — wrote the codes; its labels say "rows kernel".)

For each layer shape of the benchmark's Llama (hidden 2048, MLP 8192, 4 × 2048 tokens) and of
GPT-2 small (8 × 1024 tokens), under CUDA graphs (``gate._graph_us``): the bf16 backward, the
text recipe's layer backward as before and as now (the gate's own measurement), and the
stages that changed; then HQ's kernel over the wide g_y with other tiles.

    python3 experiments/plain_gw.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

SHAPES = [  # name, L, O, I
    ("llama.q/k/v/o", 8192, 2048, 2048),
    ("llama.gate/up", 8192, 8192, 2048),
    ("llama.down", 8192, 2048, 8192),
    ("gpt2.c_attn", 8192, 2304, 768),
    ("gpt2.attn.c_proj", 8192, 768, 768),
    ("gpt2.c_fc", 8192, 3072, 768),
    ("gpt2.mlp.c_proj", 8192, 768, 3072),
]
FP8 = "fp8_e4m3"


def old_plain_codes(x3: torch.Tensor):
    """The plain rows' codes as before: the HLA kernel, TRANSFORM off, two launches."""
    from hotcompile.kernels import hla_triton

    return hla_triton.launch_hla_quantize(
        hla_triton._hla_quant_kernel, x3, 0, (), 8, FP8, True, False, torch.float8_e4m3fn,
        None, None, 0,
    )  # fmt: skip


def probe(name: str, L: int, O: int, I: int) -> dict:  # noqa: E741
    from hotcompile.lowering import gate, hot

    T = gate._graph_us
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    gy = torch.randn((L, O), device=dev, generator=g).bfloat16()
    x = torch.randn((L, I), device=dev, generator=g).bfloat16()
    w = torch.randn((O, I), device=dev, generator=g)
    wb = w.bfloat16()
    x3, gy3 = x.view(1, L, I), gy.view(1, L, O)
    s = gate.Shape(L=L, O=O, I=I, N=1, S=L, gx_bits=8, per_token=True, rounding=FP8,
                   gw_rounding=FP8, weight_scale="maxabs")  # fmt: skip

    def bf16():
        torch.mm(gy, wb)
        torch.mm(gy.t(), x)

    def old_total():
        gx = hot.grad_input(gy, w, 8, True, FP8, "maxabs")
        xq, sx = old_plain_codes(x3)
        gq, sg = old_plain_codes(gy3)
        one = torch.ones((), device=dev)
        gw = torch._scaled_mm(gq, xq.t(), scale_a=(sg * sx).reshape(()), scale_b=one,
                              out_dtype=torch.float32)  # fmt: skip
        return gx, gw

    r: dict = {"layer": name, "L": L, "O": O, "I": I}
    r["bf16 backward"] = T(bf16)
    r["text recipe before"] = T(old_total)
    r["text recipe now"] = T(gate._hot_fn(s, gy, w, x))
    r["ABC x before (HLA kernel, 2 passes)"] = T(lambda: old_plain_codes(x3))
    r["ABC x now (2 passes)"] = T(lambda: hot.compress(x3, 0, (), 8, FP8, None))
    r["g_y codes before (HLA kernel, 2 passes)"] = T(lambda: old_plain_codes(gy3))
    _, _, raw = hot.quantize_gy(gy, 8, True, FP8, True, 16, True)
    r["g_y codes now (HQ's max-abs)"] = T(lambda: hot.hla_codes(gy3, 0, (), 8, FP8, None, raw))
    r["HQ g_y"] = T(lambda: hot.quantize_gy(gy, 8, True, FP8, True, 16))
    r["HQ g_y + raw max-abs"] = T(lambda: hot.quantize_gy(gy, 8, True, FP8, True, 16, True))
    # same codes both ways
    a, sa = old_plain_codes(gy3)
    b, sb = hot.hla_codes(gy3, 0, (), 8, FP8, None, raw)
    r["codes equal"] = bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))
    r["scales equal"] = bool(torch.equal(sa, sb))
    r["floor: one pass over g_y"] = L * O * 3 / 3.0e12 * 1e6
    for bo in (1024, 2048, 4096, 8192):
        if bo <= triton_next_pow2(O):
            r[f"HQ g_y block_o={bo}"] = T(lambda bo=bo: hq_tile(gy, bo))
    r["speed-up before"] = r["bf16 backward"] / r["text recipe before"]
    r["speed-up now"] = r["bf16 backward"] / r["text recipe now"]
    return r


def hq_tile(gy: torch.Tensor, block_o: int):
    """HQ's FP8 per-token codes of g_y with another tile width (the kernel as launched)."""
    from hotcompile.kernels import hq_triton

    L, O = gy.shape
    codes = torch.empty((L, O), dtype=torch.float8_e4m3fn, device=gy.device)
    scales = torch.empty((L,), dtype=torch.float32, device=gy.device)
    hq_triton.launch_hq_quantize(hq_triton._hq_quant_kernel, gy, codes, scales, None, 8, FP8, 0,
                                 block_o=block_o)  # fmt: skip
    return codes, scales


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def markdown(rows: list[dict], device: str) -> str:
    lines = [
        "# Text recipe g_w quantizers: HQ's shared max-abs of g_y",
        "",
        f"Device: {device}; torch {torch.__version__}. Generated by `experiments/plain_gw.py`.",
        "µs under CUDA graphs (median of 5 replays of 3 calls); bf16 g_y / x, fp32 W.",
        "",
        "| layer | L×O×I | bf16 µs | text before µs | text now µs | speed-up before → now |"
        " ABC x before → now | g_y codes before → now | HQ (+ max-abs) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layer']} | {r['L']}×{r['O']}×{r['I']} | {r['bf16 backward']:.0f} | "
            f"{r['text recipe before']:.0f} | {r['text recipe now']:.0f} | "
            f"{r['speed-up before']:.2f}× → {r['speed-up now']:.2f}× | "
            f"{r['ABC x before (HLA kernel, 2 passes)']:.0f} → "
            f"{r['ABC x now (2 passes)']:.0f} | "
            f"{r['g_y codes before (HLA kernel, 2 passes)']:.0f} → "
            f"{r['g_y codes now (HQ' + chr(39) + 's max-abs)']:.0f} | "
            f"{r['HQ g_y']:.0f} ({r['HQ g_y + raw max-abs']:.0f}) |"
        )
    lines += ["", "HQ's kernel over g_y by tile width (µs; default first):", ""]
    for r in rows:
        tiles = ", ".join(f"{k.split('=')[1]}: {v:.0f}" for k, v in r.items()
                          if k.startswith("HQ g_y block_o"))  # fmt: skip
        lines.append(f"- {r['layer']}: default {r['HQ g_y']:.0f}; {tiles}; one-pass floor "
                     f"{r['floor: one pass over g_y']:.0f}")  # fmt: skip
    ok = all(r["codes equal"] and r["scales equal"] for r in rows)
    lines += ["", f"Codes and scales identical before and now on every shape: {ok}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    rows = []
    for shape in SHAPES:
        rows.append(probe(*shape))
        print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in rows[-1].items()})
        sys.stdout.flush()
        torch.cuda.empty_cache()
    device = torch.cuda.get_device_name()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plain_gw.json").write_text(json.dumps({"device": device, "torch": torch.__version__,
                                                   "rows": rows}, indent=1))  # fmt: skip
    md = markdown(rows, device)
    (out / "plain_gw.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

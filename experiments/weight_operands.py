"""Does one pair of passes over a weight pay for its two FP8-forward operands? (issue 34)

Under ``forward="fp8"`` a HOT layer makes, every step, HQ's Hadamard codes of its weight and
the forward's rowwise FP8 copy, each from autocast's bf16 copy of the fp32 parameter. Today
the compiled step writes that bf16 copy, runs HQ's kernel over it (two passes) and inductor's
fused rowwise cast: ~16 bytes a parameter. ``hotcompile.kernels.weight_triton.weight_operands``
reads the fp32 parameter twice and writes both (~10 bytes). This times both ways under CUDA
graphs at the benchmark Llamas' weight shapes, checks that they give the same bits, and sums
the step's share (each shape × its count in the model).

    python3 experiments/weight_operands.py [--out experiments/results/weight_operands_h200.md]
    python3 experiments/weight_operands.py --sweep [--deadline 120]   # the kernel's tiles

Session 26 (H200): today's passes 3.13 ms a step on the 0.67B Llama, the fused kernel at its
first tile (8 blocks of 16 rows × 64 channels, 4 warps) 3.44; on the 8B widths 2.97 → 2.28.
``--sweep`` times the kernel at other tiles per shape, to pick its launch by shape.
Session 27 (H200): ViT-L/16's four weight shapes with the vision recipe's INT4 SAWB codes,
1.18–1.90× faster fused (4.62 → 2.94 ms a step on ViT-L): with SAWB the step now takes the
fused pass at every shape.

The compiled step takes the kernel by W's shape and codes (``lowering.hot.weight_operands_pay``:
SAWB codes always, max-abs ones for rows of at least ``WEIGHT_OPERANDS_MIN_I`` inputs), from
this script's H200 numbers; revise that constant from its output on another GPU. Its
numerics are tested through Triton's interpreter (``tests/test_kernels_interpret.py``) and on
CUDA (``tests/test_weight_operands_gpu.py``).
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import time

import torch

from hotcompile.autograd import LayerSpec
from hotcompile.kernels.weight_triton import weight_operands
from hotcompile.lowering import gate
from hotcompile.lowering import hot as native
from hotcompile.quant import FP8_E4M3, quantize

#: (model, layer, O, I, layers of that shape in the model, recipe)
SHAPES = (
    ("llama", "q/k/v/o", 2048, 2048, 32, "text"),
    ("llama", "gate/up", 8192, 2048, 16, "text"),
    ("llama", "down", 2048, 8192, 8, "text"),
    ("llama8b", "q/o", 4096, 4096, 4, "text"),
    ("llama8b", "k/v", 1024, 4096, 4, "text"),
    ("llama8b", "gate/up", 14336, 4096, 4, "text"),
    ("llama8b", "down", 4096, 14336, 2, "text"),
    ("vit_l16", "qkv", 3072, 1024, 24, "vision"),
    ("vit_l16", "proj", 1024, 1024, 24, "vision"),
    ("vit_l16", "fc1", 4096, 1024, 24, "vision"),
    ("vit_l16", "fc2", 1024, 4096, 24, "vision"),
)
_VISION = LayerSpec(name="vision")  # the default spec is the vision recipe
#: HQ's weight quantizer of each recipe, as the step's LayerSpec gives it (bits, rounding,
#: weight scale): the text recipe's FP8 codes with a max-abs scale, the vision recipe's INT4
#: SAWB codes (two atomic float sums more in the kernel's first pass)
QUANT = {
    "text": (8, FP8_E4M3, "maxabs"),
    "vision": (_VISION.gx_bits, _VISION.gx_rounding, _VISION.weight_scale),
}


def today(w: torch.Tensor, recipe: str = "text"):
    """As the compiled step makes them apart: autocast's bf16 copy, HQ's kernel over it and
    the rowwise FP8 cast (ATen that inductor fuses)."""
    wb = w.to(torch.bfloat16)
    hq, hs = native.weight_codes(wb, *QUANT[recipe])
    w8, ws = quantize(wb, 8, True, FP8_E4M3)
    return hq, hs, w8, ws


def fused(w: torch.Tensor, recipe: str = "text"):
    """As the step makes them together (``lowering.hot.weight_operands``, the kernel's
    ``triton_op``), from the fp32 parameter."""
    return native.weight_operands(w, *QUANT[recipe], torch.bfloat16)


def _differ(a, b) -> str:
    """The larger share of codes that differ between the two ways' HQ codes and FP8 copies
    ("0": same bits), and the scales' largest relative difference where they are not the same
    bits: SAWB's atomic sums may move its one scale by an ulp and a few codes with it (a
    share over the scales would read 1.0 for that one ulp, as session 27's table did)."""
    worst = max(float((x.float() != y.float()).float().mean()) for x, y in zip(a[::2], b[::2]))
    text = "0" if worst == 0 else f"{worst:.1e}"
    rel = max(float(((x - y).abs() / y.abs().clamp_min(1e-30)).max()) for x, y in
              zip(a[1::2], b[1::2]))  # fmt: skip
    return text if rel == 0 else f"{text} (scales {rel:.0e})"


#: (BLOCK_B blocks of 16 rows, BLOCK_D channels, warps) tried by --sweep; the first is
#: session 25's, whose bits the others are checked against (the default since: 4 × 128 / 4)
TILES = (
    (8, 64, 4), (8, 64, 8), (4, 64, 4), (4, 128, 4), (4, 128, 8), (2, 128, 4), (2, 256, 4),
    (8, 32, 4), (16, 32, 4), (4, 32, 2), (16, 64, 8), (1, 256, 2), (2, 64, 2), (1, 128, 1),
)  # fmt: skip


def sweep(deadline: float) -> list[str]:
    """Each shape's time at each tile of TILES (until ``deadline`` s), the fastest marked."""
    t0 = time.monotonic()
    head = " | ".join(f"{b}×{d}/{nw}" for b, d, nw in TILES)
    lines = [
        "| model | layer | O × I | today µs | " + head + " | best |",
        "|---|---|---|---|" + "---|" * (len(TILES) + 1),
    ]
    compiled = torch.compile(today)
    for model, layer, O, I, _, recipe in SHAPES:
        if recipe != "text":
            continue  # the tiles are timed with the text recipe's codes
        w = torch.randn(O, I, device="cuda")

        def at(tile, w=w):  # the text recipe's FP8 codes, the kernel at ``tile``
            return weight_operands(w, 8, FP8_E4M3, False, torch.float8_e4m3fn, True, None, *tile)

        ref = at(TILES[0])
        cells, times = [], {}
        for tile in TILES:
            if time.monotonic() - t0 > deadline:
                cells.append("—")
                continue
            same = _differ(ref, at(tile)) == "0"
            times[tile] = us = gate._graph_us(lambda tile=tile: at(tile))
            cells.append(f"{us:.1f}" + ("" if same else " (bits differ)"))
        t_today = gate._graph_us(lambda w=w: compiled(w))
        best = min(times, key=times.get) if times else None
        lines.append(
            f"| {model} | {layer} | {O} × {I} | {t_today:.1f} | "
            + " | ".join(cells)
            + (f" | {best[0]}×{best[1]}/{best[2]}: {times[best]:.1f} |" if best else " | — |")
        )
        print(lines[-1], flush=True)
    return lines


def _where() -> str:
    """The device, torch and date a table was measured on (a results file's header)."""
    return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {datetime.date.today()}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=pathlib.Path, help="also write the markdown table here")
    p.add_argument("--sweep", action="store_true", help="time the kernel's tiles (TILES)")
    p.add_argument("--deadline", type=float, default=120.0, help="--sweep's time limit, s")
    a = p.parse_args(argv)
    if a.sweep:
        lines = [
            f"# weight_operands' tiles ({_where()}): µs per call, BLOCK_B×BLOCK_D/warps",
            "",
            *sweep(a.deadline),
        ]
        if a.out:
            a.out.write_text("\n".join(lines) + "\n")
        return 0
    compiled = torch.compile(today)
    lines = [
        f"# weight_operands vs today's weight passes ({_where()})",
        "",
        "| model | layer | O × I | recipe | today µs | fused µs | speed-up | elements differing "
        "| per step, ms (today → fused) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    total: dict[str, list[float]] = {}
    for model, layer, O, I, count, recipe in SHAPES:
        w = torch.randn(O, I, device="cuda")
        a_out, b_out = compiled(w, recipe), fused(w, recipe)
        same = _differ(a_out, b_out)
        t_today = gate._graph_us(lambda w=w, r=recipe: compiled(w, r))
        t_fused = gate._graph_us(lambda w=w, r=recipe: fused(w, r))
        acc = total.setdefault(model, [0.0, 0.0])
        acc[0] += t_today * count / 1e3
        acc[1] += t_fused * count / 1e3
        lines.append(
            f"| {model} | {layer} | {O} × {I} | {recipe} | {t_today:.1f} | {t_fused:.1f} | "
            f"{t_today / t_fused:.2f}x | {same} | {t_today * count / 1e3:.2f} → "
            f"{t_fused * count / 1e3:.2f} |"
        )
    lines.append("")
    lines += [f"- {m}: the weights' operands {t:.2f} → {f:.2f} ms a step" for m, (t, f) in
              total.items()]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

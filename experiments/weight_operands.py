"""Does one pair of passes over a weight pay for its two FP8-forward operands? (issue 34)

Under ``forward="fp8"`` a HOT layer makes, every step, HQ's Hadamard codes of its weight and
the forward's rowwise FP8 copy, each from autocast's bf16 copy of the fp32 parameter. Today
the compiled step writes that bf16 copy, runs HQ's kernel over it (two passes) and inductor's
fused rowwise cast: ~16 bytes a parameter. ``hotcompile.kernels.weight_triton.weight_operands``
reads the fp32 parameter twice and writes both (~10 bytes). This times both ways under CUDA
graphs at the benchmark Llamas' weight shapes, checks that they give the same bits, and sums
the step's share (each shape × its count in the model).

    python3 experiments/weight_operands.py [--out experiments/results/weight_operands_h200.md]

The compiled step takes the kernel (``autograd._weight_operands_together``), wired before any
GPU timed it (session 25 had no device time left): if this shows it slower, that function
is where to turn it off. Its numerics are tested through Triton's interpreter
(``tests/test_kernels_interpret.py``) and on CUDA (``tests/test_weight_operands_gpu.py``).
"""

from __future__ import annotations

import argparse
import pathlib

import torch

from hotcompile.kernels.weight_triton import weight_operands
from hotcompile.lowering import gate
from hotcompile.lowering import hot as native
from hotcompile.quant import FP8_E4M3, quantize

#: (model, layer, O, I, layers of that shape in the model)
SHAPES = (
    ("llama", "q/k/v/o", 2048, 2048, 32),
    ("llama", "gate/up", 8192, 2048, 16),
    ("llama", "down", 2048, 8192, 8),
    ("llama8b", "q/o", 4096, 4096, 4),
    ("llama8b", "k/v", 1024, 4096, 4),
    ("llama8b", "gate/up", 14336, 4096, 4),
    ("llama8b", "down", 4096, 14336, 2),
)


def today(w: torch.Tensor):
    """As the compiled step makes them now: autocast's bf16 copy, HQ's kernel over it (the
    text recipe's FP8 g_x: e4m3 codes, max-abs scale) and the rowwise FP8 cast (ATen that
    inductor fuses)."""
    wb = w.to(torch.bfloat16)
    hq, hs = native.weight_codes(wb, 8, FP8_E4M3, "maxabs")
    w8, ws = quantize(wb, 8, True, FP8_E4M3)
    return hq, hs, w8, ws


def fused(w: torch.Tensor):
    return weight_operands(w, 8, FP8_E4M3, False, torch.float8_e4m3fn, True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=pathlib.Path, help="also write the markdown table here")
    a = p.parse_args(argv)
    compiled = torch.compile(today)
    lines = [
        f"# weight_operands vs today's weight passes ({torch.cuda.get_device_name()}, torch "
        f"{torch.__version__})",
        "",
        "| model | layer | O × I | today µs | fused µs | speed-up | same bits | per step, ms "
        "(today → fused) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    total: dict[str, list[float]] = {}
    for model, layer, O, I, count in SHAPES:
        w = torch.randn(O, I, device="cuda")
        a_out, b_out = compiled(w), fused(w)
        same = all(torch.equal(x.float(), y.float()) for x, y in zip(a_out, b_out))
        t_today = gate._graph_us(lambda w=w: compiled(w))
        t_fused = gate._graph_us(lambda w=w: fused(w))
        acc = total.setdefault(model, [0.0, 0.0])
        acc[0] += t_today * count / 1e3
        acc[1] += t_fused * count / 1e3
        lines.append(
            f"| {model} | {layer} | {O} × {I} | {t_today:.1f} | {t_fused:.1f} | "
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

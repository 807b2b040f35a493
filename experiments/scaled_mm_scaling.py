"""Is the FP8 GEMM with vector scales what keeps hot_fp8 behind torchao? (issue 34)

Session 26's profile of the 0.67B Llama (``tools/results/bench_train_profiles/s26_34760ae``):
HOT's 113 ``_scaled_mm`` calls with vector scales (the forward's rowwise GEMMs and the
per-token g_x GEMMs) ran cuBLAS's ``ovscale`` kernels with 128 × 128 tiles at ~1.23 PFLOP/s,
torchao's tensorwise forward GEMMs larger tiles at ~1.40. This times one ``_scaled_mm`` per
benchmark-Llama shape (8192 tokens) under CUDA graphs, five ways:

- ``rowwise``: scales ``[M, 1]`` and ``[1, N]`` (HOT's forward and per-token g_x today);
- ``rowwise fast``: the same with ``use_fast_accum=True`` (torchao's forward setting);
- ``tensorwise``: 0-d scales; ``tensorwise fast``: with fast accumulation;
- ``tw + scale``: a tensorwise GEMM with unit scales, then the row and column scales applied
  by inductor in a pass of its own (what a rowwise GEMM costs when its epilogue moves out;
  a consumer that inductor fuses it into would make the pass free).

    python3 experiments/scaled_mm_scaling.py [--out experiments/results/scaled_mm_scaling_h200.md]
    python3 experiments/scaled_mm_scaling.py --errors [--out ...]   # what fast accumulation costs

Session 27 (H200, ``results/scaled_mm_scaling_h200.md``): rowwise and tensorwise within ~5%,
fast accumulation 5–16% faster either way, the scales in a pass of their own always slower;
hence ``HotConfig.fp8_fast_accum``. ``--errors`` (not yet run) gives, per shape, the relative
error of the rowwise GEMM's output with float32 and with fast accumulation against a float64
product of the same e4m3 operands, beside e4m3's own rounding error of those operands
(normal random data): whether ``fp8_fast_accum="all"`` (HQ's g_x GEMM too) costs accuracy
that matters next to the quantization it already takes.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib

import torch

from hotcompile.lowering import gate

M = 8192  # tokens of both benchmark Llamas' batches
#: (model, layer, N outputs, K inputs) of the forward GEMM ``x Wᵀ``; g_x is ``[M, K]`` from
#: ``[M, N]`` codes and the weight's, the same GEMM with N and K swapped
SHAPES = (
    ("llama", "q/k/v/o", 2048, 2048),
    ("llama", "gate/up", 8192, 2048),
    ("llama", "down", 2048, 8192),
    ("llama8b", "q/o", 4096, 4096),
    ("llama8b", "k/v", 1024, 4096),
    ("llama8b", "gate/up", 14336, 4096),
    ("llama8b", "down", 4096, 14336),
)
WAYS = ("rowwise", "rowwise fast", "tensorwise", "tensorwise fast", "tw + scale")


def _gemm(a, b, way):
    """One way's call: ``a [M, K]``, ``b [N, K]`` e4m3, bf16 ``[M, N]``."""
    sa = torch.rand(a.shape[0], 1, device="cuda") + 0.5
    sb = torch.rand(1, b.shape[0], device="cuda") + 0.5
    one = torch.ones((), device="cuda")
    if way.startswith("rowwise"):
        fast = way.endswith("fast")
        return lambda: torch._scaled_mm(
            a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast
        )
    if way.startswith("tensorwise"):
        fast = way.endswith("fast")
        return lambda: torch._scaled_mm(
            a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast
        )

    @torch.compile
    def tw_scale(a, b, sa, sb):
        y = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return (y.float() * sa * sb).to(torch.bfloat16)

    return lambda: tw_scale(a, b, sa, sb)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def errors(device: str = "cuda") -> list[str]:
    """Per shape and GEMM: ``‖y − y64‖ / ‖y64‖`` of the rowwise GEMM's bf16 output with
    float32 and with fast accumulation (``y64``: the float64 product of the dequantized e4m3
    operands), and e4m3's rounding (the float64 product of the operands before quantization
    against ``y64``)."""
    from hotcompile.quant import FP8_E4M3, dequantize, quantize

    lines = [
        "| model | layer | GEMM | M × N × K | float32 accumulation | fast accumulation | "
        "e4m3 rounding of the operands |",
        "|---|---|---|---|---|---|---|",
    ]
    g = torch.Generator(device=device).manual_seed(0)
    for model, layer, n, k in SHAPES:
        for gemm, (nn, kk) in (("forward", (n, k)), ("g_x", (k, n))):
            x = torch.randn(M, kk, device=device, generator=g)
            w = torch.randn(nn, kk, device=device, generator=g) * 0.02
            xq, sx = quantize(x, 8, True, FP8_E4M3)
            wq, sw = quantize(w, 8, True, FP8_E4M3)
            y64 = dequantize(xq, sx).double() @ dequantize(wq, sw).double().t()
            exact = x.double() @ w.double().t()

            out = [
                _rel(torch._scaled_mm(xq, wq.t(), scale_a=sx[:, None], scale_b=sw[None, :],
                                      out_dtype=torch.bfloat16, use_fast_accum=fast), y64)
                for fast in (False, True)
            ]  # fmt: skip
            quant = _rel(y64, exact)
            lines.append(f"| {model} | {layer} | {gemm} | {M} × {nn} × {kk} | {out[0]:.1e} | "
                         f"{out[1]:.1e} | {quant:.1e} |")  # fmt: skip
            print(lines[-1], flush=True)
            del x, w, xq, wq, y64, exact
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=pathlib.Path, help="also write the markdown table here")
    p.add_argument("--errors", action="store_true", help="accuracy of fast accumulation instead")
    args = p.parse_args(argv)
    where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {datetime.date.today()}"
    if args.errors:
        head = f"# Rowwise FP8 GEMM: relative error of the output ({where}), normal random data"
        text = "\n".join([head, "", *errors()]) + "\n"
        if args.out:
            args.out.write_text(text)
        return 0
    lines = [
        f"# One FP8 GEMM, five ways of scaling ({where}); µs, PFLOP/s in brackets",
        "",
        "| model | layer | GEMM | M × N × K | " + " | ".join(WAYS) + " |",
        "|---|---|---|---|" + "---|" * len(WAYS),
    ]
    for model, layer, n, k in SHAPES:
        for gemm, (nn, kk) in (("forward", (n, k)), ("g_x", (k, n))):
            a = torch.randn(M, kk, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(nn, kk, device="cuda").to(torch.float8_e4m3fn)
            cells = []
            for way in WAYS:
                try:
                    us = gate._graph_us(_gemm(a, b, way), reps=7)
                    cells.append(f"{us:.1f} ({2 * M * nn * kk / us / 1e9:.2f})")
                except RuntimeError as e:  # a way cuBLAS does not take
                    cells.append(f"— ({str(e).splitlines()[0][:40]})")
            lines.append(
                f"| {model} | {layer} | {gemm} | {M} × {nn} × {kk} | " + " | ".join(cells) + " |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

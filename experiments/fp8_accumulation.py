"""What promoting FP8 partial sums costs and buys in the Triton scaled GEMM (Hopper).

Hopper's FP8 tensor-core MMA adds its products into an accumulator narrower than fp32.
Triton's sm_90 default never moves those partial sums into a true fp32 accumulator
(``max_num_imprecise_acc`` = 2^30); CUTLASS's non-FastAccum schedules promote every few
K steps. ``hotcompile.kernels.gemm_triton.scaled_gemm(precise=True)`` (the default) promotes
once per K tile. This script measures, at the g_x and g_w shapes of ``tools/bench_gemm.py``:

* the time of ``precise=True`` vs ``precise=False`` (autotuned tiles each, CUDA events,
  median of ``--reps`` after warm-up), side by side in one run;
* the error against the exact integer product for INT4-grid codes (integers in [-7, 7], the
  g_x path's numerics) drawn symmetric (like real Hadamard-quantized codes) and same-sign
  (every partial sum large: the worst case for a narrow accumulator), fp32 out, unit scales.

    python3 experiments/fp8_accumulation.py [--reps 30] [--out FILE]

Needs a CUDA GPU with FP8 (sm_89+).
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench_gemm import SHAPES  # noqa: E402

from hotcompile.kernels import gemm_triton  # noqa: E402


def _codes(m: int, k: int, same_sign: bool, g: torch.Generator) -> torch.Tensor:
    lo, hi = (4, 8) if same_sign else (-7, 8)
    return torch.randint(lo, hi, (m, k), generator=g, dtype=torch.int8)


def _time_us(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def measure(name: str, m: int, n: int, k: int, reps: int) -> dict:
    """Times and exactness of both accumulation modes at one shape."""
    g = torch.Generator().manual_seed(m + n + k)
    row: dict = {"name": name, "M": m, "N": n, "K": k}
    one = torch.ones(1, device="cuda")
    for kind in ("symmetric", "same_sign"):
        a, b = _codes(m, k, kind == "same_sign", g), _codes(n, k, kind == "same_sign", g)
        a8 = a.cuda().float().to(torch.float8_e4m3fn)
        b8 = b.cuda().float().to(torch.float8_e4m3fn)
        # the exact sum (|Σ| ≤ 49·K < 2^24, so exact in fp32 too) from the int8 tensor cores
        exact = torch._int_mm(a.cuda(), b.cuda().t()).float()
        for precise in (True, False):
            out = gemm_triton.scaled_gemm(a8, b8, one, None, torch.float32, precise=precise)
            err = (out - exact).abs()
            tag = "precise" if precise else "fast"
            row[f"{kind}_{tag}_max_abs_err"] = err.max().item()
            row[f"{kind}_{tag}_wrong_frac"] = (err > 0).float().mean().item()
            if kind == "symmetric":
                row[f"{tag}_us"] = _time_us(
                    lambda p=precise, x=a8, y=b8: gemm_triton.scaled_gemm(
                        x, y, one, None, torch.bfloat16, precise=p
                    ),
                    reps,
                )
    row["precise_cost"] = row["precise_us"] / row["fast_us"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="experiments/fp8_accumulation.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--reps", type=int, default=30, help="timed calls per mode (default 30)")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="write the table here too")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    lines = [
        "# FP8 accumulation in the Triton scaled GEMM: promoted (precise) vs Triton's default",
        "",
        f"- device: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
        f"date {datetime.date.today()}",
        "- time: bf16 out, autotuned tiles, median of CUDA-event timings; errors: fp32 out vs "
        "the exact integer sum, INT4-grid codes",
        "",
        "| shape | M×N×K | precise µs | fast µs | cost | sym. max err precise / fast "
        "| same-sign max err precise / fast | same-sign wrong fraction fast |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m, n, k in SHAPES:
        r = measure(name, m, n, k, a.reps)
        lines.append(
            f"| {name} | {m}×{n}×{k} | {r['precise_us']:.1f} | {r['fast_us']:.1f} | "
            f"{r['precise_cost']:.3f}× | {r['symmetric_precise_max_abs_err']:g} / "
            f"{r['symmetric_fast_max_abs_err']:g} | {r['same_sign_precise_max_abs_err']:g} / "
            f"{r['same_sign_fast_max_abs_err']:g} | {r['same_sign_fast_wrong_frac']:.3f} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

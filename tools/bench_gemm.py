"""Time HOT's backward GEMMs on Hopper: CUTLASS scaled GEMMs vs torch's kernels.

Why: the backward of a HOT layer is two quantized GEMMs whose product must be rescaled per row
and column. This measures whether the CUTLASS kernels of csrc/ (dequant fused in the epilogue)
beat ``torch._scaled_mm`` (FP8, row-wise scales), ``torch._int_mm`` followed by a separate
dequant multiply, and the honest baseline, bf16 ``torch.mm``, at the real layer shapes.

Per shape (M, N, K), ``a [M, K]`` and ``b [N, K]`` K-contiguous, bf16 output:
  bf16          torch.mm(a_bf16, b_bf16.T)
  scaled_mm     torch._scaled_mm(a_e4m3, b_e4m3.T, scale_a [M,1], scale_b [1,N])
  int_mm+dq     (torch._int_mm(a_i8, b_i8.T) * scale_a[:, None] * scale_b[None, :]).bfloat16()
  cutlass_fp8_cN / cutlass_int8_cN    hotcompile.kernels.cutlass.scaled_gemm, config N
  cutlass_*_acc_cN (g_w shapes, not --quick): fp32 out accumulated into a gradient
Times: CUDA events around each call, median of >= 20 after warm-up; TFLOP/s = 2MNK / time.
Every CUTLASS result is also compared with torch's (max relative error, in the JSON).

    python tools/bench_gemm.py [--quick] [--out DIR]

writes DIR/bench_gemm.json and DIR/bench_gemm.md (default DIR: tools/results).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import sys
from collections.abc import Callable

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hotcompile.kernels import cutlass  # noqa: E402

# (name, M, N, K): g_x = g_y·W (M = L tokens, K = O, N = I); g_w with HLA: M = O, N = I,
# K = L/2 (12608 = 788·16 for ViT-B at batch 128; 4096 for the LLM layers)
SHAPES = [
    ("vitb.qkv g_x", 25216, 2304, 768),
    ("vitb.proj g_x", 25216, 768, 768),
    ("vitb.fc1 g_x", 25216, 3072, 768),
    ("vitb.fc2 g_x", 25216, 768, 3072),
    ("llm.up g_x", 8192, 4096, 14336),
    ("llm.down g_x", 8192, 14336, 4096),
    ("vitb.qkv g_w_hla", 2304, 768, 12608),
    ("vitb.proj g_w_hla", 768, 768, 12608),
    ("vitb.fc1 g_w_hla", 3072, 768, 12608),
    ("vitb.fc2 g_w_hla", 768, 3072, 12608),
    ("llm.up g_w_hla", 14336, 4096, 4096),
    ("llm.down g_w_hla", 4096, 14336, 4096),
]


def time_us(fn: Callable[[], object], warmup: int, reps: int) -> float:
    """Median of ``reps`` CUDA-event timings of ``fn`` (µs) after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref|, in float64."""
    d = (x.double() - ref.double()).abs().max()
    return (d / ref.double().abs().max().clamp_min(1e-30)).item()


def bench_shape(name: str, m: int, n: int, k: int, args: argparse.Namespace) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    dev = "cuda"
    # HOT's operands: INT4-grid codes as e4m3, INT8 codes as int8, fp32 per-row/col scales
    a4 = torch.randint(-7, 8, (m, k), device=dev, generator=g, dtype=torch.int8)
    b4 = torch.randint(-7, 8, (n, k), device=dev, generator=g, dtype=torch.int8)
    a8, b8 = a4.float().to(torch.float8_e4m3fn), b4.float().to(torch.float8_e4m3fn)
    ai = torch.randint(-127, 128, (m, k), device=dev, generator=g, dtype=torch.int8)
    bi = torch.randint(-127, 128, (n, k), device=dev, generator=g, dtype=torch.int8)
    sa = torch.rand(m, device=dev, generator=g) + 0.5
    sb = torch.rand(n, device=dev, generator=g) * 1e-2 + 1e-3
    abf = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    bbf = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    sa_col, sb_row = sa.view(-1, 1), sb.view(1, -1)

    def scaled_mm():
        return torch._scaled_mm(
            a8, b8.t(), scale_a=sa_col, scale_b=sb_row, out_dtype=torch.bfloat16
        )

    def int_mm_dq():
        return (torch._int_mm(ai, bi.t()) * sa_col * sb_row).to(torch.bfloat16)

    kernels: dict[str, Callable[[], object]] = {
        "bf16": lambda: torch.mm(abf, bbf.t()),
        "scaled_mm": scaled_mm,
        "int_mm+dq": int_mm_dq,
    }
    refs = {"fp8": scaled_mm(), "int8": int_mm_dq()}
    checks: dict[str, float] = {}
    if cutlass.available():
        is_gw = "g_w" in name
        for tag, (a, b) in {"fp8": (a8, b8), "int8": (ai, bi)}.items():
            for c in cutlass.CONFIGS[str(a.dtype).removeprefix("torch.")]:

                def run(a=a, b=b, c=c):
                    return cutlass.scaled_gemm(a, b, sa, sb, out_dtype=torch.bfloat16, config=c)

                kernels[f"cutlass_{tag}_c{c}"] = run
                checks[f"cutlass_{tag}_c{c}"] = rel_err(run(), refs[tag])
                if is_gw and not args.quick:
                    acc = torch.zeros(m, n, device=dev)

                    def run_acc(a=a, b=b, c=c, acc=acc):
                        return cutlass.scaled_gemm(a, b, sa, sb, out=acc, config=c)

                    kernels[f"cutlass_{tag}_acc_c{c}"] = run_acc
    flop = 2.0 * m * n * k
    rows = []
    for kname, fn in kernels.items():
        us = time_us(fn, args.warmup, args.reps)
        row = {"shape": name, "M": m, "N": n, "K": k, "kernel": kname}
        row |= {"us": round(us, 2), "tflops": round(flop / us / 1e6, 1)}
        if kname in checks:
            row["max_rel_err_vs_torch"] = checks[kname]
        rows.append(row)
        print(f"{name:20s} {kname:22s} {us:9.1f} us {flop / us / 1e6:7.1f} TFLOP/s", flush=True)
    return rows


def write_md(path: pathlib.Path, meta: dict, rows: list[dict]) -> None:
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    by = {(r["shape"], r["kernel"]): r for r in rows}
    lines = [
        "# GEMM benchmark (tools/bench_gemm.py)",
        "",
        f"Device: {meta['device']}; torch {meta['torch']} (CUDA {meta['cuda']}); "
        f"{meta['date']}; median of {meta['reps']} after {meta['warmup']} warm-up calls, "
        "CUDA events. Cells: µs / TFLOP/s (bf16 output unless `acc` = fp32 accumulate).",
        "",
    ]
    if meta.get("cutlass_unavailable"):
        lines += [f"CUTLASS kernels unavailable: {meta['cutlass_unavailable']}", ""]
    if meta.get("cutlass_configs"):
        lines += ["CUTLASS configs: " + "; ".join(meta["cutlass_configs"]), ""]
    lines += ["| shape | M | N | K | " + " | ".join(kernels) + " |"]
    lines += ["|---" * (4 + len(kernels)) + "|"]
    for s in shapes:
        any_row = next(r for r in rows if r["shape"] == s)
        cells = []
        for k in kernels:
            r = by.get((s, k))
            cells.append(f"{r['us']:.1f} / {r['tflops']:.0f}" if r else "")
        lines.append(f"| {s} | {any_row['M']} | {any_row['N']} | {any_row['K']} | ")
        lines[-1] += " | ".join(cells) + " |"
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="tools/bench_gemm.py",
        description=__doc__.split("\n\n")[0]
        + " Per shape: bf16 torch.mm, torch._scaled_mm (FP8), torch._int_mm + dequant and the"
        " CUTLASS configs of csrc/, median CUDA-event time and TFLOP/s; writes bench_gemm.json"
        " and bench_gemm.md into --out. Needs a Hopper GPU (CUTLASS: pip install"
        " nvidia-cutlass==4.2.0.0).",
        epilog="examples:\n"
        "  python3 tools/bench_gemm.py --quick --out /tmp/gemm   # 20 reps, no fp32-acc rows\n"
        "  python3 tools/bench_gemm.py --out $OUT                # every shape and config",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="20 reps, 3 warm-up, no fp32-acc rows")
    p.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "tools" / "results", help="default tools/results"
    )
    p.add_argument("--reps", type=int, default=None, help="timed calls per kernel (>= 20)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (10; --quick 3)")
    args = p.parse_args(argv)
    args.reps = max(20, args.reps or (20 if args.quick else 50))
    args.warmup = args.warmup or (3 if args.quick else 10)
    if not torch.cuda.is_available():
        print("bench_gemm: needs a CUDA GPU", file=sys.stderr)
        return 1
    ok = cutlass.build()
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "reps": args.reps,
        "warmup": args.warmup,
        "cutlass_unavailable": None if ok else cutlass.error(),
        "cutlass_configs": [f"c{i}: {s}" for i, s in enumerate(cutlass.config_names())],
    }
    rows: list[dict] = []
    for name, m, n, k in SHAPES:
        rows += bench_shape(name, m, n, k, args)
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_gemm.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    write_md(args.out / "bench_gemm.md", meta, rows)
    print(f"wrote {args.out / 'bench_gemm.json'} and {args.out / 'bench_gemm.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

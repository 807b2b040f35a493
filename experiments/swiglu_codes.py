"""The lean plan's SwiGLU forward: one kernel against what inductor generates from the ATen.

Under ``forward="fp8"`` with ``abc_swiglu="fp8"`` and ``abc_recompute="unary"`` (the bench's
``hot_fp8_lean``, ``prefer="memory"``'s ABC choices) the forward of ``silu(a) * b`` makes three
sets of rowwise e4m3 codes: a's and b's (saved for the backward) and the product's (the down
projection's FP8 operand). Written as ATen, inductor made them in one kernel of three looped
row reductions, 385 µs a layer on an H200 against hot_fp8's 159 µs for the product's codes
alone (``tools/results/fp8_forward_h200_s28.md``). ``hotcompile.kernels.swiglu_triton.
_swiglu_codes_kernel`` holds each row in registers and reads a and b once.

This script checks the kernel on the GPU (a's and b's codes and scales bit for bit against
``lowering.hot.swiglu_codes``; the product's codes against ``quantize`` of the product rounded
to bf16, where ``tl.sigmoid`` against torch's may flip a rare code) and times, under CUDA
graphs, at the 0.67B Llama's (8192 × 8192) and the 8B widths' (8192 × 14336) shapes:

- ``inductor, lean``: the three quantizers as ATen, compiled (what the step ran);
- ``inductor, hot_fp8``: the product's codes alone (hot_fp8's forward, for scale);
- ``inductor, codes + values``: a's and b's codes and the bf16 product (the bf16 forward's
  ``prefer="memory"``), against the kernel's ``"values"`` product;
- the kernel, each product, at 8 / 16 / 32 warps;
- the floor: the bytes at 4.0 TB/s (what the H200's simpler passes reach).

Usage (GPU): ``python3 experiments/swiglu_codes.py [--out FILE.md]``.
"""

from __future__ import annotations

import json

import gpu_script
import torch
import torch.nn.functional as F

from hotcompile.lowering.hot import swiglu_codes
from hotcompile.quant import FP8_E4M3, quantize


def lean_aten(a, b):
    """The lean forward as the step wrote it before the kernel (inductor fuses it)."""
    y = F.silu(a) * b
    return (*swiglu_codes(a), *swiglu_codes(b), *quantize(y, 8, True, FP8_E4M3))


def fp8_aten(a, b):
    """hot_fp8's forward of the product: its rowwise codes alone."""
    return quantize(F.silu(a) * b, 8, True, FP8_E4M3)


def values_aten(a, b):
    """The bf16 forward under prefer="memory": a's and b's codes and the product."""
    return (*swiglu_codes(a), *swiglu_codes(b), F.silu(a) * b)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def measure(L: int, O: int, T, st) -> tuple[dict, str]:
    """Checks and times at ``[L, O]`` (``T``: the CUDA-graph timer, ``st``: the kernel's
    module): the JSON entry and the markdown row."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn((L, O), device="cuda", generator=gen).bfloat16() for _ in range(2))
    r: dict = {}
    n = L * O
    floor = {None: n * (4 + 2), "fp8": n * (4 + 3), "values": n * (4 + 4)}
    r["floor µs at 4.0 TB/s"] = {str(k): v / 4.0e12 * 1e6 for k, v in floor.items()}
    # correctness
    ca, sa, cb, sb, y, sy = st.swiglu_codes(a, b, "fp8")
    (ra, rsa), (rb, rsb) = swiglu_codes(a), swiglu_codes(b)
    r["a, b codes bit-exact"] = all(
        torch.equal(_bytes(u), _bytes(v)) for u, v in ((ca, ra), (sa, rsa), (cb, rb), (sb, rsb))
    )
    prod = (F.silu(a.float()) * b.float()).bfloat16()
    ry, rsy = quantize(prod, 8, True, FP8_E4M3)
    r["product codes differing (share)"] = (_bytes(y) != _bytes(ry)).float().mean().item()
    r["product scales max rel diff"] = ((sy - rsy).abs() / rsy).max().item()
    yv = st.swiglu_codes(a, b, "values")[4]
    r["product values differing from torch's bf16 (share)"] = (
        (yv.view(torch.int16) != prod.view(torch.int16)).float().mean().item()
    )
    # times
    lean_c, fp8_c, val_c = (torch.compile(f) for f in (lean_aten, fp8_aten, values_aten))
    r["inductor, lean (3 sets of codes)"] = T(lambda: lean_c(a, b))
    r["inductor, hot_fp8 (product codes only)"] = T(lambda: fp8_c(a, b))
    r["inductor, codes + bf16 values"] = T(lambda: val_c(a, b))
    sweep = {}
    for product in (None, "fp8", "values"):
        for warps in (8, 16, 32):
            key = f"kernel {product}, {warps} warps"
            try:
                sweep[key] = T(lambda p=product, w=warps: st.swiglu_codes(a, b, p, w))
            except Exception as e:  # noqa: BLE001 - a tile Triton cannot build
                sweep[key] = f"failed: {type(e).__name__}: {str(e)[:120]}"
    r["kernel µs"] = sweep
    r["default warps"] = st.codes_warps(O)
    print(json.dumps({f"{L}x{O}": r}, indent=1), flush=True)
    best = {
        p: min((v for k, v in sweep.items() if k.startswith(f"kernel {p},")
                and isinstance(v, float)), default=float("nan"))
        for p in ("None", "fp8", "values")
    }  # fmt: skip
    row = (
        f"| {L} × {O} | {r['inductor, lean (3 sets of codes)']:.1f} | {best['fp8']:.1f} | "
        f"{r['floor µs at 4.0 TB/s']['fp8']:.1f} | "
        f"{r['inductor, hot_fp8 (product codes only)']:.1f} | "
        f"{r['inductor, codes + bf16 values']:.1f} | {best['values']:.1f} | "
        f"{r['a, b codes bit-exact']} | {r['product codes differing (share)']:.2e} |"
    )
    return r, row


def main() -> None:
    args = gpu_script.parse(__doc__)
    from hotcompile.kernels import swiglu_triton as st
    from hotcompile.lowering import gate

    T = gate._graph_us
    results: dict = {}
    rows = []
    for L, O in ((8192, 8192), (8192, 14336)):
        r, row = measure(L, O, T, st)
        results[f"{L}x{O}"] = r
        rows.append(row)
    meta = gpu_script.provenance(
        "swiglu_codes.py",
        "µs under CUDA graphs (`gate._graph_us`); the kernel's best warps of 8/16/32 (each: the "
        "JSON).",
    )
    header = [
        "| rows × width | inductor, lean (3 codes) | kernel, fp8 product | floor | "
        "inductor, hot_fp8 (product codes) | inductor, codes + bf16 product | "
        "kernel, values | a, b codes bit-exact | product codes differing |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    title = "The lean plan's SwiGLU forward: one kernel against inductor's"
    gpu_script.write(args.out, title, meta, header, rows, results)


if __name__ == "__main__":
    main()

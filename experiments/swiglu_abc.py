"""The lean plan's backward: down's ABC codes from the SwiGLU's saved codes, one kernel against
what inductor generated from the ATen.

Under ``abc_swiglu="fp8"`` with ``abc_recompute="unary"`` (the bench's ``hot_fp8_lean``,
``prefer="memory"``'s ABC choices) the backward re-derives the down projection's ABC codes of
``silu(a')·b'`` from the SwiGLU's saved rowwise FP8 codes of ``a`` and ``b``. As ATen, inductor
made the bf16 product and its max-abs in one kernel (0.85 ms a step on the H200 Llama, 8 calls)
and the HLA quantizer then read the product back for the codes.
``hotcompile.kernels.swiglu_triton.swiglu_abc`` makes the product inside its two passes
(max-abs, codes) from the 1-byte codes; it is never written. (A first version ran the product
inside ``hla_triton._hla_quant_kernel``'s 16-position blocks: 238 µs at 8192², slower than
inductor's 166, at 164–255 registers a thread; this session's first call of this script.)

This script checks the kernel on the GPU (codes and scale against the ATen path's) and times,
under CUDA graphs, at the 0.67B Llama's (8192 × 8192) and the 8B widths' (8192 × 14336) shapes
with the text recipe's plain rows and FP8 codes:

- ``inductor``: the product as ATen then ``lowering.hot.compress`` with the producer's max-abs,
  compiled (what the lean step ran before);
- the kernel at several tiles (blocks × channels × warps);
- the floor: the bytes at 4.0 TB/s (codes read twice, the codes written).

Usage (GPU): ``python3 experiments/swiglu_abc.py [--out FILE.md]``.
"""

from __future__ import annotations

import json

import gpu_script
import torch
import torch.nn.functional as F

from hotcompile.lowering import hot
from hotcompile.quant import FP8_E4M3, dequantize

#: (padded tokens, channels, warps, tiles a program walks)
TILES = ((32, 128, 8, 8), (32, 128, 8, 4), (32, 128, 8, 1), (16, 128, 4, 8), (16, 64, 4, 8),
         (16, 64, 4, 16), (32, 64, 4, 8), (64, 64, 8, 4), (64, 128, 8, 2), (16, 256, 4, 8),
         (32, 128, 4, 8), (8, 256, 4, 8), (128, 64, 8, 1), (128, 64, 8, 2), (256, 32, 8, 2),
         (128, 32, 4, 4), (256, 64, 16, 1), (128, 128, 16, 1))  # fmt: skip


def aten(ca, sa, cb, sb, shape):
    """The lean backward's derivation as the step wrote it before the kernel."""
    y = (F.silu(dequantize(ca, sa)) * dequantize(cb, sb)).bfloat16().reshape(shape)
    return hot.compress(y, 0, (), 8, FP8_E4M3, None, producer_amax=True)


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def measure(N: int, S: int, D: int, T, st) -> tuple[dict, str]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b = ((torch.randn((N * S, D), device="cuda", generator=gen) * 3).bfloat16()
            for _ in range(2))  # fmt: skip
    (ca, sa), (cb, sb) = hot.swiglu_codes(a), hot.swiglu_codes(b)
    shape = (N, S, D)
    r: dict = {}
    n = N * S * D
    r["floor µs at 4.0 TB/s"] = n * 5 / 4.0e12 * 1e6
    compiled = torch.compile(aten)
    rc, rs = compiled(ca, sa, cb, sb, shape)
    c, s = st.swiglu_abc(ca, sa, cb, sb, N, 8, FP8_E4M3, torch.bfloat16)
    r["scale equal"] = bool(torch.equal(s, rs))
    r["codes differing (share)"] = (_u8(c.t()) != _u8(rc)).float().mean().item()
    r["inductor (product, then the codes pass)"] = T(lambda: compiled(ca, sa, cb, sb, shape))
    sweep = {}
    for bt, bd, w, loop in TILES:
        key = f"kernel {bt}x{bd}x{loop}, {w} warps"
        try:
            sweep[key] = T(lambda bt=bt, bd=bd, w=w, lp=loop: st.swiglu_abc(
                ca, sa, cb, sb, N, 8, FP8_E4M3, torch.bfloat16, block_t=bt, block_d=bd,
                warps=w, loop=lp))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a tile Triton cannot build
            sweep[key] = f"failed: {type(e).__name__}: {str(e)[:120]}"
    r["kernel µs"] = sweep
    print(json.dumps({f"{N * S}x{D}": r}, indent=1), flush=True)
    times = {k: v for k, v in sweep.items() if isinstance(v, float)}
    best = min(times, key=times.get) if times else "none"
    default = sweep[f"kernel {st.ABC_BLOCK_T}x{st.ABC_BLOCK_D}x{st.ABC_LOOP}, {st.ABC_WARPS} warps"]
    row = (
        f"| {N * S} × {D} | {r['inductor (product, then the codes pass)']:.1f} | "
        f"{default:.1f} | "
        f"{times.get(best, float('nan')):.1f} ({best.removeprefix('kernel ')}) | "
        f"{r['floor µs at 4.0 TB/s']:.1f} | {r['scale equal']} | "
        f"{r['codes differing (share)']:.2e} |"
    )
    return r, row


def main() -> None:
    args = gpu_script.parse(__doc__)
    from hotcompile.kernels import swiglu_triton as st
    from hotcompile.lowering import gate

    results: dict = {}
    rows = []
    for N, S, D in ((4, 2048, 8192), (2, 4096, 14336)):
        r, row = measure(N, S, D, gate._graph_us, st)
        results[f"{N * S}x{D}"] = r
        rows.append(row)
    meta = gpu_script.provenance(
        "swiglu_abc.py", "µs under CUDA graphs (`gate._graph_us`); each tile's time in the JSON."
    )
    header = [
        "| tokens × width | inductor (product, codes pass) | kernel, default tile | "
        "kernel, best tile | floor | scale equal | codes differing |",
        "|---|---|---|---|---|---|---|",
    ]
    title = "The lean backward's ABC codes from the SwiGLU's codes: one kernel against inductor's"
    gpu_script.write(args.out, title, meta, header, rows, results)


if __name__ == "__main__":
    main()

"""One pass over g_y for the text recipe's two code sets: a prototype, measured before it is built.

The text recipe quantizes each HOT layer's g_y twice, in two kernels that each read it from
HBM: HQ's (per-token FP8 of ``g_y·B_O``, row-major ``[L, O]``, also taking g_y's raw max-abs)
and the g_w codes' (FP8 of g_y itself with that max-abs as the per-tensor scale, stored
K-major ``[O, L]``). On the Llama's gate/up that is 78 + 78 µs on the H100 against ~89 µs for
one pass (read 128 MiB, write two 64 MiB code sets) — ``docs/lowering.md``, "One pass over g_y".

With the raw max-abs given (from g_y's producer, as ``abc_max_abs="producer"`` does for x),
one kernel can write both. HQ's per-token scale is the max over a whole *transformed* row, so
a program must see its rows whole before writing HQ's codes; the K-major store wants >= 32
tokens per program to fill a 32-byte sector. The prototype kernel ``_gy_codes_kernel`` walks
``BLOCK_L`` rows in ``BLOCK_O``-wide chunks twice: the first walk writes the g_w codes
(transposed) and takes the transformed rows' max-abs, the second re-reads the rows (from L2,
if they are still there) and writes HQ's codes. ``NCHUNK == 1`` keeps the tile in registers
(one walk, short K-major runs of ``BLOCK_L`` bytes).

This script checks the prototype bit for bit against the production kernels (HQ's
``hq_quantize`` + the plain-rows ``hla_codes`` with the max-abs given) and times a sweep of
tiles against them under CUDA graphs, for the Llama shapes. Usage (GPU):

    python3 experiments/one_pass_gy.py [--out FILE.md]

On CPU ``TRITON_INTERPRET=1 python3 experiments/one_pass_gy.py --check-only`` runs the
bit-exactness check through Triton's interpreter at a small shape, against the reference
(``quantize(block_hadamard(g_y))`` and ``quantize(g_y)`` in e4m3).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import pathlib

import torch
import triton
import triton.language as tl

from hotcompile.kernels.hq_triton import _amax_bits, _load_ht
from hotcompile.kernels.rounding import FP8, codes, normal_scale
from hotcompile.quant import FP8_MAX

QMAX = int(FP8_MAX)


@triton.jit
def _gy_codes_kernel(
    gy_ptr, hq_ptr, hq_scale_ptr, gw_ptr, gw_scale_ptr, amax_ptr,
    L, O, L_OUT, O_PAD, R, stride_g, stride_h, seed,
    QMAX: tl.constexpr, NCHUNK: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_O: tl.constexpr,
):  # fmt: skip
    """HQ's per-token FP8 codes of ``g_y·B_O`` ``[L_OUT, O_PAD]`` and their scales, and the
    plain FP8 codes of g_y ``[O, R]`` (K-major, token r = row r: S a multiple of 16) with the
    per-tensor scale from the given raw max-abs bits ``amax_ptr``."""
    INV_Q: tl.constexpr = 1.0 / QMAX
    pid = tl.program_id(0)
    rows = pid * BLOCK_L + tl.arange(0, BLOCK_L)
    rmask = rows < L
    rows64 = rows.to(tl.int64)
    s_w = normal_scale(tl.load(amax_ptr).to(tl.float32, bitcast=True) * INV_Q)
    if pid == 0:
        tl.store(gw_scale_ptr, s_w)
    bits = tl.zeros([BLOCK_L], dtype=tl.int32)
    for c in range(NCHUNK):
        cc = c * BLOCK_O + tl.arange(0, BLOCK_O)
        cmask = cc < O
        raw = tl.load(
            gy_ptr + rows64[:, None] * stride_g + cc[None, :],
            mask=rmask[:, None] & cmask[None, :], other=0.0,
        ).to(tl.float32)  # fmt: skip
        cw = codes(raw, s_w, cc[None, :], seed, FP8, QMAX, 1)  # (offs, seed: unused by FP8)
        # the K-major store: column o of the [O, R] codes holds this tile's BLOCK_L tokens
        cwt = tl.trans(cw)
        ptrs = gw_ptr + cc.to(tl.int64)[:, None] * R + rows[None, :]
        tl.store(ptrs, cwt.to(gw_ptr.dtype.element_ty), mask=cmask[:, None] & rmask[None, :])
        x, _ = _load_ht(gy_ptr, stride_g, rows64, rmask, cc, O, BLOCK_L, BLOCK_O)
        bits = tl.maximum(bits, _amax_bits(x))
    scale = normal_scale(bits.to(tl.float32, bitcast=True) * INV_Q)
    tl.store(hq_scale_ptr + rows, scale, mask=rows < L_OUT)
    s = scale[:, None]
    for c in range(NCHUNK):
        cc = c * BLOCK_O + tl.arange(0, BLOCK_O)
        x, _ = _load_ht(gy_ptr, stride_g, rows64, rmask, cc, O, BLOCK_L, BLOCK_O)
        q = codes(x, s, cc[None, :], seed, FP8, QMAX, 1)
        mask = (rows < L_OUT)[:, None] & (cc < O_PAD)[None, :]
        ptrs = hq_ptr + rows64[:, None] * stride_h + cc[None, :]
        tl.store(ptrs, q.to(hq_ptr.dtype.element_ty), mask=mask)


def gy_codes(gy: torch.Tensor, amax: torch.Tensor, block_l: int, block_o: int, warps: int):
    """Launch the prototype: ``(hq codes, hq scales, gw codes [O, L], gw scale)``."""
    L, O = gy.shape
    l_out, o_pad = -(-L // 16) * 16, -(-O // 16) * 16
    dev = gy.device
    hq = torch.empty((l_out, o_pad), dtype=torch.float8_e4m3fn, device=dev)
    hs = torch.empty((l_out,), dtype=torch.float32, device=dev)
    gw = torch.empty((O, L), dtype=torch.float8_e4m3fn, device=dev)
    ws = torch.empty((1,), dtype=torch.float32, device=dev)
    block_o = min(block_o, triton.next_power_of_2(o_pad))
    nchunk = triton.cdiv(o_pad, block_o)
    grid = (triton.cdiv(l_out, block_l),)
    _gy_codes_kernel[grid](
        gy, hq, hs, gw, ws, amax, L, O, l_out, o_pad, L, gy.stride(0), hq.stride(0), 0,
        QMAX=QMAX, NCHUNK=nchunk, BLOCK_L=block_l, BLOCK_O=block_o, num_warps=warps,
    )  # fmt: skip
    return hq, hs, gw, ws


def production(gy: torch.Tensor, amax: torch.Tensor):
    """The two production kernels as the native lowering runs them, the max-abs given."""
    from hotcompile.lowering import hot

    hq, hs, _ = hot.quantize_gy(gy, 8, True, "fp8_e4m3", True, 16, False)
    gw, ws = hot.hla_codes(gy[None], 0, (), 8, "fp8_e4m3", None, amax)
    return hq, hs, gw, ws


def reference(gy: torch.Tensor):
    """The pure-PyTorch specification of both code sets (CPU check)."""
    from hotcompile.hadamard import block_hadamard
    from hotcompile.quant import quantize

    hq, hs = quantize(block_hadamard(gy.float(), 1, 16), 8, True, "fp8_e4m3", "maxabs")
    gw, ws = quantize(gy.float(), 8, False, "fp8_e4m3", "maxabs")
    return hq, hs, gw.t(), ws


def same(a, b) -> bool:
    """Codes (as bytes) and scales equal, over the rows both have."""
    for u, v in zip(a, b):
        u = u.view(torch.uint8) if u.dtype == torch.float8_e4m3fn else u
        v = v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v
        if u.shape != v.shape:
            n = min(u.shape[0], v.shape[0])
            u, v = u[:n], v[:n]
        if not torch.equal(u.reshape(v.shape), v):
            return False
    return True


def check_cpu() -> None:
    """Triton's interpreter against the reference, a shape with a ragged last tile."""
    torch.manual_seed(0)
    gy = (torch.randn(40, 96) * 3).to(torch.bfloat16)
    amax = gy.float().abs().amax().reshape(1).view(torch.int32)
    ref = reference(gy)
    ref = (ref[0].to(torch.float8_e4m3fn), ref[1], ref[2].to(torch.float8_e4m3fn), ref[3])
    for bl, bo in [(16, 32), (32, 128), (8, 256)]:
        got = gy_codes(gy, amax, bl, bo, 4)
        ok = same((got[0][:40, :96], got[1][:40], got[2], got[3]), ref)
        print(f"interpreter BLOCK_L {bl} BLOCK_O {bo}: {'bit-exact' if ok else 'DIFFERS'}")
        if not ok:
            raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check-only", action="store_true", help="CPU: interpreter check only")
    ap.add_argument("--out", default="", help="write the markdown table here (and .json)")
    a = ap.parse_args()
    if a.check_only or not torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("no GPU: run with TRITON_INTERPRET=1 --check-only")
        check_cpu()
        return
    from hotcompile.lowering import gate, hot

    T = gate._graph_us
    rows, lines = [], []
    for name, L, O in [("llama.gate/up", 8192, 8192), ("llama.down, q/k/v/o", 8192, 2048)]:
        g = torch.Generator(device="cuda").manual_seed(0)
        gy = torch.randn((L, O), device="cuda", generator=g).bfloat16()
        amax = hot.amax_bits(gy)
        prod = production(gy, amax)
        r = {"layer": name, "L": L, "O": O, "floor one pass (µs)": L * O * 4 / 3.0e12 * 1e6}
        r["production: HQ (+raw max-abs) then g_w codes"] = T(
            lambda gy=gy: (lambda q: hot.hla_codes(gy[None], 0, (), 8, "fp8_e4m3", None, q[2]))(
                hot.quantize_gy(gy, 8, True, "fp8_e4m3", True, 16, True)
            )
        )
        r["production, max-abs given (HQ, g_w codes)"] = T(lambda gy=gy, m=amax: production(gy, m))
        r["max-abs alone (eager ATen)"] = T(lambda gy=gy: hot.amax_bits(gy))
        sweep = {}
        for bl, bo, w in itertools.product((4, 8, 16, 32, 64), (128, 256, 512, 1024, 2048), (4, 8)):
            if bl * bo > 32768:
                continue
            try:
                got = gy_codes(gy, amax, bl, bo, w)
            except Exception as e:  # noqa: BLE001 - a tile Triton cannot build
                sweep[f"{bl}x{bo} w{w}"] = f"failed: {type(e).__name__}"
                continue
            if not same(got, prod):
                sweep[f"{bl}x{bo} w{w}"] = "DIFFERS"
                continue
            cfg = (amax, bl, bo, w)
            sweep[f"{bl}x{bo} w{w}"] = T(lambda gy=gy, cfg=cfg: gy_codes(gy, *cfg))
        r["one pass (BLOCK_L x BLOCK_O, warps)"] = sweep
        timed = {k: v for k, v in sweep.items() if isinstance(v, float)}
        best = min(timed, key=timed.get) if timed else None
        r["best"] = best
        rows.append(r)
        torch.cuda.empty_cache()
        lines.append(
            f"| {name} | {r['production: HQ (+raw max-abs) then g_w codes']:.1f} "
            f"| {r['production, max-abs given (HQ, g_w codes)']:.1f} "
            f"| {best} {timed.get(best, float('nan')):.1f} | {r['floor one pass (µs)']:.1f} "
            f"| {r['max-abs alone (eager ATen)']:.1f} |"
        )
        print(json.dumps(r), flush=True)
    meta = (
        f"Device: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton "
        f"{triton.__version__}; commit {os.environ.get('HOTCOMPILE_COMMIT', 'unknown')}; "
        f"{datetime.date.today()}. Generated by `experiments/one_pass_gy.py`; µs under CUDA "
        "graphs (median of 5 replays of 3 calls); every timed tile's codes are bit-equal to "
        "the production kernels'."
    )
    md = "\n".join([
        "# One pass over g_y for the text recipe's two code sets (prototype)", "", meta, "",
        "| g_y | production (HQ + raw max-abs, then g_w codes) | production, max-abs given "
        "| one pass: best tile, µs | floor (read 2 B + write 2 × 1 B) | max-abs alone (eager) |",
        "|---|---|---|---|---|---|", *lines, "",
        "Every tile of the sweep: the JSON.",
    ])  # fmt: skip
    print(md)
    if a.out:
        pathlib.Path(a.out).write_text(md + "\n")
        pathlib.Path(a.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

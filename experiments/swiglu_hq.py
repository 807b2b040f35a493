"""HQ's codes written by the kernel that produces g_y: the SwiGLU backward, a measured prototype.

On the Llama the g_y of gate and up comes out of one inductor kernel, the SwiGLU backward
(``g_gate = silu'(gate)·up·g_h``, ``g_up = silu(gate)·g_h``: 217 µs a block in run 24's
profile), and HQ then reads each g_y again for its per-token FP8 codes (78 µs each,
``experiments/results/layer_passes_s17_h100.md``). HQ's scale is per token, the max over one whole
transformed row, so a kernel that holds a row whole can write the codes where g_y is made:
one read of the SwiGLU's three inputs, g_gate and g_up written in bf16 (the g_w codes still
need them: their per-tensor scale waits for the whole g_y), plus both code sets, their scales
and g_y's raw max-abs. Floor: 3 reads + 2 writes of bf16 and 2 writes of 1 byte per element.

``hotcompile.kernels.swiglu_triton`` is that kernel for rows up to one walk wide (the Llama's
8192; ``HotConfig.swiglu_hq`` puts it in the step, off by default until run there). This
script checks it and times it against what the step runs today (inductor's compiled SwiGLU
backward, then ``hot.quantize_gy`` on each g_y), under CUDA graphs:

- its g_gate / g_up against inductor's (bf16 bits; the formula's fp32 order may differ by an
  ulp), and its codes, scales and raw max-abs bit for bit against ``hot.quantize_gy`` of its
  own g_gate / g_up;
- times: today's two steps, the prototype over a tile sweep, and the floor at 3.0 TB/s.

Usage (GPU): ``python3 experiments/swiglu_hq.py [--out FILE.md]``. On the CPU,
``TRITON_INTERPRET=1 python3 experiments/swiglu_hq.py --check-only`` checks the kernel through
Triton's interpreter against the reference (``quantize(block_hadamard(g))`` in e4m3).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib

import torch
import triton

from hotcompile.kernels import hq_triton, swiglu_triton


def swiglu_hq(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor, block_l: int, warps: int):
    """The kernel (``hotcompile.kernels.swiglu_triton``) with a forced tile: ``(g_gate, g_up,
    codes_gate, scales_gate, codes_up, scales_up, raw)``, codes ``[padded(L, 16), O]`` e4m3
    as ``hot.quantize_gy(.., pad_rows_to=16)`` gives them, ``raw`` two int32 words (each
    g_y's max-abs bits). O a power of two, one walk wide."""
    L, O = a.shape
    if not swiglu_triton.supported(a, "fp8_e4m3"):
        raise ValueError(f"the kernel takes power-of-two widths up to one walk, got {O}")
    l_out = -(-L // 16) * 16
    dev = a.device
    ga, gb = torch.empty_like(a), torch.empty_like(a)
    ca = torch.empty((l_out, O), dtype=torch.float8_e4m3fn, device=dev)
    cb = torch.empty_like(ca)
    sa = torch.empty((l_out,), dtype=torch.float32, device=dev)
    sb = torch.empty_like(sa)
    # a slot a program for each raw max-abs (since session 38), reduced here to one word each
    slots = hq_triton.raw_slots(l_out, block_l)
    ra, rb = (torch.empty((slots,), dtype=torch.int32, device=dev) for _ in range(2))
    swiglu_triton.launch_swiglu_hq(
        swiglu_triton._swiglu_hq_kernel, a, b, g, ga, gb, ca, sa, cb, sb, ra, rb, 8,
        "fp8_e4m3", block_l, warps,
    )  # fmt: skip
    return ga, gb, ca, sa, cb, sb, torch.stack([ra.max(), rb.max()])


def swiglu_backward(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor):
    """The SwiGLU backward as autograd writes it (what inductor compiles in the step)."""
    return torch.ops.aten.silu_backward(g * b, a), g * torch.nn.functional.silu(a)


def today(compiled, a, b, g):
    """What the step runs: inductor's SwiGLU backward, then HQ on each g_y (raw max-abs on)."""
    from hotcompile.lowering import hot

    ga, gb = compiled(a, b, g)
    qa = hot.quantize_gy(ga, 8, True, "fp8_e4m3", True, 16, True)
    qb = hot.quantize_gy(gb, 8, True, "fp8_e4m3", True, 16, True)
    return ga, gb, qa, qb


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def check_cpu() -> None:
    """Triton's interpreter against the reference at a small shape (a ragged last row tile)."""
    from hotcompile.hadamard import block_hadamard
    from hotcompile.quant import quantize

    torch.manual_seed(0)
    L, O = 40, 64
    a, b, g = ((torch.randn(L, O) * 2).to(torch.bfloat16) for _ in range(3))
    for bl in (1, 2, 8):
        ga, gb, ca, sa, cb, sb, raw = swiglu_hq(a, b, g, bl, 4)
        ea, eb = swiglu_backward(a.float(), b.float(), g.float())
        assert torch.allclose(ga.float(), ea, rtol=1e-2, atol=1e-2), "g_gate"
        assert torch.allclose(gb.float(), eb, rtol=1e-2, atol=1e-2), "g_up"
        for gy, c, s, r in ((ga, ca, sa, raw[0]), (gb, cb, sb, raw[1])):
            q, rs = quantize(block_hadamard(gy.float(), 1, 16), 8, True, "fp8_e4m3", "maxabs")
            ok = torch.equal(_bytes(c[:L]), _bytes(q.to(torch.float8_e4m3fn)))
            ok = ok and torch.equal(s[:L], rs) and bool((s[L:] == 0).all())
            ok = ok and r.item() == gy.float().abs().amax().view(torch.int32).item()
            if not ok:
                raise SystemExit(f"interpreter BLOCK_L {bl}: DIFFERS from the reference")
        print(f"interpreter BLOCK_L {bl}: g_gate/g_up close, codes bit-exact")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check-only", action="store_true", help="CPU: interpreter check only")
    ap.add_argument("--out", default="", help="write the markdown table here (and .json)")
    args = ap.parse_args()
    if args.check_only or not torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("no GPU: run with TRITON_INTERPRET=1 --check-only")
        check_cpu()
        return
    from hotcompile.lowering import gate

    T = gate._graph_us
    L, O = 8192, 8192  # the Llama's gate/up g_y: 4 × 2048 tokens, MLP 8192
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b, g = (torch.randn((L, O), device="cuda", generator=gen).bfloat16() for _ in range(3))
    compiled = torch.compile(swiglu_backward)
    ref = today(compiled, a, b, g)
    r: dict = {"L": L, "O": O}
    r["floor (µs)"] = L * O * (3 * 2 + 2 * 2 + 2) / 3.0e12 * 1e6
    r["inductor SwiGLU backward (µs)"] = T(lambda: compiled(a, b, g))
    r["today: SwiGLU backward + 2 HQ (µs)"] = T(lambda: today(compiled, a, b, g))
    from hotcompile.lowering import hot

    sweep: dict = {}
    gd = None  # the prototype's g_gate / g_up against inductor's
    for bl in (1, 2):
        for warps in (4, 8, 16):
            key = f"BLOCK_L {bl}, {warps} warps"
            try:
                out = swiglu_hq(a, b, g, bl, warps)
            except Exception as e:  # noqa: BLE001 - a tile Triton cannot build
                sweep[key] = f"failed: {type(e).__name__}: {str(e)[:120]}"
                continue
            ga, gb, ca, sa, cb, sb, raw = out
            # the codes against production HQ of the prototype's own g_y, bit for bit
            pa = hot.quantize_gy(ga, 8, True, "fp8_e4m3", True, 16, True)
            pb = hot.quantize_gy(gb, 8, True, "fp8_e4m3", True, 16, True)
            exact = all(
                torch.equal(_bytes(c), _bytes(p[0])) and torch.equal(s, p[1])
                and torch.equal(w.reshape(1), p[2].max().reshape(1))
                for c, s, w, p in ((ca, sa, raw[0], pa), (cb, sb, raw[1], pb))
            )  # fmt: skip
            if not exact:
                sweep[key] = "DIFFERS from hot.quantize_gy of its own g_y"
                continue
            sweep[key] = T(lambda bl=bl, warps=warps: swiglu_hq(a, b, g, bl, warps))
            if gd is None:  # share of bf16 values that differ, largest difference
                gd = [
                    ((x.view(torch.int16) != y.view(torch.int16)).float().mean().item(),
                     (x.float() - y.float()).abs().max().item())
                    for x, y in ((ga, ref[0]), (gb, ref[1]))
                ]  # fmt: skip
    r["g_gate, g_up vs inductor's (share of values differing, max abs diff)"] = gd
    r["prototype (µs)"] = sweep
    timed = {k: v for k, v in sweep.items() if isinstance(v, float)}
    best = min(timed, key=timed.get) if timed else None
    r["best"] = best
    print(json.dumps(r, indent=1), flush=True)
    meta = (
        f"Device: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton "
        f"{triton.__version__}; commit {os.environ.get('HOTCOMPILE_COMMIT', 'unknown')}; "
        f"{datetime.date.today()}. Generated by `experiments/swiglu_hq.py`; µs under CUDA "
        "graphs (median of 5 replays of 3 calls); every timed tile's codes, scales and raw "
        "max-abs are bit-equal to `hot.quantize_gy` of its own g_gate / g_up."
    )
    md = "\n".join([
        "# HQ's codes written by the SwiGLU backward (prototype, the Llama's gate/up g_y)", "",
        meta, "",
        "| 8192 × 8192 | µs |", "|---|---|",
        f"| inductor's SwiGLU backward alone | {r['inductor SwiGLU backward (µs)']:.1f} |",
        f"| today: that + HQ of g_gate + HQ of g_up | "
        f"{r['today: SwiGLU backward + 2 HQ (µs)']:.1f} |",
        f"| prototype, best tile ({best}) | {timed.get(best, float('nan')):.1f} |",
        f"| floor: 3 + 2 bf16 and 2 one-byte passes at 3.0 TB/s | {r['floor (µs)']:.1f} |",
        "", f"g_gate / g_up against inductor's: {gd}", "", "Every tile: the JSON.",
    ])  # fmt: skip
    print(md)
    if args.out:
        pathlib.Path(args.out).write_text(md + "\n")
        pathlib.Path(args.out).with_suffix(".json").write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()

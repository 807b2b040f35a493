"""The Triton kernels' quantize on the CPU through Triton's interpreter: bit-exact codes and
scales against the reference. Skipped where Triton is absent (the CPU torch wheel has none);
run it after any change to hotcompile/kernels/ on a machine with ``pip install triton``
(Triton 3.6's interpreter needs numpy < 2.4).

A subprocess, because ``TRITON_INTERPRET`` is read when Triton is first imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

CHECK = textwrap.dedent("""
    import torch
    from hotcompile.hadamard import block_hadamard
    from hotcompile.hla import hla_transform
    from hotcompile.kernels.hla_triton import hla_quantize
    from hotcompile.kernels.hq_triton import hq_quantize
    from hotcompile.quant import quantize

    torch.manual_seed(0)
    LP_L1 = (0, 2, 3, 8, 10, 11, 12, 14)
    n = bad = 0
    for L, O in [(37, 40), (20, 128)]:
        gy = torch.randn(L, O) * torch.logspace(-2, 1, L)[:, None]
        for rounding in ("nearest", "pseudo_stochastic"):
            for bits in (4, 8):
                for per_token in (True, False):
                    c, s = hq_quantize(gy, bits, per_token, rounding, out_dtype=torch.int8)
                    rc, rs = quantize(block_hadamard(gy, 1, 16), bits, per_token, rounding)
                    n += 1
                    bad += not (torch.equal(c[:L], rc)
                                and torch.equal(s[:L] if per_token else s, rs))
                if not per_token and bits == 4 and O == 128:
                    # SAWB's per-tensor statistics, one walk and chunked (4 x 32 columns):
                    # every chunk's Σx², Σ|x| count; float32 rounding of the sums, codes equal
                    rc, rs = quantize(block_hadamard(gy, 1, 16), 4, False, rounding, "sawb")
                    for bo in (None, 32):
                        c, s = hq_quantize(gy, 4, False, rounding, out_dtype=torch.int8,
                                           block_o=bo, sawb=True)
                        n += 1
                        bad += not (torch.equal(c[:L], rc)
                                    and torch.allclose(s, rs, rtol=1e-6, atol=0))
                x = torch.randn(2, 35, 24)
                for grid_w in (0, 5):
                    c, s = hla_quantize(x, grid_w, LP_L1, bits, rounding, transposed=False)
                    rc, rs = quantize(hla_transform(x, grid_w, LP_L1), bits, False, rounding)
                    n += 1
                    bad += not (torch.equal(c, rc) and torch.equal(s, rs))
                    # hla_signs: read as x · signs (±1 per token), no signed copy
                    sg = 1 - 2 * torch.randint(0, 2, (2, 35, 1)).float()
                    c, s = hla_quantize(x, grid_w, LP_L1, bits, rounding, transposed=True,
                                        signs=sg)
                    rc, rs = quantize(hla_transform(x * sg, grid_w, LP_L1), bits, False, rounding)
                    n += 1
                    bad += not (torch.equal(c.t(), rc) and torch.equal(s, rs))
    # the g_w path's FP8 format: e4m3 codes (max-abs/448, round-to-nearest-even), both layouts
    from hotcompile.quant import FP8_E4M3
    for grid_w in (0, 5):
        x = torch.randn(2, 35, 24) * torch.logspace(-4, 2, 24)  # e4m3's subnormals and top
        rc, rs = quantize(hla_transform(x, grid_w, LP_L1), 8, False, FP8_E4M3)
        for transposed in (False, True):
            c, s = hla_quantize(x, grid_w, LP_L1, 8, FP8_E4M3, transposed=transposed)
            c = c.t() if transposed else c
            n += 1
            bad += not (c.dtype == rc.dtype and torch.equal(c.float(), rc.float())
                        and torch.equal(s, rs))
    # no HLA (rows=()): the plain rows of x in block order, zero rows padding S to 16s;
    # codes and scale equal the reference's quantize of hla_operand(x, grid_w, ()) (the rows
    # of x), and both g_w operands take the same row order, so their GEMM is g_yᵀx
    from hotcompile.hla import hla_operand, to_blocks
    for grid_w in (0, 5):
        x = torch.randn(2, 35, 24) * torch.logspace(-2, 1, 24)
        for rounding, bits in (("pseudo_stochastic", 8), ("nearest", 4), (FP8_E4M3, 8)):
            c, s = hla_quantize(x, grid_w, (), bits, rounding, transposed=True)
            rc, rs = quantize(hla_operand(x, grid_w, ()), bits, False, rounding)
            blocks = to_blocks(torch.ones(2, 35, 1), grid_w).reshape(-1) > 0  # real rows
            n += 1
            bad += not (c.shape[1] == blocks.numel() and torch.equal(s, rs)
                        and torch.equal(c.t()[~blocks].float(), torch.zeros(1).expand(
                            int((~blocks).sum()), 24))
                        and torch.equal(c.t()[blocks].float().sort(0).values,
                                        rc.float().sort(0).values))
            g = torch.randn(2, 35, 16)
            gc, gs = hla_quantize(g, grid_w, (), bits, rounding, transposed=True)
            rg, rgs = quantize(hla_operand(g, grid_w, ()), bits, False, rounding)
            n += 1
            got = (gc.float() @ c.t().float()) * gs * s
            want = (rg.float().t() @ rc.float()) * rgs * rs
            bad += not torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    # HQ's weight quantizer (the HLA kernel with all 16 rows, stored K-major): max-abs codes
    # and scales bit-exact; SAWB's scale from atomic sums to float32 rounding, codes equal
    from hotcompile.kernels.hq_triton import quantize_weight
    for O, I in [(40, 24), (64, 48)]:
        w = torch.randn(O, I) * 0.05
        for mode in ("maxabs", "sawb"):
            for fp8 in (False, True):
                c, s = quantize_weight(w, 4, mode, fp8)
                rc, rs = quantize(block_hadamard(w, 0, 16), 4, False, "nearest", mode)
                ok_s = torch.equal(s, rs) if mode == "maxabs" else torch.allclose(s, rs, 1e-6, 0)
                n += 1
                bad += not (torch.equal(c.t().to(torch.int8), rc) and ok_s)
    # a tensor so small its max-abs/qmax is a subnormal float: the scale is raised to the
    # smallest normal float (a finite reciprocal), in the kernels as in the reference
    from hotcompile.kernels.hq_triton import _hq_quant_kernel, launch_hq_quantize
    tiny = torch.randn(20, 64) * 1e-37
    for rounding, bits in (("nearest", 4), (FP8_E4M3, 8)):
        rc, rs = quantize(block_hadamard(tiny, 1, 16), bits, True, rounding)
        c = torch.empty((20, 64), dtype=torch.float8_e4m3fn)
        s = torch.empty((20,))
        launch_hq_quantize(_hq_quant_kernel, tiny, c, s, None, bits, rounding, 0)
        n += 1
        bad += not (torch.equal(c.float(), rc.float()) and torch.equal(s, rs)
                    and bool((s > 0).all()))
        c, s = hla_quantize(tiny[None], 0, LP_L1, 8, rounding if bits == 8 else "nearest",
                            transposed=False)
        rc, rs = quantize(hla_transform(tiny[None], 0, LP_L1), 8, False,
                          rounding if bits == 8 else "nearest")
        n += 1
        bad += not (torch.equal(c.float(), rc.float()) and torch.equal(s, rs))
    # FP8 values on a width that is not a power of two, as hq_triton.fp8_block_o tiles it
    # at scale: one masked walk over the next power of two, or chunks whose last is masked
    gy = torch.randn(37, 40) * torch.logspace(-3, 2, 37)[:, None]
    rc, rs = quantize(block_hadamard(gy, 1, 16), 8, True, FP8_E4M3)
    for bo in (None, 64, 32):
        c = torch.empty((48, 48), dtype=torch.float8_e4m3fn)
        s = torch.empty((48,))
        launch_hq_quantize(_hq_quant_kernel, gy, c, s, None, 8, FP8_E4M3, 0, block_o=bo)
        n += 1
        # (the last 16-block of each row is zero-padded, so its transform fills all 48 columns)
        bad += not (torch.equal(c[:37].float(), rc.float()) and torch.equal(s[:37], rs)
                    and not c[37:].float().any())
    c, s = hq_quantize(tiny, 4, False, "nearest", out_dtype=torch.int8)
    rc, rs = quantize(block_hadamard(tiny, 1, 16), 4, False, "nearest")
    n += 1
    bad += not (torch.equal(c, rc) and torch.equal(s, rs))
    # the scaled GEMM (int8, exact int32 accumulation; dequantization in the epilogue)
    from hotcompile.kernels.gemm_triton import TILES, scaled_gemm
    for M, N, K in [(37, 24, 200), (20, 40, 64)]:
        a = torch.randint(-127, 128, (M, K), dtype=torch.int8)
        b = torch.randint(-127, 128, (N, K), dtype=torch.int8)
        exact = (a.long() @ b.long().t()).float()
        sa, sb = torch.rand(M) + 0.5, torch.rand(N) + 0.5
        n += 2
        bad += not torch.equal(scaled_gemm(a, b, sa, sb, config=3), exact * sa[:, None] * sb)
        acc = torch.randn(M, N)
        got = acc.clone()
        scaled_gemm(a, b, sa[:1], None, out=got, config=4)
        bad += not torch.equal(got, acc + exact * sa[:1])
        # e4m3 INT4-grid codes, with and without promoting partial sums (every tile's BLOCK_K)
        a8 = a.clamp(-7, 7).float().to(torch.float8_e4m3fn)
        b8 = b.clamp(-7, 7).float().to(torch.float8_e4m3fn)
        ex8 = a8.float() @ b8.float().t()
        for config in range(len(TILES)):
            for precise in (True, False):
                n += 1
                out = scaled_gemm(a8, b8, sa, None, config=config, precise=precise)
                bad += not torch.equal(out, ex8 * sa[:, None])
    # the SwiGLU backward with HQ's codes of both gradients (FP8 values and the INT4 grid)
    from hotcompile.kernels.swiglu_triton import _swiglu_hq_kernel, launch_swiglu_hq
    for L, O in [(37, 64), (16, 256), (21, 48)]:  # 48: a masked 64-wide tile (abc_swiglu)
        a, b, g = ((torch.randn(L, O) * 2).to(torch.bfloat16) for _ in range(3))
        for bits, rounding, dt in [(8, "fp8_e4m3", torch.float8_e4m3fn),
                                   (4, "pseudo_stochastic", torch.int8)]:
            l_out = -(-L // 16) * 16
            ga, gb = torch.empty_like(a), torch.empty_like(a)
            ca, cb = (torch.empty((l_out, O), dtype=dt) for _ in range(2))
            sa, sb = (torch.empty(l_out) for _ in range(2))
            ra, rb = (torch.zeros(1, dtype=torch.int32) for _ in range(2))
            launch_swiglu_hq(_swiglu_hq_kernel, a, b, g, ga, gb, ca, sa, cb, sb, ra, rb, bits,
                             rounding, warps=4)
            ea = torch.ops.aten.silu_backward(g.float() * b.float(), a.float())
            eb = g.float() * torch.nn.functional.silu(a.float())
            n += 2
            bad += not torch.allclose(ga.float(), ea, rtol=1e-2, atol=1e-2)
            bad += not torch.allclose(gb.float(), eb, rtol=1e-2, atol=1e-2)
            for gy, c, sc, r in ((ga, ca, sa, ra), (gb, cb, sb, rb)):
                q, rs = quantize(block_hadamard(gy.float(), 1, 16), bits, True, rounding,
                                 "maxabs")
                n += 1
                bad += not (torch.equal(c[:L].float(), q.to(dt).float())
                            and torch.equal(sc[:L], rs) and bool((sc[L:] == 0).all())
                            and r.item() == gy.float().abs().amax().view(torch.int32).item())
        # abc_swiglu: a and b as the forward's FP8 codes with a scale per row; the kernel's
        # gradients are the CPU path's (dequantized float32, autograd's formulas) to rounding
        from hotcompile.lowering.hot import swiglu_backward, swiglu_codes
        (qa, xa), (qb, xb) = swiglu_codes(a), swiglu_codes(b)
        ga, gb = torch.empty_like(g), torch.empty_like(g)
        ca, cb = (torch.empty((l_out, O), dtype=torch.float8_e4m3fn) for _ in range(2))
        sa, sb = (torch.empty(l_out) for _ in range(2))
        ra, rb = (torch.zeros(1, dtype=torch.int32) for _ in range(2))
        launch_swiglu_hq(_swiglu_hq_kernel, qa, qb, g, ga, gb, ca, sa, cb, sb, ra, rb, 8,
                         "fp8_e4m3", warps=4, a_scale=xa, b_scale=xb)
        ea, eb, _, _, _ = swiglu_backward(qa, qb, g, 8, "fp8_e4m3", True, 16, xa, xb)
        n += 3
        bad += not (ea.dtype == ga.dtype == torch.bfloat16)
        bad += not torch.allclose(ga.float(), ea.float(), rtol=1e-2, atol=1e-2)
        bad += not torch.allclose(gb.float(), eb.float(), rtol=1e-2, atol=1e-2)
    # the g_w operands of g_a and g_b made from a, b and g (swiglu_gw) with the max-abs words
    # of the kernel above, which then stores neither gradient (values=False): what
    # hla_quantize writes of the stored gradients (plain rows, samples padded to 16 rows)
    from hotcompile.kernels.hla_triton import hla_quantize
    from hotcompile.kernels.swiglu_triton import swiglu_gw
    for N, S, O, bits, rounding, scaled in [(2, 21, 48, 8, "fp8_e4m3", True),
                                            (3, 16, 64, 4, "pseudo_stochastic", False),
                                            (1, 37, 40, 8, "nearest", True)]:
        a, b, g = ((torch.randn(N * S, O) * 2).to(torch.bfloat16) for _ in range(3))
        g[4, 5] = 60.0  # one large gradient sets both scales
        xa = xb = None
        if scaled:
            (a, xa), (b, xb) = swiglu_codes(a), swiglu_codes(b)
        l_out = -(-N * S // 16) * 16
        out = {}
        for values in (True, False):
            ga, gb = (torch.empty_like(g) if values else g.new_empty((0, O)) for _ in range(2))
            ca, cb = (torch.empty((l_out, O), dtype=torch.float8_e4m3fn) for _ in range(2))
            sa, sb = (torch.empty(l_out) for _ in range(2))
            ra, rb = (torch.zeros(1, dtype=torch.int32) for _ in range(2))
            launch_swiglu_hq(_swiglu_hq_kernel, a, b, g, ga, gb, ca, sa, cb, sb, ra, rb, 8,
                             "fp8_e4m3", warps=4, a_scale=xa, b_scale=xb, values=values)
            out[values] = (ga, gb, ca, sa, ra, cb, sb, rb)
        n += 1
        bad += not all(torch.equal(u.float(), v.float())
                       for u, v in zip(out[True][2:], out[False][2:]))
        ga, gb, _, _, ra, _, _, rb = out[True]
        qa, sqa, qb, sqb = swiglu_gw(a, b, g, xa, xb, ra, rb, N, bits, rounding,
                                     block_t=16, block_d=32, loop=2)
        for gy, q, sq, r in ((ga, qa, sqa, ra), (gb, qb, sqb, rb)):
            rq, rs = hla_quantize(gy.view(N, S, O), 0, (), bits, rounding, out_dtype=q.dtype)
            n += 1
            bad += not (q.shape == rq.shape and torch.equal(q.float(), rq.float())
                        and torch.equal(sq, rs)
                        and r.item() == gy.float().abs().amax().view(torch.int32).item())
    # the lean plan's forward: rowwise FP8 codes of a and b (the quantizer's bits), and the
    # product's, rounded to a's dtype first, for the down projection's FP8 forward
    from hotcompile.kernels.swiglu_triton import swiglu_codes as kernel_codes
    from hotcompile.lowering.hot import swiglu_codes
    e4m3 = "fp8_e4m3"
    for L, O, dt in [(5, 40, torch.bfloat16), (3, 256, torch.float16), (4, 100, torch.bfloat16)]:
        a = (torch.randn(L, O) * torch.logspace(-2, 1, L)[:, None] * 3).to(dt)
        b = (torch.randn(L, O) * 2).to(dt)
        a[1] = 0.0  # a zero row: zero scale and codes
        b[2, 3] = float("nan")  # reaches its row's scale, as in the reference
        same = lambda u, v: torch.equal(u.float().nan_to_num(7.0), v.float().nan_to_num(7.0))
        prod = (torch.nn.functional.silu(a.float()) * b.float()).to(dt)
        for product in (None, "fp8", "values"):
            ca, sa, cb, sb, y, sy = kernel_codes(a, b, product, warps=4)
            (ra, rsa), (rb, rsb) = swiglu_codes(a), swiglu_codes(b)
            n += 1
            bad += not (same(ca, ra) and same(sa, rsa) and same(cb, rb) and same(sb, rsb))
            if product == "fp8":
                ry, rsy = quantize(prod.float(), 8, True, e4m3)
                n += 1
                bad += not (same(y, ry) and same(sy, rsy))
            elif product == "values":
                n += 1
                bad += not (y.dtype == dt and same(y, prod))
    # the lean plan's backward: down's ABC codes of the product made from those codes
    # (one kernel, the product never written) as the ATen path makes them
    # (plain token rows, the text recipe's g_w path; each sample padded to 16 rows)
    from hotcompile.kernels.hla_triton import hla_quantize
    from hotcompile.kernels.swiglu_triton import swiglu_abc
    from hotcompile.quant import dequantize
    for N, S, D, dt, bits, rounding in [
        (2, 32, 48, torch.bfloat16, 8, e4m3),  # the Llama's text recipe
        (3, 37, 100, torch.float16, 8, "nearest"),  # padded samples, a masked channel tile
        (2, 16, 40, torch.bfloat16, 4, "pseudo_stochastic"),
        (1, 20, 32, torch.float32, 8, "nearest"),
    ]:
        a = torch.randn(N * S, D) * torch.logspace(-1, 1, N * S)[:, None] * 2
        b = torch.randn(N * S, D)
        b[3, 5] = float("nan") if dt == torch.float16 else b[3, 5]  # reaches the scale
        (ca, sa), (cb, sb) = swiglu_codes(a.to(dt)), swiglu_codes(b.to(dt))
        c, sc = swiglu_abc(ca, sa, cb, sb, N, bits, rounding, dt, block_t=16, block_d=32,
                           loop=2)  # (several tiles a program, the last ones past the rows)
        prod = (torch.nn.functional.silu(dequantize(ca, sa)) * dequantize(cb, sb)).to(dt)
        rc, rsc = hla_quantize(prod.view(N, S, D), 0, (), bits, rounding, out_dtype=c.dtype)
        n += 1
        bad += not (c.shape == rc.shape and same(c, rc) and same(sc, rsc))
    print(f"{n - bad}/{n}")
""")


def test_interpreted_kernels_match_reference_bit_exactly():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    done, total = out.stdout.split()[-1].split("/")
    assert done == total, out.stdout


def _run_script(path, source: str, interpret: bool) -> str:
    """Run ``source`` as the file ``path`` in a fresh Python (a file, not ``-c``:
    ``triton.jit`` reads a kernel's source), under Triton's interpreter or not; its stdout."""
    path.write_text(source)
    env = {**os.environ, "TRITON_INTERPRET": "1" if interpret else "0"}
    out = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _all_of_them(stdout: str) -> None:
    """The script's last word is ``passed/total``: every case passed."""
    done, total = stdout.split()[-1].split("/")
    assert done == total, stdout


E4M3 = textwrap.dedent("""
    import torch
    import triton
    import triton.language as tl
    from hotcompile.kernels.rounding import codes

    @triton.jit
    def fp8_codes(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + o, mask=o < n)
        one = tl.full([BLOCK], 1.0, tl.float32)  # the scale
        tl.store(y_ptr + o, codes(x, one, o, 0, 3, 448, 8), mask=o < n)

    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].unique()  # every finite e4m3 value, sorted
    mid = (grid[1:] + grid[:-1]) / 2  # the ties: round-half-even decides each of them
    nudge = torch.cat([mid * (1 + 2**-20), mid * (1 - 2**-20)])
    x = torch.cat([grid, mid, nudge, torch.randn(4096) * 30, torch.tensor([500.0, -1e6, 1e-12])])
    y = torch.empty_like(x)
    fp8_codes[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    want = x.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    bad = (y != want).sum().item()
    print(f"{x.numel() - bad}/{x.numel()}")
""")


def test_interpreted_fp8_codes_round_like_torchs_e4m3_cast(tmp_path):
    """The FP8 rounding of ``rounding.codes`` on every e4m3 value, every midpoint between two
    (ties to even) and values just off them: equal to torch's cast (a file, not ``-c``:
    ``triton.jit`` reads the kernel's source)."""
    _all_of_them(_run_script(tmp_path / "e4m3_check.py", E4M3, interpret=True))


WEIGHT_OPERANDS = textwrap.dedent("""
    import torch
    from hotcompile.kernels.hla_triton import hla_quantize
    from hotcompile.kernels.weight_triton import weight_operands
    from hotcompile.quant import FP8_E4M3, quantize

    torch.manual_seed(0)
    n = bad = 0
    for O, I in [(40, 24), (128, 64), (16, 130)]:
        w = torch.randn(O, I) * torch.logspace(-2, 1, O)[:, None]
        w[3] = 0.0  # a zero row: its scale and codes
        w[5, 7] = float("nan")  # reaches the row's and HQ's scales as in the reference
        w[9, :4] = 1 + 2.0**-8  # exactly between two bfloat16 values: ties to even
        w[9, 4:8] = 1 + 3 * 2.0**-8
        w[11, 0] = 3.4e38  # rounds to bfloat16's infinity, as torch's cast
        for bits, rounding, sawb, dtype in [(4, "nearest", True, torch.float8_e4m3fn),
                                            (8, "nearest", False, torch.int8),
                                            (8, FP8_E4M3, False, torch.float8_e4m3fn)]:
            for round_bf16 in (True, False):
                hq, hs, w8, ws = weight_operands(w, bits, rounding, sawb, dtype, round_bf16)
                wr = w.to(torch.bfloat16).float() if round_bf16 else w
                rc, rs = hla_quantize(wr[None], 0, list(range(16)), bits, rounding,
                                      sawb=sawb, out_dtype=dtype)
                fc, fs = quantize(wr, 8, True, FP8_E4M3)
                same = lambda a, b: torch.equal(a.float().nan_to_num(7.0),
                                                b.float().nan_to_num(7.0))
                n += 1
                bad += not (same(hq, rc) and same(hs, rs) and same(w8, fc) and same(ws, fs))
                if round_bf16:  # HQ's codes alone from the fp32 weight (the late codes)
                    dc, ds = hla_quantize(w[None], 0, list(range(16)), bits, rounding,
                                          sawb=sawb, out_dtype=dtype, round_bf16=True)
                    n += 1
                    bad += not (same(dc, rc) and same(ds, rs))
                # scale_row: each kernel's scale as the g_x GEMM's rowwise scale_b, s/16 over
                # [1, I], written by its codes pass, the codes unchanged; of a weight whose
                # scale is finite (w's NaN and bf16 infinity make every value NaN or inf)
                wf = w.clone()
                wf[5, 7] = wf[11, 0] = 0.0
                args = (bits, rounding, sawb, dtype, round_bf16)
                fc_, fs_, _, _ = weight_operands(wf, *args)
                hq2, hr, _, _ = weight_operands(wf, *args, scale_row=True)
                n += 1
                bad += not (same(hq2, fc_) and hr.shape == (1, I) and torch.isfinite(fs_)
                            and torch.equal(hr, (fs_ / 16).expand(1, I)))
                kw = dict(sawb=sawb, out_dtype=dtype, round_bf16=round_bf16)
                fc_, fs_ = hla_quantize(wf[None], 0, list(range(16)), bits, rounding, **kw)
                dc, dr = hla_quantize(wf[None], 0, list(range(16)), bits, rounding, **kw,
                                      scale_row=True)
                n += 1
                bad += not (same(dc, fc_) and dr.shape == (1, I)
                            and torch.equal(dr, (fs_ / 16).expand(1, I)))
    print(f"{n - bad}/{n}")
""")


def test_interpreted_weight_operands_are_hq_and_the_fp8_copy_bit_exactly(tmp_path):
    """``weight_operands`` (both of a weight's per-step operands under ``forward="fp8"`` from
    one pair of passes) writes HQ's codes and scale as ``hla_quantize`` with every row kept
    (HQ's weight quantizer) and the rowwise e4m3 copy and row scales as ``quantize``, from
    the fp32 weight or its bf16 rounding (ties to even, infinity and NaN as torch's cast),
    for INT4 SAWB, INT8 and FP8 HQ codes; and ``hla_quantize(..., round_bf16=True)`` (HQ's
    codes alone, made in the backward from the fp32 parameter) as of the bf16 copy. With
    ``scale_row`` both write HQ's scale/16 over ``[1, I]`` (the g_x GEMM's rowwise
    ``scale_b``) in place of the scale, for a width the last tile masks (130) too."""
    _all_of_them(_run_script(tmp_path / "weight_operands_check.py", WEIGHT_OPERANDS, True))


def test_fp8_hq_tiles_follow_the_measured_rule():
    """FP8-values HQ (the text recipe) changes its tiles only where the H100 measured a
    gain (experiments/results/hq_wide_rows_h100.md): one masked 4096-wide walk for 2304 / 3072,
    16384-wide chunks for the Llama head's 32000; GPT-2's head, the power-of-two widths and
    the unmeasured ones keep _config's rule."""
    from hotcompile.kernels.hq_triton import fp8_block_o

    assert fp8_block_o(2304) == fp8_block_o(3072) == 4096
    assert fp8_block_o(32000) == 16384
    for o_pad in (768, 2048, 4096, 8192, 5120, 11008, 14336, 50272):
        assert fp8_block_o(o_pad) is None, o_pad


AOT_HOPPER = textwrap.dedent("""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from hotcompile.kernels.weight_triton import BLOCK_B, BLOCK_D, _weight_operands_kernel

    sig = {"w_ptr": "*fp32", "hq_ptr": "*fp8e4nv", "hq_scale_ptr": "*fp32", "amax_ptr": "*i32",
           "stats_ptr": "*fp32", "rmax_ptr": "*i32", "fp8_ptr": "*fp8e4nv", "rscale_ptr": "*fp32",
           "row_ptr": "*fp32", "G": "i32", "O": "i32", "I": "i32", "R": "i32", "seed": "i32",
           "numel": "fp32"}
    n = 0
    for mode in (1, 2):
        for sawb, rounding, qmax, pm in ((False, 3, 448, 8), (True, 0, 7, 10)):
            const = dict(MODE=mode, SAWB=sawb, ROUND_BF16=True, ROUNDING=rounding, QMAX=qmax,
                         PM=pm, BLOCK_B=BLOCK_B, BLOCK_D=BLOCK_D, SCALE_ROW=True)
            src = ASTSource(fn=_weight_operands_kernel, constexprs=const,
                            signature={**sig, **{k: "constexpr" for k in const}})
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": 4})
            n += bool(kernel.asm["cubin"])
    # the lean plan's SwiGLU forward, each product, at the 8B MLP's width (16384-wide tile)
    from hotcompile.kernels.swiglu_triton import _swiglu_codes_kernel, codes_warps
    sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "ca_ptr": "*fp8e4nv", "cb_ptr": "*fp8e4nv",
           "sa_ptr": "*fp32", "sb_ptr": "*fp32", "y_ptr": "*fp8e4nv", "sy_ptr": "*fp32",
           "L": "i32", "O": "i32", "stride_a": "i32", "stride_b": "i32"}
    for product, y_type in ((0, "*fp8e4nv"), (1, "*fp8e4nv"), (2, "*bf16")):
        const = dict(PRODUCT=product, ROUND_BF16=True, BLOCK_L=1, BLOCK_O=16384)
        src = ASTSource(fn=_swiglu_codes_kernel, constexprs=const,
                        signature={**sig, "y_ptr": y_type, **{k: "constexpr" for k in const}})
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": codes_warps(14336)})
        n += bool(kernel.asm["cubin"])
    # the lean plan's backward: down's ABC codes from the SwiGLU's codes, both passes
    from hotcompile.kernels.rounding import code_constexprs
    from hotcompile.kernels.swiglu_triton import (
        ABC_BLOCK_D, ABC_BLOCK_T, ABC_LOOP, ABC_WARPS, PRODUCT_ROUND, _swiglu_abc_kernel,
    )
    sig = {"ca_ptr": "*fp8e4nv", "cb_ptr": "*fp8e4nv", "sa_ptr": "*fp32", "sb_ptr": "*fp32",
           "codes_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "amax_ptr": "*i32", "T_PAD": "i32",
           "S": "i32", "S_PAD": "i32", "D": "i32", "R": "i32", "numel": "fp32"}
    for mode in (1, 2):
        const = dict(MODE=mode, PRODUCT_ROUND=PRODUCT_ROUND[torch.bfloat16],
                     **code_constexprs(8, "fp8_e4m3"), BLOCK_T=ABC_BLOCK_T, BLOCK_D=ABC_BLOCK_D,
                     LOOP=ABC_LOOP)
        src = ASTSource(fn=_swiglu_abc_kernel, constexprs=const,
                        signature={**sig, **{k: "constexpr" for k in const}})
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": ABC_WARPS})
        n += bool(kernel.asm["cubin"])
    # HLA's kernel, both passes: HQ's weight codes from the fp32 parameter (the late codes,
    # ROUND_BF16), and the vision recipe's g_w operand (HLA rows of 4x4 patches, signs, INT4
    # SAWB statistics in slots)
    from hotcompile.kernels.hla_triton import _hla_quant_kernel, quantizer_constexprs
    sig = {"x_ptr": "*fp32", "codes_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "amax_ptr": "*i32",
           "stats_ptr": "*fp32", "sign_ptr": "*fp32", "row_ptr": "*fp32", "G": "i32", "D": "i32",
           "R": "i32", "nb": "i32", "S": "i32", "H": "i32", "W": "i32", "NBW": "i32",
           "stride_n": "i64", "stride_s": "i32", "seed": "i32", "numel": "fp32",
           "NPB": "i32", "npart": "i32"}
    late = dict(PATCH=False, SIGNS=False, ROWS=sum(k << (5 * k) for k in range(16)), NR=16,
                RP=16, ROUND_BF16=True, SCALE_ROW=True, RED=1024,
                **quantizer_constexprs(8, "fp8_e4m3", False, 8, 64, 4))
    vision = dict(PATCH=True, SIGNS=True, ROWS=sum(k << (5 * k) for k in range(8)), NR=8, RP=8,
                  ROUND_BF16=False, SCALE_ROW=False, RED=512,
                  **quantizer_constexprs(4, "nearest", True, 8, 64, 4))
    for types, case in (({}, late), ({"x_ptr": "*bf16", "codes_ptr": "*i8"}, vision)):
        for mode in (1, 2):
            const = dict(MODE=mode, TRANS=True, TRANSFORM=True, **case)
            warps = const.pop("num_warps")
            src = ASTSource(fn=_hla_quant_kernel, constexprs=const,
                            signature={**sig, **types, **{k: "constexpr" for k in const}})
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": warps})
            n += bool(kernel.asm["cubin"])
    # HQ's per-token codes of a bf16 g_y with its raw max-abs in a slot per looping program
    from hotcompile.kernels.hq_triton import _config, _hq_quant_kernel
    block_l, bo, nchunk, warps = _config(4096, None, True)
    const = dict(MODE=0, **code_constexprs(8, "fp8_e4m3"), NCHUNK=nchunk, BLOCK_L=block_l,
                 BLOCK_O=bo, SAWB=False, RAW=True)
    sig = {"gy_ptr": "*bf16", "codes_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "amax_ptr": "*fp32",
           "stats_ptr": "*fp32", "raw_ptr": "*i32", "L": "i32", "O": "i32", "L_OUT": "i32",
           "O_PAD": "i32", "stride_g": "i32", "stride_c": "i32", "seed": "i32", "numel": "fp32",
           "NRB": "i32"}
    src = ASTSource(fn=_hq_quant_kernel, constexprs=const,
                    signature={**sig, **{k: "constexpr" for k in const}})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    n += bool(kernel.asm["cubin"])
    print(f"{n}/14")
""")


def test_weight_operands_kernel_compiles_for_hopper(tmp_path):
    """The kernels written without a GPU compile to sm_90 machine code (Triton's front end,
    then ptxas): the weight operands' in both launches, max-abs-FP8 and SAWB-INT4, and the
    SwiGLU forward's codes for each product, the lean backward's kernel of down's ABC
    codes from a SwiGLU's codes, both passes, HQ's weight codes read from the fp32
    parameter (``_hla_quant_kernel`` with ROUND_BF16), both passes, the vision recipe's HLA
    g_w operand (patches, signs, SAWB statistics in slots), both passes, and HQ's per-token
    kernel with g_y's raw max-abs in slots: the interpreter does not check what only a GPU
    compile does (globals read as constexpr, types, a branch never taken)."""
    import pathlib
    import shutil

    import triton

    bundled = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not bundled.exists() and shutil.which("ptxas") is None:
        pytest.skip("no ptxas here (Triton's wheel bundles one)")
    out = _run_script(tmp_path / "aot_check.py", AOT_HOPPER, interpret=False)
    assert out.split()[-1] == "14/14", out


PARTIALS = textwrap.dedent("""
    import torch
    from hotcompile.hla import hla_transform
    from hotcompile.kernels import hla_triton as H
    from hotcompile.quant import quantize

    # the statistics pass writes a slot per program and the codes pass reduces the slots:
    # with 3 programs looping over 7 row blocks and a reduction 2 slots at a time, codes and
    # scale are those of one program per tile and one chunk (and the reference's)
    n = bad = 0
    torch.manual_seed(0)
    LP = (0, 1, 2, 3, 4, 5, 6, 7)
    for sawb in (False, True):
        for D in (64, 200):
            x = torch.randn(3, 40, D) * torch.logspace(-2, 1, D)
            x[1, 7, 3] = 25.0  # the max-abs in the second sample, far from program 0
            kw = dict(block_b=2, block_d=64)
            bits, rows = (4, LP) if sawb else (8, LP)
            one = H.launch_hla_quantize(H._hla_quant_kernel, x, 0, rows, bits, "nearest", True,
                                        sawb, torch.int8, None, None, 0, **kw)
            loop = H.launch_hla_quantize(H._hla_quant_kernel, x, 0, rows, bits, "nearest",
                                         True, sawb, torch.int8, None, None, 0, **kw,
                                         max_partials=3, reduce_block=2)
            rc, rs = quantize(hla_transform(x, 0, rows), bits, False, "nearest",
                              "sawb" if sawb else "maxabs")
            n += 1
            same_scale = (torch.equal(one[1], loop[1]) if not sawb
                          else torch.allclose(one[1], loop[1], rtol=1e-6, atol=0))
            ok_ref = (torch.equal(loop[1], rs) if not sawb
                      else torch.allclose(loop[1], rs, rtol=1e-6, atol=0))
            codes_ok = torch.equal(one[0], loop[0]) or sawb
            bad += not (same_scale and ok_ref and codes_ok
                        and (sawb or torch.equal(loop[0].t(), rc)))
            # a NaN anywhere reaches the scale through the slots
            xn = x.clone()
            xn[2, 39, D - 1] = float("nan")
            _, sn = H.launch_hla_quantize(H._hla_quant_kernel, xn, 0, rows, bits, "nearest",
                                          True, sawb, torch.int8, None, None, 0, **kw,
                                          max_partials=3, reduce_block=2)
            n += 1
            bad += not bool(torch.isnan(sn).all())
    # g_y's raw max-abs from HQ's per-token kernel as slots (3 programs looping over 19 row
    # blocks of 2 rows at this width)
    # or as the per-tensor word: the bits of g_y.abs().max(), and the plain g_w codes made
    # with them are those the HLA kernel makes with its own statistics
    from hotcompile.kernels.hq_triton import _hq_quant_kernel, launch_hq_quantize
    for nan in (False, True):
        gy = torch.randn(37, 2048) * torch.logspace(-2, 1, 37)[:, None]
        if nan:
            gy[30, 5] = float("nan")
        want = gy.abs().max().reshape(1)
        for per_token in (True, False):
            c = torch.empty((37, 2048), dtype=torch.float8_e4m3fn)
            s = torch.empty((37 if per_token else 1,))
            words = None if per_token else torch.zeros(1, dtype=torch.int32)
            raw = launch_hq_quantize(_hq_quant_kernel, gy, c, s, words, 8, "fp8_e4m3", 0,
                                     raw=True, max_raw_slots=3)
            n += 1
            top = raw.max().reshape(1).view(torch.float32)
            same = torch.isnan(top).all() if nan else torch.equal(top, want)
            bad += not (bool(same) and raw.numel() == (3 if per_token else 1))
        g3 = gy[None]
        own = H.launch_hla_quantize(H._hla_quant_kernel, g3, 0, (), 8, "fp8_e4m3", True,
                                    False, torch.float8_e4m3fn, None, None, 0)
        given = H.launch_hla_quantize(H._hla_quant_kernel, g3, 0, (), 8, "fp8_e4m3", True,
                                      False, torch.float8_e4m3fn, None, raw, 0,
                                      reduce_block=2)
        n += 1
        same = (torch.isnan(own[1]).all() and torch.isnan(given[1]).all()) if nan else (
            torch.equal(own[1], given[1])
            and torch.equal(own[0].view(torch.uint8), given[0].view(torch.uint8)))
        bad += not bool(same)
    # the SwiGLU backward's raw max-abs of g_a and g_b in 3 slots (3 programs looping over 37
    # rows) against 1, and the g_w codes swiglu_gw makes with either
    from hotcompile.kernels.swiglu_triton import _swiglu_hq_kernel, launch_swiglu_hq, swiglu_gw
    a, b, g = ((torch.randn(37, 64) * 2).to(torch.bfloat16) for _ in range(3))
    g[21, 3] = 50.0  # row 21: program 0's of 3
    res = {}
    for k in (1, 3):
        ga, gb = torch.empty_like(a), torch.empty_like(a)
        ca, cb = (torch.empty((48, 64), dtype=torch.float8_e4m3fn) for _ in range(2))
        sa, sb = (torch.empty(48) for _ in range(2))
        # poisoned (the bits of 1.7e38): a slot the kernel does not write shows
        ra, rb = (torch.full((k,), 0x7F000000, dtype=torch.int32) for _ in range(2))
        launch_swiglu_hq(_swiglu_hq_kernel, a, b, g, ga, gb, ca, sa, cb, sb, ra, rb, 8,
                         "fp8_e4m3", warps=4)
        gw = swiglu_gw(a, b, g, None, None, ra, rb, 1, 8, "fp8_e4m3", block_t=16, block_d=32)
        res[k] = (ra.max(), rb.max(), ca, sa, cb, sb, *gw)
    n += 1
    bad += not all(torch.equal(u.float(), v.float()) for u, v in zip(res[1], res[3]))
    print(f"{n - bad}/{n}")
""")


def test_interpreted_hla_statistics_in_slots_reduce_as_one(tmp_path):
    """``_hla_quant_kernel``'s statistics pass writes one slot per program (no zeroed word for
    inductor to clone) and its codes pass reduces them: looping programs and a chunked
    reduction give the codes and scale of one program per tile — the reference's — and a NaN
    anywhere still reaches the scale. HQ's per-token kernel leaves g_y's raw max-abs in a slot
    per program (at most ``max_raw_slots``, looping), which the plain g_w codes pass reduces
    to the codes of its own statistics; so does the SwiGLU backward's kernel, whose slots
    ``swiglu_gw`` reduces."""
    _all_of_them(_run_script(tmp_path / "partials.py", PARTIALS, interpret=True))


MUTATIONS = textwrap.dedent("""
    import torch
    import triton
    from torch._higher_order_ops import triton_kernel_wrap as tkw
    from triton.backends.compiler import GPUTarget

    from hotcompile.lowering import triton_ops as T

    class Hopper:  # the TTIR of an H100's compile without one: the analysis needs a target
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_current_device(self):
            return 0

        def get_active_torch_device(self):
            return torch.device("cpu")

    triton.runtime.driver.set_active(Hopper())

    def written(kernel, kwargs):
        # torch's analysis of which tensors a launch writes (its fallback when the TTIR
        # defeats it: every tensor, which fails here as it would clone them all under inductor)
        if hasattr(tkw, "identify_mutated_tensors"):  # torch 2.11, 2.12
            return tkw.identify_mutated_tensors(kernel, kwargs, {})
        acc = tkw.identify_accessed_tensors(kernel, kwargs, {})  # torch 2.13 on
        return [d.name for d in acc.read_writes.writes if torch.is_tensor(kwargs.get(d.name))]

    launches = []

    class Record:  # stands in for wrap_triton: what each op body launches, with its arguments
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((self.kernel, {**dict(zip(self.kernel.arg_names, args)), **kwargs}))
            return launch

    T.wrap_triton = Record
    f8, i32 = torch.float8_e4m3fn, torch.int32

    def r(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape).to(dtype)

    L, O = 64, 96
    cases = {
        "hq per token, raw slots": (T.hq_quantize, (r(L, O), 8, True, "fp8_e4m3", True, 16, True)),
        "hq per tensor": (T.hq_quantize, (r(L, O), 4, False, "nearest", True, 16, True)),
        "hla weight codes, fp32": (T.hla_quantize, (
            r(1, 128, 64, dtype=torch.float32), 0, list(range(16)), 8, "fp8_e4m3", False,
            False, None, None, True, True)),
        "hla LP_L1, signs": (T.hla_quantize, (
            r(2, 48, 32), 0, [0, 2, 3, 8], 8, "nearest", False, True, torch.ones(2, 48, 1))),
        "hla patches, SAWB": (T.hla_quantize, (
            r(2, 49, 32), 7, [0, 2, 3, 8], 4, "nearest", True, True)),
        "hla given max-abs": (T.hla_quantize, (
            r(2, 48, 32), 0, [], 8, "fp8_e4m3", False, False, None, torch.zeros(7, dtype=i32))),
        "swiglu_abc": (T.swiglu_abc, (
            r(L, O, dtype=f8), torch.rand(L), r(L, O, dtype=f8), torch.rand(L), 2, 8, "fp8_e4m3",
            torch.bfloat16)),
        "weight_operands": (T.weight_operands, (
            r(96, 64, dtype=torch.float32), 8, "fp8_e4m3", False, False, True)),
        "swiglu_backward_hq": (T.swiglu_backward_hq, (
            r(L, O), r(L, O), r(L, O), 8, "fp8_e4m3", True, 16)),
        "swiglu_backward_hq of codes": (T.swiglu_backward_hq, (
            r(L, O, dtype=f8), r(L, O, dtype=f8), r(L, O), 8, "fp8_e4m3", True, 16,
            torch.rand(L), torch.rand(L), False)),
        "swiglu_gw": (T.swiglu_gw, (
            r(L, O), r(L, O), r(L, O), torch.zeros(5, dtype=i32), torch.zeros(5, dtype=i32), 2, 8,
            "fp8_e4m3")),
        "swiglu_codes": (T.swiglu_codes, (r(L, O), r(L, O), "fp8")),
    }
    # every fused op and every kernel they launch is among the cases (a new one must be added)
    ops = {v for v in vars(T).values() if hasattr(v, "_init_fn") and hasattr(v, "_opoverload")}
    assert ops == {op for op, _ in cases.values()}, ops - {op for op, _ in cases.values()}
    kernels = {v for k, v in vars(T).items() if k.endswith("_kernel") and hasattr(v, "arg_names")}
    seen = set()
    n = ok = 0
    for name, (op, args) in cases.items():
        launches.clear()
        op._init_fn(*args)
        seen |= {kernel for kernel, _ in launches}
        inputs = {a.untyped_storage().data_ptr() for a in args if torch.is_tensor(a)}
        assert launches, name
        for kernel, kwargs in launches:
            w = written(kernel, kwargs)
            hit = [k for k in w if kwargs[k].untyped_storage().data_ptr() in inputs]
            n += 1
            ok += bool(w) and not hit
            print(name, kwargs.get("MODE", ""), "writes", w, f"INPUTS: {hit}" if hit else "")
    assert seen == kernels, sorted(k.__name__ for k in kernels - seen)
    print(f"{ok}/{n}")
""")


def test_fused_ops_write_only_their_own_buffers(tmp_path):
    """Every ``triton_op`` of ``hotcompile.lowering.triton_ops`` writes only buffers it
    allocates, by torch's own TTIR analysis (the one inductor runs when it traces a launch).
    A kernel the analysis counts as writing an input makes inductor clone that input for it
    (with host-computed strides that need not match the clone) and, for a weight, fails the
    compile ("a leaf Variable that requires grad is being used in an in-place operation"):
    session 39's GPU run of the slot kernels, where the HLA codes pass stored at indices a
    call returned with the tile it loaded from x. Not under the interpreter: the analysis
    reads the TTIR of the sm_90 compile."""
    out = _run_script(tmp_path / "mutations.py", MUTATIONS, interpret=False)
    _all_of_them(out)

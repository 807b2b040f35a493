"""Probe: can the text recipe's g_w path quantize in ONE pass with 1×128-token block scales?

The text recipe (issue 16) quantizes x (ABC, forward) and g_y (backward) for the g_w GEMM
``g_yᵀ·x`` with one FP8 scale per tensor: a global max-abs first, then the codes — two passes
over each tensor. The tokens are the GEMM's K dimension, so a per-token scale cannot be applied
in the epilogue; a scale per (column, 128 tokens) can, by a blockwise-scaled FP8 GEMM
(``torch._scaled_mm`` with 1×128 × 1×128 scales, cuBLAS on Hopper). Each such scale is known
inside one tile of 128 tokens, so the codes are written in the same pass that reads the tensor.

This measures on the GPU, for the Llama-style and ViT-B shapes:

1. the text recipe's present backward stage by stage (``hotcompile.lowering.hot``), against
   the two bf16 GEMMs, all under CUDA graphs;
2. a one-pass 1×128 quantizer (a Triton kernel here) against the present two-pass one;
3. the blockwise FP8 GEMM against the tensorwise one and bf16, its error against float32
   (tensorwise's beside it, on rows of spread magnitudes), and whether inductor compiles it.

    python3 experiments/blockwise_gw.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

SHAPES = [  # name, L tokens, O, I
    ("llama.qkv", 8192, 6144, 2048),
    ("llama.o", 8192, 2048, 2048),
    ("llama.gate", 8192, 8192, 2048),
    ("llama.down", 8192, 2048, 8192),
    ("vit.qkv", 25216, 2304, 768),
    ("vit.fc2", 25216, 768, 3072),
]
FLOOR_BPS = 3.0e12  # copy rate measured on the H100 machine (native_stages_h100.md)


def quantizer_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _q_tok128(x_ptr, q_ptr, s_ptr, L, D, sxl, BL: tl.constexpr, BD: tl.constexpr):
        """x [L, D] row-major -> codes [D, L] (K-major) e4m3, scales [L/BL, D] fp32."""
        pl = tl.program_id(0)
        pd = tl.program_id(1)
        rl = pl * BL + tl.arange(0, BL)
        rd = pd * BD + tl.arange(0, BD)
        m = (rl[:, None] < L) & (rd[None, :] < D)
        x = tl.load(x_ptr + rl[:, None] * sxl + rd[None, :], mask=m, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=0)
        s = tl.where(amax > 0, amax / 448.0, 1.0)
        q = (x / s[None, :]).to(tl.float8e4nv)
        tl.store(q_ptr + rd[None, :] * L + rl[:, None], q, mask=m)
        tl.store(s_ptr + pl * D + rd, s, mask=rd < D)

    def run(x: torch.Tensor, bl: int = 128, bd: int = 64):
        L, D = x.shape
        q = torch.empty((D, L), dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty((triton.cdiv(L, bl), D), dtype=torch.float32, device=x.device)
        grid = (triton.cdiv(L, bl), triton.cdiv(D, bd))
        _q_tok128[grid](x, q, s, L, D, x.stride(0), BL=bl, BD=bd, num_warps=8)
        return q, s

    return run


def dequant_blocks(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """codes [D, L] and scales [L/128, D] -> float32 [L, D]."""
    D, L = q.shape
    return (q.float().view(D, L // 128, 128) * s.t()[..., None]).view(D, L).t()


def probe_shape(name: str, L: int, O: int, I: int, qfn) -> dict:  # noqa: E741
    """Every measurement of one layer shape (see the module docstring)."""
    from hotcompile.lowering import gate, hot
    from hotcompile.quant import FP8_E4M3

    dev = torch.device("cuda")
    T = gate._graph_us
    g = torch.Generator(device=dev).manual_seed(0)
    # rows of spread magnitudes (tokens differ in scale, as activations and g_y do)
    spread = torch.exp(torch.randn((L, 1), device=dev, generator=g) * 1.5)
    gy = (torch.randn((L, O), device=dev, generator=g) * spread).bfloat16()
    x = (torch.randn((L, I), device=dev, generator=g) * spread.flip(0)).bfloat16()
    w = torch.randn((O, I), device=dev, generator=g)
    wb = w.bfloat16()
    r: dict = {"name": name, "L": L, "O": O, "I": I}
    s = gate.Shape(L=L, O=O, I=I, N=1, S=L, gx_bits=8, per_token=True, rounding=FP8_E4M3,
                   gw_rounding=FP8_E4M3, weight_scale="maxabs")  # fmt: skip
    x3, gy3 = x.view(1, L, I), gy.view(1, L, O)
    r["bf16 g_x mm"] = T(lambda: torch.mm(gy, wb))
    r["bf16 g_w mm"] = T(lambda: torch.mm(gy.t(), x))
    r["text: HOT total"] = T(gate._hot_fn(s, gy, w, x))
    r["text: hq g_y (fp8, per token)"] = T(lambda: hot.quantize_gy(gy, 8, True, FP8_E4M3, True, 16))
    r["text: weight (fp8)"] = T(lambda: hot.quantize_weight(w, 8, "maxabs", True, FP8_E4M3))
    gq, sg, _ = hot.quantize_gy(gy, 8, True, FP8_E4M3, True, 16)
    wq, sw = hot.quantize_weight(w, 8, "maxabs", True, FP8_E4M3)
    sgc, swc = sg[:, None].contiguous(), sw  # (since session 37 the row s/16 over [1, I])
    r["text: g_x _scaled_mm rowwise"] = T(
        lambda: torch._scaled_mm(gq, wq.t(), scale_a=sgc, scale_b=swc, out_dtype=torch.bfloat16)
    )
    r["text: g_w codes of g_y (2 passes)"] = T(lambda: hot.hla_codes(gy3, 0, (), 8, FP8_E4M3, None))
    r["text: ABC x (2 passes)"] = T(lambda: hot.compress(x3, 0, (), 8, FP8_E4M3, None))
    gqt, sgw = hot.hla_codes(gy3, 0, (), 8, FP8_E4M3, None)
    xq, sx = hot.compress(x3, 0, (), 8, FP8_E4M3, None)
    one = torch.ones((), device=dev)
    sc = (sgw * sx).reshape(())
    r["text: g_w _scaled_mm tensorwise"] = T(
        lambda: torch._scaled_mm(gqt, xq, scale_a=sc, scale_b=one, out_dtype=torch.float32)
    )
    # one pass, 1x128 token blocks
    r["block: g_w codes of g_y (1 pass)"] = T(lambda: qfn(gy))
    r["block: ABC x (1 pass)"] = T(lambda: qfn(x))
    qa, sa = qfn(gy)  # [O, L], [L/128, O]
    qb, sb = qfn(x)  # [I, L], [L/128, I]
    r["floor: one pass over g_y"] = L * O * 3 / FLOOR_BPS * 1e6
    r["floor: one pass over x"] = L * I * 3 / FLOOR_BPS * 1e6
    exact = gy.float().t() @ x.float()
    ref_norm = exact.norm()
    tw = torch._scaled_mm(gqt, xq, scale_a=sc, scale_b=one, out_dtype=torch.float32)
    r["err tensorwise"] = ((tw - exact).norm() / ref_norm).item()
    r["err block emulated"] = (
        (dequant_blocks(qa, sa).t() @ dequant_blocks(qb, sb) - exact).norm() / ref_norm
    ).item()
    for label, sa_, sb_ in (
        ("sa [O,K/128] stride(1,O); sb [K/128,I] contiguous", sa.t(), sb),
        ("sa contiguous; sb contiguous", sa.t().contiguous(), sb),
        ("sa stride(1,O); sb stride(1,K/128)", sa.t(), sb.t().contiguous().t()),
        ("sa contiguous; sb stride(1,K/128)", sa.t().contiguous(), sb.t().contiguous().t()),
    ):
        try:
            out = torch._scaled_mm(qa, qb.t(), scale_a=sa_, scale_b=sb_,
                                   out_dtype=torch.float32)  # fmt: skip
            torch.cuda.synchronize()
            r.setdefault("block layouts ok", []).append(label)
            r[f"err block gemm [{label}]"] = ((out - exact).norm() / ref_norm).item()
            if "block: g_w _scaled_mm 1x128" not in r:
                r["block: g_w _scaled_mm 1x128"] = T(
                    lambda sa_=sa_, sb_=sb_: torch._scaled_mm(
                        qa, qb.t(), scale_a=sa_, scale_b=sb_, out_dtype=torch.float32
                    )
                )
                try:
                    f = torch.compile(
                        lambda a_, b_, s1, s2: torch._scaled_mm(
                            a_, b_, scale_a=s1, scale_b=s2, out_dtype=torch.float32
                        )
                    )
                    oc = f(qa, qb.t(), sa_, sb_)
                    r["compiled block gemm max diff"] = (oc - out).abs().max().item()
                except Exception as e:  # noqa: BLE001 - a probe reports every failure
                    r["compiled block gemm error"] = f"{type(e).__name__}: {e}"[:400]
        except Exception as e:  # noqa: BLE001
            r.setdefault("block layouts failed", []).append(f"{label}: {str(e)[:200]}")
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default=",".join(n for n, *_ in SHAPES))
    a = ap.parse_args(argv)
    qfn = quantizer_kernel()
    want = set(a.shapes.split(","))
    results = []
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}")
    for name, L, O, I in SHAPES:
        if name not in want:
            continue
        r = probe_shape(name, L, O, I, qfn)
        results.append(r)
        for k, v in r.items():
            print(f"{name:10s} {k:45s} {v if not isinstance(v, float) else round(v, 5)}")
        sys.stdout.flush()
        torch.cuda.empty_cache()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "blockwise_gw.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
         "results": results}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

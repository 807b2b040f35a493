"""GPT-2 small's tied 50257-wide head alone on a GPU: are HOT's ops finite at that shape?

The diagnostic behind tools/results/bench_train.md's note on the GPT-2 NaN: g_y [8192, 50257]
(bf16 and fp32) and a 768-wide weight through both g_x quantize kernels (Triton, CUDA; the
CUDA one refuses rows over 16384 columns, then 4000 columns are tried), the weight quantize,
both GEMM families, hq_grad_input (vs the reference on 512 rows) and hla_grad_weight. Prints
one line per check; its output on the H200 is experiments/results/gpt2_head_ops.txt.

    HOTCOMPILE_CUTLASS=0 python3 experiments/gpt2_head_ops.py
"""

from __future__ import annotations

import faulthandler

import torch

import hotcompile  # noqa: F401  (registers the ops)
from hotcompile import ops as hops
from hotcompile.kernels import dispatch, hq_cuda, hq_triton

ops = torch.ops.hotcompile
LP_L1 = [0, 2, 3, 8, 10, 11, 12, 14]
L, O, I = 8192, 50257, 768
HQ = (4, "per_token", "pseudo_stochastic", "sawb", 16, "head")


def finite(t: torch.Tensor) -> bool:
    return bool(t.float().isfinite().all())


def quantizers(gy: torch.Tensor, dt: torch.dtype) -> None:
    for impl in ("triton", "cuda"):
        fn = hq_triton.hq_quantize_triton if impl == "triton" else hq_cuda.hq_quantize
        for pt in (True, False):
            try:
                c, s = fn(gy, 4, pt, "pseudo_stochastic", torch.float8_e4m3fn, 16)
            except Exception as e:  # noqa: BLE001 - the refusal is part of the output
                print(impl, "refused:", e, flush=True)
                c2, _ = fn(gy[:, :4000], 4, pt, "pseudo_stochastic", torch.float8_e4m3fn, 16)
                print(impl, "4000 cols ok", finite(c2), flush=True)
                continue
            torch.cuda.synchronize()
            scaling = "per_token" if pt else "per_tensor"
            print(dt, impl, scaling, "codes finite", finite(c), "scales finite", finite(s))


def with_preference(impl: str) -> None:
    dispatch.set_preference(impl)
    dispatch.clear()


def main() -> None:
    faulthandler.enable()
    torch.manual_seed(0)
    print("hq_cuda", hq_cuda.build(), flush=True)
    for dt in (torch.bfloat16, torch.float32):
        gy = (torch.randn(L, O, device="cuda") * 1e-6).to(dt)
        w = (torch.randn(O, I, device="cuda") * 0.02).bfloat16()
        quantizers(gy, dt)
        wt, sw = hq_triton.quantize_weight(w, 4, "sawb", True)
        print("w scale", sw.item(), "codes finite", finite(wt), flush=True)
        fp8 = torch.float8_e4m3fn
        c, s = hq_triton.hq_quantize_triton(gy, 4, True, "pseudo_stochastic", fp8, 16)
        for name in ("torch", "triton"):
            with_preference(name)
            out = dispatch.scaled_gemm(c, wt, s, sw / 16, dt)
            torch.cuda.synchronize()
            print("gemm", name, finite(out), dispatch.table().splitlines()[-1], flush=True)
        for impl in ("triton", "torch"):
            with_preference(impl)
            g = ops.hq_grad_input(gy, w, *HQ, "", True)
            torch.cuda.synchronize()
            ref = hops.hq_grad_input._init_fn(gy[:512], w, *HQ, "", False)
            rel = ((g[:512].float() - ref.float()).norm() / ref.float().norm()).item()
            print("hq_grad_input", impl, dt, "finite", finite(g), "rel", rel, flush=True)
        x = torch.randn(8, 1024, I, device="cuda").bfloat16()
        xq, sx = ops.abc_compress(x, 0, LP_L1, 16, 8, "pseudo_stochastic")
        for impl in ("triton", "torch"):
            with_preference(impl)
            args = (0, LP_L1, 16, 8, "pseudo_stochastic", "head", True)
            gw = ops.hla_grad_weight(gy.view(8, 1024, O), xq, sx, *args)
            torch.cuda.synchronize()
            print("hla_grad_weight", impl, dt, "finite", finite(gw), flush=True)
    dispatch.set_preference("auto")
    print("done")


if __name__ == "__main__":
    main()

"""Why does GPT-2's tied LM head pass the speed gate and still slow the step?

On the H100 (2026-11-24, tools/results/bench_train_runs/run5_039b43c_gpt2.md) the gate kept
GPT-2's 48 block layers in bf16 but took HOT for the head (8192 tokens × 768 → 50257), and the
step's GPU time grew by ~1 ms. Hypothesis: the gate times the bf16 backward on a g_y whose row
stride is 50257 elements (not 16-byte aligned), which cuBLAS runs slowly, while in the real
graph inductor pads that stride (its comprehensive padding) and the bf16 GEMMs are fast.

This script times, for the head's shape: the bf16 backward with g_y at stride 50257, at a
padded stride (50264), and with O itself padded to 50264 (zero rows of W, zero columns of g_y:
what inductor's shape padding, ``fx_passes/pad_mm.py``, runs — inductor's own step ran the
head's two backward GEMMs in 1.26 + 0.79 ms, ``bench_train_profiles/s15_a4592b2``), HOT's
native backward, and the gate's verdict (since MEASURE_VERSION 4 the faster of the unpadded
and padded exact sides). CUDA only.

    python experiments/gpt2_head_gate.py
"""

from __future__ import annotations

import torch

from hotcompile.lowering import gate


def main() -> None:
    dev = torch.device("cuda")
    L, O, I = 8192, 50257, 768
    pad = (O + 7) // 8 * 8
    g = torch.Generator(device=dev).manual_seed(0)
    gy_pad = torch.randn((L, pad), device=dev, dtype=torch.bfloat16, generator=g)
    gy_aligned = gy_pad[:, :O]  # row stride 50264: what a padded layout gives
    gy = gy_aligned.contiguous()  # row stride 50257
    x = torch.randn((L, I), device=dev, dtype=torch.bfloat16, generator=g)
    w = torch.randn((O, I), device=dev, dtype=torch.bfloat16, generator=g)

    def bf16(gy_):
        def run():
            torch.mm(gy_, w)
            torch.mm(gy_.t(), x)

        return run

    w_pad = torch.nn.functional.pad(w, (0, 0, 0, pad - O))

    def bf16_padded():
        def run():
            torch.mm(gy_pad, w_pad)
            torch.mm(gy_pad.t(), x)

        return run

    # the head as the rewrite hands it to the gate (HOT's defaults, signed HLA on text)
    s = gate.Shape(L=L, O=O, I=I, N=8, S=L // 8, rows=(1,), gx_bits=4, per_token=True,
                   gw_bits=8, gw_rounding="nearest", rounding="pseudo_stochastic",
                   weight_scale="maxabs", signs=True)  # fmt: skip

    def hot_fn(gy_):
        return gate._hot_fn(s, gy_, w.float(), x)

    rows = [
        ("bf16 backward, g_y stride 50257", gate._graph_us(bf16(gy))),
        ("bf16 backward, g_y stride 50264 (padded)", gate._graph_us(bf16(gy_aligned))),
        ("bf16 backward, O padded to 50264 (pad_mm)", gate._graph_us(bf16_padded())),
        ("HOT native backward, g_y stride 50257", gate._graph_us(hot_fn(gy))),
    ]
    print(f"GPT-2 head backward, L={L} O={O} I={I}, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}")  # fmt: skip
    for name, us in rows:
        print(f"  {name:45s} {us:8.0f} µs")
    print("  gate.measure (fresh):", gate.measure(s, dev).describe())
    print("  gate model:", gate.estimate(s).describe())


if __name__ == "__main__":
    main()

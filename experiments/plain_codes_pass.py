"""Where the text recipe's plain-rows g_w codes save time: the HLA kernel (``TRANSFORM`` off)
with its own max-abs pass (two passes) or with g_y's max-abs taken by HQ's kernel
(``amax_given``: the codes pass only). µs under CUDA graphs on the Llama/GPT-2 shapes.

The committed table (``experiments/results/plain_codes_pass_h100.md``) came from this script at
0c406bd, which also timed a separate plain-rows kernel (``_rows_quant_kernel``, one tile per
program): it was no faster than the HLA kernel in either mode and was removed.

    python3 experiments/plain_codes_pass.py
"""

from __future__ import annotations

import torch

from hotcompile.kernels import hla_triton as H
from hotcompile.lowering import gate

FP8 = "fp8_e4m3"


def run(x3: torch.Tensor, amax: torch.Tensor | None):
    return H.launch_hla_quantize(
        H._hla_quant_kernel, x3, 0, (), 8, FP8, True, False, torch.float8_e4m3fn, None, amax, 0
    )  # fmt: skip


def main() -> None:
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}")
    print("| L×D | HLA kernel 2 passes | HLA kernel codes pass | same codes |")
    print("|---|---|---|---|")
    for L, D in ((8192, 2048), (8192, 8192), (8192, 768), (8192, 3072)):
        x3 = torch.randn((1, L, D), device="cuda").bfloat16()
        amax = x3.float().abs().max().reshape(1).view(torch.int32)
        t = [gate._graph_us(lambda a=a, x3=x3: run(x3, a)) for a in (None, amax)]
        same = torch.equal(run(x3, None)[0].view(torch.uint8), run(x3, amax)[0].view(torch.uint8))
        print(f"| {L}×{D} | {t[0]:.0f} | {t[1]:.0f} | {same} |")


if __name__ == "__main__":
    main()

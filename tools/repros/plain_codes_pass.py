"""Which kernel should write the plain-rows g_w codes: the HLA kernel (TRANSFORM off) or the
plain-rows kernel? Both take g_y's max-abs from HQ (``amax_given``: the codes pass only) or
reduce it themselves (two passes); µs under CUDA graphs on the Llama/GPT-2 shapes, codes
compared bit for bit.

    python3 tools/repros/plain_codes_pass.py
"""

from __future__ import annotations

import torch

from hotcompile.kernels import hla_triton as H
from hotcompile.lowering import gate

FP8 = "fp8_e4m3"


def run(x3: torch.Tensor, rows_kernel, amax: torch.Tensor | None):
    words = amax if amax is not None else torch.zeros((1,), dtype=torch.int32, device=x3.device)
    return H.launch_hla_quantize(
        H._hla_quant_kernel, x3, 0, (), 8, FP8, True, False, torch.float8_e4m3fn, None, words,
        0, rows_kernel=rows_kernel, amax_given=amax is not None,
    )  # fmt: skip


def main() -> None:
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}")
    print("| L×D | HLA kernel 2 passes | rows kernel 2 passes | HLA kernel codes pass | "
          "rows kernel codes pass | same codes |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for L, D in ((8192, 2048), (8192, 8192), (8192, 768), (8192, 3072)):
        x3 = torch.randn((1, L, D), device="cuda").bfloat16()
        amax = x3.float().abs().max().reshape(1).view(torch.int32)
        t = [gate._graph_us(lambda k=k, a=a, x3=x3: run(x3, k, a))
             for a in (None, amax) for k in (None, H._rows_quant_kernel)]  # fmt: skip
        same = torch.equal(run(x3, None, amax)[0].view(torch.uint8),
                           run(x3, H._rows_quant_kernel, amax)[0].view(torch.uint8))  # fmt: skip
        print(f"| {L}×{D} | {t[0]:.0f} | {t[1]:.0f} | {t[2]:.0f} | {t[3]:.0f} | {same} |")


if __name__ == "__main__":
    main()

"""HQ's kernel on wide rows whose width is not a power of two: chunks vs one masked walk.

``hq_triton._config`` walks a row that is not a power of two in chunks that divide it
(two walks: max-abs, then codes, the second re-reading the rows): the Llama's LM head
(O = 32000) runs 125 chunks of 256 over a 524 MB g_y, GPT-2's (50257, padded 50272) 1571
chunks of 32. A masked walk over the next power of two reads the row once and keeps it in
registers, at the cost of the masked tail (2.3% of 32768 for the Llama's head, where the
committed H200 sweep measured it slower for narrow rows: ViT qkv, 2304 of 4096, 222 against
121 µs, ``tools/results/bench_layers_h200.md``). This times both, per-token FP8 values (the
text recipe's HQ; ``--recipe int4``: the vision recipe's INT4 grid), bit-exactness checked,
under CUDA graphs:

    python3 experiments/hq_wide_rows.py [--recipe fp8|int4] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib

import torch
import triton

from hotcompile.hadamard import padded
from hotcompile.kernels.hq_triton import _config, _hq_quant_kernel, launch_hq_quantize
from hotcompile.lowering import gate

#: (name, L, O): the text recipe's wide HQ inputs, and ViT's narrow ones for contrast
SHAPES = [
    ("llama.lm_head", 8192, 32000),
    ("gpt2.lm_head", 8192, 50257),
    ("vit.fc1", 25216, 3072),
    ("vit.qkv", 25216, 2304),
]


#: --recipe: HQ's (bits, rounding) per token; codes e4m3 either way (INT4-grid integers are
#: exact in e4m3)
RECIPES = {"fp8": (8, "fp8_e4m3"), "int4": (4, "pseudo_stochastic")}


def hq(gy: torch.Tensor, block_o: int | None, recipe: str = "fp8"):
    L, O = gy.shape
    bits, rounding = RECIPES[recipe]
    codes = torch.empty((padded(L, 16), padded(O, 16)), dtype=torch.float8_e4m3fn, device="cuda")
    scales = torch.empty((codes.shape[0],), dtype=torch.float32, device="cuda")
    launch_hq_quantize(_hq_quant_kernel, gy, codes, scales, None, bits, rounding, 0,
                       block_o=block_o)  # fmt: skip
    return codes, scales


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="", help="write the markdown table here (and .json)")
    ap.add_argument(
        "--recipe", choices=sorted(RECIPES), default="fp8",
        help="HQ's codes: fp8 (the text recipe's FP8 values) or int4 (the vision recipe's "
        "INT4 grid, pseudo-stochastic rounding)",
    )  # fmt: skip
    a = ap.parse_args()
    rc = a.recipe
    rows, lines = [], []
    for name, L, O in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        gy = torch.randn((L, O), device="cuda", generator=g).bfloat16()
        o_pad = padded(O, 16)
        # the chunked rule every recipe had until 064135b (and the INT recipes keep), forced:
        # since then hq(gy, None) takes the FP8 rule this script measured
        chunked = _config(o_pad, None)
        ref = hq(gy, chunked[1], rc)
        r = {"layer": name, "L": L, "O": O, "recipe": rc, "default config": chunked}
        r["FP8 default config (since 064135b)"] = _config(o_pad, None, True)
        r["floor (read 2 B, write 1 B, 3.0 TB/s)"] = L * O * 3 / 3.0e12 * 1e6
        r["default"] = gate._graph_us(lambda gy=gy, bo=chunked[1]: hq(gy, bo, rc))
        for bo in sorted({triton.next_power_of_2(o_pad), 4096, 8192, 16384} - {0}):
            if bo > triton.next_power_of_2(o_pad):
                continue
            key = f"block_o {bo} {_config(o_pad, bo)}"
            try:
                got = hq(gy, bo, rc)
            except Exception as e:  # noqa: BLE001 - a tile Triton cannot build
                r[key] = f"failed: {type(e).__name__}: {str(e)[:120]}"
                continue
            same = torch.equal(got[0].view(torch.uint8), ref[0].view(torch.uint8))
            same = same and torch.equal(got[1], ref[1])
            r[key] = gate._graph_us(lambda gy=gy, bo=bo: hq(gy, bo, rc)) if same else "DIFFERS"
        rows.append(r)
        print(json.dumps(r, default=str), flush=True)
        timed = {k: v for k, v in r.items() if k.startswith("block_o") and isinstance(v, float)}
        best = min(timed, key=timed.get) if timed else "-"
        t_best = timed.get(best, float("nan"))
        lines.append(
            f"| {name} ({L} × {O}) | {r['default']:.1f} | {best}: {t_best:.1f} "
            f"| {r['floor (read 2 B, write 1 B, 3.0 TB/s)']:.1f} |"
        )
        del gy
        torch.cuda.empty_cache()
    meta = (
        f"Device: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton "
        f"{triton.__version__}; commit {os.environ.get('HOTCOMPILE_COMMIT', 'unknown')}; "
        f"{datetime.date.today()}. `experiments/hq_wide_rows.py --recipe {rc}`; µs under CUDA "
        "graphs; "
        "configs (BLOCK_L, BLOCK_O, NCHUNK, warps); every timed config's codes and scales equal "
        "the chunked rule's."
    )
    md = "\n".join([
        "# HQ on rows whose width is not a power of two: chunks vs a masked walk", "", meta, "",
        "| g_y | chunked rule (µs) | best forced BLOCK_O (µs) | floor |", "|---|---|---|---|",
        *lines, "", "Every config: the JSON.",
    ])  # fmt: skip
    print(md)
    if a.out:
        pathlib.Path(a.out).write_text(md + "\n")
        pathlib.Path(a.out).with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()

"""Where do the forward's weight codes go under ``forward="fp8"``: saved, or recomputed in the
backward? (issue 34, session 32.)

The 0.67B Llama's generated backward on the H200 quantized the weights of q/k/v/o/gate/up
although ``weight_codes="forward"`` asks for them to be made in the forward and saved, and a
``MUST_SAVE`` tag on them did not change that (``results/step_code_llama_h200_s32.md``), while
the CPU suite's MLP, SwiGLU and a tiny HF Llama save them under aot_eager and inductor alike.
This prints, for the tests' SwiGLU MLP on this machine's device (``tests/test_lowering.py``'s
``saved_by_forward``), the 8-bit tensors the forward saves under each compiler and ``prefer``,
with and without the tag: whether the GPU's inductor path is where the tag is lost.

    python3 experiments/weight_codes_placement.py [--dims 512 1024 --tokens 2048]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main(argv: list[str] | None = None) -> int:
    from test_lowering import SwiGLU, saved_by_forward

    from hotcompile import autograd

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", type=int, nargs=2, default=(512, 1024), metavar=("D", "H"))
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--prefer", nargs="+", default=["paper", "speed"])
    ap.add_argument("--lowering", default="auto", help="native: HOT's own path on the CPU too")
    ap.add_argument(
        "--untagged", action="store_true", help="also without the forward's MUST_SAVE tag"
    )
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    d, h = args.dims
    # down is the graph's last layer: it keeps a bf16 forward (the head rule); gate's and up's
    # codes are the FP8 forward's question
    model = functools.partial(SwiGLU, d, h)
    weights = {"gate": (h, d), "up": (h, d), "down": (d, h)}
    print(f"device {device}, torch {torch.__version__}; SwiGLU d={d} h={h}, {args.tokens} tokens")
    tagged = autograd._saved
    try:
        for tag in (True, False) if args.untagged else (True,):
            autograd._saved = tagged if tag else contextlib.nullcontext
            for prefer in args.prefer:
                for compiler in ("aot_eager", "inductor"):
                    opts = {"forward": "fp8", "prefer": prefer, "weight_codes": "forward",
                            "recipe": "text", "lowering": args.lowering}  # fmt: skip
                    saved = saved_by_forward(
                        opts, True, device, model, compiler, (2, args.tokens // 2, d)
                    )
                    got = sorted(
                        (s, str(t).removeprefix("torch."))
                        for s, t in saved
                        if t in (torch.int8, torch.float8_e4m3fn)
                    )
                    shapes = {s for s, _ in got}
                    found = [n for n, (o, i) in weights.items() if {(o, i), (i, o)} & shapes]
                    print(f"{'tagged  ' if tag else 'untagged'} prefer={prefer:6} {compiler:9}: "
                          f"weight codes saved for {found or 'none'}; all 8-bit saved: {got}",
                          flush=True)  # fmt: skip
    finally:
        autograd._saved = tagged
    return 0


if __name__ == "__main__":
    sys.exit(main())

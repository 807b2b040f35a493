"""Where do the forward's weight codes go under ``forward="fp8"``: saved, or recomputed in the
backward? (issue 34, session 32.)

The 0.67B Llama's generated backward on the H200 quantized the weights of q/k/v/o/gate/up
although ``weight_codes="forward"`` asks for them to be made in the forward and saved, and a
``MUST_SAVE`` tag on them did not change that (``results/step_code_llama_h200_s32.md``), while
the CPU suite's MLP, SwiGLU and a tiny HF Llama save them under aot_eager and inductor alike.
This prints, for a SwiGLU MLP on this machine's device, the 8-bit tensors the forward saves
under each compiler and ``prefer``: whether the GPU's inductor path is where the tag is lost.

    python3 experiments/weight_codes_placement.py [--dims 512 1024 --tokens 2048]
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import hotcompile


class SwiGLU(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d, h, bias=False)
        self.up = nn.Linear(d, h, bias=False)
        self.down = nn.Linear(h, d, bias=False)
        self.head = nn.Linear(d, d, bias=False)  # the graph's last layer keeps a bf16 forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(nn.functional.silu(self.gate(x)) * self.up(x)))


def saved_8bit(
    compiler: str, prefer: str, d: int, h: int, tokens: int, device: str, lowering: str
) -> list:
    """The 8-bit tensors the backward graph takes from the forward (shape, dtype)."""
    import torch._inductor.compile_fx as cf
    from functorch.compile import min_cut_rematerialization_partition

    saved: list = []

    def partition(joint, *args, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, *args, **kwargs)
        for n in bw.graph.nodes:
            if n.op == "placeholder" and not n.name.startswith("tangents"):
                v = n.meta["val"]
                if v.dtype in (torch.int8, torch.float8_e4m3fn):
                    saved.append((tuple(v.shape), str(v.dtype).removeprefix("torch.")))
        return fw, bw

    before = cf.min_cut_rematerialization_partition
    cf.min_cut_rematerialization_partition = partition  # inductor's path
    try:
        torch._dynamo.reset()
        hotcompile.clear_plans()
        torch.manual_seed(0)
        net = SwiGLU(d, h).to(device)
        x = torch.randn(2, tokens // 2, d, device=device, requires_grad=True)
        opts = {"forward": "fp8", "prefer": prefer, "weight_codes": "forward",
                "compiler": compiler, "recipe": "text", "lowering": lowering}  # fmt: skip
        if compiler == "aot_eager":
            from hotcompile.backend import aot_decomp_partition
            from hotcompile.passes import rewrite

            backend = hotcompile.HotBackend(**opts)

            def compile_(gm, inputs):
                rewrite(gm, backend.config, inputs)
                modes = backend.config.abc_recompute_modes
                return aot_decomp_partition(gm, inputs, partition_fn=partition, abc_recompute=modes)

            step = torch.compile(net, backend=compile_)
        else:
            step = torch.compile(net, backend="hot", options=opts)
        with torch.autocast(device, torch.bfloat16):
            y = step(x)
        y.float().square().sum().backward()
    finally:
        cf.min_cut_rematerialization_partition = before
    return saved


def main(argv: list[str] | None = None) -> int:
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
    weights = {"gate": (h, d), "up": (h, d), "down": (d, h)}
    print(f"device {device}, torch {torch.__version__}; SwiGLU d={d} h={h}, {args.tokens} tokens")
    import contextlib

    from hotcompile import autograd

    tagged = autograd._saved
    for tag in (True, False) if args.untagged else (True,):
        autograd._saved = tagged if tag else contextlib.nullcontext
        for prefer in args.prefer:
            for compiler in ("aot_eager", "inductor"):
                got = saved_8bit(compiler, prefer, d, h, args.tokens, device, args.lowering)
                shapes = {s for s, _ in got}
                found = [n for n, (o, i) in weights.items() if {(o, i), (i, o)} & shapes]
                print(f"{'tagged  ' if tag else 'untagged'} prefer={prefer:6} {compiler:9}: "
                      f"weight codes saved for {found or 'none'}; all 8-bit saved: "
                      f"{sorted(got)}", flush=True)  # fmt: skip
    autograd._saved = tagged
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The late weight codes' gradients against the forward's, on CUDA, by compiler and with the
joint pass's CSE-twin tagging on or off: which part makes them differ (the GPU test
``test_native_weight_codes_in_the_backward_saves_neither_codes_nor_copy`` found g_x unequal
under inductor at dcf707a, twentieth session), and each one's relative error against the
exact backward (a bug would show as a larger error; float rounding as alike errors), after a
control: the forward codes compiled twice (SAWB's atomic float sums may make even those
differ). Prints two lines per case.

    python3 experiments/late_codes_grads.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def grads(codes: str, compiler: str, opts: dict) -> dict[str, torch.Tensor]:
    from test_lowering import mlp_step

    return mlp_step({**opts, "weight_codes": codes, "compiler": compiler}, "cuda")[0]


def main() -> None:
    from conftest import rel  # (tests/)

    from hotcompile.passes import abc_recompute

    base = {"lowering": "native", "prefer": "paper"}
    cases = [
        ("aot_eager", base, True),
        ("inductor", base, True),
        ("inductor", base, False),
        ("inductor", {**base, "abc_recompute": "off"}, True),
        ("inductor", {**base, "rounding": "nearest"}, True),
        ("inductor", {**base, "recipe": "text"}, True),
    ]
    # the control: the forward codes against themselves, compiled twice (SAWB's sums are
    # atomic float adds: if their order changes between launches, so may a few INT4 codes)
    for compiler in ("aot_eager", "inductor"):
        a, b = grads("forward", compiler, base), grads("forward", compiler, base)
        diff = {k: float((a[k] - b[k]).abs().max()) for k in a}
        print(compiler, "forward vs forward (control)", diff, flush=True)
    twins = abc_recompute.tag_recompute_twins
    for compiler, opts, with_twins in cases:
        abc_recompute.tag_recompute_twins = twins if with_twins else (lambda graph: [])
        try:
            early, late = grads("forward", compiler, opts), grads("backward", compiler, opts)
            diff = {k: float((early[k] - late[k]).abs().max()) for k in early}
            print(compiler, opts, "twins" if with_twins else "no twins", diff, flush=True)
            # a bug, or float rounding? each against the exact backward: a wrong buffer makes
            # late's error much larger than early's; an ulp of SAWB's scale (atomic float
            # sums in another order, or its arithmetic fused differently in the two graphs)
            # flips a few INT4 codes and leaves the two errors alike
            exact = grads("forward", compiler, {**opts, "exact": True})
            err = {
                name: {k: rel(g[k], exact[k]) for k in ("x", "fc1.weight")}
                for name, g in (("early", early), ("late", late))
            }
            print("   relative error vs exact:", err, flush=True)
        except Exception as e:  # noqa: BLE001
            print(compiler, opts, with_twins, "ERROR", type(e).__name__, str(e)[:300], flush=True)
    abc_recompute.tag_recompute_twins = twins


if __name__ == "__main__":
    main()

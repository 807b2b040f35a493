"""Why the weight's late codes (``weight_codes="backward"``) still leave something saved on
CUDA: the joint graph of the two-layer MLP of tests/test_lowering.py, each node reading a
node with its ``recompute`` tag, and what the min-cut
partitioner saved. A diagnostic for the device (it needs the Triton path); prints only.

    python3 experiments/late_codes_partition.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    from functorch.compile import min_cut_rematerialization_partition
    from test_lowering import MLP

    import hotcompile
    from hotcompile.backend import aot_decomp_partition
    from hotcompile.passes import rewrite

    def partition(joint, *args, **kwargs):
        for n in joint.graph.nodes:
            if n.op == "output":
                continue
            val = n.meta.get("val")
            desc = (tuple(val.shape), val.dtype) if isinstance(val, torch.Tensor) else ""
            ins = [a.name for a in n.all_input_nodes][:3]
            rc, tag = n.meta.get("recompute"), n.meta.get("partitioner_tag")
            print(f"{n.name:36s} {str(n.target)[:56]:56s} rc={rc} tag={tag} {desc} <- {ins}")
        fw, bw = min_cut_rematerialization_partition(joint, *args, **kwargs)
        print("SAVED:")
        for n in bw.graph.nodes:
            if n.op == "placeholder" and not n.name.startswith("tangents"):
                v = n.meta["val"]
                print("  ", n.name, tuple(v.shape), v.dtype)
        return fw, bw

    backend = hotcompile.HotBackend(
        compiler="aot_eager", lowering="native", prefer="paper", weight_codes="backward"
    )

    def compiler(gm, inputs):
        rewrite(gm, backend.config, inputs)
        return aot_decomp_partition(gm, inputs, partition_fn=partition)

    x = torch.randn(2, 40, 32, device="cuda", requires_grad=True)
    with torch.autocast("cuda", torch.bfloat16):
        torch.compile(MLP().cuda(), backend=compiler)(x).float().sum().backward()


if __name__ == "__main__":
    main()

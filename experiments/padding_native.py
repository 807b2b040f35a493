"""Does inductor's comprehensive padding break HOT's native lowering? (issue 14)

On the H100 (torch 2.11, 2026-11-24) GPT-2 small with its tied head HOT and
``inductor_config={"comprehensive_padding": True}`` trained wrongly (loss 10.70 after 13 steps
where inductor reaches 8.53; tools/results/bench_train_runs/run8_*), which is why the backend
keeps padding off in graphs with a HOT layer. This compiles a one-block HF GPT-2 with an
unaligned vocabulary (2051) under HOT's native lowering with deterministic numerics (g_x
exact, rounding to nearest), padding off and on, and compares every gradient with the same
HOT graph under ``aot_eager`` (no inductor). CUDA when available, else CPU (inductor pads
there only with ``disable_padding_cpu=False``, which this sets).

On the CPU (torch 2.13, 2026-11-24) both agree with aot_eager to 2.8e-6 with one buffer
padded. On the H100 (torch 2.11) padding on pads 2 buffers and c_fc's weight gradient is 310×
its norm off (experiments/results/padding_native_h100.md): the bug reproduces there in a minute.

    python experiments/padding_native.py
    TORCH_LOGS=output_code python experiments/padding_native.py 2> code.log  # the code
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.nn.functional as F

import hotcompile
from hotcompile.compat import import_module


def gradient_errors(gx_bits: int | None = None) -> list[dict]:
    """For padding off and on: how many buffers inductor padded and the worst parameter
    gradient's relative error against the same HOT graph under ``aot_eager``."""
    from torch._inductor import metrics

    tf = import_module("transformers")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        vocab_size=2051, n_positions=64, n_embd=64, n_layer=1, n_head=4, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    base = tf.GPT2LMHeadModel(cfg).to(dev)
    ids = torch.randint(0, 2051, (2, 32), device=dev)

    def grads(opts: dict) -> dict[str, torch.Tensor]:
        torch._dynamo.reset()
        m = copy.deepcopy(base)

        def step(ids):
            lg = m(ids).logits[:, :-1]
            return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), ids[:, 1:].reshape(-1))

        torch.compile(step, backend=hotcompile.HotBackend(**opts))(ids).backward()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    det = dict(lowering="native", rounding="nearest", gx_bits=gx_bits, prefer="paper",
               gx_scaling="per_token")  # fmt: skip
    ref = grads({**det, "compiler": "aot_eager"})
    rows = []
    for pad in (False, True):
        metrics.reset()
        print(f"===== padding {pad} =====", file=sys.stderr, flush=True)
        ic = {"disable_padding_cpu": False, "fx_graph_cache": False, "comprehensive_padding": pad}
        g = grads({**det, "inductor_config": ic})
        rel = {n: ((g[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref}
        worst = max(rel, key=rel.get)
        rows.append(dict(padding=pad, padded=metrics.num_comprehensive_padding, worst=worst,
                         rel=rel[worst]))  # fmt: skip
    return rows


def main() -> None:
    print(f"{'cuda' if torch.cuda.is_available() else 'cpu'}, torch {torch.__version__}")
    for gx_bits in (None, 4):
        print(f"g_x {'exact' if gx_bits is None else f'HQ INT{gx_bits}'}:")
        for r in gradient_errors(gx_bits):
            print(f"  padding {r['padding']!s:5}: {r['padded']} padded buffers, worst gradient "
                  f"vs aot_eager: {r['worst']} rel {r['rel']:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()

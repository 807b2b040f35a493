"""Which layers sharing one x (q/k/v, gate/up) DDPOptimizer puts in different graph pieces.

HOT quantizes an x that several layers read once (``autograd._native_compress_once``) and the
speed gate charges each reader its share (``hotcompile.passes.rewrite._share_abc``). Under
``torch.compile(DDP(model))`` DDPOptimizer splits the graph at gradient buckets and compiles
each piece alone, so a group can be cut: each piece then holds part of the group and pays its
own ABC of x. This prints, for each piece the backend compiles, the groups of layers reading
one x (one process, gloo, CPU, a tiny HF Llama; nothing downloaded):

    python3 experiments/ddp_pieces.py --bucket-mb 25
    python3 experiments/ddp_pieces.py --hidden 2048 --intermediate 8192 --heads 16 \
        --vocab 32000 --layers 8      # the benchmark's Llama (fp32 weights, ~3 GB)
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hotcompile  # noqa: F401 - registers backend="hot"
import hotcompile.passes.rewrite  # noqa: F401
from hotcompile.compat import import_module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=0, help="MLP width (default 2x hidden)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    rw = sys.modules["hotcompile.passes.rewrite"]  # the package exports a function of that name
    share = rw._share_abc
    pieces: list[list[list[str]]] = []

    def record(items: list[list]) -> dict:
        groups = share(items)  # the rewrite's own grouping by the x a layer reads
        pieces.append([[item[3].name for item in g] for g in groups.values()])
        return groups

    rw._share_abc = record
    tf = import_module("transformers")
    cfg = tf.LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate or 2 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, vocab_size=args.vocab, max_position_embeddings=64,
        use_cache=False, attn_implementation="sdpa",
    )  # fmt: skip
    model = DDP(tf.LlamaForCausalLM(cfg), bucket_cap_mb=args.bucket_mb)
    step = torch.compile(model, backend="hot", options={"compiler": "aot_eager"})
    ids = torch.randint(0, args.vocab, (1, 16))
    step(input_ids=ids, labels=ids).loss.backward()
    dist.destroy_process_group()
    for i, groups in enumerate(pieces):
        print(f"piece {i}: " + "; ".join(" + ".join(g) for g in groups))


if __name__ == "__main__":
    main()

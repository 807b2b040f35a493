"""The speed gate's verdict on a Llama block's layers, with the share of x's ABC shown.

q/k/v (and gate/up) read one x and, when all take HOT, quantize it once
(``autograd._native_compress_once``); the gate charges each its share
(``gate.Shape.x_readers``) and plans a group whose layers do not all take HOT so charged with
the whole ABC each (``hotcompile.passes.rewrite._share_abc``), the plan's reason saying what
the share would have given. This compiles one block of the benchmark's Llama (hidden 2048,
MLP 8192, 16 heads, 4 × 2048 tokens, bf16 autocast) with ``backend="hot"``, runs one training
step and prints every layer's plan (needs CUDA and transformers):

    python3 experiments/qkv_share_gate.py
"""

from __future__ import annotations

import torch
import transformers

import hotcompile
import hotcompile.backend


def main() -> None:
    cfg = transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=1, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).cuda()
    ids = torch.randint(0, cfg.vocab_size, (4, 2048), device="cuda")
    step = torch.compile(model, backend="hot")
    with torch.autocast("cuda", torch.bfloat16):
        out = step(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, hotcompile "
          f"{hotcompile.__version__}")  # fmt: skip
    for p in hotcompile.backend.plans():
        print(f"{p.name}: {p.path}; {p.speedup_text()}; {p.reason or '-'}")


if __name__ == "__main__":
    main()

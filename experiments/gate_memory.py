"""Does the speed gate's compile-time timing leave CUDA memory allocated? (CUDA only)

With no HOT layer in the graph (compiled as plain inductor), HOT's step still had a 4-5%
higher peak than inductor's on the H100 (ViT-B/16, GPT-2; 2026-11-24). The gate allocates a
layer's g_y, x and W and captures both backwards into a CUDA graph at compile time; this prints
``torch.cuda.memory_allocated`` (MiB) before and after one measurement of ViT-B's fc1 shape
and after a plain captured GEMM.

    python experiments/gate_memory.py
"""

import gc

import torch

from hotcompile.lowering import gate

gate._load = lambda: {}  # no disk cache
dev = torch.device("cuda")


def mb():
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() / 2**20


print("start", mb())
s = gate.Shape(L=25216, O=3072, I=768, N=128, S=197, rows=(1,), signs=True)
print(gate.measure(s, dev).describe(), "after measure", mb())
g = torch.randn(1000, 1000, device=dev)


def f():
    return g @ g


print("graph_us", gate._graph_us(f), "after plain graph", mb())

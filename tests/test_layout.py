"""``hotcompile.passes.layout``: which nodes the post-grad pass pins against padding.

The bug it prevents needs CUDA (``tests/test_lowering_gpu.py::test_padding_keeps_gradients``);
here the marking itself, on hand-built post-grad graphs with the node kinds inductor sees.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from hotcompile.passes.layout import (
    DISLIKE,
    REALIZE,
    could_pad,
    pin_kernel_layouts,
    realize_kernel_inputs,
)

aten = torch.ops.aten


def _kernel(g: torch.fx.Graph, **tensors: torch.fx.Node) -> torch.fx.Node:
    """A Triton-kernel wrapper node as inductor's post-grad graph holds it."""
    return g.call_function(
        torch.ops.higher_order.triton_kernel_wrapper_mutation,
        (),
        {"kernel_idx": 0, "constant_args_idx": 0, "grid": [(1, 1, 1)],
         "tma_descriptor_metadata": {}, "kwargs": tensors},
    )  # fmt: skip


def _val(node: torch.fx.Node, *shape: int, dtype: torch.dtype = torch.float32) -> torch.fx.Node:
    node.meta["val"] = torch.empty(shape, dtype=dtype, device="meta")
    return node


def _marked(g: torch.fx.Graph) -> set[str]:
    return {n.name for n in g.nodes if n.meta.get(DISLIKE)}


def test_an_unaligned_kernel_input_its_views_and_their_readers_are_pinned() -> None:
    # the GPT-2 head of the repro: the logits' gradient [2, 32, 2051] feeds HOT's kernel and,
    # through a view, an mm (the reader that froze it padded on torch 2.11)
    g = torch.fx.Graph()
    logits, w, other_in = g.placeholder("logits"), g.placeholder("w"), g.placeholder("o")
    grad = _val(g.call_function(aten.mul.Tensor, (logits, 2.0)), 2, 32, 2051)
    flat = _val(g.call_function(aten.view.default, (grad, [64, 2051])), 64, 2051)
    tr = g.call_function(aten.t.default, (flat,))
    mm = g.call_function(aten.mm.default, (flat, w))
    mm_t = g.call_function(aten.mm.default, (tr, w))
    codes = _val(g.call_function(aten.empty.memory_format, ([2051, 32],)), 2051, 32)
    as3d = g.call_function(aten.view.default, (grad, [2, 32, 2051]))
    k = _kernel(g, x=as3d, out=codes)
    unrelated = g.call_function(aten.add.Tensor, (other_in, 1.0))
    g.output((mm, mm_t, k, unrelated))

    n = pin_kernel_layouts(g)
    # codes [2051, 32] int8 cannot be padded (row stride 32): it and its readers stay free
    want = {grad.name, flat.name, tr.name, mm.name, mm_t.name, k.name, as3d.name}
    assert _marked(g) == want and n == len(want)
    assert logits.name not in _marked(g) and unrelated.name not in _marked(g)


def test_an_aligned_kernel_input_leaves_its_readers_free_to_pad() -> None:
    # GPT-2's head input [tokens, 768] feeds HOT's ABC kernel and the logits' mm: pinning the
    # mm would keep the [tokens, 50257] logits unpadded, so an aligned buffer is left alone
    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    h = _val(g.call_function(aten.relu.default, (x,)), 8192, 768, dtype=torch.bfloat16)
    logits = _val(g.call_function(aten.mm.default, (h, w)), 8192, 50257, dtype=torch.bfloat16)
    k = _kernel(g, x=h)
    g.output((logits, k))
    pin_kernel_layouts(g)
    assert _marked(g) == {k.name}


def test_could_pad_follows_inductors_rule() -> None:
    g = torch.fx.Graph()
    node = g.placeholder("x")
    cases = [
        ((64, 2051), torch.float32, True),  # row stride 2051 > 1024, not a multiple of 32
        ((64, 2048), torch.float32, False),  # aligned
        ((64, 1000), torch.float32, False),  # below the stride threshold
        ((8, 3, 50257), torch.bfloat16, True),
        ((3, 50257, 1), torch.int8, True),  # the unaligned stride is an outer one
        ((50257,), torch.float32, False),  # one dimension: nothing to pad
    ]
    for shape, dtype, want in cases:
        _val(node, *shape, dtype=dtype)
        assert could_pad(node) == want, (shape, dtype)
    del node.meta["val"]
    assert could_pad(node)  # unknown: assume inductor may pad it


def test_split_outputs_and_a_reader_of_a_sibling_are_pinned() -> None:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    buf = _val(g.call_function(aten.relu.default, (x,)), 16, 2051)
    parts = g.call_function(aten.split.Tensor, (buf, 8))
    first = g.call_function(operator.getitem, (parts, 0))
    second = g.call_function(operator.getitem, (parts, 1))
    reader = g.call_function(aten.sum.default, (second,))
    k = _kernel(g, x=first)
    g.output((k, reader))
    pin_kernel_layouts(g)
    assert {buf.name, parts.name, first.name, second.name, reader.name, k.name} <= _marked(g)


def test_a_graph_without_hot_kernels_is_left_alone() -> None:
    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    g.output(g.call_function(aten.mm.default, (g.call_function(aten.view.default, (x, [4, 4])), w)))
    assert pin_kernel_layouts(g) == 0 and not _marked(g)


def test_a_gradient_both_kernels_read_is_written_once() -> None:
    # the SwiGLU backward of the Llama: g_gate feeds HQ's kernel (through an [L, O] view) and
    # the g_w codes' kernel; inductor gave each kernel a copy of its own (two stores per value)
    g = torch.fx.Graph()
    gy_in, gate, up = g.placeholder("g"), g.placeholder("gate"), g.placeholder("up")
    g_gate = _val(g.call_function(aten.mul.Tensor, (gy_in, gate)), 4, 64, 512)
    g_up = _val(g.call_function(aten.mul.Tensor, (gy_in, up)), 4, 64, 512)
    flat = _val(g.call_function(aten.view.default, (g_gate, [256, 512])), 256, 512)
    out = _val(g.call_function(aten.empty.memory_format, ([256, 512],)), 256, 512)
    k1 = _kernel(g, gy=flat, codes=out)
    k2 = _kernel(g, x=g_gate, codes=out)
    k3 = _kernel(g, gy=g_up, codes=out)  # one reader only: its copy is its only store
    k4 = _kernel(g, gy=gy_in, codes=out)  # a graph input is a buffer already
    g.output((k1, k2, k3, k4))

    assert realize_kernel_inputs(g) == 1
    assert [n.name for n in g.nodes if n.meta.get(REALIZE)] == [g_gate.name]
    assert realize_kernel_inputs(g) == 0  # idempotent

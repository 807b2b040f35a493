"""``hotcompile.passes.layout``: which nodes the post-grad pass pins against padding.

The bug it prevents needs CUDA (``tests/test_lowering_gpu.py::test_padding_keeps_gradients``);
here the marking itself, on hand-built post-grad graphs with the node kinds inductor sees.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from hotcompile.passes.layout import DISLIKE, pin_kernel_layouts

aten = torch.ops.aten


def _kernel(g: torch.fx.Graph, **tensors: torch.fx.Node) -> torch.fx.Node:
    """A Triton-kernel wrapper node as inductor's post-grad graph holds it."""
    return g.call_function(
        torch.ops.higher_order.triton_kernel_wrapper_mutation,
        (),
        {"kernel_idx": 0, "constant_args_idx": 0, "grid": [(1, 1, 1)],
         "tma_descriptor_metadata": {}, "kwargs": tensors},
    )  # fmt: skip


def _marked(g: torch.fx.Graph) -> set[str]:
    return {n.name for n in g.nodes if n.meta.get(DISLIKE)}


def test_a_kernel_input_its_views_and_their_readers_are_pinned() -> None:
    # the GPT-2 head: logits' gradient feeds HOT's kernel and, through a view, an mm
    g = torch.fx.Graph()
    logits, w, other_in = g.placeholder("logits"), g.placeholder("w"), g.placeholder("o")
    grad = g.call_function(aten.mul.Tensor, (logits, 2.0))
    flat = g.call_function(aten.view.default, (grad, [64, 2051]))
    tr = g.call_function(aten.t.default, (flat,))
    mm = g.call_function(aten.mm.default, (flat, w))
    mm_t = g.call_function(aten.mm.default, (tr, w))
    codes = g.call_function(aten.empty.memory_format, ([2051, 32],))
    as3d = g.call_function(aten.view.default, (grad, [2, 32, 2051]))
    k = _kernel(g, x=as3d, out=codes)
    unrelated = g.call_function(aten.add.Tensor, (other_in, 1.0))
    g.output((mm, mm_t, k, unrelated))

    n = pin_kernel_layouts(g)
    want = {grad.name, flat.name, tr.name, mm.name, mm_t.name, codes.name, k.name, as3d.name}
    assert _marked(g) == want and n == len(want)
    # what HOT does not touch may still be padded: the forward logits, unrelated work
    assert logits.name not in _marked(g) and unrelated.name not in _marked(g)


def test_split_outputs_and_opaque_hot_ops_count() -> None:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    buf = g.call_function(aten.relu.default, (x,))
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

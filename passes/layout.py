"""Pin the layout of every buffer HOT's kernels read or write, so inductor may pad the rest.

Inductor's comprehensive padding rounds the row stride of unaligned buffers up (GPT-2's
``[tokens, 50257]`` logits to 50264) — worth ~1 ms a step on GPT-2 small's head. It decides a
buffer's padding when the buffer's layout is frozen, and asks the node *being lowered at that
moment* whether it dislikes padding (``meta["dislike_padding"]``). User-defined Triton kernels
(HOT's ``triton_op`` kernels) dislike it: their stride arguments were traced as constants.
But on torch 2.11 inductor marks only the kernel node itself, not the nodes around it, so:

    buf1 = logits' gradient              (a pointwise kernel, flexible layout)
    mm(view(buf1, (64, 2051)))           lowered first: the view freezes buf1 *padded*, (2080, 1)
    hla_quant_kernel(buf1, ...)          buf1 allocated unpadded, (2051, 1): the mm's view is stale

and the mm read rows at stride 2080 from a buffer written at stride 2051: every gradient
upstream of the head was garbage (``experiments/padding_native.py``; the generated code is
in ``experiments/results/padding_native_h100.md``). The same stale layout fed ``hq_grad_input`` on
the ``ops`` path (``experiments/results/gpt2_nan_gpu``).

This post-grad pass marks, for every tensor a HOT kernel takes whose buffer padding could
change (a row stride above inductor's threshold and not aligned), the buffer behind it (walking
back through views), every view of that buffer and every consumer of those views as disliking
padding. Whoever freezes such a buffer then freezes it unpadded, and all its readers agree.
A consumer so marked pads nothing it lowers (its own output included), which is why aligned
buffers are left alone: GPT-2's head input ``[tokens, 768]`` feeds HOT's ABC kernel and the
logits' mm, and the logits ``[tokens, 50257]`` stay padded. Buffers no HOT kernel touches
still get padded.

Verified on the H100 (torch 2.11): with padding on, the one-block GPT-2 of the repro pads 2
buffers and its gradients were 2.5–310× off without this pass, equal to ``aot_eager``'s
(5.8e-6) with it (``experiments/results/padding_native_h100.md``).

The same pass has inductor write once what two of HOT's kernels read. Inductor lowers a
user-defined Triton kernel with its inputs at the traced strides
(``triton_kernel_default_layout_constraint="needs_fixed_stride_order"``): an input that is a
buffer not yet written (the output of a pointwise kernel inductor has still to generate) is
given a *copy* of its own at those strides, which inductor fuses into the producer as one more
store. A gradient that feeds both HQ's kernel (g_x) and the g_w codes' kernel was therefore
stored twice by its producer — in the Llama's SwiGLU backward, g_gate and g_up each twice:
315 µs instead of 223 µs per block (``experiments/results/step_code_llama_h100.md``).
:func:`realize_kernel_inputs` marks such a tensor ``inductor_realize_to_strides``: inductor
writes it once, at its traced strides, as soon as it is lowered, and every kernel reads that
buffer.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

#: the ``node.meta`` key inductor's ``Layout._pad_strides`` reads (torch 2.11–2.14)
DISLIKE = "dislike_padding"
#: namespaces of HOT's opaque ops (the ``ops`` path); ``triton_op`` bodies are inlined into
#: the graph as Triton-kernel wrapper nodes
HOT_NAMESPACES = ("hotcompile", "hotcompile_lowering")


def _is_kernel(node: torch.fx.Node) -> bool:
    """A node that runs a user-defined Triton kernel or one of HOT's opaque ops."""
    if node.op != "call_function":
        return False
    from torch._higher_order_ops import triton_kernel_wrap as tkw

    target = node.target
    if isinstance(target, (tkw.TritonKernelWrapperMutation, tkw.TritonKernelWrapperFunctional)):
        return True
    return isinstance(target, torch._ops.OpOverload) and target.namespace in HOT_NAMESPACES


def _is_view(node: torch.fx.Node) -> bool:
    """A node whose output aliases its first input's storage (no buffer of its own)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:  # an element of a view op's list (split, unbind)
        return bool(node.all_input_nodes) and _is_view(node.all_input_nodes[0])
    return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view


def _storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node that owns ``node``'s buffer: back through views to the first non-view."""
    while _is_view(node) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _views_of(root: torch.fx.Node) -> list[torch.fx.Node]:
    """``root`` and every node that views its buffer, transitively."""
    seen, todo = {root}, [root]
    while todo:
        for user in todo.pop().users:
            if user not in seen and _is_view(user):
                seen.add(user)
                todo.append(user)
    return list(seen)


def could_pad(node: torch.fx.Node) -> bool:
    """Whether comprehensive padding could change the strides of ``node``'s buffer: inductor
    (``Layout._pad_strides``) pads a dense stride above ``padding_stride_threshold`` that is
    not a multiple of ``padding_alignment_bytes``. A node without a recorded value counts as
    paddable; one that holds no tensor (a size) as not."""
    if "val" not in node.meta:
        return True
    val = node.meta["val"]
    if not isinstance(val, torch.Tensor):
        return False
    from torch._inductor import config

    align = max(1, config.padding_alignment_bytes // val.dtype.itemsize)
    dims = sorted(range(val.dim()), key=lambda d: val.stride()[d])  # innermost first
    stride = 1
    for inner in dims[:-1]:
        stride = stride * val.shape[inner]
        if not isinstance(stride, int):
            return True  # symbolic: inductor may pad it (pad_dynamic_shapes)
        if stride > config.padding_stride_threshold and stride % align:
            return True
    return False


def pin_kernel_layouts(graph: torch.fx.Graph) -> int:
    """Mark the buffers HOT's kernels touch, their views and their readers as disliking
    padding (see the module docstring). Returns how many nodes it marked."""
    marked: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if not _is_kernel(node):
            continue
        marked.add(node)
        for arg in node.all_input_nodes:
            root = _storage_root(arg)
            if not could_pad(root):
                continue
            for view in _views_of(root):
                marked.add(view)
                marked.update(view.users)
    for node in marked:
        node.meta[DISLIKE] = True
    return len(marked)


#: the ``node.meta`` key with which inductor's ``GraphLowering.run_node`` realizes a node's
#: result right after lowering it, at its traced strides (torch 2.11–2.14)
REALIZE = "inductor_realize_to_strides"


def realize_kernel_inputs(graph: torch.fx.Graph) -> int:
    """Mark every tensor read by one of HOT's kernels and by anything else (another of its
    kernels, a view of it, a GEMM) for inductor to write once, at its traced strides, before
    its readers are lowered (see the module docstring): no reader then gets a copy of its own.
    Graph inputs and constants already are buffers. Returns how many nodes it marked."""
    marked = 0
    for node in graph.nodes:
        if not _is_kernel(node):
            continue
        for arg in node.all_input_nodes:
            root = _storage_root(arg)
            if root.op != "call_function" or not root.all_input_nodes or root.meta.get(REALIZE):
                continue  # a graph input, a constant or a fresh allocation is a buffer already
            val = root.meta.get("val")
            if not isinstance(val, torch.Tensor):
                continue
            readers = {u for v in _views_of(root) for u in v.users if not _is_view(u)}
            if len(readers) > 1:
                root.meta[REALIZE] = True
                marked += 1
    return marked

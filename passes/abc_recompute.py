"""ABC where it saves nothing: recompute the compression in the backward instead of saving it.

ABC saves ``Q8(T x)`` instead of x — a win only when x would otherwise be saved *for this
layer alone*. When the backward reads x (or a tensor x is a view or copy of) anyway — the
attention output that feeds a transformer's ``proj``, which the attention backward also reads
— the partitioner saves both that tensor and the compressed copy: ABC then *adds* memory
(an INT8 half-size copy per such layer; ViT-B/16 at batch 128: 9.7 MB per block).

This joint-graph pass finds those layers before the min-cut partitioner runs: for every
``hotcompile.abc_compress`` it walks up its input through view and copy ops (view, reshape,
permute, transpose, clone, ...) to the tensor they start from; if a backward node reads that
tensor, the chain and the compression are tagged ``MUST_RECOMPUTE`` (the checkpoint policy
the partitioner honours), so the backward re-derives the codes from the tensor it has anyway
(a copy and one ``abc_compress``: two memory-bound passes over x) and the forward saves no
codes. With ``"unary"`` the walk also goes through elementwise ops — an MLP's activation
function, whose backward reads fc1's output anyway, so fc2's codes (the largest ABC buffer
of a transformer block) are recomputed from it, trading an activation and an
``abc_compress`` per block in the backward for that buffer's bytes (ViT-B/16, H100: saved
activations 0.76× → 0.70× of inductor's, step +1.6% under CUDA graphs). ``"views"`` follows
view/copy chains only (a copy at most in the backward); ``"off"`` keeps the partitioner's own
choice everywhere. ``HotConfig.abc_recompute="auto"`` (the default) is ``"unary"`` on the
ops path and, on the native path, where recomputing moves Triton quantizers into the
backward (step time), ``"unary"`` under ``prefer="memory"`` and ``"off"`` otherwise
(``HotConfig.abc_recompute_modes``). On the native path a compression is several nodes (a
max-abs in ATen, Triton kernel calls), found by the number ``hotcompile.autograd`` writes in
their ``meta["custom"]`` while it traces them.

Runs as inductor's ``joint_custom_post_pass`` (and before min-cut in
``hotcompile.backend.aot_decomp_partition``, so the graph-diff tool shows the same split).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from hotcompile.config import ABC_RECOMPUTE

aten = torch.ops.aten

#: ops whose output is a view or plain copy of their first argument
_VIEW_OR_COPY = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.permute.default,
    aten.transpose.int,
    aten.t.default,
    aten.clone.default,
    aten.alias.default,
    aten.expand.default,
    aten.squeeze.dim,
    aten.unsqueeze.default,
}
_CLONE = aten.clone.default
_CONVERT = torch.ops.prims.convert_element_type.default


def _backward_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes of the joint graph that depend on a tangent (the backward's nodes)."""
    bw: set[fx.Node] = set()
    for node in graph.nodes:  # topological order: inputs come first
        if node.op == "placeholder":
            if node.name.startswith("tangents"):
                bw.add(node)
        elif node.op != "output" and any(a in bw for a in node.all_input_nodes):
            bw.add(node)
    return bw


def _pointwise(node: fx.Node) -> bool:
    """An elementwise op (an activation function, a dtype cast, a product of two tensors)."""
    target = node.target
    return node.op == "call_function" and (
        target is _CONVERT
        or (isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags)
    )


#: the most nodes :func:`_region` walks up from one layer's input (a GELU is ~8 nodes)
MAX_REGION = 32


def _region(
    x: fx.Node, elementwise: bool, stop: set[fx.Node] = frozenset()
) -> tuple[list[fx.Node], list[fx.Node]] | None:
    """``(nodes, leaves)``: the nodes x is computed by from view/copy ops (and, with
    ``elementwise``, elementwise ops, the dequantization of saved codes among them), walking up from
    x, and the tensors they start from; a node of ``stop`` (codes saved in place of their
    input) is where a walk starts, never walked through. None when the region grows past
    ``MAX_REGION`` nodes."""
    nodes: list[fx.Node] = []
    leaves: list[fx.Node] = []
    stack, seen = [x], {x}
    while stack:
        n = stack.pop()
        walk = (
            n not in stop
            and n.op == "call_function"
            and (n.target in _VIEW_OR_COPY or (elementwise and _pointwise(n)))
        )
        if not walk:
            leaves.append(n)
            continue
        nodes.append(n)
        if len(nodes) > MAX_REGION:
            return None
        inputs = n.all_input_nodes if n.target not in _VIEW_OR_COPY else [n.args[0]]
        for a in inputs:
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return nodes, leaves


def _forward_nodes(graph: fx.Graph, bw: set[fx.Node]) -> set[fx.Node]:
    """The forward's own computation: every node the forward outputs depend on (the joint
    graph returns the forward outputs and the gradients; the gradients depend on tangents)."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    stack = [a for a in out.all_input_nodes if a not in bw]
    seen = set(stack)
    while stack:
        for a in stack.pop().all_input_nodes:
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return seen


def _read_by_backward(
    root: fx.Node, fw: set[fx.Node], region: set[fx.Node], skip: set[fx.Node]
) -> bool:
    """Whether the backward reads ``root``: a node outside the forward's computation (and
    outside ``skip``, the compression itself) reads it directly, through a view of it
    (``aten.alias`` is how the attention ops save their output), or through a node of
    ``region`` (an activation function's backward reads the function's input, or its own
    intermediate values, which the partitioner saves as, or recomputes from, ``root``)."""
    stack, seen = [root], {root}
    while stack:
        n = stack.pop()
        for u in n.users:
            if u in seen or u in skip:
                continue
            if u not in fw and u not in region:
                return True
            view = u.op == "call_function" and u.target in _VIEW_OR_COPY and u.target is not _CLONE
            if view or u in region:
                seen.add(u)
                stack.append(u)
    return False


def tag_abc_recompute(graph: fx.Graph, mode: str | tuple[str, str] = "unary") -> list[str]:
    """Tag the ABC compressions whose input the backward can re-derive from tensors it reads
    anyway as recomputed (see the module docstring). ``mode``: ``"views"`` follows view/copy
    ops only, ``"unary"`` also elementwise ops (an activation function: fc2's input is
    recomputed from fc1's output, which the activation's backward reads; SwiGLU's from both
    of its inputs), ``"off"`` tags nothing; a pair: the ops path's mode and the native
    path's (``HotConfig.abc_recompute_modes``). Returns the names of the tagged compressions."""
    from torch.utils.checkpoint import CheckpointPolicy

    modes = (mode, mode) if isinstance(mode, str) else tuple(mode)
    for m in modes:
        if m not in ABC_RECOMPUTE or m == "auto":
            valid = tuple(v for v in ABC_RECOMPUTE if v != "auto")
            raise ValueError(f"abc_recompute must be one of {valid}, got {m!r}")
    if modes == ("off", "off"):
        return []

    codes = _saved_codes_nodes(graph)
    compressions = _compressions(graph, codes)
    if not compressions:
        return []
    bw = _backward_nodes(graph)
    fw = _forward_nodes(graph, bw)
    tagged = []
    for xs, members, native in compressions:
        mode_here = modes[1] if native else modes[0]
        if mode_here == "off" or any(n in bw for n in members):
            continue
        regions = [_region(x, elementwise=mode_here == "unary", stop=codes) for x in xs]
        if any(r is None for r in regions):
            continue
        inside = [n for r in regions for n in r[0]]
        leaves = [n for r in regions for n in r[1]]
        skip = set(members) | codes
        if not all(_read_by_backward(leaf, fw, set(inside), skip) for leaf in leaves):
            continue
        for n in [*inside, *members]:
            n.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
        tagged.append(members[0].name)
    return tagged


def _saved_codes_nodes(graph: fx.Graph) -> set[fx.Node]:
    """The forward's nodes that make codes saved in place of their input
    (:data:`hotcompile.autograd.SAVED_CODES`: a SwiGLU's gate and up outputs under
    ``abc_swiglu="fp8"``). They are outside the forward's outputs' computation, so without
    this they would count as the backward reading that input: down's ABC codes were then
    recomputed from the bf16 outputs, which were saved again (H100 Llama, 2026-11-27). The
    backward's nodes carry the same mark (AOT copies it from the forward node of their
    autograd sequence number) and are left out."""
    from hotcompile.autograd import SAVED_CODES

    return {
        n
        for n in graph.nodes
        if (n.meta.get("custom") or {}).get(SAVED_CODES)
        and n.meta.get("partitioner_tag") == "is_forward"
    }


def _compressions(
    graph: fx.Graph, codes: set[fx.Node] = frozenset()
) -> list[tuple[list[fx.Node], list[fx.Node], bool]]:
    """Each ABC compression of the joint graph as ``(what it reads, its nodes, native)``: on the
    ops path an ``abc_compress`` node and the getitems of its codes and scale; on the native
    path the nodes traced under one :data:`hotcompile.autograd.ABC_GROUP` number, when they
    read one tensor from outside, or only ``codes`` (:func:`_saved_codes_nodes`: down's ABC
    derived from a SwiGLU's saved codes, ``hotcompile.autograd._native_compress_swiglu``).
    A compression with HLA's signs also reads the signs: left alone."""
    from hotcompile.autograd import ABC_GROUP

    abc = torch.ops.hotcompile.abc_compress.default
    found: list[tuple[list[fx.Node], list[fx.Node], bool]] = []
    groups: dict[int, list[fx.Node]] = {}
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is abc:
            found.append(([n.args[0]], [n, *n.users], False))
        group = (n.meta.get("custom") or {}).get(ABC_GROUP)
        if group is not None:
            groups.setdefault(group, []).append(n)
    for members in groups.values():
        inside = set(members)
        reads = {
            a
            for n in members
            for a in n.all_input_nodes
            if a not in inside
            and a.op != "get_attr"
            and isinstance(a.meta.get("val"), torch.Tensor)
        }  # (a constant, a get_attr, is in both graphs)
        if len(reads) == 1 or (reads and reads <= codes):
            found.append((sorted(reads, key=lambda a: a.name), members, True))
    return found


def tag_recompute_twins(graph: fx.Graph) -> list[str]:
    """Tag the CSE twins of recomputed nodes: an untagged node the partitioner's CSE would
    merge with a ``MUST_RECOMPUTE`` one (the same op on the same — or merged — arguments).

    The min-cut partitioner CSEs the joint graph first and keeps the first of each set of
    twins, with its own tags. Twins arise where a computation traced in the backward repeats
    the forward's: the weight's late codes (``HotConfig.weight_codes="backward"``) start from
    the parameter's cast to the autocast dtype, the very op autocast's forward GEMM reads, and
    every Triton quantizer zero-fills a small word buffer (``full``) for its atomics, as the
    forward's do. Kept untagged, the forward's cast was saved (the bf16 copy of every weight:
    two bytes a weight where the codes were one). (The late INT4 codes also differed from the
    forward's under inductor on the H100; a kept word buffer would have explained it, but the
    forward codes compiled twice differ as much: SAWB's atomic float sums in launch order,
    ``experiments/results/late_codes_grads_h100.txt``.)
    Tagged, each twin runs in the forward for its own use and again in the backward, from the
    parameter or from nothing. Random ops are left alone (CSE does not merge them). Returns
    the names of the nodes tagged."""
    from torch.fx.node import map_arg
    from torch.utils.checkpoint import CheckpointPolicy

    must = CheckpointPolicy.MUST_RECOMPUTE

    def ours(n: fx.Node) -> bool:  # not activation checkpointing's (it sets an ac_graph_id)
        return n.meta.get("recompute") is must and "ac_graph_id" not in n.meta

    if not any(ours(n) for n in graph.nodes):  # the default path tags nothing: no classes
        return []
    canon: dict[fx.Node, object] = {}
    classes: dict[str, list[fx.Node]] = {}
    for n in graph.nodes:
        seeded = isinstance(n.target, torch._ops.OpOverload) and (
            torch.Tag.nondeterministic_seeded in n.target.tags
        )
        if n.op != "call_function" or seeded:
            canon[n] = n.name
            continue
        args = map_arg((n.args, n.kwargs), lambda a: canon[a])
        members = classes.setdefault(f"{n.target}|{args!r}", [])
        members.append(n)
        canon[n] = id(members)  # the class's number: keys stay short however deep the graph
    tagged = []
    for members in classes.values():
        # hotcompile's own tags only: an activation-checkpointing region's nodes and their
        # twins keep the partitioner's checkpoint rules
        if len(members) < 2 or not any(ours(m) for m in members):
            continue
        for m in members:
            if m.meta.get("recompute") is None and "ac_graph_id" not in m.meta:
                m.meta["recompute"] = must
                tagged.append(m.name)
    return tagged


def tag_recompute(graph: fx.Graph, mode: str | tuple[str, str] = "unary") -> list[str]:
    """The joint graph's recompute tags before the partitioner: :func:`tag_abc_recompute`
    (``mode`` as ``HotConfig.abc_recompute_modes``), then :func:`tag_recompute_twins`."""
    return tag_abc_recompute(graph, mode) + tag_recompute_twins(graph)

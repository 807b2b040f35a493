"""``hotcompile.graphdiff``: what the hot backend changes in the compiled training graphs.

HOT's effect is invisible from the outside: the model computes the same forward, and the
compiled backward is an opaque callable. To check what happened to a model, this tool compiles
it twice on small real inputs — plain, and with the hot rewrite — through the *same*
AOTAutograd pipeline as ``compiler="aot_eager"`` (inductor's decompositions and the min-cut
partitioner, no code generation), so the forward/backward split and the saved tensors are the
ones inductor would get. It then reports, per linear/conv layer:

- the forward and backward nodes before and after (aten nodes are attributed to layers through
  ``nn_module_stack``, backward nodes through ``seq_nr`` and the ``layer`` argument of the
  ``torch.ops.hotcompile`` ops);
- the g_x quantizer chosen and the rule that chose it (LQS, a plan, or the config);
- the saved-tensor table before and after (name, producing layer, shape, dtype, bytes,
  compressed or not);
- every layer whose full-precision input is still saved, and why: a skipped or excluded layer,
  activation checkpointing, another consumer that needs the tensor anyway, a graph input that
  is alive regardless, or the partitioner finding the compressed operand more expensive.

The graph code is printed with normalised node names (``fc1.addmm`` rather than ``addmm_3``),
so the unified diff shows real changes instead of renumbering noise. Output as ANSI text,
JSON, a self-contained HTML page (``hotcompile.htmlreport``) and a ``tlparse`` artifact
under ``TORCH_TRACE``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import operator
import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import torch
import torch.nn as nn

from hotcompile.cliargs import (
    add_library_model_args,
    library_model,
    load_factory,
    parse_input_spec,
    parse_option,
)
from hotcompile.config import HotConfig
from hotcompile.diffdata import (
    GraphDiffData,
    GraphPair,
    LayerDiff,
    SavedValue,
    human_bytes,
)
from hotcompile.passes import rewrite

__all__ = [
    "GraphDiff",
    "LayerDiff",
    "SavedValue",
    "add_parser",
    "diff",
    "example_block",
    "example_cnn",
]

#: aten ops that only re-view their first argument: a saved view of x *is* x.
_VIEW_OPS = {
    "view",
    "_unsafe_view",
    "reshape",
    "permute",
    "t",
    "transpose",
    "expand",
    "alias",
    "squeeze",
    "unsqueeze",
    "as_strided",
    "slice",
    "select",
    "contiguous",
    "clone",
}
_LAYER_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d)
_DTYPE_SHORT = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "b8",
}


# --------------------------------------------------------------------------- capture


@dataclasses.dataclass
class _Capture:
    """One Dynamo graph as AOTAutograd compiled it: the joint split into forward/backward."""

    dynamo: torch.fx.GraphModule
    example_inputs: list[Any]
    plans: list[Any]
    fw: torch.fx.GraphModule | None = None
    bw: torch.fx.GraphModule | None = None
    num_fwd_outputs: int = 0


def _recording_backend(config: HotConfig | None, captures: list[_Capture]) -> Callable:
    """A backend doing what ``HotBackend(compiler="aot_eager")`` does, recording the graphs.

    With ``config=None`` it is plain ``aot_eager_decomp_partition``; otherwise the Dynamo graph
    is rewritten first. The partitioner is wrapped to keep the forward and backward modules and
    the number of user outputs (the saved values are the forward outputs after them).
    """
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition

    from hotcompile.backend import aot_decomp_partition

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        plans = rewrite(gm, config, example_inputs) if config is not None else []
        cap = _Capture(gm, list(example_inputs), list(plans))
        captures.append(cap)

        def partition(joint, joint_inputs, **kwargs):
            fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
            cap.fw, cap.bw = fw, bw
            cap.num_fwd_outputs = int(kwargs.get("num_fwd_outputs", 1))
            return fw, bw

        def inference(gm_inf: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable:
            cap.fw = gm_inf
            cap.num_fwd_outputs = len(_outputs(gm_inf))
            return make_boxed_func(gm_inf.forward)

        mode = config.abc_recompute_modes if config is not None else "off"
        return aot_decomp_partition(gm, example_inputs, partition, inference, mode)

    return backend


def _compile(model: nn.Module, inputs: Sequence[Any], config: HotConfig | None) -> list[_Capture]:
    captures: list[_Capture] = []
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=_recording_backend(config, captures), dynamic=False)
        with torch.enable_grad():
            compiled(*inputs)
    finally:
        torch._dynamo.reset()
    return captures


# --------------------------------------------------------------------------- graph reading


def _outputs(gm: torch.fx.GraphModule) -> list[Any]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    args = out.args[0]
    return list(args) if isinstance(args, (list, tuple)) else [args]


def _op_name(target: Any) -> str:
    """``aten.addmm`` / ``hotcompile.abc_compress`` / ``aten.sum.dim_IntList``."""
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        packet = target._schema.name.split("::")[-1]
        overload = target._overloadname
        return f"{ns}.{packet}" + ("" if overload in ("default", "") else f".{overload}")
    return getattr(target, "__name__", str(target))


def _short_op(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    return getattr(target, "__name__", str(target))


def _is_hot_op(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.namespace == "hotcompile"


def _val(node: torch.fx.Node) -> Any:
    return node.meta.get("val", node.meta.get("example_value"))


def _type_str(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"{_DTYPE_SHORT.get(v.dtype, str(v.dtype).replace('torch.', ''))}{list(v.shape)}"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_type_str(x) for x in v) + ")"
    return type(v).__name__ if v is not None else ""


def _nbytes(v: Any) -> int:
    if not isinstance(v, torch.Tensor):
        return 0
    try:
        return int(v.numel()) * v.element_size()
    except Exception:  # symbolic sizes: not expected with dynamic=False
        return 0


def _module_layer(node: torch.fx.Node) -> str:
    """The module path of a node (``blocks.0.fc1``), or "" for code of the top-level module."""
    if not node.meta.get("nn_module_stack"):
        return ""
    from hotcompile.passes import layer_name

    return layer_name(node)


def _layer_arg(node: torch.fx.Node) -> str | None:
    """The ``layer`` string argument of a ``torch.ops.hotcompile`` op, if it has one."""
    if not _is_hot_op(node.target):
        return None
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name == "layer":
            if i < len(node.args):
                return str(node.args[i])
            if "layer" in node.kwargs:
                return str(node.kwargs["layer"])
    return None


def _root(node: Any) -> Any:
    """Follow view-like ops to the tensor they view: saving a view of x saves x."""
    seen = 0
    while (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and _short_op(node.target) in _VIEW_OPS
        and node.args
        and isinstance(node.args[0], torch.fx.Node)
        and seen < 64
    ):
        node = node.args[0]
        seen += 1
    return node


class _GraphNames:
    """Stable, layer-based names for the nodes of one AOT graph.

    ``addmm_3`` depends on how many addmm came before anywhere in the model; ``fc1.addmm``
    does not, so diffs of the normalised code line up across the two variants.
    """

    def __init__(self) -> None:
        self.names: dict[torch.fx.Node, str] = {}
        self.taken: set[str] = set()

    def add(self, node: torch.fx.Node, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        self.names[node] = name
        return name

    def arg(self, a: Any) -> str:
        if isinstance(a, torch.fx.Node):
            return self.names.get(a, a.name)
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self.arg(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner})"
        if isinstance(a, torch.dtype):
            return str(a)
        if isinstance(a, torch.device):
            return repr(str(a))
        if isinstance(a, float):
            return repr(round(a, 8))
        return repr(a)


@dataclasses.dataclass
class _GraphInfo:
    """One variant's forward and backward, read: node names, layers, saved values."""

    capture: _Capture
    fw_names: _GraphNames
    bw_names: _GraphNames
    fw_layer: dict[torch.fx.Node, str]
    bw_layer: dict[torch.fx.Node, str]
    param_names: dict[torch.fx.Node, str]
    saved: list[torch.fx.Node]
    fw_lines: list[tuple[str, str]]  # (layer, normalised line)
    bw_lines: list[tuple[str, str]]


def _param_map(model: nn.Module) -> dict[int, str]:
    names: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), n)
    for n, b in model.named_buffers(remove_duplicate=False):
        names.setdefault(id(b), n)
    return names


def _read(capture: _Capture, param_ids: dict[int, str]) -> _GraphInfo | None:
    fw, bw = capture.fw, capture.bw
    if fw is None:
        return None
    fw_names, bw_names = _GraphNames(), _GraphNames()
    fw_layer: dict[torch.fx.Node, str] = {}
    params: dict[torch.fx.Node, str] = {}
    seq_layer: dict[int, str] = {}
    n_input = 0
    placeholders = [n for n in fw.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        real = capture.example_inputs[i] if i < len(capture.example_inputs) else None
        pname = param_ids.get(id(real)) if real is not None else None
        if pname is not None:
            params[node] = pname
            fw_names.add(node, pname)
            fw_layer[node] = pname.rpartition(".")[0]
        else:
            fw_names.add(node, f"input{n_input}")
            fw_layer[node] = ""
            n_input += 1
    calls = [n for n in fw.graph.nodes if n.op == "call_function"]
    for node in calls:
        layer = _module_layer(node)
        fw_layer[node] = layer
        if node.meta.get("seq_nr") is not None and layer:
            seq_layer.setdefault(int(node.meta["seq_nr"]), layer)
    fw_of = functools.partial(_get, fw_layer)
    fw_lines = [(fw_layer[n], _line(n, fw_names, fw_layer[n], fw_of)) for n in calls]
    outs = _outputs(fw)
    saved = [o for o in outs[capture.num_fwd_outputs :] if isinstance(o, torch.fx.Node)]
    if bw is None:
        return _GraphInfo(capture, fw_names, bw_names, fw_layer, {}, params, [], fw_lines, [])
    by_name = {n.name: n for n in fw.graph.nodes}
    bw_layer: dict[torch.fx.Node, str] = {}
    n_tangent = 0
    for node in bw.graph.nodes:
        if node.op != "placeholder":
            continue
        src = by_name.get(node.name)
        if src is not None:
            bw_names.add(node, fw_names.names[src])
            bw_layer[node] = fw_layer.get(src, "")
        else:
            bw_names.add(node, f"tangent{n_tangent}")
            bw_layer[node] = ""
            n_tangent += 1
    calls = [n for n in bw.graph.nodes if n.op == "call_function"]
    for node in calls:
        layer = _layer_arg(node)
        if layer is None:
            layer = _module_layer(node)
        if not layer and node.meta.get("seq_nr") is not None:
            layer = seq_layer.get(int(node.meta["seq_nr"]), "")
        if not layer and node.target is operator.getitem:
            layer = bw_layer.get(node.args[0], "")
        bw_layer[node] = layer
    bw_of = functools.partial(_get, bw_layer)
    bw_lines = [(bw_layer[n], _line(n, bw_names, bw_layer[n], bw_of)) for n in calls]
    return _GraphInfo(
        capture, fw_names, bw_names, fw_layer, bw_layer, params, saved, fw_lines, bw_lines
    )


def _exported(node: torch.fx.Node, layer_of: Callable[[torch.fx.Node], str]) -> bool:
    """A value a layer hands to code outside it (its output, or its g_x in the backward)."""
    mine = layer_of(node)
    return any(u.op == "call_function" and layer_of(u) != mine for u in node.users)


def _get(table: dict[torch.fx.Node, str], node: torch.fx.Node) -> str:
    return table.get(node, "")


def _line(
    node: torch.fx.Node,
    names: _GraphNames,
    layer: str,
    layer_of: Callable[[torch.fx.Node], str],
) -> str:
    """``fc1.addmm: f32[32, 256] = aten.addmm(fc1.bias, fc1.view, fc1.permute)``.

    A node read outside its layer is named ``<layer>.out``: with internal numbering only,
    every line downstream of a changed layer would differ in the diff.
    """
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        name = names.add(
            node, f"{names.names.get(node.args[0], node.args[0].name)}[{node.args[1]}]"
        )
        return f"{name}: {_type_str(_val(node))} = {names.arg(node.args[0])}[{node.args[1]}]"
    base = _short_op(node.target)
    if layer and _exported(node, layer_of):
        base = "out"  # what the layer hands on: stable even when its internals change
    name = names.add(node, f"{layer}.{base}" if layer else base)
    args = [names.arg(a) for a in node.args]
    args += [f"{k}={names.arg(v)}" for k, v in node.kwargs.items()]
    return f"{name}: {_type_str(_val(node))} = {_op_name(node.target)}({', '.join(args)})"


# --------------------------------------------------------------------------- results


class GraphDiff(GraphDiffData):
    """The result of :func:`diff`: per-layer and per-graph changes, renderable four ways (the
    data and JSON: :class:`hotcompile.diffdata.GraphDiffData`)."""

    def to_text(self, color: bool | None = None, code: bool = True) -> str:
        """The terminal report; ``color=None`` colours only a tty without ``NO_COLOR``."""
        return _render_text(self, _want_color(color, sys.stdout), code)

    def to_html(self) -> str:
        """One self-contained page: the two graphs side by side, and the tables."""
        from hotcompile.htmlreport import render_html

        return render_html(self)

    def emit_trace_artifact(self) -> None:
        """Log the JSON as a ``tlparse`` artifact (only does work when TORCH_TRACE is set)."""
        torch._logging.trace_structured(
            "artifact",
            metadata_fn=lambda: {"name": "hotcompile_graph_diff", "encoding": "json"},
            payload_fn=lambda: self.to_json(indent=1),  # tlparse wants lines
            expect_trace_id=False,
        )
        torch._logging.trace_structured(
            "artifact",
            metadata_fn=lambda: {"name": "hotcompile_graph_diff_text", "encoding": "string"},
            payload_fn=lambda: self.to_text(color=False),
            expect_trace_id=False,
        )


# --------------------------------------------------------------------------- analysis


def _saved_rows(info: _GraphInfo | None) -> list[SavedValue]:
    if info is None:
        return []
    rows = []
    for node in info.saved:
        v = _val(node)
        if not isinstance(v, torch.Tensor):
            continue
        src = node.args[0] if node.target is operator.getitem else node
        compressed = isinstance(src, torch.fx.Node) and _is_hot_op(src.target)
        if node in info.param_names:
            role = "parameter"
        elif node.op == "placeholder":
            role = "input"
        elif compressed:
            role = "compressed"
        elif v.dtype == torch.bool:
            role = "mask"
        else:
            role = "activation"
        rows.append(
            SavedValue(
                name=info.fw_names.names.get(node, node.name),
                node=node.name,
                layer=info.fw_layer.get(node, ""),
                shape=tuple(int(s) for s in v.shape),
                dtype=str(v.dtype).replace("torch.", ""),
                bytes=_nbytes(v),
                role=role,
                compressed=compressed,
            )
        )
    return rows


def _layer_input(info: _GraphInfo, layer: str) -> torch.fx.Node | None:
    """The activation a layer reads in the AOT forward: its only non-parameter outside arg."""
    fw = info.capture.fw
    assert fw is not None
    members = {n for n in fw.graph.nodes if info.fw_layer.get(n) == layer and n.op != "placeholder"}
    for n in fw.graph.nodes:
        if n not in members:
            continue
        for a in n.all_input_nodes:
            if a in members or a in info.param_names:
                continue
            v = _val(a)
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                return _root(a)
    return None


def _consumers(graph: torch.fx.Graph, start: torch.fx.Node) -> list[torch.fx.Node]:
    """Non-view users of ``start`` in ``graph``, looking through view-like ops."""
    out, stack, seen = [], [start], set()
    while stack:
        n = stack.pop()
        for u in n.users:
            if u in seen or u.op != "call_function":
                continue
            seen.add(u)
            if _short_op(u.target) in _VIEW_OPS or u.target is operator.getitem:
                stack.append(u)
            out.append(u)
    return out


def _has_ac(info: _GraphInfo, layer: str) -> bool:
    """Whether ``layer`` is inside a user's checkpointed region. ``torch.utils.checkpoint``
    marks its nodes with an ``ac_graph_id``; a ``recompute`` tag alone is also what
    ``hotcompile.passes.abc_recompute`` sets on the ops it re-derives ABC codes through."""
    fw = info.capture.fw
    assert fw is not None
    return any(
        info.fw_layer.get(n) == layer and n.meta.get("ac_graph_id") is not None
        for n in fw.graph.nodes
    )


def _input_saved(info: _GraphInfo | None, layer: str, plan: Any, kind: str) -> tuple[bool, str]:
    """Whether the layer's full-precision input is saved in this variant, and why."""
    if info is None or info.capture.bw is None:
        return False, ""
    x = _layer_input(info, layer)
    if x is None:
        return False, ""
    ac = _has_ac(info, layer)
    saved_roots = {_root(s): s for s in info.saved}
    if x not in saved_roots:
        if ac:
            # Not saved at all: the region's forward runs again in the backward. For a HOT
            # layer that is what ABC expects (the compression is recomputed with it), so it
            # is noted, not flagged.
            return False, "recomputed in the backward (activation checkpointing)"
        return False, ""
    s = saved_roots[x]
    xname = info.fw_names.names.get(x, x.name)
    if plan is None:
        return True, "not rewritten: the hot rewrite did not see this call"
    if plan.path == "skipped":
        return True, f"skipped layer: {plan.reason}"
    if ac:
        return True, (
            "activation checkpointing: the forward is recomputed in the backward, so "
            "compression gains nothing there"
        )
    spec = plan.spec
    if spec is not None and (getattr(spec, "gw_exact", False) or plan.path == "exact"):
        return True, "exact weight gradient: autograd's formula needs x itself"
    if spec is not None and not getattr(spec, "abc", True):
        return True, "abc=False: x is kept in full precision and compressed in the backward"
    # who reads the saved tensor in the backward, other than this layer's own HOT path?
    bw = info.capture.bw
    assert bw is not None
    placeholder = next(
        (p for p in bw.graph.nodes if p.op == "placeholder" and p.name == s.name), None
    )
    others: list[str] = []
    own_recompress = False
    if placeholder is not None:
        for u in _consumers(bw.graph, placeholder):
            ulayer = info.bw_layer.get(u, "")
            if _short_op(u.target) in _VIEW_OPS or u.target is operator.getitem:
                continue
            if ulayer == layer or (ulayer.startswith(layer + ":")):
                own_recompress = True
                continue
            desc = f"{ulayer or '(top level)'} {_short_op(u.target)}"
            if desc not in others:
                others.append(desc)
    if others:
        return True, (
            f"another consumer needs it: {', '.join(others[:4])}"
            + (" ..." if len(others) > 4 else "")
            + " reads "
            + xname
            + " in the backward, so the partitioner saves it"
            + (
                " (the compressed copy is saved as well)"
                if _compressed_saved(info, layer)
                else " and recomputes the compression in the backward"
            )
        )
    if x.op == "placeholder":
        return True, (
            "graph input: it is alive anyway, so the partitioner saves it for free and "
            "compresses it in the backward"
        )
    if own_recompress:
        comp = _compressed_bytes_in_bw(info, layer)
        extra = f" ({comp} B compressed vs {_nbytes(_val(x))} B for x)" if comp else ""
        return True, (
            "min-cut partitioner: saving x is cheaper than saving the compressed operand" + extra
        )
    return True, "saved by the partitioner (no backward consumer found)"


def _compressed_saved(info: _GraphInfo, layer: str) -> bool:
    """Whether the forward saves a ``hotcompile`` op's output produced in ``layer``."""
    for s in info.saved:
        src = s.args[0] if s.target is operator.getitem else s
        if isinstance(src, torch.fx.Node) and _is_hot_op(src.target):
            if info.fw_layer.get(src) == layer:
                return True
    return False


def _compressed_bytes_in_bw(info: _GraphInfo, layer: str) -> int:
    bw = info.capture.bw
    assert bw is not None
    total = 0
    for n in bw.graph.nodes:
        if n.op == "call_function" and _short_op(n.target) == "abc_compress":
            if info.bw_layer.get(n) == layer:
                total += sum(_nbytes(v) for v in (_val(n) or ()))
    return total


def _layer_saved(info: _GraphInfo | None, layer: str, rows: list[SavedValue]) -> list[str]:
    """Saved values the layer's backward reads: produced by it, or read by its hot ops."""
    if info is None:
        return []
    names = {r.name for r in rows if r.layer == layer and r.role != "parameter"}
    x = _layer_input(info, layer) if info.capture.fw is not None else None
    if x is not None:  # the layer's input, wherever it was produced (a ReLU, a LayerNorm)
        names |= {
            info.fw_names.names.get(s, s.name)
            for s in info.saved
            if _root(s) is x and s not in info.param_names
        }
    bw = info.capture.bw
    if bw is not None:
        by_canon = {r.name for r in rows}
        for n in bw.graph.nodes:
            if n.op == "call_function" and _is_hot_op(n.target) and info.bw_layer.get(n) == layer:
                for a in n.all_input_nodes:
                    a = _root(a)
                    if a.op == "placeholder":
                        nm = info.bw_names.names.get(a, a.name)
                        if nm in by_canon and not any(
                            r.name == nm and r.role == "parameter" for r in rows
                        ):
                            names.add(nm)
    order = [r.name for r in rows]
    return [n for n in order if n in names]


def _quantizer(plan: Any) -> tuple[str | None, str]:
    """The g_x quantizer of a rewritten layer and the rule that chose it.

    ``plan.quantizer`` is LQS's run-time decision (or ``"lqs (calibrating)"`` before the
    first backward), the plan's, or the config's; ``plan.quantizer_rule`` says which.
    """
    if plan is None or plan.spec is None or plan.path == "skipped":
        return None, ""
    if not plan.spec.gx_quantized:
        return "exact", "g_x unquantized (exact or gx_bits=None)"
    if not plan.needs_gx:
        return None, "no g_x: the layer's input needs no gradient"
    return plan.quantizer, plan.quantizer_rule


def _candidate_layers(info: _GraphInfo | None, model: nn.Module) -> list[tuple[str, str]]:
    """Linear/conv modules the plain graph computes (to catch layers the rewrite never saw)."""
    if info is None or info.capture.fw is None:
        return []
    modules = dict(model.named_modules())
    found: list[tuple[str, str]] = []
    for n in info.capture.fw.graph.nodes:
        layer = info.fw_layer.get(n, "")
        if not layer or any(layer == f for f, _ in found):
            continue
        m = modules.get(layer)
        if isinstance(m, _LAYER_MODULES):
            kind = "linear" if isinstance(m, nn.Linear) else type(m).__name__.lower()
            found.append((layer, kind))
    return found


def _describe_inputs(inputs: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for t in inputs:
        if isinstance(t, torch.Tensor):
            out.append({"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")})
        else:
            out.append({"value": repr(t)})
    return out


def diff(
    model: nn.Module,
    example_inputs: Any,
    config: HotConfig | dict[str, Any] | None = None,
    *,
    trace: bool = True,
) -> GraphDiff:
    """Compile ``model`` plain and with the hot backend; return what changed.

    Args:
        model: the module to inspect. Its parameters are used as they are (nothing is
            updated: only one forward per variant runs, no backward).
        example_inputs: a tensor or a sequence of positional inputs. Keep them small: the
            graphs only depend on their shapes and dtypes, and both variants run them once.
        config: a :class:`HotConfig` or its options dict (default: the paper's settings).
        trace: also log the result as a ``tlparse`` artifact when ``TORCH_TRACE`` is set.

    Both variants go through AOTAutograd with inductor's decompositions and the min-cut
    partitioner, as ``compiler="aot_eager"`` does, so the saved tensors are the ones
    inductor would be handed. Dynamo's caches are reset before and after each compile.
    """
    cfg = config if isinstance(config, HotConfig) else HotConfig.from_options(config)
    inputs = [example_inputs] if isinstance(example_inputs, torch.Tensor) else list(example_inputs)
    param_ids = _param_map(model)
    plain = _compile(model, inputs, None)
    hot = _compile(model, inputs, cfg)
    notes: list[str] = []
    if len(plain) != len(hot):
        notes.append(
            f"the plain compile produced {len(plain)} graph(s), the hot one {len(hot)}: "
            "only the first graphs of each are compared"
        )
    layers: list[LayerDiff] = []
    graphs: list[GraphPair] = []
    for gi, (cp, ch) in enumerate(zip(plain, hot)):
        before, after = _read(cp, param_ids), _read(ch, param_ids)
        if before is None or after is None:
            notes.append(f"graph {gi}: not compiled")
            continue
        if cp.bw is None:
            notes.append(
                f"graph {gi}: an inference graph (nothing needs a gradient): nothing is saved "
                "and HOT changes nothing"
            )
        rows_b, rows_a = _saved_rows(before), _saved_rows(after)
        graphs.append(
            GraphPair(
                gi,
                [x for _, x in before.fw_lines],
                [x for _, x in after.fw_lines],
                [x for _, x in before.bw_lines],
                [x for _, x in after.bw_lines],
                rows_b,
                rows_a,
            )
        )
        plans = {p.name: p for p in ch.plans}
        names = [p.name for p in ch.plans]
        kinds = {p.name: p.kind for p in ch.plans}
        for name, kind in _candidate_layers(before, model):
            if name not in plans:
                names.append(name)
                kinds[name] = kind
        for name in names:
            plan = plans.get(name)
            base = name.split(":")[0]

            def lines(pairs, base=base):
                return [x for lay, x in pairs if lay == base]

            q, rule = _quantizer(plan)
            saved_fp, why = _input_saved(after, base, plan, kinds[name])
            if plan is None:
                path = "not rewritten"
                reason = why.split(":")[0] if why else "not seen by the rewrite"
            else:
                path, reason = plan.path, plan.reason
            hot_ops = sorted(
                {
                    _op_name(n.target)
                    for n in (ch.bw.graph.nodes if ch.bw is not None else ())
                    if n.op == "call_function"
                    and _is_hot_op(n.target)
                    and after.bw_layer.get(n) == name
                }
            )
            layers.append(
                LayerDiff(
                    name=name,
                    kind=kinds[name],
                    path=path,
                    reason=reason,
                    quantizer=q,
                    quantizer_rule=rule,
                    speedup=plan.speedup_text() if plan is not None else "-",
                    forward=plan.forward if plan is not None else "bf16",
                    forward_reason=plan.forward_reason if plan is not None else "",
                    fw_before=lines(before.fw_lines),
                    fw_after=lines(after.fw_lines),
                    bw_before=lines(before.bw_lines),
                    bw_after=lines(after.bw_lines),
                    hot_ops=hot_ops,
                    saved_before=_layer_saved(before, base, rows_b),
                    saved_after=_layer_saved(after, name, rows_a),
                    input_saved=saved_fp,
                    input_saved_reason=why,
                    graph=gi,
                )
            )
    result = GraphDiff(
        model=type(model).__name__,
        inputs=_describe_inputs(inputs),
        config=_config_dict(cfg),
        layers=layers,
        graphs=graphs,
        notes=notes,
    )
    if trace:
        result.emit_trace_artifact()
    return result


def _config_dict(cfg: HotConfig) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        out[f.name] = v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
    return out


# --------------------------------------------------------------------------- text output


class _Style:
    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.on else text

    def bold(self, t: str) -> str:
        return self(t, "1")

    def red(self, t: str) -> str:
        return self(t, "31")

    def green(self, t: str) -> str:
        return self(t, "32")

    def yellow(self, t: str) -> str:
        return self(t, "33")

    def cyan(self, t: str) -> str:
        return self(t, "36")

    def dim(self, t: str) -> str:
        return self(t, "2")


def _want_color(color: bool | None, stream: TextIO) -> bool:
    """ANSI colours only on a terminal, never with ``NO_COLOR`` set (no-color.org)."""
    if color is not None:
        return color
    if os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def _table(rows: list[list[str]], header: list[str], style: _Style) -> list[str]:
    widths = [len(h) for h in header]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(_strip_ansi(c)))

    def fmt(r: list[str]) -> str:
        return "  ".join(c + " " * (widths[i] - len(_strip_ansi(c))) for i, c in enumerate(r))

    return [style.bold(fmt(header)), *(fmt(r) for r in rows)]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _strip_ansi(s: str) -> str:
    return _ANSI.sub("", s)


def _render_text(d: GraphDiff, color: bool, code: bool) -> str:
    st = _Style(color)
    out: list[str] = []
    shapes = ", ".join("x".join(map(str, i.get("shape", []))) or "?" for i in d.inputs)
    out.append(st.bold(f"hotcompile diff: {d.model} on inputs [{shapes}]"))
    sb = d.saved_bytes()
    b, a = sb["before"]["activations"], sb["after"]["activations"]
    ratio = f"{a / b:.2f}x" if b else "-"
    out.append(
        f"saved activations: plain {human_bytes(b)} -> hot {human_bytes(a)} ({ratio}); "
        f"compressed {human_bytes(sb['after']['compressed'])}"
    )
    for n in d.notes:
        out.append(st.yellow(f"note: {n}"))
    out.append("")
    out.append(st.bold("Layers"))
    rows = []
    for lay in d.layers:
        path = lay.path
        path = st.green(path) if path in ("hot", "gx_only") else st.yellow(path)
        if lay.flagged:
            flag = st.red("x saved: " + lay.input_saved_reason)
        else:
            note = lay.input_saved_reason
            flag = st.green(f"ok: {note}" if note else "ok")
        rows.append(
            [
                lay.name,
                lay.kind,
                path,
                lay.quantizer or "-",
                lay.quantizer_rule or "-",
                lay.forward + (f" ({lay.forward_reason})" if lay.forward_reason else ""),
                lay.speedup,
                flag,
            ]
        )
    heads = ["layer", "kind", "path", "quantizer", "rule", "forward", "speed-up"]
    heads.append("full-precision x")
    out += _table(rows, heads, st)
    ran = d.kernels_ran()
    if ran:
        out += ["", st.bold("CUDA kernels that ran (this process)")]
        out += [f"  {n}: " + ", ".join(f"{k} {v}" for k, v in ks.items()) for n, ks in ran.items()]
    out.append("")
    out.append(st.bold("Per layer: nodes before -> after"))
    for lay in d.layers:
        out.append(st.cyan(f"[{lay.name}]") + f" {lay.kind}, {lay.path}")
        if lay.reason:
            out.append(f"  reason: {lay.reason}")
        for which in ("forward", "backward"):
            ch = lay.op_changes(which)
            nb = len(lay.fw_before if which == "forward" else lay.bw_before)
            na = len(lay.fw_after if which == "forward" else lay.bw_after)
            parts = [
                (st.green if v > 0 else st.red)(f"{'+' if v > 0 else ''}{v} {k}")
                for k, v in ch.items()
            ]
            out.append(f"  {which}: {nb} -> {na} nodes  " + (", ".join(parts) or "unchanged"))
        if lay.hot_ops:
            out.append("  hot ops in the backward: " + ", ".join(lay.hot_ops))
        if lay.saved_before or lay.saved_after:
            out.append(
                f"  saved: {', '.join(lay.saved_before) or '-'} -> "
                f"{', '.join(lay.saved_after) or '-'}"
            )
        if lay.flagged:
            out.append(st.red(f"  ! full-precision input still saved: {lay.input_saved_reason}"))
    for g in d.graphs:
        out.append("")
        out.append(st.bold(f"Saved tensors, graph {g.index}"))
        for which, rows_ in (("plain", g.saved_before), ("hot", g.saved_after)):
            out.append(st.dim(f"-- {which}"))
            other = {s.name for s in (g.saved_after if which == "plain" else g.saved_before)}
            trows = []
            for s in rows_:
                mark = " " if s.name in other else ("-" if which == "plain" else "+")
                paint = st.red if mark == "-" else st.green if mark == "+" else (lambda t: t)
                trows.append(
                    [
                        paint(mark + " " + s.name),
                        s.layer or "-",
                        "x".join(map(str, s.shape)) or "scalar",
                        s.dtype,
                        human_bytes(s.bytes),
                        s.role,
                        "yes" if s.compressed else "no",
                    ]
                )
            out += _table(
                trows, ["  name", "layer", "shape", "dtype", "bytes", "role", "compressed"], st
            )
        if code:
            for which in ("forward", "backward"):
                out.append("")
                out.append(st.bold(f"Graph {g.index} {which}: normalised unified diff"))
                for line in g.unified(which):
                    if line.startswith("+") and not line.startswith("+++"):
                        out.append(st.green(line))
                    elif line.startswith("-") and not line.startswith("---"):
                        out.append(st.red(line))
                    elif line.startswith("@@"):
                        out.append(st.cyan(line))
                    else:
                        out.append(line)
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- examples


class _Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, S, D))


class TinyBlock(nn.Module):
    """A pre-norm transformer block: LN -> attention, LN -> Linear -> GELU -> Linear."""

    def __init__(self, d: int = 32, hidden: int = 64, heads: int = 2) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = _Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class TinyCNN(nn.Module):
    """3x3 conv, a depthwise conv (skipped by HOT), a 1x1 conv and a linear head."""

    def __init__(self, c: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, c, 3, padding=1)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.pw = nn.Conv2d(c, c, 1)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.dw(x))
        x = torch.relu(self.pw(x))
        return self.head(x.mean((2, 3)))


def example_block() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A tiny transformer block and a [2, 16, 32] input (``hotcompile diff`` example)."""
    torch.manual_seed(0)
    return TinyBlock(), (torch.randn(2, 16, 32),)


def example_cnn() -> nn.Module:
    """A tiny CNN; give it an input with ``--input 2x3x16x16``."""
    torch.manual_seed(0)
    return TinyCNN()


# --------------------------------------------------------------------------- CLI


def load_model(target: str, inputs: Sequence[torch.Tensor]) -> tuple[nn.Module, list[Any]]:
    """``package.module:factory`` -> (model, example inputs); ``--input`` shapes, when given,
    replace the factory's inputs."""
    made, example = load_factory(target)
    example = list(inputs) or example or []
    if not example:
        raise SystemExit(f"{target} returned no example inputs: give --input SHAPE")
    return made, example


def _run_cli(args: argparse.Namespace) -> int:
    model = library_model(args)
    if model is not None:
        if not args.input:
            raise SystemExit("--timm / --hf: give the example input, e.g. --input 2x64:int64")
        inputs = list(args.input)
    elif args.model:
        model, inputs = load_model(args.model, args.input or [])
    else:
        raise SystemExit("give a model as package.module:factory (or --timm / --hf)")
    options = dict(args.option or [])
    result = diff(model, inputs, options or None)
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(result.to_html())
    if args.json:
        print(result.to_json())
    else:
        color = False if args.no_color else None
        sys.stdout.write(
            _render_text(result, _want_color(color, sys.stdout), code=not args.summary)
        )
        if args.html:
            print(f"wrote {args.html}")
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``diff`` subcommand to a ``hotcompile`` subparsers object."""
    p = subparsers.add_parser(
        "diff",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="show what the hot backend changes in a model's compiled graphs",
        description=textwrap.dedent("""\
            Compile a model twice on small inputs, plain and with backend="hot", through the
            same AOTAutograd pipeline (inductor's decompositions + min-cut partitioner), and
            show per layer:
              - the forward and backward nodes before and after (the HOT ops appear in the
                backward, abc_compress in the forward);
              - the g_x quantizer (per_token / per_tensor) and the rule that chose it;
              - the tensors the forward saves for the backward, before and after: INT8
                compressed activations replace the full-precision inputs;
              - every layer whose full-precision input is still saved, and why (skipped or
                excluded layer, activation checkpointing, another consumer needs it, ...).
            Node names are normalised (fc1.addmm, not addmm_3) so the unified diff of the
            graph code shows real changes only. Shapes matter, values do not: keep inputs
            small."""),
        epilog=textwrap.dedent("""\
            MODEL is 'package.module:factory': a function returning the model, or
            (model, example_inputs); or a library model by name (--timm NAME, --hf NAME:
            random weights, nothing downloaded for a Hugging Face model type). --input
            SHAPE[:DTYPE] makes a random input (float32 by default; integer dtypes draw token
            ids in [0, 100)).

            examples:
              hotcompile diff hotcompile.graphdiff:example_block
              hotcompile diff hotcompile.graphdiff:example_cnn --input 2x3x16x16 --summary
              hotcompile diff mypkg.models:make_vit --input 2x3x32x32 --html diff.html
              hotcompile diff mypkg.models:make_lm --input 2x64:int64 --json > diff.json
              hotcompile diff mypkg.models:make_vit --input 2x3x32x32 \\
                  --option exclude="('head',)" --option gx_bits=8
              hotcompile diff --hf gpt2 --hf-config n_layer=1 --input 2x64:int64 --summary
              TORCH_TRACE=/tmp/trace hotcompile diff ...   # then: tlparse /tmp/trace/*"""),
    )
    p.add_argument("model", metavar="MODEL", nargs="?", help="package.module:factory")
    add_library_model_args(p)
    p.add_argument(
        "--input",
        action="append",
        type=parse_input_spec,
        metavar="SHAPE[:DTYPE]",
        help="an example input, e.g. 2x3x32x32 (repeat for several positional inputs)",
    )
    p.add_argument(
        "--option",
        "-o",
        action="append",
        type=parse_option,
        metavar="KEY=VALUE",
        help="a HotConfig option (repeatable), e.g. gx_bits=8 or exclude=\"('head',)\"",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--no-color", action="store_true", help="no ANSI colours (also: NO_COLOR=1)")
    p.add_argument("--summary", action="store_true", help="omit the unified diff of the graph code")
    p.set_defaults(func=_run_cli)
    return p


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hotcompile")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["diff", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(_main())

"""Which calls of a Dynamo graph multiply by a weight, and how each maps onto ``F.linear``.

Real models do not all write their layers as ``F.linear``: Hugging Face's ``Conv1D`` (GPT-2)
is ``torch.addmm(bias, x.view(-1, nx), weight)`` with a ``[in, out]`` weight; others write
``x @ self.W``, ``torch.matmul(x, W.t())``, ``self.W @ x`` or a ``bmm`` with a weight expanded
across the batch. Each of these is the linear layer ``y = x · Wᵀ + b`` for the right ``W``
(a transpose of the parameter, at most), so HOT's linear backward applies unchanged once the
call is written in that form. :func:`match` finds those calls and says how to write them so;
``hotcompile.passes.rewrite`` does the writing.

What counts as a weight: a parameter of the model (a placeholder Dynamo lifted from a module's
``_parameters``, an ``nn.Parameter`` input, or a ``get_attr`` of one), seen through view-like
ops only (transpose, ``.T``, view/reshape, unsqueeze/expand, dtype casts). A matmul between two
activations (attention scores, ``attn @ v``) is not a weight matmul and is never touched. A
weight matmul that cannot be written as a linear layer (a per-batch 3-D weight, a
matrix-vector product, ``einsum``, ``beta``/``alpha`` scaling) is still returned, with the
reason, so the plan lists it: nothing is skipped silently.

Matching reads the graph and changes nothing; ``hotcompile report`` uses it to size the calls
the rewrite will plan, in the same order.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

LINEAR_TARGETS = (torch._C._nn.linear, F.linear)
CONV2D_TARGETS = (torch.conv2d, F.conv2d)
#: ops HOT leaves alone on purpose, with the reason reported to the user.
UNSUPPORTED_TARGETS: dict[Any, str] = {
    torch.conv1d: "conv1d is not supported yet (only conv2d)",
    torch.conv3d: "conv3d is not supported yet (only conv2d)",
    torch.conv_transpose1d: "transposed convs keep autograd's backward",
    torch.conv_transpose2d: "transposed convs keep autograd's backward",
    torch.conv_transpose3d: "transposed convs keep autograd's backward",
}

#: matmul-family functions and methods -> (op name, argument names in order)
_MATMUL_FUNCTIONS: dict[Any, str] = {
    torch.addmm: "addmm",
    torch.mm: "mm",
    torch.matmul: "matmul",
    operator.matmul: "matmul",
    torch.bmm: "bmm",
    torch.baddbmm: "baddbmm",
}
_MATMUL_METHODS = {"addmm", "mm", "matmul", "bmm", "baddbmm", "__matmul__"}
_ARGS = {
    "addmm": ("input", "mat1", "mat2"),
    "baddbmm": ("input", "batch1", "batch2"),
    "mm": ("input", "mat2"),
    "bmm": ("input", "mat2"),
    "matmul": ("input", "other"),
}
#: weight matmuls HOT does not rewrite, with the reason
_OTHER_FUNCTIONS: dict[Any, tuple[str, str]] = {
    torch.einsum: ("einsum", "einsum with a weight operand is not rewritten (write it as @)"),
    torch.mv: ("mv", "matrix-vector product (a 1-D operand) keeps autograd's backward"),
    torch.addmv: ("addmv", "matrix-vector product (a 1-D operand) keeps autograd's backward"),
    F.bilinear: ("bilinear", "bilinear layers keep autograd's backward"),
}
#: Dynamo graph ops that give a view (or a dtype cast) of their first argument
_VIEW_METHODS = {
    "t", "transpose", "permute", "view", "reshape", "unsqueeze", "squeeze", "expand",
    "expand_as", "contiguous", "to", "type", "float", "half", "bfloat16", "flatten", "detach",
}  # fmt: skip
_VIEW_FUNCTIONS = {
    torch.t, torch.transpose, torch.permute, torch.reshape, torch.unsqueeze, torch.squeeze,
    torch.flatten,
}  # fmt: skip
_VIEW_ATTRS = {"T", "mT", "data"}
#: HOPs whose body runs exactly once, inline: the rewrite goes into them
INLINE_HOPS = ("tag_activation_checkpoint", "wrap")


@dataclasses.dataclass(frozen=True)
class WeightCall:
    """One call that multiplies by a weight, as the rewrite will see it.

    The linear form is ``F.linear(x', W', bias)`` where ``x' = x.mT`` if ``weight_left`` else
    ``x``, and ``W' = weight.t()`` if ``transposed`` else ``weight`` (``[out, in]``); its
    output is transposed back (``weight_left``), flattened back to 2-D (``unflatten``: ``x`` is
    the N-D tensor the call's 2-D input was flattened from, so HLA sees the token sequence)
    and ``bias_add`` added. ``reason`` non-empty: recognised, not rewritable (the plan says so).
    """

    node: fx.Node
    kind: str  # "linear" | "conv2d" | "other"
    op: str  # the call as written: "linear", "addmm", "matmul", "conv1d", "einsum", ...
    x: Any = None
    weight: Any = None
    bias: Any = None
    transposed: bool = False
    weight_left: bool = False
    unflatten: bool = False
    bias_add: Any = None
    param: fx.Node | None = None  # the parameter behind the weight
    reason: str = ""

    @property
    def rewritable_form(self) -> bool:
        """The call is ``F.linear``/``F.conv2d`` itself (the rewrite retargets the node)."""
        return self.op in ("linear", "conv2d")

    def linear_shapes(self) -> tuple[tuple | None, tuple | None]:
        """``(x', W')`` shapes of the linear form (``W'`` as ``[out, in]``); None if unknown."""
        x, w = shape(self.x), shape(self.weight)
        if self.kind != "linear" or x is None or w is None:
            return x, w
        if self.weight_left:
            x = (*x[:-2], x[-1], x[-2]) if len(x) >= 2 else x
        if self.transposed and len(w) == 2:
            w = (w[1], w[0])
        return x, w


def shape(node: Any) -> tuple | None:
    """The example value's shape of a node (or tensor); None when it has none."""
    v = value(node)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def value(node: Any) -> Any:
    """The example value Dynamo (or AOT) recorded for a node; a tensor constant as is."""
    if isinstance(node, fx.Node):
        return node.meta.get("example_value", node.meta.get("val"))
    return node


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """A call's argument by position or keyword."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def source_name(node: fx.Node) -> str | None:
    """Dynamo's source path of a placeholder (``L['self']._modules['fc']._parameters['weight']``),
    None when it has none."""
    src = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(src, "name", None)
    name = name() if callable(name) else name  # a method before torch 2.13, then a property
    return name if isinstance(name, str) else None


def node_objects(gm: fx.GraphModule, example_inputs: Any = None) -> dict[fx.Node, Any]:
    """The real objects behind ``gm``'s placeholders (``example_inputs``, what the backend
    receives, when given) and ``get_attr`` nodes."""
    found: dict[fx.Node, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if example_inputs is not None and len(example_inputs) == len(placeholders):
        found.update(zip(placeholders, example_inputs))
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            obj: Any = gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part, None)
            found[n] = obj
    return found


def parameter_nodes(gm: fx.GraphModule, example_inputs: Any = None) -> set[fx.Node]:
    """The nodes of ``gm`` that hold a model parameter (frozen ones included): a placeholder
    Dynamo lifted from a module's ``_parameters``, or any node whose object is one."""
    found = {n for n, obj in node_objects(gm, example_inputs).items()
             if isinstance(obj, torch.nn.Parameter)}  # fmt: skip
    for n in gm.graph.nodes:
        name = source_name(n) if n.op == "placeholder" else None
        if name is not None and "._parameters[" in name:
            found.add(n)
    return found


_SUBSCRIPT = re.compile(r"\._modules\[['\"]([^'\"]+)['\"]\]|\[['\"]([^'\"]+)['\"]\]|\[(\d+)\]")
#: the root of a Dynamo source path: the compiled module (``L['self']``), or ``L['args'][0]``
#: when a decorator (HF's ``check_model_inputs``) calls ``forward(*args)``
_ROOT = re.compile(r"^[LG]\[['\"]args['\"]\]\[0\]|^[LG]\[['\"][^'\"]*['\"]\]")


_DICT = re.compile(r"\.__dict__\[['\"]_(?:modules|parameters|buffers)['\"]\]")


def module_path(source: str) -> str:
    """``L['self']._modules['blocks']._modules['0'].fc1`` -> ``blocks.0.fc1`` (also through
    ``.__dict__['_modules']``, as Dynamo spells a PEFT model's modules)."""
    path = _ROOT.sub("", source)
    path = _DICT.sub("", path)
    path = _SUBSCRIPT.sub(lambda m: "." + next(g for g in m.groups() if g is not None), path)
    return path.strip(".")


def parameter_name(node: fx.Node) -> str | None:
    """``blocks.0.attn.c_attn.weight`` for a parameter placeholder; None when unknown."""
    name = source_name(node)
    if name is None:
        return None
    return module_path(name.replace("._parameters", "")) or None


def weight_root(node: Any, params: set[fx.Node]) -> fx.Node | None:
    """The parameter ``node`` is a view or cast of, else None."""
    for _ in range(32):
        if not isinstance(node, fx.Node):
            return None
        if node in params:
            return node
        if node.op == "call_method" and node.target in _VIEW_METHODS:
            node = node.args[0]
        elif node.op == "call_function" and node.target in _VIEW_FUNCTIONS:
            node = node.args[0]
        elif (
            node.op == "call_function"
            and node.target is getattr
            and len(node.args) == 2
            and node.args[1] in _VIEW_ATTRS
        ):
            node = node.args[0]
        else:
            return None
    return None


def _batch_shared(w: fx.Node) -> fx.Node | None:
    """For a 3-D weight operand that repeats one matrix over the batch —
    ``M.unsqueeze(0)``, ``M[None]`` written as view/reshape ``(1, a, b)``, either followed by
    ``expand`` — the 2-D node ``M``; else None."""
    node = w
    if node.op == "call_method" and node.target in ("expand", "expand_as"):
        node = node.args[0]
    if not isinstance(node, fx.Node):
        return None
    src = None
    if node.op == "call_method" and node.target == "unsqueeze" and node.args[1:] == (0,):
        src = node.args[0]
    elif node.op == "call_function" and node.target is torch.unsqueeze and node.args[1:] == (0,):
        src = node.args[0]
    elif node.op == "call_method" and node.target in ("view", "reshape"):
        viewed = shape(node)
        if viewed is not None and len(viewed) == 3 and viewed[0] == 1:
            src = node.args[0]
    src_shape = shape(src)
    if src_shape is None or len(src_shape) != 2 or src_shape != shape(w)[1:]:
        return None
    return src


def _flattened_from(x: Any) -> fx.Node | None:
    """The N-D tensor (N ≥ 3) a 2-D ``x`` was flattened from, keeping the last dim
    (``x.view(-1, d)``, ``reshape``, ``flatten(0, -2)``); None otherwise."""
    if not isinstance(x, fx.Node):
        return None
    is_view = (x.op == "call_method" and x.target in ("view", "reshape", "flatten")) or (
        x.op == "call_function" and x.target in (torch.reshape, torch.flatten)
    )
    if not is_view or not isinstance(x.args[0], fx.Node):
        return None
    src, out = shape(x.args[0]), shape(x)
    if src is None or out is None or len(src) < 3 or len(out) != 2 or src[-1] != out[-1]:
        return None
    return x.args[0]


def _matmul_op(node: fx.Node) -> str | None:
    if node.op == "call_function" and node.target in _MATMUL_FUNCTIONS:
        return _MATMUL_FUNCTIONS[node.target]
    if node.op == "call_method" and node.target in _MATMUL_METHODS:
        return "matmul" if node.target == "__matmul__" else node.target
    return None


def _scaled(node: fx.Node, op: str) -> bool:
    """``addmm``/``baddbmm`` with ``beta`` or ``alpha`` other than 1."""
    if op not in ("addmm", "baddbmm"):
        return False
    return node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1


def _matmul(node: fx.Node, op: str, params: set[fx.Node]) -> WeightCall | None:
    names = _ARGS[op]
    addend = None
    if op in ("addmm", "baddbmm"):
        addend = arg(node, 0, names[0])
        a, b = arg(node, 1, names[1]), arg(node, 2, names[2])
    else:
        a, b = arg(node, 0, names[0]), arg(node, 1, names[1])
    ra, rb = weight_root(a, params), weight_root(b, params)
    if ra is None and rb is None:
        return None  # two activations: attention scores, attn @ v
    left = rb is None  # W @ x
    w, x = (a, b) if left else (b, a)
    call = WeightCall(node, "other", op, x=x, weight=w, param=ra if left else rb)
    if ra is not None and rb is not None:
        return dataclasses.replace(
            call, param=ra, reason="both operands are parameters (a weight product, not a layer)"
        )
    if _scaled(node, op):
        return dataclasses.replace(call, reason=f"{op} with beta/alpha other than 1")
    wv, xv = value(w), value(x)
    if not isinstance(wv, torch.Tensor) or not isinstance(xv, torch.Tensor):
        return dataclasses.replace(call, reason="operand is not a traced tensor")
    if wv.dim() == 1 or xv.dim() == 1:
        return dataclasses.replace(
            call, reason="matrix-vector product (a 1-D operand) keeps autograd's backward"
        )
    if wv.dim() == 3:
        shared = _batch_shared(w) if not left else None
        if shared is None:
            return dataclasses.replace(
                call,
                reason="a batch of weight matrices (3-D weight, not one matrix shared across "
                "the batch) keeps autograd's backward",
            )
        w, wv = shared, value(shared)
    elif wv.dim() != 2:
        return dataclasses.replace(call, reason=f"{wv.dim()}-D weight operand")
    bias = None
    if addend is not None and not left:  # ``x @ W + b``: a 1-D b of width out is the bias
        av = value(addend)
        if isinstance(av, torch.Tensor) and av.dim() == 1 and av.shape[0] == wv.shape[1]:
            bias, addend = addend, None
    x_nd = _flattened_from(x) if xv.dim() == 2 and not left else None
    return dataclasses.replace(
        call,
        kind="linear",
        x=x_nd if x_nd is not None else x,
        weight=w,
        bias=bias,
        transposed=not left,
        weight_left=left,
        unflatten=x_nd is not None,
        bias_add=addend,
    )


def match(node: fx.Node, params: set[fx.Node]) -> WeightCall | None:
    """The :class:`WeightCall` of ``node`` when it multiplies by a weight, else None.

    ``F.linear`` and ``F.conv2d`` count whatever their weight argument is (it is one by
    definition); the matmul family counts when one operand is a parameter (``params``).
    """
    if node.op == "call_function":
        t = node.target
        if t in LINEAR_TARGETS or t in CONV2D_TARGETS:
            kind = "linear" if t in LINEAR_TARGETS else "conv2d"
            return WeightCall(
                node, kind, kind, x=arg(node, 0, "input"), weight=arg(node, 1, "weight"),
                bias=arg(node, 2, "bias"), param=weight_root(arg(node, 1, "weight"), params),
            )  # fmt: skip
        if t in UNSUPPORTED_TARGETS:
            name = getattr(t, "__name__", str(t))
            return WeightCall(
                node, "other", name, x=arg(node, 0, "input"), weight=arg(node, 1, "weight"),
                reason=UNSUPPORTED_TARGETS[t],
            )  # fmt: skip
        if t in _OTHER_FUNCTIONS:
            roots = [weight_root(a, params) for a in node.args if isinstance(a, fx.Node)]
            roots = [r for r in roots if r is not None]
            if roots:
                op, reason = _OTHER_FUNCTIONS[t]
                return WeightCall(node, "other", op, param=roots[0], reason=reason)
            return None
    op = _matmul_op(node)
    return _matmul(node, op, params) if op is not None else None


def hop_body(node: fx.Node, gm: fx.GraphModule) -> tuple[str, fx.GraphModule] | None:
    """``(hop name, body)`` for a higher-order op call with a graph body (checkpoint, ...)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.HigherOrderOperator):
        return None
    body = node.args[0] if node.args else None
    if not (isinstance(body, fx.Node) and body.op == "get_attr"):
        return None
    sub = getattr(gm, str(body.target), None)
    if not isinstance(sub, fx.GraphModule):
        return None
    return node.target.name(), sub


def body_inputs(node: fx.Node, body: fx.GraphModule) -> dict[fx.Node, Any]:
    """The body's placeholders -> the outer values passed for them (the HOP's operands)."""
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    return dict(zip(placeholders, node.args[1:]))


@dataclasses.dataclass
class Scope:
    """One graph the walk visits: the Dynamo graph, or the body of an inline HOP in it.

    ``inputs`` maps the body's placeholders to the outer graph's nodes passed for them;
    ``hop`` is the HOP's name ("" for the Dynamo graph itself); ``skip`` non-empty: a body the
    rewrite does not enter (its weight calls are listed with this reason)."""

    gm: fx.GraphModule
    params: set[fx.Node]
    outer: Scope | None = None
    inputs: dict[fx.Node, Any] = dataclasses.field(default_factory=dict)
    hop: str = ""
    skip: str = ""

    def outer_node(self, node: Any) -> Any:
        """``node`` as the Dynamo graph has it (a body placeholder's outer value)."""
        scope = self
        while scope.outer is not None and node in scope.inputs:
            node, scope = scope.inputs[node], scope.outer
        return node


def weight_calls(scope: Scope):
    """Yield ``(scope, call)`` for every weight call, in graph order, entering HOP bodies.

    Lazy on purpose: the rewrite changes the graph between two yields (a matched node is
    replaced), and a later call must be matched on the changed graph."""
    for node in list(scope.gm.graph.nodes):
        hop = hop_body(node, scope.gm)
        if hop is not None:
            name, body = hop
            inputs = body_inputs(node, body)
            params = {ph for ph, outer in inputs.items() if outer in scope.params}
            skip = scope.skip or (
                ""
                if name in INLINE_HOPS
                else f"inside torch.ops.higher_order.{name}: HOT rewrites only "
                f"{' and '.join(INLINE_HOPS)} regions"
            )
            yield from weight_calls(Scope(body, params, scope, inputs, name, skip))
            continue
        if node.op in ("call_function", "call_method"):
            call = match(node, scope.params)
            if call is not None:
                yield scope, call

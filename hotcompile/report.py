"""The static cost report: what HOT would do to each layer of a model, and what it costs.

``hotcompile.report(model, example_inputs)`` never runs real compute. The model is copied onto
the ``meta`` device (parameters are replaced, not copied, so a 7B model costs no memory) and
compiled with a backend that calls the same rewrite pass as ``backend="hot"``; the per-layer
plans (path, reason, bits, quantizer) are therefore exactly the ones training would get. L, O
and I come from the fake tensors Dynamo attaches to the graph, the costs from the formulas of
:mod:`hotcompile.cost`. Optionally AOTAutograd traces the training graph of both the plain
and the rewritten graph on fake tensors, with the min-cut partitioner that inductor uses, and
the report sums the bytes of what each forward saves for its backward.
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import io
import json
import math
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sympy
import torch

from hotcompile import cost
from hotcompile.cliargs import (
    add_library_model_args,
    library_model,
    load_factory,
    parse_input_spec,
    parse_option,
)
from hotcompile.config import HotConfig

GIB = 1024**3
#: metrics of a layer, grouped as in the JSON; totals use the same keys.
METRICS: dict[str, tuple[str, ...]] = {
    "flops": ("forward", "vanilla_backward", "hot_overhead", "hot_backward"),
    "bops": ("forward", "hot_forward", "fp_backward", "hot_backward", "fp_train", "hot_train"),
    "memory": ("paper_fp_bytes", "paper_hot_bytes"),
}
_FORMULA_OF = {
    ("flops", "forward"): "forward_flops",
    ("flops", "vanilla_backward"): "vanilla_backward_flops",
    ("flops", "hot_overhead"): "hot_overhead_flops",
    ("flops", "hot_backward"): "hot_backward_flops",
    ("bops", "forward"): "forward_bops",
    ("bops", "hot_forward"): "hot_forward_bops",
    ("bops", "fp_backward"): "fp_backward_bops",
    ("bops", "hot_backward"): "hot_backward_bops",
    ("memory", "paper_fp_bytes"): "paper_fp_bytes",
    ("memory", "paper_hot_bytes"): "paper_hot_bytes",
}


# --------------------------------------------------------------------------- results


def kernels_ran(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """Layer -> stage -> the implementation (CUTLASS config, Triton tile, CUDA, torch) the HOT
    ops ran on CUDA for these layers, as ``hotcompile.kernels.dispatch`` recorded it in this
    process — empty before any CUDA backward: the choice is measured per shape at run time,
    so a static report or diff cannot know it beforehand."""
    dispatch = sys.modules.get("hotcompile.kernels.dispatch")
    if dispatch is None:
        return {}
    ran = dispatch.by_layer()
    return {n: ran[n] for n in names if n in ran}


@dataclasses.dataclass
class LayerReport:
    """One linear/conv call of the compiled model: its plan, its shape and its costs.

    ``L`` is an int, or a sympy expression of the batch symbol when the batch is dynamic; the
    metric values are then evaluated at the example inputs' sizes (``L_value``).
    """

    name: str
    kind: str
    graph: int
    L: int | sympy.Expr
    L_value: int
    O: int
    I: int
    path: str
    reason: str
    gx_bits: int | None
    gw_bits: int | None
    n: int
    r: int
    quantizer: str | None
    weight_grad: bool
    formulas: cost.Formulas
    values: dict[str, dict[str, int | float]]
    gw_format: str = "int8"  #: the g_w codes when gw_bits is 8: "int8" or "fp8" (e4m3)
    #: HOT's backward speed-up over bf16 (``LayerPlan.speedup_text``: measured, or the H100
    #: roofline model of ``hotcompile.lowering.gate`` on meta tensors)
    speedup: str = "-"
    #: who writes HQ's g_y operand when not the layer's own pass (``LayerPlan.gy_from``)
    gy_from: str = ""
    #: the forward GEMM (``LayerPlan.forward``: bf16, or FP8 under ``forward="fp8"``) and why
    #: a layer keeps bf16 where FP8 was asked for
    forward: str = "bf16"
    forward_reason: str = ""

    def to_json(self, formulas: bool = False) -> dict[str, Any]:
        row: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "graph": self.graph,
            "L": self.L if isinstance(self.L, int) else str(self.L),
            "L_value": self.L_value,
            "O": self.O,
            "I": self.I,
            "path": self.path,
            "reason": self.reason,
            "bits": {"gx": self.gx_bits, "gw": self.gw_bits},
            "gw_format": self.gw_format if self.gw_bits == 8 else None,
            "speedup": self.speedup,
            "gy_from": self.gy_from or None,
            "forward": self.forward,
            "forward_reason": self.forward_reason or None,
            "hla": {"n": self.n, "r": self.r},
            "quantizer": self.quantizer,
            "weight_grad": self.weight_grad,
            **{group: dict(vals) for group, vals in self.values.items()},
        }
        van = self.values["flops"]["vanilla_backward"]
        row["flops"]["hot_overhead_pct"] = (
            100.0 * self.values["flops"]["hot_overhead"] / van if van else 0.0
        )
        if formulas:
            row["formulas"] = {k: _pretty(str(v)) for k, v in self.formulas.as_dict().items()}
            if not isinstance(self.L, int):
                row["formulas_in_batch"] = {
                    k: str(sympy.expand(v.subs({cost.L: self.L}))) for k, v in row_formulas(self)
                }
        return row


def row_formulas(layer: LayerReport) -> list[tuple[str, sympy.Expr]]:
    """The layer's formulas with its O, I, n, r substituted (L kept, or its batch expression)."""
    values = {cost.O: layer.O, cost.I: layer.I, cost.n: layer.n, cost.r: layer.r}
    return [(k, cost.evaluate(v, values)) for k, v in layer.formulas.as_dict().items()]


@dataclasses.dataclass
class SavedBytes:
    """Bytes the compiled forward saves for the backward (parameters and buffers excluded)."""

    baseline: int | None
    hot: int | None
    baseline_tensors: list[dict[str, Any]]
    hot_tensors: list[dict[str, Any]]
    error: str | None = None

    def to_json(self, tensors: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": "AOTAutograd on fake tensors, inductor decompositions, min-cut partitioner",
            "baseline_bytes": self.baseline,
            "hot_bytes": self.hot,
            "error": self.error,
        }
        if tensors:
            out["baseline_tensors"] = self.baseline_tensors
            out["hot_tensors"] = self.hot_tensors
        return out


class Report:
    """The static cost report of one model. Build it with :func:`report`."""

    def __init__(
        self,
        model_name: str,
        config: HotConfig,
        options: dict[str, Any],
        layers: list[LayerReport],
        paper_memory: dict[str, Any],
        saved: SavedBytes | None,
        symbols: dict[str, str],
    ) -> None:
        self.model_name = model_name
        self.config = config
        self.options = options
        self.layers = layers
        self.paper_memory = paper_memory
        self.saved = saved
        self.symbols = symbols
        self.totals = _totals(layers)

    # -- output formats -----------------------------------------------------------------
    def to_json(self, formulas: bool = False, saved_tensors: bool = False) -> dict[str, Any]:
        """Everything as a JSON-serialisable dict (``json.dumps(r.to_json())`` works)."""
        options = {k: _jsonable(v) for k, v in self.config.to_options().items()}
        return {
            "model": self.model_name,
            "config": options,
            "options": dict(self.options),
            "symbols": dict(self.symbols),
            "layers": [layer.to_json(formulas) for layer in self.layers],
            "totals": self.totals,
            "totals_in_batch": self.symbolic_totals(),
            "paper_memory": self.paper_memory,
            "saved": None if self.saved is None else self.saved.to_json(saved_tensors),
            "kernels_ran": self.kernels_ran(),
        }

    def kernels_ran(self) -> dict[str, dict[str, str]]:
        """What :func:`kernels_ran` says for this report's layers."""
        return kernels_ran(lay.name for lay in self.layers)

    def to_csv(self) -> str:
        """One row per layer plus a ``TOTAL`` row; nested keys flattened with dots."""
        rows = [_flatten(layer.to_json()) for layer in self.layers]
        rows.append(_flatten({"name": "TOTAL", **self.totals}))
        fields: list[str] = []
        for row in rows:
            fields.extend(k for k in row if k not in fields)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()

    def table(self, formulas: bool = False) -> str:
        """A readable text table (tabulate) with totals and the memory summary."""
        from tabulate import tabulate

        headers = [
            "layer", "kind", "L", "O", "I", "path", "gx/gw bits", "forward", "quantizer",
            "vanilla MFLOP", "overhead MFLOP", "ovh %", "FP GBOPs", "HOT GBOPs",
            "paper FP MiB", "paper HOT MiB", "speed-up",
        ]  # fmt: skip
        rows = []
        for lay in self.layers:
            j = lay.to_json()
            gw = "fp8" if lay.gw_bits == 8 and lay.gw_format == "fp8" else lay.gw_bits or 32
            bits = "-" if lay.path == "skipped" else f"{lay.gx_bits or 32}/{gw}"
            rows.append([
                lay.name, lay.kind, j["L"], lay.O, lay.I,
                lay.path + (f" ({lay.reason})" if lay.reason else ""), bits,
                lay.forward + (f" ({lay.forward_reason})" if lay.forward_reason else ""),
                (lay.quantizer or "-") + (" *" if lay.gy_from else ""),
                j["flops"]["vanilla_backward"] / 1e6, j["flops"]["hot_overhead"] / 1e6,
                j["flops"]["hot_overhead_pct"], j["bops"]["fp_backward"] / 1e9,
                j["bops"]["hot_backward"] / 1e9, j["memory"]["paper_fp_bytes"] / 2**20,
                j["memory"]["paper_hot_bytes"] / 2**20, lay.speedup,
            ])  # fmt: skip
        t = self.totals
        rows.append([
            "TOTAL", "", "", "", "", "", "", "", "", t["flops"]["vanilla_backward"] / 1e6,
            t["flops"]["hot_overhead"] / 1e6, t["flops"]["hot_overhead_pct"],
            t["bops"]["fp_backward"] / 1e9, t["bops"]["hot_backward"] / 1e9,
            t["memory"]["paper_fp_bytes"] / 2**20, t["memory"]["paper_hot_bytes"] / 2**20, "",
        ])  # fmt: skip
        text = tabulate(rows, headers=headers, floatfmt=".2f", intfmt="d")
        lines = [f"HOT cost report: {self.model_name}", text, ""]
        fused = [lay for lay in self.layers if lay.gy_from]
        if fused:
            lines.append(
                "*: g_y's HQ codes written by the kernel that makes g_y, not a pass of the "
                "layer's own: " + ", ".join(sorted({lay.gy_from for lay in fused}))
            )
        if any(lay.speedup.endswith("H100 model") for lay in self.layers):
            lines.append(
                "speed-up: HOT's backward vs bf16 per layer, from the roofline model of an H100 "
                "(hotcompile.lowering.gate); on a GPU the backend measures each shape and keeps "
                "the exact backward where HOT is not at least 3% faster (prefer='speed')"
            )
        lines.append(
            f"training BOPs (forward + backward): FP {t['bops']['fp_train'] / 1e9:.2f} G -> "
            f"HOT {t['bops']['hot_train'] / 1e9:.2f} G"
        )
        pm = self.paper_memory
        lines.append(
            f"paper memory model (weights, gradients, {pm['optimizer_states']} optimizer "
            f"states, linear/conv outputs): FP {pm['fp_total_gib']:.2f} GiB -> "
            f"HOT {pm['hot_total_gib']:.2f} GiB"
        )
        if self.saved is None:
            lines.append("saved by the compiled graph: not measured (pass saved=True / --saved)")
        elif self.saved.error:
            lines.append(f"saved by the compiled graph: unavailable ({self.saved.error})")
        else:
            lines.append(
                f"saved by the compiled graph (activations): plain {_mib(self.saved.baseline)} "
                f"-> HOT {_mib(self.saved.hot)}"
            )
        if self.symbols:
            lines.append("symbols: " + ", ".join(f"{k} = {v}" for k, v in self.symbols.items()))
        ran = self.kernels_ran()
        if ran:
            lines += ["", "CUDA kernels that ran for these layers in this process:"]
            for name, stages in ran.items():
                lines.append(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in stages.items()))
        if formulas:
            lines += ["", self.formulas_text()]
        return "\n".join(lines)

    def symbolic_totals(self) -> dict[str, str] | None:
        """Totals as expressions of the batch symbol(s); None when every shape is static."""
        if all(isinstance(lay.L, int) for lay in self.layers):
            return None
        sums: dict[str, sympy.Expr] = {}
        for lay in self.layers:
            for key, expr in row_formulas(lay):
                sums[key] = sums.get(key, 0) + expr.subs({cost.L: lay.L})
        return {k: str(sympy.expand(v)) for k, v in sums.items()}

    def formulas_text(self) -> str:
        """Each distinct set of formulas once, with the layers that use it."""
        groups: dict[tuple, list[str]] = {}
        for lay in self.layers:
            key = tuple(str(v) for v in lay.formulas.as_dict().values())
            groups.setdefault(key, []).append(lay.name)
        names = list(cost.Formulas.__dataclass_fields__)
        out = ["formulas (symbols L, O, I, n, r):"]
        for key, layer_names in groups.items():
            shown = ", ".join(layer_names[:4]) + (" ..." if len(layer_names) > 4 else "")
            out.append(f"  layers ({len(layer_names)}): {shown}")
            out += [f"    {name} = {_pretty(expr)}" for name, expr in zip(names, key)]
        return "\n".join(out)

    def plot(self, path: str) -> str:
        """Per-layer bars, baseline vs HOT: backward FLOPs, backward bit-ops, paper memory."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = [lay.name for lay in self.layers]
        panels = [
            ("backward GFLOPs", "flops", "vanilla_backward", "hot_backward", 1e9),
            ("backward GBOPs", "bops", "fp_backward", "hot_backward", 1e9),
            ("saved activations, MiB (paper model)", "memory", "paper_fp_bytes",
             "paper_hot_bytes", 2**20),
        ]  # fmt: skip
        width = min(max(8.0, 0.25 * len(names) + 2), 60.0)
        fig, axes = plt.subplots(3, 1, figsize=(width, 10), sharex=True)
        xs = range(len(names))
        for ax, (title, group, base, hot, scale) in zip(axes, panels):
            b = [lay.values[group][base] / scale for lay in self.layers]
            h = [lay.values[group][hot] / scale for lay in self.layers]
            ax.bar([x - 0.2 for x in xs], b, width=0.4, label="baseline (FP32)")
            ax.bar([x + 0.2 for x in xs], h, width=0.4, label="HOT")
            ax.set_ylabel(title)
            ax.legend(loc="upper right")
        axes[-1].set_xticks(list(xs))
        axes[-1].set_xticklabels(names, rotation=90, fontsize=6)
        fig.suptitle(f"HOT cost report: {self.model_name}")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def _pretty(expr: str) -> str:
    return expr.replace("log(n)/log(2)", "log2(n)")


def _mib(v: int | None) -> str:
    return "n/a" if v is None else f"{v / 2**20:.2f} MiB"


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(i) for i in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _totals(layers: list[LayerReport]) -> dict[str, Any]:
    totals: dict[str, Any] = {
        group: {key: sum(lay.values[group][key] for lay in layers) for key in keys}
        for group, keys in METRICS.items()
    }
    van = totals["flops"]["vanilla_backward"]
    totals["flops"]["hot_overhead_pct"] = (
        100.0 * totals["flops"]["hot_overhead"] / van if van else 0.0
    )
    totals["layers"] = len(layers)
    totals["layers_rewritten"] = sum(lay.path in ("hot", "gx_only") for lay in layers)
    return totals


# --------------------------------------------------------------------------- tracing


def _to_meta(model: torch.nn.Module) -> torch.nn.Module:
    """A structural copy of ``model`` whose parameters and buffers live on ``meta``.

    ``deepcopy`` with a pre-filled memo swaps every tensor for a meta twin without ever
    copying its data, so a real 7B model is never duplicated.
    """
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(
            torch.empty_like(p, device="meta"), requires_grad=p.requires_grad
        )
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def _meta_input(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_like(x, device="meta").requires_grad_(x.requires_grad)
    if isinstance(x, torch.Size) or (
        isinstance(x, (tuple, list)) and x and all(isinstance(i, int) for i in x)
    ):
        return torch.empty(tuple(x), device="meta")
    if isinstance(x, (tuple, list)):
        return type(x)(_meta_input(i) for i in x)
    if isinstance(x, dict):
        return {k: _meta_input(v) for k, v in x.items()}
    return x


def _normalise_inputs(example_inputs: Any) -> tuple[Any, ...]:
    """Inputs as a tuple of positional args: a tensor, a shape, or a sequence of those."""
    if isinstance(example_inputs, torch.Tensor) or isinstance(example_inputs, torch.Size):
        return (_meta_input(example_inputs),)
    if isinstance(example_inputs, (tuple, list)):
        if example_inputs and all(isinstance(i, int) for i in example_inputs):
            return (_meta_input(example_inputs),)
        return tuple(_meta_input(x) for x in example_inputs)
    return (_meta_input(example_inputs),)


@dataclasses.dataclass
class _Node:
    """Shapes of one linear/conv call, read before the rewrite changed its target."""

    x_shape: tuple | None
    w_shape: tuple | None
    out_shape: tuple | None
    target: Any
    weight_grad: bool
    op: str = ""


def _candidates(gm: torch.fx.GraphModule) -> list[_Node]:
    """The calls the rewrite pass plans, in its order (it emits one plan per weight call),
    sized in their linear form (a matmul with a ``[in, out]`` weight as ``[out, in]``)."""
    from hotcompile.passes import matmul

    found = []
    for _, call in matmul.weight_calls(matmul.Scope(gm, matmul.parameter_nodes(gm))):
        x, w = call.linear_shapes()
        wv = matmul.value(call.param if call.param is not None else call.weight)
        found.append(
            _Node(
                x,
                w,
                matmul.shape(call.node),
                call.node.target,
                bool(isinstance(wv, torch.Tensor) and wv.requires_grad),
                call.op,
            )
        )
    return found


def _saved_bytes(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], exclude: set[int]
) -> tuple[int, list[dict[str, Any]]]:
    """Trace the training graph of ``gm`` with AOTAutograd and sum what the forward saves.

    Same decompositions and partitioner as ``HotBackend(compiler="aot_eager")`` and inductor;
    ``exclude`` holds the positions of parameter/buffer inputs (alive anyway). The returned
    callable is discarded: only the partitioner's decision is wanted.
    """
    from functorch.compile import min_cut_rematerialization_partition

    from hotcompile.backend import aot_decomp_partition

    found: list[dict[str, Any]] = []

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        placeholders = [n for n in fw.graph.nodes if n.op == "placeholder"]
        out = next(n for n in fw.graph.nodes if n.op == "output")
        for node in out.args[0][kwargs["num_fwd_outputs"] :]:
            val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
            if not isinstance(val, torch.Tensor):
                continue  # saved SymInts
            if node in placeholders and placeholders.index(node) in exclude:
                continue
            nbytes = val.numel() * val.element_size()
            found.append({
                "name": node.name, "shape": [str(s) for s in val.shape],
                "dtype": str(val.dtype).replace("torch.", ""), "bytes": _hint(nbytes),
            })  # fmt: skip
        return fw, bw

    aot_decomp_partition(gm, example_inputs, partition_fn=partition)
    return sum(t["bytes"] for t in found), found


def _hint(v: Any) -> int:
    """An int, or a symbolic size evaluated at the example inputs' sizes."""
    if isinstance(v, torch.SymInt):
        return int(v.node.hint)
    return int(v)


@dataclasses.dataclass
class _Graph:
    nodes: list[_Node]
    plans: list[Any]
    saved: tuple[int, int, list, list] | None
    error: str | None
    batch_symbols: dict[sympy.Symbol, tuple[str, int]]


def _batch_symbols(gm: torch.fx.GraphModule, user_inputs: set[int]) -> dict:
    """Symbols of the dynamic leading dims of user inputs -> (readable name, example size)."""
    found: dict[sympy.Symbol, tuple[str, int]] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        v = node.meta.get("example_value")
        if i not in user_inputs or not isinstance(v, torch.Tensor) or v.dim() == 0:
            continue
        d = v.shape[0]
        if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol):
            if d.node.expr not in found:
                name = "B" if not found else f"B{len(found)}"
                found[d.node.expr] = (name, int(d.node.hint))
    return found


def _trace(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any],
    config: HotConfig,
    dynamic: bool,
    saved: bool,
) -> list[_Graph]:
    """Compile the meta model with a capturing backend; run the plain graph on meta."""
    from hotcompile.passes import rewrite

    params = {id(t) for t in (*model.parameters(), *model.buffers())}
    graphs: list[_Graph] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        exclude = {i for i, t in enumerate(example_inputs) if id(t) in params}
        users = {i for i, t in enumerate(example_inputs) if i not in exclude}
        hot_gm = copy.deepcopy(gm)
        nodes = _candidates(hot_gm)
        plans = rewrite(hot_gm, config)
        if len(plans) != len(nodes):  # pragma: no cover - rewrite and report disagree
            raise RuntimeError(f"rewrite planned {len(plans)} calls, report saw {len(nodes)}")
        result, error = None, None
        if saved:
            try:
                base, base_t = _saved_bytes(gm, example_inputs, exclude)
                hot, hot_t = _saved_bytes(hot_gm, example_inputs, exclude)
                result = (base, hot, base_t, hot_t)
            except torch._dynamo.exc.RestartAnalysis:
                raise  # Dynamo's control flow: it re-runs the backend on a new graph
            except Exception as e:  # noqa: BLE001 - reported, never replaced by a guess
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        graphs.append(_Graph(nodes, plans, result, error, _batch_symbols(gm, users)))
        return gm.forward

    if dynamic:  # only the batch: every other size stays static, as in training
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                if t.shape[0] < 2:
                    raise ValueError(
                        "dynamic=True needs an example batch of at least 2 "
                        "(Dynamo specialises sizes 0 and 1)"
                    )
                torch._dynamo.mark_dynamic(t, 0)
    limits = {k: 10**6 for k in ("recompile_limit", "cache_size_limit")
              if k in torch._dynamo.config._config}  # fmt: skip
    with torch._dynamo.config.patch(**limits):
        compiled = torch.compile(model, backend=backend)
        compiled(*inputs, **kwargs)
    return graphs


# --------------------------------------------------------------------------- layers


#: weight calls of the matmul family that the rewrite left alone (sized by x and the output)
_MATMULS = ("addmm", "mm", "matmul", "bmm", "baddbmm", "mv", "addmv")


def _gemm_dims(node: _Node, kind: str) -> tuple[Any, Any, Any]:
    """(L, O, I) of a call in the GEMM view of its backward; zeros when the shapes do not say
    (an ``einsum``: the row is listed, with its reason, without costs)."""
    x, w, out = node.x_shape, node.w_shape, node.out_shape
    if kind == "linear" and x is not None and w is not None:
        return math.prod(x[:-1]), w[0], w[1]
    if node.op in _MATMULS and x is not None and out is not None:
        return math.prod(out[:-1]), (out[-1] if out else 1), x[-1]
    if x is None or w is None or out is None:
        return 0, 0, 0
    if "transpose" in getattr(node.target, "__name__", ""):
        # col2im GEMM: x (L_in × C_in) · W (C_in × C_out·k²)
        return x[0] * math.prod(x[2:]), math.prod(w[1:]), w[0]
    return out[0] * math.prod(out[2:]), w[0], math.prod(w[1:])


def _expr(v: Any, symbols: dict) -> tuple[int | sympy.Expr, int]:
    """A possibly-symbolic size as (int or expression in B, its value at the example)."""
    if isinstance(v, torch.SymInt):
        expr = v.node.expr.subs({s: sympy.Symbol(nm, positive=True, integer=True)
                                 for s, (nm, _) in symbols.items()})  # fmt: skip
        value = int(v.node.hint)
        return (value if expr.is_Integer else expr), value
    return int(v), int(v)


def _quantizer(plan: Any) -> str | None:
    """The g_x quantizer of the layer plan: LQS's decision, the plan's or the config's; None
    when the layer computes no quantized g_x (skipped, exact, or its input needs no grad)."""
    if plan.spec is None or plan.path not in ("hot", "gx_only"):
        return None
    return plan.quantizer


def _layer(
    graph_index: int, node: _Node, plan: Any, config: HotConfig, opts: dict[str, Any],
    symbols: dict,
) -> LayerReport | None:  # fmt: skip
    kind = plan.kind_text if plan.kind != "other" else plan.op or "other"
    dims = _gemm_dims(node, plan.kind)
    (L_sym, L_val), (O, _), (I, _) = (_expr(d, symbols) for d in dims)
    spec = plan.spec
    n = spec.block if spec is not None else config.block_size
    rows = len(spec.hla_rows) if spec is not None else config.rank
    hla = bool(spec is not None and spec.hla_rows)
    gx_bits = spec.gx_bits if spec is not None and spec.gx_quantized else None
    gw_bits = spec.gw_bits if spec is not None and not spec.exact else None
    fwd_bits = 8 if spec is not None and spec.forward != "bf16" else None
    path = cost.PathCosts(
        plan.path, node.weight_grad and plan.path != "gx_only", gx_bits, gw_bits, hla, fwd_bits
    )
    qkv = 4 if opts["official_qkv"] and "qkv" in plan.name else 1
    f = cost.formulas(path, opts["bops_variant"], qkv)
    subs = {cost.L: L_val, cost.O: O, cost.I: I, cost.n: n, cost.r: rows if hla else n}
    values: dict[str, dict[str, int | float]] = {}
    for (group, key), attr in _FORMULA_OF.items():
        values.setdefault(group, {})[key] = cost.to_number(cost.evaluate(getattr(f, attr), subs))
    values["bops"]["fp_train"] = values["bops"]["forward"] + values["bops"]["fp_backward"]
    values["bops"]["hot_train"] = values["bops"]["hot_forward"] + values["bops"]["hot_backward"]
    values["bops"] = {k: values["bops"][k] for k in METRICS["bops"]}
    return LayerReport(
        name=plan.name, kind=kind, graph=graph_index, L=L_sym, L_value=L_val, O=O, I=I,
        path=plan.path, reason=plan.reason, gx_bits=gx_bits if path.rewritten else None,
        gw_bits=gw_bits if path.hot_gw else None, n=n, r=rows if hla else n,
        quantizer=_quantizer(plan), weight_grad=node.weight_grad, formulas=f, values=values,
        gw_format=spec.gw_format if spec is not None else _gw_format_unrewritten(config),
        speedup=plan.speedup_text(), gy_from=plan.gy_from, forward=plan.forward,
        forward_reason=plan.forward_reason,
    )  # fmt: skip


def _gw_format_unrewritten(config: HotConfig) -> str:
    """The g_w codes of a layer the rewrite left alone: as the ops lowering resolves them."""
    from hotcompile.passes.rewrite import gw_format_of

    return gw_format_of(config, "ops")


def _paper_memory(
    model: torch.nn.Module, layers: list[LayerReport], official_qkv: bool, optimizer_states: int
) -> dict[str, Any]:
    """The official "theoretical" memory: weights, gradients, optimizer states, activations.

    Weights count the parameters that need a gradient (FP32); with ``official_qkv`` those
    named ``qkv`` count three times, as the official code does (unexplained).
    """
    weights = 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            weights += p.numel() * 4 * (3 if official_qkv and "qkv" in name else 1)
    fixed = weights * (2 + optimizer_states)
    fp_act = sum(lay.values["memory"]["paper_fp_bytes"] for lay in layers)
    hot_act = sum(lay.values["memory"]["paper_hot_bytes"] for lay in layers)
    return {
        "weights_bytes": weights,
        "gradients_bytes": weights,
        "optimizer_states": optimizer_states,
        "optimizer_bytes": weights * optimizer_states,
        "fp_activation_bytes": fp_act,
        "hot_activation_bytes": hot_act,
        "fp_total_bytes": fixed + fp_act,
        "hot_total_bytes": fixed + hot_act,
        "fp_total_gib": (fixed + fp_act) / GIB,
        "hot_total_gib": (fixed + hot_act) / GIB,
    }


# --------------------------------------------------------------------------- API


def report(
    model: torch.nn.Module,
    example_inputs: Any,
    config: HotConfig | dict[str, Any] | None = None,
    *,
    example_kwargs: dict[str, Any] | None = None,
    dynamic: bool = False,
    saved: bool = False,
    bops_variant: str = "table5",
    official_qkv: bool = False,
    optimizer_states: int = 2,
) -> Report:
    """The static cost report of ``model`` under HOT; no real compute runs.

    Args:
        model: any module; it is copied onto the meta device (the original is untouched).
        example_inputs: a tensor, a shape tuple, or a sequence of tensors/shapes (positional
            args of ``model``). Only shapes and dtypes matter.
        config: the :class:`HotConfig` (or options dict) ``backend="hot"`` would get.
        example_kwargs: keyword args of ``model`` (tensors are moved to meta too).
        dynamic: mark dim 0 of every input dynamic: ``L`` becomes an expression of ``B``.
        saved: also trace AOTAutograd (fake tensors, min-cut) to measure the bytes the
            compiled forward saves, plain vs HOT. Off by default: it is the slow part (ViT-B
            about 25 s, a 7B decoder about 60 s on 2 CPU cores, against seconds without).
        bops_variant: ``"table5"`` (default) or ``"code"``: the official code's ``I·(r/n)·O``
            term, which its published GBOPs totals use.
        official_qkv: the official memory model's unexplained ×4 activations / ×3 weights
            for layers named ``qkv`` (needed to reproduce the paper's 33.22 → 5.83 GB).
        optimizer_states: FP32 states per parameter in the paper memory model (AdamW: 2).
    """
    if bops_variant not in cost.BOPS_VARIANTS:
        raise ValueError(f"bops_variant must be one of {cost.BOPS_VARIANTS}")
    config = HotConfig.from_options(config)
    meta_model = _to_meta(model)
    inputs = _normalise_inputs(example_inputs)
    kwargs = {k: _meta_input(v) for k, v in (example_kwargs or {}).items()}
    graphs = _trace(meta_model, inputs, kwargs, config, dynamic, saved)
    opts = {"bops_variant": bops_variant, "official_qkv": official_qkv}
    layers: list[LayerReport] = []
    symbols: dict[str, str] = {}
    for gi, g in enumerate(graphs):
        symbols.update({nm: f"dim 0 of the inputs (example: {v})"
                        for nm, v in g.batch_symbols.values()})  # fmt: skip
        for node, plan in zip(g.nodes, g.plans):
            lay = _layer(gi, node, plan, config, opts, g.batch_symbols)
            if lay is not None:
                layers.append(lay)
    saved_result = None
    if saved:
        errors = [g.error for g in graphs if g.error]
        if errors:
            saved_result = SavedBytes(None, None, [], [], "; ".join(errors))
        else:
            parts = [g.saved for g in graphs if g.saved is not None]
            saved_result = SavedBytes(
                sum(p[0] for p in parts), sum(p[1] for p in parts),
                [t for p in parts for t in p[2]], [t for p in parts for t in p[3]],
            )  # fmt: skip
    opts.update(dynamic=dynamic, optimizer_states=optimizer_states, graphs=len(graphs))
    return Report(
        type(model).__name__,
        config,
        opts,
        layers,
        _paper_memory(meta_model, layers, official_qkv, optimizer_states),
        saved_result,
        symbols,
    )


# --------------------------------------------------------------------------- CLI

_EXAMPLES = """\
examples:
  # a factory returning a model (built on the meta device: no memory, no compute)
  hotcompile report mypkg.models:vit_b16 --input 1x3x224x224
  # the factory may return (model, example_inputs); integer inputs take a dtype suffix
  hotcompile report mypkg.llm:llama7b --input 1x2048:int64
  hotcompile report mypkg.models:resnet50 --input 32x3x224x224 --json --saved > r50.json
  hotcompile report mypkg.models:resnet50 --input 1x3x224x224 --csv --plot r50.png
  hotcompile report mypkg.models:vit_b16 --input 1x3x224x224 --dynamic --formulas
  # the paper's counting: HLA across the batch for 2-D inputs, the code's BOPs term
  hotcompile report mypkg.models:vit_b16 --input 1x3x224x224 \\
      --option hla_2d=batch --bops-variant code --official-qkv
  # library models (only when timm / transformers are installed), random weights; a
  # Hugging Face model type needs no download (its default configuration), a hub id does
  # (or a local directory holding its config.json)
  hotcompile report --timm vit_base_patch16_224 --input 1x3x224x224
  hotcompile report --hf gpt2 --input 1x1024:int64
  hotcompile report --hf llama --hf-config hidden_size=2048,intermediate_size=8192 \\
      --hf-config num_hidden_layers=8,num_attention_heads=16 --input 4x2048:int64
"""


def _parse_input(text: str) -> torch.Tensor:
    return parse_input_spec(text, device="meta")


def _load_model(args: argparse.Namespace) -> tuple[torch.nn.Module, Any]:
    """The model (built on meta) and its example inputs from a factory or a model hub."""
    with torch.device("meta"):
        model = library_model(args)
        if model is not None:
            return model, None
        if not args.model or ":" not in args.model:
            raise SystemExit("give a model as package.module:factory (or --timm / --hf)")
        return load_factory(args.model)


def _run(args: argparse.Namespace) -> int:
    model, inputs = _load_model(args)
    if args.input:
        inputs = tuple(args.input)
    if inputs is None:
        raise SystemExit("no example inputs: pass --input SHAPE (e.g. --input 1x3x224x224)")
    rep = report(
        model,
        inputs,
        dict(args.option or []),
        dynamic=args.dynamic,
        saved=args.saved,
        bops_variant=args.bops_variant,
        official_qkv=args.official_qkv,
    )
    if args.json:
        text = json.dumps(rep.to_json(formulas=args.formulas), indent=2)
    elif args.csv:
        text = rep.to_csv()
    else:
        text = rep.table(formulas=args.formulas)
    print(text)
    if args.plot:
        rep.plot(args.plot)
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``report`` subcommand to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="static per-layer cost report (FLOPs, bit-ops, memory), baseline vs HOT",
        description=textwrap.dedent("""\
            Static cost report of HOT for a model: per linear/conv layer, the plan the hot
            backend makes (path, reason when skipped, bit-widths, quantizer), L, O, I, the
            FLOPs of the vanilla backward and HOT's overhead (supplement Table 5), bit-ops
            FP vs HOT, the paper's activation-memory model, and (with --saved) the
            bytes the compiled training graph saves, plain vs HOT.
            The model is built on the meta device and compiled on fake tensors: no real
            compute runs, so a 7B-parameter model takes seconds."""),
        epilog=_EXAMPLES,
    )
    p.add_argument("model", nargs="?", help="package.module:factory returning a model "
                   "or (model, example_inputs); called under torch.device('meta')")  # fmt: skip
    p.add_argument("--input", action="append", type=_parse_input, metavar="SHAPE[:DTYPE]",
                   help="an example input shape, e.g. 1x3x224x224 or 1x512:int64; "
                   "repeat for several positional inputs")  # fmt: skip
    add_library_model_args(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON")
    fmt.add_argument("--csv", action="store_true", help="print CSV (one row per layer)")
    p.add_argument("--plot", metavar="FILE.png", help="also write per-layer bar charts")
    p.add_argument("--formulas", action="store_true", help="print the sympy formulas")
    p.add_argument("--dynamic", action="store_true", help="dynamic batch: L in terms of B")
    p.add_argument("--saved", action="store_true",
                   help="also measure the bytes the compiled training graph saves, plain vs "
                   "HOT (AOTAutograd on fake tensors; slower: ViT-B ~25 s)")  # fmt: skip
    p.add_argument("--bops-variant", choices=cost.BOPS_VARIANTS, default="table5",
                   help="'code' uses the official code's I*(r/n)*O term")  # fmt: skip
    p.add_argument(
        "--official-qkv",
        action="store_true",
        help="the official memory model's unexplained x4 for layers named qkv",
    )
    p.add_argument(
        "--option",
        action="append",
        type=parse_option,
        metavar="KEY=VALUE",
        help="a HotConfig option, e.g. gx_bits=8 or exclude=('head',)",
    )
    p.set_defaults(func=_run)
    return p

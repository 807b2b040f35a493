"""The HOT rewrite pass over the Dynamo graph.

Every ``F.linear`` and every ``F.conv2d`` with ``groups == 1`` whose weight or input needs a
gradient is replaced by a call of :func:`hotcompile.autograd.hot_linear` /
:func:`hotcompile.autograd.hot_conv2d` carrying that layer's :class:`LayerSpec`. The forward
computation is unchanged; AOTAutograd then traces HOT's backward. Layers left alone are logged
with the reason on the ``hotcompile`` logger (``TORCH_LOGS=+hotcompile``) and listed in the plan.

Eligibility is decided on static facts only (weight shapes, dtypes, conv parameters, names),
never on the token count, which is symbolic under ``dynamic=True``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import operator
from typing import Any

import torch
import torch.nn.functional as F

from hotcompile import fp8, lqs
from hotcompile.autograd import LayerSpec, hot_conv2d, hot_linear, hot_swiglu, is_empty
from hotcompile.config import HotConfig
from hotcompile.hla import hla_rows
from hotcompile.lowering import hot as native
from hotcompile.lowering.gate import Shape, Speed, decide
from hotcompile.passes import family
from hotcompile.passes.family import EMBEDDING_TARGETS, token_sequence_nodes  # noqa: F401 (re-exported)
from hotcompile.passes.matmul import (
    Scope,
    WeightCall,
    arg,
    module_path,
    node_objects,
    parameter_name,
    parameter_nodes,
    value,
    weight_calls,
)
from hotcompile.quant import has_fp8_gemm

log = logging.getLogger("hotcompile")

#: what each ``LayerPlan.path`` means (the plan table's legend, ``hotcompile.PlanTable``)
PATHS: dict[str, str] = {
    "hot": "HOT's backward: g_x through HQ (Hadamard + low-bit GEMM), g_w through HLA + low-bit "
    "codes of the saved, compressed activation (ABC)",
    "gx_only": "frozen weight (requires_grad=False, e.g. a LoRA base): only g_x runs HOT; no "
    "g_w is computed and nothing is saved for one",
    "exact": "exact=True: HOT's autograd Function with every transform off (checks the plumbing)",
    "fp8_forward": 'forward="fp8" where HOT\'s backward does not pay but the FP8 forward does '
    "(the speed gate's measurement): the forward GEMM in FP8, autograd's exact backward",
    "skipped": "autograd's own backward; the reason column says why (the speed gate's 'speed:' "
    "rows: HOT measured no faster than the exact bf16 backward on this GPU)",
    "inference": "compiled without gradients (torch.no_grad, inference_mode, or nothing needs "
    "a grad): there is no backward, so nothing is rewritten and the forward is plain",
}
#: the paths whose layers run HOT's autograd Function (``LayerPlan.rewritten``)
REWRITTEN_PATHS = frozenset({"hot", "gx_only", "exact", "fp8_forward"})
#: the paths whose layers run HOT's backward (HQ / HLA / ABC): the layers a run counts as HOT
HOT_PATHS = frozenset({"hot", "gx_only"})
#: the reason of a ``gx_only`` layer
GX_ONLY_REASON = (
    "weight frozen (requires_grad=False): only g_x runs HOT; no g_w, nothing saved for it"
)
#: the reason of an ``exact`` layer
EXACT_REASON = "exact=True: HOT's Function with every transform off (full-precision backward)"
#: the reason of an ``fp8_forward`` layer (the gate's times follow it)
FP8_FORWARD_REASON = "FP8 forward, exact backward"
#: the reason of an ``inference`` layer
INFERENCE_REASON = (
    "compiled without gradients: no backward to rewrite; takes HOT's backward when compiled "
    "for training"
)


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """What the rewrite decided for one layer of one compiled graph.

    ``op``: the call as the model wrote it (``linear``, ``addmm``, ``matmul``, ...; a matmul
    with a weight operand runs as the linear layer it is); ``region``: ``"checkpoint"`` for a
    layer inside an activation-checkpointed region (its forward is recomputed in the backward).
    ``path``: one of :data:`PATHS` — ``"hot"`` (HQ g_x + HLA g_w), ``"gx_only"`` (frozen
    weight: HQ g_x, nothing saved for g_w), ``"exact"`` (config.exact: rewritten, every
    transform off), ``"skipped"`` (autograd's backward) or ``"inference"`` (the graph was
    compiled without gradients: no backward exists to rewrite). ``reason`` says why for every
    path but ``"hot"``. ``graph``: the backend's index of the compiled graph the plan belongs
    to (0 outside the backend's records). ``hla_plan``: the plan's HLA choice for this
    layer ``(hla, e_hla, rule)`` when the plan made one (``spec.hla_rows`` is what runs).
    ``gy_from``: who makes HQ's operand of this layer's g_y when the layer does not quantize
    it itself (``"SwiGLU backward (gate * up)"`` for a gated MLP's gate and up layers under
    ``HotConfig.swiglu_hq``); empty where the layer's backward reads g_y in a pass of its own.
    """

    name: str
    kind: str
    weight_shape: tuple[int, ...]
    path: str
    reason: str = ""
    spec: LayerSpec | None = None
    static_rule: str = ""
    needs_gx: bool = True
    hla_plan: tuple[bool, float | None, str] | None = None
    speed: Speed | None = None
    op: str = ""
    region: str = ""
    recipe: str = ""
    gy_from: str = ""
    graph: int = 0
    forward_reason: str = ""

    @property
    def forward(self) -> str:
        """The layer's forward GEMM: ``"bf16"`` (as the model wrote it; every layer HOT does
        not run), ``"fp8 rowwise"`` or ``"fp8 tensorwise"`` (``HotConfig.forward="fp8"``)."""
        if self.spec is None or not self.rewritten or self.spec.forward == "bf16":
            return "bf16"
        return self.spec.forward.replace("_", " ")

    @property
    def rewritten(self) -> bool:
        """The layer's backward is HOT's autograd Function (``hot``, ``gx_only``, ``exact``);
        ``skipped`` and ``inference`` layers run autograd's backward or none at all."""
        return self.path in REWRITTEN_PATHS

    @property
    def kind_text(self) -> str:
        """``linear``, or ``linear (addmm)`` for a layer written as another matmul, with
        ``, checkpoint`` for one inside an activation-checkpointed region."""
        text = self.kind if not self.op or self.op == self.kind else f"{self.kind} ({self.op})"
        return f"{text}, {self.region}" if self.region else text

    @property
    def quantizer(self) -> str | None:
        """Quantizer of the g_x operand: ``per_token``/``per_tensor``; for a layer under LQS
        the runtime decision, or ``"lqs (calibrating)"`` before its first backward."""
        s = self.spec
        if s is None or not s.gx_quantized or not self.needs_gx:
            return None
        if s.gx_scaling != "lqs":
            return s.gx_scaling
        st = lqs.get(s.lqs_key)
        return st.decision if st is not None and st.decision else "lqs (calibrating)"

    @property
    def quantizer_rule(self) -> str:
        """Why that quantizer: the config, the plan, or LQS's measured errors."""
        s = self.spec
        if s is None or not s.gx_quantized or not self.needs_gx:
            return ""
        if s.gx_scaling != "lqs":
            return self.static_rule
        st = lqs.get(s.lqs_key)
        if st is None or not st.decision:
            return "LQS: measured on the first backward step(s), then frozen"
        return st.rule

    @property
    def lqs_errors(self) -> tuple[float | None, float | None] | None:
        """(e_token, e_tensor) measured by LQS, if this layer was calibrated at run time."""
        s = self.spec
        st = lqs.get(s.lqs_key) if s is not None and s.lqs_key else None
        return (st.e_token, st.e_tensor) if st is not None and st.decision else None

    @property
    def hla_choice(self) -> tuple[bool, float | None, str] | None:
        """The measured HLA choice ``(hla, e_hla, rule)``: from this run's calibration
        (:func:`hotcompile.calibrate`) or from the plan; None when nothing was measured."""
        s = self.spec
        if s is None or self.path != "hot":
            return None
        st = lqs.get(s.lqs_key) if s.lqs_key else None
        if st is not None and st.hla is not None:
            return st.hla, st.e_hla, st.hla_rule
        return self.hla_plan

    def describe(self) -> dict[str, Any]:
        """One row of the plan table."""
        s = self.spec
        hot = s is not None and self.path in ("hot", "gx_only")
        gw = "-"
        if hot and self.path == "hot":
            gw = (
                "exact"
                if s.gw_exact
                else (
                    f"{'HLA r=' + str(len(s.hla_rows)) + ' ' if s.hla_rows else ''}"
                    f"{'signs ' if s.hla_rows and s.hla_signs else ''}"
                    f"{_gw_codes(s)}"
                )
            )
        gx = "-"
        if hot and not self.needs_gx:
            gx = "- (input needs no grad)"
        elif hot:
            hq = "HQ" if s.hadamard else "no-Hadamard"
            codes = "FP8" if s.gx_format == "fp8" else f"INT{s.gx_bits}"
            gx = f"{hq} {codes} {self.quantizer}" if s.gx_quantized else "exact"
        return {
            "layer": self.name,
            "kind": self.kind_text,
            "weight": "x".join(map(str, self.weight_shape)),
            "path": self.path,
            "g_x": gx,
            "g_w": gw,
            "rounding": s.rounding if hot else "-",
            "recipe": self.recipe if hot else "-",
            "forward": self.forward,
            "speed-up": self.speedup_text(),
            "note": "; ".join(filter(None, self._notes())),
        }

    def _notes(self) -> tuple[str, ...]:
        """The reason column: why the layer is not ``hot`` (or HLA's plan note), where g_y's
        codes come from, and why its forward is not the configured one."""
        return (self.reason or self._hla_note(), self._gy_note(), self.forward_reason)

    def _gy_note(self) -> str:
        """Where HQ's g_y operand comes from when another kernel writes it."""
        return f"g_y's HQ codes from the {self.gy_from}" if self.gy_from else ""

    def speedup_text(self) -> str:
        """HOT's backward speed-up over bf16 for this layer and where the number comes from:
        ``"1.21x measured"`` (this GPU) or ``"0.64x H100 model"``; ``"-"`` when not gated."""
        if self.speed is None:
            return "-"
        src = "measured" if self.speed.source == "measured" else "H100 model"
        share = f", x's ABC shared by {self.speed.shared}" if self.speed.shared > 1 else ""
        return f"{self.speed.speedup:.2f}x {src}{share}"

    def _hla_note(self) -> str:
        """Why the g_w path runs without HLA on a layer whose config allows it."""
        choice = self.hla_choice
        if choice is None or choice[0]:
            return ""
        return f"HLA off: {choice[2]}" if choice[2] else "HLA off by plan"


def _gw_codes(s: LayerSpec) -> str:
    """The g_w path's code format in the plan table: INT8, FP8 (e4m3) or fp32."""
    if not s.gw_bits:
        return "fp32"
    return "FP8" if s.gw_format == "fp8" and s.gw_bits == 8 else f"INT{s.gw_bits}"


def layer_name(node: torch.fx.Node) -> str:
    """The module path of the layer a node belongs to, as ``model.named_modules()`` spells it."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return node.name
    path = list(stack.values())[-1][0]
    return module_path(str(path)) or node.name


def _meta(node: Any) -> torch.Tensor | None:
    """The example tensor of ``node`` (a tensor as is); None for anything else."""
    v = value(node)
    return v if isinstance(v, torch.Tensor) else None


def _conv_padding(padding: Any, weight: torch.Tensor, dilation: tuple[int, int], stride):
    """Numeric (ph, pw) for conv2d's padding argument, or None when it cannot be expressed."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0)
        if padding == "same" and tuple(stride) == (1, 1):
            total = [d * (k - 1) for d, k in zip(dilation, weight.shape[-2:])]
            if all(t % 2 == 0 for t in total):
                return (total[0] // 2, total[1] // 2)
        return None
    return _pair(padding)


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else tuple(int(i) for i in v)


#: why the native path quantizes per token where the config says "lqs" and no plan decides
NATIVE_LQS_RULE = (
    "native path: per-token (its row max-abs comes with the pass that writes the codes, so it "
    "costs what per-tensor costs, and its step is never coarser); run-time LQS needs "
    "lowering='ops' or a plan from hotcompile.calibrate"
)


def _lowering(config: HotConfig, kind: str, x: torch.Tensor, probe_hla: bool) -> str:
    """``"native"`` or ``"ops"`` for one layer (``HotConfig.lowering``)."""
    if config.lowering == "ops" or probe_hla or kind != "linear":
        return "ops"
    if config.lowering == "native":
        return "native"
    ok = (
        x.device.type == "cuda"
        and config.compiler != "eager"
        and config.rounding in native.ROUNDINGS
        and not config.warmup_steps
    )
    return "native" if ok else "ops"


def gw_format_of(config: HotConfig, lowering: str, device: torch.device | None = None) -> str:
    """``gw_format="auto"``: FP8-e4m3 g_w codes on the native path (Hopper's FP8 GEMM is the
    fast one) where ``device`` multiplies FP8, INT8 elsewhere (a GPU without FP8, the ops
    lowering) and whenever g_w is not 8 bits. ``device`` None or meta: as on an H100."""
    if config.gw_format != "auto":
        return config.gw_format
    fp8_device = device is None or device.type == "meta" or has_fp8_gemm(device)
    return "fp8" if lowering == "native" and config.gw_bits == 8 and fp8_device else "int8"


def _scaling(config: HotConfig, name: str, lowering: str = "ops") -> tuple[str, str]:
    """The g_x quantizer of a layer and the rule that chose it (before any calibration)."""
    entry = config.plan.get(name) if config.plan is not None else None
    if entry is not None:
        return entry.quantizer, f"plan: {entry.rule or 'given'}"
    if config.gx_scaling == "lqs":
        if lowering == "native":
            return "per_token", NATIVE_LQS_RULE
        return "lqs", ""
    return config.gx_scaling, f"config gx_scaling={config.gx_scaling!r}"


def _hla_plan(config: HotConfig, name: str) -> tuple[bool, float | None, str] | None:
    """The plan's HLA choice for a layer, if the plan made one."""
    entry = config.plan.get(name) if config.plan is not None else None
    if entry is None or entry.hla is None:
        return None
    return entry.hla, entry.e_hla, f"plan: {entry.hla_rule or 'given'}"


def _lqs_key(
    config: HotConfig, name: str, weight: Any, scaling: str, probe_hla: bool = False
) -> str:
    """Key of the layer's runtime LQS / warm-up / HLA-probe state: one per (weight, settings)."""
    if scaling != "lqs" and not config.warmup_steps and not probe_hla:
        return ""
    settings = (
        config.lqs_calibration_steps,
        config.lqs_metric,
        config.lqs_threshold,
        config.warmup_steps,
        config.gx_bits,
        config.block_size,
        config.hadamard,
        config.hla_threshold,
        probe_hla,
    )
    key = f"{name}@{id(weight):x}/{hash(settings) & 0xFFFFFFFF:08x}"
    lqs.state(
        key,
        name=name,
        calibration_steps=config.lqs_calibration_steps,
        metric=config.lqs_metric,
        threshold=config.lqs_threshold,
        warmup_steps=config.warmup_steps,
        hla_threshold=config.hla_threshold if probe_hla else None,
    )
    return key


def _spec(
    config: HotConfig,
    name: str,
    kind: str,
    scaling: str,
    key: str,
    hla: bool,
    signs: bool = False,
    lowering: str = "ops",
    device: torch.device | None = None,
    **conv: Any,
) -> LayerSpec:
    """The layer's spec; ``hla``: this layer runs HLA (config.hla and not turned off by the
    plan). Without HLA the g_w path quantizes x and g_y only (``hla_rows`` empty). ``signs``:
    HLA with random signs (``config.hla_signs``, resolved for this layer). ``lowering``: the
    layer's (:func:`_lowering`), which with ``device`` also resolves ``gw_format="auto"``."""
    return LayerSpec(
        name=name,
        kind=kind,
        gx_bits=config.gx_bits,
        gx_format=config.gx_format,
        hadamard=config.hadamard,
        gx_scaling=scaling,
        lqs_key=key,
        weight_scale=config.weight_scale,
        gw_bits=config.gw_bits,
        gw_format=gw_format_of(config, lowering, device),
        hla_rows=hla_rows(config.hla_rows, config.rank, config.block_size) if hla else (),
        block=config.block_size,
        rounding=config.rounding,
        abc=config.abc,
        abc_max_abs=config.abc_max_abs,
        weight_codes_late=config.weight_codes_late,
        hla_signs=signs,
        hla_2d=config.hla_2d,
        exact=config.exact,
        check=config.check_nonfinite == "once",
        lowering=lowering,
        fast_accum=config.fp8_fast_accum,
        **conv,
    )


def _selected(config: HotConfig, name: str, numel: int) -> str:
    """Empty string when the layer is selected, else the reason it is not."""
    for pat in config.exclude:
        if fnmatch.fnmatchcase(name, pat):
            return f"excluded by pattern {pat!r}"
    if config.include and not any(fnmatch.fnmatchcase(name, p) for p in config.include):
        return "not matched by any include pattern"
    if numel < config.min_weight_numel:
        return f"weight has {numel} elements < min_weight_numel={config.min_weight_numel}"
    return ""


def _hint(d: Any) -> int:
    """A size as an int without guarding on it: a symbolic size's hint (``int()`` would
    specialize a dynamic batch), else the value."""
    if isinstance(d, torch.SymInt):
        hint = getattr(d.node, "hint", None)
        return int(hint) if hint is not None else 1024
    return int(d)


#: why the gate keeps conv layers exact on CUDA (with prefer="speed")
CONV_GATE_REASON = (
    "speed: conv layers have no inductor-native HOT path yet, and the ops path is host-bound "
    "on a GPU (ResNet-50 step 0.13x of inductor's); prefer='memory' or 'paper' keeps HOT here"
)


def _gate(
    spec: LayerSpec,
    kind: str,
    x: torch.Tensor,
    out_features: int,
    need_gw: bool,
    native_gw_format: str = "fp8",
    w_dtype: torch.dtype = torch.float32,
    x_readers: int = 1,
    forward: str = "bf16",
) -> tuple[Speed | None, str]:
    """``prefer="speed"``: the gate's times for this layer (measured on CUDA, the roofline
    model on meta tensors, both of the native path) and the reason to keep the exact backward
    ("" when HOT is faster). ``x_readers``: layers sharing x's ABC (:func:`_share_abc`); layers
    with HLA's signs quantize their own x."""
    if x.device.type == "meta" and kind == "linear":
        spec = dataclasses.replace(spec, lowering="native", gw_format=native_gw_format)
    if kind != "linear":
        return None, CONV_GATE_REASON
    if spec.lowering != "native":
        # the ops lowering was asked for (lowering="ops") or forced by settings the native
        # path does not take (warm-up, stochastic rounding): the user wants HOT's numerics
        # there, and timing a host-bound path per layer would say nothing about its step
        return None, ""
    I, O = _hint(x.shape[-1]), _hint(out_features)
    L = 1
    for d in x.shape[:-1]:
        L *= _hint(d)
    if x.dim() == 2:
        N, S, grid_w = 1, L, 0
    else:
        N = _hint(x.shape[0])
        S = L // max(N, 1)
        grid_w = _hint(x.shape[2]) if x.dim() == 4 else 0
    if L == 0:
        return None, ""
    shape = Shape(
        L=L, O=O, I=I, N=N, S=S, grid_w=grid_w, rows=tuple(spec.hla_rows),
        gx_bits=spec.gx_bits, per_token=spec.gx_scaling != "per_tensor", gw_bits=spec.gw_bits,
        gw_rounding=spec.gw_rounding, rounding=spec.gx_rounding, weight_scale=spec.weight_scale,
        signs=spec.hla_signs and bool(spec.hla_rows), need_gx=x.requires_grad,
        need_gw=need_gw,
        dtype="bfloat16" if torch.is_autocast_enabled("cuda") or x.dtype == torch.bfloat16
        else str(x.dtype).replace("torch.", ""),
        wdtype=str(w_dtype).replace("torch.", ""),
        x_amax_given=spec.abc_max_abs == "producer",
        x_readers=1 if (spec.hla_signs and spec.hla_rows) or not spec.abc else x_readers,
        forward=forward,
        fast_forward=forward != "bf16" and spec.fast_forward,
        fast_gx=spec.fast_gx,
    )  # fmt: skip
    speed = decide(shape, x.device)
    return speed, "" if speed.hot else f"speed: {speed.describe()}"


def _make_call(fn, spec: LayerSpec):
    """A graph-callable closure ``fn(x, w, b, spec=spec)`` (FX stores it as a global)."""

    def call(x, weight, bias=None):
        return fn(x, weight, bias, spec)

    call.__name__ = call.__qualname__ = fn.__name__
    call.hot_spec = spec  # type: ignore[attr-defined]
    return call


def _fake_value(fn, *args: Any) -> Any:
    """``fn`` applied to the example values of ``args`` (fake tensors: no compute)."""
    vals = [_meta(a) if isinstance(a, torch.fx.Node) else a for a in args]
    if any(isinstance(a, torch.fx.Node) and v is None for a, v in zip(args, vals)):
        return None
    try:
        with torch.no_grad():
            return fn(*vals)
    except Exception:  # noqa: BLE001 - a value for display only; the graph is what runs
        return None


def _add(graph: torch.fx.Graph, like: torch.fx.Node, target, args: tuple, fn) -> torch.fx.Node:
    """A new call before ``like`` with ``like``'s metadata (module stack, source) and its own
    example value (``fn`` on the example values of ``args``)."""
    kind = "call_method" if isinstance(target, str) else "call_function"
    with graph.inserting_before(like):
        node = graph.create_node(kind, target, args)
    node.meta.update({k: v for k, v in like.meta.items() if k not in ("example_value", "val")})
    val = _fake_value(fn, *args)
    if val is not None:
        node.meta["example_value"] = val
    return node


def _emit(gm: torch.fx.GraphModule, call: WeightCall, fn, spec: LayerSpec) -> None:
    """Write ``call`` as ``fn`` (``hot_linear``/``hot_conv2d``) in its linear form."""
    node = call.node
    if call.rewritable_form:
        node.target = _make_call(fn, spec)
        node.args = (call.x, call.weight, call.bias)
        node.kwargs = {}
        return
    g = gm.graph
    x, w = call.x, call.weight
    if call.weight_left:
        x = _add(g, node, "transpose", (x, -1, -2), lambda v, a, b: v.transpose(a, b))
    if call.transposed:
        w = _add(g, node, "t", (w,), lambda v: v.t())
    y = _add(g, node, _make_call(fn, spec), (x, w, call.bias), F.linear)
    if call.weight_left:
        y = _add(g, node, "transpose", (y, -1, -2), lambda v, a, b: v.transpose(a, b))
    if call.unflatten:
        y = _add(g, node, "flatten", (y, 0, -2), lambda v, a, b: v.flatten(a, b))
    if call.bias_add is not None:
        y = _add(g, node, "add", (y, call.bias_add), lambda a, b: a + b)
    y.meta.update(node.meta)  # the value the model's next op reads is the call's own
    node.replace_all_uses_with(y)
    g.erase_node(node)


def _name(call: WeightCall, scope: Scope, seen: dict[str, int]) -> str:
    """The layer's name: its module's path (``h.0.attn.c_attn``); for a matmul with a
    parameter that is not that module's ``weight``, or a call outside any submodule, the
    parameter's path (``blocks.0.W``).
    Repeated calls of one module get ``:1``, ``:2``, ..."""
    name = layer_name(call.node)
    in_module = name != call.node.name  # else: called at the model's top level
    if (not call.rewritable_form or not in_module) and call.param is not None:
        pname = parameter_name(scope.outer_node(call.param))
        if pname and pname != f"{name}.weight" and pname != name:
            name = pname.removesuffix(".weight")
    seen[name] = seen.get(name, 0) + 1
    return f"{name}:{seen[name] - 1}" if seen[name] > 1 else name


def rewrite(
    gm: torch.fx.GraphModule,
    config: HotConfig,
    example_inputs: Any = None,
    probe_hla: bool = False,
    inference: bool = False,
) -> list[LayerPlan]:
    """Rewrite ``gm`` in place; return the plan of every weight call it saw.

    Weight calls are ``F.linear``, ``F.conv2d``, and every matmul with a parameter operand
    (:mod:`hotcompile.passes.matmul`), inside activation-checkpointed regions too. Each is
    rewritten or listed with the reason it keeps autograd's backward.

    ``example_inputs`` (what the backend receives) identify each layer's weight tensor, which
    keys its runtime LQS state; without them a layer's state is keyed by ``gm`` instead.
    ``probe_hla`` (calibration only, eager compiler): layers that would run HLA keep x in full
    (ABC off) and measure HLA's g_w error in their backward, for the plan's HLA choice.
    ``inference``: the graph is compiled without gradients (AOTAutograd traces no backward):
    ``gm`` is left as it is, and each layer HOT would take is planned ``"inference"`` after
    the static checks only (no speed gate, no LQS state): its reasons for skipping a layer
    still show, and nothing claims a rewrite that cannot happen.
    """
    weights = node_objects(gm, example_inputs)
    root = Scope(gm, parameter_nodes(gm, example_inputs))
    # per-layer text/image decisions: hla_signs="auto" and recipe="auto"
    auto = config.hla_signs == "auto" or config.recipe == "auto"
    # family.token_nodes: token_sequence_nodes(gm) plus the marks a split graph carries from
    # the rest of its model (DDPOptimizer pieces, graph breaks, FSDP2: passes/family.py)
    tokens: dict[int, set] = {id(gm): family.token_nodes(gm, example_inputs) if auto else set()}
    plans: list[LayerPlan] = []
    seen: dict[str, int] = {}
    touched: set[torch.fx.GraphModule] = {gm}
    calls = list(weight_calls(root))
    readers = _x_readers(calls)
    items = []
    last = len(calls) - 1
    for i, (scope, call) in enumerate(calls):
        if id(scope.gm) not in tokens:  # a HOP body: its inputs carry the outer marks
            outer = tokens.get(id(scope.outer.gm), set()) if scope.outer else set()
            tokens[id(scope.gm)] = token_sequence_nodes(scope.gm, scope, outer) if auto else set()
        name = _name(call, scope, seen)
        args = (config, scope, call, name, weights, tokens[id(scope.gm)], probe_hla)
        n_readers = readers.get(_x_key(scope, call), 1)
        head = i == last and _ends_the_model(call.node)
        plan = _plan_call(*args, n_readers, inference=inference, head=head)
        items.append([scope, call, args, plan])
    if inference:
        for item in items:
            log.info("hotcompile: %s (%s): %s", item[3].name, item[3].path, item[3].reason)
        return [item[3] for item in items]
    groups = _share_abc(items)
    # a DDPOptimizer piece: the readers of this graph's own inputs of linear layers, against
    # the readers of the same values in earlier pieces
    family.cut_readers(
        gm, {x: [item[3].name for item in g] for (gid, x), g in groups.items() if gid == id(gm)}
    )
    for scope, call, _, plan in items:
        plans.append(plan)
        if plan.path == "skipped":
            log.info("hotcompile: skip %s (%s): %s", plan.name, plan.kind_text, plan.reason)
            continue
        fn = hot_linear if call.kind == "linear" else hot_conv2d
        _emit(scope.gm, call, fn, plan.spec)
        touched.add(scope.gm)
        log.info(
            "hotcompile: %s (%s %s) -> %s",
            plan.name,
            plan.kind_text,
            "x".join(map(str, plan.weight_shape)),
            plan.path,
        )
    if config.swiglu_hq:
        by_name = {p.name: i for i, p in enumerate(plans)}  # unique: _name numbers repeats
        for m in touched:
            share = config.abc_swiglu_codes and config.abc_recompute_modes[1] == "unary"
            for gate, up in _fuse_swiglu(m, config.abc_swiglu_codes, share):
                what = f"SwiGLU backward ({gate} * {up})"
                if config.abc_swiglu_codes:
                    what += ", which saves both outputs as FP8 codes (abc_swiglu)"
                for i in (by_name[gate], by_name[up]):
                    plans[i] = dataclasses.replace(plans[i], gy_from=what)
    for m in touched:
        m.recompile()
    return plans


def _is_silu(node: Any) -> bool:
    """``F.silu(t)`` (not in place) as Dynamo writes a gated MLP's activation."""
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target is F.silu
        and len(node.args) == 1
        and not node.kwargs.get("inplace", False)
    )


def _linear_spec(node: Any) -> LayerSpec | None:
    """The spec of a HOT linear call (the rewrite's ``hot_linear`` node), else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    spec = getattr(node.target, "hot_spec", None)
    return spec if getattr(node.target, "__name__", "") == hot_linear.__name__ else None


def _hq_linear_spec(node: Any) -> LayerSpec | None:
    """The spec of a HOT linear call whose g_x runs native per-token HQ, else None."""
    spec = _linear_spec(node)
    if spec is None:
        return None
    ok = spec.lowering == "native" and spec.gx_quantized and spec.per_token and not spec.exact
    return spec if ok else None


def _fp8_forward_reader(node: torch.fx.Node) -> bool:
    """Whether ``node``'s one reader is a HOT linear call with the rowwise FP8 forward that
    reads it as its x: the SwiGLU's kernel then writes that layer's FP8 operand too."""
    users = list(node.users)
    if len(users) != 1 or users[0].args[:1] != (node,):
        return False
    spec = _linear_spec(users[0])
    return spec is not None and spec.forward == "fp8_rowwise"


def _fuse_swiglu(
    gm: torch.fx.GraphModule, codes: bool = False, share: bool = False
) -> list[tuple[str, str]]:
    """``HotConfig.swiglu_hq``: each ``silu(gate(x)) * up(x)`` whose gate and up are HOT
    linear calls on one x with the same HQ settings becomes ``hot_swiglu(gate(x), up(x))``
    (:class:`hotcompile.autograd.HotSwiGLUFunction`), whose backward makes HQ's operands of
    both gradients; ``codes``: it saves gate's and up's outputs as FP8 codes
    (``HotConfig.abc_swiglu``); ``share``: the HOT layer reading the product derives its ABC
    codes from those codes (``hotcompile.autograd._share_swiglu_codes``: with
    ``abc_recompute="unary"``, recomputed in the backward). Returns the fused pairs' layer
    names ``(gate, up)`` (also logged)."""
    fused = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (operator.mul, torch.mul):
            continue
        if len(node.args) != 2 or node.kwargs:
            continue
        for act, up in (node.args, node.args[::-1]):
            if not _is_silu(act) or len(act.users) != 1:
                continue
            gate = act.args[0]
            sg, su = _hq_linear_spec(gate), _hq_linear_spec(up)
            if sg is None or su is None or len(gate.users) != 1 or gate.args[0] is not up.args[0]:
                continue
            if (sg.gx_bits, sg.gx_rounding) != (su.gx_bits, su.gx_rounding):
                continue
            x = _meta(gate.args[0])
            if x is None:
                continue
            spec, in_features = sg, _hint(x.shape[-1])
            fp8_product = codes and share and _fp8_forward_reader(node)

            def call(a, b, spec=spec, in_features=in_features, codes=codes, share=share,
                     fp8_product=fp8_product):  # fmt: skip
                return hot_swiglu(a, b, spec, in_features, codes, share, fp8_product)

            call.__name__ = call.__qualname__ = hot_swiglu.__name__
            node.target, node.args = call, (gate, up)
            gm.graph.erase_node(act)
            fused.append((sg.name, su.name))
            log.info("hotcompile: silu(%s) * %s -> hot_swiglu (HQ of both in its backward)",
                     sg.name, su.name)  # fmt: skip
            break
    return fused


def _x_key(scope: Scope, call: WeightCall) -> tuple[int, Any] | None:
    """What identifies the x a linear call's ABC quantizes (None where it is not shared: a
    conv, or a matmul whose linear form reads a transpose the rewrite inserts per call)."""
    if call.kind != "linear" or call.weight_left or not isinstance(call.x, torch.fx.Node):
        return None
    return (id(scope.gm), call.x)


def _x_readers(calls: list[tuple[Scope, WeightCall]]) -> dict[tuple[int, Any], int]:
    """How many linear calls read each x (:func:`_x_key`): a Llama's q/k/v read one x, gate
    and up another."""
    n: dict[tuple[int, Any], int] = {}
    for scope, call in calls:
        key = _x_key(scope, call)
        if key is not None:
            n[key] = n.get(key, 0) + 1
    return n


def _share_abc(items: list[list]) -> dict[tuple[int, Any], list[list]]:
    """Keep the speed gate's shared charge for ABC only where it comes true.

    Layers that read one x and all take HOT quantize x once (``autograd.
    _native_compress_once``), so :func:`rewrite` plans each with 1/n of that quantization
    (``Shape.x_readers``): the Llama's q/k/v each took 201 µs alone against bf16's 193, and
    ~186 with a third of the shared ABC. Where a group's layers do not *all* take HOT so
    charged (one is excluded, or slower even with the share) the share would be wrong, and the
    group's layers are planned again with the whole ABC each: a layer the gate then takes is
    faster than bf16 whatever its neighbours do. ``items``: ``[scope, call, args, plan]``,
    each plan replaced in place. Returns the items grouped by the x they read
    (:func:`_x_key`)."""
    groups: dict[tuple[int, Any], list[list]] = {}
    for item in items:
        key = _x_key(item[0], item[1])
        if key is not None:
            groups.setdefault(key, []).append(item)
    for group in groups.values():
        if len(group) < 2 or all(item[3].path == "hot" for item in group):
            continue
        for item in group:
            shared, item[3] = item[3].speed, _plan_call(*item[2], 1)
            if shared is not None and shared.shared > 1 and item[3].reason.startswith("speed:"):
                # say what the share would have given (the Llama's q/k/v: close, not 3%)
                short = "not taken by all of them" if shared.hot else "short of the gate's 3%"
                why = (
                    f"{item[3].reason}; with x's ABC shared by {shared.shared}: HOT "
                    f"{shared.hot_us:.0f} µs ({shared.speedup:.2f}x), {short}"
                )
                item[3] = dataclasses.replace(item[3], reason=why)
    return groups


def _plan_call(
    config: HotConfig,
    scope: Scope,
    call: WeightCall,
    name: str,
    weights: dict,
    tokens: set,
    probe_hla: bool,
    x_readers: int = 1,
    inference: bool = False,
    head: bool = False,
) -> LayerPlan:
    """What to do with one weight call: a skipped plan with its reason, or the HOT plan whose
    ``spec`` the rewrite bakes into the graph. ``x_readers``: the layers reading this call's
    x, which share its ABC if all take HOT (:func:`_share_abc`). ``inference``: the graph has
    no backward; a layer that passes the static checks is planned ``"inference"``. ``head``:
    the model's head (:func:`_ends_the_model`), which keeps a bf16 forward under
    ``forward="fp8"``."""
    kind = call.kind
    text = call.x in tokens
    config = config.for_layer(text)
    recipe = config.recipe if config.recipe != "auto" else ("text" if text else "vision")
    region = "checkpoint" if scope.hop == "tag_activation_checkpoint" else ""
    xs, ws = call.linear_shapes()
    wshape = tuple(ws) if ws is not None else ()

    def skip(reason: str, speed: Speed | None = None) -> LayerPlan:
        return LayerPlan(
            name, kind, wshape, "skipped", reason, speed=speed, op=call.op, region=region,
            recipe=recipe,
        )  # fmt: skip

    if call.reason:
        return skip(call.reason)
    if scope.skip:
        return skip(scope.skip)
    x, w = _meta(call.x), _meta(call.weight)
    if x is None or w is None:
        return skip("input or weight is not a traced tensor")
    if not (x.is_floating_point() and w.is_floating_point()):
        return skip(f"dtype {x.dtype}/{w.dtype} is not floating point")
    if not (w.requires_grad or x.requires_grad):
        return skip("no gradient needed (weight frozen, input needs no grad)")
    if is_empty(x):
        return skip("empty input (no rows): autograd's exact backward")
    reason = _selected(config, name, w.numel())
    if reason:
        return skip(reason)
    conv: dict[str, Any] = {}
    node = call.node
    if kind == "conv2d":
        groups = arg(node, 6, "groups", 1)
        if groups != 1:
            return skip(f"groups={groups}: grouped/depthwise convs keep autograd's backward")
        if x.dim() != 4:
            return skip("unbatched conv2d input")
        stride = _pair(arg(node, 3, "stride", 1))
        dilation = _pair(arg(node, 5, "dilation", 1))
        padding = _conv_padding(arg(node, 4, "padding", 0), w, dilation, stride)
        if padding is None:
            return skip(
                f"padding={arg(node, 4, 'padding')!r} with stride {stride} is not supported"
            )
        conv = dict(stride=stride, padding=padding, dilation=dilation)
    if inference:
        return LayerPlan(
            name, kind, wshape, "inference", INFERENCE_REASON, op=call.op, region=region,
            recipe=recipe,
        )  # fmt: skip
    if call.weight_left:  # the linear form's input is x.mT
        x = x.transpose(-1, -2)
    lowering = _lowering(config, kind, x, probe_hla)
    scaling, rule = _scaling(config, name, lowering)
    hla_plan = _hla_plan(config, name)
    wkey = scope.outer_node(call.param if call.param is not None else call.weight)
    key = _lqs_key(config, name, weights.get(wkey, scope.gm), scaling, probe_hla)
    use_hla = config.hla and (hla_plan is None or hla_plan[0])
    signs = config.hla_signs is True or (config.hla_signs == "auto" and text)
    spec = _spec(config, name, kind, scaling, key, use_hla, signs, lowering, x.device, **conv)
    if kind == "linear" and x.dim() == 2 and config.hla_2d == "none":
        # one row per sample: no token dimension to low-pass, INT8 quantization only
        spec = dataclasses.replace(spec, hla_rows=())
    if probe_hla:
        spec = dataclasses.replace(spec, abc=False, hla_probe=bool(spec.hla_rows))
    forward, forward_reason = _forward(config, kind, x, wshape, head)
    spec = dataclasses.replace(spec, forward=forward)
    speed = None
    if config.prefer == "speed" and not config.exact and _gate_runs(x):
        # on CUDA the measured verdict decides; on meta tensors (hotcompile report) the
        # roofline model says what to expect on an H100 and decides nothing
        native_fmt = gw_format_of(config, "native")
        speed, why = _gate(
            spec, kind, x, wshape[0], w.requires_grad, native_fmt, w.dtype, x_readers, forward
        )
        if why and _gate_decides(x):
            if speed is not None and forward != "bf16" and speed.fp8_forward_alone:
                # HOT's backward does not pay here, the FP8 forward alone does: keep it, with
                # autograd's exact backward (HotLinearFunction with every transform off)
                return LayerPlan(
                    name, kind, wshape, "fp8_forward",
                    f"{FP8_FORWARD_REASON}; {why.removeprefix('speed: ')}",
                    dataclasses.replace(spec, exact=True), rule, x.requires_grad, None, speed,
                    op=call.op, region=region, recipe=recipe,
                )  # fmt: skip
            return skip(why, speed)
        if speed is not None and forward != "bf16" and not speed.fp8_forward:
            times = f"FP8 {speed.fwd_fp8_us:.0f} µs vs bf16 {speed.fwd_bf16_us:.0f} µs"
            if _gate_decides(x):
                forward_reason = f"forward: {times} measured: bf16 forward"
                spec = dataclasses.replace(spec, forward="bf16")
            else:  # meta tensors: the model only says what a GPU's gate would likely do
                forward_reason = f"forward: the H100 model expects {times}: a GPU may keep bf16"
    path = "exact" if config.exact else ("hot" if w.requires_grad else "gx_only")
    reason = {"exact": EXACT_REASON, "gx_only": GX_ONLY_REASON}.get(path, "")
    return LayerPlan(
        name, kind, wshape, path, reason, spec, rule, x.requires_grad, hla_plan, speed,
        op=call.op, region=region, recipe=recipe, forward_reason=forward_reason,
    )  # fmt: skip


def _gate_runs(x: torch.Tensor) -> bool:
    """Whether ``prefer="speed"``'s gate times the layer: on CUDA (measured) and on meta
    tensors (its roofline model, for ``hotcompile report``); the CPU runs every eligible
    layer on HOT, as the tests and the CPU demos want."""
    return x.device.type in ("cuda", "meta")


def _gate_decides(x: torch.Tensor) -> bool:
    """Whether the speed gate's verdict decides the plan: on CUDA, where it measured. On meta
    tensors (``hotcompile report``) its roofline model only says what to expect."""
    return x.device.type == "cuda"


def _ends_the_model(node: torch.fx.Node, limit: int = 256) -> bool:
    """Whether the graph's last weight call is the model's head: nothing after it mixes its
    output with another floating-point activation, and the graph hands on no activation of
    its own beside what the head made. A head's logits reach the graph's outputs or the loss
    through views, casts and reductions, meeting only integer targets; the last layer of a
    graph that ends inside the model meets the residual stream (``h + down(...)``: an FSDP2
    block) or rotary tables first, or, where the graph is cut right after it (a DDPOptimizer
    piece ending at q_proj, a graph break), the graph also returns the residual stream for
    the next piece. Past ``limit`` nodes it is taken for a head (a bf16 forward: the safe
    side). A model that returns a hidden state beside its logits (a value head) gives its LM
    head the FP8 forward: ``exclude`` keeps such a layer off HOT."""
    seen, todo = {node}, [node]
    while todo:
        n = todo.pop()
        for user in n.users:
            if user in seen or user.op == "output":
                continue
            for a in user.all_input_nodes:
                if a in seen or a.op in ("placeholder", "get_attr"):
                    continue
                if _activation(a):
                    return False  # another activation joins: the model goes on
            seen.add(user)
            if len(seen) > limit:
                return True
            todo.append(user)
    out = next((n for n in reversed(node.graph.nodes) if n.op == "output"), None)
    handed_on = out.all_input_nodes if out is not None else []
    return not any(
        a not in seen and a.op not in ("placeholder", "get_attr") and _activation(a)
        for a in handed_on
    )


def _activation(n: torch.fx.Node) -> bool:
    """A floating-point tensor with at least one dim (not a scalar loss or a count)."""
    val = _meta(n)
    return isinstance(val, torch.Tensor) and val.is_floating_point() and val.dim() > 0


#: why the model's head keeps a bf16 forward under ``forward="fp8"``
HEAD_FORWARD_REASON = "forward: bf16 for the model's last layer (a head), as FP8 recipes keep it"


def _forward(
    config: HotConfig, kind: str, x: torch.Tensor, wshape: tuple[int, ...], head: bool
) -> tuple[str, str]:
    """The layer's forward GEMM (``LayerSpec.forward``) and, where ``forward="fp8"`` was asked
    for and the layer keeps bf16, why."""
    if config.forward == "bf16":
        return "bf16", ""
    if config.exact:
        return "bf16", "forward: exact=True keeps every part in full precision"
    if kind != "linear":
        return "bf16", "forward: the FP8 forward is for linear layers (conv keeps bf16)"
    if head:
        return "bf16", HEAD_FORWARD_REASON
    why = fp8.unsupported(_hint(x.shape[-1]), wshape[0])
    if why:
        return "bf16", why
    return f"fp8_{config.forward_scaling}", ""

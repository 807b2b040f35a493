"""LQS: layer-wise quantizer selection for the INT4 operand of the g_x path.

Per layer, HOT quantizes ``Ĝ = g_y·B_O`` either per token (one scale per row) or per tensor
(cheaper). The official rule, decided once on real gradients of the user's loss and then
frozen: **per-token iff e_token < 0.5 · e_tensor**, where ``e = ‖G − deq(Q4(G))‖_F``, measured
by default on the operand actually quantized (``Ĝ``; the official code measures raw ``g_y``,
available as ``lqs_metric="raw"``).

How the decision reaches the compiled graph without recompiling: the quantizer choice is not
baked into the graph. The HQ ops receive a per-layer key and look up the layer's runtime state
here. During the first ``lqs_calibration_steps`` backward calls of a layer the op returns the
exact ``g_y·W`` and accumulates both errors; then the decision freezes and every later call
quantizes with it. The compiled graph is the same throughout: zero recompiles. (With CUDA
graphs, calibrate first with :func:`hotcompile.calibrate` and pass the plan, since a captured
graph does not re-run Python.)

A :class:`Plan` records the decisions and errors; it round-trips through JSON and can be
applied with ``options={"plan": plan}``, skipping calibration.

The same per-layer state counts backward calls for the precision warm-up (``warmup_steps``:
the g_x path runs INT8 instead of INT4 for the first steps, the paper's pre-training recipe).

**The HLA choice** lives in the same state and plan. HLA replaces ``g_yᵀ x`` by
``g_yᵀ Π x`` (Π: the projector onto the kept low-sequency Walsh coefficients of each 16-block
along L). That is harmless where g_y and x are smooth along L (4x4 image patches) and loses
much of g_w where they are not (bytes of text). :func:`hotcompile.calibrate` measures, per
layer, on the real g_y and x of its calibration backward, ``e_hla = ‖g_yᵀΠx − g_yᵀx‖_F /
‖g_yᵀx‖_F`` (the projection alone: the INT8 quantization is common to both choices), and the
plan keeps HLA iff ``e_hla <= hla_threshold``. Unlike the g_x quantizer, this choice cannot be
made at run time: it changes what the forward saves (ABC keeps ``Q8(T x)``, from which
``g_yᵀ x`` can no longer be formed), and the forward has already run, and been compiled, before
the first backward is seen. So it is decided by ``calibrate`` and applied at compile time
through the plan.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from hotcompile.hadamard import block_hadamard
from hotcompile.hla import hla_transform
from hotcompile.quant import dequantize, quantize

QUANTIZERS = ("per_token", "per_tensor")


@dataclasses.dataclass
class LayerState:
    """Runtime LQS / warm-up state of one layer (shared by every graph that contains it)."""

    name: str
    calibration_steps: int = 1
    metric: str = "transformed"
    threshold: float = 0.5
    warmup_steps: int = 0
    steps: int = 0
    sq_err_token: float = 0.0
    sq_err_tensor: float = 0.0
    decision: str | None = None
    rule: str = ""
    hla_threshold: float | None = None
    hla_steps: int = 0
    sq_err_hla: float = 0.0
    sq_ref_hla: float = 0.0
    hla: bool | None = None
    hla_rule: str = ""

    @property
    def e_token(self) -> float | None:
        return math.sqrt(self.sq_err_token) if self.steps or self.decision else None

    @property
    def e_tensor(self) -> float | None:
        return math.sqrt(self.sq_err_tensor) if self.steps or self.decision else None

    def observe(self, gy: torch.Tensor, bits: int, block: int) -> None:
        """Accumulate both quantization errors of this step's g_x operand."""
        g = block_hadamard(gy, 1, block) if self.metric == "transformed" else gy.float()
        for per_token in (True, False):
            err = (dequantize(*quantize(g, bits, per_token, "nearest")) - g).square().sum()
            if per_token:
                self.sq_err_token += float(err)
            else:
                self.sq_err_tensor += float(err)

    @property
    def e_hla(self) -> float | None:
        """Relative g_w error of HLA's projection over the observed steps (None: not measured)."""
        if not self.hla_steps:
            return None
        return math.sqrt(self.sq_err_hla / self.sq_ref_hla) if self.sq_ref_hla > 0 else 0.0

    def observe_hla(
        self, gy3: torch.Tensor, x3: torch.Tensor, grid_w: int, rows: tuple[int, ...], block: int
    ) -> None:
        """Accumulate HLA's g_w error on this step's real operands, then (re)decide.

        ``gy3: [N, S, O]`` and ``x3: [N, S, I]`` in the layer's HLA geometry (``grid_w``,
        ``rows``, ``block`` as the g_w path uses them). Computes the exact ``g_yᵀ x`` and the
        projected ``(T g_y)ᵀ (T x) / n`` in float32 (float64 accumulation of the norms): an
        extra GEMM per layer, paid once, at calibration.
        """
        g2 = gy3.reshape(-1, gy3.shape[-1]).float()
        x2 = x3.reshape(-1, x3.shape[-1]).float()
        exact = g2.t() @ x2
        approx = hla_transform(gy3, grid_w, tuple(rows), block).t()
        approx = approx @ hla_transform(x3, grid_w, tuple(rows), block) / block
        self.sq_err_hla += float((approx - exact).double().square().sum())
        self.sq_ref_hla += float(exact.double().square().sum())
        self.hla_steps += 1
        self.decide_hla()

    def decide_hla(self) -> bool | None:
        """Keep HLA iff e_hla <= hla_threshold (None: no threshold or nothing measured)."""
        e = self.e_hla
        if self.hla_threshold is None or e is None:
            return None
        self.hla = e <= self.hla_threshold
        op = "<=" if self.hla else ">"
        self.hla_rule = (
            f"HLA g_w error over {self.hla_steps} step(s): e_hla={e:.4g} {op} "
            f"hla_threshold={self.hla_threshold:g}: HLA {'on' if self.hla else 'off'}"
        )
        return self.hla

    def decide(self) -> str:
        e_tok, e_ten = math.sqrt(self.sq_err_token), math.sqrt(self.sq_err_tensor)
        per_token = e_tok < self.threshold * e_ten
        self.decision = "per_token" if per_token else "per_tensor"
        op = "<" if per_token else ">="
        self.rule = (
            f"LQS on {self.metric} g_y over {self.calibration_steps} step(s): "
            f"e_token={e_tok:.4g} {op} {self.threshold:g}*e_tensor={self.threshold * e_ten:.4g}"
        )
        return self.decision


_lock = threading.Lock()
_STATES: dict[str, LayerState] = {}


def state(key: str, **init: Any) -> LayerState:
    """The state registered under ``key`` (created with ``init`` fields the first time)."""
    with _lock:
        st = _STATES.get(key)
        if st is None:
            st = _STATES[key] = LayerState(**init)
        return st


def get(key: str) -> LayerState | None:
    return _STATES.get(key)


def reset() -> None:
    """Forget every layer's calibration, decision and step count."""
    with _lock:
        _STATES.clear()


def resolve(key: str, scaling: str, gy: torch.Tensor, bits: int, block: int) -> tuple[str, int]:
    """The quantizer and bits of one HQ call (every implementation of the op starts here).

    ``scaling="lqs"`` consults the layer's state (``"exact"`` while it calibrates); a non-empty
    ``key`` also counts the step for the warm-up. Without a key, ``"lqs"`` is an error.
    """
    if key:
        if scaling == "lqs":
            return step_scaling(key, gy, bits, block)
        return scaling, step_bits(key, bits)
    if scaling == "lqs":
        raise ValueError("hq_grad_input: scaling='lqs' needs the layer's LQS key")
    return scaling, bits


def step_scaling(key: str, gy: torch.Tensor, bits: int, block: int) -> tuple[str, int]:
    """Called by the HQ ops on every backward of an LQS layer.

    Returns ``(scaling, bits)`` for this call: ``"exact"`` while calibrating (errors are
    recorded), else the frozen decision; bits are raised to 8 during the warm-up.
    """
    st = _STATES[key]
    st.steps += 1
    if st.decision is None:
        st.observe(gy, bits, block)
        if st.steps >= st.calibration_steps:
            st.decide()
        return "exact", bits
    return st.decision, _warm_bits(st, bits)


def observe_hla(
    key: str, gy3: torch.Tensor, x3: torch.Tensor, grid_w: int, rows: tuple[int, ...], block: int
) -> None:
    """Called by the calibration backward of a layer that would run HLA (eager, real tensors):
    measure HLA's g_w error for the layer's state (see :meth:`LayerState.observe_hla`)."""
    _STATES[key].observe_hla(gy3, x3, grid_w, rows, block)


def step_bits(key: str, bits: int) -> int:
    """Warm-up only (layers whose quantizer is fixed): count the step, maybe raise bits."""
    st = _STATES[key]
    st.steps += 1
    return _warm_bits(st, bits)


def _warm_bits(st: LayerState, bits: int) -> int:
    return max(bits, 8) if st.steps <= st.warmup_steps else bits


# ----------------------------------------------------------------------------- plans


PLAN_FORMAT = "hotcompile.lqs.plan/2"
#: plan formats :meth:`Plan.from_json` reads (/1: quantizer choices only, before HLA choices).
PLAN_FORMATS = ("hotcompile.lqs.plan/1", PLAN_FORMAT)


@dataclasses.dataclass(frozen=True)
class PlanEntry:
    """One layer's choices and the evidence for them.

    ``quantizer``: the g_x operand's scaling (None: not chosen here, e.g. a layer whose input
    needs no gradient; the config decides). ``hla``: whether the g_w path runs HLA (None: the
    config decides; False turns HLA off for this layer, True keeps it where the config has
    ``hla=True``), with ``e_hla`` the measured relative g_w error and ``hla_rule`` the rule.
    """

    layer: str
    quantizer: str | None = None
    e_token: float | None = None
    e_tensor: float | None = None
    rule: str = ""
    hla: bool | None = None
    e_hla: float | None = None
    hla_rule: str = ""

    def __post_init__(self) -> None:
        if self.quantizer is not None and self.quantizer not in QUANTIZERS:
            raise ValueError(f"quantizer of {self.layer!r} must be one of {QUANTIZERS} or None")
        if self.hla is not None and not isinstance(self.hla, bool):
            raise ValueError(f"hla of {self.layer!r} must be True, False or None")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-layer decisions: LQS's quantizer and the HLA choice. Hashable, so it can live in
    the frozen config. ``hla_threshold`` records the threshold the HLA choices were made with
    (None: the plan holds no HLA choices)."""

    entries: tuple[PlanEntry, ...] = ()
    metric: str = "transformed"
    threshold: float = 0.5
    hla_threshold: float | None = None

    def get(self, layer: str) -> PlanEntry | None:
        return next((e for e in self.entries if e.layer == layer), None)

    def __len__(self) -> int:
        return len(self.entries)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "metric": self.metric,
            "threshold": self.threshold,
            "hla_threshold": self.hla_threshold,
            "layers": [dataclasses.asdict(e) for e in self.entries],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        """A plan from its JSON dict; reads the current format and /1 (no HLA choices)."""
        if data.get("format") not in PLAN_FORMATS:
            raise ValueError(f"not a hotcompile plan (format must be one of {PLAN_FORMATS})")
        entries = tuple(PlanEntry(**e) for e in data["layers"])
        return cls(
            entries,
            data.get("metric", "transformed"),
            data.get("threshold", 0.5),
            data.get("hla_threshold"),
        )

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | pathlib.Path) -> Plan:
        return cls.from_json(json.loads(pathlib.Path(path).read_text()))

    @classmethod
    def from_states(cls, states: Iterable[LayerState]) -> Plan:
        states = list(states)
        entries = tuple(
            PlanEntry(
                s.name,
                s.decision,
                s.e_token if s.decision else None,
                s.e_tensor if s.decision else None,
                s.rule,
                s.hla,
                s.e_hla if s.hla is not None else None,
                s.hla_rule,
            )
            for s in states
            if s.decision is not None or s.hla is not None
        )
        metric = states[0].metric if states else "transformed"
        threshold = states[0].threshold if states else 0.5
        hla_threshold = next((s.hla_threshold for s in states if s.hla is not None), None)
        return cls(entries, metric, threshold, hla_threshold)

    def table(self) -> str:
        """The plan as a markdown table: quantizer and HLA choice per layer, with evidence."""
        from tabulate import tabulate

        def hla(e: PlanEntry) -> str:
            return "-" if e.hla is None else ("on" if e.hla else "off")

        rows = [
            {
                "layer": e.layer,
                "quantizer": e.quantizer or "-",
                "e_token": e.e_token,
                "e_tensor": e.e_tensor,
                "hla": hla(e),
                "e_hla": e.e_hla,
                "rule": "; ".join(r for r in (e.rule, e.hla_rule) if r),
            }
            for e in self.entries
        ]
        return tabulate(rows, headers="keys", tablefmt="github", floatfmt=".4g")


def as_plan(value: Plan | Mapping[str, Any] | str | pathlib.Path | None) -> Plan | None:
    """A plan from a Plan, its JSON dict, or a path to its JSON file."""
    if value is None or isinstance(value, Plan):
        return value
    if isinstance(value, (str, pathlib.Path)):
        return Plan.load(value)
    if isinstance(value, Mapping):
        return Plan.from_json(value)
    raise TypeError(f"a plan must be a Plan, a dict or a path, not {type(value).__name__}")

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


def step_bits(key: str, bits: int) -> int:
    """Warm-up only (layers whose quantizer is fixed): count the step, maybe raise bits."""
    st = _STATES[key]
    st.steps += 1
    return _warm_bits(st, bits)


def _warm_bits(st: LayerState, bits: int) -> int:
    return max(bits, 8) if st.steps <= st.warmup_steps else bits


# ----------------------------------------------------------------------------- plans


@dataclasses.dataclass(frozen=True)
class PlanEntry:
    """One layer's quantizer choice and the evidence for it."""

    layer: str
    quantizer: str
    e_token: float | None = None
    e_tensor: float | None = None
    rule: str = ""

    def __post_init__(self) -> None:
        if self.quantizer not in QUANTIZERS:
            raise ValueError(f"quantizer of {self.layer!r} must be one of {QUANTIZERS}")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-layer quantizer decisions (LQS). Hashable, so it can live in the frozen config."""

    entries: tuple[PlanEntry, ...] = ()
    metric: str = "transformed"
    threshold: float = 0.5

    def get(self, layer: str) -> PlanEntry | None:
        return next((e for e in self.entries if e.layer == layer), None)

    def __len__(self) -> int:
        return len(self.entries)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "hotcompile.lqs.plan/1",
            "metric": self.metric,
            "threshold": self.threshold,
            "layers": [dataclasses.asdict(e) for e in self.entries],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        if data.get("format") != "hotcompile.lqs.plan/1":
            raise ValueError("not a hotcompile LQS plan (missing format 'hotcompile.lqs.plan/1')")
        entries = tuple(PlanEntry(**e) for e in data["layers"])
        return cls(entries, data.get("metric", "transformed"), data.get("threshold", 0.5))

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | pathlib.Path) -> Plan:
        return cls.from_json(json.loads(pathlib.Path(path).read_text()))

    @classmethod
    def from_states(cls, states: Iterable[LayerState]) -> Plan:
        states = list(states)
        entries = tuple(
            PlanEntry(s.name, s.decision, s.e_token, s.e_tensor, s.rule)
            for s in states
            if s.decision is not None
        )
        metric = states[0].metric if states else "transformed"
        threshold = states[0].threshold if states else 0.5
        return cls(entries, metric, threshold)

    def table(self) -> str:
        from tabulate import tabulate

        rows = [
            {
                "layer": e.layer,
                "quantizer": e.quantizer,
                "e_token": e.e_token,
                "e_tensor": e.e_tensor,
                "rule": e.rule,
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

"""The data of a graph diff (``hotcompile.graphdiff``): saved tensors, per-layer and per-graph
changes, and the byte-size format the reports share.

Kept apart from :mod:`hotcompile.graphdiff` (which computes a diff and renders it as text)
so that :mod:`hotcompile.htmlreport` (which renders it as HTML) imports these and not the
module that imports it back.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import json
import re
from collections.abc import Sequence
from typing import Any


def human_bytes(n: int) -> str:
    """``1.5 KiB``-style sizes for tables."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
    return f"{n} B"  # pragma: no cover


#: the plan paths whose layers the rewrite changed (``hotcompile.passes.rewrite.REWRITTEN_PATHS``;
#: this module stays free of the passes' imports)
REWRITTEN = ("hot", "gx_only", "exact", "fp8_forward")


@dataclasses.dataclass
class SavedValue:
    """One tensor the forward saves for the backward."""

    name: str  #: normalised name (``fc1.abc_compress[0]``, ``fc2.weight``)
    node: str  #: the FX node name in the AOT forward graph
    layer: str  #: producing layer ("" for top-level code)
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    role: str  #: ``parameter``, ``input``, ``activation``, ``compressed``, ``mask``
    compressed: bool

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        return d


@dataclasses.dataclass
class LayerDiff:
    """What the hot backend did to one linear/conv layer."""

    name: str
    kind: str
    #: ``hot``, ``gx_only``, ``exact``, ``fp8_forward``, ``skipped``, or ``not rewritten``
    path: str
    reason: str
    quantizer: str | None
    quantizer_rule: str
    fw_before: list[str]
    fw_after: list[str]
    bw_before: list[str]
    bw_after: list[str]
    hot_ops: list[str]
    saved_before: list[str]
    saved_after: list[str]
    input_saved: bool  #: the layer's full-precision input is still saved after the rewrite
    input_saved_reason: str
    graph: int = 0
    #: HOT's backward speed-up over bf16 (measured on CUDA, the H100 model on meta tensors)
    speedup: str = "-"
    #: the forward GEMM (``LayerPlan.forward``) and why it is bf16 where FP8 was asked for
    forward: str = "bf16"
    forward_reason: str = ""

    @property
    def flagged(self) -> bool:
        return self.input_saved

    def op_changes(self, which: str) -> dict[str, int]:
        """Op -> count change (``+2`` added, ``-1`` removed) in the forward or backward."""
        before = self.fw_before if which == "forward" else self.bw_before
        after = self.fw_after if which == "forward" else self.bw_after
        cb = collections.Counter(_line_op(x) for x in before)
        ca = collections.Counter(_line_op(x) for x in after)
        keys = sorted(set(cb) | set(ca))
        return {k: ca[k] - cb[k] for k in keys if ca[k] != cb[k]}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["flagged"] = self.flagged
        d["forward_op_changes"] = self.op_changes("forward")
        d["backward_op_changes"] = self.op_changes("backward")
        return d


def _line_op(line: str) -> str:
    m = re.search(r"= ([\w.]+)\(", line)
    return m.group(1) if m else "getitem"


@dataclasses.dataclass
class GraphPair:
    """One Dynamo graph (one per graph break) in both variants."""

    index: int
    fw_before: list[str]
    fw_after: list[str]
    bw_before: list[str]
    bw_after: list[str]
    saved_before: list[SavedValue]
    saved_after: list[SavedValue]

    def unified(self, which: str, context: int = 3) -> list[str]:
        """Unified diff of the normalised forward or backward code."""
        a, b = (
            (self.fw_before, self.fw_after)
            if which == "forward"
            else (self.bw_before, self.bw_after)
        )
        return list(
            difflib.unified_diff(
                a,
                b,
                f"graph{self.index}.{which}.plain",
                f"graph{self.index}.{which}.hot",
                n=context,
                lineterm="",
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "forward": {
                "before": self.fw_before,
                "after": self.fw_after,
                "unified_diff": self.unified("forward"),
            },
            "backward": {
                "before": self.bw_before,
                "after": self.bw_after,
                "unified_diff": self.unified("backward"),
            },
            "saved": {
                "before": [s.to_dict() for s in self.saved_before],
                "after": [s.to_dict() for s in self.saved_after],
            },
            "saved_bytes": {
                "before": _byte_summary(self.saved_before),
                "after": _byte_summary(self.saved_after),
            },
        }


def _byte_summary(saved: Sequence[SavedValue]) -> dict[str, int]:
    act = sum(s.bytes for s in saved if s.role not in ("parameter",))
    return {
        "activations": act,
        "compressed": sum(s.bytes for s in saved if s.compressed),
        "full_precision": sum(
            s.bytes for s in saved if s.role in ("activation", "input") and not s.compressed
        ),
        "parameters": sum(s.bytes for s in saved if s.role == "parameter"),
    }


@dataclasses.dataclass
class GraphDiffData:
    """What :func:`hotcompile.graphdiff.diff` found: per-layer and per-graph changes, as data
    (``hotcompile.graphdiff.GraphDiff`` adds the text, HTML and ``tlparse`` renderings)."""

    model: str
    inputs: list[dict[str, Any]]
    config: dict[str, Any]
    layers: list[LayerDiff]
    graphs: list[GraphPair]
    notes: list[str]

    @property
    def flagged(self) -> list[LayerDiff]:
        """Layers whose full-precision input is still saved after the rewrite."""
        return [lay for lay in self.layers if lay.flagged]

    def layer(self, name: str) -> LayerDiff:
        for lay in self.layers:
            if lay.name == name:
                return lay
        raise KeyError(f"no layer {name!r}; layers: {[lay.name for lay in self.layers]}")

    def saved_bytes(self) -> dict[str, dict[str, int]]:
        tot: dict[str, dict[str, int]] = {}
        for which in ("before", "after"):
            rows = [s for g in self.graphs for s in getattr(g, f"saved_{which}")]
            tot[which] = _byte_summary(rows)
        return tot

    def kernels_ran(self) -> dict[str, dict[str, str]]:
        """Which CUDA implementation each layer's HOT stages ran in this process (see
        ``hotcompile.report.kernels_ran``; empty before a CUDA backward)."""
        from hotcompile.report import kernels_ran

        return kernels_ran(lay.name for lay in self.layers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "inputs": self.inputs,
            "config": self.config,
            "summary": {
                "layers": len(self.layers),
                "rewritten": sum(lay.path in REWRITTEN for lay in self.layers),
                "flagged": [lay.name for lay in self.flagged],
                "saved_bytes": self.saved_bytes(),
            },
            "layers": [lay.to_dict() for lay in self.layers],
            "graphs": [g.to_dict() for g in self.graphs],
            "notes": self.notes,
            "kernels_ran": self.kernels_ran(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

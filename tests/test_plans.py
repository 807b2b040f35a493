"""What the backend tells its user: the plan table (``print(hotcompile.plans())``), inference
compiles reported as such, the warning when a training compile rewrites nothing, and a NaN in
the input named by ``nonfinite_layers()``."""

from __future__ import annotations

import logging

import torch
import torch.nn as nn
from conftest import AOT, LoRALinear, MLPBlock

import hotcompile
from hotcompile import HotBackend
from hotcompile.demo import plan_table
from hotcompile.plantable import COLUMNS, format_plans

NO_HOT = "runs no HOT backward"


def _every_path_model() -> nn.Module:
    """hot (0, 1.lora_a), gx_only (1.base), skipped by pattern (1.lora_b, with exclude "*b")
    and as unsupported (2)."""
    return nn.Sequential(nn.Linear(32, 64), LoRALinear(64, 48), nn.Conv1d(16, 16, 1, groups=16))


def _train_step(model: nn.Module, x: torch.Tensor, backend) -> None:
    torch.compile(model, backend=backend)(x).sum().backward()


def test_printed_plans_are_a_table_with_every_column_and_stay_a_list():
    _train_step(_every_path_model(), torch.randn(4, 16, 32), HotBackend(**AOT, exclude=("*b",)))
    plans = hotcompile.plans()
    assert isinstance(plans, list) and len(plans) == 5
    assert plans == list(plans) and plans[0].path == "hot"  # a list for code as before
    for text in (str(plans), repr(plans)):
        assert "LayerPlan(" not in text
        header = text.splitlines()[0]
        assert [c.strip() for c in header.strip("|").split("|")] == [h for h, _ in COLUMNS]
        rows = [line for line in text.splitlines()[2:] if line.startswith("|")]
        assert len(rows) == 5
        assert "2 hot" in text and "1 gx_only" in text and "2 skipped" in text
        assert "gx_only: frozen weight" in text  # the legend says what the path means
    # slices print as tables too; one graph: no graph column
    assert str(plans[:1]).splitlines()[0].split("|")[1].strip() == "layer"


def test_gx_only_and_skipped_rows_say_why():
    _train_step(_every_path_model(), torch.randn(4, 16, 32), HotBackend(**AOT, exclude=("*b",)))
    rows = {r["layer"]: r for r in hotcompile.plans().rows()}
    assert rows["1.base"]["path"] == "gx_only" and "frozen" in rows["1.base"]["reason"]
    assert "excluded by pattern" in rows["1.lora_b"]["reason"]
    assert rows["2"]["path"] == "skipped" and "conv1d" in rows["2"]["reason"]
    assert all(r["reason"] for r in rows.values() if r["path"] != "hot")
    assert hotcompile.plans()[1].reason  # the LayerPlan field itself, not only the table


def test_demo_uses_the_same_formatter():
    _train_step(MLPBlock(), torch.randn(2, 8, 64), HotBackend(**AOT))
    _train_step(MLPBlock(), torch.randn(3, 8, 64), HotBackend(**AOT))  # a second graph
    plans = hotcompile.plans()
    assert plan_table(plans) == format_plans(plans, dedupe=True)
    assert "graph" in str(plans).splitlines()[0]  # two graphs: rows say which
    assert len([ln for ln in plan_table(plans).splitlines() if ln.startswith("| fc")]) == 2


def test_no_grad_compile_is_reported_as_inference_not_rewritten(caplog):
    m = MLPBlock().eval()
    backend = HotBackend(**AOT)
    c = torch.compile(m, backend=backend)
    with caplog.at_level(logging.INFO, logger="hotcompile"), torch.no_grad():
        c(torch.randn(2, 8, 64))
    assert [p.path for p in backend.layers] == ["inference", "inference"]
    assert all(not p.rewritten and p.reason for p in backend.layers)
    assert backend.records[0].inference
    msgs = [r.getMessage() for r in caplog.records]
    assert any("inference compile" in msg and "no backward" in msg for msg in msgs), msgs
    assert not any("rewritten" in msg for msg in msgs), msgs
    assert not any(NO_HOT in msg for msg in msgs)  # not the "HOT changes nothing" warning
    assert "2 inference" in str(backend.layers) and "inference: compiled without" in str(
        backend.layers
    )
    c(torch.randn(2, 8, 64)).sum().backward()  # grad mode: a training graph, rewritten
    assert [p.path for p in backend.records[-1].layers] == ["hot", "hot"]


def test_a_model_without_eligible_layers_warns_exactly_once(caplog):
    m = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    c = torch.compile(m, backend="hot", options={**AOT, "min_weight_numel": 1000})
    with caplog.at_level(logging.WARNING, logger="hotcompile"):
        for batch in (2, 3, 5):  # recompiles (dynamic shapes) must not repeat it
            c(torch.randn(batch, 8)).sum().backward()
    warned = [r.getMessage() for r in caplog.records if NO_HOT in r.getMessage()]
    assert len(warned) == 1, warned
    assert "all 2 linear/conv layers are skipped: 2 below `min_weight_numel`" in warned[0]
    assert len(hotcompile.plans()) >= 4  # it did compile more than one graph


def test_no_warning_once_a_graph_took_hot_nor_for_inference(caplog):
    m = MLPBlock()
    with caplog.at_level(logging.WARNING, logger="hotcompile"):
        c = torch.compile(m, backend="hot", options=AOT)
        c(torch.randn(2, 8, 64)).sum().backward()
        with torch.no_grad():
            c(torch.randn(2, 8, 64))
        # a graph with no linear layer after HOT was taken: the loss after a graph break
        loss = torch.compile(lambda t: t.sin().sum(), backend="hot", options=AOT)
        loss(torch.randn(4, requires_grad=True)).backward()
    assert not [r for r in caplog.records if NO_HOT in r.getMessage()]
    hotcompile.clear_plans()  # re-arms it: a linear-free graph first now warns, naming why
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="hotcompile"):
        loss(torch.randn(4, requires_grad=True)).backward()
    warned = [r.getMessage() for r in caplog.records if NO_HOT in r.getMessage()]
    assert len(warned) == 1 and "no linear or conv2d layer" in warned[0]


def test_nan_in_the_input_is_named_by_nonfinite_layers(caplog):
    """A NaN in the model's input whose gradient g_y stays finite (the loss is a sum, so g_y is
    all ones): only the g_w path's x codes carry it. Before they were watched,
    ``nonfinite_layers()`` stayed empty here."""
    m = nn.Sequential(nn.Linear(32, 16))
    x = torch.randn(4, 8, 32)
    x[1, 2, 3] = float("nan")
    c = torch.compile(m, backend="hot", options=AOT)
    with caplog.at_level(logging.WARNING, logger="hotcompile"):
        c(x).sum().backward()
    assert not torch.isfinite(m[0].weight.grad).all()  # the NaN propagates
    assert hotcompile.nonfinite_layers() == {"0": "x"}
    assert any("input x of layer '0'" in r.getMessage() for r in caplog.records)


def test_nan_check_off_watches_nothing():
    m = nn.Sequential(nn.Linear(32, 16))
    x = torch.randn(4, 8, 32)
    x[0, 0, 0] = float("inf")
    c = torch.compile(m, backend="hot", options={**AOT, "check_nonfinite": "off"})
    c(x).sum().backward()
    assert hotcompile.nonfinite_layers() == {}

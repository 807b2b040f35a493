"""The kernel dispatcher's bookkeeping on CPU (hotcompile.kernels.dispatch): which
implementation each layer's stage ran, as the cost report shows it. The timing and the CUDA
candidates themselves are tested on a GPU (tests/test_gemm_gpu.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

import hotcompile
from hotcompile.kernels import dispatch


@pytest.fixture
def torch_preference():
    before = dispatch.preference()
    dispatch.clear()
    dispatch.set_preference("torch")
    yield
    dispatch.set_preference(before)
    dispatch.clear()


def test_by_layer_records_what_each_stage_ran(torch_preference):
    a = torch.randint(-7, 8, (32, 64), dtype=torch.int8)
    b = torch.randint(-7, 8, (16, 64), dtype=torch.int8)
    s = torch.full((1,), 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUTLASS kernels unavailable" (once per process)
        out = dispatch.scaled_gemm(a, b, s, None, layer="fc1", stage="g_w GEMM")
    assert torch.equal(out, (a.long() @ b.long().t()).float() * 0.5)
    dispatch.note("fc1", "g_x quantize", "triton")  # a single-implementation kernel
    assert dispatch.by_layer() == {"fc1": {"g_w GEMM": "torch", "g_x quantize": "triton"}}
    dispatch.scaled_gemm(a, b, s)  # no layer: not recorded per layer
    assert list(dispatch.by_layer()) == ["fc1"]


def test_report_shows_the_kernels_that_ran(torch_preference):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    rep = hotcompile.report(model, torch.randn(4, 8, 32))
    assert rep.kernels_ran() == {} and "CUDA kernels that ran" not in rep.table()
    name = rep.layers[0].name
    dispatch.note(name, "g_x quantize", "cuda")
    assert rep.kernels_ran() == {name: {"g_x quantize": "cuda"}}
    assert f"{name}: g_x quantize cuda" in rep.table()
    assert rep.to_json()["kernels_ran"] == {name: {"g_x quantize": "cuda"}}


def test_cpu_tensors_take_the_torch_path_without_timing():
    """On CPU tensors there is one candidate (torch._int_mm + the dequantization): no CUDA
    call, no CUTLASS build, bit-identical to the reference's integer GEMM."""
    dispatch.clear()
    a = torch.randint(-127, 128, (40, 64), dtype=torch.int8)
    b = torch.randint(-127, 128, (24, 64), dtype=torch.int8)
    sa, sb = torch.rand(40) + 0.5, torch.rand(24) + 0.5
    out = dispatch.scaled_gemm(a, b, sa, sb)
    ref = torch.ops.hotcompile.int_gemm(a, b).float() * sa[:, None] * sb[None, :]
    assert torch.equal(out, ref)
    (c,) = dispatch.choices().values()
    assert c.impl == "torch" and c.source == "only candidate"
    dispatch.clear()


def test_diff_shows_the_kernels_that_ran(torch_preference):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    d = hotcompile.diff(model, torch.randn(4, 8, 32))
    assert d.kernels_ran() == {} and "CUDA kernels that ran" not in d.to_text(color=False)
    name = d.layers[0].name
    dispatch.note(name, "g_w GEMM", "cutlass:1")
    assert f"{name}: g_w GEMM cutlass:1" in d.to_text(color=False)
    assert d.to_dict()["kernels_ran"] == {name: {"g_w GEMM": "cutlass:1"}}


def test_a_compile_does_not_inherit_an_earlier_kernels_choice():
    """``options={"kernels": ...}`` is process-wide in the dispatcher: each compile sets its
    own (also "auto"), so a forced family from an earlier model does not leak into the next."""
    before = dispatch.preference()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 16))
        x = torch.randn(4, 8, 32)
        torch.compile(model, backend="hot", options={"kernels": "torch"})(x).sum().backward()
        assert dispatch.preference() == "torch"
        torch._dynamo.reset()
        torch.compile(model, backend="hot")(x).sum().backward()
        assert dispatch.preference() == "auto"
    finally:
        dispatch.set_preference(before)


def test_a_settled_shape_builds_only_the_chosen_candidate(monkeypatch):
    """After the first call of a shape, later calls build and run only the implementation
    chosen for it (the per-call host cost of the dispatcher), with the same result; a changed
    preference goes back through the full choice."""
    dispatch.clear()
    monkeypatch.setattr(dispatch, "_preference", "auto")  # whatever HOTCOMPILE_GEMM says
    a = torch.randint(-7, 8, (32, 64), dtype=torch.int8)
    b = torch.randint(-7, 8, (16, 64), dtype=torch.int8)
    s = torch.full((1,), 0.25)
    built = []
    real = dispatch._candidates

    def spy(*args, only=None):
        built.append(only)
        return real(*args, only=only)

    monkeypatch.setattr(dispatch, "_candidates", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = dispatch.scaled_gemm(a, b, s)
        second = dispatch.scaled_gemm(a, b, s, layer="l", stage="g_w GEMM")
        assert built == [None, "torch"] and torch.equal(first, second)
        assert dispatch.by_layer() == {"l": {"g_w GEMM": "torch"}}
        dispatch.set_preference("torch")  # (monkeypatch restores the preference)
        dispatch.scaled_gemm(a, b, s)
    assert built[-1] is None  # a forced preference is not a settled measurement
    dispatch.clear()

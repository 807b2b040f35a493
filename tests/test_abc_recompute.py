"""ABC codes recomputed in the backward where it reads the layer's input anyway
(``hotcompile.passes.abc_recompute``, ``HotConfig.abc_recompute``): fewer saved bytes, the
same gradients bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hotcompile import HotConfig, HotConfigError, memory
from hotcompile.demo import Block
from hotcompile.graphdiff import diff


class SwiGLU(nn.Module):
    """LLaMA's MLP: the down projection's input is ``silu(gate) * up``."""

    def __init__(self, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(dim, hidden), nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


#: the ops path (the CPU's default) and the native one, whose compression is several nodes
#: (``hotcompile.autograd.ABC_GROUP``), with every layer on HOT's path
LOWERINGS = [{}, {"lowering": "native", "prefer": "paper"}]


def _run(model_fn, x, mode: str, compiler: str = "aot_eager", lowering: dict | None = None):
    """Gradients after two compiled steps and the saved activation bytes of a third forward."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = model_fn()
    options = {"compiler": compiler, "abc_recompute": mode, "gx_scaling": "per_token"}
    options.update(lowering or {})
    compiled = torch.compile(model, backend="hot", options=options)
    for _ in range(2):
        model.zero_grad()
        compiled(x).square().mean().backward()
    saved = memory.saved_activation_bytes(compiled(x).square().mean(), model)
    return [p.grad.clone() for p in model.parameters()], saved


def _codes_bytes(rows: int, cols: int) -> int:
    return rows * cols  # int8 codes (+ a 4-byte scale, below)


@pytest.mark.parametrize("lowering", LOWERINGS, ids=["ops", "native"])
def test_views_drops_the_codes_of_proj_whose_input_attention_saves_anyway(lowering: dict):
    x = torch.randn(2, 32, 64)
    grads_off, saved_off = _run(lambda: Block(64, 4, 128), x, "off", lowering=lowering)
    grads_views, saved_views = _run(lambda: Block(64, 4, 128), x, "views", lowering=lowering)
    assert all(torch.equal(a, b) for a, b in zip(grads_off, grads_views))
    # proj's codes: 2 samples x 2 blocks of 16 tokens x 8 kept rows, 64 channels, + scale
    assert saved_off - saved_views == _codes_bytes(2 * 2 * 8, 64) + 4


@pytest.mark.parametrize("lowering", LOWERINGS, ids=["ops", "native"])
def test_unary_also_recomputes_fc2s_codes_from_fc1s_output(lowering: dict):
    x = torch.randn(2, 32, 64)
    grads_views, saved_views = _run(lambda: Block(64, 4, 128), x, "views", lowering=lowering)
    grads_unary, saved_unary = _run(lambda: Block(64, 4, 128), x, "unary", lowering=lowering)
    assert all(torch.equal(a, b) for a, b in zip(grads_views, grads_unary))
    assert saved_views - saved_unary == _codes_bytes(2 * 2 * 8, 128) + 4  # fc2's codes


@pytest.mark.parametrize("lowering", LOWERINGS, ids=["ops", "native"])
def test_unary_recomputes_swiglus_down_projection_input_from_both_its_inputs(lowering: dict):
    x = torch.randn(2, 32, 64)
    grads_views, saved_views = _run(SwiGLU, x, "views", lowering=lowering)
    grads_unary, saved_unary = _run(SwiGLU, x, "unary", lowering=lowering)
    assert all(torch.equal(a, b) for a, b in zip(grads_views, grads_unary))
    assert saved_views - saved_unary == _codes_bytes(2 * 2 * 8, 128) + 4  # down's codes


def test_auto_is_unary_on_the_ops_path_and_on_the_native_one_only_for_memory():
    """``"auto"``: the ops path recomputes; the native path, whose recompute moves Triton
    quantizers into the backward (~2 ms of the H100 Llama's step), only under
    ``prefer="memory"`` (``abc_swiglu="off"`` here: with the SwiGLU's inputs saved as FP8
    codes the backward no longer reads them, and down's codes have nothing to come from)."""
    x = torch.randn(2, 32, 64)

    def saved(mode: str, lowering: dict) -> int:
        return _run(SwiGLU, x, mode, lowering=lowering)[1]

    assert saved("auto", {}) == saved("unary", {})
    paper = {"lowering": "native", "prefer": "paper"}
    assert saved("auto", paper) == saved("off", paper) > saved("unary", paper)
    memory = {"lowering": "native", "prefer": "memory", "abc_swiglu": "off"}
    assert saved("auto", memory) == saved("unary", memory) < saved("off", memory)
    assert HotConfig().abc_recompute_modes == ("unary", "off")
    assert HotConfig(prefer="memory").abc_recompute_modes == ("unary", "unary")
    assert HotConfig(abc_recompute="views").abc_recompute_modes == ("views", "views")


@pytest.mark.slow
def test_the_joint_pass_runs_under_inductor():
    x = torch.randn(2, 32, 64)
    grads_off, saved_off = _run(lambda: Block(64, 4, 128), x, "off", "inductor")
    grads_unary, saved_unary = _run(lambda: Block(64, 4, 128), x, "unary", "inductor")
    assert all(torch.equal(a, b) for a, b in zip(grads_off, grads_unary))
    assert saved_off - saved_unary >= _codes_bytes(2 * 2 * 8, 128) + 4


def test_the_diff_tool_says_the_compression_is_recomputed():
    result = diff(Block(64, 4, 128), [torch.randn(2, 32, 64)])
    proj = result.layer("proj")
    assert proj.input_saved and "recomputes the compression" in proj.input_saved_reason


def test_unknown_mode_is_refused_with_the_valid_ones():
    with pytest.raises(HotConfigError, match="abc_recompute.*'auto', 'views', 'unary', 'off'"):
        HotConfig.from_options({"abc_recompute": "all"})
    with pytest.raises(HotConfigError, match="abc_max_abs.*'kernel', 'producer'"):
        HotConfig.from_options({"abc_max_abs": "fused"})


def test_the_diff_tool_shows_fc2s_compression_in_the_backward_and_flags_nothing_new():
    """Default (``"unary"``): fc2's ``abc_compress`` moves from the forward to the backward, and
    the ops it is re-derived through are not mistaken for activation checkpointing."""
    result = diff(Block(64, 4, 128), [torch.randn(2, 32, 64)])
    fc2, fc1 = result.layer("fc2"), result.layer("fc1")
    assert not any("abc_compress" in line for line in fc2.fw_after)
    assert any("abc_compress" in line for line in fc2.bw_after)
    assert not fc1.flagged and not fc2.flagged, (fc1.input_saved_reason, fc2.input_saved_reason)


def test_twins_of_hotcompiles_recomputed_nodes_are_tagged_checkpointings_left_alone():
    """min-cut CSEs the joint graph and keeps the first twin: an untagged forward twin of a
    node hotcompile tags (the late weight codes' cast, a zeroed word buffer) would be kept and
    saved, so it is tagged too; a node tagged by activation checkpointing (it has an
    ``ac_graph_id``) neither makes nor becomes such a twin."""
    from torch.utils.checkpoint import CheckpointPolicy

    from hotcompile.passes.abc_recompute import tag_recompute_twins

    must = CheckpointPolicy.MUST_RECOMPUTE
    g = torch.fx.Graph()
    w, v = g.placeholder("w"), g.placeholder("v")
    cast = torch.ops.prims.convert_element_type.default
    fwd = g.call_function(cast, (w, torch.bfloat16))  # the forward's (autocast's) copy
    late = g.call_function(cast, (w, torch.bfloat16))  # the backward's, tagged
    late.meta["recompute"] = must
    buf = g.call_function(torch.ops.aten.full.default, ([3], 0))  # a forward word buffer
    late_buf = g.call_function(torch.ops.aten.full.default, ([3], 0))
    late_buf.meta["recompute"] = must
    other = g.call_function(cast, (w, torch.float16))  # a different op: no twin
    ckpt = g.call_function(cast, (v, torch.bfloat16))  # checkpointing's
    ckpt.meta.update(recompute=must, ac_graph_id=1)
    plain = g.call_function(cast, (v, torch.bfloat16))
    g.output((fwd, late, buf, late_buf, other, ckpt, plain))

    assert sorted(tag_recompute_twins(g)) == sorted([fwd.name, buf.name])
    assert fwd.meta["recompute"] is must and buf.meta["recompute"] is must
    assert "recompute" not in other.meta and "recompute" not in plain.meta

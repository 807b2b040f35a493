"""The inductor-native lowering of HOT's backward (``HotConfig.lowering="native"``).

The reference custom ops are the specification: the native path must give the same gradients
(bit for bit on CPU in float32, where its ATen formulation *is* the reference's arithmetic and
``torch._scaled_mm`` / ``torch._int_mm`` are exact on INT-grid codes), its backward graph must
hold no ``torch.ops.hotcompile`` op (that is the point: nothing opaque to inductor, no Python
per call), and every setting it cannot honour must say so.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn as nn

import hotcompile
from hotcompile.config import HotConfig, HotConfigError
from hotcompile.hadamard import block_hadamard
from hotcompile.lowering import gate, hot
from hotcompile.quant import quantize


class MLP(nn.Module):
    def __init__(self, d: int = 32, h: int = 64, out: int = 48) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def mlp_step(
    options: dict, device: str = "cpu", model_cls: type[nn.Module] | None = None
) -> tuple[dict[str, torch.Tensor], int]:
    """One compiled training step of :class:`MLP` (or ``model_cls``, 32 wide in) under bf16
    autocast, seed 0: the gradients (of x and of every parameter) and the bytes the compiled
    graph saves for its backward. Shared by the GPU tests and
    ``experiments/late_codes_grads.py``."""
    from hotcompile import memory

    torch.manual_seed(0)
    model = (model_cls or MLP)().to(device)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="hot", options=options)
    x = torch.randn(4, 32, 32, device=device, requires_grad=True)
    with torch.autocast(device, torch.bfloat16):
        out = compiled(x)
    loss = out.float().square().sum()
    saved = memory.saved_activation_bytes(loss, model)
    loss.backward()
    return {"x": x.grad, **{n: p.grad for n, p in model.named_parameters()}}, saved


class SwiGLU(nn.Module):
    """A Llama MLP: gate and up read the same x."""

    def __init__(self, d: int = 32, h: int = 64) -> None:
        super().__init__()
        self.gate = nn.Linear(d, h, bias=False)
        self.up = nn.Linear(d, h, bias=False)
        self.down = nn.Linear(h, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def _grads(options: dict, x: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = MLP()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="hot", options=options)
    xx = x.clone().requires_grad_(True)
    (compiled(xx) * torch.linspace(-1, 1, 48)).square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    grads["x"] = xx.grad.clone()
    return grads


@pytest.mark.parametrize("signs", [False, True])
@pytest.mark.parametrize("scaling", ["per_token", "per_tensor"])
def test_native_equals_ops(scaling: str, signs: bool) -> None:
    """Same config, two lowerings (float32, CPU, aot_eager). The last layer sees the same g_y
    on both: its g_w (HLA codes, integer GEMM, the same scale products) is identical bit for
    bit, its g_x equal to float32 rounding (``_scaled_mm`` applies the dequantization scales
    in its own order). Earlier layers then quantize a g_y that differs in its last bits, so
    their gradients agree to the quantization noise, not bit for bit: x's gradient by
    0.5–1.5% (per tensor) and 1.8–2.3% (per token) over seeds 0–5 on torch 2.13, a wrong
    gradient by 10% or more (INT4's own error)."""
    torch.manual_seed(0)
    x = torch.randn(4, 32, 32)
    base = {"compiler": "aot_eager", "gx_scaling": scaling, "hla_signs": signs}
    base["gw_format"] = "int8"  # "auto" is FP8 on the native path: compare like with like
    ops = _grads({**base, "lowering": "ops"}, x)
    nat = _grads({**base, "lowering": "native"}, x)
    assert torch.equal(ops["fc2.weight"], nat["fc2.weight"])
    assert torch.equal(ops["fc2.bias"], nat["fc2.bias"])
    torch.testing.assert_close(nat["fc1.bias"], ops["fc1.bias"], rtol=1e-5, atol=1e-5)
    for k in ("fc1.weight", "x"):
        rel = (nat[k] - ops[k]).norm() / ops[k].norm()
        assert rel < 0.04, (k, rel)


@pytest.mark.parametrize("signs", [False, True])
def test_native_unquantized_hla_is_the_ops_paths(signs: bool) -> None:
    """``gw_bits=None`` (HLA without quantization) takes the ops path's own compression on the
    native lowering: the last layer's g_w is the ops path's bit for bit."""
    x = torch.randn(4, 32, 32)
    base = {"compiler": "aot_eager", "gx_scaling": "per_token", "gw_bits": None}
    base["hla_signs"] = signs
    ops = _grads({**base, "lowering": "ops"}, x)
    nat = _grads({**base, "lowering": "native"}, x)
    assert torch.equal(ops["fc2.weight"], nat["fc2.weight"])


@pytest.mark.slow
def test_native_through_inductor_cpu_matches_aot_eager() -> None:
    """Inductor's CPU code generation of the native backward (fused butterflies, max-abs,
    rounding; ``_scaled_mm``/``_int_mm``) gives the aot_eager gradients."""
    x = torch.randn(2, 32, 32)
    base = {"gx_scaling": "per_token", "lowering": "native"}
    ref = _grads({**base, "compiler": "aot_eager"}, x)
    ind = _grads({**base, "compiler": "inductor"}, x)
    # inductor rounds g_y's own float32 arithmetic (the loss, GELU's backward) its way, so a
    # few codes round the other way: agreement to HOT's quantization noise, not bit for bit
    for k in ref:
        rel = (ind[k] - ref[k]).norm() / ref[k].norm()
        assert rel < 0.1, (k, rel)  # a wrong scale or operand gives ~1


def test_native_backward_holds_no_opaque_op() -> None:
    """The backward graph of the native path has no ``hotcompile::`` custom op (the ops path
    has them), and the layers are still HOT layers."""
    from functorch.compile import min_cut_rematerialization_partition

    from hotcompile.backend import aot_decomp_partition

    seen: list[str] = []

    def partition(joint, *args, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, *args, **kwargs)
        seen.extend(str(n.target) for n in bw.graph.nodes if n.op == "call_function")
        return fw, bw

    for lowering, expect_ops in (("native", False), ("ops", True)):
        seen.clear()
        backend = hotcompile.HotBackend(compiler="aot_eager", lowering=lowering)

        def compiler(gm, inputs, backend=backend):
            from hotcompile.passes import rewrite

            rewrite(gm, backend.config, inputs)
            return aot_decomp_partition(gm, inputs, partition_fn=partition)

        torch._dynamo.reset()
        model = MLP()
        out = torch.compile(model, backend=compiler)(torch.randn(2, 16, 32))
        out.sum().backward()
        has_ops = any("hotcompile." in t for t in seen)
        assert has_ops == expect_ops, (lowering, seen)
        assert any("_int_mm" in t or "_scaled_mm" in t for t in seen) == (lowering == "native")


def saved_by_forward(
    options: dict,
    autocast: bool,
    device: str = "cpu",
    model: Callable[[], nn.Module] | None = None,
    compiler: str = "aot_eager",
    x_shape: tuple[int, ...] = (2, 40, 32),
) -> list[tuple[tuple, torch.dtype]]:
    """(shape, dtype) of what the forward saves for the backward (the backward graph's
    inputs other than tangents) of the MLP (or ``model()``) compiled with inductor's
    decompositions + min-cut: through HOT's ``aot_eager`` partition, or with
    ``compiler="inductor"`` through inductor's own (whose parameters are static inputs, free
    to save; ``experiments/weight_codes_placement.py`` compares the two).
    (tests/test_lowering_gpu.py asserts on it for CUDA, where HOT's quantizers are Triton
    kernels the partitioner must not recompute; on the CPU they are ATen, which it may.)"""
    import torch._inductor.compile_fx as compile_fx
    from functorch.compile import min_cut_rematerialization_partition

    from hotcompile.backend import aot_decomp_partition

    saved: list[tuple[tuple, torch.dtype]] = []

    def partition(joint, *args, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, *args, **kwargs)
        for n in bw.graph.nodes:
            if n.op == "placeholder" and not n.name.startswith("tangents"):
                saved.append((tuple(n.meta["val"].shape), n.meta["val"].dtype))
        return fw, bw

    if compiler == "inductor":
        backend: Any = hotcompile.HotBackend(compiler="inductor", **options)
    else:
        config = hotcompile.HotBackend(compiler="aot_eager", **options).config

        def backend(gm, inputs):
            from hotcompile.passes import rewrite

            rewrite(gm, config, inputs)
            modes = config.abc_recompute_modes
            return aot_decomp_partition(gm, inputs, partition_fn=partition, abc_recompute=modes)

    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(*x_shape, device=device, requires_grad=True)  # 80 tokens: no shape clash
    # inductor partitions the joint graph itself: watch that partition instead of HOT's
    watch = (
        mock.patch.object(compile_fx, "min_cut_rematerialization_partition", partition)
        if compiler == "inductor"
        else contextlib.nullcontext()
    )
    with watch, torch.autocast(device, torch.bfloat16, enabled=autocast):
        net = (model or MLP)().to(device)
        torch.compile(net, backend=backend)(x).float().sum().backward()
    return saved


def test_exact_backward_under_autocast_saves_the_weights_bf16_copies() -> None:
    """What the native path's weight codes replace (tests/test_lowering_gpu.py): autograd's
    bf16 backward saves the forward's bf16 copy of each weight."""
    weights = {(64, 32), (48, 64)}  # fc1, fc2 as [O, I]
    exact = saved_by_forward({"exact": True}, autocast=True)
    assert {s for s in exact if s[0] in weights} == {(w, torch.bfloat16) for w in weights}


def test_native_weight_codes_are_the_reference_of_the_forwards_copy() -> None:
    """Under autocast the weight's codes are HQ's reference quantizer applied to the bf16 copy
    the forward's GEMM multiplies by (FP8 values here, the text recipe's g_x format)."""
    w = torch.randn(48, 64) * 0.02
    wb = w.to(torch.bfloat16)
    wq, sw = hot.weight_codes(wb, 8, "fp8_e4m3", "maxabs")
    rq, rs = quantize(block_hadamard(wb, 0, 16), 8, False, "fp8_e4m3")
    assert torch.equal(wq.t().float(), rq.float())
    # the scale as the g_x GEMM's rowwise scale_b takes it: s/16 over a row [1, I]
    assert sw.shape == (1, 64) and sw.is_contiguous() and torch.equal(sw, (rs / 16).expand(1, 64))
    # the late codes pass the fp32 parameter and the dtype (on CUDA the kernel rounds as it
    # reads): the codes of the same bf16 copy, for a weight with bf16 ties too
    w[0, :4] = 1 + 2.0**-8
    lq, ls = hot.weight_codes(w, 8, "fp8_e4m3", "maxabs", dtype=torch.bfloat16)
    cq, cs = hot.weight_codes(w.to(torch.bfloat16), 8, "fp8_e4m3", "maxabs")
    assert torch.equal(lq.float(), cq.float()) and torch.equal(ls, cs)


def test_grad_input_codes_refuses_a_bare_weight_scale() -> None:
    """The g_x GEMM takes the weight's scale as :func:`hot.weight_codes` returns it, the row
    ``s/16`` over ``[1, I]``. A bare per-tensor scale ``[1]`` (the form before session 37)
    would give a gradient 16× too large: it is an error, not a silent wrong gradient."""
    w = torch.randn(48, 64) * 0.02
    gy = torch.randn(32, 48)
    wq, sw = hot.weight_codes(w, 4, "nearest", "maxabs")
    gx = hot.grad_input_codes(gy, wq, sw, 4, True, "nearest")[0]
    assert gx.shape == (32, 64) and torch.isfinite(gx).all()
    with pytest.raises(ValueError, match=r"scale row \[1, 64\]"):
        hot.grad_input_codes(gy, wq, sw[:, 0] * 16, 4, True, "nearest")


def test_native_lqs_resolves_per_token_and_says_why() -> None:
    torch._dynamo.reset()
    backend = hotcompile.HotBackend(compiler="aot_eager", lowering="native")
    x = torch.randn(2, 16, 32, requires_grad=True)
    torch.compile(MLP(), backend=backend)(x).sum().backward()
    for layer in backend.layers:
        assert layer.spec.lowering == "native"
        assert layer.quantizer == "per_token"
        assert "native path" in layer.quantizer_rule


def test_native_takes_a_plans_quantizer() -> None:
    plan = hotcompile.Plan(
        (hotcompile.lqs.PlanEntry("fc1", "per_tensor", 1.0, 0.9, "given"),), "transformed", 0.5
    )
    torch._dynamo.reset()
    backend = hotcompile.HotBackend(compiler="aot_eager", lowering="native", plan=plan)
    x = torch.randn(2, 16, 32, requires_grad=True)
    torch.compile(MLP(), backend=backend)(x).sum().backward()
    q = {p.name: p.quantizer for p in backend.layers}
    assert q == {"fc1": "per_tensor", "fc2": "per_token"}


@pytest.mark.parametrize("lowering, fmt", [("native", "fp8"), ("ops", "int8")])
def test_gw_format_auto_is_fp8_on_the_native_path(lowering: str, fmt: str) -> None:
    torch._dynamo.reset()
    backend = hotcompile.HotBackend(compiler="aot_eager", lowering=lowering)
    torch.compile(MLP(), backend=backend)(torch.randn(2, 16, 32)).sum().backward()
    assert {p.spec.gw_format for p in backend.layers} == {fmt}
    assert all(fmt.upper() in p.describe()["g_w"] for p in backend.layers)


def test_auto_lowering_is_ops_on_cpu() -> None:
    """CPU runs keep the run-time LQS of the ops path by default."""
    torch._dynamo.reset()
    backend = hotcompile.HotBackend(compiler="aot_eager")
    torch.compile(MLP(), backend=backend)(torch.randn(2, 16, 32)).sum().backward()
    assert {p.spec.lowering for p in backend.layers} == {"ops"}


@pytest.mark.parametrize(
    "options, words",
    [
        ({"lowering": "native", "rounding": "stochastic"}, "host"),
        ({"lowering": "native", "warmup_steps": 2}, "warm-up"),
        ({"lowering": "native", "compiler": "eager"}, "inductor"),
        ({"lowering": "fast"}, "auto"),
        ({"prefer": "fastest"}, "speed"),
    ],
)
def test_settings_native_cannot_honour_fail_clearly(options: dict, words: str) -> None:
    with pytest.raises(HotConfigError, match=words):
        HotConfig.from_options(options)


def test_empty_batch_trains_on_the_native_path() -> None:
    torch._dynamo.reset()
    model = MLP()
    compiled = torch.compile(
        model, backend="hot", options={"compiler": "aot_eager", "lowering": "native"}
    )
    x = torch.randn(0, 32, requires_grad=True)
    compiled(x).sum().backward()
    assert model.fc1.weight.grad is not None and torch.all(model.fc1.weight.grad == 0)
    assert x.grad.shape == (0, 32)


@pytest.mark.parametrize("I", [32, 24])  # 24: no FP8 GEMM (I % 16), the float fallback
@pytest.mark.parametrize("per_token", [True, False])
def test_grad_input_matches_the_reference_op(I: int, per_token: bool) -> None:
    gy, w = torch.randn(37, 48) * 3, torch.randn(48, I)
    scaling = "per_token" if per_token else "per_tensor"
    ref = torch.ops.hotcompile.hq_grad_input(
        gy, w, 4, scaling, "pseudo_stochastic", "sawb", 16, "t", "", False
    )
    got = hot.grad_input(gy, w, 4, per_token, "pseudo_stochastic", "sawb")
    # CPU _scaled_mm scales its operands before summing: float32 rounding of the terms
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


def test_codes_are_the_references() -> None:
    gy = torch.randn(20, 40)
    q, s, raw = hot.quantize_gy(gy, 4, True, "pseudo_stochastic", True, 16)
    rq, rs = quantize(block_hadamard(gy, 1, 16), 4, True, "pseudo_stochastic", "maxabs")
    assert q.dtype == torch.float8_e4m3fn and q.shape == (32, 48)
    assert torch.equal(q[:20].to(torch.int8), rq) and torch.equal(s[:20], rs)
    assert torch.all(q[20:].float() == 0) and torch.all(s[20:] == 0)
    assert raw is None  # the max-abs word is a CUDA kernel's (the CPU path quantizes anew)


def test_gate_model_orders_the_shapes_as_measured() -> None:
    """The roofline model (for reports without a GPU) agrees with the H100 measurements of
    experiments/results/native_stages_h100.md on which side wins: an LLM down projection gains
    (measured 1.21x with FP8 g_w), ViT-B's qkv loses (0.62x), a 1000-class head over 128
    samples loses; and the verdict follows the margin."""
    fp8 = "fp8_e4m3"
    rows = (0, 2, 3, 8, 10, 11, 12, 14)
    down = gate.estimate(gate.Shape(8192, 2048, 8192, 4, 2048, rows=rows, gw_rounding=fp8))
    qkv = gate.estimate(gate.Shape(25216, 2304, 768, 128, 197, rows=rows, gw_rounding=fp8))
    head = gate.estimate(gate.Shape(L=128, O=1000, I=768, N=1, S=128))
    assert down.hot and 1.05 < down.speedup < 1.4
    assert not qkv.hot and 0.5 < qkv.speedup < 0.8
    assert not head.hot
    assert "model" in down.describe() and "-> HOT" in down.describe()
    assert not gate.Speed(100.0, 98.0, "measured").hot  # 2% is inside the margin


def test_gate_leaves_ops_layers_and_gates_convs() -> None:
    """On CUDA (faked here by the rewrite's view of the input), a linear layer on the ops
    lowering is not gated (its settings ask for HOT), a conv keeps bf16 with the reason."""
    from hotcompile.autograd import LayerSpec
    from hotcompile.passes.rewrite import CONV_GATE_REASON, _gate

    x = torch.empty(4, 16, 32, device="meta", requires_grad=True)
    assert _gate(LayerSpec("l", lowering="ops"), "conv2d", x, 48, True) == (None, CONV_GATE_REASON)
    speed, why = _gate(LayerSpec("l", lowering="native"), "linear", x, 48, True)
    assert speed is not None and speed.source == "model" and why.startswith("speed:")


def test_gate_charges_the_exact_side_with_autograds_cast_of_g_w(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under autocast an exact layer's g_w comes out of the GEMM in bf16 and autograd casts it
    to the fp32 master weight's dtype (a kernel of its own); HOT's g_w GEMM writes fp32. The
    gate's model counts that cast where the weight's dtype differs (a bf16 model: no cast),
    and the rewrite hands the gate the weight's dtype."""
    import importlib

    from hotcompile.autograd import LayerSpec

    rewrite = importlib.import_module("hotcompile.passes.rewrite")  # the module, not the pass
    up = dict(L=8192, O=8192, I=2048, N=4, S=2048)
    fp32_w = gate.estimate(gate.Shape(**up))
    bf16_w = gate.estimate(gate.Shape(**up, wdtype="bfloat16"))
    assert fp32_w.bf16_us > bf16_w.bf16_us and fp32_w.hot_us == bf16_w.hot_us
    no_gw = gate.estimate(gate.Shape(**up, need_gw=False))
    assert no_gw.bf16_us < bf16_w.bf16_us  # the cast belongs to g_w only

    seen = []
    real = rewrite.decide

    def spy(shape, device):
        seen.append(shape)
        return real(shape, device)

    x = torch.empty(4, 16, 32, device="meta", requires_grad=True)
    monkeypatch.setattr(rewrite, "decide", spy)
    spec = LayerSpec("l", lowering="native")
    rewrite._gate(spec, "linear", x, 48, True, "fp8", torch.bfloat16)
    rewrite._gate(spec, "linear", x, 48, True)
    assert [s.wdtype for s in seen] == ["bfloat16", "float32"]


def test_gate_charges_layers_reading_one_x_their_share_of_its_abc() -> None:
    """q/k/v read one x and, all taking HOT, quantize it once: the gate charges each a third
    of that ABC (the Llama's q/k/v: 201 µs alone against bf16's 193, ~186 with the share). A
    group the gate does not take whole (here: one layer excluded) is planned again with the
    whole ABC on each layer, so no layer takes HOT on a share that does not happen."""
    from hotcompile.report import report

    alone = gate.estimate(gate.Shape(L=8192, O=2048, I=2048, N=4, S=2048, x_amax_given=True))
    share = gate.estimate(
        gate.Shape(L=8192, O=2048, I=2048, N=4, S=2048, x_amax_given=True, x_readers=3)
    )
    assert share.bf16_us == alone.bf16_us and share.hot_us < alone.hot_us
    assert share.shared == 3 and "x's ABC shared by 3 layers" in share.describe()

    class QKV(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))

        def forward(self, x):
            return self.q(x) + self.k(x) * self.v(x)

    def speedups(**options):
        r = report(QKV(256), (2, 64, 256), options)
        return {lay.name: lay.speedup for lay in r.layers}

    whole = speedups()
    assert set(whole) == {"q", "k", "v"}
    assert all(t.endswith("x's ABC shared by 3") for t in whole.values()), whole
    part = speedups(exclude=("k",))
    assert "shared" not in part["q"] and "shared" not in part["v"], part
    assert float(part["q"].split("x")[0]) < float(whole["q"].split("x")[0])


def test_gate_times_a_shared_shape_once_and_derives_the_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shape the rewrite plans with x's ABC shared (q/k/v: 3) and then again alone (its
    group not taken whole) is timed once: the layer alone, and ABC apart, under the
    layer-alone key; the share is derived from those. (The timings are faked here: the
    bookkeeping runs on the CPU.)"""
    import contextlib

    from hotcompile import diskcache

    timed: list[str] = []
    fake = {"bf16": 189.0, "hot": 197.0, "abc": 20.0}

    def timer(kind):
        def make(*args):
            return kind

        return make

    monkeypatch.setattr(gate, "_cache", {})
    monkeypatch.setattr(diskcache, "save", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "H100 (faked)")
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(gate, "exact_sides", lambda *a: ["bf16"])
    monkeypatch.setattr(gate, "_hot_fn", timer("hot"))
    monkeypatch.setattr(gate, "_abc_fn", timer("abc"))
    monkeypatch.setattr(gate, "_graph_us", lambda kind: timed.append(kind) or fake[kind])
    qkv = gate.Shape(L=64, O=32, I=32, N=2, S=32, x_amax_given=True)
    cpu = torch.device("cpu")
    shared = gate.measure(dataclasses.replace(qkv, x_readers=3), cpu)
    assert shared.shared == 3 and shared.hot_us == pytest.approx(197.0 - 20.0 * 2 / 3)
    alone = gate.measure(qkv, cpu)
    assert alone.shared == 1 and (alone.bf16_us, alone.hot_us) == (189.0, 197.0)
    assert timed == ["bf16", "hot", "abc"]  # nothing timed twice
    # a shape first timed alone has ABC timed apart when a share is asked of it
    timed.clear()
    other = dataclasses.replace(qkv, O=64)
    gate.measure(other, cpu)
    gate.measure(dataclasses.replace(other, x_readers=2), cpu)
    assert timed == ["bf16", "hot", "abc"]


def test_a_group_not_taken_whole_is_planned_with_the_whole_abc_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the H100 the Llama's q/k/v measured 202 µs alone against bf16's 193: with a third of
    the shared ABC each they come close but not within the gate's 3%. Then each is planned
    again with the whole ABC (the share would not happen), and its reason says what the share
    would have given; a group taken whole keeps its plans."""
    import importlib
    import types

    rewrite = importlib.import_module("hotcompile.passes.rewrite")
    x = torch.fx.Graph().placeholder("x")
    scope = types.SimpleNamespace(gm=object())
    calls = [types.SimpleNamespace(kind="linear", weight_left=False, x=x) for _ in range(3)]
    shared = gate.Speed(193.0, 189.0, "measured", 3)  # 1.02x: inside the margin
    alone = gate.Speed(193.0, 202.0, "measured")
    replanned = []

    def plan(name: str, path: str, speed: gate.Speed) -> object:
        why = f"speed: {speed.describe()}" if path == "skipped" else ""
        return rewrite.LayerPlan(name, "linear", (8, 8), path, why, speed=speed)

    def plan_call(name: str, x_readers: int) -> object:
        replanned.append((name, x_readers))
        return plan(name, "skipped", alone)

    monkeypatch.setattr(rewrite, "_plan_call", plan_call)
    items = [[scope, c, (n,), plan(n, "skipped", shared)] for n, c in zip("qkv", calls)]
    rewrite._share_abc(items)
    assert replanned == [("q", 1), ("k", 1), ("v", 1)]
    for item in items:
        assert item[3].reason.startswith("speed: measured: HOT 202 µs vs bf16 193 µs")
        assert item[3].reason.endswith(
            "with x's ABC shared by 3: HOT 189 µs (1.02x), short of the gate's 3%"
        )
    replanned.clear()
    taken = gate.Speed(193.0, 180.0, "measured", 3)
    items = [[scope, c, (n,), plan(n, "hot", taken)] for n, c in zip("qkv", calls)]
    rewrite._share_abc(items)
    assert replanned == [] and all(item[3].speed is taken for item in items)


def test_gate_times_the_exact_side_padded_as_inductor_pads_it() -> None:
    """Inductor pads an mm's unaligned dims (``shape_padding``): GPT-2's head (50257 outputs)
    ran its bf16 backward in 2.05 ms of inductor's step where the unpadded GEMMs the gate timed
    took 6.1–8.7 ms, and the gate chose HOT's 3.2 ms. The exact side is now also timed with
    every dim zero-padded to inductor's multiple (8 for bf16): the same products in the
    top-left corner; an aligned shape has nothing to pad."""
    torch.manual_seed(0)
    L, O, I = 37, 50, 24  # noqa: E741
    s = gate.Shape(L=L, O=O, I=I, N=1, S=L)
    gy, x = torch.randn(L, O).bfloat16(), torch.randn(L, I).bfloat16()
    w = torch.randn(O, I)
    gx, gw = gate._bf16_padded_fn(s, gy, w, x)()
    assert gx.shape == (40, 24) and gw.shape == (56, 24) and gw.dtype == torch.float32
    ex, ew = gate._bf16_fn(s, gy, w, x)()
    assert torch.equal(gx[:L], ex) and torch.equal(gw[:O], ew)
    assert not gx[L:].any() and not gw[O:].any()
    aligned = gate.Shape(L=40, O=56, I=24, N=1, S=40)
    g2, x2 = torch.randn(40, 56).bfloat16(), torch.randn(40, 24).bfloat16()
    assert gate._bf16_padded_fn(aligned, g2, torch.randn(56, 24), x2) is None
    assert gate._alignment(torch.float32) == 4
    # what measure() times and keeps the faster of: both sides for the odd shape, one else
    assert len(gate.exact_sides(s, gy, w, x)) == 2
    assert len(gate.exact_sides(aligned, g2, torch.randn(56, 24), x2)) == 1


TRITON_OPS_CHECK = """
import torch
from hotcompile.lowering import hot, triton_ops
from hotcompile.hadamard import block_hadamard
from hotcompile.hla import hla_transform, signed
from hotcompile.quant import quantize
torch.manual_seed(0)
ok = True
from hotcompile.hla import hla_operand
for per_token in (True, False):
    gy = torch.randn(37, 40) * torch.logspace(-2, 1, 37)[:, None]
    c, s, _ = triton_ops.hq_quantize(gy, 4, per_token, "pseudo_stochastic", True, 16)
    rc, rs = quantize(block_hadamard(gy, 1, 16), 4, per_token, "pseudo_stochastic")
    ok &= torch.equal(c[:37].float(), rc.float()) and torch.equal(s[:37] if per_token else s, rs)
    # FP8 values (gx_format="fp8"): e4m3 of the transformed g_y, max-abs/448 scales; the
    # same pass also takes g_y's own max-abs (raw_amax), which the g_w codes of its plain
    # rows then use instead of a pass of their own: codes and scale still the reference's
    c, s, raw = triton_ops.hq_quantize(gy, 8, per_token, "fp8_e4m3", True, 16, True)
    rc, rs = quantize(block_hadamard(gy, 1, 16), 8, per_token, "fp8_e4m3")
    ok &= torch.equal(c[:37].float(), rc.float()) and torch.equal(s[:37] if per_token else s, rs)
    ok &= raw.view(torch.float32).item() == gy.abs().max().item()
    gy3 = gy.view(1, 37, 40)
    rc, rs = quantize(hla_operand(gy3, 0, ()), 8, False, "fp8_e4m3")
    # ABC of x's plain rows takes its max-abs from ATen (hot.amax_bits, inductor fuses it
    # into x's producer): the same word, the same codes
    ok &= torch.equal(hot.amax_bits(gy3.to(torch.bfloat16)).view(torch.float32),
                      gy.to(torch.bfloat16).abs().max().float().reshape(1))
    for amax in (None, raw, hot.amax_bits(gy3)):
        c, s = triton_ops.hla_quantize(gy3, 0, [], 8, "fp8_e4m3", False, False, None, amax)
        ok &= torch.equal(c.t()[:37].float(), rc.float()) and torch.equal(s, rs)
        ok &= c.shape == (40, 48) and not c.t()[37:].float().any()  # rows padded to 16s
    ok &= triton_ops.hq_quantize(gy, 8, per_token, "fp8_e4m3", True, 16)[2].numel() == 0
LP = [0, 2, 3, 8, 10, 11, 12, 14]
x = torch.randn(2, 35, 24); sg = (torch.randint(0, 2, (2, 35, 1)) * 2 - 1).float()
for rounding in ("pseudo_stochastic", "fp8_e4m3"):
    c, s = triton_ops.hla_quantize(x, 0, LP, 8, rounding, False, False, sg)
    rc, rs = quantize(hla_transform(signed(x, sg), 0, tuple(LP), 16), 8, False, rounding)
    ok &= torch.equal(c.t().float(), rc.float()) and torch.equal(s, rs)
w = torch.randn(48, 32)
c, s = triton_ops.hla_quantize(w[None], 0, list(range(16)), 8, "fp8_e4m3", False, True)
rc, rs = quantize(block_hadamard(w, 0, 16), 8, False, "fp8_e4m3")
ok &= torch.equal(c.t().float(), rc.float()) and torch.equal(s, rs)
assert ok, "codes differ from the reference"
c, s = triton_ops.hla_quantize(w[None], 0, list(range(16)), 4, "nearest", True, True)
rc, rs = quantize(block_hadamard(w, 0, 16), 4, False, "nearest", "sawb")
assert torch.equal(c.t().float(), rc.float())
assert ((s - rs).abs() / rs).item() < 1e-5  # SAWB from atomic sums: float32 rounding
"""


def test_triton_op_bodies_equal_the_reference_in_triton_interpreter() -> None:
    """The ``triton_op``s the native path launches on CUDA (their bodies: allocation, the
    shared launch functions, both kernels), run by Triton's CPU interpreter: the reference's
    codes bit for bit. Skipped without Triton (the CPU torch wheel has none; ``pip install
    triton "numpy<2.4"`` to run it). A subprocess: ``TRITON_INTERPRET`` is read at import."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", TRITON_OPS_CHECK], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_gpus_without_fp8_get_int8_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    """An A100 (compute capability 8.0) has no FP8 GEMM: ``gw_format="auto"`` resolves to INT8
    there, and the check says so; sm_89+ and the CPU multiply FP8."""
    from hotcompile.passes.rewrite import gw_format_of
    from hotcompile.quant import has_fp8_gemm

    cuda = torch.device("cuda", 0)
    cfg = HotConfig()
    for cap, fmt in (((8, 0), "int8"), ((8, 9), "fp8"), ((9, 0), "fp8")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None, c=cap: c)
        assert has_fp8_gemm(cuda) == (fmt == "fp8")
        assert gw_format_of(cfg, "native", cuda) == fmt
        assert gw_format_of(cfg, "ops", cuda) == "int8"
    assert has_fp8_gemm(torch.device("cpu"))
    assert gw_format_of(cfg, "native", torch.device("meta")) == "fp8"  # the report: an H100


@pytest.mark.parametrize("per_token", [True, False])
def test_fp8_gx_native_equals_the_reference_op(per_token: bool) -> None:
    """``gx_format="fp8"``: the native g_x (its CPU formulation) is the reference op's, up to
    the float32 summation order of the FP8 products; the error to the exact product lies
    between INT8's and INT4's (e4m3 keeps 3 mantissa bits)."""
    from hotcompile.ops import hq_grad_input
    from hotcompile.quant import FP8_E4M3

    torch.manual_seed(0)
    gy, w = torch.randn(64, 48) * torch.logspace(-3, 1, 64)[:, None], torch.randn(48, 40)
    scaling = "per_token" if per_token else "per_tensor"
    nat = hot.grad_input(gy, w, 8, per_token, FP8_E4M3, "sawb")
    ref = hq_grad_input(gy, w, 8, scaling, FP8_E4M3, "sawb", 16, "l", "", False)
    torch.testing.assert_close(nat, ref, rtol=1e-5, atol=1e-6)
    exact = gy @ w
    err = {}
    for name, bits, rounding in (
        ("int4", 4, "nearest"),
        ("fp8", 8, FP8_E4M3),
        ("int8", 8, "nearest"),
    ):
        out = hq_grad_input(gy, w, bits, scaling, rounding, "maxabs", 16, "l", "", False)
        err[name] = ((out - exact).norm() / exact.norm()).item()
    assert err["int8"] < err["fp8"] < err["int4"], err


def test_fp8_gx_option_trains_through_both_lowerings() -> None:
    """``backend="hot", options={"gx_bits": 8, "gx_format": "fp8"}``: both lowerings compute
    the same gradients (aot_eager, nearest rounding, FP8 g_w on both: ``"auto"`` would pick
    INT8 on the ops path), the plan names the format, and the
    option without 8 bits is refused with the reason."""
    x = torch.randn(4, 16, 32)
    opts = {"gx_bits": 8, "gx_format": "fp8", "gw_format": "fp8", "rounding": "nearest",
            "prefer": "paper", "gx_scaling": "per_token", "compiler": "aot_eager"}  # fmt: skip
    nat = _grads({**opts, "lowering": "native"}, x)
    ops = _grads({**opts, "lowering": "ops"}, x)
    for k in nat:
        torch.testing.assert_close(nat[k], ops[k], rtol=1e-4, atol=1e-6)
    backend = hotcompile.HotBackend(**opts)
    torch._dynamo.reset()
    torch.compile(MLP(), backend=backend)(x.requires_grad_(True)).sum().backward()
    rows = [p.describe() for p in backend.layers]
    assert all("FP8" in r["g_x"] for r in rows), rows
    with pytest.raises(HotConfigError, match="gx_bits=8"):
        HotConfig(gx_format="fp8")


def test_layers_reading_one_x_save_one_set_of_its_codes() -> None:
    """On the CPU, where the native path's quantizers are ATen: gate and up read the same x,
    their ABC is the same ATen on the same tensor, so the forward computes and saves x's
    codes once (the graph's common-subexpression elimination), where a Llama's bf16 backward
    saves x once too. (On CUDA, where the quantizers are ``triton_op`` kernels that no such
    pass merges, the layers share one traced quantization instead:
    :func:`test_layers_reading_one_x_quantize_it_once_while_traced`.) (Down's codes the
    partitioner may save or re-derive in the backward from gate's and up's outputs, which the
    backward reads anyway: on the CPU it re-derives them.)"""
    opts = {"recipe": "text", "prefer": "paper", "lowering": "native"}
    saved = saved_by_forward(opts, True, "cpu", SwiGLU)
    e4m3 = [shape for shape, dt in saved if dt == torch.float8_e4m3fn]
    assert e4m3.count((80, 32)) == 1 and e4m3.count((80, 64)) <= 1, saved
    assert (
        saved_by_forward({"exact": True}, True, "cpu", SwiGLU).count(((80, 32), torch.bfloat16))
        == 1
    )  # the exact backward's one copy of x, which the codes replace


def test_layers_reading_one_x_quantize_it_once_while_traced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Gate and up read one x: while the graph is traced, ABC quantizes it once for both
    (on CUDA each ``triton_op`` launch is a kernel and an output of its own, which no
    common-subexpression pass merges); down's input is another tensor and gets its own. A
    second compile traces afresh and quantizes again (nothing is kept across traces).
    (:func:`test_layers_reading_one_x_save_one_set_of_its_codes` checks what is saved.)"""
    import hotcompile.autograd as ag

    calls: list[tuple[int, ...]] = []
    real = ag._native_compress

    def spy(spec, x3, *args, **kwargs):
        calls.append(tuple(x3.shape))
        return real(spec, x3, *args, **kwargs)

    monkeypatch.setattr(ag, "_native_compress", spy)
    opts = {"recipe": "text", "prefer": "paper", "lowering": "native", "compiler": "aot_eager"}
    for _ in range(2):
        torch._dynamo.reset()
        torch.manual_seed(0)
        net = SwiGLU()
        x = torch.randn(2, 40, 32, requires_grad=True)
        torch.compile(net, backend="hot", options=opts)(x).sum().backward()
        assert all(p.grad is not None for p in net.parameters())
    # AOTAutograd traces the forward more than once (metadata, then the joint graph): in each
    # trace x (gate's and up's input, 32 wide) is quantized once, as down's input (64 wide)
    assert calls.count((2, 40, 32)) == calls.count((2, 40, 64)) >= 2, calls


@pytest.mark.slow
def test_swiglu_hq_makes_both_operands_in_the_swiglu_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``swiglu_hq``: ``silu(gate(x)) * up(x)`` becomes one op whose backward makes HQ's
    operands of g_gate and g_up (on CUDA in the kernel that makes them); gate's and up's
    backwards take them instead of quantizing their g_y again, down's quantizes its own. The
    gradients are the same bits as without it (on the CPU both make the operand with the same
    ATen), in float32 and under bf16 autocast, with inductor too."""
    import hotcompile.autograd as ag
    from hotcompile.lowering import hot as native

    given: list[bool] = []
    real = native.grad_input_codes

    def spy(gy2, *args):  # (wq, sw, bits, per_token, rounding, raw_amax, given, fast_accum)
        given.append(len(args) > 6 and args[6] is not None)
        return real(gy2, *args)

    monkeypatch.setattr(native, "grad_input_codes", spy)

    def grads(fuse: bool, autocast: bool, compiler: str) -> dict[str, torch.Tensor]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        net = SwiGLU()
        x = torch.randn(2, 40, 32, requires_grad=True)
        opts = {"recipe": "text", "prefer": "paper", "lowering": "native", "swiglu_hq": fuse,
                "compiler": compiler}  # fmt: skip
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            torch.compile(net, backend="hot", options=opts)(x).float().square().sum().backward()
        return {"x": x.grad, **{n: p.grad for n, p in net.named_parameters()}}

    for autocast, compiler in ((False, "aot_eager"), (True, "aot_eager"), (True, "inductor")):
        given.clear()
        fused = grads(True, autocast, compiler)
        assert given.count(True) >= 2 and given.count(False) >= 1, given  # gate, up; down
        given.clear()
        plain = grads(False, autocast, compiler)
        assert not any(given), given
        for k in fused:
            assert torch.equal(fused[k], plain[k]), (k, autocast, compiler)
    assert not ag._TRACED_GY and not ag._TRACED_GW  # nothing kept once the traces are gone


def test_swiglu_gw_operands_keep_a_dynamic_batch_dynamic(monkeypatch) -> None:
    """The SwiGLU backward makes gate's and up's g_w operands (``swiglu_hq``): under
    ``dynamic=True`` the batch stays symbolic (one compile for four batch sizes whose tokens
    are multiples of 16; session 35's first version specialized it), and the layers take the
    operands (``native.grad_weight`` sees them ``given``)."""
    from hotcompile.lowering import hot as native

    given: list[bool] = []
    real = native.grad_weight

    def spy(gy3, *args):
        given.append(len(args) > 8 and args[8] is not None)
        return real(gy3, *args)

    monkeypatch.setattr(native, "grad_weight", spy)
    be = hotcompile.HotBackend(compiler="aot_eager", lowering="native", recipe="text",
                               prefer="paper")  # fmt: skip
    torch.manual_seed(0)
    net = SwiGLU(32, 64)
    c = torch.compile(net, backend=be, dynamic=True)
    compiles = []
    for b, t in [(2, 16), (3, 16), (5, 16), (4, 32)]:
        c(torch.randn(b, t, 32)).square().sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in net.parameters())
        compiles.append(len(be.records))
    assert compiles == [1, 1, 1, 1], compiles
    assert given.count(True) == 2 and given.count(False) == 1, given  # gate, up; down


def test_swiglu_hq_is_in_the_plan() -> None:
    """The plan table says where gate's and up's g_y codes come from under ``swiglu_hq`` (the
    default), so ``hotcompile report`` / ``hotcompile.plans()`` show the fusion; down, whose
    g_y no SwiGLU makes, and the unfused plan say nothing of it."""
    from hotcompile.passes.rewrite import rewrite

    def plan_notes(swiglu_hq: bool) -> dict[str, str]:
        graphs = []

        def capture(gm, inputs):
            graphs.append((gm, inputs))
            return gm

        torch._dynamo.reset()
        torch.compile(SwiGLU(), backend=capture)(torch.randn(2, 8, 32))
        ((gm, inputs),) = graphs
        config = hotcompile.HotConfig(
            recipe="text", prefer="paper", lowering="native", swiglu_hq=swiglu_hq
        )
        return {p.name: p.describe()["note"] for p in rewrite(gm, config, inputs)}

    fused, plain = plan_notes(True), plan_notes(False)
    assert set(fused) == {"gate", "up", "down"}, fused
    for name in ("gate", "up"):
        assert "g_y's HQ codes from the SwiGLU backward (gate * up)" in fused[name], fused
        assert "SwiGLU" not in plain[name], plain
    assert "SwiGLU" not in fused["down"], fused
    from hotcompile.report import report

    opts = {"recipe": "text", "prefer": "paper", "lowering": "native"}
    rows = {r["name"]: r for r in report(SwiGLU(), [(2, 8, 32)], opts).to_json()["layers"]}
    assert rows["gate"]["gy_from"] == rows["up"]["gy_from"] == "SwiGLU backward (gate * up)"
    assert rows["down"]["gy_from"] is None


def test_swiglu_hq_fuses_only_a_gated_product_of_two_hq_layers() -> None:
    """The rewrite fuses ``silu(gate(x)) * up(x)`` (either operand order) where both are HOT
    linear calls on one x with native per-token HQ; a product whose silu has another reader,
    or whose layers read different inputs, or with a layer kept exact, stays as it is."""
    from hotcompile.passes.rewrite import _fuse_swiglu, rewrite

    class Variants(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.g, self.u, self.v, self.w = (nn.Linear(32, 64, bias=False) for _ in range(4))

        def forward(self, x, y):
            a = self.u(x) * torch.nn.functional.silu(self.g(x))  # fused (operands swapped)
            s = torch.nn.functional.silu(self.v(x))
            b = s * self.w(x) + s  # silu read twice: kept
            c = torch.nn.functional.silu(self.v(y)) * self.w(x)  # different inputs: kept
            return a.sum() + b.sum() + c.sum()

    graphs = []

    def capture(gm, inputs):
        graphs.append((gm, inputs))
        return gm

    torch._dynamo.reset()
    x, y = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    torch.compile(Variants(), backend=capture)(x, y)
    ((gm, inputs),) = graphs
    config = hotcompile.HotConfig(recipe="text", prefer="paper", lowering="native", swiglu_hq=False)
    rewrite(gm, config, inputs)
    with torch.no_grad():
        before = gm(*inputs)
    fused = _fuse_swiglu(gm)
    assert fused == [("g", "u")], fused
    names = [getattr(n.target, "__name__", "") for n in gm.graph.nodes]
    assert names.count("hot_swiglu") == 1 and names.count("silu") == 2, names
    gm.recompile()
    with torch.no_grad():  # the fused op's forward is the product's
        torch.testing.assert_close(gm(*inputs), before)
    # up kept out of HOT: its product is not fused
    graphs.clear()
    torch._dynamo.reset()
    torch.compile(Variants(), backend=capture)(x, y)
    ((gm, inputs),) = graphs
    rewrite(gm, dataclasses.replace(config, exclude=("u",)), inputs)
    assert _fuse_swiglu(gm) == []


def weight_codes_grads(recipe: str, compiler: str, codes: str, autocast: bool) -> dict:
    """The gradients of one compiled step of :class:`SwiGLU` with ``weight_codes=codes``
    (:func:`test_weight_codes_in_the_backward_same_gradients`; also run in a child process)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = SwiGLU(32, 64)
    x = torch.randn(2, 40, 32, requires_grad=True)
    opts = {"recipe": recipe, "prefer": "paper", "lowering": "native",
            "weight_codes": codes, "compiler": compiler}  # fmt: skip
    if compiler == "inductor":
        # the two placements partition the step differently, and inductor's CPU code elides
        # a bf16 round trip (the SwiGLU product's, into down's ABC codes) in one fusion and
        # not the other: down.weight's gradient differed by a few codes (session 32, once the
        # forward's codes were tagged MUST_SAVE). Rounding as the graph says compares what
        # this test is about, the weight codes' placement.
        opts["inductor_config"] = {"emulate_precision_casts": True}
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        out = torch.compile(net, backend="hot", options=opts)(x)
    out.float().square().sum().backward()
    return {"x": x.grad, **{n: p.grad for n, p in net.named_parameters()}}


def _early_and_late_codes_under_inductor(recipe: str) -> tuple[dict, dict]:
    """:func:`weight_codes_grads` under inductor and bf16 autocast with ``"forward"`` and
    ``"backward"`` codes, the latter in a child process meanwhile: inductor's CPU code
    generation is single-threaded Python, so the two compiles (about a minute each for the
    vision recipe on 2 cores) take the wall time of one where a second core is free."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "late.pt"
        code = (
            f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r}); "
            "import torch, test_lowering as t; "
            f"torch.save(t.weight_codes_grads({recipe!r}, 'inductor', 'backward', True), "
            f"{str(path)!r})"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            first = weight_codes_grads(recipe, "inductor", "forward", True)
            log = child.communicate(timeout=900)[0].decode(errors="replace")
        finally:
            child.kill()
            child.wait()
        assert child.returncode == 0, log[-4000:]
        return first, torch.load(path)


@pytest.mark.parametrize("recipe", ["text", "vision"])
@pytest.mark.parametrize(
    "compiler", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_weight_codes_in_the_backward_same_gradients(compiler: str, recipe: str) -> None:
    """``weight_codes="backward"``: the native g_x path quantizes the weight in the backward,
    from the parameter cast as the forward's GEMM read it: the same codes, so the same
    gradients bit for bit (float32 and bf16 autocast) as the forward's codes give — with the
    text recipe's FP8 max-abs codes and the vision recipe's INT4 SAWB ones (on the CPU SAWB's
    sums are ATen reductions; on the GPU, atomic float adds: ``test_lowering_gpu``). Under
    inductor only with bf16 autocast, the case users run (float32 through aot_eager): four
    inductor compiles of the vision recipe took 136 s of the suite on two cores; the late
    codes' compile runs in a child process alongside the early one's."""
    if compiler == "inductor":
        pairs = {True: _early_and_late_codes_under_inductor(recipe)}
    else:
        codes = ("forward", "backward")
        pairs = {
            a: [weight_codes_grads(recipe, compiler, c, a) for c in codes] for a in (False, True)
        }
    for autocast, (early, late) in pairs.items():
        for k in early:
            assert torch.equal(early[k], late[k]), (k, autocast)


def test_weight_codes_in_the_backward_are_recomputed_by_the_partitioner() -> None:
    """The min-cut partitioner places by data dependence: codes the backward makes from the
    parameter alone would be computed in the forward and saved (on CUDA, where they are a
    ``triton_op`` it never recomputes by choice, the Llama saved all of them). The late codes'
    nodes carry ``MUST_RECOMPUTE`` in the joint graph, the forward's codes do not; and after
    min-cut's CSE every cast of a graph input and every constant a tagged node reads is tagged
    too (on the H100 the forward's twin of the cast was kept and saved, the bf16 copy of each
    weight, 2026-11-27)."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._functorch.compile_utils import fx_graph_cse
    from torch.utils.checkpoint import CheckpointPolicy

    from hotcompile.backend import aot_decomp_partition
    from hotcompile.passes import rewrite

    must = CheckpointPolicy.MUST_RECOMPUTE

    def tagged(codes: str) -> list[str]:
        names: list[str] = []

        def partition(joint, *args, **kwargs):
            nodes = joint.graph.nodes
            names.extend(str(n.target) for n in nodes if n.meta.get("recompute") is must)
            # min-cut CSEs first: the cast each late-codes chain starts from must stay tagged
            # (else the forward's twin, autocast's copy for its GEMM, is kept and saved)
            cse = fx_graph_cse(copy.deepcopy(joint.graph))
            for n in cse.nodes:  # a cast of a parameter, or a constant (a zeroed buffer)
                reads_inputs = all(a.op == "placeholder" for a in n.all_input_nodes)
                if n.op == "call_function" and reads_inputs:
                    if any(u.meta.get("recompute") is must for u in n.users):
                        assert n.meta.get("recompute") is must, n
            return min_cut_rematerialization_partition(joint, *args, **kwargs)

        backend = hotcompile.HotBackend(
            compiler="aot_eager", lowering="native", prefer="paper", weight_codes=codes
        )

        def compiler(gm, inputs):
            rewrite(gm, backend.config, inputs)
            # ABC recompute off: only the late codes (and their twins) are tagged
            return aot_decomp_partition(gm, inputs, partition, abc_recompute="off")

        torch._dynamo.reset()
        x = torch.randn(2, 40, 32, requires_grad=True)
        with torch.autocast("cpu", torch.bfloat16):
            torch.compile(MLP(), backend=compiler)(x).float().sum().backward()
        return names

    assert tagged("forward") == []
    late = tagged("backward")
    # both layers' weights: the cast to the forward's dtype, the Hadamard, the quantizer
    assert late.count("prims.convert_element_type.default") >= 4, late
    assert sum("round" in t for t in late) == 2, late


def test_weight_codes_in_the_backward_saves_no_codes() -> None:
    """With ``weight_codes_late`` the autograd Function saves the weight (a parameter, alive
    anyway) instead of its codes: one byte per weight of every HOT layer less between the
    forward and the backward. (On the CPU the min-cut partitioner moves ATen weight codes
    into the backward by itself; a ``triton_op`` on CUDA it does not — ``test_lowering_gpu``
    checks the compiled step.) ``weight_codes="auto"`` is ``"backward"`` under
    ``prefer="memory"`` and ``forward="fp8"`` (where it measured faster on the Llamas), and
    ``"forward"`` with the bf16 forward: there casting the weights again costs step time."""
    from hotcompile.autograd import LayerSpec, hot_linear
    from hotcompile.memory import saved_tensors

    spec = LayerSpec("l", gx_bits=8, gx_format="fp8", gx_scaling="per_token", hla_rows=(),
                     gw_format="fp8", lowering="native", rounding="nearest")  # fmt: skip
    for autocast in (False, True):
        saved, grads = {}, {}
        for late in (False, True):
            torch.manual_seed(0)
            w = torch.randn(64, 32, requires_grad=True)
            x = torch.randn(2, 40, 32, requires_grad=True)
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                out = hot_linear(x, w, None, dataclasses.replace(spec, weight_codes_late=late))
            saved[late] = [(s.shape, s.dtype) for s in saved_tensors(out)]
            out.float().square().sum().backward()
            grads[late] = (x.grad, w.grad)
        assert ((32, 64), torch.float8_e4m3fn) in saved[False], saved  # W's codes, K-major
        assert ((64, 32), torch.float32) not in saved[False], saved
        assert ((64, 32), torch.float32) in saved[True], saved  # W itself
        assert not any(d == torch.float8_e4m3fn and sh[0] == 32 for sh, d in saved[True]), saved
        assert all(torch.equal(a, b) for a, b in zip(grads[False], grads[True], strict=True))
    assert hotcompile.HotConfig(prefer="memory").weight_codes_late
    assert not hotcompile.HotConfig(prefer="memory", weight_codes="forward").weight_codes_late
    assert not hotcompile.HotConfig().weight_codes_late
    assert not hotcompile.HotConfig(prefer="paper").weight_codes_late
    assert hotcompile.HotConfig(weight_codes="backward").weight_codes_late
    assert hotcompile.HotConfig(forward="fp8").weight_codes_late
    assert not hotcompile.HotConfig(forward="fp8", weight_codes="forward").weight_codes_late

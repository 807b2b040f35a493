"""The FP8 forward (``HotConfig.forward="fp8"``, issue 34) on the CPU.

``hotcompile.fp8.linear_reference`` (dequantized e4m3 codes multiplied in float32) is the
specification; ``fp8.linear`` (``torch._scaled_mm``, which the CPU build of torch runs too) must
match it, and both must be an FP8-accurate ``F.linear``. HOT's backward must not depend on
the forward's precision; the plan, the report and the diff must say which forward each layer
runs and why a layer keeps bf16.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch
import torch.nn.functional as F
from conftest import rel

import hotcompile
from hotcompile import HotBackend, HotConfigError, fp8
from hotcompile.autograd import LayerSpec, hot_linear
from hotcompile.demo import DigitsViT
from hotcompile.quant import FP8_E4M3

SCALINGS = ("rowwise", "tensorwise")


def _data(m: int = 40, k: int = 64, n: int = 48, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[3] *= 50  # one loud token: rowwise scales keep the others' resolution
    w = torch.randn(n, k, generator=g) * 0.05
    b = torch.randn(n, generator=g)
    return x, w, b


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("autocast", [False, True])
def test_fast_path_matches_the_reference(scaling, autocast):
    x, w, b = _data()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ref = fp8.linear_reference(x, w, b, scaling)
        fast = fp8.linear(x, w, b, scaling)
        exact = F.linear(x, w, b)
    assert fast.dtype == ref.dtype == exact.dtype
    assert rel(fast, ref) < 1e-2  # the GEMM's bf16 output (rowwise) and its accumulation
    # e4m3 keeps 3 mantissa bits: each operand's rounding is at most 2^-4 relative
    assert 2e-3 < rel(ref, exact) < 0.06


def test_rowwise_scales_are_per_token_and_per_channel():
    x, w, b = _data()
    xq, sx, wq, sw = fp8.operands(x, w, "rowwise")
    assert xq.dtype == wq.dtype == torch.float8_e4m3fn
    assert sx.shape == (x.shape[0], 1) and sw.shape == (1, w.shape[0])
    torch.testing.assert_close(sx[:, 0], x.abs().amax(1) / 448)
    torch.testing.assert_close(sw[0], w.abs().amax(1) / 448)
    # the loud token does not coarsen the others (it would under tensorwise scales)
    quiet = [i for i in range(x.shape[0]) if i != 3]
    err_row = rel(fp8.linear_reference(x[quiet], w, None), F.linear(x[quiet], w))
    err_tensor = rel(fp8.linear_reference(x, w, None, "tensorwise")[quiet], F.linear(x[quiet], w))
    assert err_row < err_tensor


def test_unaligned_shapes_fall_back_and_say_why():
    assert fp8.unsupported(64, 48) == ""
    assert "in=70" in fp8.unsupported(70, 48) and "out=50" in fp8.unsupported(64, 50)
    x = torch.randn(5, 70)
    w = torch.randn(50, 70)
    torch.testing.assert_close(fp8.linear(x, w, None), fp8.linear_reference(x, w, None))


def test_nan_in_the_input_reaches_the_output():
    x, w, b = _data()
    x[7, 5] = float("nan")
    y = fp8.linear(x, w, b)
    assert torch.isnan(y[7]).all() and torch.isfinite(y[:7]).all()


def test_bad_scaling_and_option_are_errors():
    x, w, _ = _data()
    with pytest.raises(ValueError, match="rowwise"):
        fp8.operands(x, w, "blockwise")
    with pytest.raises(HotConfigError, match="forward"):
        HotBackend(forward="fp16")
    with pytest.raises(HotConfigError, match="forward_scaling"):
        HotBackend(forward="fp8", forward_scaling="columnwise")


@pytest.mark.parametrize("forward", ["fp8_rowwise", "fp8_tensorwise"])
def test_hot_backward_does_not_depend_on_the_forward(forward):
    x, w, b = _data()
    x3 = x.reshape(2, 20, 64)
    gy = torch.randn(2, 20, 48, generator=torch.Generator().manual_seed(1))
    grads = {}
    for fwd in ("bf16", forward):
        spec = LayerSpec(name="l", forward=fwd, rounding="nearest", gx_scaling="per_token")
        xs, ws, bs = (t.clone().requires_grad_() for t in (x3, w, b))
        y = hot_linear(xs, ws, bs, spec)
        y.backward(gy)
        grads[fwd] = (y.detach(), xs.grad, ws.grad, bs.grad)
    (y0, *g0), (y1, *g1) = grads["bf16"], grads[forward]
    assert rel(y1, y0) > 1e-3  # the forward really ran in FP8
    for a, b_ in zip(g0, g1):
        torch.testing.assert_close(a, b_, rtol=0, atol=0)


def _compiled_vit(**options):
    hotcompile.clear_plans()
    torch.manual_seed(0)
    model = DigitsViT()
    x = torch.randn(16, 1, 8, 8)
    be = HotBackend(compiler="aot_eager", prefer="paper", **options)
    out = torch.compile(model, backend=be)(x)
    out.sum().backward()
    return model, x, out, be


@pytest.mark.parametrize("scaling", SCALINGS)
def test_backend_runs_the_fp8_forward_and_plans_say_so(scaling):
    model, x, out, be = _compiled_vit(forward="fp8", forward_scaling=scaling)
    rows = {p.name: p for p in be.layers}
    for name in ("blocks.0.qkv", "blocks.0.fc1", "blocks.1.fc2"):
        assert rows[name].forward == f"fp8 {scaling}" and not rows[name].forward_reason
    assert rows["head"].forward == "bf16" and "last layer" in rows["head"].forward_reason
    assert rows["patch"].forward == "bf16" and "linear layers" in rows["patch"].forward_reason
    table = str(hotcompile.plans())
    assert "forward" in table and f"fp8 {scaling}" in table
    with torch.no_grad():
        exact = model(x)
    assert 1e-3 < rel(out, exact) < 0.1  # FP8 ran, and is FP8-accurate


def test_default_forward_is_bf16():
    model, x, out, be = _compiled_vit()
    assert {p.forward for p in be.layers} == {"bf16"}
    assert not any(p.forward_reason for p in be.layers)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)


def test_exact_keeps_the_bf16_forward():
    _, _, _, be = _compiled_vit(forward="fp8", exact=True)
    assert {p.forward for p in be.layers} == {"bf16"}
    assert all("exact=True" in p.forward_reason for p in be.layers if p.kind == "linear")


def test_report_counts_fp8_forward_bit_operations():
    from hotcompile.report import report

    plain = report(DigitsViT(), torch.empty(4, 1, 8, 8))
    fp8_rep = report(DigitsViT(), torch.empty(4, 1, 8, 8), {"forward": "fp8"})
    by_name = {lay.name: lay for lay in fp8_rep.layers}
    qkv = by_name["blocks.0.qkv"].values["bops"]
    assert by_name["blocks.0.qkv"].forward == "fp8 rowwise"
    assert qkv["hot_forward"] * 16 == qkv["forward"]  # 8x8 bits against the paper's 32x32
    head = by_name["head"].values["bops"]
    assert head["hot_forward"] == head["forward"] and by_name["head"].forward_reason
    assert fp8_rep.totals["bops"]["hot_train"] < plain.totals["bops"]["hot_train"]
    assert "fp8 rowwise" in fp8_rep.table()


@pytest.mark.slow
def test_composes_with_text_recipe_memory_and_checkpointing():
    """A tiny HF Llama with activation checkpointing, prefer="memory" and the text recipe:
    every block linear runs the FP8 forward, the LM head keeps bf16, and it trains."""
    from hotcompile import compat

    pytest.importorskip("transformers")
    tf = compat.import_module("transformers")  # mends a CUDA torchvision beside a CPU torch
    cfg = tf.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, use_cache=False,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    hotcompile.clear_plans()
    options = {"compiler": "aot_eager", "forward": "fp8", "prefer": "memory"}
    compiled = torch.compile(model, backend="hot", options=options)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    x = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compiled(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    plans = {p.name: p for p in hotcompile.plans()}
    blocks = [p for n, p in plans.items() if n.startswith("model.layers.")]
    assert len(blocks) == 14 and all(p.forward == "fp8 rowwise" for p in blocks)
    assert all(p.recipe == "text" and p.region == "checkpoint" for p in blocks)
    assert plans["lm_head"].forward == "bf16" and plans["lm_head"].forward_reason
    assert losses[-1] < losses[0]


def test_a_graph_that_ends_inside_the_model_keeps_its_last_layer_fp8():
    """A graph of one transformer block (as FSDP2 or DDP's pieces compile a model) ends in
    the residual stream, not a head: its last layer (fc2) keeps the FP8 forward; a model that
    ends in a classifier (an integer-target loss after it) keeps that head in bf16."""
    from hotcompile.demo import Block

    hotcompile.clear_plans()
    block = Block(64, 4, 128)
    be = HotBackend(compiler="aot_eager", prefer="paper", forward="fp8")
    torch.compile(block, backend=be)(torch.randn(2, 16, 64, requires_grad=True)).sum().backward()
    assert {p.name: p.forward for p in be.layers}["fc2"] == "fp8 rowwise"

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vit = DigitsViT()

        def forward(self, x, y):
            return F.cross_entropy(self.vit(x).float(), y)

    model = WithLoss()
    be = HotBackend(compiler="aot_eager", prefer="paper", forward="fp8")
    loss = torch.compile(model, backend=be)(torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))
    loss.backward()
    rows = {p.name: p for p in be.layers}
    assert rows["vit.head"].forward == "bf16" and "head" in rows["vit.head"].forward_reason
    assert rows["vit.blocks.1.fc2"].forward == "fp8 rowwise"


def _gate_says(monkeypatch, hot_us: float, fwd_fp8_us: float, rederive_us: float = 0.0):
    """Make the speed gate run and decide on the CPU with fixed times: the exact backward
    200 µs against HOT's ``hot_us``, the bf16 forward 100 µs against FP8's ``fwd_fp8_us``,
    ``rederive_us`` the exact backward's bf16 x beside the FP8 forward (on a GPU
    :func:`hotcompile.lowering.gate.decide` measures the times and models the last)."""
    from hotcompile.lowering.gate import Speed

    rewrite = importlib.import_module("hotcompile.passes.rewrite")  # (the package's
    # ``rewrite`` attribute is the function of that name)

    def gate(spec, kind, x, out_features, need_gw, fmt, w_dtype, x_readers, forward):
        fp8 = fwd_fp8_us if forward != "bf16" else 0
        speed = Speed(200.0, hot_us, "measured", 1, 100.0, fp8, rederive_us)
        return speed, "" if speed.hot else f"speed: {speed.describe()}"

    monkeypatch.setattr(rewrite, "_gate", gate)
    monkeypatch.setattr(rewrite, "_gate_runs", lambda x: True)
    monkeypatch.setattr(rewrite, "_gate_decides", lambda x: True)


def _block_step(**options):
    from hotcompile.demo import Block

    hotcompile.clear_plans()
    torch.manual_seed(0)
    block = Block(64, 4, 128)
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    be = HotBackend(compiler="aot_eager", **options)
    y = torch.compile(block, backend=be)(x)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    y.backward(gy)
    grads = {"x": x.grad, **{n: p.grad for n, p in block.named_parameters()}}
    return y.detach(), grads, {p.name: p for p in be.layers}


def test_gate_keeps_the_fp8_forward_where_only_it_pays(monkeypatch):
    """The speed gate's third choice: HOT's backward loses (300 against 200 µs) but the FP8
    forward wins (60 against 100 µs). The layer runs the FP8 forward on autograd's exact
    backward (path ``fp8_forward``), not bf16 throughout: its gradients are the exact
    backward's of the FP8 forward's activations — the same as with HOT off and the same
    forward, bit for bit."""
    _gate_says(monkeypatch, hot_us=300.0, fwd_fp8_us=60.0)
    y, grads, rows = _block_step(forward="fp8")
    for name in ("qkv", "proj", "fc1", "fc2"):
        row = rows[name]
        assert row.path == "fp8_forward" and row.forward == "fp8 rowwise", row
        assert row.spec.exact and row.reason.startswith("FP8 forward, exact backward")
        assert "exact backward, FP8 forward" in row.reason
    table = str(hotcompile.plans())
    assert "fp8_forward" in table and "autograd's exact backward" in table
    # the same plan without the gate: every layer exact=True with the FP8 forward by hand
    monkeypatch.undo()
    y_bf16, grads_bf16, _ = _block_step(prefer="paper", exact=True)
    assert 1e-3 < rel(y, y_bf16) < 0.06  # the forward did run in FP8
    from hotcompile import autograd

    ref_spec = {}
    real = autograd.hot_linear

    def fp8_exact(x, weight, bias, spec):
        ref_spec[spec.name] = spec
        return real(x, weight, bias, dataclasses.replace(spec, forward="fp8_rowwise"))

    monkeypatch.setattr(autograd, "hot_linear", fp8_exact)
    monkeypatch.setattr(
        importlib.import_module("hotcompile.passes.rewrite"), "hot_linear", fp8_exact
    )
    y_ref, grads_ref, _ = _block_step(prefer="paper", exact=True)
    assert set(ref_spec) == {"qkv", "proj", "fc1", "fc2"}
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    for n in grads:
        torch.testing.assert_close(grads[n], grads_ref[n], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("hot_us", "fwd_fp8_us", "path", "forward", "rederive_us"),
    [
        (150.0, 60.0, "hot", "fp8 rowwise", 0.0),  # both pay: HOT with the FP8 forward
        (150.0, 99.0, "hot", "bf16", 0.0),  # HOT pays, FP8 not by 3%: HOT, bf16 forward
        (300.0, 99.0, "skipped", "bf16", 0.0),  # neither: autograd's bf16 layer
        # HOT loses; the FP8 forward wins by 10% alone but not once the exact backward's
        # bf16 x (8 µs) is paid: bf16 throughout (ViT-L/16, H200 run 44)
        (300.0, 90.0, "skipped", "bf16", 8.0),
        (150.0, 90.0, "hot", "fp8 rowwise", 8.0),  # HOT reads codes: no bf16 x to pay
    ],
)
def test_gate_choices_with_the_fp8_forward(
    monkeypatch, hot_us, fwd_fp8_us, path, forward, rederive_us
):
    _gate_says(monkeypatch, hot_us=hot_us, fwd_fp8_us=fwd_fp8_us, rederive_us=rederive_us)
    _, _, rows = _block_step(forward="fp8")
    assert (rows["fc1"].path, rows["fc1"].forward) == (path, forward)


def test_the_fp8_forward_alone_pays_for_the_backwards_bf16_x():
    """The model's cost of the exact backward's bf16 x beside an FP8 forward: one pass that
    reads x's producer's input and writes x (4 bytes an element in bf16), none where no g_w is
    made; it counts against the FP8 forward alone (``fp8_forward_alone``), not beside HOT."""
    from hotcompile.lowering import gate

    qkv = gate.Shape(L=12608, O=3072, I=1024, N=64, S=197, forward="fp8_rowwise")
    want = 12608 * 1024 * 4 / gate.HBM * 1e6 + gate.KERNEL_US
    assert gate._rederive_us(qkv) == pytest.approx(want)
    frozen = dataclasses.replace(qkv, need_gw=False)
    assert gate._rederive_us(frozen) == 0.0
    speed = gate.Speed(200.0, 300.0, "measured", 1, 100.0, 90.0, 10.0)
    assert speed.fp8_forward and not speed.fp8_forward_alone
    assert "+10 µs of bf16 x" in speed.describe()
    assert gate.estimate(qkv).rederive_us == pytest.approx(want)


@pytest.mark.parametrize("recipe", ["text", "vision"])
def test_weights_fp8_copy_and_hq_codes_are_made_together(monkeypatch, recipe):
    """With the rowwise FP8 forward on the native lowering, one call makes both of W's
    per-step operands (``lowering.hot.weight_operands``: on CUDA one kernel, two passes over
    the fp32 parameter), the forward's GEMM reads its FP8 copy and the backward HQ's codes.
    The step is bit-equal to the two quantizers run apart (``_weight_operands_together`` off),
    under bf16 autocast (the copies are of the bf16 weight) and in float32."""
    from hotcompile import autograd
    from hotcompile.lowering import hot as native

    calls = []
    real, together_rule = native.weight_operands, autograd._weight_operands_together

    def counted(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(native, "weight_operands", counted)
    monkeypatch.setattr(native, "weight_operands_pay", lambda *a: True)  # a small W
    x, w, b = _data()
    x3 = x.reshape(2, 20, 64)
    gy = torch.randn(2, 20, 48, generator=torch.Generator().manual_seed(1))
    spec = LayerSpec(name="l", forward="fp8_rowwise", lowering="native")  # vision: INT4 SAWB
    if recipe == "text":  # FP8 HQ codes with the max-abs scale, FP8 g_w on plain rows
        spec = dataclasses.replace(spec, gx_bits=8, gx_format="fp8", gw_format="fp8", hla_rows=())
    for autocast in (True, False):
        results = []
        for together in (True, False):
            rule = together_rule if together else lambda *a: False
            monkeypatch.setattr(autograd, "_weight_operands_together", rule)
            calls.clear()
            xs, ws, bs = (t.clone().requires_grad_() for t in (x3, w, b))
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = hot_linear(xs, ws, bs, spec)
            y.backward(gy.to(y.dtype))
            assert len(calls) == (1 if together else 0), calls
            results.append((y.detach(), xs.grad, ws.grad, bs.grad))
        for a, b_ in zip(*results):
            torch.testing.assert_close(a, b_, rtol=0, atol=0)


def test_weight_operands_are_made_together_where_measured_to_pay(monkeypatch):
    """The fused weight pass is taken where it was measured to pay on an H200: for the text
    recipe's max-abs FP8 codes by W's shape — long rows (the Llamas' down projection, every
    8B-wide weight) together, short rows (2048 inputs: q/k/v/o and gate/up of the 2048-wide
    Llama) apart, where the passes apart were faster; for the vision recipe's SAWB-scaled
    INT4 codes at every shape (ViT-L's 1024-input weights too). The step's bits are the same
    either way (the test above)."""
    from hotcompile.lowering import hot as native

    calls = []
    real = native.weight_operands
    monkeypatch.setattr(native, "weight_operands", lambda *a: calls.append(a[0].shape) or real(*a))
    text = LayerSpec(name="l", forward="fp8_rowwise", lowering="native", gx_bits=8,
                     gx_format="fp8", gw_format="fp8", hla_rows=())  # fmt: skip
    vision = LayerSpec(name="l", forward="fp8_rowwise", lowering="native")  # INT4, SAWB
    g = torch.Generator().manual_seed(0)
    cases = ((text, 4096, True), (text, 2048, False), (vision, 1024, True))
    for spec, inputs, together in cases:
        x = torch.randn(2, 16, inputs, generator=g, requires_grad=True)
        w = torch.randn(32, inputs, generator=g, requires_grad=True)
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = hot_linear(x, w, None, spec)
        y.float().sum().backward()
        assert calls == ([torch.Size([32, inputs])] if together else []), (inputs, calls)
        assert x.grad is not None and torch.isfinite(w.grad).all()
    assert not native.weight_operands_pay((8192, 2048), FP8_E4M3, "maxabs")
    assert native.weight_operands_pay((14336, 4096), FP8_E4M3, "maxabs")
    assert native.weight_operands_pay((3072, 1024), "nearest", "sawb")
    # SAWB only where HQ's codes are integers: FP8 values always take the max-abs scale
    assert not native.weight_operands_pay((3072, 1024), FP8_E4M3, "sawb")


@pytest.mark.parametrize(
    ("mode", "forward_fast", "gx_fast"),
    [(None, True, True), ("forward", True, False), ("all", True, True), ("off", False, False)],
)
def test_fp8_fast_accum_reaches_the_gemms_it_names(monkeypatch, mode, forward_fast, gx_fast):
    """``fp8_fast_accum`` sets ``use_fast_accum`` on the GEMMs it names and no others: the FP8
    forward's with ``"forward"``, also HQ's g_x GEMM on FP8 values with ``"all"`` (the default,
    ``None`` here); INT4-grid codes (the vision recipe) never, whatever the option — their
    integer sums are exact only without it. The config reaches each layer's spec through the
    rewrite."""
    from hotcompile.config import HotConfig

    rewrite = importlib.import_module("hotcompile.passes.rewrite")  # the module, not the pass
    given = {} if mode is None else {"fp8_fast_accum": mode}
    spec = rewrite._spec(HotConfig(forward="fp8", **given), "l", "linear", "per_token", "l",
                         hla=False)  # fmt: skip
    mode = spec.fast_accum
    assert mode == given.get("fp8_fast_accum", "all")
    calls = []
    real = torch._scaled_mm

    def recorded(a, b, **kw):
        calls.append((tuple(a.shape), kw.get("use_fast_accum", False)))
        return real(a, b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", recorded)
    x, w, _ = _data(m=64, k=80, n=32)  # x [64, 80]; g_x's codes [64, 32], g_w's [32, 64]
    gy = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    text = dict(gx_bits=8, gx_format="fp8", gw_format="fp8", hla_rows=())
    for recipe, extra in (("text", text), ("vision", {})):
        layer = LayerSpec(name="l", forward="fp8_rowwise", lowering="native", fast_accum=mode,
                          **extra)  # fmt: skip
        calls.clear()
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = hot_linear(xs, ws, None, layer)
        y.backward(gy)
        fwd = [fast for shape, fast in calls if shape == (64, 80)]
        gx = [fast for shape, fast in calls if shape == (64, 32)]
        assert fwd == [forward_fast], (recipe, calls)
        assert gx and all(f == (gx_fast and recipe == "text") for f in gx), (recipe, calls)


def test_gate_times_and_keys_fast_accumulation(monkeypatch):
    """The gate's cached timings with fast accumulation (the forward's, the g_x GEMM's) are
    never taken for ones without (or back): the four keys differ. Shapes without it keep the
    keys they had before the option, and those with the forward's only the keys session 27
    cached (a carried cache stays valid). HOT's timed side runs the g_x GEMM as the step
    would (``fast_gx``)."""
    from hotcompile.lowering import gate

    calls = []
    real = torch._scaled_mm

    def recorded(a, b, **kw):
        calls.append(kw.get("use_fast_accum", False))
        return real(a, b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", recorded)
    text = gate.Shape(L=64, O=32, I=48, N=2, S=32, gx_bits=8, gw_bits=None, need_gw=False,
                      rounding=FP8_E4M3, weight_scale="maxabs", dtype="float32")  # fmt: skip
    for fast in (False, True):
        s = dataclasses.replace(text, fast_gx=fast)
        g = torch.Generator().manual_seed(0)
        gy, w, x = (torch.randn(*shape, generator=g) for shape in ((64, 32), (32, 48), (64, 48)))
        calls.clear()
        gate._hot_fn(s, gy, w, x)()
        assert calls == [fast], calls

    plain = gate.Shape(L=4096, O=1024, I=1024, N=4, S=1024, forward="fp8_rowwise")
    fast = dataclasses.replace(plain, fast_forward=True)
    gx = dataclasses.replace(plain, fast_gx=True)
    both = dataclasses.replace(fast, fast_gx=True)
    keys = {s.key("gpu") for s in (plain, fast, gx, both)}
    assert len(keys) == 4
    assert plain.key("gpu").endswith("'fp8_rowwise')")  # the last field before the options
    assert fast.key("gpu").endswith("'fp8_rowwise', True)")  # as session 27 cached it

"""The per-layer HLA choice: measured by ``calibrate`` on real g_y and x, carried by the plan."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
from conftest import AOT, rel

import hotcompile
from hotcompile import HotBackend, HotConfig, HotConfigError, Plan, PlanEntry, lqs

S, I, O = 128, 32, 48  # tokens per sample, in/out features


@pytest.fixture(autouse=True)
def _fresh_lqs():
    lqs.reset()
    yield
    lqs.reset()


def _smooth(n: int, S: int, d: int) -> torch.Tensor:
    """``[n, S, d]``: a few slow sinusoids along the token axis (image-patch-like)."""
    t = torch.arange(S, dtype=torch.float32)[None, :, None] / S
    f = torch.randint(0, 3, (1, 1, d)).float()
    phase = torch.rand(n, 1, d) * 2 * math.pi
    return torch.sin(2 * math.pi * f * t + phase) + 0.5


def _text_like(n: int, S: int, d: int) -> torch.Tensor:
    """``[n, S, d]``: embeddings of random bytes, white along the token axis."""
    return torch.randn(256, d)[torch.randint(0, 256, (n, S))]


class Two(nn.Module):
    """Two linears on two inputs: ``a`` sees smooth tokens, ``b`` text-like ones."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(I, O), nn.Linear(I, O)

    def forward(self, xa, xb):
        return self.a(xa), self.b(xb)


def _two_case():
    torch.manual_seed(0)
    m = Two()
    xa, xb = _smooth(2, S, I), _text_like(2, S, I)
    ga, gb = _smooth(2, S, O), _text_like(2, S, O)  # g_y of a is smooth too, of b white

    def loss_fn(out):
        return (out[0] * ga).sum() + (out[1] * gb).sum()

    return m, (xa, xb), loss_fn


def test_calibrate_keeps_hla_on_smooth_tokens_and_drops_it_on_text_like_ones():
    m, xs, loss_fn = _two_case()
    plan = hotcompile.calibrate(m, xs, loss_fn)
    a, b = plan.get("a"), plan.get("b")
    assert a.hla is True and a.e_hla < 0.1, a
    # white operands: HLA keeps half the diagonal, e_hla ~ sqrt(1/2)
    assert b.hla is False and 0.6 < b.e_hla < 0.9, b
    assert "e_hla" in b.hla_rule and "HLA off" in b.hla_rule
    assert plan.hla_threshold == HotConfig().hla_threshold
    assert m.a.weight.grad is None  # calibration leaves gradients as they were


def test_e_hla_is_the_relative_gw_error_of_the_projection():
    torch.manual_seed(1)
    lin = nn.Linear(I, O, bias=False)
    x, g = _text_like(1, S, I), torch.randn(1, S, O)
    plan = hotcompile.calibrate(lin, x, lambda y: (y * g).sum())
    g2, x2 = g.reshape(S, O), x.reshape(S, I)
    H = torch.tensor([[(-1) ** bin(i & j).count("1") for j in range(16)] for i in range(16)])
    keep = H[[0, 2, 3, 8, 10, 11, 12, 14]].float()  # LP_L1 rows of H_16
    proj = torch.block_diag(*[keep.t() @ keep / 16] * (S // 16))  # Π, an orthogonal projector
    exact = g2.t() @ x2
    expected = rel(g2.t() @ proj @ x2, exact)
    assert plan.entries[0].e_hla == pytest.approx(expected, rel=1e-4)


def test_thresholds_and_switches():
    m, xs, loss_fn = _two_case()
    loose = hotcompile.calibrate(m, xs, loss_fn, {"hla_threshold": 10.0})
    assert loose.get("b").hla is True
    lqs.reset()
    off = hotcompile.calibrate(m, xs, loss_fn, {"hla_threshold": None})
    assert all(e.hla is None and e.e_hla is None for e in off.entries)
    assert off.hla_threshold is None
    lqs.reset()
    no_hla = hotcompile.calibrate(m, xs, loss_fn, {"hla": False})
    assert all(e.hla is None for e in no_hla.entries)


@pytest.mark.parametrize("bad", [0, -0.5, "0.6", True])
def test_invalid_hla_threshold(bad):
    with pytest.raises(HotConfigError, match="hla_threshold"):
        HotConfig(hla_threshold=bad)


def test_plan_json_round_trip_and_old_plans(tmp_path):
    m, xs, loss_fn = _two_case()
    plan = hotcompile.calibrate(m, xs, loss_fn)
    path = tmp_path / "plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    assert {e["layer"]: e["hla"] for e in data["layers"]} == {"a": True, "b": False}
    assert Plan.load(path) == plan
    # a plan written before HLA choices existed: format /1, no hla fields
    old = {
        "format": "hotcompile.lqs.plan/1",
        "metric": "transformed",
        "threshold": 0.5,
        "layers": [{"layer": "a", "quantizer": "per_token", "e_token": 1.0, "e_tensor": 3.0}],
    }
    loaded = Plan.from_json(old)
    assert loaded.get("a").hla is None and loaded.hla_threshold is None
    assert HotConfig(plan=old).plan == loaded
    with pytest.raises(ValueError, match="format"):
        Plan.from_json({**old, "format": "something/9"})
    with pytest.raises(ValueError, match="hla"):
        PlanEntry("a", "per_token", hla="yes")  # type: ignore[arg-type]
    # a layer with an HLA choice but no quantizer choice (its input needs no gradient)
    assert PlanEntry("stem", None, hla=False).quantizer is None
    table = plan.table()
    assert "e_hla" in table and "| off" in table


def _grads(m, xs, loss_fn, **options):
    lqs.reset()
    torch._dynamo.reset()
    be = HotBackend(**{**AOT, **options})
    c = torch.compile(m, backend=be)
    for p in m.parameters():
        p.grad = None
    loss_fn(c(*xs)).backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}, be


def test_compiled_model_honours_the_plan_per_layer():
    m, xs, loss_fn = _two_case()
    plan = hotcompile.calibrate(m, xs, loss_fn)
    with_plan, be = _grads(m, xs, loss_fn, plan=plan)
    hla_on, _ = _grads(m, xs, loss_fn)  # the paper's default: HLA on every layer
    hla_off, _ = _grads(m, xs, loss_fn, hla=False)
    exact, _ = _grads(m, xs, loss_fn, hla=False, gw_bits=None)
    # a keeps HLA: bit-identical to the HLA path; b runs the hla=False path (INT8 g_w)
    assert torch.equal(with_plan["a.weight"], hla_on["a.weight"])
    assert torch.equal(with_plan["b.weight"], hla_off["b.weight"])
    assert not torch.equal(with_plan["b.weight"], hla_on["b.weight"])
    assert rel(with_plan["b.weight"], exact["b.weight"]) < 0.02  # INT8 only
    assert rel(hla_on["b.weight"], exact["b.weight"]) > 0.5  # what HLA would have cost
    layers = {p.name: p for p in be.layers}
    assert layers["a"].spec.hla_rows and not layers["b"].spec.hla_rows
    row = layers["b"].describe()
    assert row["g_w"] == "INT8" and row["note"].startswith("HLA off: plan:")
    assert layers["a"].describe()["g_w"].startswith("HLA r=8")
    # the plan travels on: the backend's plan repeats the choices
    again = be.lqs_plan()
    assert {e.layer: e.hla for e in again.entries} == {"a": True, "b": False}
    assert again.hla_threshold == plan.hla_threshold


def test_config_hla_false_wins_over_a_plan_that_keeps_hla():
    m, xs, loss_fn = _two_case()
    plan = hotcompile.calibrate(m, xs, loss_fn)
    _, be = _grads(m, xs, loss_fn, plan=plan, hla=False)
    assert all(not p.spec.hla_rows for p in be.layers)


def test_turned_off_layer_saves_int8_x_not_the_projection():
    m, xs, loss_fn = _two_case()
    plan = hotcompile.calibrate(m, xs, loss_fn)
    lqs.reset()
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    c = torch.compile(m, backend=HotBackend(compiler="eager", plan=plan))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = c(*xs)
    int8 = sorted(tuple(t.shape) for t in saved if t.dtype == torch.int8)
    # a: Q8(T x), half the rows; b: Q8(x), every row
    assert int8 == [(2 * S // 2, I), (2 * S, I)]
    loss_fn(out).backward()


def test_conv_layers_are_measured():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 16, 16).cumsum(-1).cumsum(-2)  # smooth images
    plan = hotcompile.calibrate(conv, x, lambda y: y.square().mean())
    (entry,) = plan.entries
    assert entry.quantizer is None  # the input needs no gradient: no g_x, no LQS
    assert entry.hla is True and entry.e_hla < 0.6


@pytest.mark.slow
def test_inductor_honours_the_plan():
    m, xs, loss_fn = _two_case()
    plan = hotcompile.calibrate(m, xs, loss_fn)
    ref, _ = _grads(m, xs, loss_fn, plan=plan)
    got, _ = _grads(m, xs, loss_fn, plan=plan, compiler="inductor")
    for k in ("a.weight", "b.weight"):
        assert rel(got[k], ref[k]) < 1e-5, k


def test_the_estimator_study_s_unbiased_hla_variants_are_unbiased():
    """``experiments/hla_estimators_lm.py`` compares HLA with two unbiased variants of it;
    its conclusion rests on them being unbiased (mean over draws → the exact g_w) while the
    fixed-row HLA is not (on white-noise tokens it keeps about half)."""
    from conftest import load_tool

    study = load_tool("hla_estimators_lm.py", "experiments")
    g = torch.Generator().manual_seed(0)
    gy3, x3 = torch.randn(4, 64, 12, generator=g), torch.randn(4, 64, 10, generator=g)
    exact = study.weight_grad(gy3, x3, "exact", g)
    draws = 4000
    for how in ("random_rows", "random_signs"):
        mean = sum(study.weight_grad(gy3, x3, how, g) for _ in range(draws)) / draws
        assert rel(mean, exact) < 0.08, how  # Monte-Carlo error ~ 1/sqrt(draws) x spread
    hla = study.weight_grad(gy3, x3, "hla", g)
    assert 0.3 < (hla * exact).sum() / (exact * exact).sum() < 0.7  # ~½ of the exact g_w


def _gw_of(spec, x, gy, w):
    from hotcompile.autograd import hot_linear

    w = w.clone().requires_grad_(True)
    hot_linear(x, w, None, spec).backward(gy)
    return w.grad


@pytest.mark.parametrize("abc,rank", [(True, 8), (False, 8), (True, 4)])
def test_hla_signs_makes_the_weight_gradient_unbiased(abc, rank):
    """``hla_signs``: the mean over steps of HLA's g_w is the exact ``g_yᵀx`` (the low-pass
    alone keeps about r/16 of it on white-noise tokens) — with ABC's saved codes and without,
    and at a rank other than 8 (the correction is n/r, not a fixed 2). The signs are a hash
    salted with the layer's weight: each "step" here nudges the first weight (as an optimizer
    step would), which redraws every sign while g_yᵀx stays put."""
    from hotcompile.autograd import LayerSpec
    from hotcompile.hla import hla_rows

    g = torch.Generator().manual_seed(0)
    x, gy = torch.randn(4, 64, 10, generator=g), torch.randn(4, 64, 12, generator=g)
    w = torch.randn(12, 10, generator=g)
    exact = gy.flatten(0, 1).t() @ x.flatten(0, 1)
    rows = hla_rows("lp_l1", rank)
    # HLA without quantization
    base = LayerSpec("l", gx_bits=None, gw_bits=None, abc=abc, hla_rows=rows)
    signed = LayerSpec("l", gx_bits=None, gw_bits=None, abc=abc, hla_rows=rows, hla_signs=True)
    total = torch.zeros_like(exact)
    for k in range(2000):
        wk = w.clone()
        wk[0, 0] += k * 1e-6  # a new salt: new signs everywhere
        total += _gw_of(signed, x, gy, wk)
    assert rel(total / 2000, exact) < (0.08 if rank == 8 else 0.15)
    low = _gw_of(base, x, gy, w)
    kept = float((low * exact).sum() / (exact * exact).sum())
    assert rank / 16 - 0.2 < kept < rank / 16 + 0.2
    one = _gw_of(signed, x, gy, w)  # one draw: a different matrix, of the exact's size
    assert 0.5 < float(one.norm() / exact.norm()) < 2.0


def test_hla_signs_compile_without_random_ops_and_save_no_more():
    """Compiled (aot_eager, INT8 codes): no random op in the forward or backward graph (the
    signs are a hash of the layer's weight, a graph input, so wherever the partitioner places
    or recomputes them, x and g_y get the same), no more saved bytes than without signs, and
    the step trains."""
    from hotcompile.graphdiff import diff

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 32))

    x = torch.randn(2, 64, 32)
    d = diff(mlp(), [x], {"hla_signs": True}, trace=False)
    lines = [ln for lay in d.layers for ln in (*lay.fw_after, *lay.bw_after)]
    assert lines and not any("rand" in ln for ln in lines)
    saved = {}
    for signs in (False, True):
        torch._dynamo.reset()
        m = mlp()
        c = torch.compile(m, backend="hot", options={**AOT, "hla_signs": signs})
        y = c(x)
        saved[signs] = hotcompile.saved_activation_bytes(y, m)
        y.square().mean().backward()
        assert all(p.grad is not None and p.grad.isfinite().all() for p in m.parameters())
    assert saved[True] <= saved[False]
    with pytest.raises(HotConfigError, match="hla_signs"):
        HotConfig.from_options({"hla_signs": "yes"})


@pytest.mark.slow
def test_hla_signs_under_inductor_match_aot_eager():
    """Inductor's generated code computes the same sign hash (integer ops) as the decomposed
    graph: the same weight gradients as the aot_eager pipeline, to float rounding. Exact g_x
    and unquantized HLA, so that only the signs could make them differ (one differing sign
    changes g_w by far more than rounding; quantized paths differ by flipped codes anyway)."""
    x = torch.randn(2, 64, 32)
    grads = {}
    for compiler in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 32))
        opts = {"compiler": compiler, "hla_signs": True, "gx_bits": None, "gw_bits": None}
        torch.compile(m, backend="hot", options=opts)(x).square().mean().backward()
        grads[compiler] = [p.grad for p in m.parameters()]
    for a, b in zip(grads["aot_eager"], grads["inductor"]):
        assert rel(b, a) < 1e-5


class _Tokens(nn.Module):
    """A tiny LM trunk (token and position embeddings) beside an image-like branch whose
    positions come from ``arange`` and from a ``position_ids`` buffer (as HF's CLIP vision
    tower has them): integer tensors, but the model's own, not the user's tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(256, 32), nn.Embedding(64, 32)
        self.register_buffer("position_ids", torch.arange(64), persistent=False)
        self.text = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 48), nn.GELU())
        self.head = nn.Linear(48, 32)
        self.patch = nn.Linear(32, 32)  # sees only float input and the model's positions

    def forward(self, ids: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
        positions = self.pos(torch.arange(ids.shape[1]))
        text = self.head(self.text(self.tok(ids) + positions))
        own = self.pos(self.position_ids[: ids.shape[1]])
        return text.sum() + self.patch(patches + positions + own).sum()


@pytest.mark.parametrize("setting", ["auto", True, False])
def test_hla_signs_auto_picks_the_layers_fed_by_a_token_embedding(setting):
    """``hla_signs="auto"`` (the default): signs exactly on the layers downstream of an
    embedding lookup of integer graph inputs (text tokens, where the low-pass's bias broke the
    LMs); not on a layer that sees only float input plus positions built in the graph by
    ``arange`` or held in a buffer. True / False: every HLA layer / none. The plan table says
    which."""
    hotcompile.clear_plans()
    torch._dynamo.reset()
    m = _Tokens()
    # the vision recipe: HLA on the text layers too (the text recipe, the default there,
    # turns HLA off: tests/test_recipe.py)
    options = {**AOT, "hla_signs": setting, "recipe": "vision"}
    c = torch.compile(m, backend="hot", options=options)
    c(torch.randint(256, (2, 64)), torch.randn(2, 64, 32)).backward()
    got = {p.name: p.spec.hla_signs for p in hotcompile.plans()}
    want = {"text.1": True, "head": True, "patch": False} if setting == "auto" else None
    assert got == (want or dict.fromkeys(got, setting)), got
    assert set(got) == {"text.1", "head", "patch"}
    gw = {p.name: p.describe()["g_w"] for p in hotcompile.plans()}
    assert all(("signs" in gw[n]) == got[n] for n in got), gw
    assert all(p.grad is not None and p.grad.isfinite().all() for p in m.parameters())
    assert HotConfig().hla_signs == "auto"

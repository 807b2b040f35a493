"""Every weight matmul as models write it gets HOT: ``addmm`` (HF ``Conv1D``), ``x @ W``,
``matmul`` with either layout, ``W @ x``, ``bmm`` with a weight shared across the batch,
layers inside activation checkpointing; empty batches train; and the weight matmuls HOT
leaves alone are in the plan with their reason (issue 15)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import AOT, grads, rel
from torch.utils.checkpoint import checkpoint

import hotcompile
from hotcompile import HotBackend

#: deterministic HOT numerics, so two ways of writing one layer give the same gradients
OPTS = {**AOT, "rounding": "nearest", "gx_scaling": "per_token"}


class Form(nn.Module):
    """One linear layer ``y = x·Wᵀ + b`` (``W`` stored as ``[in, out]`` or ``[out, in]``),
    written as ``form`` says, followed by a nonlinearity so g_y is not constant."""

    def __init__(self, form: str, d_in: int = 32, d_out: int = 48):
        super().__init__()
        self.form = form
        out_in = form in ("linear_t", "w_left", "matmul_t")
        shape = (d_out, d_in) if out_in else (d_in, d_out)
        self.W = nn.Parameter(torch.randn(shape) / d_in**0.5)
        self.b = nn.Parameter(torch.randn(d_out) / 10)

    def weight_out_in(self) -> torch.Tensor:
        """The ``[out, in]`` weight of the layer, whatever the storage."""
        return self.W if self.form in ("linear_t", "w_left", "matmul_t") else self.W.t()

    def forward(self, x):
        W, b, f = self.W, self.b, self.form
        if f == "addmm":  # Hugging Face Conv1D
            y = torch.addmm(b, x.view(-1, x.size(-1)), W).view(*x.shape[:-1], -1)
        elif f == "at":
            y = x @ W + b
        elif f == "matmul":
            y = torch.matmul(x, W) + b
        elif f == "matmul_t":
            y = x.matmul(W.t()) + b
        elif f == "linear_t":
            y = F.linear(x, W, b)
        elif f == "w_left":
            y = (W @ x.transpose(-1, -2)).transpose(-1, -2) + b
        elif f == "bmm":
            y = torch.bmm(x, W.unsqueeze(0).expand(x.shape[0], -1, -1)) + b
        elif f == "baddbmm":
            y = torch.baddbmm(b, x, W.unsqueeze(0).expand(x.shape[0], -1, -1))
        elif f == "mm":
            y = torch.mm(x.reshape(-1, x.shape[-1]), W).reshape(*x.shape[:-1], -1) + b
        else:
            raise ValueError(f)
        return F.gelu(y)


class Ref(nn.Module):
    """The same layer as an ``nn.Linear``: what every form must match."""

    def __init__(self, form: Form):
        super().__init__()
        w = form.weight_out_in().detach()
        self.lin = nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            self.lin.weight.copy_(w)
            self.lin.bias.copy_(form.b)

    def forward(self, x):
        return F.gelu(self.lin(x))


def _loss(y: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(1)
    return (y * torch.randn_like(y)).sum()


FORMS = ["addmm", "at", "matmul", "matmul_t", "w_left", "bmm", "baddbmm", "mm", "linear_t"]


@pytest.mark.parametrize("form", FORMS)
def test_every_matmul_form_is_a_hot_layer_with_linear_gradients(form):
    """Each way of writing the layer is rewritten (the plan names the op) and its HOT
    gradients equal those of the same layer written as ``nn.Linear``."""
    torch.manual_seed(0)
    model = Form(form)
    ref = Ref(model)
    x = torch.randn(4, 32, 32, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    _loss(torch.compile(model, backend="hot", options=OPTS)(x)).backward()
    plans = hotcompile.plans()
    hotcompile.clear_plans()
    torch._dynamo.reset()
    _loss(torch.compile(ref, backend="hot", options=OPTS)(xr)).backward()
    (plan,) = plans
    assert plan.path == "hot" and plan.kind == "linear", plan
    assert plan.weight_shape == (48, 32)
    if form != "linear_t":
        assert plan.describe()["kind"] != "linear"  # the op as written is named
    exact = copy.deepcopy(model)
    xe = x.detach().clone().requires_grad_(True)
    _loss(exact(xe)).backward()
    out_in = form in ("linear_t", "w_left", "matmul_t")
    gw = model.W.grad if out_in else model.W.grad.t()
    assert rel(gw, ref.lin.weight.grad) < 1e-5
    assert rel(model.b.grad, ref.lin.bias.grad) < 1e-5
    assert rel(x.grad, xr.grad) < 1e-5
    # and it is HOT's gradient, not autograd's
    assert rel(x.grad, xe.grad) > 1e-4


def test_hf_conv1d_layers_see_the_token_sequence():
    """GPT-2's ``Conv1D`` flattens x to 2-D; the rewrite keeps the ``[B, S, d]`` view, so the
    layer gets HLA along its tokens like an ``nn.Linear`` (not the INT8-only 2-D path)."""
    from hotcompile.compat import import_module

    Conv1D = import_module("transformers.pytorch_utils").Conv1D
    m = nn.Sequential(Conv1D(48, 32), nn.GELU(), Conv1D(32, 48))
    c = torch.compile(m, backend="hot", options=AOT)
    c(torch.randn(2, 16, 32)).sum().backward()
    plans = hotcompile.plans()
    assert [p.path for p in plans] == ["hot", "hot"]
    assert all(p.spec.hla_rows for p in plans)
    assert [p.describe()["kind"] for p in plans] == ["linear (addmm)"] * 2


def test_gpt2_blocks_are_all_hot_layers():
    """HF GPT-2 with GPT-2 small's 12 blocks (narrow, so the test is quick): its 48
    attention/MLP ``Conv1D`` layers and the tied LM head are HOT layers, none skipped."""
    from hotcompile.compat import import_module

    tf = import_module("transformers")
    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=12, n_head=2, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=63, eos_token_id=63,
    )  # fmt: skip
    model = tf.GPT2LMHeadModel(cfg)
    backend = HotBackend(**AOT)
    ids = torch.randint(0, 64, (2, 8))
    torch.compile(model, backend=backend)(ids).logits.sum().backward()
    plans = backend.layers
    conv1d = [p for p in plans if p.name.startswith("transformer.h.")]
    assert len(conv1d) == 48 and all(p.path == "hot" for p in conv1d)
    assert {p.name.rsplit(".", 1)[-1] for p in conv1d} == {"c_attn", "c_proj", "c_fc"}
    assert [p.path for p in plans if p.name == "lm_head"] == ["hot"]
    assert len(plans) == 49


class Mixed(nn.Module):
    """Weight matmuls HOT does not rewrite, next to activation matmuls it must not touch."""

    def __init__(self):
        super().__init__()
        self.per_head = nn.Parameter(torch.randn(4, 16, 16) / 4)
        self.E = nn.Parameter(torch.randn(16, 16) / 4)
        self.v = nn.Parameter(torch.randn(16) / 4)
        self.A = nn.Parameter(torch.randn(16, 4) / 4)
        self.B = nn.Parameter(torch.randn(4, 16) / 4)

    def forward(self, x):  # x: [4, 8, 16]
        scores = x @ x.transpose(-1, -2)  # activations only: not a weight matmul
        h = torch.bmm(x, self.per_head)
        h = h + torch.einsum("bsi,io->bso", x, self.E)
        h = h + (x @ self.v).unsqueeze(-1)
        delta = self.A @ self.B  # a weight product (LoRA-style merge)
        h = h + x @ delta
        h = h + torch.addmm(self.v, x.reshape(-1, 16), self.E, beta=0.5).view_as(x)
        return (scores.softmax(-1) @ h).sum()


def test_weight_matmuls_left_alone_are_listed_with_reasons():
    """No silent skips: every weight matmul is a plan row, rewritten or with its reason; the
    matmuls between activations (scores, attn @ v) are not rows."""
    m = Mixed()
    torch.compile(m, backend="hot", options=AOT)(torch.randn(4, 8, 16)).backward()
    rows = {p.name: p for p in hotcompile.plans()}
    assert set(rows) == {"per_head", "E", "v", "A", "E:1"}, rows.keys()
    assert "batch of weight matrices" in rows["per_head"].reason
    assert "einsum" in rows["E"].reason
    assert "matrix-vector" in rows["v"].reason
    assert "both operands are parameters" in rows["A"].reason
    assert "beta/alpha" in rows["E:1"].reason
    assert all(p.path == "skipped" for p in rows.values())
    # x @ delta: the operand is computed from parameters, not a view of one: a matmul of
    # two computed tensors, which keeps autograd's backward and is not a layer


def test_skipped_weight_matmuls_reach_report_and_diff():
    """``hotcompile report`` and ``hotcompile diff`` list the same skipped rows."""
    from hotcompile import report
    from hotcompile.graphdiff import diff

    r = report(Mixed(), torch.empty(4, 8, 16))
    names = {lay.name: lay for lay in r.layers}
    assert {"per_head", "E", "v", "A", "E:1"} <= set(names)
    assert "einsum" in names["E"].reason and names["E"].path == "skipped"
    d = diff(Mixed(), torch.randn(4, 8, 16))
    layers = {lay.name: lay for lay in d.layers}
    assert "einsum" in layers["E"].reason


# ----------------------------------------------------------------------------- checkpointing


def _save_gemms():
    """Selective activation checkpointing: save the GEMMs' outputs, recompute the rest (a
    module-level function: Dynamo takes no closure as ``context_fn``)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Block(nn.Module):
    def __init__(self, d=32, hidden=64, ckpt: str = "none"):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.ckpt = ckpt

    def inner(self, x):
        return self.fc2(F.gelu(self.fc1(self.ln(x))))

    def forward(self, x):
        if self.ckpt == "none":
            return x + self.inner(x)
        if self.ckpt in ("full", "reentrant"):
            return x + checkpoint(self.inner, x, use_reentrant=self.ckpt == "reentrant")
        return x + checkpoint(self.inner, x, use_reentrant=False, context_fn=_save_gemms)


class Net(nn.Module):
    def __init__(self, ckpt: str):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(ckpt=ckpt) for _ in range(2)])

    def forward(self, x):
        return self.blocks(x)


def _capture_backward(model, x, options):
    """Gradients of one step and the AOT backward graph's hotcompile ops."""
    import functorch.compile as fc

    from hotcompile.backend import aot_decomp_partition

    graphs = {}

    def partition(joint, inputs, **kw):
        fw, bw = fc.min_cut_rematerialization_partition(joint, inputs, **kw)
        graphs["fw"], graphs["bw"] = fw, bw
        return fw, bw

    backend = HotBackend(**options)

    def be(gm, ex):
        backend(gm, ex)  # rewrites gm (the returned callable is not used)
        return aot_decomp_partition(gm, ex, partition_fn=partition)

    _loss(torch.compile(model, backend=be)(x)).backward()
    ops = lambda g: [str(n.target) for n in g.graph.nodes if "hotcompile" in str(n.target)]  # noqa: E731
    return grads(model), backend.layers, ops(graphs["fw"]), ops(graphs["bw"])


@pytest.mark.parametrize("ckpt", ["full", "selective", "reentrant"])
def test_checkpointed_layers_are_hot_layers(ckpt):
    """Layers inside ``torch.utils.checkpoint`` (non-reentrant, plain and selective; Dynamo
    traces the reentrant form into the same region) are HOT layers, their gradients equal
    the uncheckpointed HOT model's, and with full checkpointing the backward recomputes
    ABC's compression from the block input (the forward saves no codes)."""
    torch.manual_seed(0)
    plain, ck = Net("none"), Net(ckpt)
    ck.load_state_dict(plain.state_dict())
    x = torch.randn(2, 32, 32)
    g0, layers0, fw0, bw0 = _capture_backward(plain, x, OPTS)
    torch._dynamo.reset()
    g1, layers1, fw1, bw1 = _capture_backward(ck, x, OPTS)
    assert [p.path for p in layers1] == ["hot"] * 4
    assert all(p.region == "checkpoint" for p in layers1)
    assert "checkpoint" in layers1[0].describe()["kind"]
    for n in g0:
        assert rel(g1[n], g0[n]) < 1e-5, n
    assert any("abc_compress" in o for o in fw0)  # uncheckpointed: compressed in the forward
    if ckpt != "selective":
        assert not any("abc_compress" in o for o in fw1)
        assert sum("abc_compress" in o for o in bw1) == 4  # recomputed, one per layer


# ----------------------------------------------------------------------------- empty inputs


@pytest.mark.parametrize("compiler", ["eager", "aot_eager"])
def test_an_empty_batch_trains(compiler):
    """A zero-row batch runs forward and backward (no HOT reduction over nothing), and the
    next real batch trains with HOT again."""
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    c = torch.compile(m, backend="hot", options={"compiler": compiler})
    for shape in [(0, 32), (2, 0, 32), (8, 32)]:
        opt.zero_grad()
        x = torch.randn(*shape, requires_grad=True)
        c(x).pow(2).sum().backward()
        assert x.grad.shape == x.shape
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
        opt.step()
    plans = hotcompile.plans()
    assert any("empty input" in p.reason for p in plans)
    assert plans[-1].path == "hot"


def test_empty_inputs_are_safe_in_the_function_itself():
    """``hot_linear`` called directly on an empty input (no rewrite decided it) takes the
    exact path rather than reducing over nothing."""
    from hotcompile.autograd import LayerSpec, hot_linear

    x = torch.randn(0, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    hot_linear(x, w, None, LayerSpec("l")).sum().backward()
    assert w.grad is not None and (w.grad == 0).all() and x.grad.shape == (0, 16)

"""Model coverage: does ``backend="hot"`` reach every weight matmul of real timm and Hugging Face
models, as users write them? (issue 15)

Per model (tiny random configs, CPU, nothing downloaded):

1. **weight calls**: the forward calls of every module that owns a weight of 2 or more
   dimensions (``nn.Linear``, convs, HF ``Conv1D``, LoRA's adapters; embeddings excluded: a
   lookup is no matmul), counted with forward hooks on an eager pass. This is the count the
   plan must match: each call is a row, rewritten or skipped *with its reason*.
2. **graphs**: the number of graphs Dynamo makes with ``backend="hot"`` and with a plain
   backend; HOT must add no graph break.
3. **gradients**: one step of HOT compiled (``compiler="aot_eager"``: inductor's
   decompositions and partitioner around the reference ops) against HOT's reference path (the
   rewritten graph run eagerly by autograd): with g_x exact and rounding to nearest their
   relative difference must be float noise — the compiled training graph computes what the
   specification says. (g_w is still INT8: a last-bit difference of the compiled graph, e.g.
   a decomposed BatchNorm, can move a value across a rounding boundary, one INT8 step; on
   MobileNetV3 that adds up to ~1e-3.) With HOT's default numerics, both against autograd's
   exact gradients: the cosines must agree (a quantized g_x turns the compiled graph's
   last-bit differences into other INT4 codes, so the two differ as much as either differs
   from the exact one),
   plus the smallest cosine of one rewritten layer's weight gradient (HOT's quantization
   error on a tiny model after one step, not a bug).
4. **training**: a few AdamW steps on one batch with the HOT-compiled model: every loss
   finite and the last below the first.

``python tools/coverage.py`` prints the table and writes ``tools/results/coverage.md`` and
``.json``; ``tests/test_coverage.py`` asserts the same per model in CI.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import math
import pathlib
import platform
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import hotcompile
from hotcompile.compat import import_module

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_models import versions  # noqa: E402  (installed library versions)
from gpu_tests import _commit  # noqa: E402  (one way to name the commit: env or git)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"

#: HOT's options for the check: the default numerics with a fixed g_x quantizer (per token,
#: as the native CUDA path runs), so the reference run and the compiled run quantize alike (a
#: run-time LQS decision made by one would carry over to the other)
OPTIONS = {"compiler": "aot_eager", "gx_scaling": "per_token"}


@dataclasses.dataclass(frozen=True)
class Case:
    """A model of the coverage table: ``build()`` gives ``(model, inputs, loss_fn)``."""

    name: str
    library: str
    build: Callable[[], tuple[nn.Module, tuple, Callable[[Any], torch.Tensor]]]
    note: str = ""


# ----------------------------------------------------------------------------- the models


def _images(model: nn.Module, size: int, classes: int, batch: int = 4):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)

    def loss(out):
        logits = out if isinstance(out, torch.Tensor) else out[0]
        return F.cross_entropy(logits, y)

    return model, (x,), loss


def _timm(name: str, size: int, batch: int = 4, **kw):
    def build():
        timm = import_module("timm")
        torch.manual_seed(0)
        # no stochastic depth (Swin's default is 0.1): the phases of the check compare
        # gradients of separate runs, which must see the same network
        kw.setdefault("drop_path_rate", 0.0)
        model = timm.create_model(name, pretrained=False, num_classes=10, **kw)
        return _images(model, size, 10, batch)

    return build


def _tokens(vocab: int, seq: int = 16, batch: int = 2):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, seq), generator=g)


def _lm(model: nn.Module, vocab: int):
    ids = _tokens(vocab)

    def loss(out):
        logits = out.logits[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    return model, (ids,), loss


def _transformers():
    return import_module("transformers")


def _hf_config(name: str, **kw):
    """transformers, and its config class ``name`` built from ``kw``, with the models' random
    init seeded."""
    tf = _transformers()
    torch.manual_seed(0)
    return tf, getattr(tf, name)(**kw)


def _gpt2():
    tf, cfg = _hf_config(
        "GPT2Config",
        vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=127, eos_token_id=127,
    )  # fmt: skip
    return _lm(tf.GPT2LMHeadModel(cfg), 128)


def _llama_config(tf):
    return tf.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        use_cache=False,
    )  # fmt: skip


def _llama():
    tf = _transformers()
    torch.manual_seed(0)
    return _lm(tf.LlamaForCausalLM(_llama_config(tf)), 128)


def _bert():
    tf, cfg = _hf_config(
        "BertConfig",
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    model = tf.BertForMaskedLM(cfg)
    ids = _tokens(128)

    def loss(out):
        return F.cross_entropy(out.logits.reshape(-1, 128), ids.reshape(-1))

    return model, (ids,), loss


def _t5():
    tf, cfg = _hf_config(
        "T5Config",
        vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
        num_heads=4, dropout_rate=0.0, use_cache=False, decoder_start_token_id=0,
    )  # fmt: skip
    model = tf.T5ForConditionalGeneration(cfg)
    ids, labels = _tokens(128), _tokens(128, seq=8)

    class Seq2Seq(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids, labels=labels).loss

    return Seq2Seq(model), (ids,), lambda loss: loss


def _clip_vision():
    tf, cfg = _hf_config(
        "CLIPVisionConfig",
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        image_size=32, patch_size=8, projection_dim=32,
    )  # fmt: skip
    model = tf.CLIPVisionModelWithProjection(cfg)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return model, (x,), lambda out: out.image_embeds.pow(2).mean()


def _whisper_encoder():
    tf, cfg = _hf_config(
        "WhisperConfig",
        vocab_size=128, num_mel_bins=16, d_model=64, encoder_layers=2, encoder_attention_heads=4,
        decoder_layers=1, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=16, max_target_positions=16, dropout=0.0, use_cache=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )  # fmt: skip
    whisper = import_module("transformers.models.whisper.modeling_whisper")
    model = whisper.WhisperEncoder(cfg)
    g = torch.Generator().manual_seed(1)
    feats, target = torch.randn(2, 16, 32, generator=g), torch.randn(2, 16, 64, generator=g)
    return model, (feats,), lambda out: (out.last_hidden_state - target).pow(2).mean()


def _peft_lora():
    tf = _transformers()
    peft = import_module("peft")
    torch.manual_seed(0)
    base = tf.LlamaForCausalLM(_llama_config(tf))
    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(base, cfg)
    # LoRA's B starts at zero; move it off zero so every adapter has a gradient to compare
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    return _lm(model, 128)


CASES: tuple[Case, ...] = (
    Case("timm ViT", "timm", _timm("vit_tiny_patch16_224", 32, img_size=32, patch_size=8,
                                   embed_dim=64, depth=2, num_heads=4)),
    Case("timm ResNet", "timm", _timm("resnet18", 32)),
    Case("timm ConvNeXt", "timm", _timm("convnext_atto", 32, dims=(16, 32, 48, 64),
                                        depths=(1, 1, 1, 1))),
    Case("timm MobileNetV3", "timm", _timm("mobilenetv3_small_050", 32)),
    Case("timm Swin", "timm", _timm("swin_tiny_patch4_window7_224", 32, img_size=32,
                                    window_size=4, embed_dim=32, depths=(1, 1),
                                    num_heads=(2, 4))),
    Case("timm EfficientFormer", "timm", _timm("efficientformer_l1", 224, 2, depths=(1, 1, 1, 1),
                                               embed_dims=(16, 32, 48, 64), num_vit=1)),
    Case("HF GPT-2", "transformers", _gpt2, "attention/MLP are Conv1D (addmm)"),
    Case("HF Llama", "transformers", _llama),
    Case("HF BERT", "transformers", _bert),
    Case("HF T5", "transformers", _t5),
    Case("HF CLIP vision", "transformers", _clip_vision),
    Case("HF Whisper encoder", "transformers", _whisper_encoder),
    Case("PEFT LoRA (HF Llama)", "peft", _peft_lora, "base weights frozen: g_x only"),
)  # fmt: skip


# ----------------------------------------------------------------------------- the check


def weight_module_calls(model: nn.Module, inputs: tuple) -> list[str]:
    """Names of the modules called in an eager forward that own a weight of ≥ 2 dims (one
    entry per call), embeddings excluded. What the plan must account for, row by row."""
    calls: list[str] = []
    hooks = []
    for name, mod in model.named_modules():
        w = mod._parameters.get("weight")
        if w is None or w.dim() < 2 or isinstance(mod, (nn.Embedding, nn.EmbeddingBag)):
            continue
        hooks.append(mod.register_forward_hook(lambda m, i, o, name=name: calls.append(name)))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return calls


def _counting(backend) -> tuple[Callable, list[int]]:
    """``backend`` wrapped to count the graphs Dynamo hands it (``count[0]``)."""
    count = [0]

    def counted(gm, example_inputs):
        count[0] += 1
        return backend(gm, example_inputs)

    return counted, count


def _count_graphs(model: nn.Module, inputs: tuple, backend) -> int:
    torch._dynamo.reset()
    counted, count = _counting(backend)
    torch.compile(model, backend=counted)(*inputs)
    torch._dynamo.reset()
    return count[0]


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    den = a.norm() * b.norm()
    return float((a @ b) / den) if den > 0 else float("nan")


@dataclasses.dataclass
class Row:
    """One model's coverage result."""

    model: str
    library: str
    weight_calls: int
    hot: int
    skipped: int
    skip_reasons: dict[str, int]
    graphs_hot: int
    graphs_plain: int
    ref_rel: float
    ref_cos: float
    grad_cos: float
    min_layer_cos: float
    losses: list[float]
    seconds: float
    note: str = ""
    unaccounted: list[str] = dataclasses.field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every weight call is a plan row (rewritten or skipped with a reason)."""
        return self.hot + self.skipped == self.weight_calls and not self.unaccounted

    @property
    def trains(self) -> bool:
        return all(math.isfinite(v) for v in self.losses) and self.losses[-1] < self.losses[0]


STEPS = 4


def check(case: Case, steps: int = STEPS, lr: float = 1e-3) -> Row:
    """Run the four checks of the module doc on one model."""
    t0 = time.perf_counter()
    pristine, inputs, loss_fn = case.build()
    pristine.train()

    def fresh() -> nn.Module:
        # every phase on its own copy: some models keep Python state between compiles (timm's
        # Swin computes another forward after a second compile, with plain torch.compile too)
        torch._dynamo.reset()
        torch.manual_seed(0)
        return copy.deepcopy(pristine)

    calls = weight_module_calls(fresh(), inputs)
    graphs_plain = _count_graphs(fresh(), inputs, lambda gm, ex: gm.forward)

    def grads_of(model: nn.Module, fn) -> dict[str, torch.Tensor]:
        loss_fn(fn(*inputs)).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model = fresh()
    exact = grads_of(model, model)
    # HOT compiled against HOT's reference path (the rewritten graph run eagerly by autograd
    # with the reference ops). Bit-level agreement is checked with g_x exact and rounding to
    # nearest: a quantized g_x turns any last-bit difference of the compiled graph (a
    # decomposed BatchNorm, another summation order) into flipped INT4 codes whose error
    # every layer below carries on, so two equally valid HOT gradients of a deep model differ
    # as much as either differs from the exact one. With quantized g_x the two are compared
    # by their cosine to the exact gradient.
    ref = {}
    det = {**OPTIONS, "rounding": "nearest", "gx_bits": None}
    for compiler in ("eager", "aot_eager"):
        model = fresh()
        backend = hotcompile.HotBackend(**{**det, "compiler": compiler})
        ref[compiler] = grads_of(model, torch.compile(model, backend=backend))
    model = fresh()
    backend = hotcompile.HotBackend(**{**OPTIONS, "compiler": "eager"})
    reference = grads_of(model, torch.compile(model, backend=backend))

    # HOT with its default numerics: the gradients, the plan, the graphs, then training
    model = fresh()
    backend = hotcompile.HotBackend(**OPTIONS)
    counted, n_graphs = _counting(backend)
    compiled = torch.compile(model, backend=counted)
    hot = grads_of(model, compiled)
    plans = backend.layers
    names = [n for n in exact if n in hot]
    flat = lambda g: torch.cat([g[n].double().flatten() for n in names])  # noqa: E731
    grad_cos = _cos(flat(exact), flat(hot))
    ref_rel = float(
        (flat(ref["aot_eager"]) - flat(ref["eager"])).norm() / flat(ref["eager"]).norm()
    )
    ref_cos = _cos(flat(exact), flat(reference))
    rewritten = {p.name for p in plans if p.path != "skipped"}
    layer_cos = [
        _cos(hot[n], exact[n]) for n in names
        if n.removesuffix(".weight") in rewritten and exact[n].dim() >= 2
        and exact[n].norm() > 0
    ]  # fmt: skip

    # a few training steps on the same batch
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(compiled(*inputs))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    torch._dynamo.reset()

    reasons: dict[str, int] = {}
    for p in plans:
        if p.path == "skipped":  # one entry per kind of reason: "groups=N: grouped/..."
            key = re.sub(r"=\d+", "=N", p.reason)
            reasons[key] = reasons.get(key, 0) + 1
    planned = {p.name.split(":")[0] for p in plans}
    unaccounted = sorted({c for c in calls if c not in planned})
    return Row(
        model=case.name, library=case.library, weight_calls=len(calls),
        hot=sum(p.path != "skipped" for p in plans),
        skipped=sum(p.path == "skipped" for p in plans), skip_reasons=reasons,
        ref_rel=ref_rel, ref_cos=ref_cos, graphs_hot=n_graphs[0], graphs_plain=graphs_plain,
        grad_cos=grad_cos, min_layer_cos=min(layer_cos) if layer_cos else float("nan"),
        losses=losses, seconds=time.perf_counter() - t0, note=case.note, unaccounted=unaccounted,
    )  # fmt: skip


# ----------------------------------------------------------------------------- report


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    """The coverage table (README and tools/results/coverage.md)."""
    head = (
        "| model | weight calls | HOT layers | skipped (reason) | graphs hot / plain "
        "| g_w vs reference (rel) | cos to exact: compiled / reference (min layer) "
        "| loss first → last |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        why = "; ".join(f"{n}× {k}" for k, n in sorted(r.skip_reasons.items())) or "–"
        lines.append(
            f"| {r.model} | {r.weight_calls} | {r.hot} | {r.skipped}: {why} "
            f"| {r.graphs_hot} / {r.graphs_plain} | {r.ref_rel:.1e} "
            f"| {r.grad_cos:.3f} / {r.ref_cos:.3f} ({r.min_layer_cos:.3f}) "
            f"| {r.losses[0]:.3f} → {r.losses[-1]:.3f} |"
        )
    foot = (
        f"\nCPU, torch {meta['torch']}, timm {meta['timm']}, transformers "
        f"{meta['transformers']}, peft {meta['peft']}; commit {meta['commit']}, {meta['date']}; "
        f"`python tools/coverage.py` (HOT options {OPTIONS}: HOT's default numerics with the "
        "reference ops). *weight calls*: forward calls of modules owning a ≥2-D weight "
        "(embeddings excluded); every one is a plan row. *g_w vs reference*: relative "
        "difference of the compiled HOT gradient to HOT's reference path (the rewritten graph "
        "run eagerly, reference ops), with g_x exact and rounding to nearest so that it is "
        "deterministic (g_w stays INT8: a last-bit difference can flip a code). "
        "*cos to exact*: cosine of HOT's whole gradient (default numerics) to "
        "autograd's after one step, compiled and on the reference path (a quantized g_x makes "
        "last-bit differences grow through the layers: the two are equally valid draws); "
        "*min layer*: the lowest cosine of a compiled rewritten layer's weight gradient. "
        f"Training: AdamW lr 1e-3, {STEPS} steps on one batch."
    )
    return "\n".join(lines) + "\n" + foot + "\n"


def _meta() -> dict[str, Any]:
    libs = versions(("timm", "transformers", "peft"))
    return {
        "torch": torch.__version__, **{k: v or "missing" for k, v in libs.items()},
        "python": platform.python_version(), "commit": _commit(),
        "date": datetime.date.today().isoformat(),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python tools/coverage.py\n"
        "  python tools/coverage.py --models 'HF GPT-2' 'timm Swin' --no-write\n",
    )
    p.add_argument("--models", nargs="*", help="names from the table (default: all)")
    p.add_argument("--no-write", action="store_true", help="print only; write no results")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    cases = [c for c in CASES if not args.models or c.name in args.models]
    rows = []
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    it = cases if tqdm is None or args.no_progress else tqdm(cases, desc="coverage")
    for case in it:
        rows.append(check(case))
    meta = _meta()
    text = markdown(rows, meta)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "coverage.md").write_text("# Model coverage (issue 15)\n\n" + text)
        data = {"meta": meta, "options": OPTIONS,
                "rows": [dataclasses.asdict(r) for r in rows]}  # fmt: skip
        (RESULTS / "coverage.json").write_text(json.dumps(data, indent=2) + "\n")
    bad = [r.model for r in rows if not (r.complete and r.trains)]
    if bad:
        print("not covered or not training:", ", ".join(bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

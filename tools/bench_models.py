"""The models that tools/bench_train.py trains: the issue's four, plus the two it defined itself.

Every model is built from a config object with random weights: no ``from_pretrained``, no hub
access, nothing downloaded. Full size (the GPU benchmark) and tiny (``--quick``, a CPU smoke
test of the same model family and code path):

  vit_b16    timm ``vit_base_patch16_224`` (1000 classes), 224x224 images, batch 128.
             quick: the same timm VisionTransformer, 32x32 images, patch 8, dim 64, depth 2.
  llama      HF ``LlamaForCausalLM(LlamaConfig(hidden 2048, intermediate 8192, 8 layers,
             16 heads, 16 KV heads, vocab 32000))``, SDPA attention, seq 2048, batch 4.
             quick: hidden 64, intermediate 128, 2 layers, 4 heads, vocab 256, seq 32.
  resnet50   timm ``resnet50`` (1000 classes), 224x224, batch 128, channels_last (model and
             input). quick: timm's ResNet with ResNet-50's bottleneck blocks, one per stage,
             widths 8/16/32/64, 32x32 images.
  gpt2       HF ``GPT2LMHeadModel(GPT2Config())`` (GPT-2 small: n_embd 768, 12 layers,
             vocab 50257, n_positions 1024, head tied to the token embedding), SDPA attention,
             seq 1024, batch 8. quick: n_embd 64, 2 layers, 4 heads, vocab 256, seq 64.
  llama8b    issue 34's second Llama: HF LlamaForCausalLM at Llama-3-8B's layer widths (hidden
             4096, intermediate 14336, 32 heads, 8 KV heads, vocab 32000), 2 layers, seq 4096,
             batch 2: not run unless named. quick: hidden 64, intermediate 224, 2 KV heads.
  vit_l16    timm ``vit_large_patch16_224`` (1000 classes), 224x224, batch 64: not run unless
             named. quick: as vit_b16's.
  gpt2_linear
             gpt2 with transformers' Conv1D layers (GPT-2's block linears: addmm with an
             (in, out) weight) swapped for equivalent nn.Linear: not run unless named.
  vit_b16_local, gpt2_local
             the ViT-B/16 and GPT-2 small this script defined itself before (hotcompile.demo
             blocks): not run unless named.

HF models are built with ``use_cache=False`` (a training step keeps no KV cache) and, for
GPT-2, dropout 0 (GPT2Config's default is 0.1; LLaMA and timm's ViT have none): every model
trains without dropout, so that all variants see the same forward and the same first loss.
Each model's ``forward(x)`` gives logits (HF models: an output whose ``.logits`` they are);
bench_train.WithLoss adds the cross-entropy against the batch's targets (for the language
models, the next tokens: the shifted LM loss).

Models whose library (timm, transformers) is missing are skipped by bench_train with that
reason (:func:`missing`). :func:`versions` names the libraries' versions for the report.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable

import torch
import torch.nn as nn

from hotcompile.compat import import_module  # timm / transformers next to a CPU torch

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A benchmarked model: how to build it and a batch for it, full size and tiny (quick).

    ``build(quick)`` gives the model, ``batch(b, quick, generator)`` (inputs, targets) on the
    CPU. ``requires``: modules the model needs (missing: the model is skipped, not failed).
    ``classifier``: module names (relative to the model) of the final classifier or LM head,
    which torchao's float8 conversion leaves in high precision. ``channels_last``: model and
    images in ``torch.channels_last``. ``quick_default``: run by ``--quick`` without
    ``--models``."""

    name: str
    description: str
    build: Callable[[bool], nn.Module]
    batch: Callable[[int, bool, torch.Generator], Batch]
    default_batch: int
    quick_batch: int
    quick_description: str = "tiny dims"
    requires: tuple[str, ...] = ()
    classifier: tuple[str, ...] = ()
    channels_last: bool = False
    default: bool = True
    quick_default: bool = True


# ----------------------------------------------------------------------------- libraries


def missing(spec: ModelSpec) -> str | None:
    """Why ``spec`` cannot be built here (``"timm not installed"``), or None."""
    for name in spec.requires:
        try:
            import_module(name)
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] == name:
                return f"{name} not installed"
            return f"{name} not importable: {type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - a broken install is a reason, not a crash
            return f"{name} not importable: {type(e).__name__}: {e}"
    return None


def versions(
    names: tuple[str, ...] = ("torchao", "timm", "transformers", "torchvision"),
) -> dict[str, str | None]:
    """Installed versions of the model and float8 libraries (None: not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


# ----------------------------------------------------------------------------- batches


def _images(img: int, classes: int) -> Callable[[int, bool, torch.Generator], Batch]:
    def batch(b: int, quick: bool, gen: torch.Generator) -> Batch:
        size, n = (32, 10) if quick else (img, classes)
        return torch.randn(b, 3, size, size, generator=gen), torch.randint(n, (b,), generator=gen)

    return batch


def _tokens(vocab: int, seq: int, quick_vocab: int, quick_seq: int):
    def batch(b: int, quick: bool, gen: torch.Generator) -> Batch:
        v, s = (quick_vocab, quick_seq) if quick else (vocab, seq)
        tokens = torch.randint(v, (b, s + 1), generator=gen)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return batch


# ----------------------------------------------------------------------------- the issue's


def _vit_b16(quick: bool) -> nn.Module:
    timm = import_module("timm")
    if quick:
        return timm.create_model(
            "vit_base_patch16_224",
            pretrained=False,
            num_classes=10,
            img_size=32,
            patch_size=8,
            embed_dim=64,
            depth=2,
            num_heads=4,
        )
    return timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000)


def _resnet50(quick: bool) -> nn.Module:
    timm = import_module("timm")
    if quick:  # ResNet-50's bottleneck blocks, one per stage, narrow
        return timm.create_model(
            "resnet50",
            pretrained=False,
            num_classes=10,
            layers=(1, 1, 1, 1),
            channels=(8, 16, 32, 64),
            stem_width=8,
        )
    return timm.create_model("resnet50", pretrained=False, num_classes=1000)


def _llama(quick: bool, layers: int | None = None) -> nn.Module:
    """The benchmark's Llama (``layers``: another number of blocks, same widths)."""
    tf = import_module("transformers")
    dims = (
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
        | dict(num_key_value_heads=4, vocab_size=256, max_position_embeddings=64)
        if quick
        else dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=8)
        | dict(num_attention_heads=16, num_key_value_heads=16, vocab_size=32000)
        | dict(max_position_embeddings=2048)
    )
    if layers is not None:
        dims["num_hidden_layers"] = layers
    cfg = tf.LlamaConfig(**dims, use_cache=False, attn_implementation="sdpa")
    return tf.LlamaForCausalLM(cfg)


def _llama8b(quick: bool) -> nn.Module:
    """Two Llama blocks at Llama-3-8B's layer widths (issue 34's second Llama)."""
    tf = import_module("transformers")
    dims = (
        dict(hidden_size=64, intermediate_size=224, num_hidden_layers=2, num_attention_heads=4)
        | dict(num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
        if quick
        else dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2)
        | dict(num_attention_heads=32, num_key_value_heads=8, vocab_size=32000)
        | dict(max_position_embeddings=4096)
    )
    cfg = tf.LlamaConfig(**dims, use_cache=False, attn_implementation="sdpa")
    return tf.LlamaForCausalLM(cfg)


def _vit_l16(quick: bool) -> nn.Module:
    timm = import_module("timm")
    if quick:
        return timm.create_model(
            "vit_large_patch16_224", pretrained=False, num_classes=10, img_size=32,
            patch_size=8, embed_dim=64, depth=2, num_heads=4,
        )  # fmt: skip
    return timm.create_model("vit_large_patch16_224", pretrained=False, num_classes=1000)


def _gpt2(quick: bool) -> nn.Module:
    tf = import_module("transformers")
    dims = (
        dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
        | dict(bos_token_id=255, eos_token_id=255)
        if quick
        else {}  # GPT-2 small: GPT2Config's defaults
    )
    cfg = tf.GPT2Config(
        **dims,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return tf.GPT2LMHeadModel(cfg)


def _gpt2_linear(quick: bool) -> nn.Module:
    """HF GPT-2 with each transformers ``Conv1D`` (``addmm(b, x, W)``, W stored (in, out))
    swapped for the equivalent ``nn.Linear`` (W transposed): the same function and initial
    weights, written the way torchao's float8 conversion (nn.Linear only) and F.linear-shaped
    graph patterns see."""
    model = _gpt2(quick)
    for mod in list(model.modules()):
        for cname, child in list(mod.named_children()):
            if type(child).__name__ == "Conv1D":
                n_in, n_out = child.weight.shape
                lin = nn.Linear(n_in, n_out)
                with torch.no_grad():
                    lin.weight.copy_(child.weight.t())
                    lin.bias.copy_(child.bias)
                setattr(mod, cname, lin)
    return model


# ----------------------------------------------------------------------------- local models


def _init_weights(model: nn.Module) -> None:
    """GPT-2/ViT-style init (normal 0.02, zero biases): realistic activation and gradient
    scales matter to HOT, whose LQS picks quantizers from the gradients it sees."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


class ViT(nn.Module):
    """ViT-B/16-shaped classifier (timm's ``vit_base_patch16_224`` layout, pre-norm blocks from
    ``hotcompile.demo.Block``; LayerNorm eps 1e-5 instead of timm's 1e-6, no dropout)."""

    def __init__(
        self,
        img: int = 224,
        patch: int = 16,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        mlp: int = 3072,
        classes: int = 1000,
        chans: int = 3,
    ) -> None:
        from hotcompile.demo import Block

        super().__init__()
        self.patch = nn.Conv2d(chans, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, (img // patch) ** 2 + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        _init_weights(self)
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.cls, std=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


class GPT2(nn.Module):
    """GPT-2-small-shaped decoder: token + learned position embeddings, causal SDPA blocks
    (``hotcompile.demo.Block(causal=True)``), final LayerNorm, LM head tied to the token
    embedding (as GPT-2 does). Vocabulary 50257 is kept unpadded: HOT pads it internally."""

    def __init__(
        self,
        vocab: int = 50257,
        ctx: int = 1024,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        tied: bool = True,
    ) -> None:
        from hotcompile.demo import Block

        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, 4 * dim, causal=True) for _ in range(depth))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        _init_weights(self)
        if tied:
            self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def _vit_local(quick: bool) -> nn.Module:
    if quick:
        return ViT(img=32, patch=8, dim=64, depth=2, heads=4, mlp=128, classes=10)
    return ViT()


def _gpt2_local(quick: bool) -> nn.Module:
    if quick:  # vocab 257: not a multiple of 16, like 50257, so HOT's padding path runs
        return GPT2(vocab=257, ctx=64, dim=64, depth=2, heads=4)
    return GPT2()


# ----------------------------------------------------------------------------- registry

MODELS: dict[str, ModelSpec] = {
    "vit_b16": ModelSpec(
        "vit_b16",
        "timm vit_base_patch16_224 (random init; 86M parameters: 12 blocks, dim 768, 12 heads, "
        "MLP 3072), 224x224 images, 1000 classes, cross-entropy on random labels",
        _vit_b16,
        _images(224, 1000),
        128,
        4,
        quick_description="timm VisionTransformer, 32x32 images, patch 8, dim 64, depth 2, "
        "4 heads, 10 classes",
        requires=("timm",),
        classifier=("head",),
    ),
    "llama": ModelSpec(
        "llama",
        "HF LlamaForCausalLM(LlamaConfig(hidden 2048, intermediate 8192, 8 layers, 16 heads, "
        "16 KV heads, vocab 32000, max positions 2048)), SDPA attention, no KV cache, random "
        "init (~0.67B parameters, untied head), seq 2048, next-token cross-entropy",
        _llama,
        _tokens(32000, 2048, 256, 32),
        4,
        2,
        quick_description="LlamaConfig hidden 64, intermediate 128, 2 layers, 4 heads, vocab "
        "256, seq 32",
        requires=("transformers",),
        classifier=("lm_head",),
    ),
    "llama8b": ModelSpec(
        "llama8b",
        "HF LlamaForCausalLM at Llama-3-8B's layer widths (hidden 4096, intermediate 14336, "
        "32 heads, 8 KV heads, vocab 32000), 2 layers, SDPA attention, no KV cache, random "
        "init, seq 4096, next-token cross-entropy",
        _llama8b,
        _tokens(32000, 4096, 256, 32),
        2,
        2,
        quick_description="LlamaConfig hidden 64, intermediate 224, 2 layers, 4 heads, 2 KV "
        "heads, vocab 256, seq 32",
        requires=("transformers",),
        classifier=("lm_head",),
        default=False,
        quick_default=False,
    ),
    "vit_l16": ModelSpec(
        "vit_l16",
        "timm vit_large_patch16_224 (random init; 304M parameters: 24 blocks, dim 1024, 16 "
        "heads, MLP 4096), 224x224 images, 1000 classes, cross-entropy on random labels",
        _vit_l16,
        _images(224, 1000),
        64,
        4,
        quick_description="timm VisionTransformer, 32x32 images, patch 8, dim 64, depth 2, "
        "4 heads, 10 classes",
        requires=("timm",),
        classifier=("head",),
        default=False,
        quick_default=False,
    ),
    "resnet50": ModelSpec(
        "resnet50",
        "timm resnet50 (random init, 25.6M parameters), 224x224 images, 1000 classes, "
        "channels_last model and input, cross-entropy on random labels",
        _resnet50,
        _images(224, 1000),
        128,
        4,
        quick_description="timm ResNet, bottleneck blocks (1,1,1,1), widths 8/16/32/64, "
        "32x32 images, 10 classes",
        requires=("timm",),
        classifier=("fc",),
        channels_last=True,
    ),
    "gpt2": ModelSpec(
        "gpt2",
        "HF GPT2LMHeadModel(GPT2Config()) (GPT-2 small: n_embd 768, 12 layers, 12 heads, "
        "vocab 50257, n_positions 1024, head tied to wte; dropout 0, no KV cache), SDPA "
        "attention, random init, seq 1024, next-token cross-entropy. Its block linears are "
        "transformers' Conv1D (addmm with a (in, out) weight), not nn.Linear",
        _gpt2,
        _tokens(50257, 1024, 256, 64),
        8,
        2,
        quick_description="GPT2Config n_embd 64, 2 layers, 4 heads, vocab 256, n_positions 64, "
        "seq 64",
        requires=("transformers",),
        classifier=("lm_head",),
    ),
    "gpt2_linear": ModelSpec(
        "gpt2_linear",
        "gpt2 (HF GPT-2 small, as above) with each transformers Conv1D swapped for the "
        "equivalent nn.Linear (weights transposed, same initial values)",
        _gpt2_linear,
        _tokens(50257, 1024, 256, 64),
        8,
        2,
        quick_description="as gpt2's",
        requires=("transformers",),
        classifier=("lm_head",),
        default=False,
        quick_default=False,
    ),
    "vit_b16_local": ModelSpec(
        "vit_b16_local",
        "ViT-B/16 defined in tools/bench_models.py (conv patch embed, 12 hotcompile.demo "
        "blocks, dim 768, 12 heads, MLP 3072, 224x224, 1000 classes)",
        _vit_local,
        _images(224, 1000),
        128,
        4,
        quick_description="dim 64, depth 2, 4 heads, 32x32, patch 8, 10 classes",
        classifier=("head",),
        default=False,
        quick_default=False,
    ),
    "gpt2_local": ModelSpec(
        "gpt2_local",
        "GPT-2 small defined in tools/bench_models.py (12 causal hotcompile.demo blocks, "
        "d 768, 12 heads, seq 1024, vocab 50257, tied head)",
        _gpt2_local,
        _tokens(50257, 1024, 257, 64),
        8,
        2,
        quick_description="dim 64, depth 2, 4 heads, vocab 257, seq 64",
        classifier=("head",),
        default=False,
        quick_default=False,
    ),
}


# ----------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """List the models: name, batch, whether this machine can build it, its description."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="tools/bench_models.py",
        description=__doc__.split("\n\n")[0]
        + " A module that bench_train.py, bench_distributed.py and coverage.py import; run"
        " alone it lists the models.",
        epilog="examples:\n"
        "  python3 tools/bench_models.py             # the models, batch sizes, what is missing\n"
        "  python3 tools/bench_models.py --params    # + parameter counts of the tiny versions\n"
        "  python3 tools/bench_train.py --models llama,gpt2   # train them (see its --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--params",
        action="store_true",
        help="build each tiny (quick) model and count its parameters",
    )
    a = ap.parse_args(argv)
    for name, spec in MODELS.items():
        why = missing(spec)
        line = f"{name:14} batch {spec.default_batch:4} (quick {spec.quick_batch})"
        if a.params and why is None:
            n = sum(p.numel() for p in spec.build(True).parameters())
            line += f", quick {n / 1e6:.2f} M params"
        print(f"{line}{'' if spec.default else ', only when named'}: {why or 'buildable here'}")
        print(f"{'':16}{spec.description}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

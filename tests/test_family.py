"""hotcompile.passes.family: a split graph still knows a text model from an image model.

Single-process: DDPOptimizer is used directly as the backend (what dynamo does under DDP), so
the pieces are the ones a DDP run compiles; graph breaks and blocks compiled one by one stand
for FSDP2's frames (tests/test_distributed.py runs the real wrappers on 2 processes).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from conftest import MLPBlock

import hotcompile
from hotcompile.passes import family
from hotcompile.passes.rewrite import token_sequence_nodes

EAGER = {"compiler": "eager"}


@pytest.fixture(autouse=True)
def _fresh_family():
    family.clear()
    yield
    family.clear()


class TinyLM(nn.Module):
    """Token + position embeddings, MLP blocks, LM head; ``eager_embed``: the embedding runs
    outside the compiled blocks (as under FSDP2); ``brk``: a graph break after it."""

    def __init__(self, vocab: int = 64, d: int = 32, depth: int = 3, brk: bool = False):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(16, d)
        self.blocks = nn.ModuleList(MLPBlock(d, 2 * d) for _ in range(depth))
        self.head = nn.Linear(d, vocab)
        self.brk = brk

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1]))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if self.brk:
            torch._dynamo.graph_break()
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


class TinyImage(nn.Module):
    """Conv patches + a position *embedding lookup* of arange (as CLIP's vision tower)."""

    def __init__(self, d: int = 32, depth: int = 3):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, stride=4)
        self.pos = nn.Embedding(16, d)
        self.blocks = nn.ModuleList(MLPBlock(d, 2 * d) for _ in range(depth))
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = x + self.pos(torch.arange(x.shape[1]))
        for b in self.blocks:
            x = x + b(x)
        return self.head(x.mean(1))


def _signs(plans) -> dict[str, bool]:
    return {p.name: bool(p.spec.hla_signs) for p in plans if p.spec is not None}


def _ids(b: int = 2, s: int = 16) -> torch.Tensor:
    return torch.randint(64, (b, s), generator=torch.Generator().manual_seed(0))


def _ddp_pieces(model: nn.Module, x: torch.Tensor, bucket: int = 20_000) -> hotcompile.HotBackend:
    """Compile ``model`` as DDP would: DDPOptimizer splits at ``bucket``-byte buckets and
    calls the hot backend per piece. Returns the backend (``.records``: one per piece)."""
    from torch._dynamo.backends.distributed import DDPOptimizer

    backend = hotcompile.HotBackend(**EAGER)
    ddpo = DDPOptimizer(bucket, backend, first_bucket_cap=bucket)
    torch.compile(model, backend=ddpo.compile_fn, dynamic=False)(x).float().sum().backward()
    return backend


def test_unsplit_graph_marks_unchanged():
    """One graph: exactly token_sequence_nodes's marks, and nothing carried."""
    seen = []

    def spy(gm, example_inputs):
        seen.append((family.token_nodes(gm, example_inputs), token_sequence_nodes(gm)))
        return gm.forward

    for model, x in ((TinyLM(), _ids()), (TinyImage(), torch.randn(2, 3, 16, 16))):
        torch._dynamo.reset()
        torch.compile(model, backend=spy)(x)
    (text, text_ref), (image, image_ref) = seen
    assert text == text_ref and text and not image and not image_ref
    assert [r.source for r in family.records()] == ["embedding", "none"]


def test_ddp_pieces_carry_text_marks():
    """Every piece of a split text model treats its layers as the unsplit graph does."""
    x = _ids()
    whole = hotcompile.HotBackend(**EAGER)
    torch.compile(TinyLM(), backend=whole)(x)
    family.clear()
    torch._dynamo.reset()
    split = _ddp_pieces(TinyLM(), x)
    assert len(split.records) >= 3, "DDPOptimizer did not split the graph"
    assert _signs(split.layers) == _signs(whole.layers)
    assert all(_signs(whole.layers).values())
    sources = [r.source for r in family.records()]
    assert sources[0] == "embedding" and set(sources[1:]) == {"pieces"}, sources
    assert {r.compile_id for r in family.records()} == {family.records()[0].compile_id}


def test_ddp_pieces_without_family_lose_text(monkeypatch: pytest.MonkeyPatch):
    """The failure the carry fixes: with the graph's own marks only, later pieces are image."""
    monkeypatch.setattr(family, "token_nodes", lambda gm, ex=None: token_sequence_nodes(gm))
    signs = _signs(_ddp_pieces(TinyLM(), _ids()).layers)
    assert signs["blocks.0.fc1"] and not signs["head"], signs


def test_ddp_pieces_of_image_model_stay_image():
    backend = _ddp_pieces(TinyImage(), torch.randn(2, 3, 16, 16), bucket=8_000)
    assert len(backend.records) >= 2
    assert not any(_signs(backend.layers).values())
    assert {r.family for r in family.records()} == {"image"}


def test_blocks_compiled_alone_read_eager_embedding():
    """FSDP2's case: the embedding runs eagerly, each block is its own frame."""
    model = TinyLM()
    backend = hotcompile.HotBackend(**EAGER)
    for i, b in enumerate(model.blocks):
        model.blocks[i] = torch.compile(b, backend=backend)
    model.head = torch.compile(model.head, backend=backend)
    model(_ids()).sum().backward()
    assert backend.layers and all(_signs(backend.layers).values())
    assert {r.source for r in family.records()} == {"history"}
    assert "eager embedding lookup" in family.records()[0].detail


def test_blocks_compiled_alone_after_position_lookup_stay_image():
    """An eager lookup of arange positions is not a token embedding."""
    model = TinyImage()
    backend = hotcompile.HotBackend(**EAGER)
    for i, b in enumerate(model.blocks):
        model.blocks[i] = torch.compile(b, backend=backend)
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    assert backend.layers and not any(_signs(backend.layers).values())


def test_graph_break_after_compiled_embedding():
    """The embedding compiled in the first graph (AOTAutograd: no embedding node in the
    autograd history, only the compiled function's): the continuation reaches its table."""
    backend = hotcompile.HotBackend(compiler="aot_eager")
    torch.compile(TinyLM(brk=True), backend=backend)(_ids()).sum().backward()
    assert len(backend.records) == 2
    assert backend.layers and all(_signs(backend.layers).values())
    last = family.records()[-1]
    assert last.source == "history" and "token table" in last.detail, last


def test_assume_overrides():
    backend = hotcompile.HotBackend(**EAGER)
    with family.assume("text"):
        torch.compile(TinyImage(), backend=backend)(torch.randn(2, 3, 16, 16))
    assert all(_signs(backend.layers).values())
    torch._dynamo.reset()
    backend = hotcompile.HotBackend(**EAGER)
    with family.assume("image"):
        torch.compile(TinyLM(), backend=backend)(_ids())
    assert not any(_signs(backend.layers).values())
    assert [r.source for r in family.records()] == ["assumed", "assumed"]
    with pytest.raises(ValueError, match="family"), family.assume("audio"):
        pass


def test_position_ids_rule():
    assert family.is_position_ids(torch.arange(8)[None].expand(3, 8))
    assert family.is_position_ids(torch.arange(4, 12)[None])
    assert not family.is_position_ids(torch.tensor([[3, 1, 4, 1, 5]]))
    assert not family.is_position_ids(torch.tensor([[7]]))

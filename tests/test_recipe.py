"""``HotConfig.recipe`` (issue 16): HOT's numerics per model family.

Text layers (input computed from a token embedding) get FP8 g_x values and no HLA by default,
image layers the paper's INT4 HQ + HLA; ``recipe="paper"`` reproduces the paper everywhere.
A recipe never overrides an option the user passed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from conftest import AOT
from test_hla_choice import _Tokens

import hotcompile
from hotcompile import HotConfig, HotConfigError

TEXT = {"text.1", "head"}


def _step(options: dict) -> tuple[dict[str, hotcompile.LayerPlan], dict[str, torch.Tensor]]:
    """One compiled step of the text + image model: the plans and the gradients."""
    hotcompile.clear_plans()
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = _Tokens()
    c = torch.compile(m, backend="hot", options={**AOT, **options})
    torch.manual_seed(1)
    c(torch.randint(256, (2, 64)), torch.randn(2, 64, 32)).backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in m.parameters())
    return {p.name: p for p in hotcompile.plans()}, {n: p.grad for n, p in m.named_parameters()}


def _plans(options: dict) -> dict[str, hotcompile.LayerPlan]:
    return _step(options)[0]


def test_auto_gives_text_layers_the_text_recipe_and_says_so() -> None:
    plans = _plans({})
    assert set(plans) == TEXT | {"patch"}
    for name, p in plans.items():
        row = p.describe()
        if name in TEXT:
            assert (p.spec.gx_bits, p.spec.gx_format, p.spec.hla_rows) == (8, "fp8", ())
            assert row["recipe"] == "text" and row["g_x"].startswith("HQ FP8"), row
            assert "HLA" not in row["g_w"], row
        else:
            assert (p.spec.gx_bits, p.spec.gx_format) == (4, "int") and p.spec.hla_rows
            assert row["recipe"] == "vision" and row["g_x"].startswith("HQ INT4"), row
            assert row["g_w"].startswith("HLA r=8 ") and "signs" not in row["g_w"], row


@pytest.mark.parametrize("recipe", ["text", "vision"])
def test_one_recipe_for_every_layer(recipe: str) -> None:
    plans = _plans({"recipe": recipe})
    assert {p.describe()["recipe"] for p in plans.values()} == {recipe}
    want = (8, "fp8") if recipe == "text" else (4, "int")
    assert {(p.spec.gx_bits, p.spec.gx_format) for p in plans.values()} == {want}
    assert all(bool(p.spec.hla_rows) == (recipe == "vision") for p in plans.values())


def test_paper_recipe_is_the_papers_settings() -> None:
    c = HotConfig(recipe="paper")
    got = (c.hla_signs, c.gw_format, c.prefer, c.gx_bits, c.hla)
    assert got == (False, "int8", "paper", 4, True)
    plans = _plans({"recipe": "paper"})
    for p in plans.values():
        assert p.spec.hla_rows and not p.spec.hla_signs and p.spec.gw_format == "int8"
        assert p.describe()["recipe"] == "paper"
    # the paper recipe fills defaults only: an explicit choice stays
    assert HotConfig(recipe="paper", prefer="memory").prefer == "memory"


def test_the_text_recipe_is_exactly_its_options() -> None:
    """The default on a text layer computes what the measured candidate computed
    (``gx_bits=8, gx_format="fp8", hla=False``; tools/accuracy.py's ``hot_fp8_gx_no_hla``):
    the same gradients, bit for bit (deterministic rounding)."""

    def grads(options: dict) -> dict[str, torch.Tensor]:
        return _step(options)[1]

    tok = {"gx_scaling": "per_token"}  # LQS would run the first step's g_x exactly
    auto = grads(tok)
    explicit = grads({**tok, "recipe": "vision", "gx_bits": 8, "gx_format": "fp8", "hla": False})
    paper = grads({**tok, "recipe": "vision"})
    for n in ("text.1.weight", "head.weight", "tok.weight"):
        assert torch.equal(auto[n], explicit[n]), n
        assert not torch.equal(auto[n], paper[n]), n  # the recipe did change the numerics
    # the image layer keeps the vision recipe (its g_x sees the text layers' g_x: compare g_w)
    assert torch.equal(auto["patch.weight"], paper["patch.weight"])


@pytest.mark.parametrize(
    "options, want",
    [
        ({"gx_bits": None}, (None, "int", ())),  # exact g_x asked for: kept, no FP8
        ({"gx_bits": 8}, (8, "int", ())),  # INT8 grid asked for: the g_x group stays
        ({"hla_rows": "sequency"}, (8, "fp8", ())),  # unrelated option: recipe applies
        ({"hla": False}, (8, "fp8", ())),
    ],
)
def test_a_recipe_never_overrides_an_option_passed(options: dict, want: tuple) -> None:
    c = HotConfig(**options).for_layer(text=True)
    assert (c.gx_bits, c.gx_format, tuple() if not c.hla else ("hla",)) == want
    assert HotConfig(**options).for_layer(text=False) == HotConfig(**options)


def test_recipe_errors_list_the_choices() -> None:
    with pytest.raises(HotConfigError, match="'auto', 'text', 'vision', 'paper'"):
        HotConfig.from_options({"recipe": "llm"})
    with pytest.raises(HotConfigError, match="did you mean 'recipe'"):
        HotConfig.from_options({"recipes": "text"})


def test_an_image_model_is_unchanged_by_the_default() -> None:
    """No embedding lookup, no text layer: ``recipe="auto"`` is the vision recipe (what
    hotcompile did before recipes existed)."""
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16))
    hotcompile.clear_plans()
    torch._dynamo.reset()
    torch.compile(model, backend="hot", options=AOT)(torch.randn(4, 16, 32)).sum().backward()
    rows = [p.describe() for p in hotcompile.plans()]
    assert len(rows) == 2 and {r["recipe"] for r in rows} == {"vision"}
    assert rows[0]["g_x"].startswith("-") and rows[1]["g_x"].startswith("HQ INT4"), rows


@pytest.mark.parametrize("signs", [True, False])
def test_text_layers_found_whatever_hla_signs_says(signs: bool) -> None:
    """The text/image test runs for ``recipe="auto"`` even when ``hla_signs`` is fixed."""
    plans = _plans({"hla_signs": signs})
    assert {n for n, p in plans.items() if p.describe()["recipe"] == "text"} == TEXT

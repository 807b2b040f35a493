"""``hotcompile.diff``: the graph-diff inspection tool (issue 3).

Each model is diffed once per module (a plain and a hot compile, about a second each on 2 CPU
cores); the tests then read the result as JSON, text, HTML, and through the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import html.parser
import io
import json
import logging
import os
import pathlib
import struct
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import MLPBlock, SmallCNN
from torch.utils.checkpoint import checkpoint

import hotcompile.graphdiff as diffmod
from hotcompile.graphdiff import add_parser, diff

CHROMIUM = "/usr/bin/chromium"


class Attention(nn.Module):
    def __init__(self, d: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, S, D))


class Block(nn.Module):
    """Pre-norm transformer block: LN -> attention, then the MLP block LN -> fc1 -> GELU -> fc2."""

    def __init__(self, d: int = 32):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d)
        self.mlp = MLPBlock(d, 2 * d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(x)


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = MLPBlock(32, 64)
        self.out = nn.Linear(32, 32)

    def forward(self, x):
        return self.out(checkpoint(self.inner, x, use_reentrant=False))


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    # abc_recompute="views": every layer's compression in the forward, saved (the default,
    # "unary", re-derives fc2's in the backward: tests/test_abc_recompute.py)
    opts = {"exclude": ("attn.proj",), "gx_scaling": "per_token", "abc_recompute": "views"}
    return diff(Block(), torch.randn(2, 16, 32), opts)


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return diff(SmallCNN(), torch.randn(2, 1, 8, 8))


def _saved(d: dict, which: str) -> dict[str, dict]:
    return {s["name"]: s for g in d["graphs"] for s in g["saved"][which]}


def test_block_layers_quantizer_and_hot_ops(block):
    d = json.loads(block.to_json())
    layers = {lay["name"]: lay for lay in d["layers"]}
    assert set(layers) == {"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"}
    for name in ("attn.qkv", "mlp.fc1", "mlp.fc2"):
        lay = layers[name]
        assert lay["path"] == "hot"
        assert lay["quantizer"] == "per_token" and "gx_scaling" in lay["quantizer_rule"]
        after, before = "\n".join(lay["bw_after"]), "\n".join(lay["bw_before"])
        assert "hotcompile.hq_grad_input(" in after and "hotcompile.hla_grad_weight(" in after
        assert "hotcompile." not in before and "aten.mm(" in before
        assert "aten.mm(" not in after  # both GEMMs of the layer's backward were replaced
        assert lay["backward_op_changes"]["aten.mm"] == -2
        assert any("hotcompile.abc_compress(" in line for line in lay["fw_after"])
        assert not lay["flagged"], lay["input_saved_reason"]
    proj = layers["attn.proj"]
    assert proj["path"] == "skipped" and proj["quantizer"] is None
    assert proj["flagged"] and "excluded by pattern 'attn.proj'" in proj["input_saved_reason"]
    assert proj["bw_before"] == proj["bw_after"] and proj["hot_ops"] == []
    assert d["summary"]["flagged"] == ["attn.proj"]


def test_block_saved_tensors_compressed(block):
    d = block.to_dict()
    before, after = _saved(d, "before"), _saved(d, "after")
    fc1 = block.layer("mlp.fc1")
    # plain saves fc1's fp32 input; hot saves an INT8 low-pass copy (half the rows) and a scale
    acts = [n for n in fc1.saved_before if before[n]["role"] == "activation"]
    (x_before,) = [n for n in acts if n not in after]  # fc1's output stays: GELU needs it
    assert before[x_before]["dtype"] == "float32" and before[x_before]["shape"] == [32, 32]
    codes = [after[n] for n in fc1.saved_after if after[n]["dtype"] == "int8"]
    assert len(codes) == 1 and codes[0]["compressed"] and codes[0]["layer"] == "mlp.fc1"
    assert codes[0]["shape"] == [16, 32] and codes[0]["bytes"] == 16 * 32
    assert not any(s["compressed"] for s in before.values())
    n_int8 = sum(s["dtype"] == "int8" and s["compressed"] for s in after.values())
    assert n_int8 == 3  # qkv, fc1, fc2; the excluded proj keeps its fp32 input
    assert block.layer("attn.proj").saved_before == block.layer("attn.proj").saved_after
    sb = d["summary"]["saved_bytes"]
    assert sb["after"]["activations"] < sb["before"]["activations"]
    assert sb["after"]["compressed"] == sum(s["bytes"] for s in after.values() if s["compressed"])
    assert sb["before"]["parameters"] > 0 and sb["before"]["compressed"] == 0


def test_normalised_forward_diff_only_adds(block):
    """The hot forward is the plain one plus compression: with normalised names, no '-' lines."""
    (g,) = block.graphs
    fwd = g.unified("forward")
    removed = [x for x in fwd if x.startswith("-") and not x.startswith("---")]
    added = [x for x in fwd if x.startswith("+") and not x.startswith("+++")]
    assert removed == []
    assert sum("hotcompile.abc_compress(" in x for x in added) == 3
    # the raw FX names *are* renumbered (view_2 -> view_3 ...), which normalisation hides
    bwd = g.unified("backward")
    assert any("hotcompile.hq_grad_input(" in x for x in bwd if x.startswith("+"))
    assert any("aten.mm(" in x for x in bwd if x.startswith("-"))


def test_cnn_conv_layers_and_flags(cnn):
    layers = {lay.name: lay for lay in cnn.layers}
    assert list(layers) == ["conv1", "conv2", "dw", "conv3", "pw", "head"]
    dw = layers["dw"]
    assert dw.path == "skipped" and dw.flagged and "groups=16" in dw.input_saved_reason
    for name in ("conv2", "pw"):
        assert "hotcompile.hq_conv_grad_input" in layers[name].hot_ops
        assert not layers[name].flagged
        assert any("abc_compress[0]" in n for n in layers[name].saved_after)
    # conv1 reads the graph input, which the partitioner may keep for free
    assert layers["conv1"].flagged and "graph input" in layers["conv1"].input_saved_reason
    # conv3's input (a ReLU output) is read by the ReLU's own backward as well
    assert layers["conv3"].flagged
    assert "another consumer" in layers["conv3"].input_saved_reason
    assert "recomputes the compression" in layers["conv3"].input_saved_reason
    assert "hotcompile.hq_grad_input" in layers["head"].hot_ops


def test_attention_output_projection_shares_its_input():
    """SDPA's backward reads its own output, which is the projection's input: still saved, and
    the compression is recomputed from it in the backward (``abc_recompute="views"``), not
    saved on top of it."""
    torch.manual_seed(0)
    d = diff(Block(), torch.randn(2, 16, 32), {"gx_scaling": "per_tensor"}, trace=False)
    proj = d.layer("attn.proj")
    assert proj.path == "hot" and proj.quantizer == "per_tensor" and proj.flagged
    assert "another consumer needs it" in proj.input_saved_reason
    assert "scaled_dot_product" in proj.input_saved_reason
    assert "recomputes the compression in the backward" in proj.input_saved_reason
    assert not any("abc_compress" in n for n in proj.saved_after)
    assert [lay.name for lay in d.flagged] == ["attn.proj"]


def test_activation_checkpointing_layers_are_hot():
    """Layers in a checkpointed region get HOT's backward; their input is recomputed, not
    saved, so the diff notes the checkpointing without flagging the layer."""
    torch.manual_seed(0)
    d = diff(Checkpointed(), torch.randn(2, 16, 32), trace=False)
    layers = {lay.name: lay for lay in d.layers}
    for name in ("inner.fc1", "inner.fc2"):
        assert layers[name].path == "hot"
        assert not layers[name].flagged
        assert "activation checkpointing" in layers[name].input_saved_reason
        assert "hotcompile.hq_grad_input" in layers[name].hot_ops
    assert layers["out"].path == "hot" and not layers["out"].flagged
    assert "ok: recomputed in the backward" in d.to_text(color=False)


def test_text_colours(block, monkeypatch):
    coloured = block.to_text(color=True)
    assert "\x1b[32m" in coloured and "\x1b[31m" in coloured
    plain = block.to_text(color=False)
    assert "\x1b[" not in plain
    assert "excluded by pattern" in plain and "mlp.fc1.abc_compress[0]" in plain
    assert "@@" in plain  # the unified diff is there
    monkeypatch.setenv("NO_COLOR", "1")

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert diffmod._want_color(None, Tty()) is False
    monkeypatch.delenv("NO_COLOR")
    assert diffmod._want_color(None, Tty()) is True
    assert diffmod._want_color(None, io.StringIO()) is False


class _Checker(html.parser.HTMLParser):
    VOID = {"meta", "br", "input", "img", "hr", "link", "col", "wbr"}

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.external: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        for k, v in attrs:
            if k in ("src", "href") and v and not v.startswith("#"):
                self.external.append(v)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]} at {self.getpos()}")
        else:
            self.stack.pop()


def test_html_well_formed_and_self_contained(block):
    page = block.to_html()
    p = _Checker()
    p.feed(page)
    p.close()
    assert p.errors == [] and p.stack == []
    assert p.external == [] and "link" not in p.tags
    assert "http://" not in page and "https://" not in page
    assert {"style", "script", "table"} <= p.tags
    assert "plain torch.compile" in page and "backend=&quot;hot&quot;" in page
    assert "mlp.fc1.abc_compress[0]" in page and "excluded by pattern" in page


def _png_size(path: pathlib.Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium is not installed")
def test_html_opens_in_headless_chromium(block, tmp_path):
    page = tmp_path / "diff.html"
    page.write_text(block.to_html(), encoding="utf-8")
    shot = tmp_path / "diff.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri()],
        capture_output=True,
        timeout=90,
        check=True,
    )
    assert _png_size(shot) == (1400, 1000)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    ).stdout
    assert "mlp.fc1" in dom and 'id="layer-filter"' in dom


def test_trace_artifact(block):
    from torch._logging._internal import trace_log

    records: list[logging.LogRecord] = []

    class Grab(logging.Handler):
        def emit(self, record):
            records.append(record)

    h = Grab()
    trace_log.addHandler(h)
    try:
        block.emit_trace_artifact()
    finally:
        trace_log.removeHandler(h)
    names = [r.metadata["artifact"]["name"] for r in records if "artifact" in r.metadata]
    assert names == ["hotcompile_graph_diff", "hotcompile_graph_diff_text"]
    assert json.loads(records[0].payload) == json.loads(block.to_json())


def _cli(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="hotcompile")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = args.func(args)
    return rc, out.getvalue()


def test_cli_json_and_html(tmp_path):
    page = tmp_path / "cnn.html"
    rc, out = _cli(
        [
            "diff",
            "hotcompile.graphdiff:example_cnn",
            "--input",
            "2x3x16x16",
            "--option",
            "exclude=('head',)",
            "--json",
            "--html",
            str(page),
        ]
    )
    assert rc == 0
    d = json.loads(out)
    assert d["inputs"] == [{"shape": [2, 3, 16, 16], "dtype": "float32"}]
    head = next(lay for lay in d["layers"] if lay["name"] == "head")
    assert head["path"] == "skipped" and "excluded by pattern 'head'" in head["reason"]
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_cli_takes_library_models_by_name(monkeypatch):
    """``hotcompile diff --hf gpt2 --hf-config n_layer=1``: the model type's default
    configuration, random weights, nothing downloaded; GPT-2's Conv1D layers are rewritten and
    their inputs saved compressed. Without a model or without an input it says what to give."""
    try:
        from hotcompile import compat

        compat.import_module("transformers")
    except ImportError:
        pytest.skip("needs transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, out = _cli(["diff", "--hf", "gpt2", "--hf-config", "n_layer=1", "--input", "2x32:int64",
                    "--json"])  # fmt: skip
    assert rc == 0
    layers = {lay["name"]: lay for lay in json.loads(out)["layers"]}
    assert set(layers) >= {"h.0.attn.c_attn", "h.0.mlp.c_fc", "h.0.mlp.c_proj"}
    assert all(layers[n]["path"] != "skipped" for n in ("h.0.mlp.c_fc", "h.0.mlp.c_proj"))
    with pytest.raises(SystemExit, match="--input"):
        _cli(["diff", "--hf", "gpt2", "--hf-config", "n_layer=1"])
    with pytest.raises(SystemExit, match="package.module:factory"):
        _cli(["diff"])


def test_cli_text_and_help(capsys):
    rc, out = _cli(["diff", "hotcompile.graphdiff:example_block", "--no-color", "--summary"])
    assert rc == 0 and "\x1b[" not in out
    assert "attn.qkv" in out and "Saved tensors" in out and "unified diff" not in out
    parser = argparse.ArgumentParser(prog="hotcompile")
    add_parser(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit):
        parser.parse_args(["diff", "--help"])
    helptext = capsys.readouterr().out
    assert (
        "examples:" in helptext and "--input" in helptext and "package.module:factory" in helptext
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["diff", "x:y", "--input", "2xthree"])
    assert diffmod.parse_input_spec("4x8:int64").dtype == torch.int64


def test_factory_without_inputs_is_an_error():
    with pytest.raises(SystemExit, match="--input"):
        diffmod.load_model("hotcompile.graphdiff:example_cnn", [])

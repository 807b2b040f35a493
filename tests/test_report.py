"""The static cost report: formulas against the method page, totals against the paper.

Models are built on the meta device (no memory, no compute). ViT-B/16 and ResNet-50 are
written out here the way timm/torchvision build them (timm is not a dependency) with 100
classes, as the official analysis (``gbops_calculation.py``) instantiates them.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import AOT, MLPBlock, SmallCNN

import hotcompile
from hotcompile import compat, cost
from hotcompile.config import HotConfig
from hotcompile.report import add_parser, report

# --------------------------------------------------------------------------- models


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, 16, stride=16)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class ViT(nn.Module):
    """timm ``vit_base_patch16_224`` (class token, token pooling), ``num_classes`` head."""

    def __init__(self, dim=768, depth=12, heads=12, classes=100, img=224):
        super().__init__()
        self.patch_embed = PatchEmbed(dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (img // 16) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or cin != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    """torchvision ``resnet50`` (v1.5: stride in the 3x3 conv), ``classes`` outputs."""

    def __init__(self, classes: int = 100):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        cin, stages = 64, []
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layers = [Bottleneck(cin, planes, stride)]
            cin = planes * 4
            layers += [Bottleneck(cin, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class LlamaLayer(nn.Module):
    def __init__(self, dim: int, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.input_layernorm = RMSNorm(dim)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(dim, dim, bias=False) for _ in range(4)
        )
        self.post_attention_layernorm = RMSNorm(dim)
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        B, S, D = x.shape
        h = self.input_layernorm(x)
        q, k, v = (
            p(h).view(B, S, self.heads, D // self.heads).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, S, D))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    """A Llama-2-7B-shaped decoder (32 layers, d=4096, SwiGLU 11008, vocab 32000)."""

    def __init__(self, dim=4096, hidden=11008, heads=32, depth=32, vocab=32000):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LlamaLayer(dim, hidden, heads) for _ in range(depth))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def meta(cls, *args, **kwargs) -> nn.Module:
    with torch.device("meta"):
        return cls(*args, **kwargs)


def vit_b16():
    """CLI factory: ``hotcompile report test_report:vit_b16`` (tests/ on PYTHONPATH)."""
    return ViT(), torch.empty(1, 3, 224, 224)


def resnet50():
    """CLI factory, like :func:`vit_b16`."""
    return ResNet50(), torch.empty(1, 3, 224, 224)


def llama_7b():
    """CLI factory, like :func:`vit_b16`: one sequence of 2048 tokens."""
    return Llama(), torch.empty(1, 2048, dtype=torch.long)


#: the paper's counting: HLA also on one-row-per-sample inputs (the official code blocks
#: across the batch) and the code's I·(r/n)·O term, at batch 1.
OFFICIAL = {"config": HotConfig(hla_2d="batch"), "bops_variant": "code", "saved": False}


@pytest.fixture(scope="module")
def vit_report():
    return report(meta(ViT), torch.empty(1, 3, 224, 224), **OFFICIAL)


@pytest.fixture(scope="module")
def resnet_report():
    return report(meta(ResNet50), torch.empty(1, 3, 224, 224), **OFFICIAL)


def by_name(rep) -> dict:
    return {lay["name"]: lay for lay in rep.to_json()["layers"]}


# --------------------------------------------------------------------------- per layer

# (L, O, I), vanilla MFLOP, overhead MFLOP, overhead % — the test table of hot-method.md
TABLE = {
    "EfficientFormer-L1 stages.3 fc2": ((49, 448, 1792), "157.35", "11.017", "7.00"),
    "layer1.0.conv2": ((3136, 64, 576), "462.42", "24.125", "5.22"),
    "layer4.0.conv2": ((49, 512, 4608), "462.42", "31.272", "6.76"),
    "blocks.0.attn.qkv": ((197, 2304, 768), "1394.34", "31.522", "2.26"),
    "blocks.0.attn.proj": ((197, 768, 768), "464.78", "11.617", "2.50"),
    "blocks.0.mlp.fc1": ((197, 3072, 768), "1859.13", "41.474", "2.23"),
    "blocks.0.mlp.fc2": ((197, 768, 3072), "1859.13", "37.843", "2.04"),
}


def _printed(lay: dict) -> tuple[str, str, str]:
    f = lay["flops"]
    return (
        f"{f['vanilla_backward'] / 1e6:.2f}",
        f"{f['hot_overhead'] / 1e6:.3f}",
        f"{f['hot_overhead_pct']:.2f}",
    )


def test_table_rows_from_the_formulas():
    """Every row of the method page's table, straight from the sympy formulas."""
    f = cost.formulas(cost.PathCosts("hot"))
    for (L, O, I), *printed in TABLE.values():
        v = {cost.L: L, cost.O: O, cost.I: I, cost.n: 16, cost.r: 8}
        van = cost.to_number(cost.evaluate(f.vanilla_backward_flops, v))
        ovh = cost.to_number(cost.evaluate(f.hot_overhead_flops, v))
        assert (f"{van / 1e6:.2f}", f"{ovh / 1e6:.3f}", f"{100 * ovh / van:.2f}") == tuple(printed)


def test_table_rows_from_traced_models(vit_report, resnet_report):
    """The same rows, with L, O, I read off the traced ViT-B and ResNet-50."""
    layers = {**by_name(vit_report), **by_name(resnet_report)}
    for name, ((L, O, I), *printed) in TABLE.items():
        if name.startswith("EfficientFormer"):
            continue
        lay = layers[name]
        assert (lay["L"], lay["O"], lay["I"]) == (L, O, I), name
        assert lay["path"] == "hot" and lay["kind"] in ("linear", "conv2d")
        assert _printed(lay) == tuple(printed), name


# --------------------------------------------------------------------------- totals


def test_vit_b16_gbops_totals(vit_report):
    t = vit_report.to_json()["totals"]["bops"]
    assert len(vit_report.layers) == 1 + 12 * 4 + 1
    assert f"{t['fp_train'] / 1e9:.2f}" == "51756.47"
    assert f"{t['hot_train'] / 1e9:.2f}" == "18856.88"


def test_resnet50_gbops_totals(resnet_report):
    t = resnet_report.to_json()["totals"]["bops"]
    assert len(resnet_report.layers) == 1 + 16 * 3 + 4 + 1  # stem, bottlenecks, downsample, fc
    assert f"{t['fp_train'] / 1e9:.2f}" == "12556.31"
    assert f"{t['hot_train'] / 1e9:.2f}" == "4758.92"


def test_table5_variant_and_plan_aware_head_differ(vit_report):
    """Table 5's I·(r/n)·L and the default plan (no HLA on the 2-D head) change the total."""
    rep = report(meta(ViT), torch.empty(1, 3, 224, 224), saved=False)
    head = by_name(rep)["head"]
    assert head["hla"] == {"n": 16, "r": 16} and head["path"] == "hot"
    assert by_name(vit_report)["head"]["hla"]["r"] == 8
    hot = rep.to_json()["totals"]["bops"]["hot_train"] / 1e9
    assert f"{hot:.2f}" != "18856.88"
    assert abs(hot - 18856.88) < 40  # Table 5's term is much smaller than the code's


def test_vit_b_paper_memory_batch_256():
    rep = report(meta(ViT), torch.empty(256, 3, 224, 224), saved=False, official_qkv=True).to_json()
    pm = rep["paper_memory"]
    assert (f"{pm['fp_total_gib']:.2f}", f"{pm['hot_total_gib']:.2f}") == ("33.22", "5.83")
    assert rep["totals"]["memory"]["paper_fp_bytes"] == pm["fp_activation_bytes"]
    assert 7.9 < pm["fp_activation_bytes"] / pm["hot_activation_bytes"] <= 8


def test_llama_7b_sized_model_in_seconds():
    t0 = time.perf_counter()
    model = meta(Llama)
    rep = report(model, torch.empty(1, 2048, dtype=torch.long), saved=False)
    elapsed = time.perf_counter() - t0
    assert elapsed < 30, elapsed
    params = sum(p.numel() for p in model.parameters())
    assert 6.5e9 < params < 7.0e9
    j = rep.to_json()
    assert len(j["layers"]) == 32 * 7 + 1
    down = by_name(rep)["layers.31.down_proj"]
    assert (down["L"], down["O"], down["I"]) == (2048, 4096, 11008)
    # 2 GEMMs x 2 FLOPs per MAC per weight element and token, over all linear layers
    linear_params = params - 32000 * 4096 - 4096 * 65
    assert j["totals"]["flops"]["vanilla_backward"] == 4 * 2048 * linear_params


# --------------------------------------------------------------------------- plans, saved bytes


class Frozen(nn.Module):
    """A frozen base layer (LoRA-like), an excluded layer and a conv1d the pass skips."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(32, 32)
        self.base = nn.Linear(32, 32).requires_grad_(False)
        self.conv = nn.Conv1d(32, 32, 3, padding=1)
        self.head = nn.Linear(32, 16)

    def forward(self, x):
        x = self.conv(self.base(self.pre(x)).transpose(1, 2)).transpose(1, 2)
        return self.head(x)


def test_paths_follow_the_rewrite_pass():
    rep = report(Frozen(), torch.randn(2, 16, 32), {"exclude": ("head",)})
    layers = by_name(rep)
    assert [lay["path"] for lay in layers.values()] == ["hot", "gx_only", "skipped", "skipped"]
    assert "conv1d" in layers["conv"]["reason"] and layers["conv"]["kind"] == "conv1d"
    assert "excluded" in layers["head"]["reason"]
    base = layers["base"]
    # frozen weight: only the g_x GEMM, nothing saved for g_w, in both counts
    assert base["flops"]["vanilla_backward"] == 2 * 32 * 32 * 32
    assert base["memory"] == {"paper_fp_bytes": 0, "paper_hot_bytes": 0}
    assert base["bits"] == {"gx": 4, "gw": None} and base["quantizer"] is not None
    for name in ("conv", "head"):  # autograd's backward: HOT costs what FP costs
        lay = layers[name]
        assert lay["flops"]["hot_overhead"] == 0 and lay["quantizer"] is None
        assert lay["bops"]["hot_backward"] == lay["bops"]["fp_backward"] > 0
        assert lay["memory"]["paper_hot_bytes"] == lay["memory"]["paper_fp_bytes"] > 0
    assert (layers["conv"]["L"], layers["conv"]["O"], layers["conv"]["I"]) == (32, 32, 96)


def test_bits_and_options_change_the_costs():
    x = torch.randn(2, 32, 64)
    base = report(MLPBlock(), x).to_json()["layers"][0]
    int8 = report(MLPBlock(), x, {"gx_bits": 8, "hla": False}).to_json()["layers"][0]
    assert int8["bits"] == {"gx": 8, "gw": 8} and int8["hla"]["r"] == 16
    L, O, I = 64, 256, 64
    gemms = L * O * I * (8 * 8) * 2
    assert int8["bops"]["hot_backward"] - gemms == 1024 * (
        L * O * 4 + I * O * 4 + L * O + I * O + L * I + (O + I) * L + I * O
    )
    assert int8["memory"]["paper_hot_bytes"] == L * O == 2 * base["memory"]["paper_hot_bytes"]


@pytest.mark.parametrize("model, x", [
    (MLPBlock(), torch.randn(4, 32, 64)),
    (SmallCNN(), torch.randn(4, 1, 16, 16)),
    (nn.Sequential(nn.Conv2d(3, 16, 3), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(784, 10)),
     torch.randn(2, 3, 16, 16)),
])  # fmt: skip
def test_static_saved_bytes_equal_the_runtime_measurement(model, x):
    """The fake-tensor partition predicts exactly what the compiled graphs save at run time."""
    rep = report(model, x, saved=True)
    assert rep.saved.error is None and 0 < rep.saved.hot < rep.saved.baseline
    measured = {}
    for variant, kw in (("baseline", {"backend": "aot_eager_decomp_partition"}),
                        ("hot", {"backend": "hot", "options": AOT})):  # fmt: skip
        torch._dynamo.reset()
        m = copy.deepcopy(model)
        y = torch.compile(m, **kw)(x)
        measured[variant] = hotcompile.saved_activation_bytes(y, m)
    assert measured == {"baseline": rep.saved.baseline, "hot": rep.saved.hot}
    saved = rep.to_json(saved_tensors=True)["saved"]
    assert sum(t["bytes"] for t in saved["hot_tensors"]) == rep.saved.hot


def test_no_real_compute_and_model_untouched():
    model = MLPBlock()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    devices = []
    model.register_forward_pre_hook(lambda m, args: devices.append(args[0].device.type))
    rep = report(model, torch.randn(3, 32, 64), saved=True)
    assert set(devices) == {"meta"} and rep.layers
    assert all(p.device.type == "cpu" and p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert hotcompile.plans() == []  # the report does not pollute the backend's records


def test_dynamic_batch_gives_symbolic_L():
    rep = report(MLPBlock(), torch.randn(4, 32, 64), dynamic=True, saved=True)
    j = rep.to_json(formulas=True)
    fc1 = j["layers"][0]
    assert fc1["L"] == "32*B" and fc1["L_value"] == 128
    assert fc1["formulas_in_batch"]["vanilla_backward_flops"] == str(4 * 32 * 256 * 64) + "*B"
    assert j["totals_in_batch"]["paper_fp_bytes"] == str(4 * 32 * (256 + 64)) + "*B"
    static = report(MLPBlock(), torch.randn(4, 32, 64), saved=True)
    assert j["totals"] == static.to_json()["totals"]
    assert rep.saved.hot == static.saved.hot and rep.saved.baseline == static.saved.baseline
    with pytest.raises(ValueError, match="at least 2"):
        report(MLPBlock(), torch.randn(1, 32, 64), dynamic=True)


# --------------------------------------------------------------------------- outputs, CLI


def test_json_csv_table_plot(tmp_path, vit_report):
    j = vit_report.to_json(formulas=True)
    json.dumps(j)
    for key in ("name", "L", "O", "I"):
        assert key in j["layers"][0]
    for group, keys in (("flops", ("vanilla_backward", "hot_overhead")),
                        ("bops", ("fp_backward", "hot_backward")),
                        ("memory", ("paper_fp_bytes", "paper_hot_bytes"))):  # fmt: skip
        for key in keys:
            assert j["totals"][group][key] == sum(lay[group][key] for lay in j["layers"])
    assert "log2(n)" in j["layers"][1]["formulas"]["hot_overhead_flops"]
    rows = vit_report.to_csv().splitlines()
    assert len(rows) == 1 + 50 + 1 and rows[-1].startswith("TOTAL")
    assert "flops.vanilla_backward" in rows[0].split(",")
    table = vit_report.table(formulas=True)
    assert "blocks.11.mlp.fc2" in table and "TOTAL" in table and "hot_backward_bops =" in table
    png = vit_report.plot(str(tmp_path / "vit.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hotcompile")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli(capsys, tmp_path):
    args = _cli(["report", "test_report:resnet50", "--json", "--plot", str(tmp_path / "r.png"),
                 "--option", "hla_2d='batch'", "--bops-variant", "code"])  # fmt: skip
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert f"{out['totals']['bops']['hot_train'] / 1e9:.2f}" == "4758.92"
    assert (tmp_path / "r.png").stat().st_size > 0
    args = _cli(["report", "conftest:MLPBlock", "--input", "2x16x64", "--csv"])
    args.func(args)
    assert capsys.readouterr().out.splitlines()[1].startswith("fc1,linear")
    args = _cli(["report", "conftest:MLPBlock", "--input", "4x16x64", "--formulas", "--saved",
                 "--dynamic"])  # fmt: skip
    args.func(args)
    out = capsys.readouterr().out
    assert "16*B" in out and "vanilla_backward_flops = 4*I*L*O" in out and "plain" in out
    ids = _cli(["report", "x:y", "--input", "1x512:int64"]).input[0]
    assert ids.dtype == torch.int64 and ids.shape == (1, 512) and ids.device.type == "meta"
    with pytest.raises(SystemExit):
        _cli(["report", "x:y", "--input", "1xQ"])


def test_cli_help_teaches(capsys):
    with pytest.raises(SystemExit):
        _cli(["report", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "--input" in out and "--timm" in out and "--formulas" in out


def test_cli_guards_missing_libraries():
    pytest.importorskip("torch")
    for flag, lib in (("--timm", "timm"), ("--hf", "transformers")):
        try:  # as the CLI imports it (a CUDA torchvision next to a CPU torch is mended)
            compat.import_module(lib)
        except ImportError:
            args = _cli(["report", flag, "some-model", "--input", "1x3x224x224"])
            with pytest.raises(SystemExit, match=lib):
                args.func(args)


def test_cli_builds_hugging_face_models_without_downloads(capsys, tmp_path, monkeypatch):
    """``--hf`` takes a model type (its default configuration: nothing downloaded), sized with
    ``--hf-config``, or a local directory holding a config.json; a name that is neither and
    cannot be fetched exits saying what to pass. The KV cache is off (a training step)."""
    try:
        transformers = compat.import_module("transformers")
    except ImportError:
        pytest.skip("needs transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = _cli(["report", "--hf", "gpt2", "--hf-config", "n_layer=1", "--input", "1x64:int64"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    names = [ln.split()[0] for ln in out.splitlines() if ln.startswith("h.")]
    assert names == ["h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc", "h.0.mlp.c_proj"]
    assert "(addmm)" in out  # GPT-2's Conv1D layers

    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, vocab_size=100,
    )  # fmt: skip
    cfg.save_pretrained(tmp_path)
    args = _cli(["report", "--hf", str(tmp_path), "--input", "1x16:int64", "--json"])
    assert args.func(args) == 0
    layers = {r["name"]: r for r in json.loads(capsys.readouterr().out)["layers"]}
    assert len(layers) == 14 and layers["layers.1.mlp.down_proj"]["I"] == 128

    args = _cli(["report", "--hf", str(tmp_path / "nothing-here"), "--input", "1x16:int64"])
    with pytest.raises(SystemExit, match="local directory holding its config.json"):
        args.func(args)
    with pytest.raises(SystemExit):
        _cli(["report", "--hf", "gpt2", "--hf-config", "n_layer"])


def test_cli_builds_timm_models_by_name(capsys):
    """``--timm NAME``: the model with random weights (nothing downloaded), every linear in the
    plan."""
    try:
        compat.import_module("timm")
    except ImportError:
        pytest.skip("needs timm")
    args = _cli(["report", "--timm", "vit_tiny_patch16_224", "--input", "1x3x224x224", "--json"])
    assert args.func(args) == 0
    layers = [r["name"] for r in json.loads(capsys.readouterr().out)["layers"]]
    assert "blocks.11.mlp.fc2" in layers and "head" in layers and len(layers) == 12 * 4 + 2


def test_hf_config_keeps_derived_fields_with_their_sources():
    """``--hf llama --hf-config num_attention_heads=16`` (docs/report.md's example): the KV heads
    and the head dim the config class derived from the defaults follow the new sizes (they
    stayed 32 / 128 and SDPA failed); a field the user sets is kept as given."""
    pytest.importorskip("transformers")
    from hotcompile import compat
    from hotcompile.cliargs import hf_config

    tf = compat.import_module("transformers")
    cfg = hf_config(tf, "llama", [{"hidden_size": 1024, "num_attention_heads": 16}])
    assert (cfg.num_key_value_heads, cfg.head_dim) == (16, 64)
    cfg = hf_config(tf, "llama", [{"num_attention_heads": 16, "num_key_value_heads": 4}])
    assert cfg.num_key_value_heads == 4
    assert hf_config(tf, "llama", [{"num_hidden_layers": 2}]).num_key_value_heads == 32

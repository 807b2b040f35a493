"""The scaled-up GPU LM of ``tools/accuracy.py --gpu-lm`` (issue 5), exercised on the CPU.

The real run needs an H200 and minutes; these tests keep its code path honest on every CPU
test run: a tiny configuration trains bf16 and HOT end to end through the same function the
GPU run uses, the result set has the schema the README and later tooling read, losses are
finite, both variants start from the same weights, and a later invocation merges into (rather
than overwrites) the result set, which is how extra variants or seeds are added within the
device's per-command time limit.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib

import pytest
import torch
from conftest import load_tool

import hotcompile.config

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_accuracy():
    return load_tool("accuracy.py")


acc = _load_accuracy()


def _tiny() -> acc.GpuLMSettings:
    """Smaller still than ``--quick``: a few seconds for two variants on 2 CPU cores."""
    s = acc.gpu_lm_quick_settings()
    s.steps, s.eval_every, s.warmup = 4, 2, 1
    return s


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[pathlib.Path, list, acc.GpuLMSettings]:
    out = tmp_path_factory.mktemp("gpu_lm")
    s = _tiny()
    results, skipped = acc.run_gpu_lm(
        ["bf16", "hot"], [0], s, torch.device("cpu"), out, progress=False, fresh=True
    )
    assert skipped == []
    return out, results, s


def test_quick_gpu_lm_writes_the_result_set(quick_run):
    out, results, s = quick_run
    doc = json.loads((out / "accuracy_gpu_lm.json").read_text())
    env = doc["environment"]
    assert {"device", "torch", "date", "python", "settings", "compiler"} <= env.keys()
    assert env["torch"] == torch.__version__ and env["settings"]["tokens"] == s.tokens
    rows = {r["variant"]: r for r in doc["rows"]}
    assert list(rows) == ["bf16", "hot"]
    for r in rows.values():
        assert r["task"] == "lm_gpu" and r["metric"] == "val_loss" and r["seeds"] == [0]
        assert math.isfinite(r["mean"]) and 0 < r["mean"] < 6.0 and r["std"] == 0.0
        assert r["params"] > 0 and r["tokens"] == s.steps * s.batch * s.ctx
        assert r["wall_s"] > 0 and "delta_vs_ref" in r
    assert rows["bf16"]["delta_vs_ref"] == 0.0
    assert [t["target"] for t in doc["targets"]] == [
        "lm_gpu: hot validation loss within 2% of bf16"
    ]
    runs = {r["variant"]: r for r in doc["runs"]}
    for r in runs.values():
        assert r["extra"]["val_steps"] == [0, 2, 4] and len(r["curve"]) == 3
        assert all(math.isfinite(v) for v in r["curve"] + r["extra"]["train_curve"])
    # same seed: same initial weights on both sides, and HOT leaves the forward untouched
    assert runs["hot"]["curve"][0] == pytest.approx(runs["bf16"]["curve"][0])
    assert "plan" in runs["hot"]["extra"] and "plan" not in runs["bf16"]["extra"]
    md = (out / "accuracy_gpu_lm.md").read_text()
    assert "| variant | val_loss mean ± std | Δ vs bf16 |" in md and "| hot | " in md
    assert env["device"] in md and env["torch"] in md and env["date"] in md
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "accuracy_gpu_lm_curves.png").stat().st_size > 0


def test_later_runs_merge_only_when_sizes_match(quick_run):
    out, results, s = quick_run
    env = acc.gpu_lm_environment(s, torch.device("cpu"), "aot_eager")
    previous = acc.load_previous_gpu_lm(out / "accuracy_gpu_lm.json", env)
    assert sorted((r.variant, r.seed) for r in previous) == [("bf16", 0), ("hot", 0)]
    other = _tiny()
    other.steps = 5
    env_other = acc.gpu_lm_environment(other, torch.device("cpu"), "aot_eager")
    assert acc.load_previous_gpu_lm(out / "accuracy_gpu_lm.json", env_other) == []
    # a re-summary of the merged runs gives the same rows as the file
    doc = json.loads((out / "accuracy_gpu_lm.json").read_text())
    assert [r["mean"] for r in acc.summarize_gpu_lm(previous)] == [r["mean"] for r in doc["rows"]]


def test_default_size_budget_and_cli():
    s = acc.GpuLMSettings()
    with torch.device("meta"):
        params = sum(p.numel() for p in acc.ByteLM(s.dim, s.depth, s.heads, s.ctx).parameters())
    assert 25e6 <= params <= 40e6, params  # issue 5: a ~20-50 M decoder
    assert s.tokens == s.steps * s.batch * s.ctx and 5e6 <= s.tokens <= 2e7
    # warm-up rises linearly to the peak, cosine ends at min_lr_ratio
    assert acc.lr_factor(0, s) == pytest.approx(1 / s.warmup)
    assert acc.lr_factor(s.warmup, s) == pytest.approx(1.0)
    assert acc.lr_factor(s.steps, s) == pytest.approx(s.min_lr_ratio)
    args = acc.build_parser().parse_args(["--gpu-lm", "--variants", "hot", "--out", "/x"])
    assert args.gpu_lm and args.variants == ["hot"] and args.deadline == 360.0
    text = acc.build_parser().format_help()
    assert "--gpu-lm" in text and "accuracy_gpu_lm" in text and "hot_exact_gw" in text


def test_gpu_lm_hot_plan_records_its_decisions(tmp_path):
    """``--gpu-lm --variants hot_plan``: the pilot runs on the LM's device and the run keeps
    the plan's per-layer decisions (HLA kept or not, e_hla, quantizer)."""
    results, _ = acc.run_gpu_lm(
        ["hot_plan"], [0], _tiny(), torch.device("cpu"), tmp_path, progress=False, fresh=True
    )
    (r,) = results
    decided = r.extra["plan_decisions"]
    assert {"blocks.0.qkv", "head"} <= set(decided)
    assert all(isinstance(d["hla"], bool) and d["e_hla"] is not None for d in decided.values())


def test_gpu_lm_strict_plan_uses_its_threshold(tmp_path):
    """``hot_plan_strict`` calibrates with its own ``hla_threshold`` (0.2): every layer keeps HLA
    exactly when its measured e_hla is at most that, not the default 0.6."""
    threshold = acc.GPU_LM_VARIANTS["hot_plan_strict"]["hla_threshold"]
    assert threshold < hotcompile.config.HotConfig().hla_threshold
    results, _ = acc.run_gpu_lm(
        ["hot_plan_strict"], [0], _tiny(), torch.device("cpu"), tmp_path, progress=False, fresh=True
    )
    (r,) = results
    decided = r.extra["plan_decisions"]
    assert decided and all(d["hla"] == (d["e_hla"] <= threshold) for d in decided.values())


def _transformers_ok() -> bool:
    try:
        acc.build_gpu_lm(acc.gpu_lm_llama_settings(quick=True))
    except ImportError:
        return False
    return True


def test_llama_settings_are_issue_16s_run():
    """``--arch llama``: a ~125 M HF Llama for >= 1,500 steps, its own result folder, and the
    peer (torchao float8) among its default variants."""
    s = acc.gpu_lm_llama_settings()
    assert s.arch == "llama" and s.steps >= 1500
    # the linears of the decoder (embedding and head are 2 x 256 x dim more)
    per_layer = 4 * s.dim * s.dim + 3 * s.dim * s.mlp
    assert 110e6 <= s.depth * per_layer <= 140e6
    assert acc.GPU_LM_DEFAULT_BY_ARCH["llama"] == ("bf16", "hot", "torchao_fp8")
    args = acc.build_parser().parse_args(["--gpu-lm", "--arch", "llama"])
    assert args.arch == "llama"
    with pytest.raises(ValueError, match="unknown GPU-LM arch"):
        acc.build_gpu_lm(acc.GpuLMSettings(arch="gpt"))


@pytest.mark.skipif(not _transformers_ok(), reason="transformers not importable")
def test_llama_arch_trains_with_the_text_recipe(tmp_path):
    """The quick Llama trains bf16 and HOT from the same weights; HOT takes every linear with
    the text recipe (the layers are fed by the token embedding), and the table names the
    model."""
    s = acc.gpu_lm_llama_settings(quick=True)
    s.steps, s.eval_every, s.warmup = 4, 2, 1
    results, skipped = acc.run_gpu_lm(
        ["bf16", "hot"], [0], s, torch.device("cpu"), tmp_path, progress=False, fresh=True
    )
    assert skipped == []
    runs = {r.variant: r for r in results}
    assert runs["hot"].curve[0] == pytest.approx(runs["bf16"].curve[0])
    assert all(math.isfinite(v) for r in results for v in r.curve)
    plan = {p["layer"]: p for p in runs["hot"].extra["plan"]}
    kinds = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert all(any(k in name for name in plan) for k in kinds), sorted(plan)
    assert all(p["path"] == "hot" and p["recipe"] == "text" for p in plan.values()), plan
    md = (tmp_path / "accuracy_gpu_lm.md").read_text()
    assert "LlamaForCausalLM" in md and "~125M Llama" in md


def test_torchao_variants_skip_without_torchao(tmp_path, monkeypatch):
    """Without torchao the peer rows are skipped and the table says why; a HOT row is then
    not judged against a missing peer."""
    real = acc.importlib.util.find_spec
    monkeypatch.setattr(
        acc.importlib.util, "find_spec", lambda n, *a: None if n == "torchao" else real(n, *a)
    )
    results, skipped = acc.run_gpu_lm(
        ["bf16", "torchao_fp8"], [0], _tiny(), torch.device("cpu"), tmp_path, progress=False,
        fresh=True,
    )  # fmt: skip
    assert [r.variant for r in results] == ["bf16"]
    assert skipped == ["torchao_fp8/seed 0 (torchao not installed)"]
    md = (tmp_path / "accuracy_gpu_lm.md").read_text()
    assert "torchao_fp8/seed 0 (torchao not installed)" in md


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
def test_torchao_variants_convert_the_block_linears(tmp_path):
    """With torchao (emulated FP8 on a CPU): every block linear converted, the head not, and
    the table holds the peer comparison for HOT."""
    results, _ = acc.run_gpu_lm(
        ["bf16", "hot", "torchao_fp8_rowwise"], [0], _tiny(), torch.device("cpu"), tmp_path,
        progress=False, fresh=True,
    )  # fmt: skip
    f8 = {r.variant: r for r in results}["torchao_fp8_rowwise"].extra["float8"]
    assert f8["n_converted"] == 4 * _tiny().depth and "head" in f8["not_converted"]
    assert "rowwise" in f8["recipe"]
    doc = json.loads((tmp_path / "accuracy_gpu_lm.json").read_text())
    assert "lm_gpu: hot's gap to bf16 no larger than torchao_fp8_rowwise's" in [
        t["target"] for t in doc["targets"]
    ]


def test_fp8_forward_is_judged_against_torchao_with_issue_34s_slack():
    """The FP8 forward's accuracy target (issue 34): its gap to bf16 may exceed torchao
    float8's by at most 0.3 (relative %); HOT's own (issue 16) by nothing."""
    rows = [{"variant": "bf16", "delta_vs_ref": 0.0}]
    rows += [{"variant": v, "delta_vs_ref": d} for v, d in
             (("hot", 0.2), ("hot_fp8", 0.45), ("torchao_fp8", 0.1))]  # fmt: skip
    got = {t["target"]: t for t in acc.gpu_lm_targets(rows)}
    fp8 = got["lm_gpu: hot_fp8's gap to bf16 no larger than torchao_fp8's + 0.3"]
    hot = got["lm_gpu: hot's gap to bf16 no larger than torchao_fp8's"]
    assert not fp8["met"] and fp8["miss_by"] == pytest.approx(0.05)
    assert not hot["met"] and hot["miss_by"] == pytest.approx(0.1)
    rows[2]["delta_vs_ref"] = 0.4
    got = {t["target"]: t for t in acc.gpu_lm_targets(rows)}
    assert got["lm_gpu: hot_fp8's gap to bf16 no larger than torchao_fp8's + 0.3"]["met"]

"""Fast guards for the accuracy experiment (``tools/accuracy.py``).

The full experiment takes ~35 minutes; this file keeps its two promises cheap to check on
every CPU test run: HOT still *trains* a transformer LM about as well as FP32 on real text
(a regression in any backward path shows up as a worse loss after a few dozen steps), and the
script's command line, job plan and report logic hold together.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from conftest import load_tool

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_accuracy():
    return load_tool("accuracy.py")


acc = _load_accuracy()


def _train_tiny_lm(variant: str, text, val, steps: int = 40) -> tuple[float, float]:
    """Initial and final validation loss of a tiny byte LM trained ``steps`` steps."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = acc.ByteLM(dim=32, depth=1, heads=2, ctx=32)
    initial = acc.lm_val_loss(model, val)
    compiled, _ = acc.compile_variant(model, variant, acc.VARIANTS[variant])
    gen = torch.Generator().manual_seed(0)
    acc._fit(model, compiled, variant, acc.batches(text, 32, 8, gen), steps, 5e-3,
             acc._lm_loss, 10, lambda n: None)  # fmt: skip
    return initial, acc.lm_val_loss(model, val)


@pytest.mark.slow
def test_hot_lm_converges_like_fp32():
    torch.set_flush_denormal(True)
    text = acc.load_text("lib", "train", max_bytes=200_000)
    val = acc.val_windows(acc.load_text("lib", "val", max_bytes=100_000), 32, 64)
    init_fp32, fp32 = _train_tiny_lm("fp32", text, val)
    init_hot, hot = _train_tiny_lm("hot", text, val)
    print(f"tiny LM val loss: init {init_fp32:.3f}, FP32 {fp32:.3f}, HOT {hot:.3f}")
    assert init_hot == pytest.approx(init_fp32)  # same weights: the forward is untouched
    # both learn: from ~ln(256) = 5.5 nats/byte to well below
    assert fp32 < init_fp32 - 1.0, (init_fp32, fp32)
    assert hot < init_hot - 1.0, (init_hot, hot)
    # and HOT's backward costs at most a few percent of loss at this scale
    assert hot <= 1.03 * fp32, f"HOT val loss {hot:.4f} vs FP32 {fp32:.4f}"


def test_stdlib_split_is_deterministic_and_disjoint():
    files = acc.stdlib_files()
    assert files == sorted(files) and len(files) > 100
    rels = [r for r, _ in files]
    assert all("site-packages" not in r for r in rels)
    splits = {r: acc.file_split(r) for r in rels}
    assert splits == {r: acc.file_split(r) for r in rels}
    n_val = sum(s == "val" for s in splits.values())
    assert 0.05 < n_val / len(rels) < 0.15
    assert {acc.file_domain(r) for r in rels} == {"lib", "tests"}


def test_quick_cli_parsing_and_job_plan():
    args = acc.build_parser().parse_args(["--quick", "--tasks", "lm", "lora"])
    s = acc.settings_from_args(args)
    assert s.lm_steps < acc.Settings().lm_steps and args.out is None
    full = acc.settings_from_args(acc.build_parser().parse_args(["--lm-steps", "7"]))
    assert full.lm_steps == 7 and full.vit_epochs == acc.Settings().vit_epochs
    jobs = acc.plan_jobs(["lm", "lora"], [0, 1])
    assert jobs[:2] == [("lm", "fp32", 0), ("lm", "fp32", 1)]  # they unlock the LoRA runs
    assert len(jobs) == 2 * len(acc.VARIANTS) and not any(t == "lora" for t, _, _ in jobs)
    assert acc.plan_jobs(["lora"], [0]) == [("lm", "fp32", 0)]
    help_text = acc.build_parser().format_help()
    assert "examples:" in help_text and "naive_int4" in help_text and "--quick" in help_text


def _run(task: str, variant: str, seed: int, value: float):
    return acc.RunOutput(task, variant, seed, acc.METRIC[task], value, [1.0, 0.5], 0.0, 2)


def test_summary_and_targets_follow_the_numbers():
    runs = [
        *(_run("cnn", "fp32", s, v) for s, v in enumerate([0.99, 0.98, 0.99])),
        *(_run("cnn", "hot", s, v) for s, v in enumerate([0.97, 0.97, 0.96])),
        *(_run("cnn", "naive_int4", s, v) for s, v in enumerate([0.90, 0.91, 0.89])),
        *(_run("lm", "fp32", s, v) for s, v in enumerate([2.00, 2.02])),
        *(_run("lm", "hot", s, v) for s, v in enumerate([2.01, 2.03])),
        *(_run("lm", "hot_plan", s, v) for s, v in enumerate([2.10, 2.12])),
    ]
    rows = acc.summarize(runs)
    assert [(r["task"], r["variant"]) for r in rows] == [
        ("cnn", "fp32"), ("cnn", "hot"), ("cnn", "naive_int4"), ("lm", "fp32"), ("lm", "hot"),
        ("lm", "hot_plan"),
    ]  # fmt: skip
    hot = rows[1]
    assert hot["mean"] == pytest.approx(0.9667, abs=1e-4) and hot["seeds"] == [0, 1, 2]
    assert hot["delta_vs_ref"] == pytest.approx(-2.0)  # accuracy points
    targets = acc.evaluate_targets(rows)
    cnn = next(t for t in targets if t["target"].startswith("cnn: HOT"))
    assert not cnn["met"] and cnn["miss_by"] == pytest.approx(1.5)
    assert next(t for t in targets if t["target"].startswith("lm: HOT"))["met"]
    assert next(t for t in targets if "naive" in t["target"])["met"]
    plan = next(t for t in targets if t["target"].startswith("lm: HOT + calibrated plan"))
    assert not plan["met"] and plan["miss_by"] == pytest.approx(100 * (2.11 / 2.01 - 1) - 2)
    env = {"device": "cpu", "torch": "x", "python": "3", "date": "d", "seeds": [0, 1, 2],
           "command": "c", "settings": acc.Settings().__dict__}  # fmt: skip
    md = acc.markdown(rows, targets, env)
    assert "| cnn | hot | accuracy | 96.67 ± 0.58 | -2.00 pt |" in md
    assert "missed by 1.50" in md


def test_pilot_plan_calibrates_a_copy_and_decides_hla_per_layer():
    """``hot_plan``'s pilot trains a copy (the model keeps its initial weights, so every variant
    of a seed starts equal) and returns a plan with an HLA decision and e_hla per HLA layer."""
    torch.set_flush_denormal(True)
    text = acc.load_text("lib", "train", max_bytes=100_000)
    torch.manual_seed(0)
    model = acc.ByteLM(dim=32, depth=1, heads=2, ctx=32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    batches = acc.batches(text, 32, 8, gen)
    plan = acc.pilot_plan(model, batches, 5e-3, acc._lm_loss, 5, acc.VARIANTS["hot_plan"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    decided = acc.plan_summary(plan)
    assert {"blocks.0.qkv", "blocks.0.fc1", "head"} <= set(decided)
    for layer, d in decided.items():
        assert isinstance(d["hla"], bool) and d["e_hla"] is not None, (layer, d)
        assert d["hla"] == (d["e_hla"] <= 0.6)  # the default hla_threshold

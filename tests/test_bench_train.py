"""Guards for the whole-step benchmark (``tools/bench_train.py``, models in bench_models.py).

The real run needs a GPU (timm ViT-B/16 and ResNet-50, HF LLaMA and GPT-2, minutes of compile
per variant); here its ``--quick`` mode (tiny models of the same families, aot_eager, CPU) runs
end to end in a subprocess, so that a broken schema, a crash in a variant, a missing rewrite
or a non-finite number fails on every CPU test run, before GPU time is spent on it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import re
import statistics
import subprocess
import sys
from typing import Any

import pytest
from conftest import load_tool

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "bench_train.py"

DEFAULT_VARIANTS = ["inductor", "inductor_cg", "hot", "hot_cg", "torchao_float8"]
MODELS = ["vit_b16", "llama", "resnet50", "gpt2"]
HAVE_TORCHAO = importlib.util.find_spec("torchao") is not None


def _load_bench():
    return load_tool("bench_train.py")


bench = _load_bench()
#: timm imports here? (On the CPU machines pip pairs the CPU torch with a CUDA torchvision
#: wheel whose ops cannot load; bench_models imports timm anyway, see
#: hotcompile.compat.torchvision_without_ops. Asking here applies that to this process too, so
#: that a later ``import timm`` in the same test session does not raise.) Without timm, the
#: timm models are skipped with that reason, and checked as skipped.
HAVE_TIMM = sys.modules["bench_models"].missing(bench.MODELS["vit_b16"]) is None
TIMM_MODELS = {"vit_b16", "resnet50"}


#: the tests that read it are marked slow: the run takes ~60-100 s on 2 cores
@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """``bench_train.py --quick`` in a fresh interpreter: (the JSON, the markdown)."""
    out = tmp_path_factory.mktemp("bench_train")
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--no-progress",
            "--profile",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "profile_llama_hot.txt").is_file()
    # a progress line per variant, flushed as it goes
    assert "[20/20] gpt2 torchao_float8" in proc.stdout
    assert "[8/20] llama hot" in proc.stdout and ("[3/20] vit_b16 hot" in proc.stdout) == HAVE_TIMM
    return json.loads((out / "bench_train.json").read_text()), (out / "bench_train.md").read_text()


def _positive_finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def test_defaults() -> None:
    assert list(bench.DEFAULT_VARIANTS) == DEFAULT_VARIANTS
    assert bench.default_models(False) == MODELS
    assert bench.default_models(True) == MODELS
    assert bench.baseline_of("hot") == "inductor" and bench.baseline_of("hot_cg") == "inductor_cg"
    assert bench.baseline_of("torchao_float8") == "inductor"
    assert bench.baseline_of("torchao_float8_cg") == "inductor_cg"
    assert bench.baseline_of("inductor_cg") == "inductor"


@pytest.mark.slow
def test_quick_json_schema_and_numbers(quick_run: tuple[dict[str, Any], str]) -> None:
    res, _ = quick_run
    for key in ("device", "torch", "triton", "versions", "commit", "date", "method", "models"):
        assert key in res, key
    assert res["quick"] is True and res["compiler"] == "aot_eager" and res["complete"] is True
    assert res["profile_steps"] == 1
    assert res["versions"]["transformers"] and "timm" in res["versions"]
    assert res["targets"] == bench.targets_doc()
    assert res["targets"]["issue"] == 34
    assert res["targets"]["default_step_ratio_min"] == {"llama": 1.08, "llama8b": 1.15}
    assert [m["name"] for m in res["models"]] == MODELS
    if not HAVE_TIMM:
        skipped = {m["name"]: m.get("skipped") for m in res["models"] if m.get("skipped")}
        assert skipped == dict.fromkeys(TIMM_MODELS, "timm not installed")
    ran = [m for m in res["models"] if not m.get("skipped")]
    assert len(ran) >= 2  # at least llama and gpt2
    for m in ran:
        assert m["batch"] > 0
        assert list(m["variants"]) == DEFAULT_VARIANTS
        for name, v in m["variants"].items():
            if name == "torchao_float8" and not HAVE_TORCHAO:
                assert v == {"skipped": "torchao not installed"}
                continue
            assert "error" not in v, (m["name"], name, v.get("traceback"))
            for key in ("step_ms", "first_step_s", "saved_act_bytes", "loss_first", "loss_last"):
                assert _positive_finite(v[key]), (m["name"], name, key, v[key])
            assert v["compile_s"] >= 0 and v["step_ms_min"] <= v["step_ms"] <= v["step_ms_max"]
            groups = v["saved_groups"]  # what the saved bytes are made of, largest first
            assert groups and sum(g["bytes"] for g in groups) <= v["saved_act_bytes"]
            sizes = [g["bytes"] for g in groups]
            assert sizes == sorted(sizes, reverse=True)
            assert v["peak_bytes"] is None  # CPU: no allocator statistics
            assert v["gpu_busy"] is None  # CPU: no kernels to see
        hot, base = m["variants"]["hot"], m["variants"]["inductor"]
        # same seed, same weights, same batch: the forward (hence the first loss) is untouched
        assert hot["loss_first"] == pytest.approx(base["loss_first"], rel=1e-3)
        assert hot["hot_layers"], m["name"]
        assert _positive_finite(m["step_ratio"])
        assert m["peak_ratio"] is None and m["gpu_busy"] is None
        t = m["targets"]["hot"]
        assert t["step_ratio_target"]["met"] == (
            m["step_ratio"] >= bench.step_ratio_target(m["name"])
        )
        assert t["gpu_busy"] is None  # not measured on CPU (and reported, not judged)
        # the default answers to a step ratio only (issue 34: torchao is forward="fp8"'s)
        assert set(m["targets_met"]) == {"step_ratio_target"}
        assert set(m["targets"]) == {"hot", "hot_cg"}
    by = {m["name"]: m for m in ran}
    # the rewrite really happened, on attention, MLP and the head
    llama = set(by["llama"]["variants"]["hot"]["hot_layers"])
    assert {"model.model.layers.0.self_attn.q_proj", "model.model.layers.1.mlp.down_proj"} <= llama
    assert "model.lm_head" in llama
    assert by["llama"]["variants"]["hot"]["attn_implementation"] == "sdpa"
    assert by["gpt2"]["variants"]["inductor"]["attn_implementation"] == "sdpa"
    if HAVE_TIMM:
        vit = set(by["vit_b16"]["variants"]["hot"]["hot_layers"])
        assert {"model.blocks.0.attn.qkv", "model.blocks.1.mlp.fc2", "model.head"} <= vit
        assert "model.fc" in by["resnet50"]["variants"]["hot"]["hot_layers"]


@pytest.mark.slow
def test_quick_markdown_names_the_setup(quick_run: tuple[dict[str, Any], str]) -> None:
    res, md = quick_run
    head = md.split("## Summary")[0]
    assert f"torch {res['torch']}" in head and res["date"] in head and "triton" in head
    assert f"commit {res['commit']}" in head
    timm = res["versions"]["timm"]
    assert (f"timm {timm}" if timm else "timm not installed") in head
    assert f"transformers {res['versions']['transformers']}" in head
    assert ("torchao not installed" in head) != HAVE_TORCHAO
    assert "## Summary: the issue's targets" in md and "Issue 34's" in md
    assert "| llama | hot | " in md and "| gpt2 | hot_cg | " in md
    assert ("| vit_b16 | hot | " in md) == HAVE_TIMM
    for name in MODELS:
        assert f"## {name} (batch " in md
    table = "| variant | step (ms) | ratio vs baseline | peak (GiB) | peak ratio | GPU busy"
    assert md.count(table) == sum(1 for m in res["models"] if not m.get("skipped"))
    if not HAVE_TORCHAO:
        assert "| torchao_float8 | skipped: torchao not installed |" in md


def test_targets_say_by_how_much() -> None:
    """Issue 34's targets, per kind of variant: the default's step ratio (1.08x on the
    Llama), forward="fp8" against the faster torchao recipe (step and peak), fp8 + memory
    against inductor's peak, 0.98x everywhere else, nothing for prefer="memory" alone."""
    G = 2**30
    base = {"step_ms": 40.0, "saved_act_bytes": 8 * G, "peak_bytes": 10 * G}
    slow = {"step_ms": 80.0, "saved_act_bytes": 7 * G, "peak_bytes": 9 * G, "gpu_busy": 0.84}
    t = bench._targets("llama", base, slow, None, variant="hot")
    assert t["step_ratio"] == pytest.approx(0.5)
    assert t["step_ratio_target"]["met"] is False
    miss = t["step_ratio_target"]["miss"]
    assert "too slow" in miss and "1.08x" in miss and "37.0 ms" in miss, miss
    assert set(t) & set(bench.TARGET_KEYS) == {"step_ratio_target"}
    assert t["gpu_busy"] == 0.84  # reported
    fast = {"step_ms": 36.0, "saved_act_bytes": 2 * G, "peak_bytes": 5 * G}
    assert bench._targets("llama", base, fast, variant="hot")["step_ratio_target"]["met"]
    assert bench._targets("llama8b", base, fast, variant="hot")["step_ratio_target"]["met"] is False
    # forward="fp8" on a Llama: >= 1.03x the torchao run's step at <= 0.95x its peak
    ao = {"step_ms": 38.0, "peak_bytes": 6 * G}
    t = bench._targets("llama", base, fast, ao, "torchao_float8_rowwise", "hot_fp8")
    cell = t["faster_than_torchao_target"]
    assert cell["met"] is True and cell["value"] == pytest.approx(38 / 36)
    assert "torchao_float8_rowwise" in cell["target"] and cell["margin"] == "+0.026x"
    assert t["peak_target"]["met"] is True and t["peak_target"]["value"] == pytest.approx(5 / 6)
    t = bench._targets("llama", base, {**fast, "step_ms": 37.5, "peak_bytes": 5.8 * G}, ao,
                       variant="hot_fp8")  # fmt: skip
    assert t["faster_than_torchao_target"]["met"] is False  # 1.013x
    assert "36.9 ms" in t["faster_than_torchao_target"]["miss"]
    assert t["peak_target"]["met"] is False and "above" in t["peak_target"]["miss"]
    # ... not on other models: ViT-L's is 1.05x inductor, ViT-B's 0.98x
    t = bench._targets("vit_l16", base, {**fast, "step_ms": 39.0}, ao, variant="hot_fp8")
    assert t["step_ratio_target"]["met"] is False and "faster_than_torchao_target" not in t
    t = bench._targets("vit_b16", base, {**fast, "step_ms": 40.8}, ao, variant="hot_fp8")
    assert t["step_ratio_target"]["met"] is True  # 0.980x
    # fp8 + memory on the Llama: >= 1.10x at <= 0.65x inductor's peak
    t = bench._targets("llama", base, {**fast, "peak_bytes": 6.4 * G}, variant="hot_fp8_memory")
    assert t["step_ratio_target"]["met"] is True and t["peak_target"]["met"] is True
    assert "faster_than_torchao_target" not in t
    # prefer="memory" alone: no target; any other variant: 0.98x
    assert not set(bench._targets("llama", base, slow, variant="hot_memory")) & set(
        bench.TARGET_KEYS
    )
    t = bench._targets("resnet50", base, {**fast, "step_ms": 40.9}, None, variant="hot_unary")
    assert t["step_ratio_target"]["met"] is False  # 0.978x < 0.98x
    # torchao skipped: that target is not judged, and says why
    t = bench._targets("llama", base, fast, {"skipped": "torchao not installed"},
                       variant="hot_fp8")  # fmt: skip
    assert t["faster_than_torchao_target"]["met"] is None
    assert "torchao not installed" in t["faster_than_torchao_target"]["miss"]
    assert t["peak_target"]["met"] is None


def test_fp8_is_held_against_the_faster_torchao_recipe() -> None:
    runs = {
        "torchao_float8": {"step_ms": 61.5, "peak_bytes": 12},
        "torchao_float8_rowwise": {"step_ms": 60.0, "peak_bytes": 13},
    }
    assert bench._faster_torchao(runs, bench.FP8_TORCHAO_VARIANTS)[0] == "torchao_float8_rowwise"
    only = {"torchao_float8": {"skipped": "torchao not installed"}}
    assert bench._faster_torchao(only, bench.FP8_TORCHAO_VARIANTS) == (
        "torchao_float8",
        {"skipped": "torchao not installed"},
    )
    entry = {
        "name": "llama",
        "variants": {
            "inductor": {"step_ms": 69.7, "peak_bytes": 14},
            "hot_fp8": {"step_ms": 60.3, "peak_bytes": 12.5},
            "hot_fp8_cg": {"step_ms": 58.0},
            "inductor_cg": {"step_ms": 66.0},
            **runs,
        },
    }
    bench._judge(entry)
    cell = entry["targets"]["hot_fp8"]["faster_than_torchao_target"]
    assert "torchao_float8_rowwise" in cell["target"] and cell["met"] is False  # 0.995x
    # with CUDA graphs: torchao_float8_cg only (not run here)
    cg = entry["targets"]["hot_fp8_cg"]["faster_than_torchao_target"]
    assert "torchao_float8_cg" in cg["target"] and cg["met"] is None


def test_a_bimodal_variant_is_flagged_unsteady() -> None:
    # run 24's torchao float8: four steps near 66.7 ms, six near 72 ms, median 71.2
    ao = [67.1, 66.6, 66.4, 66.7, 70.6, 72.9, 72.4, 72.2, 72.3, 71.7]
    note = bench.unsteady_note({"step_ms": 71.2, "step_times_ms": ao})
    assert note == "unsteady: steps 66.4-72.9 ms"
    steady = [69.0, 69.0, 68.5, 69.6, 68.9, 68.8, 69.0, 68.9, 69.6, 68.8]  # its hot variant
    assert bench.unsteady_note({"step_ms": 68.9, "step_times_ms": steady}) is None
    assert bench.unsteady_note({"step_ms": 68.9, "step_times_ms": [68.9]}) is None
    # such a run does not decide hot vs torchao where their steps overlap
    base = {"step_ms": 73.9, "peak_bytes": 1, "step_times_ms": [73.9] * 10}
    hot = {"step_ms": 68.9, "peak_bytes": 1, "step_times_ms": steady}
    t = bench._targets(
        "llama", base, hot, {"step_ms": 71.2, "step_times_ms": ao}, variant="hot_fp8"
    )
    cell = t["faster_than_torchao_target"]
    assert cell["met"] is None and "unsteady steps overlap" in cell["miss"], cell
    assert "--isolate --repeat 2" in bench._target_cell(cell)
    slow = {"step_ms": 80.0, "step_times_ms": [x + 10 for x in ao]}  # unsteady, all slower
    t = bench._targets("llama", base, hot, slow, variant="hot_fp8")
    assert t["faster_than_torchao_target"]["met"] is True


def test_a_failing_variant_is_recorded_not_fatal(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(quick: bool) -> Any:
        raise RuntimeError("simulated out of memory")

    vit = bench.MODELS["vit_b16"]
    spec = bench.ModelSpec("broken", "always fails", broken, vit.batch, 1, 1)
    monkeypatch.setitem(bench.MODELS, "broken", spec)
    res = bench.main(
        ["--quick", "--models", "broken", "--variants", "inductor,hot,torchao_float8"]
        + ["--no-progress", "--out", str(tmp_path)]
    )
    v = res["models"][0]["variants"]
    assert "simulated out of memory" in v["inductor"]["error"]
    assert "simulated out of memory" in v["hot"]["error"]
    if not HAVE_TORCHAO:
        assert v["torchao_float8"] == {"skipped": "torchao not installed"}
    assert res["models"][0]["step_ratio"] is None
    on_disk = json.loads((tmp_path / "bench_train.json").read_text())
    assert on_disk["models"][0]["variants"]["hot"]["error"].startswith("RuntimeError")
    assert "error: RuntimeError" in (tmp_path / "bench_train.md").read_text()


def test_a_missing_library_skips_the_model(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vit = bench.MODELS["vit_b16"]
    spec = bench.ModelSpec(
        "needs_lib", "needs a library", vit.build, vit.batch, 1, 1, requires=("no_such_lib_x",)
    )
    monkeypatch.setitem(bench.MODELS, "needs_lib", spec)
    res = bench.main(["--quick", "--models", "needs_lib", "--no-progress", "--out", str(tmp_path)])
    assert res["models"][0]["skipped"] == "no_such_lib_x not installed"
    assert res["models"][0]["variants"] == {}
    assert "Skipped: no_such_lib_x not installed" in (tmp_path / "bench_train.md").read_text()


@pytest.mark.slow  # reads the module's --quick run (~60 s)
def test_merge_combines_split_runs(
    quick_run: tuple[dict[str, Any], str], tmp_path: pathlib.Path
) -> None:
    res, _ = quick_run
    a, b = tmp_path / "a", tmp_path / "b"
    for d, names in ((a, {"vit_b16", "llama"}), (b, {"resnet50", "gpt2"})):
        d.mkdir()
        part = {**res, "models": [m for m in res["models"] if m["name"] in names]}
        (d / "bench_train.json").write_text(json.dumps(part))
    merged = bench.main(["--merge", str(a), str(b / "bench_train.json"), "--out", str(tmp_path)])
    assert [m["name"] for m in merged["models"]] == MODELS
    assert len(merged["parts"]) == 2 and "merge_warning" not in merged
    md = (tmp_path / "bench_train.md").read_text()
    assert "Merged from 2 runs" in md and "| gpt2 | hot | " in md


def test_merge_judges_committed_runs_again(tmp_path: pathlib.Path) -> None:
    """``--merge`` reads every committed run, also those with variants retired since (known
    by name: HOT with options this version does not know, judged at 0.98x) and from before
    the results named their profiled steps, and judges them by today's targets: run 97 (the
    8B widths without inductor) judges forward="fp8" against torchao alone."""
    runs = bench.RESULTS / "bench_train_runs"
    retired = runs / "run81_90b0f45_vitl_static_launch_h200.json"
    res = bench.main(["--merge", str(retired), "--out", str(tmp_path / "a")])
    t = res["models"][0]["targets"]["hot_fp8_triton_launch"]
    assert bench.target_kind("hot_fp8_triton_launch") == "other"
    assert t["step_ratio_target"]["target"] == ">= 0.98x"
    bench.main(["--merge", str(runs / "run1_3cb0e9a.json"), "--out", str(tmp_path / "b")])
    res = bench.main(
        ["--merge", str(runs / "run97_04f5039_llama8b_h200.json"), "--out", str(tmp_path / "c")]
    )
    t = res["models"][0]["targets"]["hot_fp8_swiglu_noreuse"]
    assert t["step_ratio"] is None and "step_ratio_target" not in t
    assert t["faster_than_torchao_target"]["met"] is True and t["peak_target"]["met"] is True
    md = (tmp_path / "c" / "bench_train.md").read_text()
    assert "| llama8b | hot_fp8_swiglu_noreuse | n/a: inductor not run | 1.043x" in md


@pytest.mark.slow
def test_repeat_alternates_the_order_and_pools_the_steps(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--repeat 2``: every variant runs twice, in the given order and then reversed (a host
    that drifts during the run no longer favours whichever variant ran first); each variant's
    step is the median of both runs' steps, with each run's median in the notes."""
    res = bench.main(
        ["--quick", "--models", "gpt2", "--variants", "inductor,hot", "--steps", "2"]
        + ["--repeat", "2", "--profile", "0", "--no-progress", "--out", str(tmp_path)]
    )
    log = capsys.readouterr().out
    order = re.findall(r"\] gpt2 (\w+) \(batch .*compile \+ warm-up", log)
    assert order == ["inductor", "hot", "hot", "inductor"], order
    assert res["repeat"] == 2
    for v in res["models"][0]["variants"].values():
        assert len(v["step_times_ms"]) == 4 and len(v["step_ms_by_repeat"]) == 2
        assert v["step_ms"] == statistics.median(v["step_times_ms"])
    md = (tmp_path / "bench_train.md").read_text()
    assert "in each of 2 runs of every variant" in md and "runs " in md


def test_help_teaches() -> None:
    out = bench.build_parser().format_help()
    for word in ("1.08x", "1.15x", "1.03x", "0.95x", "0.98x", "torchao_float8", "inductor_cg",
                 "max_memory_allocated", "--quick", "--merge", "examples:",
                 "lqs_calibration_steps", "vit_base_patch16_224", "LlamaForCausalLM",
                 "resnet50", "GPT2LMHeadModel"):  # fmt: skip
        assert word in out, word


@pytest.mark.slow
def test_profile_says_where_hot_spends_the_step(quick_run: tuple[dict[str, Any], str]) -> None:
    """``--profile``: per variant, wall time and the ``hotcompile::`` ops that ran, with calls
    per step matching the model's layers (host-bound or not is read off these numbers)."""
    res, md = quick_run
    for m in res["models"]:
        if m.get("skipped"):
            continue
        hot = m["variants"]["hot"]["profile"]
        plain = m["variants"]["inductor"]["profile"]
        assert _positive_finite(hot["wall_ms"]) and _positive_finite(plain["wall_ms"])
        assert plain["hot_ops"] == {}
        n_layers = len(m["variants"]["hot"]["hot_layers"])
        ops = hot["hot_ops"]
        assert ops["hotcompile::hla_grad_weight"]["calls"] >= n_layers - 1
        assert all(_positive_finite(o["host_ms"]) for o in ops.values())
    assert "Where a step's time goes" in md


def test_gpu_busy_is_the_union_of_kernel_spans() -> None:
    assert bench._merged_us([]) == 0.0
    assert bench._merged_us([(0.0, 10.0), (5.0, 12.0), (20.0, 25.0), (21.0, 22.0)]) == 17.0


def test_profile_classes_kernels_by_name() -> None:
    """The profile's class table adds up a variant's kernels by what they do, so that two
    variants' steps can be compared class by class (names from H200 profiles)."""
    names = {
        "nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_ovscale_TNT": "GEMM, 8-bit operands",
        "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT": "GEMM, 16-bit",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26": "attention",
        "void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>>": (
            "optimizer"
        ),
        "Optimizer.step#AdamW.step": "annotation",
        "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, "
        "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, "
        "float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>>>": (
            "other (ATen, copies)"
        ),
        "_hla_quant_kernel": "HOT's Triton/CUDA kernels",
        "_weight_operands_kernel": "HOT's Triton/CUDA kernels",
        "_swiglu_hq_kernel": "HOT's Triton/CUDA kernels",
        "triton_red_fused_abs_max_mul_silu_silu_backward_view_6": "inductor's Triton kernels",
        "triton_poi_fused__scaled_dot_product_flash_attention_backward_3": (
            "inductor's Triton kernels"
        ),
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor>": (
            "other (ATen, copies)"
        ),
    }
    for name, cls in names.items():
        assert bench.kernel_class(name) == cls, name


def test_class_table_puts_profiled_variants_side_by_side() -> None:
    """The markdown's class table: one row per class a variant ran, one column per variant,
    device ms with the idle before in brackets; no table where no kernels were seen (CPU)."""
    classes = dict.fromkeys(bench.KERNEL_CLASSES, 0.0)

    def prof(gemm: float, idle: float) -> dict:
        return {
            "kernel_classes_ms": {**classes, "GEMM, 8-bit operands": gemm},
            "idle_before_ms": {**classes, "GEMM, 8-bit operands": idle},
            "gpu_busy_ms": gemm,
            "idle_ms": idle,
            "wall_ms": gemm + idle,
        }

    m = {"name": "llama"}
    rows = bench._class_tables(
        [(m, "hot_fp8", {"profile": prof(19.4, 0.4)}), (m, "torchao", {"profile": prof(18.8, 0.3)})]
    )
    text = "\n".join(rows)
    assert "| class | hot_fp8 | torchao |" in text
    assert "| GEMM, 8-bit operands | 19.40 (0.40) | 18.80 (0.30) |" in text
    assert "optimizer" not in text  # a class no variant ran has no row
    assert bench._class_tables([(m, "hot", {"profile": {"kernel_classes_ms": classes}})]) == []


def test_idle_time_is_charged_to_the_kernel_the_gpu_waited_for() -> None:
    """A gap in the GPU's timeline counts before the kernel that ends it; overlapping kernels
    (two streams) make no gap."""
    kernels = [("a", 0.0, 10.0), ("b", 15.0, 20.0), ("c", 18.0, 30.0), ("b", 40.0, 41.0)]
    assert bench._waits(kernels) == {"b": 15.0}
    assert bench._waits([]) == {}


def test_host_waits_are_the_idle_before_the_launch_call_began() -> None:
    """Of a gap, the host is charged only up to the start of the kernel's launch call: a
    kernel launched before the GPU ran dry waited on something else (launch latency, another
    stream), and a kernel whose launch was not seen is charged nothing."""
    kernels = [
        ("a", 0.0, 10.0, -50.0),
        ("b", 15.0, 20.0, 13.0),  # launched 3 us after the GPU ran dry: 3 of the 5 idle
        ("c", 30.0, 31.0, 5.0),  # launched long before: none of its 10
        ("d", 40.0, 41.0, None),  # launch not seen: none
        ("b", 50.0, 51.0, 60.0),  # clock skew (launch after start): the whole gap, no more
    ]
    assert bench._waits(kernels) == {"b": 14.0, "c": 10.0, "d": 9.0}
    assert bench._host_waits(kernels) == {"b": 12.0}
    assert bench._is_launch_call("cudaLaunchKernel") and bench._is_launch_call("cuLaunchKernelEx")
    assert not bench._is_launch_call("cudaMemcpyAsync")
    assert not bench._is_launch_call("aten::mm")


def test_class_table_shows_the_hosts_share_of_the_idle() -> None:
    """Profiles with the host's share of the idle show it beside the idle, per class and in
    the total row."""
    classes = dict.fromkeys(bench.KERNEL_CLASSES, 0.0)
    gemm = "GEMM, 8-bit operands"
    p = {
        "kernel_classes_ms": {**classes, gemm: 19.4},
        "idle_before_ms": {**classes, gemm: 0.4},
        "host_wait_before_ms": {**classes, gemm: 0.25},
        "gpu_busy_ms": 19.4,
        "idle_ms": 0.4,
        "host_wait_ms": 0.25,
        "wall_ms": 19.8,
    }
    text = "\n".join(bench._class_tables([({"name": "llama"}, "hot_fp8", {"profile": p})]))
    assert "| GEMM, 8-bit operands | 19.40 (0.40; host 0.25) |" in text
    assert "| GPU busy / idle (host) / wall | **19.4 / 0.40; host 0.25 / 19.8** |" in text


def test_nested_hot_ops_count_once_in_the_profile() -> None:
    """A reference op calling another ``hotcompile`` op (``hla_grad_weight_dense`` →
    ``hla_grad_weight`` on CPU) is counted as the outer op only: the host/device sums of the
    profile table do not count the inner call twice."""
    import torch

    gy, x = torch.randn(2, 32, 48), torch.randn(2, 32, 40)
    rows = [0, 2, 3, 8, 10, 11, 12, 14]

    def step():
        return torch.ops.hotcompile.hla_grad_weight_dense(
            gy, x, 0, rows, 16, 8, "nearest", "l", False
        )

    prof = bench.profile_steps_of(step, 2, torch.device("cpu"), "t", None)
    assert set(prof["hot_ops"]) == {"hotcompile::hla_grad_weight_dense"}
    assert prof["hot_ops"]["hotcompile::hla_grad_weight_dense"]["calls"] == 1


@pytest.mark.slow
def test_isolate_runs_each_variant_in_a_fresh_process(tmp_path: pathlib.Path) -> None:
    """``--isolate``: every variant runs in a child process of its own (nothing one variant
    leaves behind reaches the next one's host), with the parent's other options; the parent
    collects the children's results and logs and says so in the report."""
    res = bench.main(
        ["--quick", "--models", "gpt2", "--variants", "inductor,hot", "--steps", "2"]
        + ["--isolate", "--profile", "0", "--no-progress", "--out", str(tmp_path)]
    )
    assert res["isolate"] is True
    variants = res["models"][0]["variants"]
    assert set(variants) == {"inductor", "hot"}
    for name, v in variants.items():
        assert "error" not in v, v
        assert len(v["step_times_ms"]) == 2 and v["step_ms"] > 0, name
        log = (tmp_path / "isolated" / f"gpt2_{name}_run0" / "log.txt").read_text()
        # the child ran one variant with the parent's --steps and --quick
        assert f"gpt2 {name} (batch" in log and "--steps 2" in log, log[-500:]
        other = "hot" if name == "inductor" else "inductor"
        assert f"gpt2 {other} (batch" not in log
    assert "fresh Python process (--isolate)" in (tmp_path / "bench_train.md").read_text()


def test_isolate_child_command_line() -> None:
    """A child keeps the parent's options and gets its own model, variant, run and output."""
    argv = ["--steps=7", "--models", "llama,gpt2", "--isolate", "--repeat", "3"]
    argv += ["--hot-options", '{"gx_bits": 8}', "--out=/x", "--profile", "3", "--variants=a,b"]
    got = bench.child_argv(argv, "gpt2", "hot", 0, pathlib.Path("/x/isolated/c"))
    assert got == [
        "--steps=7", "--hot-options", '{"gx_bits": 8}', "--models", "gpt2", "--variants", "hot",
        "--repeat", "1", "--profile", "0", "--out", "/x/isolated/c",
    ]  # fmt: skip


def test_isolated_child_without_a_result_is_an_error_with_its_output(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that dies before writing its result (an import error, the OOM killer) fails
    that variant with the child's exit status and the end of its output, and its log is
    kept; a child's recorded error or skip reaches the parent as one."""
    import types

    def died(cmd, **kw):
        return types.SimpleNamespace(returncode=-9, stdout="warming up\n", stderr="Killed\n")

    monkeypatch.setattr(subprocess, "run", died)
    with pytest.raises(RuntimeError, match=r"(?s)exited -9 with no result: .*Killed"):
        bench.run_isolated(["--steps", "2"], "gpt2", "hot", 0, 0, tmp_path)
    assert "Killed" in (tmp_path / "isolated" / "gpt2_hot_run0" / "log.txt").read_text()

    def recorded(cmd, **kw):
        out = pathlib.Path(cmd[cmd.index("--out") + 1])
        variants = {"hot": {"error": "ValueError: bad"}, "hot_cg": {"skipped": "no GPU"}}
        variant = cmd[cmd.index("--variants") + 1]
        res = {"models": [{"name": "gpt2", "variants": {variant: variants[variant]}}]}
        (out / "bench_train.json").write_text(json.dumps(res))
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(subprocess, "run", recorded)
    with pytest.raises(RuntimeError, match="isolated process.*ValueError: bad"):
        bench.run_isolated([], "gpt2", "hot", 1, 0, tmp_path)
    with pytest.raises(bench.VariantSkipped, match="no GPU"):
        bench.run_isolated([], "gpt2", "hot_cg", 0, 0, tmp_path)

"""Guards for the whole-step benchmark (``tools/bench_train.py``).

The real run needs a GPU (ViT-B/16 and GPT-2 small, minutes of compile); here its ``--quick``
mode (tiny models, aot_eager, CPU) runs end to end in a subprocess, so that a broken schema,
a crash in a variant, a missing rewrite or a non-finite number fails on every CPU test run,
before GPU time is spent on it.
"""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from conftest import load_tool

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "bench_train.py"


def _load_bench():
    return load_tool("bench_train.py")


bench = _load_bench()


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
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "profile_vit_b16_hot.txt").is_file()
    return json.loads((out / "bench_train.json").read_text()), (out / "bench_train.md").read_text()


def _positive_finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def test_quick_json_schema_and_numbers(quick_run: tuple[dict[str, Any], str]) -> None:
    res, _ = quick_run
    for key in ("device", "torch", "triton", "date", "method", "models", "targets", "compiler"):
        assert key in res, key
    assert res["quick"] is True and res["compiler"] == "aot_eager"
    assert res["targets"] == {
        "step_speedup_min": 1.15,
        "saved_act_ratio_max": 0.75,
        "peak_memory_ratio_max": 0.80,
    }
    assert [m["name"] for m in res["models"]] == ["vit_b16", "gpt2_small"]
    for m in res["models"]:
        assert m["batch"] > 0
        assert set(m["variants"]) == {"inductor", "hot"}
        for name, v in m["variants"].items():
            assert "error" not in v, (m["name"], name, v.get("traceback"))
            for key in ("step_ms", "first_step_s", "saved_act_bytes", "loss_first", "loss_last"):
                assert _positive_finite(v[key]), (m["name"], name, key, v[key])
            assert v["compile_s"] >= 0 and v["step_ms_min"] <= v["step_ms"] <= v["step_ms_max"]
            assert v["peak_bytes"] is None  # CPU: no allocator statistics
        hot, base = m["variants"]["hot"], m["variants"]["inductor"]
        # same seed, same weights, same batch: the forward (hence the first loss) is untouched
        assert hot["loss_first"] == pytest.approx(base["loss_first"], rel=1e-3)
        # the rewrite really happened, on attention, MLP and the head
        assert {"model.blocks.0.qkv", "model.blocks.1.fc2", "model.head"} <= set(hot["hot_layers"])
        assert _positive_finite(m["step_speedup"])
        assert m["peak_memory_ratio"] is None
        # HOT never saves more than plain compile (README), and ABC does save something
        assert 0 < m["saved_act_ratio"] < 1.0, m["saved_act_ratio"]
        t = m["targets"]["hot"]
        assert t["saved_act_target"]["met"] == (m["saved_act_ratio"] <= 0.75)
        assert set(m["targets_met"]) == {
            "step_speedup_target",
            "saved_act_target",
            "peak_memory_target",
        }


def test_quick_markdown_names_the_setup(quick_run: tuple[dict[str, Any], str]) -> None:
    res, md = quick_run
    assert f"torch {res['torch']}" in md and res["date"] in md and "triton" in md
    assert "| vit_b16 | 4 | hot |" in md and "| gpt2_small | 2 | inductor |" in md
    assert "## Targets" in md


def test_targets_say_by_how_much() -> None:
    base = {"step_ms": 40.0, "saved_act_bytes": 8 * 2**30, "peak_bytes": 10 * 2**30}
    slow = {"step_ms": 80.0, "saved_act_bytes": 7 * 2**30, "peak_bytes": 9 * 2**30}
    t = bench._targets(base, slow)
    assert t["step_speedup"] == pytest.approx(0.5)
    assert t["step_speedup_target"]["met"] is False
    assert "too slow" in t["step_speedup_target"]["miss"]
    assert t["saved_act_target"]["met"] is False and "short" in t["saved_act_target"]["miss"]
    assert t["peak_memory_ratio"] == pytest.approx(0.9)
    fast = {"step_ms": 20.0, "saved_act_bytes": 2 * 2**30, "peak_bytes": 5 * 2**30}
    t = bench._targets(base, fast)
    assert all(t[k]["met"] for k in ("step_speedup_target", "saved_act_target",
                                     "peak_memory_target"))  # fmt: skip
    assert t["step_speedup_target"]["miss"] is None


def test_a_failing_variant_is_recorded_not_fatal(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(quick: bool) -> Any:
        raise RuntimeError("simulated out of memory")

    spec = bench.ModelSpec("broken", "always fails", broken, bench._vit_batch, 1, 1)
    monkeypatch.setitem(bench.MODELS, "broken", spec)
    res = bench.main(["--quick", "--models", "broken", "--no-progress", "--out", str(tmp_path)])
    v = res["models"][0]["variants"]
    assert "simulated out of memory" in v["inductor"]["error"]
    assert "simulated out of memory" in v["hot"]["error"]
    assert res["models"][0]["step_speedup"] is None
    on_disk = json.loads((tmp_path / "bench_train.json").read_text())
    assert on_disk["models"][0]["variants"]["hot"]["error"].startswith("RuntimeError")
    assert "error: RuntimeError" in (tmp_path / "bench_train.md").read_text()


def test_help_teaches() -> None:
    out = bench.build_parser().format_help()
    for word in ("1.15x", "25%", "20%", "max_memory_allocated", "saved_activation_bytes",
                 "--quick", "examples:", "lqs_calibration_steps"):  # fmt: skip
        assert word in out, word


def test_profile_says_where_hot_spends_the_step(quick_run: tuple[dict[str, Any], str]) -> None:
    """``--profile``: per variant, wall time and the ``hotcompile::`` ops that ran, with calls
    per step matching the model's layers (host-bound or not is read off these numbers)."""
    res, md = quick_run
    for m in res["models"]:
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

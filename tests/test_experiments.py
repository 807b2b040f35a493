"""The experiment scripts (experiments/) the GPU tests load run on the CPU too (a renamed helper
once broke one of them, and only the GPU machine noticed)."""

from __future__ import annotations

import torch
from conftest import load_tool


def test_int8_head_check_runs_on_the_cpu() -> None:
    """``tests/test_gpu.py``'s GPT-2 regression test calls this function on CUDA."""
    mod = load_tool("int8_head_check.py", "experiments")
    options = {"gx_scaling": "per_token", "warmup_steps": 1000, "hla": False}
    hot = mod.grads({**options, "compiler": "aot_eager"})[0]
    assert hot and all(torch.isfinite(g).all() for g in hot.values())


def test_peak_moment_replays_the_allocators_trace(tmp_path) -> None:
    """``experiments/peak_moment.py`` (a GPU experiment) finds the peak of a recorded step
    from the allocator's events and names each live tensor by inductor's generated line;
    checked here on a synthetic trace and a generated-looking module."""
    mod = load_tool("peak_moment.py", "experiments")
    code = tmp_path / "ab" / ("c" + "q" * 52 + ".py")
    code.parent.mkdir()
    code.write_text(
        "def call(args):\n"
        "    buf5 = empty_strided_cuda((64, 64), (64, 1), torch.bfloat16)\n"
        "    # Topologically Sorted Source Nodes: [silu, mul], Original ATen: [aten.mul]\n"
        "    triton_poi_fused_mul_silu_0.run(buf3, buf5, 4096, stream=stream0)\n"
    )
    gen = [{"filename": str(code), "line": 2, "name": "call"}]
    bwd = [*gen, {"filename": "/x/torch/_functorch/runtime_wrappers.py", "name": "backward"}]
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": bwd},
        {"action": "free_completed", "addr": 9, "size": 30},  # held before the step
        {"action": "alloc", "addr": 2, "size": 50, "frames": gen},
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 3, "size": 60, "frames": gen},
    ]
    r = mod.replay({"device_traces": [trace]}, baseline=1000)
    assert r["peak"] == 1000 + 100 - 30 + 50 and r["at"] == 2
    assert {a: size for a, (size, _) in r["live"].items()} == {1: 100, 2: 50}
    assert r["pre_freed_at_end"] == 30
    label = mod._label(gen)
    assert label["alloc"].startswith("buf5 = empty_strided_cuda((64, 64)")
    assert label["call"].startswith("triton_poi_fused_mul_silu_0.run(buf3, buf5")
    assert label["nodes"].startswith("[silu, mul]")
    assert mod._phase(bwd) == "backward" and mod._phase(gen) == "forward"

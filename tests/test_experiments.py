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


def test_backward_liveness_replays_a_generated_module(tmp_path) -> None:
    """``experiments/backward_liveness.py`` replays a generated module's memory from its
    source: arguments sized from the harness, allocations, inductor's ``# reuse`` renames
    (kept alive as written, a new buffer at the last use otherwise), ``del`` and the
    returned gradient; ``extern_kernels.mm`` is no use of an argument named ``mm``; a buffer
    ``never`` matches takes no memory."""
    mod = load_tool("backward_liveness.py", "experiments")
    code = tmp_path / "c.py"
    code.write_text(
        "class Runner:\n"
        "    def call(self, args):\n"
        "        primals_1, mm, tangents_1 = args\n"
        "        args.clear()\n"
        "        buf0 = empty_strided_cuda((1024, ), (1, ), torch.float32)\n"  # 4 KiB
        "        triton_poi_0.run(mm, buf0, stream=stream0)\n"
        "        del mm\n"
        "        buf1 = empty_strided_cuda((512, ), (1, ), torch.bfloat16)\n"  # 1 KiB
        "        extern_kernels.mm(buf0, primals_1, out=buf1)\n"
        "        buf2 = reinterpret_tensor(buf0, (1024, ), (1, ), 0); del buf0  # reuse\n"
        "        triton_poi_1.run(buf1, buf2, stream=stream0)\n"
        "        del buf1\n"
        "        return (buf2, )\n"
        "def get_args():\n"
        "    primals_1 = rand_strided((64, 64), (64, 1), device='cuda:0', dtype=torch.float32)\n"
        "    mm = rand_strided((2048, ), (1, ), device='cuda:0', dtype=torch.bfloat16)\n"
        "    tangents_1 = rand_strided((), (), device='cuda:0', dtype=torch.float32)\n"
    )
    body, args = mod.module_call(str(code))
    assert args["mm"] == (4096, "bfloat16") and args["primals_1"][0] == 64 * 64 * 4
    t = 4  # tangents_1, a float32 scalar, never deleted
    written, _ = mod.replay(body, args, "as-written", 0)
    # mm 4 KiB until its del; buf0 4 KiB; buf1 1 KiB; buf0's storage lives on as buf2
    assert max(written) == 4096 + 4096 + t and written[-1] == 4096 + t
    assert written[body.index("del buf1")] == 4096 + t
    # buf0 never made (matched by the kernel that writes it): mm alone is the peak
    assert max(mod.replay(body, args, "as-written", 0, r"triton_poi_0\.")[0]) == 4096 + t
    last, snaps = mod.replay(body, args, "last-use", 0)
    # mm freed after the kernel that reads it (not at the `mm` of extern_kernels.mm), and
    # tangents_1, which nothing reads, at once
    assert last[body.index("del mm")] == 4096 and max(last) == 4096 + 4096
    assert last[-1] == 4096 and [s.size for s in snaps[-1]] == [4096]

"""Where HOT's host time goes: Python profile of compiled training steps, and per-op call cost.

tools/bench_train.py --profile (H100, 2026-11-22) showed HOT's training step host-bound: ViT-B
at batch 128 kept the GPU busy 34% of the step, and the ``hotcompile::`` ops spent ~2 ms of
host time per layer per step (inductor's whole step: 42 ms). This script says which Python
code that is, on a model small enough that the GPU never is the bottleneck:

1. ``cProfile`` over N compiled training steps of a small transformer (``hotcompile.demo.Block``)
   under ``backend="hot"``: the functions with the most own time and the most cumulative time
   (tottime / cumtime per step, microseconds).
2. The host cost of one call of each HOT op on its own (``torch.ops.hotcompile.*`` in a loop,
   the device queued ahead so only the host is timed): µs per call.
3. (CUDA) The same for the pieces under the ops: the op against its CUDA function called
   directly (torch's custom-op layers), the dispatcher, each kernel launch, the NaN check.

    python3 experiments/host_overhead.py [--steps 20] [--out DIR]

Needs CUDA (the CUDA kernels' host path is what is measured); on a CPU machine it runs the
reference ops and says so.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import pathlib
import pstats
import sys
import time

import torch
import torch.nn as nn

from hotcompile.demo import Block

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
from bench_train import warmup_steps_needed  # noqa: E402
from gpu_tests import _commit  # noqa: E402


class Stack(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, dim // 64, 4 * dim) for _ in range(depth))
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x).float().mean()


def step_fn(model: nn.Module, x: torch.Tensor, device: torch.device):
    def step() -> None:
        for p in model.parameters():
            p.grad = None
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(x)
        loss.backward()

    return step


def step_wall_us(step, steps: int, device: torch.device) -> float:
    """Wall µs per step of ``steps`` steps, no profiler (the host's pace when it is the
    bottleneck)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) * 1e6 / steps


def profile_steps(step, steps: int, device: torch.device, top: int) -> tuple[str, float]:
    """cProfile tables of ``steps`` steps (per step) and the host µs per step."""
    prof = cProfile.Profile()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    sync()
    per_step_us = (time.perf_counter() - t0) * 1e6 / steps
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.strip_dirs()
    for key in ("tottime", "cumulative"):
        out.write(f"\n===== by {key} (totals over {steps} steps) =====\n")
        st.sort_stats(key).print_stats(top)
    return out.getvalue(), per_step_us


def _operands(device: torch.device):
    """A ViT-B-sized layer slice (L 1024, 768 → 3072), bf16: g_y, x, W and their 3-D views."""
    L, O, I = 1024, 3072, 768
    g = torch.Generator(device="cpu").manual_seed(0)
    gy = torch.randn(L, O, generator=g).to(device, torch.bfloat16)
    x = torch.randn(L, I, generator=g).to(device, torch.bfloat16)
    w = torch.randn(O, I, generator=g).to(device, torch.bfloat16) * 0.02
    return gy, x, w, gy.reshape(8, L // 8, O), x.reshape(8, L // 8, I)


#: the defaults (LayerSpec.hla_rows, block 16)
ROWS, BLOCK = [0, 2, 3, 8, 10, 11, 12, 14], 16


def op_call_cost(device: torch.device, reps: int) -> dict[str, float]:
    """Host µs per call of each HOT op on a ViT-B-sized layer slice (L 1024, 768 → 3072)."""
    from hotcompile import ops

    gy, x, w, gy3, x3 = _operands(device)
    calls = {
        "hq_grad_input": lambda: ops.hq_grad_input(
            gy, w, 4, "per_token", "pseudo_stochastic", "sawb", BLOCK, "probe", "", False
        ),
        "abc_compress": lambda: ops.abc_compress(x3, 0, ROWS, BLOCK, 8, "nearest"),
    }
    xq, sx = ops.abc_compress(x3, 0, ROWS, BLOCK, 8, "nearest")
    calls["hla_grad_weight"] = lambda: ops.hla_grad_weight(
        gy3, xq, sx, 0, ROWS, BLOCK, 8, "nearest", "probe", False
    )
    return _host_us(calls, device, reps)


def part_costs(device: torch.device, reps: int) -> dict[str, float]:
    """Host µs per call of the pieces under the ops (CUDA only): how much each layer of the
    call stack adds — torch's custom-op machinery (op vs its CUDA function called directly),
    the dispatcher's choice, each Triton / C++ launch, the NaN check — measured the same way."""
    from hotcompile import lqs, numerics, ops
    from hotcompile.kernels import dispatch, hla_triton, hq_cuda, hq_triton

    gy, x, w, gy3, x3 = _operands(device)
    hq = (4, "per_token", "pseudo_stochastic", "sawb", BLOCK, "probe", "", False)
    fp8 = torch.float8_e4m3fn
    codes, sg = hq_triton.hq_quantize(gy, 4, True, "pseudo_stochastic", fp8, 16)
    wt, sw = hq_triton.quantize_weight(w, 4, "sawb", True)
    xq, sx = ops.abc_compress(x3, 0, ROWS, BLOCK, 8, "nearest")
    gqt, sgw = hla_triton.hla_quantize(gy3, 0, ROWS, 8, "nearest", transposed=True)
    xqt = xq.t().contiguous()

    @torch.library.custom_op("hotcompile_probe::fresh", mutates_args=())
    def fresh(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(a)

    @fresh.register_fake
    def _(a, b):
        return torch.empty_like(a)

    calls = {
        "op hq_grad_input": lambda: ops.hq_grad_input(gy, w, *hq),
        "hq_grad_input_cuda (no custom-op layers)": lambda: hq_triton.hq_grad_input_cuda(
            gy, w, *hq
        ),
        "  lqs.resolve": lambda: lqs.resolve("", "per_token", gy, 4, BLOCK),
        "  hq_quantize (dispatcher + kernel)": lambda: hq_triton.hq_quantize(
            gy, 4, True, "pseudo_stochastic", fp8, 16
        ),
        "  hq_quantize_triton (1 launch)": lambda: hq_triton.hq_quantize_triton(
            gy, 4, True, "pseudo_stochastic", fp8, 16
        ),
        "  quantize_weight (2 launches + zeros)": lambda: hq_triton.quantize_weight(
            w, 4, "sawb", True
        ),
        "  scaled_gemm g_x (dispatcher + GEMM)": lambda: dispatch.scaled_gemm(
            codes, wt, sg, sw / BLOCK, torch.bfloat16
        ),
        "  numerics.check_scale (per-token)": lambda: numerics.check_scale(sg, "probe", "g_x"),
        "  numerics.check_scale (per-tensor)": lambda: numerics.check_scale(sgw, "probe", "g_w"),
        "op hla_grad_weight": lambda: ops.hla_grad_weight(
            gy3, xq, sx, 0, ROWS, BLOCK, 8, "nearest", "probe", False
        ),
        "hla_grad_weight_cuda (no custom-op layers)": lambda: hla_triton.hla_grad_weight_cuda(
            gy3, xq, sx, 0, ROWS, BLOCK, 8, "nearest", "probe", False
        ),
        "  hla_quantize (2 launches + zeros)": lambda: hla_triton.hla_quantize(
            gy3, 0, ROWS, 8, "nearest", transposed=True
        ),
        "  xq.t().contiguous()": lambda: xq.t().contiguous(),
        "  scaled_gemm g_w (dispatcher + GEMM)": lambda: dispatch.scaled_gemm(
            gqt, xqt, sgw * sx / BLOCK, None, torch.float32
        ),
        "custom op doing torch.empty_like": lambda: fresh(gy, w),
        "torch.empty_like": lambda: torch.empty_like(gy),
        "torch.zeros(1)": lambda: torch.zeros((1,), dtype=torch.int32, device=device),
        "scale * scalar": lambda: sw / BLOCK,
    }
    if hq_cuda.available():
        calls["  hq_cuda.hq_quantize (C++ kernel)"] = lambda: hq_cuda.hq_quantize(
            gy, 4, True, "pseudo_stochastic", fp8, 16
        )
    return _host_us(calls, device, reps)


#: calls timed between two device syncs: few enough that their launches never fill the CUDA
#: launch queue (~1000 entries), whose back-pressure would be timed as host cost
CHUNK = 20


def _host_us(calls: dict, device: torch.device, reps: int) -> dict[str, float]:
    """Host µs per call of each function, the device kept busy so only the host is timed.

    Timed in chunks of ``CHUNK`` calls, each behind a fresh device sleep: in one long run the
    launches queue up until the launch queue is full and every later launch waits for the
    device (the first s6 breakdown timed ``torch.zeros(1)`` at 96 µs that way)."""
    res = {}
    for name, fn in calls.items():
        for _ in range(3):
            fn()
        total, done = 0.0, 0
        while done < reps:
            n = min(CHUNK, reps - done)
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda._sleep(10_000_000)  # ~5 ms of device time to queue behind
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            total += time.perf_counter() - t0
            done += n
        res[name] = total * 1e6 / reps
        if device.type == "cuda":
            torch.cuda.synchronize()
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        prog="experiments/host_overhead.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--steps", type=int, default=20, help="profiled steps (default 20)")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1024, help="batch x sequence (default 1024)")
    ap.add_argument("--top", type=int, default=45, help="rows per table (default 45)")
    ap.add_argument("--reps", type=int, default=200, help="calls per op timing (default 200)")
    ap.add_argument("--options", default="{}", help="hotcompile options (JSON)")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="write the report here too")
    a = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = Stack(a.dim, a.depth).to(device)
    x = torch.randn(a.tokens // 128 or 1, 128, a.dim, device=device)
    options = json.loads(a.options)
    compiled = torch.compile(model, backend="hot", options=options)
    step = step_fn(compiled, x, device)
    for _ in range(warmup_steps_needed(4, options)):  # past LQS calibration and INT8 warm-up
        step()
    wall = step_wall_us(step, a.steps, device)
    text, per_step = profile_steps(step, a.steps, device, a.top)
    costs = op_call_cost(device, a.reps)
    parts = part_costs(device, a.reps) if device.type == "cuda" else {}
    head = [
        f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}; "
        f"torch {torch.__version__}; {datetime.date.today()}; commit {_commit()}; "
        f"{a.depth} blocks, dim {a.dim}, {a.tokens} tokens",
        f"host time per compiled step under cProfile: {per_step:.0f} µs "
        f"({4 * a.depth + 1} HOT linears)",
        f"wall time per compiled step without the profiler: {wall:.0f} µs",
        "host µs per op call (device queued ahead): "
        + ", ".join(f"{k} {v:.0f}" for k, v in costs.items()),
    ]
    if parts:
        head += ["", "host µs per call of the pieces under the ops (device queued ahead):"]
        head += [f"  {v:8.1f}  {k}" for k, v in parts.items()]
    report = "\n".join(head) + "\n" + text
    print(report)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "host_overhead.txt").write_text(report)
    return {"per_step_us": per_step, "wall_us": wall, "op_us": costs, "part_us": parts}


if __name__ == "__main__":
    sys.exit(0 if main() else 1)

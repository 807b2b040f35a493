"""Does inductor launch HOT's Triton kernels through its static launcher? (issue 34, session 33.)

Session 32's generated code and profile put HOT's user-defined Triton launches at ~28 µs of
host time each against ~12 for inductor's own kernels, and the Llama's hot_fp8 step waited
1.2-1.4 ms longer on the host than torchao's. In torch 2.11-2.14 inductor launches its own
kernels through ``StaticallyLaunchedCudaKernel`` but user-defined ones (``triton_op`` /
``wrap_triton``: all of HOT's quantizers) through Triton's Python launcher, unless
``torch._inductor.config.static_launch_user_defined_triton_kernels`` is on (default off).

This compiles a SwiGLU MLP stack with ``backend="hot"`` (``forward="fp8"``, every layer HOT)
with the option off and on, each run in a process of its own, in the order ``--order`` gives
(default off, on, on, off: session 33's first version ran both in one process, and its two
calls disagreed as the order would explain). Per run it prints why inductor bypassed the
static launcher (its INFO log, counted by reason), the host time to issue one training step
(no synchronisation inside it; median of 20) and the step's time on the GPU; then whether
all runs' gradients are the same bits.

    python3 experiments/static_launch.py [--dims 1024 4096 --tokens 4096 --layers 4 --order 0110]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import statistics
import subprocess
import time

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # the launcher's log in-process

import torch  # noqa: E402


class _Reasons(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "Bypassing" in msg:
            self.counts[msg.split(" due to ")[-1][:80]] += 1


def _model(d: int, h: int, layers: int) -> torch.nn.Module:
    from test_lowering import SwiGLU

    torch.manual_seed(0)
    blocks = [SwiGLU(d, h) for _ in range(layers)]
    return torch.nn.Sequential(*blocks).cuda()


def run(static: bool, args) -> tuple[dict, list[torch.Tensor]]:
    import hotcompile  # noqa: F401  (registers backend="hot")

    torch._dynamo.reset()
    model = _model(args.dims[0], args.dims[1], args.layers)
    opts = {
        "forward": "fp8",
        "prefer": "memory",
        "weight_scale": "maxabs",  # SAWB's float atomics would make the two runs differ
        "inductor_config": {
            "static_launch_user_defined_triton_kernels": static,
            "fx_graph_cache": False,
        },
    }
    step_model = torch.compile(model, backend="hot", options=opts)
    x = torch.randn(args.tokens, args.dims[0], device="cuda")
    handler = _Reasons()
    log = logging.getLogger("torch._inductor.runtime.triton_heuristics")
    log.addHandler(handler)
    old = log.level
    log.setLevel(logging.INFO)

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            loss = step_model(x).float().square().mean()
        loss.backward()

    try:
        step()  # compiles
    finally:
        log.removeHandler(handler)
        log.setLevel(old)
    host, gpu = [], []
    for _ in range(20):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        step()
        host.append((time.perf_counter() - t0) * 1e3)
        b.record()
        torch.cuda.synchronize()
        gpu.append(a.elapsed_time(b))
    grads = [p.grad.detach().clone() for p in model.parameters()]
    out = {
        "bypassed": dict(handler.counts),
        "host_ms": statistics.median(host),
        "gpu_ms": statistics.median(gpu),
    }
    return out, grads


def _child(static: bool, args, grads_file: str) -> None:
    res, grads = run(static, args)
    torch.save(grads, grads_file)
    print("RESULT " + json.dumps(res), flush=True)


def main(argv: list[str] | None = None) -> int:
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", type=int, nargs=2, default=(1024, 4096), metavar=("D", "H"))
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument(
        "--order", default="0110", help="settings in run order, one process each (1: static)"
    )
    ap.add_argument("--child", choices=("0", "1"), help=argparse.SUPPRESS)
    ap.add_argument("--grads", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        _child(args.child == "1", args, args.grads)
        return 0
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, SwiGLU x{args.layers} "
        f"{args.dims}, {args.tokens} tokens, forward=fp8, prefer=memory, weight_scale=maxabs; "
        f"one process per run, order {args.order}"
    )
    grads: list[list[torch.Tensor]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, setting in enumerate(args.order):
            gfile = f"{tmp}/grads{k}.pt"
            cmd = [sys.executable, __file__, "--child", setting, "--grads", gfile,
                   "--dims", *map(str, args.dims), "--tokens", str(args.tokens),
                   "--layers", str(args.layers)]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            res = json.loads(out.split("RESULT ", 1)[1])
            print(
                f"run {k} static_launch_user_defined_triton_kernels={setting == '1'}: host "
                f"{res['host_ms']:.2f} ms to issue a step, GPU {res['gpu_ms']:.2f} ms; "
                f"bypassed: {res['bypassed']}",
                flush=True,
            )
            grads.append(torch.load(gfile))
    same = all(torch.equal(a, b) for g in grads[1:] for a, b in zip(grads[0], g, strict=True))
    print(f"gradients bit-identical across all runs: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

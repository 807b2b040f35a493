"""Does inductor's C++ wrapper (``cpp_wrapper``) run a training step here, and what does it save?

On host-bound steps (ResNet-50 at GPU busy ~50%, GPT-2 small at ~85% in the default mode) the
Python wrapper's per-kernel launches set the step time; inductor's C++ wrapper launches the
same kernels from generated C++. On the H100 (torch 2.11.0+cu130, 2026-11-27, run 28) plain
``torch.compile(model, options={"cpp_wrapper": True})`` failed on both models with
``AssertionError: CudaKernelParamCache not populated for triton_poi_fused_...``: the kernel's
launch parameters are recorded when the wrapper autotunes at compile time, and that did not
happen. This probe tries the settings that decide it, each in a fresh process (the static CUDA
launcher is read from the environment at import):

- ``cpp``: ``cpp_wrapper`` alone (run 28's failure);
- ``cpp+autotune``: with ``triton.autotune_at_compile_time=True``;
- ``cpp+nostatic``: with ``TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0``;
- ``cpp+both``: both;

on a host-bound model (a stack of small LayerNorm-GELU-Linear blocks, many short kernels) with
plain inductor and with ``backend="hot"`` (``prefer="paper"``: HOT's ``triton_op`` kernels in
the graph too). Each row: ran or the error, compile seconds, median step ms against the Python
wrapper's in the same process, and whether the gradients equal the Python wrapper's.

    python3 experiments/cpp_wrapper_probe.py [--out FILE.md]

``--check-only`` runs the plumbing on the CPU (inductor's C++ wrapper exists for CPU code too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS: dict[str, tuple[dict[str, object], dict[str, str]]] = {
    "cpp": ({"cpp_wrapper": True}, {}),
    "cpp+autotune": ({"cpp_wrapper": True, "triton.autotune_at_compile_time": True}, {}),
    "cpp+nostatic": ({"cpp_wrapper": True}, {"TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER": "0"}),
    "cpp+both": (
        {"cpp_wrapper": True, "triton.autotune_at_compile_time": True},
        {"TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER": "0"},
    ),
}


def _model(device: str):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.LayerNorm(256), nn.Linear(256, 256), nn.GELU()) for _ in range(16)]
    return nn.Sequential(*blocks, nn.Linear(256, 16)).to(device)


def _run(backend: str, options: dict, device: str, steps: int) -> dict:
    """Compile, one warm-up step, then ``steps`` timed steps; grads of the last step."""
    import torch

    torch._dynamo.reset()
    model = _model(device)
    x = torch.randn(64, 256, device=device)
    kw = {"backend": "hot", "options": {"prefer": "paper", "inductor_config": options}}
    if backend == "inductor":
        kw = {"options": options} if options else {}
    step_fn = torch.compile(model, **kw)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device, torch.bfloat16, enabled=device == "cuda"):
            loss = step_fn(x).float().square().mean()
        loss.backward()

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    step()
    sync()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    grads = [p.grad.float().cpu() for p in model.parameters()]
    return {"compile_s": compile_s, "step_ms": statistics.median(times), "grads": grads}


def child(setting: str, backend: str, device: str, steps: int) -> None:
    """One setting in this process: the Python wrapper first (the reference), then C++."""
    import torch

    options, _ = SETTINGS[setting]
    ref = _run(backend, {}, device, steps)
    try:
        got = _run(backend, options, device, steps)
    except Exception as e:  # the row reports it
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:160]}"
        print(json.dumps({"ok": False, "error": msg, "ref_ms": ref["step_ms"]}))
        return
    same = all(torch.equal(a, b) for a, b in zip(ref["grads"], got["grads"], strict=True))
    print(json.dumps({
        "ok": True, "ref_ms": ref["step_ms"], "ms": got["step_ms"],
        "compile_s": got["compile_s"], "ref_compile_s": ref["compile_s"], "same_grads": same,
    }))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", help="also write the table to this markdown file")
    ap.add_argument("--check-only", action="store_true", help="CPU, 2 steps: the plumbing only")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--child", nargs=3, metavar=("SETTING", "BACKEND", "DEVICE"),
                    help=argparse.SUPPRESS)  # fmt: skip
    args = ap.parse_args()
    if args.child:
        child(*args.child, steps=args.steps)
        return
    import torch

    device = "cpu" if args.check_only else "cuda"
    steps = 2 if args.check_only else args.steps
    settings = ["cpp"] if args.check_only else list(SETTINGS)
    head = (f"{torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}, torch "
            f"{torch.__version__}, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    lines = [f"# inductor's C++ wrapper on a host-bound step ({head})", "",
             "| setting | backend | result | step ms (Python wrapper) | compile s | same grads |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for setting in settings:
        for backend in ("inductor", "hot"):
            env = {**os.environ, **SETTINGS[setting][1]}
            cmd = [sys.executable, __file__, "--child", setting, backend, device,
                   "--steps", str(steps)]  # fmt: skip
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            last = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if not last:
                tail = (p.stderr.strip().splitlines() or ["no output"])[-1][:160]
                row = f"| {setting} | {backend} | crashed: {tail} | - | - | - |"
            else:
                r = json.loads(last[-1])
                if r["ok"]:
                    row = (
                        f"| {setting} | {backend} | ran | {r['ms']:.2f} ({r['ref_ms']:.2f}) | "
                        f"{r['compile_s']:.1f} ({r['ref_compile_s']:.1f}) | {r['same_grads']} |"
                    )
                else:
                    row = (
                        f"| {setting} | {backend} | {r['error']} | - ({r['ref_ms']:.2f}) | - | - |"
                    )
            print(row, flush=True)
            lines.append(row)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Run the test-suite on a CUDA machine and record the result.

    python tools/gpu_tests.py [--out DIR] [pytest args...]

Runs ``pytest tests`` (the CPU suite plus tests/test_gpu.py, which only runs with a GPU) and
writes ``gpu_tests.md`` with the device, torch/triton versions, date and the pytest summary
into DIR (default tools/results). Exit status is pytest's.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import re
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "tools" / "results"))
    args, pytest_args = ap.parse_known_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        *pytest_args,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (out / "gpu_tests.log").write_text(log)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    summary = [
        line
        for line in log.splitlines()
        if re.search(r"\d+ (passed|failed|skipped|errors?|deselected)", line)
    ]
    report = [
        "# hotcompile test-suite on a GPU machine",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"- device: {device}",
        f"- torch: {torch.__version__} (CUDA {torch.version.cuda}), triton {triton_version}",
        f"- python: {platform.python_version()}",
        f"- command: `{' '.join(cmd[2:])}`",
        f"- exit status: {proc.returncode}",
        "",
        "```",
        *(summary[-1:] or ["(no pytest summary line)"]),
        "```",
        "",
        "Failures and skips (from `-rs` and the failure summary):",
        "",
        "```",
        *[line for line in log.splitlines() if line.startswith(("FAILED", "ERROR", "SKIPPED"))],
        "```",
    ]
    (out / "gpu_tests.md").write_text("\n".join(report) + "\n")
    print(log[-6000:])
    print("\n".join(report))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())

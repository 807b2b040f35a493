"""Run hotcompile's GPU tests on a CUDA machine and record the result in one markdown file.

    python tools/gpu_tests.py [--out DIR] [--files a.py,b.py] [--timeout S] [pytest args...]

Runs each ``tests/*_gpu.py`` file (and tests/test_gpu.py) in its own pytest process with its own
time limit, so one slow or crashing file (a C++ extension that aborts the process, say) costs
only its own row, and writes ``gpu_tests.md`` into DIR (default tools/results): device,
torch/triton/CUDA versions, date, the git commit, and per file the pytest summary line, the
failures and skips. Each file's full log goes next to it (``gpu_tests_<file>.log``). The CPU
suite runs in CI; ``--all`` adds ``tests`` as a whole (every CPU test too) as a last row.

Before the tests it builds the JIT extensions (CUTLASS needs ``pip install nvidia-cutlass``)
so the first test does not pay minutes of compile time inside its own limit. Exit status: 0
when every file passed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import re
import subprocess
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _gpu_files() -> list[str]:
    files = sorted(p.name for p in (ROOT / "tests").glob("test_*gpu*.py"))
    return files


def _commit() -> str:
    if os.environ.get("HOTCOMPILE_COMMIT"):  # a `git archive` snapshot has no .git
        return os.environ["HOTCOMPILE_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown (no git)"


def _build() -> list[str]:
    lines = []
    for name in ("hq_cuda", "cutlass"):
        t0 = time.perf_counter()
        try:
            mod = __import__(f"hotcompile.kernels.{name}", fromlist=["build"])
            ok = mod.build()
            why = "" if ok else f" ({mod.error()})"
            lines.append(f"- {name}: {'built' if ok else 'unavailable'}{why}, "
                         f"{time.perf_counter() - t0:.0f} s")  # fmt: skip
        except Exception as e:  # noqa: BLE001 - recorded, the tests still run
            lines.append(f"- {name}: {type(e).__name__}: {e}")
    return lines


def _write_report(out, commit, builds, rows, details, pytest_args) -> str:
    """Write gpu_tests.md (after every file, so a run cut short still leaves its rows)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    report = [
        "# hotcompile's GPU tests on a GPU machine (tools/gpu_tests.py)",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"- commit: {commit}",
        f"- device: {device}",
        f"- torch: {torch.__version__} (CUDA {torch.version.cuda}), triton {triton_version}",
        f"- python: {platform.python_version()}",
        f"- extra pytest args: `{' '.join(pytest_args)}`"
        if pytest_args
        else "- extra pytest args: none",
        "",
        "JIT builds before the tests:",
        "",
        *builds,
        "",
        "| file | result | seconds |",
        "|---|---|---|",
        *rows,
        "",
        *(["## Failures and skips", "", *details] if details else []),
    ]
    text = "\n".join(report) + "\n"
    (out / "gpu_tests.md").write_text(text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__,
        epilog="examples:\n"
        "  python3 tools/gpu_tests.py --out $OUT                     # every GPU test file\n"
        "  python3 tools/gpu_tests.py --files test_gpu.py,test_lowering_gpu.py --timeout 400\n"
        "  python3 tools/gpu_tests.py --files test_kernels_gpu.py -k hla   # pytest args pass on\n"
        "  python3 tools/gpu_tests.py --all --out $OUT               # + the CPU suite last",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--out", default=str(ROOT / "tools" / "results"), help="default tools/results")
    ap.add_argument("--files", default=None, help="comma-separated test files (default: GPU ones)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per file (default 300)")
    ap.add_argument("--all", action="store_true", help="also run the whole suite as a last row")
    args, pytest_args = ap.parse_known_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = args.files.split(",") if args.files else _gpu_files()
    targets = [f"tests/{f}" for f in files] + (["tests"] if args.all else [])
    builds = _build() if torch.cuda.is_available() else ["- no CUDA device: nothing built"]
    rows, details, status = [], [], 0
    commit, text = _commit(), ""
    for target in targets:
        cmd = [sys.executable, "-m", "pytest", target, "-q", "-rs", "-p", "no:cacheprovider"]
        cmd += pytest_args
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=args.timeout)  # fmt: skip
            log, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            log = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else ""
            log += f"\n(timed out after {args.timeout} s)"
            rc = -1
        dt = time.perf_counter() - t0
        name = pathlib.Path(target).stem if target != "tests" else "all"
        (out / f"gpu_tests_{name}.log").write_text(log)
        summary = [ln for ln in log.splitlines()
                   if re.search(r"\d+ (passed|failed|skipped|errors?|deselected)", ln)]  # fmt: skip
        crashed = "Fatal Python error" in log or rc < 0
        verdict = "crashed" if crashed and rc != -1 else ("timed out" if rc == -1 else "")
        line = (summary[-1].strip("= ") if summary else "(no pytest summary)") + (
            f" — {verdict}" if verdict else ""
        )
        rows.append(f"| {target} | {line} | {dt:.0f} |")
        bad = [ln for ln in log.splitlines() if ln.startswith(("FAILED", "ERROR", "SKIPPED"))]
        if bad:
            details += [f"### {target}", "", "```", *bad[:60], "```", ""]
        status = status or (rc != 0)
        print(f"{target}: {line} ({dt:.0f} s)", flush=True)
        text = _write_report(out, commit, builds, rows, details, pytest_args)
    print(text or _write_report(out, commit, builds, rows, details, pytest_args))
    return int(status)


if __name__ == "__main__":
    sys.exit(main())

"""Where a late host spends a step: read a profiler timeline (``tools/bench_distributed.py
--profile N --profile-trace`` writes one per rank, ``*.trace.json.gz``) and say, per step,

1. what the host did at the top level of each thread (FSDP2's hooks, the compiled regions,
   the optimizer, the Python between them): host ms and kernel launches per name, and
2. what the host was inside when the GPU sat idle waiting for a launch: each idle gap of the
   GPU (all streams merged) whose next kernel was launched after the gap began is charged to
   the launching thread's enclosing events at that launch (outermost, then innermost), and
3. what each kind of kernel launch costs the host inside the compiled regions (forward:
   ``Torch-Compiled Region``, backward: ``CompiledFunctionBackward``): the host time from the
   previous launch's end to this one's, by kernel class — the Python of inductor's wrapper
   between launches included.

Session 37's tables said hot_fp8's GPU idles 18-44 ms a step under FSDP2 on two H200s (torchao
3 ms) with about as many launches; they could not say where on the host the time goes. An
experiment, not a maintained tool: its output is read once per question.

    python3 experiments/host_timeline.py profile_llama_hot_fp8.trace.json.gz --steps 2
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
import bench_train  # noqa: E402 (tools/ is not a package)

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATS = {"cpu_op", "user_annotation", "python_function"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}


def _short(name: str, n: int = 70) -> str:
    name = re.sub(r"\d+/\d+", "N/N", name)  # compiled regions: frame/recompile ids
    name = re.sub(r"## Call CompiledFxGraph \w+ ##", "CompiledFxGraph", name)
    return name if len(name) <= n else name[: n - 1] + "…"


def kernel_class(name: str) -> str:
    """A GPU event's class for the launch-cost table: ``tools/bench_train.py``'s classes
    (what its profile tables add up), with HOT's kernels by name and NCCL, copies and memsets
    apart from the rest of "other"."""
    cls = bench_train.kernel_class(name)
    if cls == "HOT's Triton/CUDA kernels":
        return f"HOT: {re.sub(r'_[0-9]+$', '', name)}"
    if cls.startswith("other"):
        if "nccl" in name.lower():
            return "NCCL"
        if name.startswith(("Memcpy", "Memset")):
            return name.split(" (")[0]
    return cls


def launch_costs(events: list[dict], steps: int) -> list[str]:
    """Per step and region kind: host ms, launches and µs a launch by kernel class."""
    xs = [e for e in events if e.get("ph") == "X"]
    gpu = {
        e["args"]["correlation"]: e["name"]
        for e in xs
        if e.get("cat") in GPU_CATS and "correlation" in e.get("args", {})
    }
    launches = sorted(
        (e for e in xs if e.get("cat") in LAUNCH_CATS and e["args"].get("correlation") in gpu),
        key=lambda e: e["ts"],
    )
    kinds = {
        "forward": "Torch-Compiled Region",
        "backward": "autograd::engine::evaluate_function: CompiledFunctionBackward",
    }
    lines = []
    for kind, prefix in kinds.items():
        regions = sorted(
            (e for e in xs if e["name"].startswith(prefix)), key=lambda e: (e["tid"], e["ts"])
        )
        outer, last = [], None  # a region inside another of its kind counts once, as that one
        for r in regions:
            if last is None or r["tid"] != last["tid"] or r["ts"] >= last["ts"] + last["dur"]:
                outer.append(r)
                last = r
        regions = outer
        cost: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        host = 0.0
        for r in regions:
            prev, end = r["ts"], r["ts"] + r["dur"]
            host += r["dur"]
            for le in launches:
                if le["tid"] == r["tid"] and r["ts"] <= le["ts"] <= end:
                    c = cost[kernel_class(gpu[le["args"]["correlation"]])]
                    c[0] += le["ts"] + le["dur"] - prev
                    c[1] += 1
                    prev = le["ts"] + le["dur"]
        n = sum(c[1] for c in cost.values())
        lines += [
            "",
            f"{kind} regions: host {host / steps / 1e3:.2f} ms, {n / steps:.0f} launches a step;"
            " host ms, launches and µs a launch by kernel class:",
        ]
        for k, (us, cnt) in sorted(cost.items(), key=lambda kv: -kv[1][0])[:10]:
            lines.append(f"  {us / steps / 1e3:8.2f} {cnt / steps:7.0f} {us / cnt:7.1f}  {k}")
    return lines


def load(path: str) -> list[dict]:
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return json.load(f)["traceEvents"]


def analyse(events: list[dict], steps: int, top: int = 15) -> str:
    host: dict[int, list[dict]] = collections.defaultdict(list)
    gpu, launch_at = [], {}
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        if cat in HOST_CATS:
            host[e["tid"]].append(e)
        elif cat in GPU_CATS:
            gpu.append(e)
        elif cat in LAUNCH_CATS and "correlation" in e.get("args", {}):
            launch_at[e["args"]["correlation"]] = e
    # per thread: events sorted, each with its parent chain (the profiler nests by time)
    chains: dict[int, tuple[list[float], list[list[dict]]]] = {}
    top_level: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for tid, evs in host.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        starts, paths = [], []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if not stack:
                top_level[f"[{tid % 1000}] {_short(e['name'])}"][0] += e["dur"]
            stack.append(e)
            starts.append(e["ts"])
            paths.append(list(stack))
        chains[tid] = (starts, paths)

    def context(tid: int, ts: float) -> list[dict]:
        starts, paths = chains.get(tid, ([], []))
        i = bisect.bisect_right(starts, ts) - 1
        while i >= 0:
            path = [e for e in paths[i] if e["ts"] + e["dur"] >= ts]
            if path:
                return path
            i -= 1
        return []

    # launches per top-level event
    for le in launch_at.values():
        path = context(le["tid"], le["ts"])
        if path:
            top_level[f"[{le['tid'] % 1000}] {_short(path[0]['name'])}"][1] += 1
    gpu.sort(key=lambda e: e["ts"])
    idle_by = collections.Counter()
    idle_inner = collections.Counter()
    idle_total = late_total = 0.0
    end = gpu[0]["ts"] + gpu[0]["dur"] if gpu else 0.0
    for e in gpu[1:]:
        gap = e["ts"] - end
        if gap > 2.0:
            idle_total += gap
            le = launch_at.get(e.get("args", {}).get("correlation"))
            if le is not None and le["ts"] > end:  # launched after the GPU went idle
                late = min(gap, le["ts"] - end)
                late_total += late
                path = context(le["tid"], le["ts"])
                outer = _short(path[0]["name"]) if path else "?"
                inner = _short(path[-1]["name"]) if path else "?"
                idle_by[outer] += late
                idle_inner[f"{outer}  >  {inner}"] += late
        end = max(end, e["ts"] + e["dur"])
    lines = [
        f"GPU idle {idle_total / steps / 1e3:.2f} ms a step; of it, the next launch not yet "
        f"made: {late_total / steps / 1e3:.2f} ms",
        "",
        "GPU idle waiting for a launch, by the host's outermost event at that launch (ms/step):",
    ]
    lines += [f"  {v / steps / 1e3:8.2f}  {k}" for k, v in idle_by.most_common(top)]
    lines += ["", "... by outermost > innermost event (ms/step):"]
    lines += [f"  {v / steps / 1e3:8.2f}  {k}" for k, v in idle_inner.most_common(top)]
    lines += ["", "host top-level events per thread [tid]: host ms/step, launches/step:"]
    rows = sorted(top_level.items(), key=lambda kv: -kv[1][0])[: 2 * top]
    lines += [f"  {v[0] / steps / 1e3:8.2f} {v[1] / steps:7.0f}  {k}" for k, v in rows]
    return "\n".join(lines + launch_costs(events, steps))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", help="*.trace.json[.gz] files")
    p.add_argument("--steps", type=int, default=2, help="profiled steps in each trace")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args()
    for t in args.traces:
        print(f"== {t}\n{analyse(load(t), args.steps, args.top)}\n")


if __name__ == "__main__":
    main()

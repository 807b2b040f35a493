"""Data-parallel training with ``backend="hot"``: DDP or FSDP2, step time, memory, loss curves.

Launch one process per GPU with torchrun; every process trains the same model on its own
batches (weak scaling: the batch *per GPU* is fixed), rank 0 writes the results:

  torchrun --nproc-per-node 2 tools/bench_distributed.py --wrapper ddp --out runs/ddp_n2
  torchrun --nproc-per-node 1 tools/bench_distributed.py --wrapper ddp --out runs/ddp_n1
  python tools/bench_distributed.py --merge runs/ddp_n1/*.json runs/ddp_n2/*.json --out runs/ddp

Models (tools/bench_models.py, random init, nothing downloaded):
  llama    HF LlamaForCausalLM, hidden 2048, MLP 8192, 8 layers, seq 2048, batch 4 per GPU,
           trained on bytes of the Python stdlib (tools/accuracy.py's corpus: a fixed, real
           text, vocabulary 256 of the model's 32000)
  vit_b16  timm ViT-B/16, 224x224, batch 128 per GPU, on a fixed pool of 8 random batches
           per rank (random images, random labels: the loss falls as the model memorises)

Variants: inductor (torch.compile), hot (backend="hot" plus --hot-options), hot_fp8 (the same
with forward="fp8": FP8 forward GEMMs, issue 34), hot_fp8_lean (forward="fp8" with the SwiGLU's
inputs saved as FP8 codes and down's ABC codes re-derived in the backward: less memory for a
little time), hot_fp8_lean_noreuse (the same with inductor's allow_buffer_reuse off: each
buffer freed at its last use), hot_fp8_static (HOT's Triton kernels launched by inductor's
static launcher, not Triton's Python one: less host time a launch) -- the options are
tools/bench_train.py's variants of those names, under --hot-options --, torchao_float8
(torchao.float8.convert_to_float8_training, tensorwise, every nn.Linear but the head, then
torch.compile; skipped with a message when torchao is missing).

Wrappers: ddp (torch.compile(DDP(model)); --ddp-order compiled-ddp: DDP(torch.compile(model)))
with bf16 autocast; fsdp2 (fully_shard per transformer block, then the root, with
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); --fp32-params on the CPU), then
torch.compile of the root. Every fully_shard module call is a graph break, and Dynamo runs a
frame that loops over such calls eagerly: timm's ViT calls its blocks through nn.Sequential
(x = self.blocks(x)) and HF's Llama loops in LlamaModel, which has no layer of its own, so
every layer reaches the backend; a hot record's eager_layers lists any that did not
(hotcompile.eager_frames()).

Measured: median step time over the timed steps (after --warmup steps that compile), per-rank
peak GPU memory (torch.cuda.max_memory_allocated over the timed steps), the loss of every step
(averaged over the ranks). Written to --out: bench_distributed.json, bench_distributed.md (device,
torch, commit — git or HOTCOMPILE_COMMIT —, date, command) and loss_curves.png. --merge takes
several JSON files (a 1-process and an N-process run) and adds the weak-scaling efficiency
(1-GPU step time) / (N-GPU step time) per model, variant and wrapper.
--profile N: N more steps under torch.profiler after the timed ones, each rank's written as
profile_<model>_<variant>[_rank<r>].txt (tools/bench_train.py's tables: GPU-busy time against
wall time, what the GPU waited for, the top kernels and host operators), with a table of every
rank's summary: under a wrapper, a step the GPU waits on the host for shows here, and which
rank's host the others wait for in the collectives. --profile-trace: each rank's whole
timeline as well (.trace.json.gz).

--smoke: a CPU check of the whole path in under two minutes (gloo, tiny models, aot_eager,
a few steps, fp32 FSDP2 parameters); its timings mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import pathlib
import platform
import socket
import statistics
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_models  # noqa: E402  (the models bench_train trains)
import bench_train  # noqa: E402
from bench_train import (  # noqa: E402
    VariantSkipped,
    WithLoss,
    convert_float8,
    plan_record,
    profile_steps_of,
)
from gpu_tests import _commit  # noqa: E402

#: options each hot variant adds to --hot-options: bench_train's variants of the same name (hot_fp8:
#: issue 34's FP8 forward; the lean ones its memory-first plans), so both benches run one plan
HOT_VARIANTS: dict[str, dict[str, Any]] = {
    v: bench_train.VARIANTS[v] or {}
    for v in (
        "hot", "hot_fp8", "hot_fp8_lean", "hot_fp8_lean_noreuse", "hot_fp8_static",
        # session 38: the 8B widths' plan between the two, and the weight codes made in the
        # forward (fewer launches in the backward, where FSDP2's step waits on the host)
        "hot_fp8_swiglu_noreuse", "hot_fp8_forward_codes",
    )
}  # fmt: skip
VARIANTS = ("inductor", *HOT_VARIANTS, "torchao_float8")
MODELS = ("llama", "vit_b16")
WRAPPERS = ("ddp", "fsdp2")


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks FSDP2 shards one by one (HF Llama's layers, timm's blocks)."""
    inner = model.model if isinstance(model, WithLoss) else model
    if hasattr(inner, "model") and hasattr(inner.model, "layers"):
        return list(inner.model.layers)
    return list(inner.blocks)


def _batches(name: str, per_rank: int, quick: bool, rank: int, device: torch.device):
    """Endless (inputs, targets) for this rank: stdlib bytes for llama, a fixed pool for ViT."""
    spec = bench_models.MODELS[name]
    gen = torch.Generator().manual_seed(1000 + rank)
    if name == "llama":
        import accuracy  # tools/accuracy.py: the stdlib byte corpus

        seq = spec.batch(1, quick, gen)[0].shape[1]
        text = accuracy.load_text("lib", "train", 4_000_000 if not quick else 200_000)
        for x, y in accuracy.batches(text, seq, per_rank, gen):
            yield x.to(device), y.to(device)
    pool = [spec.batch(per_rank, quick, gen) for _ in range(8)]
    i = 0
    while True:
        x, y = pool[i % len(pool)]
        i += 1
        yield x.to(device), y.to(device)


def hot_options(given: str, variant: str) -> dict[str, Any]:
    """The hot backend's options of ``variant``: ``--hot-options`` (JSON), then the variant's
    own on top; their ``inductor_config`` dicts merge (the variant's keys win), so that e.g.
    ``'{"inductor_config": {"static_launch_user_defined_triton_kernels": true}}'`` reaches
    the variants that set an inductor option of their own (hot_fp8_lean_noreuse's)."""
    opts = dict(json.loads(given)) if given else {}
    own = HOT_VARIANTS[variant]
    config = {**opts.get("inductor_config", {}), **own.get("inductor_config", {})}
    opts.update(own)
    if config:
        opts["inductor_config"] = config
    return opts


def build(args: argparse.Namespace, name: str, variant: str, device: torch.device):
    """The wrapped, compiled training module and the parameters to optimise."""
    spec = bench_models.MODELS[name]
    torch.manual_seed(0)
    core = spec.build(args.smoke)
    info: dict[str, Any] = {}
    if variant == "torchao_float8":
        info["float8"] = convert_float8(core, spec.classifier, emulate=device.type != "cuda")
    model = WithLoss(core).to(device)
    backend: dict[str, Any] = {}
    if variant in HOT_VARIANTS:
        opts = hot_options(args.hot_options, variant)
        if args.smoke:
            opts.setdefault("compiler", "aot_eager")
        backend = {"backend": "hot", "options": opts}
        info["hot_options"] = opts
    elif args.smoke:
        backend = {"backend": "aot_eager_decomp_partition"}
    if args.wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        kw: dict[str, Any] = {"device_ids": [device.index] if device.type == "cuda" else None}
        if args.bucket_mb:
            kw["bucket_cap_mb"] = args.bucket_mb
        if args.ddp_order == "compiled-ddp":
            run = DDP(torch.compile(model, **backend), **kw)
        else:
            run = torch.compile(DDP(model, **kw), **backend)
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        bf16 = not args.fp32_params
        mp = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32
        )
        for blk in blocks_of(model):
            fully_shard(blk, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        run = torch.compile(model, **backend)
        info["param_dtype"] = "bfloat16" if bf16 else "float32"
    return run, model, info


def wrapper_label(args: argparse.Namespace) -> str:
    """``ddp``, ``ddp 250MB`` (DDP with --bucket-mb: results of other bucket sizes stay apart
    in a merge) or ``fsdp2``."""
    if args.wrapper == "ddp" and args.bucket_mb:
        return f"ddp {args.bucket_mb:g}MB"
    return args.wrapper


#: counters of torch.cuda.memory_stats whose growth over the timed steps means the step left
#: the caching allocator's fast path: cudaMalloc / cudaFree calls, and the retries that free
#: cached blocks (a device-wide synchronization) before allocating again
ALLOCATOR_COUNTS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


def _allocator_counts(device: torch.device) -> dict[str, int]:
    stats = torch.cuda.memory_stats(device)
    return {k: int(stats.get(k, 0)) for k in ALLOCATOR_COUNTS}


def _release(device: torch.device) -> float | None:
    """Free what earlier variants of this process left (their models and optimizers can sit
    in reference cycles until a collection) and say how many GiB are still allocated.

    The variants share one process, and a peak is ``max_memory_allocated``: memory an earlier
    variant still holds counts in a later one's peak (session 36: 2.5 GiB more for the
    variants after hot_fp8_lean_noreuse in two runs of three). What is left after the
    collection is recorded with the peak (``held_at_start_gib``) and flagged in the table."""
    gc.collect()
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(device) / 2**30


def run_one(args: argparse.Namespace, name: str, variant: str, device: torch.device) -> dict:
    """Train one (model, variant) and measure it; every rank returns the same record."""
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = bench_models.MODELS[name]
    per_rank = args.batch or (spec.quick_batch if args.smoke else spec.default_batch)
    rec: dict[str, Any] = {"model": name, "variant": variant, "wrapper": wrapper_label(args)}
    rec.update(world=world, batch_per_rank=per_rank, steps=args.steps, warmup=args.warmup)
    if variant in HOT_VARIANTS:  # this run's plans only (the process keeps every compiled graph's)
        import hotcompile

        hotcompile.clear_plans()
    rec["held_at_start_gib"] = _release(device)
    try:
        run, model, info = build(args, name, variant, device)
    except VariantSkipped as e:
        return {**rec, "skipped": str(e)}
    rec.update(info)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    autocast = args.wrapper == "ddp" and device.type == "cuda"
    data = _batches(name, per_rank, args.smoke, rank, device)
    losses, times = [], []

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = run(x, y)
        loss.backward()
        opt.step()
        return loss

    before: dict[str, int] = {}
    for step in range(args.warmup + args.steps):
        if step == args.warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            before = _allocator_counts(device)
        x, y = next(data)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss = train_step(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        losses.append(loss.detach().float())
    if before:  # the caching allocator's slow paths during the timed steps (rank 0's)
        after = _allocator_counts(device)
        rec["allocator"] = {k: after[k] - before[k] for k in before}
    if args.profile:  # every rank steps (the collectives need them all) and writes its tables
        title = f"{name} {variant} {rec['wrapper']} x{world} rank {rank}"
        path = args.out / f"profile_{name}_{variant}{f'_rank{rank}' if rank else ''}.txt"
        prof = profile_steps_of(
            lambda: train_step(*next(data)), args.profile, device, title, path, args.profile_trace
        )
        keys = ("wall_ms", "gpu_busy_ms", "gpu_busy_fraction", "idle_ms", "host_wait_ms")
        mine = {k: prof[k] for k in keys}
        # every rank's summary: a rank whose host is late makes the others wait inside the
        # collectives (session 36: rank 0's NCCL kernels took 2-4x inductor's), so rank 0's
        # tables alone cannot say which rank's host holds the step
        every = [None] * world
        dist.all_gather_object(every, mine)
        rec["profile"] = mine | {"top_host_ops": prof["top_host_ops"]}
        rec["profile_by_rank"] = every
    curve = torch.stack(losses)
    dist.all_reduce(curve)
    curve /= world
    peak = torch.tensor(
        [torch.cuda.max_memory_allocated(device) if device.type == "cuda" else -1.0],
        device=device,
    )
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    step_ms = 1e3 * statistics.median(times)
    medians = [None] * world  # each rank's median (every step ends in a synchronize)
    dist.all_gather_object(medians, step_ms)
    rec.update(
        step_ms=step_ms,
        step_ms_by_rank=medians,
        losses=[round(v, 5) for v in curve.tolist()],
        peak_gib=[p.item() / 2**30 if p.item() >= 0 else None for p in peaks],
    )
    if variant in HOT_VARIANTS:
        import hotcompile

        plans = hotcompile.plans()
        layers = plan_record(plans)
        rec["hot_layers"] = len(layers["hot_layers"])
        rec["layers"] = len(plans)
        rec["hot_layer_names"] = layers["hot_layers"]
        rec["fp8_forward_layers"] = layers["fp8_forward_layers"]
        # why the others keep bf16 (the speed gate's times; DDPOptimizer's pieces can split
        # layers that share one x, e.g. q/k/v, each piece charged its own ABC of x)
        rec["kept_bf16"] = layers["skip_reasons"]
        # one plan for all ranks (the speed gate takes rank 0's verdicts: gate.agree)
        mine = sorted((p.name, p.path) for p in plans)
        every = [None] * world
        dist.all_gather_object(every, mine)
        rec["plans_agree"] = all(other == mine for other in every)
        # layers a frame that Dynamo ran eagerly calls itself: never seen by the backend
        eager = hotcompile.eager_frames()
        rec["eager_layers"] = [f"{f.function}: {layer}" for f in eager for layer in f.layers]
    return rec


# ----------------------------------------------------------------------------- reporting


def environment(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {
        "device": f"{name or 'cpu'} ({device.type})",
        "torch": torch.__version__,
        "commit": _commit(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(["torchrun" if "LOCAL_RANK" in os.environ else "python", *sys.argv]),
        "world": dist.get_world_size() if dist.is_initialized() else None,
        "smoke": bool(args.smoke),
        # rank 0's CPUs under --pin-cores (each rank had a slice of its own), else None
        "pinned_cpus": getattr(args, "pinned", None),
        "versions": bench_models.versions(),
    }


def add_scaling(results: list[dict]) -> list[dict]:
    """Weak-scaling efficiency of each run: (1-process step) / (this run's step), matched on
    model, variant, wrapper and batch per rank."""
    one = {
        (r["model"], r["variant"], r["wrapper"], r["batch_per_rank"]): r["step_ms"]
        for r in results
        if r.get("world") == 1 and r.get("step_ms")
    }
    for r in results:
        base = one.get((r["model"], r["variant"], r["wrapper"], r.get("batch_per_rank")))
        r["scaling"] = base / r["step_ms"] if base and r.get("step_ms") else None
    return results


def _pinned_note(cpus: list[int] | None) -> str:
    return f", each rank pinned to its own cores (rank 0: {len(cpus)} CPUs)" if cpus else ""


def _peak_held(r: dict[str, Any]) -> tuple[float | None, float]:
    """A variant's highest per-rank peak (GiB; None without allocator statistics) and what
    an earlier variant still held at its start, which that peak includes."""
    peaks = [p for p in r.get("peak_gib") or [] if p is not None]
    return (max(peaks) if peaks else None), r.get("held_at_start_gib") or 0.0


def _own_peak(r: dict[str, Any]) -> float | None:
    """A variant's highest per-rank peak less what an earlier variant still held at its
    start (GiB), or None without allocator statistics."""
    peak, held = _peak_held(r)
    return peak - held if peak is not None else None


def _vs_torchao(r: dict[str, Any], ao: dict[str, Any] | None) -> str:
    """The cell of ``r`` against torchao float8's run ``ao`` (same wrapper and world):
    torchao's step over this one's, this peak over torchao's."""
    if ao is None or r is ao:
        return "-"
    cell = f"{ao['step_ms'] / r['step_ms']:.3f}x"
    mine, theirs = _own_peak(r), _own_peak(ao)
    return cell + (f", peak {mine / theirs:.3f}x" if mine and theirs else "")


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    envs = env if isinstance(env, list) else [env]
    lines = ["# bench_distributed", ""]
    for e in envs:
        lines.append(
            f"- {e['device']}, torch {e['torch']}, commit {e['commit']}, {e['date']}, "
            f"world {e['world']}{' (smoke: timings mean nothing)' if e['smoke'] else ''}"
            f"{_pinned_note(e.get('pinned_cpus'))}: `{e['command']}`"
        )
    lines += [
        "",
        "| model | wrapper | variant | GPUs | batch/GPU | step (median) | vs inductor | "
        "vs torchao float8 | scaling | peak/GPU | loss first → last | HOT layers |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {
        (r["model"], r["wrapper"], r["world"]): r.get("step_ms")
        for r in res["results"]
        if r["variant"] == "inductor"
    }
    rival = {
        (r["model"], r["wrapper"], r["world"]): r
        for r in res["results"]
        if r["variant"] == "torchao_float8" and r.get("step_ms")
    }
    for r in res["results"]:
        if r.get("skipped") or r.get("error"):
            why = r.get("skipped") or r["error"].strip().splitlines()[-1]
            lines.append(
                f"| {r['model']} | {r['wrapper']} | {r['variant']} | {r['world']} | "
                f"{r['batch_per_rank']} | {'skipped' if r.get('skipped') else 'failed'}: {why} "
                "| | | | | | |"
            )
            continue
        b = base.get((r["model"], r["wrapper"], r["world"]))
        loss = r["losses"]
        hot = f"{r['hot_layers']} of {r['layers']}" if "hot_layers" in r else "-"
        if r.get("plans_agree") is False:
            hot += " (**plans differ across ranks**)"
        if r.get("eager_layers"):
            hot += f" (eager, no HOT: {', '.join(r['eager_layers'])})"
        scaling = r.get("scaling")
        step = r["step_ms"]
        top, held = _peak_held(r)
        peak = f"{top:.2f} GiB" if top is not None else "-"
        if held > 0.05:  # an earlier variant's memory is in this peak
            peak += f" (incl. {held:.2f} held at start)"
        ao = rival.get((r["model"], r["wrapper"], r["world"]))
        lines.append(
            f"| {r['model']} | {r['wrapper']} | {r['variant']} | {r['world']} | "
            f"{r['batch_per_rank']} | {r['step_ms']:.1f} ms | "
            f"{f'{b / step:.2f}x' if b else '-'} | {_vs_torchao(r, ao)} | "
            f"{f'{scaling:.2f}' if scaling else '-'} | "
            f"{peak} | {loss[0]:.3f} → {loss[-1]:.3f} | {hot} |"
        )
    lines += [
        "",
        "Step: median wall time of the timed steps (zero_grad, forward + loss, backward, "
        "AdamW). vs inductor: inductor's step / this step (same wrapper and GPU count). "
        "vs torchao float8: torchao's step / this step, and this peak / torchao's, each peak "
        "less what was held at start (same wrapper and GPU count; issue 34 wants the FP8 "
        "forward above 1 in step and below 1 in peak). "
        "Scaling: weak scaling, (1-GPU step) / (N-GPU step) at the same batch per GPU. "
        "Peak: the highest rank's max_memory_allocated over the timed (and profiled) steps; "
        "'held at start': memory still allocated when the variant began, after a garbage "
        "collection (an earlier variant's), which the peak includes. Loss: averaged over "
        "ranks, first and last step (warm-up included).",
    ]
    profiled = [r for r in res["results"] if r.get("profile")]
    if profiled:
        lines += [
            "",
            "Profiled steps (--profile, rank 0; the profiler's own cost per launch raises "
            "every wall time, most where there are the most launches):",
            "",
            "| model | variant | GPUs | wall | GPU busy | GPU idle | of it, waiting for a host "
            "launch |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in profiled:
            p = r["profile"]
            busy = p.get("gpu_busy_fraction")
            lines.append(
                f"| {r['model']} | {r['variant']} | {r['world']} | {p['wall_ms']:.1f} ms | "
                f"{p['gpu_busy_ms']:.1f} ms{f' ({busy:.0%})' if busy else ''} | "
                f"{p['idle_ms']:.1f} ms | {p['host_wait_ms']:.1f} ms |"
            )
        ranked = [r for r in profiled if len(r.get("profile_by_rank") or []) > 1]
        if ranked:
            lines += [
                "",
                "Every rank's profiled steps (the rank whose GPU waits longest on its own host "
                "is the one the others wait for in the collectives; each rank's tables are in "
                "`profile_<model>_<variant>[_rank<r>].txt`):",
                "",
                "| model | variant | rank | step (median, timed) | wall | GPU busy | GPU idle | "
                "of it, waiting for a host launch |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for r in ranked:
                steps = r.get("step_ms_by_rank") or [None] * len(r["profile_by_rank"])
                for k, (p, t) in enumerate(zip(r["profile_by_rank"], steps)):
                    lines.append(
                        f"| {r['model']} | {r['variant']} | {k} | "
                        f"{f'{t:.1f} ms' if t is not None else '-'} | {p['wall_ms']:.1f} ms | "
                        f"{p['gpu_busy_ms']:.1f} ms | {p['idle_ms']:.1f} ms | "
                        f"{p['host_wait_ms']:.1f} ms |"
                    )
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in results if r.get("losses")})
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models):
        for r in results:
            if r["model"] == m and r.get("losses"):
                label = f"{r['variant']} {r['wrapper']} x{r['world']}"
                ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=label)
        ax.set(title=m, xlabel="step", ylabel="loss (mean over ranks)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(res: dict[str, Any], out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_distributed.json").write_text(json.dumps(res, indent=1))
    (out / "bench_distributed.md").write_text(markdown(res))
    plot(res["results"], out / "loss_curves.png")
    print(f"wrote {out}/bench_distributed.{{json,md}} and loss_curves.png", flush=True)


def merge(paths: list[str], out: pathlib.Path) -> dict[str, Any]:
    parts = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    results = [r for p in parts for r in p["results"]]
    res = {"environment": [p["environment"] for p in parts], "results": add_scaling(results)}
    write(res, out)
    return res


# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n", 2)[2] + "\nexamples:\n"
        "  torchrun --nproc-per-node 2 tools/bench_distributed.py --wrapper fsdp2 --out r/f2\n"
        "  torchrun --nproc-per-node 2 tools/bench_distributed.py --smoke --out /tmp/bd\n"
        "  python tools/bench_distributed.py --merge r/f1/bench_distributed.json "
        "r/f2/bench_distributed.json --out r/fsdp2\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--wrapper", choices=WRAPPERS, default="ddp")
    p.add_argument(
        "--ddp-order",
        choices=("ddp-compiled", "compiled-ddp"),
        default="ddp-compiled",
        help="ddp-compiled: torch.compile(DDP(model)) (default); compiled-ddp: DDP(compile(m))",
    )
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=None,
        help="DDP's bucket_cap_mb (default: DDP's 25). DDPOptimizer splits the compiled graph "
        "at buckets; one block's gradients per bucket keeps layers that share an input (q/k/v, "
        "gate/up) in one piece, so HOT quantizes that input once",
    )
    p.add_argument("--steps", type=int, default=200, help="timed steps (default 200)")
    p.add_argument("--warmup", type=int, default=5, help="untimed first steps (compile)")
    p.add_argument("--batch", type=int, default=None, help="batch per GPU (default: model's)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timed steps, N more under torch.profiler (every rank writes "
        "profile_<model>_<variant>[_rank<r>].txt to --out: GPU-busy time against wall time, "
        "the GPU's waits on the host, the top kernels and host operators; bench_train's "
        "tables; the results table gets every rank's summary)",
    )
    p.add_argument(
        "--profile-trace",
        action="store_true",
        help="with --profile: each rank also writes the profiler's timeline, "
        "profile_<model>_<variant>[_rank<r>].trace.json.gz (open in Perfetto or chrome://tracing; "
        "about 1 MB a profiled step): where a late host spends its time",
    )
    p.add_argument(
        "--pin-cores",
        action="store_true",
        help="pin each local rank to its own slice of the physical cores (SMT siblings "
        "together): a host-bound step is paced by the slowest rank's host; this rules core "
        "sharing in or out (on 2 x H200 the ranks' hosts still ran at different speeds)",
    )
    p.add_argument("--hot-options", default="", help='JSON options, e.g. \'{"prefer": "paper"}\'')
    p.add_argument("--fp32-params", action="store_true", help="FSDP2 without bf16 parameters")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench_distributed_out"))
    p.add_argument("--merge", nargs="+", metavar="JSON", help="merge runs, add the scaling")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="CPU check: gloo, tiny models, aot_eager, 4 steps, fp32 FSDP2 parameters",
    )
    return p


def physical_cores(cpus: set[int], sysfs: str = "/sys/devices/system/cpu") -> list[list[int]]:
    """``cpus`` grouped by physical core (SMT siblings together), in core order; a CPU whose
    topology cannot be read is a core of its own."""
    cores: dict[tuple[int, int], list[int]] = {}
    for c in sorted(cpus):
        try:
            top = pathlib.Path(sysfs, f"cpu{c}", "topology")
            key = (
                int((top / "physical_package_id").read_text()),
                int((top / "core_id").read_text()),
            )
        except (OSError, ValueError):
            key = (1 << 30, c)  # after the known cores
        cores.setdefault(key, []).append(c)
    return [cores[k] for k in sorted(cores)]


def pin_cores(local_rank: int, local_world: int) -> list[int] | None:
    """Pin this process (and the threads it starts after this) to its own share of the
    physical cores it may run on: local rank r of n takes the r-th of n equal slices, SMT
    siblings included, so no two ranks share a core. Why: under FSDP2 the step of a HOT plan
    waits on the host, and one rank's host ran ~1.6x slower than the other's in the same run
    (session 38's timelines: 6.5 against 4.0 ms a block's backward), which paces both. This
    rules core sharing in or out; on 2 × H200 it did not even the ranks (session 38, call
    3b). Returns the CPUs kept, or None (not pinned) when there are fewer cores than ranks."""
    cores = physical_cores(os.sched_getaffinity(0))
    if len(cores) < local_world:
        return None
    per = len(cores) // local_world
    mine = [c for core in cores[local_rank * per : (local_rank + 1) * per] for c in core]
    os.sched_setaffinity(0, mine)
    return mine


def _init() -> torch.device:
    """The process group (torchrun's env, or a 1-process group) and this rank's device."""
    if "RANK" not in os.environ:  # plain `python`: one process
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    return device


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = build_parser().parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    if args.smoke:
        args.steps = min(args.steps, 4)
        args.warmup = min(args.warmup, 2)
        args.fp32_params = True
    if args.profile_trace and not args.profile:
        build_parser().error("--profile-trace writes the timelines of --profile N's steps")
    if args.pin_cores and hasattr(os, "sched_setaffinity"):
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        args.pinned = pin_cores(int(os.environ.get("LOCAL_RANK", 0)), local_world)
    device = _init()
    rank = dist.get_rank()
    results = []
    try:
        for name in args.models:
            missing = bench_models.missing(bench_models.MODELS[name])
            for variant in args.variants:
                base = {"model": name, "variant": variant, "wrapper": wrapper_label(args)}
                base.update(world=dist.get_world_size(), batch_per_rank=args.batch)
                if missing:
                    results.append({**base, "skipped": missing})
                    continue
                if rank == 0:
                    print(f"[bench_distributed] {name} {variant} {base['wrapper']} ...", flush=True)
                torch._dynamo.reset()
                try:
                    rec = run_one(args, name, variant, device)
                except Exception:  # noqa: BLE001 - recorded; the other variants still run
                    rec = {**base, "error": traceback.format_exc()}
                    print(rec["error"], file=sys.stderr, flush=True)
                results.append(rec)
                if rank == 0 and rec.get("step_ms"):
                    print(f"  step {rec['step_ms']:.1f} ms, loss {rec['losses'][-1]:.3f}")
                if rank == 0:  # after every variant: a run stopped later keeps what finished
                    write({"environment": environment(args, device), "results": results}, args.out)
        res = {"environment": environment(args, device), "results": add_scaling(results)}
        if rank == 0:
            write(res, args.out)
        return res
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One training step of whole models: ``torch.compile(backend="hot")`` vs plain inductor.

The per-layer benchmark (tools/bench_layers.py) times HOT's backward ops in isolation; what a
user feels is the whole training step. This script trains two models for a few steps each,
plain ``torch.compile(model)`` (inductor) and ``torch.compile(model, backend="hot")``, and
compares:

  step time     median wall time of N whole steps (zero_grad, forward + loss under bf16
                autocast, backward, fused AdamW step), each step bracketed by
                torch.cuda.synchronize() + time.perf_counter(), after warm-up steps that
                compile the graphs and finish HOT's LQS calibration (its first backward per
                layer runs the exact g_x while it measures; see HotConfig.lqs_calibration_steps
                and .warmup_steps, which the warm-up count is derived from).
  peak memory   torch.cuda.max_memory_allocated over the timed steps (stats reset after the
                warm-up): weights, gradients, AdamW state and activations together.
  saved bytes   what the compiled training graph keeps for its backward, read off the autograd
                graph of one extra forward (hotcompile.memory.saved_activation_bytes: every
                tensor saved by the compiled graph's backward node, once per storage, the
                model's parameters excluded; the bf16 weight copies autocast makes are
                included and reported apart as "param-shaped"). On CUDA it is cross-checked by
                the allocator: memory_allocated after that forward minus before it (gradients
                freed, optimizer state alive on both sides).

Models (defined here, no downloads, no timm): ViT-B/16 (conv patch embed 16x16, class token,
learned positions, 12 pre-norm blocks of hotcompile.demo.Block, dim 768, 12 heads, MLP 3072,
224x224 images, 1000 classes, batch 128) and GPT-2 small (12 causal blocks, d 768, 12 heads,
seq 1024, vocab 50257, learned positions, head tied to the token embedding, batch 8). Inputs
are random tensors (fixed per model); both variants start from the same initial weights. The
loss (cross-entropy) is compiled with the model, as a training loop would.

Targets (the issue's): step time >= 1.15x faster, saved-activation bytes >= 25% lower and
peak memory >= 20% lower than plain inductor. Each is reported met or missed, and by how much.

Writes OUT/bench_train.json and OUT/bench_train.md (device, torch, triton, date). A variant
that fails (compile error, out of memory) is recorded with its error; the others still run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import pathlib
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import hotcompile
from hotcompile.config import HotConfig
from hotcompile.demo import Block
from hotcompile.memory import saved_tensors

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gpu_tests import _commit  # noqa: E402  (one way to name the commit: env or git)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
GIB = 1024**3

#: the issue's targets: hot vs plain inductor
TARGET_SPEEDUP = 1.15  # inductor step time / hot step time, at least
TARGET_SAVED_RATIO = 0.75  # hot saved-activation bytes / inductor's, at most (>= 25% lower)
TARGET_PEAK_RATIO = 0.80  # hot peak memory / inductor's, at most (>= 20% lower)


# ----------------------------------------------------------------------------- models


def _init_weights(model: nn.Module) -> None:
    """GPT-2/ViT-style init (normal 0.02, zero biases): realistic activation and gradient
    scales matter to HOT, whose LQS picks quantizers from the gradients it sees."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


class ViT(nn.Module):
    """ViT-B/16-shaped classifier (timm's ``vit_base_patch16_224`` layout, pre-norm blocks from
    ``hotcompile.demo.Block``; LayerNorm eps 1e-5 instead of timm's 1e-6, no dropout)."""

    def __init__(
        self,
        img: int = 224,
        patch: int = 16,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        mlp: int = 3072,
        classes: int = 1000,
        chans: int = 3,
    ) -> None:
        super().__init__()
        self.patch = nn.Conv2d(chans, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, (img // patch) ** 2 + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        _init_weights(self)
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.cls, std=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


class GPT2(nn.Module):
    """GPT-2-small-shaped decoder: token + learned position embeddings, causal SDPA blocks
    (``hotcompile.demo.Block(causal=True)``), final LayerNorm, LM head tied to the token
    embedding (as GPT-2 does). Vocabulary 50257 is kept unpadded: HOT pads it internally."""

    def __init__(
        self,
        vocab: int = 50257,
        ctx: int = 1024,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        tied: bool = True,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, 4 * dim, causal=True) for _ in range(depth))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        _init_weights(self)
        if tied:
            self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class WithLoss(nn.Module):
    """Model + cross-entropy in one module, so that the loss is compiled with the model (the
    logits of GPT-2 are 0.8 GB in bf16: leaving the loss eager would dominate memory)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        return F.cross_entropy(logits.float().flatten(0, -2), target.flatten())


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A benchmarked model: how to build it and a batch for it, full-size and tiny (--quick)."""

    name: str
    description: str
    build: Callable[[bool], nn.Module]
    batch: Callable[[int, bool, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    default_batch: int
    quick_batch: int


def _vit(quick: bool) -> nn.Module:
    if quick:
        return ViT(img=32, patch=8, dim=64, depth=2, heads=4, mlp=128, classes=10)
    return ViT()


def _vit_batch(b: int, quick: bool, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    img, classes = (32, 10) if quick else (224, 1000)
    return torch.randn(b, 3, img, img, generator=gen), torch.randint(classes, (b,), generator=gen)


def _gpt2(quick: bool) -> nn.Module:
    if quick:  # vocab 257: not a multiple of 16, like 50257, so HOT's padding path runs
        return GPT2(vocab=257, ctx=64, dim=64, depth=2, heads=4)
    return GPT2()


def _gpt2_batch(b: int, quick: bool, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    vocab, ctx = (257, 64) if quick else (50257, 1024)
    tokens = torch.randint(vocab, (b, ctx + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


MODELS: dict[str, ModelSpec] = {
    "vit_b16": ModelSpec(
        "vit_b16",
        "ViT-B/16 (defined here: conv patch embed, 12 blocks, dim 768, 12 heads, MLP 3072, "
        "224x224, 1000 classes)",
        _vit,
        _vit_batch,
        128,
        4,
    ),
    "gpt2_small": ModelSpec(
        "gpt2_small",
        "GPT-2 small (defined here: 12 causal blocks, d 768, 12 heads, seq 1024, vocab 50257, "
        "tied head)",
        _gpt2,
        _gpt2_batch,
        8,
        2,
    ),
}


# ----------------------------------------------------------------------------- variants

#: variant name -> hotcompile options (None: plain inductor). ``hot_nocheck`` turns off the
#: NaN/Inf check (on CUDA a non-blocking copy per HOT backward op, no device sync).
VARIANTS: dict[str, dict[str, Any] | None] = {
    "inductor": None,
    "inductor_cg": None,
    "hot": {},
    "hot_nocheck": {"check_nonfinite": "off"},
    "hot_cg": {"mode": "reduce-overhead"},
    "hot_unary": {"abc_recompute": "unary"},
    "hot_unary_cg": {"abc_recompute": "unary", "mode": "reduce-overhead"},
    "hot_views": {"abc_recompute": "views"},
    "hot_views_cg": {"abc_recompute": "views", "mode": "reduce-overhead"},
    "hot_lowpass_cg": {"hla_signs": False, "mode": "reduce-overhead"},
}

#: the inductor mode of the plain variants (``torch.compile(model, mode=...)``)
PLAIN_MODES: dict[str, str | None] = {"inductor": None, "inductor_cg": "reduce-overhead"}


def baseline_of(variant: str) -> str:
    """The plain variant whose run ``variant``'s ratios and targets are taken against: CUDA
    graphs on both sides (a hot variant with ``mode="reduce-overhead"`` → ``inductor_cg``),
    or on neither (``inductor``, also for the plain variants themselves)."""
    hot_with_graphs = VARIANTS[variant] is not None and uses_cudagraphs(variant)
    return "inductor_cg" if hot_with_graphs else "inductor"


VARIANT_NOTES: dict[str, str] = {
    "inductor": "`torch.compile(model)`, bf16 autocast",
    "hot": '`torch.compile(model, backend="hot")` with default options (INT4 g_x with LQS, '
    "HLA + INT8 g_w, ABC-compressed saved inputs; check_nonfinite='once': a non-blocking "
    "flag copy per HOT backward op) plus --hot-options",
    "hot_nocheck": "as hot, with check_nonfinite='off' (no NaN/Inf flag copies)",
    "inductor_cg": '`torch.compile(model, mode="reduce-overhead")`: inductor with CUDA graphs '
    "(no per-kernel launch cost on the host)",
    "hot_cg": 'as hot, with options={"mode": "reduce-overhead"}: HOT\'s backward recorded into '
    "CUDA graphs too; judged against inductor_cg",
    "hot_unary": 'as hot, with abc_recompute="unary" (the default since 2026-11-22: fc2\'s ABC '
    "codes recomputed in the backward from fc1's output, saved anyway for the activation's "
    "backward, instead of saved)",
    "hot_unary_cg": 'as hot_cg, with abc_recompute="unary"; judged against inductor_cg',
    "hot_views": 'as hot, with abc_recompute="views" (the default until 2026-11-22: only '
    "view/copy chains recomputed)",
    "hot_views_cg": 'as hot_cg, with abc_recompute="views"; judged against inductor_cg',
    "hot_lowpass_cg": "as hot_cg, with hla_signs=False (the paper's low-pass HLA everywhere, "
    "the default until 2026-11-22; the default signs only differ on layers fed by a token "
    "embedding: the GPT-2's)",
}


def uses_cudagraphs(variant: str) -> bool:
    """Whether the variant compiles with ``mode="reduce-overhead"`` (CUDA graphs): its
    training loop must then mark each step's beginning."""
    opts = VARIANTS[variant]
    mode = PLAIN_MODES.get(variant) if opts is None else opts.get("mode")
    return mode == "reduce-overhead"


def compile_variant(
    module: nn.Module, variant: str, compiler: str, extra: dict[str, Any] | None = None
) -> nn.Module:
    """``torch.compile(module)`` or ``torch.compile(module, backend="hot", options=...)``.

    ``extra`` (``--hot-options``) adds hotcompile options to every hot variant.
    ``compiler="aot_eager"`` (the --quick default on CPU) swaps inductor's code generation out
    on both sides (plain: ``aot_eager_decomp_partition``; hot: ``options={"compiler":
    "aot_eager"}``): the same decompositions, partitioner and saved tensors, no C++/Triton
    compile. Its timings mean nothing; it checks the plumbing.
    """
    options = VARIANTS[variant]
    if options is None:
        if compiler == "inductor":
            return torch.compile(module, mode=PLAIN_MODES[variant])
        return torch.compile(module, backend="aot_eager_decomp_partition")
    return torch.compile(module, backend="hot", options=hot_options(variant, compiler, extra))


def hot_options(variant: str, compiler: str, extra: dict[str, Any] | None) -> dict[str, Any]:
    """The ``options`` dict a hot variant compiles with (recorded in the JSON)."""
    opts = {**(VARIANTS[variant] or {}), **(extra or {})}
    if compiler != "inductor":
        opts["compiler"] = compiler
        opts.pop("mode", None)  # an inductor mode; aot_eager generates no code to graph
    return opts


def warmup_steps_needed(requested: int, extra: dict[str, Any] | None = None) -> int:
    """Warm-up long enough to compile (step 1), finish LQS calibration and HOT's INT8 warm-up
    (``HotConfig`` with ``extra``), plus one steady step: timed steps then run the final
    quantizers, as in a long training run."""
    cfg = HotConfig.from_options(extra)
    return max(requested, cfg.lqs_calibration_steps + cfg.warmup_steps + 2)


# ----------------------------------------------------------------------------- measurement


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fused_adamw(params: list[nn.Parameter], device: torch.device) -> tuple[Any, bool]:
    """AdamW with ``fused=True`` where this torch supports it on ``device``."""
    try:
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.05, fused=True), True
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.05), False


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if enabled:
        try:
            from tqdm.auto import tqdm

            return tqdm(total=total, desc=desc, unit="step", leave=True, dynamic_ncols=True)
        except ImportError:
            pass

    class _NoBar:
        def update(self, n: int = 1) -> None: ...
        def set_postfix(self, **kw: Any) -> None: ...
        def close(self) -> None: ...

    return _NoBar()


def _saved_bytes(loss: torch.Tensor, module: nn.Module) -> tuple[int, int]:
    """(saved bytes, of which param-shaped) behind ``loss``, the parameters themselves excluded.

    Param-shaped tensors are the bf16 weight casts autocast makes and the graph keeps for
    g_x; they are counted (they are saved) but reported apart (they are not activations).
    """
    params = list(module.parameters())
    exclude = {p.untyped_storage().data_ptr() for p in params}
    # matrices only: a (1, tokens, dim) position table would match batch-1 activations
    shapes = {tuple(p.shape) for p in params if p.dim() >= 2 and p.shape[0] > 1}
    total = param_shaped = 0
    for s in saved_tensors(loss):
        if s.storage in exclude:
            continue
        total += s.nbytes
        if s.shape in shapes:
            param_shaped += s.nbytes
    return total, param_shaped


#: kernels of HOT's own backward ops, by name (CUDA, CUTLASS, Triton kernels and the cuBLAS
#: FP8/INT8 GEMMs behind torch._scaled_mm / torch._int_mm): for the "HOT kernels" share only
HOT_KERNEL_MARKERS = ("hq_", "hla", "_scaled_gemm", "cutlass", "amax_to_scale", "e4m3", "i8i8")


def _merged_us(spans: list[tuple[float, float]]) -> float:
    """Microseconds covered by the union of (start, end) spans (streams may overlap)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _outermost_hot_op(event: Any) -> bool:
    """A ``hotcompile::`` op event not nested in another (a reference calling ``int_gemm`` or
    ``hla_grad_weight``): its host and device time already count in the outer op's."""
    if not event.name.startswith("hotcompile::"):
        return False
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("hotcompile::"):
            return False
        parent = parent.cpu_parent
    return True


def profile_steps_of(
    step: Callable[[], torch.Tensor],
    n: int,
    device: torch.device,
    title: str,
    out_file: pathlib.Path | None,
) -> dict[str, Any]:
    """Run ``n`` more steps under ``torch.profiler`` and say where a step's time goes.

    A step is device-bound when its kernels keep the GPU busy for most of its wall time; when
    the GPU-busy time is well below the wall time, the host (Python, the dispatcher, kernel
    launches) is what the step waits on, and faster kernels would not help. Reported per step:
    wall time (profiler on, so a little above the timed median), GPU-busy time (union of kernel
    spans), the kernels taking the most device time, the ``hotcompile::`` ops (host time spent
    in them and device time of the kernels they launch), and the operators taking the most
    host time. ``out_file``: also writes the tables there as text.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    _sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        _sync(device)
        wall_us = (time.perf_counter() - t0) * 1e6 / n
    events = prof.events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    by_kernel: dict[str, list[float]] = {}
    for e in kernels:
        by_kernel.setdefault(e.name, []).append(e.time_range.elapsed_us())
    kernel_us = sum(sum(v) for v in by_kernel.values())
    top_kernels = sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))[:20]
    hot_us = sum(
        sum(v) for k, v in by_kernel.items() if any(m in k.lower() for m in HOT_KERNEL_MARKERS)
    )
    ops: dict[str, dict[str, float]] = {}
    for e in events:
        if e.device_type == DeviceType.CPU and _outermost_hot_op(e):
            o = ops.setdefault(e.name, {"calls": 0, "host_us": 0.0, "device_us": 0.0})
            o["calls"] += 1
            o["host_us"] += e.cpu_time_total
            o["device_us"] += e.device_time_total
    avgs = [a for a in prof.key_averages() if a.device_type == DeviceType.CPU]
    top_cpu = sorted(avgs, key=lambda a: -a.self_cpu_time_total)[:15]
    res = {
        "steps": n,
        "wall_ms": wall_us / 1e3,
        "gpu_busy_ms": _merged_us(spans) / n / 1e3,
        "kernel_ms": kernel_us / n / 1e3,
        "hot_kernel_ms": hot_us / n / 1e3,
        "kernels_per_step": len(kernels) / n,
        "top_kernels": [
            {"name": k[:160], "calls": len(v) / n, "ms": sum(v) / n / 1e3} for k, v in top_kernels
        ],
        "hot_ops": {
            k: {
                "calls": v["calls"] / n,
                "host_ms": v["host_us"] / n / 1e3,
                "device_ms": v["device_us"] / n / 1e3,
            }
            for k, v in sorted(ops.items())
        },
        "top_host_ops": [
            {
                "name": a.key[:160],
                "calls": a.count / n,
                "self_host_ms": a.self_cpu_time_total / n / 1e3,
            }
            for a in top_cpu
        ],
    }
    res["gpu_busy_fraction"] = res["gpu_busy_ms"] / res["wall_ms"] if res["wall_ms"] else None
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(profile_text(title, res))
    return res


def profile_text(title: str, p: dict[str, Any]) -> str:
    """One profile (``profile_steps_of``) as plain-text tables, per step."""
    lines = [
        f"{title}: {p['steps']} profiled steps; per step:",
        f"  wall {p['wall_ms']:.1f} ms, GPU busy {p['gpu_busy_ms']:.1f} ms "
        f"({_fmt(p['gpu_busy_fraction'], '.0%')}), kernels {p['kernel_ms']:.1f} ms in "
        f"{p['kernels_per_step']:.0f} launches, HOT-named kernels {p['hot_kernel_ms']:.1f} ms",
        "",
        "top kernels (device ms per step, calls per step):",
    ]
    lines += [f"  {k['ms']:8.2f} {k['calls']:6.0f}  {k['name']}" for k in p["top_kernels"]]
    if p["hot_ops"]:
        lines += ["", "hotcompile ops (calls, host ms incl. children, device ms of their kernels):"]
        lines += [
            f"  {v['calls']:5.0f} {v['host_ms']:8.2f} {v['device_ms']:8.2f}  {k}"
            for k, v in p["hot_ops"].items()
        ]
    lines += ["", "top host operators (self host ms per step, calls per step):"]
    lines += [
        f"  {a['self_host_ms']:8.2f} {a['calls']:6.0f}  {a['name']}" for a in p["top_host_ops"]
    ]
    return "\n".join(lines) + "\n"


def run_variant(
    spec: ModelSpec,
    variant: str,
    batch: int,
    steps: int,
    warmup: int,
    device: torch.device,
    quick: bool,
    compiler: str,
    seed: int,
    progress: bool,
    extra: dict[str, Any] | None = None,
    profile_steps: int = 0,
    profile_out: pathlib.Path | None = None,
) -> dict[str, Any]:
    """Build a fresh model (same seed: same init), compile it, warm up, time ``steps`` steps;
    with ``profile_steps``, profile that many more (see :func:`profile_steps_of`)."""
    t_variant = time.perf_counter()
    torch._dynamo.reset()
    hotcompile.clear_plans()
    torch.manual_seed(seed)
    model = spec.build(quick).to(device)
    module = WithLoss(model)
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = (t.to(device) for t in spec.batch(batch, quick, gen))
    compiled = compile_variant(module, variant, compiler, extra)
    opt, fused = _fused_adamw(list(module.parameters()), device)
    cuda = device.type == "cuda"
    losses: list[float] = []

    graphs = cuda and compiler == "inductor" and uses_cudagraphs(variant)

    def step() -> torch.Tensor:
        if graphs:  # a new iteration: the previous step's graph outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = compiled(x, y)
        loss.backward()
        opt.step()
        return loss

    bar = _progress(warmup + steps + 1, f"{spec.name} {variant}", progress)
    try:
        warm_times = []
        for i in range(warmup):
            _sync(device)
            t0 = time.perf_counter()
            loss = step()
            _sync(device)
            warm_times.append(time.perf_counter() - t0)
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(phase="compile" if i == 0 else "warm-up", loss=f"{losses[-1]:.3f}")
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(steps):
            _sync(device)
            t0 = time.perf_counter()
            loss = step()
            _sync(device)
            times.append(time.perf_counter() - t0)
            bar.update(1)
            bar.set_postfix(phase="timed", ms=f"{1e3 * times[-1]:.1f}")
        losses.append(loss.item())
        # under CUDA graphs the step's memory lives in the graph pool, allocated while the
        # graphs were recorded (warm-up): replays allocate nothing, so the peak after the reset
        # would show only the optimizer's and the outputs' memory. Not comparable: not given.
        peak = torch.cuda.max_memory_allocated(device) if cuda and not graphs else None
        reserved = torch.cuda.memory_reserved(device) if cuda else None
        prof = None
        if profile_steps:
            title = f"{spec.name} {variant} (batch {batch})"
            path = profile_out / f"profile_{spec.name}_{variant}.txt" if profile_out else None
            prof = profile_steps_of(step, profile_steps, device, title, path)
            bar.set_postfix(phase="profiled")

        if graphs:
            torch.compiler.cudagraph_mark_step_begin()

        # one more forward, kept alive, to read what the graph saves; then finish the step
        opt.zero_grad(set_to_none=True)
        _sync(device)
        before = torch.cuda.memory_allocated(device) if cuda else None
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = compiled(x, y)
        _sync(device)
        after = torch.cuda.memory_allocated(device) if cuda else None
        saved, param_shaped = _saved_bytes(loss, module)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        bar.update(1)
    finally:
        bar.close()

    plans = hotcompile.plans()
    median_s = statistics.median(times)
    result: dict[str, Any] = {
        "step_ms": 1e3 * median_s,
        "step_ms_min": 1e3 * min(times),
        "step_ms_max": 1e3 * max(times),
        "first_step_s": warm_times[0],
        "compile_s": max(warm_times[0] - median_s, 0.0),
        "warmup_s": sum(warm_times),
        "peak_bytes": peak,
        "peak_gib": peak / GIB if peak is not None else None,
        "reserved_bytes": reserved,
        "saved_act_bytes": saved,
        "saved_act_gib": saved / GIB,
        "saved_param_shaped_bytes": param_shaped,
        "fwd_alloc_delta_bytes": (after - before) if cuda else None,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "fused_adamw": fused,
        "params": sum(p.numel() for p in module.parameters()),
    }
    if prof is not None:
        result["profile"] = prof
    result["variant_s"] = time.perf_counter() - t_variant
    if VARIANTS[variant] is not None:
        result["hot_options"] = hot_options(variant, compiler, extra)
        layers = {(p.name, p.path) for p in plans}
        result["hot_layers"] = sorted({n for n, path in layers if path != "skipped"})
        result["skipped_layers"] = sorted({n for n, path in layers if path == "skipped"})
        result["graphs_compiled"] = len({id(r) for r in hotcompile.backend.RECORDS})
        dispatch = sys.modules.get("hotcompile.kernels.dispatch")
        if dispatch is not None:  # which CUDA implementation each layer's stages ran
            result["kernels_ran"] = dispatch.by_layer()
            result["kernel_choices"] = {k: c.impl for k, c in dispatch.choices().items()}
    return result


def _free(device: torch.device) -> None:
    torch._dynamo.reset()
    hotcompile.clear_plans()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- targets


def _ratio_target(ratio: float, limit: float, base_bytes: float) -> dict[str, Any]:
    """A "hot / inductor bytes ≤ limit" target: met, or by how many bytes it is missed."""
    return {
        "target": f"<= {limit} (>= {1 - limit:.0%} lower)",
        "value": ratio,
        "met": ratio <= limit,
        "miss": None
        if ratio <= limit
        else f"{1 - ratio:.1%} lower vs >= {1 - limit:.0%} target "
        f"({fmt_bytes((ratio - limit) * base_bytes)} short)",
    }


def _targets(base: dict[str, Any], hot: dict[str, Any]) -> dict[str, Any]:
    """Ratios hot/inductor and, per target, whether it is met and by how much it is missed."""
    out: dict[str, Any] = {}
    speedup = base["step_ms"] / hot["step_ms"]
    out["step_speedup"] = speedup
    need_ms = base["step_ms"] / TARGET_SPEEDUP
    out["step_speedup_target"] = {
        "target": f">= {TARGET_SPEEDUP}x",
        "value": speedup,
        "met": speedup >= TARGET_SPEEDUP,
        "miss": None
        if speedup >= TARGET_SPEEDUP
        else f"{speedup:.2f}x vs >= {TARGET_SPEEDUP}x: hot needs {need_ms:.1f} ms per step, "
        f"takes {hot['step_ms']:.1f} ms ({hot['step_ms'] - need_ms:.1f} ms too slow)",
    }
    saved = hot["saved_act_bytes"] / base["saved_act_bytes"]
    out["saved_act_ratio"] = saved
    # the same ratio without autocast's bf16 weight copies (not activations): for information
    act_base = base["saved_act_bytes"] - base.get("saved_param_shaped_bytes", 0)
    act_hot = hot["saved_act_bytes"] - hot.get("saved_param_shaped_bytes", 0)
    out["saved_act_ratio_excl_param_shaped"] = act_hot / act_base if act_base > 0 else None
    out["saved_act_target"] = _ratio_target(saved, TARGET_SAVED_RATIO, base["saved_act_bytes"])
    if base.get("peak_bytes") and hot.get("peak_bytes"):
        peak = hot["peak_bytes"] / base["peak_bytes"]
        out["peak_memory_ratio"] = peak
        out["peak_memory_target"] = _ratio_target(peak, TARGET_PEAK_RATIO, base["peak_bytes"])
    else:
        out["peak_memory_ratio"] = None
        out["peak_memory_target"] = {
            "target": f"<= {TARGET_PEAK_RATIO}",
            "value": None,
            "met": None,
            "miss": "not measured (no CUDA device, or CUDA graphs: memory in the graph pool)",
        }
    return out


# ----------------------------------------------------------------------------- report

METHOD = (
    "step: median of N whole training steps (zero_grad(set_to_none), forward + cross-entropy "
    "under torch.autocast(bfloat16), backward, AdamW step), each bracketed by device "
    "synchronize + time.perf_counter, after warm-up steps (compile + HOT's LQS calibration). "
    "compile_s = first step minus the median step. peak: torch.cuda.max_memory_allocated over "
    "the timed steps (reset after warm-up): weights + grads + AdamW state + activations. "
    "saved_act_bytes: hotcompile.memory.saved_tensors on the autograd graph of one extra "
    "forward (the compiled graph's saved tensors, one count per storage, parameters excluded, "
    "autocast's bf16 weight copies included and also given as saved_param_shaped_bytes); "
    "fwd_alloc_delta_bytes: torch.cuda.memory_allocated after minus before that forward "
    '(gradients freed) as a cross-check. CUDA-graph variants (mode="reduce-overhead", '
    "torch.compiler.cudagraph_mark_step_begin() before each step): no peak (their memory is "
    "the graph pool, allocated while recording; replays allocate nothing), reserved_bytes "
    "(torch.cuda.memory_reserved after the timed steps) for information."
)


def fmt_bytes(n: float | None) -> str:
    """Bytes in the largest binary unit below them (quick-mode sizes are KiB, real ones GiB)."""
    if n is None:
        return "-"
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} B" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return str(n)


def _fmt(v: Any, spec: str = ".2f", unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:{spec}}{unit}"


def markdown(res: dict[str, Any]) -> str:
    """The results as a markdown report: header, per-variant table, targets table."""
    lines = [
        '# Training step: backend="hot" vs plain inductor (tools/bench_train.py)',
        "",
        f"Device: {res['device']}; torch {res['torch']}, triton {res['triton']}, "
        f"Python {res['python']}; {res['date']}; commit {res.get('commit', '?')}. "
        f"Compiler: {res['compiler']}; "
        f"{res['steps']} timed steps after {res['warmup']} warm-up steps; bf16 autocast; "
        f"AdamW (fused where available).",
        "",
        f"Method: {res['method']}",
        "",
        "Ratios are hot / inductor (hot_cg / inductor_cg); speed-up is that baseline's step "
        "time / the variant's.",
        "",
        "| model | batch | variant | step (ms) | speed-up | peak | peak ratio "
        "| saved act. | saved ratio | alloc delta | compile (s) | loss first → last |",
        "|" + "---|" * 12,
    ]
    for m in res["models"]:
        for name, v in m["variants"].items():
            base = m["variants"].get(baseline_of(name), {})
            if "error" in v:
                lines.append(
                    f"| {m['name']} | {m['batch']} | {name} | error: "
                    f"{v['error'][:120]} |" + " |" * 8
                )
                continue
            ok = "error" not in base and bool(base)
            sp = base["step_ms"] / v["step_ms"] if ok else None
            pr = v["peak_bytes"] / base["peak_bytes"] if ok and v["peak_bytes"] else None
            sr = v["saved_act_bytes"] / base["saved_act_bytes"] if ok else None
            delta = v["fwd_alloc_delta_bytes"]
            lines.append(
                f"| {m['name']} | {m['batch']} | {name} | {v['step_ms']:.1f} "
                f"| {_fmt(sp, unit='x')} | {fmt_bytes(v['peak_bytes'])} | {_fmt(pr)} "
                f"| {fmt_bytes(v['saved_act_bytes'])} | {_fmt(sr)} | {fmt_bytes(delta)} "
                f"| {v['compile_s']:.1f} | {v['loss_first']:.3f} → {v['loss_last']:.3f} |"
            )
    lines += [
        "",
        f"## Targets (hot vs inductor): step >= {TARGET_SPEEDUP}x faster, saved activations "
        f">= {1 - TARGET_SAVED_RATIO:.0%} lower, peak memory >= {1 - TARGET_PEAK_RATIO:.0%} lower",
        "",
        "| model | variant | speed-up | saved ratio | peak ratio | missed by "
        "| saved ratio w/o weight copies (info) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in res["models"]:
        for name, t in m.get("targets", {}).items():
            cells = []
            misses = []
            for key in ("step_speedup_target", "saved_act_target", "peak_memory_target"):
                tt = t[key]
                mark = "met" if tt["met"] else ("n/a" if tt["met"] is None else "MISSED")
                cells.append(f"{_fmt(tt['value'])} ({mark})")
                if tt["met"] is False:
                    misses.append(tt["miss"])
            lines.append(
                f"| {m['name']} | {name} | "
                + " | ".join(cells)
                + f" | {'; '.join(misses) or '-'} "
                + f"| {_fmt(t.get('saved_act_ratio_excl_param_shaped'))} |"
            )
    profiled = [
        (m, k, v) for m in res["models"] for k, v in m["variants"].items() if "profile" in v
    ]
    if profiled:
        lines += [
            "",
            "## Where a step's time goes (torch.profiler, per step)",
            "",
            "GPU busy = union of kernel spans; well below the wall time means the host (Python, "
            "dispatch, launches) is what the step waits on. HOT ops: host time inside the "
            "`hotcompile::` ops (incl. what they call) and device time of their kernels. "
            "Tables: profile_<model>_<variant>.txt.",
            "",
            "| model | variant | wall (ms) | GPU busy (ms) | busy | kernels / step "
            "| HOT ops host (ms) | HOT ops device (ms) | top kernel |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for m, k, v in profiled:
            p = v["profile"]
            host = sum(o["host_ms"] for o in p["hot_ops"].values())
            dev = sum(o["device_ms"] for o in p["hot_ops"].values())
            top = p["top_kernels"][0] if p["top_kernels"] else None
            top_s = f"{top['name'][:60]} ({top['ms']:.1f} ms)" if top else "-"
            lines.append(
                f"| {m['name']} | {k} | {p['wall_ms']:.1f} | {p['gpu_busy_ms']:.1f} "
                f"| {_fmt(p['gpu_busy_fraction'], '.0%')} | {p['kernels_per_step']:.0f} "
                f"| {host:.1f} | {dev:.1f} | {top_s} |"
            )
    notes = [f"- {m['name']}: {m['description']}; batch {m['batch']}." for m in res["models"]]
    lines += ["", "Models:", "", *notes, "", "Variants:", ""]
    lines += [f"- {k}: {VARIANT_NOTES[k]}" for k in VARIANT_NOTES]
    if res["compiler"] != "inductor":
        lines += [
            "",
            f"**compiler={res['compiler']}: no code generation on either side; the step times "
            "check the plumbing and say nothing about speed. Saved bytes are those inductor's "
            "partitioner would choose.**",
        ]
    lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def _parse_batch(text: str | None, names: list[str]) -> dict[str, int]:
    """``--batch 64`` (every model) or ``--batch vit_b16=64,gpt2_small=4``."""
    if not text:
        return {}
    if "=" not in text:
        return dict.fromkeys(names, int(text))
    out = {}
    for part in text.split(","):
        k, v = part.split("=")
        if k.strip() not in MODELS:
            raise SystemExit(f"--batch: unknown model {k!r}; choose from {', '.join(MODELS)}")
        out[k.strip()] = int(v)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line; ``--help`` prints the module docstring (what, how, targets)."""
    ap = argparse.ArgumentParser(
        prog="tools/bench_train.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  python3 tools/bench_train.py --out $OUT              # GPU: both models, ~5 min\n"
            "  python3 tools/bench_train.py --models vit_b16 --steps 20\n"
            "  python3 tools/bench_train.py --batch vit_b16=64,gpt2_small=4\n"
            "  python3 tools/bench_train.py --variants inductor,hot,hot_nocheck\n"
            "  python3 tools/bench_train.py --quick --out /tmp/bt    # CPU smoke test, < 1 min\n"
        ),
    )
    ap.add_argument("--out", default=str(RESULTS), help="output directory (default: %(default)s)")
    ap.add_argument(
        "--models",
        default=",".join(MODELS),
        help="comma-separated, from: " + ", ".join(MODELS) + " (default: all)",
    )
    ap.add_argument(
        "--variants",
        default="inductor,hot",
        help="comma-separated, from: " + ", ".join(VARIANTS) + " (default: "
        "%(default)s; hot_nocheck = hot with check_nonfinite='off', no device sync)",
    )
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10; quick 3)")
    ap.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="warm-up steps, raised to cover compile + LQS calibration (default: %(default)s)",
    )
    ap.add_argument(
        "--batch",
        default=None,
        help="batch size for every model (64) or per model (vit_b16=64,gpt2_small=4);"
        " defaults: vit_b16 128, gpt2_small 8",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny models (2 blocks, dim 64) and aot_eager compile: a CPU smoke test",
    )
    ap.add_argument(
        "--compiler",
        choices=("inductor", "aot_eager"),
        default=None,
        help="code generation for both variants (default: inductor; --quick: "
        "aot_eager, same partitioner and saved tensors, no C++/Triton compile)",
    )
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument(
        "--hot-options",
        default=None,
        help='extra hotcompile options (JSON) for the hot variants, e.g. \'{"exclude": '
        '["model.head"]}\' or \'{"gx_bits": 8}\'',
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timed steps, profile N more (torch.profiler) and report where a step's "
        "time goes: GPU-busy vs wall (host-bound?), top kernels, hotcompile ops' host and "
        "device time; tables also in OUT/profile_<model>_<variant>.txt (default: off)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every model x variant, write bench_train.json and .md, print the markdown."""
    a = build_parser().parse_args(argv)
    names = [n.strip() for n in a.models.split(",") if n.strip()]
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    for n in names:
        if n not in MODELS:
            raise SystemExit(f"--models: unknown {n!r}; choose from {', '.join(MODELS)}")
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"--variants: unknown {v!r}; choose from {', '.join(VARIANTS)}")
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    compiler = a.compiler or ("aot_eager" if a.quick else "inductor")
    steps = a.steps or (3 if a.quick else 10)
    extra = json.loads(a.hot_options) if a.hot_options else None
    HotConfig.from_options(extra)  # fail now, naming the valid options, not per variant
    warmup = warmup_steps_needed(a.warmup, extra)
    batches = _parse_batch(a.batch, names)
    torch.set_float32_matmul_precision("high")
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "commit": _commit(),
        "command": " ".join(["tools/bench_train.py", *(sys.argv[1:] if argv is None else argv)]),
        "quick": a.quick,
        "compiler": compiler,
        "steps": steps,
        "warmup": warmup,
        "autocast": "bfloat16",
        "method": METHOD,
        "targets": {
            "step_speedup_min": TARGET_SPEEDUP,
            "saved_act_ratio_max": TARGET_SAVED_RATIO,
            "peak_memory_ratio_max": TARGET_PEAK_RATIO,
        },
        "hot_config": HotConfig.from_options(extra).to_options() | {"plan": None},
        "models": [],
    }
    t_start = time.perf_counter()
    for name in names:
        spec = MODELS[name]
        batch = batches.get(name, spec.quick_batch if a.quick else spec.default_batch)
        entry: dict[str, Any] = {
            "name": name,
            "description": spec.description + (" [--quick: tiny dims]" if a.quick else ""),
            "batch": batch,
            "variants": {},
        }
        for variant in variants:
            try:
                entry["variants"][variant] = run_variant(
                    spec,
                    variant,
                    batch,
                    steps,
                    warmup,
                    device,
                    a.quick,
                    compiler,
                    a.seed,
                    not a.no_progress,
                    extra,
                    profile_steps=a.profile,
                    profile_out=pathlib.Path(a.out),
                )
            except Exception as e:  # noqa: BLE001 - recorded, the other variants still run
                entry["variants"][variant] = {
                    "error": f"{type(e).__name__}: {e}"[:2000],
                    "traceback": traceback.format_exc()[-4000:],
                }
                print(f"{name} {variant}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                _free(device)
        entry["targets"] = {}
        for variant, v in entry["variants"].items():
            base = entry["variants"].get(baseline_of(variant))
            if VARIANTS[variant] is None or "error" in v or not base or "error" in base:
                continue
            entry["targets"][variant] = _targets(base, v)
        # the top-level fields: hot vs inductor
        t = entry["targets"].get("hot", {})
        entry["step_speedup"] = t.get("step_speedup")
        entry["peak_memory_ratio"] = t.get("peak_memory_ratio")
        entry["saved_act_ratio"] = t.get("saved_act_ratio")
        entry["targets_met"] = (
            {
                k: t[k]["met"]
                for k in ("step_speedup_target", "saved_act_target", "peak_memory_target")
            }
            if t
            else None
        )
        res["models"].append(entry)
    res["total_s"] = time.perf_counter() - t_start
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_train.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = markdown(res)
    (out / "bench_train.md").write_text(md)
    print(md)
    return res


if __name__ == "__main__":
    main()

"""Per layer: does HOT's backward beat the exact bf16 backward on this GPU? (``prefer="speed"``)

HOT trades two bf16 GEMMs for two low-precision GEMMs (FP8 g_x, INT8 g_w over half the tokens)
plus memory-bound passes (quantize g_y twice, the weight, and the forward's ABC compression).
Which side wins depends on the shape: on H100, large LLM layers win by 1.3–1.6×, ViT-B's
K = 768 layers barely, a classifier head with 1000 outputs or a 3×3 conv not at all. So the
default takes HOT's path only where it is measured faster:

- :func:`measure` (CUDA): both backwards of the layer's shape on random data, each captured in
  a CUDA graph and replayed (device time only: the compiled step launches from inductor's
  wrapper or a graph, not from Python), median of several replays. HOT's side is the native
  path (:mod:`hotcompile.lowering.hot`) with the layer's settings, its forward work included
  (ABC of x, the weight's codes; with ``abc_max_abs="producer"`` not the max-abs of x's
  plain rows, which inductor computes in the kernel that produces x, ``hot.amax_bits``). The
  exact side casts its g_w to the weight's dtype, as autograd does under autocast
  (:func:`_bf16_fn`), and is the faster of the GEMMs as they are and with unaligned dims
  padded, as inductor's shape padding runs them (:func:`_bf16_padded_fn`). Cached per (GPU,
  torch, shape, settings) in memory and in ``~/.cache/hotcompile/gate.json``
  (``HOTCOMPILE_CACHE`` moves it), so a shape is timed once per machine. Under
  ``torch.distributed`` every rank takes rank 0's verdict (:func:`agree`): one plan for all.
- :func:`estimate` (no GPU, e.g. ``hotcompile report`` on meta tensors): a roofline model with
  the H100 rates measured in ``shared/docs/hopper-gemm.md`` (bf16 ~700 TFLOP/s, FP8 ~1150,
  INT8 ~700 on large shapes; ~1.8 TB/s for the quantize passes, as measured; a few µs per kernel).
  It says what to expect; the decision on a GPU is the measured one.

HOT is taken iff ``hot_us <= MARGIN · bf16_us``: a layer HOT does not speed up by at least
3% keeps the exact backward (measurement noise must not flip a layer into a slower path).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import statistics
import threading
import time

import torch

from hotcompile import diskcache

log = logging.getLogger("hotcompile")

#: HOT must be at least this much faster (hot/bf16 time) for the gate to pick it
MARGIN = 0.97
_lock = threading.Lock()
_cache: dict[str, dict[str, float]] | None = None


@dataclasses.dataclass(frozen=True)
class Speed:
    """The gate's verdict for one layer: times of both backwards and how they were obtained."""

    bf16_us: float
    hot_us: float
    source: str  # "measured" (this GPU) or "model" (roofline, H100 constants)
    #: layers whose backward shares one ABC quantization of x, this one included
    #: (``Shape.x_readers``): ``hot_us`` carries 1/shared of that quantization
    shared: int = 1
    #: the forward GEMM both ways (``Shape.forward`` FP8 only; 0 where the forward was not
    #: timed): bf16 (the weight's autocast copy included) and FP8 (both operands' casts and
    #: ``torch._scaled_mm``)
    fwd_bf16_us: float = 0.0
    fwd_fp8_us: float = 0.0
    #: what the FP8 forward costs the *exact* backward more (modelled: :func:`_rederive_us`):
    #: x in bf16, which the bf16 forward wrote anyway and the FP8 forward does not
    rederive_us: float = 0.0

    @property
    def fp8_forward(self) -> bool:
        """The FP8 forward pays for itself beside HOT's backward (which reads ABC's codes of x,
        not x): at least 3% faster than the bf16 forward."""
        return self.fwd_fp8_us > 0 and self.fwd_fp8_us <= MARGIN * self.fwd_bf16_us

    @property
    def fp8_forward_alone(self) -> bool:
        """The FP8 forward pays for itself beside the exact backward (the plan's
        ``fp8_forward`` path): at least 3% faster than the bf16 forward once the backward's
        bf16 x is paid for. Why: on ViT-L/16 (H200 run 44) the gate took 72 layers so at
        ≥3% each on the forward alone, and the step ran 0.97× inductor's: the compiled step
        re-derived each bf16 x in the backward (its 3.4 GiB left the saved tensors), which
        the forward's timing did not see."""
        fp8 = self.fwd_fp8_us + self.rederive_us
        return self.fwd_fp8_us > 0 and fp8 <= MARGIN * self.fwd_bf16_us

    @property
    def step_hot_us(self) -> float:
        """HOT's side of the layer's whole step: its backward plus the forward it would run."""
        return self.hot_us + (self.fwd_fp8_us if self.fp8_forward else self.fwd_bf16_us)

    @property
    def step_bf16_us(self) -> float:
        return self.bf16_us + self.fwd_bf16_us

    @property
    def speedup(self) -> float:
        return self.step_bf16_us / self.step_hot_us if self.step_hot_us > 0 else math.inf

    @property
    def hot(self) -> bool:
        return self.step_hot_us <= MARGIN * self.step_bf16_us

    def describe(self) -> str:
        verdict = "HOT" if self.hot else "exact bf16"
        if self.hot and self.fwd_fp8_us:
            verdict += f", {'FP8' if self.fp8_forward else 'bf16'} forward"
        elif self.fp8_forward_alone:  # the plan's fp8_forward path: the FP8 forward pays alone
            verdict = "exact backward, FP8 forward"
        share = f" (x's ABC shared by {self.shared} layers)" if self.shared > 1 else ""
        fwd = ""
        if self.fwd_fp8_us:
            again = f" (+{self.rederive_us:.0f} µs of bf16 x)" if not self.hot else ""
            fwd = (f"; forward FP8 {self.fwd_fp8_us:.0f}{again} vs bf16 {self.fwd_bf16_us:.0f}"
                   " µs, whole step")  # fmt: skip
        return (
            f"{self.source}: HOT {self.hot_us:.0f} µs{share} vs bf16 {self.bf16_us:.0f} µs{fwd} "
            f"({self.speedup:.2f}x) -> {verdict}"
        )


#: part of every cached measurement's key: bumped when HOT's kernels change speed, so that a
#: gate.json written by an older hotcompile is measured afresh (2: g_y's shared max-abs;
#: 3: codes times the scale's reciprocal, the weight quantized in the forward from its GEMM
#: copy, the bf16 side's cast of g_w to the weight's dtype; 4: the exact side also timed with
#: unaligned dims padded as inductor pads them; ``Shape.x_amax_given``; 5: ``Shape.x_readers``,
#: ABC timed alone too, kept under the layer-alone key; 6: ``Shape.forward``, the forward
#: timed both ways for ``HotConfig.forward="fp8"``)
MEASURE_VERSION = 6


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a layer's backward costs depend on. ``L`` tokens (all leading dims), ``O`` outputs,
    ``I`` inputs; ``N``, ``S``: samples × positions of HLA's geometry."""

    L: int
    O: int
    I: int
    N: int
    S: int
    grid_w: int = 0
    rows: tuple[int, ...] = ()
    gx_bits: int | None = 4
    per_token: bool = True
    gw_bits: int | None = 8
    gw_rounding: str = "pseudo_stochastic"
    rounding: str = "pseudo_stochastic"
    weight_scale: str = "sawb"
    signs: bool = False
    need_gx: bool = True
    need_gw: bool = True
    dtype: str = "bfloat16"
    wdtype: str = "float32"
    #: ABC takes x's max-abs from x's producer (``HotConfig.abc_max_abs="producer"``)
    x_amax_given: bool = False
    #: layers reading this very x with it (a Llama's q/k/v: 3), which then share one ABC
    #: quantization of x (``autograd._native_compress_once``): each is charged 1/x_readers of
    #: it. The rewrite passes more than 1 only where every one of them takes HOT so charged
    #: (``hotcompile.passes.rewrite._share_abc``)
    x_readers: int = 1
    #: the forward HOT's side would run: ``"bf16"`` (not timed: the same on both sides) or
    #: ``"fp8_rowwise"`` / ``"fp8_tensorwise"`` (``HotConfig.forward="fp8"``: both forwards
    #: timed, the faster taken on HOT's side)
    forward: str = "bf16"
    #: the FP8 forward's GEMM runs with Hopper's fast accumulation
    #: (``HotConfig.fp8_fast_accum``, session 27): timed so
    fast_forward: bool = False
    #: and HQ's g_x GEMM, where its codes are FP8 values (``fp8_fast_accum="all"``)
    fast_gx: bool = False

    def key(self, device_name: str) -> str:
        """The gate cache's key. The fields added after the cache's first keys
        (:data:`_LATE_FIELDS`) are left out while False, trailing ones first, so that a carried
        cache's keys stay valid for the shapes they timed."""
        head = f"{device_name}|{torch.__version__}|v{MEASURE_VERSION}|"
        fields = dataclasses.astuple(self)
        for _ in range(_LATE_FIELDS):
            if fields[-1] is not False:
                break
            fields = fields[:-1]
        return head + repr(fields)


#: Shape's last fields, added after its keys were first cached (``fast_forward``, ``fast_gx``)
_LATE_FIELDS = 2


# ----------------------------------------------------------------------------- model


#: H100 rates (hopper-gemm.md, large shapes): TFLOP/s (TOP/s for int8), and bytes/s of a pass
RATES = {"bf16": 700e12, "fp8": 1150e12, "int8": 700e12}
#: bytes/s the quantize kernels reach (measured: 1.4-2.4 TB/s of the 3.0 TB/s a copy reaches;
#: experiments/results/native_stages_h100.md)
HBM = 1.8e12
KERNEL_US = 4.0
SMS = 132


def _gemm_us(m: int, n: int, k: int, kind: str) -> float:
    """Roofline time of an ``[m, k]·[k, n]`` GEMM with 128×256 tiles and wave quantization."""
    tiles = math.ceil(m / 128) * math.ceil(n / 256)
    waves = math.ceil(tiles / SMS)
    eff = tiles / (waves * SMS)
    if k >= 8192:  # few output tiles, long K (the g_w GEMMs): split-K fills the GPU
        eff = max(eff, 0.85)
    return 2.0 * m * n * k / (RATES[kind] * eff) * 1e6 + KERNEL_US


def _pass_us(nbytes: float, kernels: int = 1) -> float:
    return nbytes / HBM * 1e6 + KERNEL_US * kernels


def estimate(s: Shape) -> Speed:
    """The roofline model of both backwards (H100 constants): what to expect without a GPU."""
    L, O, I = s.L, s.O, s.I
    bf16 = (_gemm_us(L, I, O, "bf16") if s.need_gx else 0.0) + (
        _gemm_us(O, I, L, "bf16") if s.need_gw else 0.0
    )
    if s.need_gw and s.wdtype != s.dtype:  # autograd casts the GEMM's g_w to the weight's
        bf16 += _pass_us(O * I * 6)
    hot = 0.0
    if s.need_gx:
        kind = "fp8" if s.gx_bits == 4 or "fp8" in s.rounding else "int8"
        hot += _gemm_us(L, I, O, kind) if s.gx_bits else _gemm_us(L, I, O, "bf16")
        if s.gx_bits:
            hot += _pass_us(L * O * 3, 1 if s.per_token else 2)  # read bf16 g_y, write codes
            hot += _pass_us(O * I * 5, 2)  # the weight's GEMM copy: two reads (bf16), codes
    if s.need_gw:
        r = len(s.rows)
        k = L * r // 16 if r else L
        hot += _gemm_us(O, I, k, "fp8" if "fp8" in s.gw_rounding else "int8")
        # HLA of g_y and ABC of x: two reads (max-abs, codes) and the codes written; one read
        # for plain rows (g_y's max-abs from HQ's pass, x's from x's producer)
        from hotcompile.lowering.hot import plain_rows

        plain = plain_rows(s.grid_w, s.rows, s.signs)
        gy_reads = 1 if plain and s.need_gx and s.gx_bits else 2
        x_reads = 1 if plain and s.x_amax_given else 2
        hot += _pass_us(gy_reads * L * O * 2 + k * O, gy_reads)
        hot += _pass_us(x_reads * L * I * 2 + k * I, x_reads) / s.x_readers
    fwd_bf16 = fwd_fp8 = 0.0
    if s.forward != "bf16":
        fwd_bf16 = _gemm_us(L, O, I, "bf16")
        if s.wdtype != s.dtype:  # autocast's copy of the weight in the GEMM's dtype
            fwd_bf16 += _pass_us(O * I * (_itemsize(s.wdtype) + _itemsize(s.dtype)))
        fwd_fp8 = _gemm_us(L, O, I, "fp8") + _fp8_casts_us(s)
    return Speed(bf16, hot, "model", s.x_readers, fwd_bf16, fwd_fp8, _rederive_us(s))


def _fp8_casts_us(s: Shape) -> float:
    """The FP8 forward's casts as the compiled step runs them (modelled, not timed): x's codes
    are one more byte per element written by the kernel that produces x (inductor computes
    the row max-abs and the cast there, in a pass the step makes anyway), the weight's one
    pass over the parameter (read it, write its codes)."""
    return (s.L * s.I) / HBM * 1e6 + _pass_us(s.O * s.I * (_itemsize(s.wdtype) + 1))


def _rederive_us(s: Shape) -> float:
    """The exact backward's bf16 x beside an FP8 forward (modelled, not timed): one pass
    that reads x's producer's input and writes x (~4 bytes an element), as the compiled step
    ran it on ViT-L/16 (run 44: the LayerNorm outputs recomputed in the backward, no longer
    saved). Zero where no g_w is made (nothing of x is read)."""
    return _pass_us(s.L * s.I * 2 * _itemsize(s.dtype)) if s.need_gw else 0.0


def _itemsize(dtype: str) -> int:
    return getattr(torch, dtype).itemsize


# ----------------------------------------------------------------------------- measurement


#: the gate's file in hotcompile.diskcache
CACHE_FILE = "gate.json"


def _load() -> dict[str, dict[str, float]]:
    global _cache
    if _cache is None:
        _cache = diskcache.load(CACHE_FILE)
    return _cache


def _store(key: str, times: dict[str, float]) -> None:
    cache = _load()
    cache[key] = times
    diskcache.save(CACHE_FILE, cache)  # a read-only home: the in-memory cache still holds


#: one warm-up stream per device: cuBLAS keeps a workspace per stream it ran on (allocated
#: through the caching allocator, never freed), so a new stream per timing kept ~32 MiB
#: allocated for the rest of training per measurement
_STREAMS: dict[int, torch.cuda.Stream] = {}


def _warmup_stream() -> torch.cuda.Stream:
    index = torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream()
    return _STREAMS[index]


def _release_workspaces() -> None:
    """Forget cuBLAS's per-stream workspaces after a timing (the next GEMM allocates its
    stream's again): the gate must leave the training step's memory as it found it."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        torch.cuda.synchronize()
        clear()


def _graph_us(fn, reps: int = 5, inner: int = 3) -> float:
    """Median device time of ``fn`` (µs), captured once in a CUDA graph, replayed."""
    stream = _warmup_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the graph: Triton compiles, cuBLAS handles
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / inner)
    del graph
    # the capture allocated cuBLAS's workspace in the graph's pool, now freed: drop cuBLAS's
    # handle on it (as inductor's CUDA-graph trees do) and the warm-up stream's workspace
    _release_workspaces()
    return statistics.median(times)


def _hot_fn(s: Shape, gy: torch.Tensor, w: torch.Tensor, x: torch.Tensor):
    """HOT's side of one layer as the compiled step runs it: the forward's weight codes (from
    the weight's copy in g_y's dtype, which the forward's GEMM makes either way) and ABC of x,
    then the backward's g_x and g_w, g_w cast to the weight's dtype as autograd does."""
    from hotcompile.lowering import hot

    gy3 = gy.view(s.N, s.S, s.O)
    wb = w.to(gy.dtype)
    signs = torch.ones((s.N, s.S, 1), device=x.device, dtype=x.dtype) if s.signs else None

    # as the backward does (autograd._shares_gy_amax): HQ's kernel takes g_y's max-abs for
    # the g_w codes of g_y's plain rows
    share = bool(s.need_gx and s.gx_bits and s.need_gw and s.gw_bits)
    share = share and hot.plain_rows(s.grid_w, s.rows, s.signs)
    compress = _abc_fn(s, x)

    def run():
        out, amax = [], None
        if s.need_gx:
            if s.gx_bits:
                wq, sw = hot.weight_codes(wb, s.gx_bits, s.rounding, s.weight_scale)
                gx, amax = hot.grad_input_codes(gy, wq, sw, s.gx_bits, s.per_token, s.rounding,
                                                share, fast_accum=s.fast_gx)  # fmt: skip
                out.append(gx)
            else:
                out.append(gy @ wb)
        if s.need_gw:
            xq, sx = compress()
            gw = hot.grad_weight(gy3, xq, sx, s.grid_w, s.rows, s.gw_bits, s.gw_rounding, signs,
                                 amax)  # fmt: skip
            out.append(gw.to(w.dtype))
        return out

    return run


def _abc_fn(s: Shape, x: torch.Tensor):
    """ABC of ``x`` as the forward runs it for ``s`` (:func:`_hot_fn`'s part that layers
    reading one x share)."""
    from hotcompile.lowering import hot

    x3 = x.view(s.N, s.S, s.I)
    signs = torch.ones((s.N, s.S, 1), device=x.device, dtype=x.dtype) if s.signs else None
    # abc_max_abs="producer": ABC of x's plain rows takes x's max-abs from the kernel that
    # produces x (a row reduction fused into it, hot.amax_bits), not from a pass of its own:
    # computed once, outside the timing
    x_amax = None
    if s.x_amax_given and s.need_gw and s.gw_bits and hot.plain_rows(s.grid_w, s.rows, s.signs):
        x_amax = hot.amax_bits(x3) if hot.use_triton(x3) else None

    def run():
        return hot.compress(x3, s.grid_w, s.rows, s.gw_bits, s.gw_rounding, signs, x_amax)

    return run


def _bf16_fn(s: Shape, gy: torch.Tensor, w: torch.Tensor, x: torch.Tensor):
    """The exact backward as the compiled step runs it: the two GEMMs in g_y's dtype, g_w then
    cast to the weight's dtype (autocast's fp32 master weight: a pass over O×I that inductor
    cannot fuse into cuBLAS's GEMM; the Llama's inductor step spends ~39 µs per gate/up/down
    layer on it, ``bench_train_profiles/profile_llama_inductor.txt``)."""
    wb = w.to(gy.dtype)

    def run():
        out = []
        if s.need_gx:
            out.append(torch.mm(gy, wb))
        if s.need_gw:
            out.append(torch.mm(gy.t(), x).to(w.dtype))
        return out

    return run


def _alignment(dtype: torch.dtype) -> int:
    """The multiple inductor pads an mm's dims to (``fx_passes/pad_mm.py``, torch 2.11–2.14:
    8 for 16-bit floats, 4 for float32, none otherwise)."""
    if dtype in (torch.float16, torch.bfloat16):
        return 8
    return 4 if dtype == torch.float32 else 1


def _bf16_padded_fn(s: Shape, gy: torch.Tensor, w: torch.Tensor, x: torch.Tensor):
    """The exact backward with every unaligned dim zero-padded to inductor's alignment, or
    None where the shape is aligned.

    Inductor pads an mm's unaligned dims (``shape_padding``, on by default, where its own
    benchmark finds the padded GEMM faster; the joint graph's backward mms included), and its
    comprehensive padding often gives the operand a padded buffer already: GPT-2's tied head
    (O = 50257) ran its two backward GEMMs in 1.26 + 0.79 ms of inductor's step (H100,
    ``bench_train_profiles/s15_a4592b2/profile_gpt2_inductor.txt``), where the unpadded
    GEMMs the gate timed took 6.1–8.7 ms (``experiments/results/gpt2_head_gate_h100.md``): the
    gate chose HOT's 3.2 ms for a head that inductor runs faster in bf16. The padding copies
    are not timed (the exact side's best case: a layer must beat it to take HOT)."""
    a = _alignment(gy.dtype)
    L, O, I = s.L, s.O, s.I  # noqa: E741
    Lp, Op, Ip = (-(-n // a) * a for n in (L, O, I))
    if (Lp, Op, Ip) == (L, O, I):
        return None
    F = torch.nn.functional
    gyp = F.pad(gy, (0, Op - O, 0, Lp - L))
    xp = F.pad(x, (0, Ip - I, 0, Lp - L))
    wp = F.pad(w, (0, Ip - I, 0, Op - O))
    return _bf16_fn(s, gyp, wp, xp)


def exact_sides(s: Shape, gy: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> list:
    """The ways inductor may run the exact backward of ``s``: as is, and, where a dim is
    unaligned, padded (:func:`_bf16_padded_fn`). :func:`measure` keeps the fastest."""
    return [f for f in (_bf16_fn(s, gy, w, x), _bf16_padded_fn(s, gy, w, x)) if f is not None]


def measure(s: Shape, device: torch.device) -> Speed:
    """Both backwards of ``s`` timed on ``device`` (cached): see the module docstring.

    The times are kept for the layer alone (``x_readers`` 1), with ABC of x timed apart where
    a layer shares it: a shape the rewrite plans with a share and again without
    (``rewrite._share_abc``) is timed once, and its share derived."""
    n = s.x_readers
    shares = n > 1 and s.need_gw and bool(s.gw_bits)
    key = dataclasses.replace(s, x_readers=1).key(torch.cuda.get_device_name(device))
    with _lock:
        times = dict(_load().get(key) or {})
        if not times or (shares and "abc_us" not in times):
            dtype = getattr(torch, s.dtype)
            gen = torch.Generator(device=device).manual_seed(0)
            with torch.cuda.device(device):
                gy = torch.randn((s.L, s.O), device=device, dtype=dtype, generator=gen)
                x = torch.randn((s.L, s.I), device=device, dtype=dtype, generator=gen)
                w = torch.randn((s.O, s.I), device=device, generator=gen)
                w = w.to(getattr(torch, s.wdtype))
                if not times:
                    times["bf16_us"] = min(_graph_us(f) for f in exact_sides(s, gy, w, x))
                    times["hot_us"] = _graph_us(_hot_fn(s, gy, w, x))
                if shares:
                    times["abc_us"] = _graph_us(_abc_fn(s, x))
                if s.forward != "bf16" and "fwd_fp8_us" not in times:
                    times.update(_forward_us(s, x, w))
            _store(key, times)
    hot_us = times["hot_us"]
    if shares:  # one quantization of x for all its readers: this layer's share of it
        hot_us -= times["abc_us"] * (1 - 1 / n)
    fwd = (times["fwd_bf16_us"], times["fwd_fp8_us"]) if s.forward != "bf16" else (0.0, 0.0)
    return Speed(times["bf16_us"], hot_us, "measured", n, *fwd, _rederive_us(s))


def _forward_us(s: Shape, x: torch.Tensor, w: torch.Tensor) -> dict[str, float]:
    """Both forwards of ``s``: bf16 (the weight's autocast copy and the GEMM) and FP8 (the
    GEMM timed, with the step's accumulation, ``s.fast_forward``; the casts modelled by
    :func:`_fp8_casts_us`: timed as eager ATen they would be several kernels each, where the
    compiled step fuses them)."""
    from hotcompile import fp8

    scaling = s.forward.removeprefix("fp8_")
    xq, sx, wq, sw = fp8.operands(x, w.to(x.dtype), scaling)
    bf16 = _graph_us(lambda: torch.mm(x, w.to(x.dtype).t()))
    gemm = _graph_us(lambda: fp8.scaled_gemm(xq, sx, wq, sw, scaling, x.dtype, s.fast_forward))
    return {"fwd_bf16_us": bf16, "fwd_fp8_us": gemm + _fp8_casts_us(s)}


def decide(s: Shape, device: torch.device | None) -> Speed:
    """Measured on a CUDA device (falling back to the model if the timing fails; under
    ``torch.distributed`` rank 0's verdict, :func:`agree`), else the model's estimate."""
    if device is not None and device.type == "cuda":
        try:
            speed = measure(s, device)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
            log.warning("hotcompile: timing %s failed (%s); the gate uses the model", s, e)
            torch.cuda.empty_cache()
            speed = estimate(s)
        return agree(s, speed)
    return estimate(s)


# ----------------------------------------------------------------------------- ranks

#: seconds a rank waits for rank 0's verdict on a shape before it keeps its own (a graph only
#: this rank compiles, e.g. after a recompile on a short last batch, gets none). Ranks compile
#: in step (their collectives meet in the forward), so rank 0 is seconds ahead or behind.
AGREE_TIMEOUT_S = 120.0
#: after a timeout, the wait for the next shapes (the rest of that graph's layers) in the
#: following AGREE_TIMEOUT_S: a graph only this rank compiles costs one long wait, not one a layer
AGREE_AFTER_TIMEOUT_S = 5.0
_STORE_PREFIX = "hotcompile/gate/"
_timed_out_at = -math.inf


def _default_store():
    """The default process group's key-value store and this rank, or ``(None, 0)`` outside
    ``torch.distributed`` (or with one process)."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None, 0
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store(), dist.get_rank()
    except Exception:  # noqa: BLE001 - no store: every rank decides alone
        return None, 0


def agree(s: Shape, speed: Speed, timeout_s: float | None = None) -> Speed:
    """Every rank takes rank 0's verdict on ``s``.

    Timed verdicts differ between GPUs by their noise, and a layer near the margin (a Llama's
    q/k/v sit there) would take HOT on one rank and bf16 on another: different graphs, memory
    and gradients per rank, and not the one-process plan the user was shown. Rank 0 publishes
    each verdict in the process group's store; the other ranks wait for it there. No collective
    runs, so a rank that compiles a graph alone (a recompile the others do not make) cannot
    hang the group: after ``timeout_s`` (:data:`AGREE_TIMEOUT_S`; then
    :data:`AGREE_AFTER_TIMEOUT_S` for a while) it keeps its own verdict, with a warning."""
    global _timed_out_at
    store, rank = _default_store()
    if store is None:
        return speed
    key = _STORE_PREFIX + s.key("")
    if rank == 0:
        store.set(key, json.dumps(dataclasses.asdict(speed)))
        return speed
    wait = AGREE_TIMEOUT_S if timeout_s is None else timeout_s
    if time.monotonic() - _timed_out_at < AGREE_TIMEOUT_S:
        wait = min(wait, AGREE_AFTER_TIMEOUT_S)
    try:
        store.wait([key], datetime.timedelta(seconds=wait))
        theirs = json.loads(store.get(key))
    except Exception as e:  # noqa: BLE001 - timeout or a broken store: decide alone
        _timed_out_at = time.monotonic()
        log.warning(
            "hotcompile: rank %d got no verdict from rank 0 for %s in %.0f s (%s); it keeps its "
            "own (%s), which may differ from the other ranks' plan",
            rank, s, wait, type(e).__name__, speed.describe(),
        )  # fmt: skip
        return speed
    theirs["source"] = f"{theirs['source']} (rank 0)"
    return Speed(**theirs)

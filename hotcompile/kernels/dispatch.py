"""Which implementation runs each low-precision GEMM: measured per shape, cached, overridable.

HOT's two GEMMs (FP8/INT8 g_x, INT8 g_w) have several implementations on CUDA — CUTLASS sm_90a
kernels (``hotcompile.kernels.cutlass``, when built), the Triton kernel
(``hotcompile.kernels.gemm_triton``, one candidate per tile configuration) and torch's own
(``torch._scaled_mm``, ``torch._int_mm`` + a dequantization pass) — and which one is fastest
depends on the shape (ViT-B's K = 768 is a different problem from an LLM's K = 14336). So the
first call per (dtype, M, N, K, scales, out dtype) times every candidate that takes the shape
(CUDA events, a few runs each) and keeps the fastest, in memory and in a JSON file under
``~/.cache/hotcompile`` keyed by GPU name, torch and Triton versions, so later processes skip the
measurement. While a CUDA graph is being captured nothing is timed (the first candidate that
takes the shape runs).

Override: ``HOTCOMPILE_GEMM=cutlass|cuda|triton|torch`` (environment) or :func:`set_preference`;
``HOTCOMPILE_CUTLASS=0`` leaves the CUTLASS kernels out (and never builds them);
the backend applies ``HotConfig.kernels`` (``options={"kernels": "triton"}``) when a model is
compiled. :func:`choices` says which
implementation each shape got (``tools/bench_layers.py`` and ``tools/bench_train.py`` print
it with their results).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hotcompile import diskcache

IMPLS = ("auto", "cutlass", "cuda", "triton", "torch")
_ENV = "HOTCOMPILE_GEMM"
_preference = os.environ.get(_ENV, "auto")
_lock = threading.Lock()


@dataclass
class Choice:
    """The implementation picked for one GEMM shape, and what it was picked from."""

    impl: str
    timings_us: dict[str, float] = field(default_factory=dict)
    source: str = "measured"  #: "measured", "disk cache", "preference", "capture"
    errors: dict[str, str] = field(default_factory=dict)  #: candidates that failed to run


_choices: dict[str, Choice] = {}
_disk: dict[str, str] | None = None
#: (layer, stage) -> the shape key its last call ran (see :func:`by_layer`)
_layer_keys: dict[tuple[str, str], str] = {}


def set_preference(impl: str) -> None:
    """Force one implementation family (``"auto"``: measure). Unknown names raise."""
    global _preference
    if impl not in IMPLS:
        raise ValueError(f"gemm implementation must be one of {IMPLS}, got {impl!r}")
    _preference = impl


def preference() -> str:
    return _preference


def choices() -> dict[str, Choice]:
    """Shape key -> the implementation chosen for it in this process."""
    return dict(_choices)


def clear() -> None:
    """Forget this process's choices (the disk cache stays)."""
    _choices.clear()
    _layer_keys.clear()


def note(layer: str, stage: str, key: str) -> None:
    """Record that ``layer``'s ``stage`` (e.g. ``"g_x GEMM"``) ran the shape ``key``: what
    :func:`by_layer` reports. A key without a choice (a single-implementation kernel) is
    reported as the key itself."""
    if layer:
        _layer_keys[(layer, stage)] = key


def by_layer() -> dict[str, dict[str, str]]:
    """Layer -> stage -> the implementation that ran in this process (CUDA only), e.g.
    ``{"blocks.0.qkv": {"g_x quantize": "cuda", "g_x GEMM": "torch", ...}}``."""
    out: dict[str, dict[str, str]] = {}
    for (layer, stage), key in _layer_keys.items():
        c = _choices.get(key)
        out.setdefault(layer, {})[stage] = c.impl if c is not None else key
    return out


def table() -> str:
    """A plain-text table of the choices (for logs and benchmark outputs)."""
    lines = [f"{'GEMM (dtype M×N×K scales→out)':<52} {'implementation':<14} source"]
    for key, c in sorted(_choices.items()):
        lines.append(f"{key:<52} {c.impl:<14} {c.source}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- candidates

Fn = Callable[[], torch.Tensor]


def _dequant(r: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor | None) -> torch.Tensor:
    """``(r · s_a) · s_b`` (row vector or scalar, then column vector, scalar or none): the
    reference's dequantization order, for the candidates without a fused epilogue."""
    r = r * (sa[:, None] if sa.numel() > 1 else sa)
    if sb is not None:
        r = r * (sb[None, :] if sb.numel() > 1 else sb)
    return r


def _torch_impl(a, b, sa, sb, out_dtype, out) -> Fn | None:
    """torch's own kernels; the scale tensors they need are built inside the returned
    function, so nothing is allocated for a candidate that is not the one run."""
    M, K = a.shape
    N = b.shape[0]
    if a.dtype == torch.int8:
        if not (M > 16 and K % 8 == 0 and N % 8 == 0):
            return None

        def run() -> torch.Tensor:
            return _finish(
                _dequant(torch._int_mm(a, b.t()).to(torch.float32), sa, sb), out_dtype, out
            )

        return run
    if not (M % 16 == 0 and K % 16 == 0 and N % 16 == 0):
        return None
    rowwise = sa.numel() > 1 or (sb is not None and sb.numel() > 1)
    if rowwise and out_dtype == torch.bfloat16 and out is None:

        def run_rowwise() -> torch.Tensor:
            # row-wise scales fused in cuBLAS's epilogue (bf16 output only)
            scale_b = sb if sb is not None else torch.ones((), device=a.device)
            s_a = sa.reshape(-1, 1).expand(M, 1).contiguous()
            s_b = scale_b.reshape(1, -1).expand(1, N).contiguous()
            return torch._scaled_mm(a, b.t(), scale_a=s_a, scale_b=s_b, out_dtype=out_dtype)

        return run_rowwise

    def run_fp8() -> torch.Tensor:
        one = torch.ones((), dtype=torch.float32, device=a.device)
        r = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        return _finish(_dequant(r, sa, sb), out_dtype, out)

    return run_fp8


def _finish(r: torch.Tensor, out_dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    if out is not None:
        return out.add_(r)
    return r.to(out_dtype)


def _refused_is_error(r: torch.Tensor | None) -> torch.Tensor:
    if r is None:  # the CUTLASS wrapper returns None for what it does not take
        raise ValueError("the CUTLASS kernel refused these operands")
    return r


def _candidates(a, b, sa, sb, out_dtype, out, only: str | None = None) -> list[tuple[str, Fn]]:
    """Every implementation that takes these operands, or (``only``) just the one so named."""
    cands: list[tuple[str, Fn]] = []
    family = only.split(":")[0] if only else None
    try:
        from hotcompile.kernels import cutlass
    except ImportError:  # pragma: no cover - the module ships with the package
        cutlass = None
    aligned = all(d % 16 == 0 for d in (*a.shape, b.shape[0]))
    enabled = os.environ.get("HOTCOMPILE_CUTLASS", "1") != "0"
    if (
        family in (None, "cutlass")
        and a.is_cuda
        and aligned
        and enabled
        and cutlass is not None
        and cutlass.available()
    ):
        dt = str(a.dtype).replace("torch.", "")  # CONFIGS keys: "int8", "float8_e4m3fn"
        s_b = sb if sb is not None else 1.0  # the wrapper takes a float for "no column scale"
        for cfg in cutlass.CONFIGS.get(dt, []):
            if only and only != f"cutlass:{cfg}":
                continue
            cands.append(
                (
                    f"cutlass:{cfg}",
                    lambda cfg=cfg: _refused_is_error(
                        cutlass.scaled_gemm(a, b, sa, s_b, 1.0, out_dtype, out=out, config=cfg)
                    ),
                )
            )
    gemm_triton = None
    if a.is_cuda and family in (None, "triton"):  # (CPU-only installs have no Triton)
        from hotcompile.kernels import gemm_triton
    if gemm_triton is not None and gemm_triton.supported(a, b):
        for i in range(len(gemm_triton.TILES)):
            if only and only != f"triton:{i}":
                continue
            cands.append(
                (
                    f"triton:{i}",
                    lambda i=i: gemm_triton.scaled_gemm(a, b, sa, sb, out_dtype, out, config=i),
                )
            )
    t = _torch_impl(a, b, sa, sb, out_dtype, out) if family in (None, "torch") else None
    if t is not None:
        cands.append(("torch", t))
    return cands


# ----------------------------------------------------------------------------- the choice


def _key(a, b, sa, sb, out_dtype, out) -> str:
    dt = "int8" if a.dtype == torch.int8 else "e4m3"
    scales = (
        ("row" if sa.numel() > 1 else "1")
        + "·"
        + ("-" if sb is None else ("col" if sb.numel() > 1 else "1"))
    )
    od = "+=fp32" if out is not None else str(out_dtype).replace("torch.", "")
    return f"{dt} {a.shape[0]}×{b.shape[0]}×{a.shape[1]} {scales}→{od}"


def _device_tag(device: torch.device) -> str:
    import triton

    name = torch.cuda.get_device_name(device)
    return f"{name}|torch {torch.__version__}|triton {triton.__version__}"


#: the dispatcher's file in hotcompile.diskcache
CACHE_FILE = "gemm_dispatch.json"


def _load_disk() -> dict[str, str]:
    global _disk
    if _disk is None:
        _disk = diskcache.load(CACHE_FILE)
    return _disk


def _save_disk(tag_key: str, impl: str) -> None:
    disk = _load_disk()
    disk[tag_key] = impl
    diskcache.save(CACHE_FILE, disk)  # a read-only home: the in-memory choice still holds


def _time(fn: Fn, reps: int = 10) -> float:
    """Median GPU µs of ``reps`` runs after two warm-ups (the first may compile a kernel).

    The device is first kept busy (``torch.cuda._sleep``) so the host queues every timed run
    ahead: the events then measure the kernels, not Python's launch overhead, which would
    otherwise blur the small differences between candidates.
    """
    fn()
    fn()
    torch.cuda.synchronize()
    events = []
    torch.cuda._sleep(20_000_000)  # ~10 ms of device time to queue the runs behind
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1000.0 for s, e in events)
    return times[len(times) // 2]


def settled(key: str) -> str | None:
    """The implementation measured (or read from the disk cache) for ``key`` earlier in this
    process, while the preference is ``"auto"``; else None. Callers that find one build and
    run only that candidate: the host cost of the full :func:`choose` (every candidate's
    closure, the lock) is paid once per shape, not on every call."""
    c = _choices.get(key)
    if _preference != "auto" or c is None or c.source in ("capture", "preference"):
        return None
    return c.impl


def choose(key: str, cands: list[tuple[str, Fn]], device, out: torch.Tensor | None = None) -> str:
    """The candidate to run for ``key`` (an op and its shape): the preference when one of the
    candidates belongs to that family, else the measured fastest (cached in memory and on
    disk). ``out``: an accumulator the candidates add into (restored after timing)."""
    names = [n for n, _ in cands]
    pref = _preference
    if pref != "auto":
        for n in names:
            if n.split(":")[0] == pref:
                _choices[key] = Choice(n, source="preference")
                return n
    capturing = torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()
    if key in _choices and _choices[key].impl in names:
        # a forced choice is not a measurement: once the preference is back to "auto", measure
        if capturing or _choices[key].source not in ("capture", "preference"):
            return _choices[key].impl
    if capturing or len(cands) == 1:
        _choices[key] = Choice(names[0], source="capture" if capturing else "only candidate")
        return names[0]
    tag_key = f"{_device_tag(device)}|{key}"
    cached = _load_disk().get(tag_key)
    if cached in names:
        _choices[key] = Choice(cached, source="disk cache")
        return cached
    saved = out.clone() if out is not None else None
    timings, errors = {}, {}
    for name, fn in cands:
        try:
            timings[name] = _time(fn)
        except Exception as e:  # a candidate that fails to compile or launch is not chosen
            errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
    if saved is not None:
        out.copy_(saved)  # the timing runs accumulated into it
    best = min(timings, key=timings.get) if timings else names[-1]
    _choices[key] = Choice(best, timings, errors=errors)
    _save_disk(tag_key, best)
    return best


def scaled_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
    layer: str = "",
    stage: str = "GEMM",
) -> torch.Tensor:
    """``(a·bᵀ).float() · scale_a · scale_b`` in ``out_dtype`` (added into ``out`` if given) by
    the fastest implementation for this shape; see :mod:`hotcompile.kernels.gemm_triton` for
    the operand contract (K-major int8 or float8_e4m3fn, float32 scales on the device).
    ``layer``/``stage`` name the call for :func:`by_layer`."""
    sa = scale_a.reshape(-1).to(torch.float32)
    sb = None if scale_b is None else scale_b.reshape(-1).to(torch.float32)
    key = _key(a, b, sa, sb, out_dtype, out)
    name = settled(key)
    if name is not None:  # the fast path: only the chosen candidate is built
        only = _candidates(a, b, sa, sb, out_dtype, out, only=name)
        if only:
            note(layer, stage, key)
            return only[0][1]()
    cands = _candidates(a, b, sa, sb, out_dtype, out)
    if not cands:
        raise ValueError(f"no GEMM implementation takes {key}")
    with _lock:
        name = choose(key, cands, a.device, out)
    note(layer, stage, key)
    return dict(cands)[name]()

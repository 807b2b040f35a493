"""HOT's backward for linear and conv2d layers, as autograd Functions.

The rewrite pass replaces every eligible ``F.linear`` / ``F.conv2d`` of the Dynamo graph with
:func:`hot_linear` / :func:`hot_conv2d`. AOTAutograd traces these like eager code:

- the forward stays the full-precision aten op (inductor still fuses around it);
- the forward also computes the ABC compression ``abc_compress(x)`` and saves it. That op's
  result is used only by the backward, so the min-cut partitioner is free to place it: it saves
  the INT8 buffer (half the rows) when x would otherwise be saved for the weight gradient. When
  the backward reads x anyway (as a view or copy of a tensor another op's backward reads — the
  attention output feeding ``proj``), ``hotcompile.passes.abc_recompute`` tags the compression
  for recomputation in the backward, so the INT8 copy is not saved on top of it;
- the backward calls the ``hotcompile`` ops: HQ for g_x, HLA for g_w. The bias gradient stays
  exact. A frozen weight (LoRA base) gets only the g_x path and saves nothing for g_w.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

import hotcompile.ops  # noqa: F401  (registers torch.ops.hotcompile)
from hotcompile import fp8, lqs
from hotcompile.hla import hla_transform, patch_side, signed
from hotcompile.lowering import hot as native
from hotcompile.quant import FP8_E4M3

ops = torch.ops.hotcompile


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """What the HOT backward of one layer does. Hashable; baked into the traced graph.

    ``gx_bits``/``gw_bits`` None means that path is computed without quantization;
    ``hla_rows`` empty means no low-rank projection on the g_w path; ``exact`` turns every
    transform off. ``hla_2d`` decides whether inputs with one row per sample use HLA across
    the batch. ``stride``/``padding``/``dilation`` are set for conv2d only.

    ``lowering``: ``"ops"`` (the ``torch.ops.hotcompile`` custom ops, run-time LQS) or
    ``"native"`` (:mod:`hotcompile.lowering.hot`: nodes inductor compiles and launches itself;
    every decision static, ``gx_scaling`` then ``per_token`` or ``per_tensor``).

    ``hla_probe`` (set by :func:`hotcompile.calibrate` only, with ``abc`` off so x is saved in
    full, and the eager compiler so the backward runs on real tensors): the backward also
    measures HLA's g_w error for the layer's LQS state (``hotcompile.lqs.observe_hla``), which
    decides the plan's HLA choice.

    ``forward``: the forward GEMM's precision — ``"bf16"`` (``F.linear`` as the model wrote
    it, the paper's) or ``"fp8_rowwise"`` / ``"fp8_tensorwise"`` (:func:`hotcompile.fp8.linear`,
    ``HotConfig.forward="fp8"``). The backward does not depend on it. ``fast_accum``: which
    FP8 GEMMs of e4m3 values accumulate with ``use_fast_accum`` (``HotConfig.fp8_fast_accum``;
    "off" unless the config says otherwise).
    """

    name: str
    kind: str = "linear"
    gx_bits: int | None = 4
    gx_format: str = "int"
    hadamard: bool = True
    gx_scaling: str = "per_token"
    lqs_key: str = ""
    weight_scale: str = "sawb"
    gw_bits: int | None = 8
    gw_format: str = "int8"
    hla_rows: tuple[int, ...] = (0, 2, 3, 8, 10, 11, 12, 14)
    block: int = 16
    rounding: str = "pseudo_stochastic"
    abc: bool = True
    abc_max_abs: str = "producer"
    weight_codes_late: bool = False
    hla_signs: bool = False
    hla_2d: str = "none"
    exact: bool = False
    check: bool = True
    hla_probe: bool = False
    lowering: str = "ops"
    forward: str = "bf16"
    fast_accum: str = "off"
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)

    @property
    def fast_forward(self) -> bool:
        """The FP8 forward's GEMM takes Hopper's fast accumulation (``fast_accum``)."""
        return self.fast_accum in ("forward", "all")

    @property
    def fast_gx(self) -> bool:
        """HQ's g_x GEMM takes it where its codes are FP8 values (``fast_accum="all"``): the
        gate then times, and keys, only the layers whose GEMM it changes."""
        return self.fast_accum == "all" and self.gx_rounding == FP8_E4M3

    @property
    def per_token(self) -> bool:
        return self.gx_scaling == "per_token"

    @property
    def gw_rounding(self) -> str:
        """The g_w path's rounding argument: ``quant.FP8_E4M3`` for FP8 codes (the ops take
        the format where an integer rounding goes), else the configured rounding."""
        return FP8_E4M3 if self.gw_format == "fp8" else self.rounding

    @property
    def gx_rounding(self) -> str:
        """The g_x path's rounding argument: ``quant.FP8_E4M3`` for FP8 values
        (``gx_format="fp8"``), else the configured rounding."""
        return FP8_E4M3 if self.gx_format == "fp8" else self.rounding

    @property
    def gx_block(self) -> int:
        """Hadamard block of the g_x path; 1 (identity transform) without Hadamard."""
        return self.block if self.hadamard else 1

    @property
    def hq_args(self) -> tuple:
        """The trailing arguments of the HQ ops (``hq_grad_input``, ``hq_conv_grad_input``)."""
        return (
            self.gx_bits,
            self.gx_scaling,
            self.gx_rounding,
            self.weight_scale,
            self.gx_block,
            self.name,
            self.lqs_key,
            self.check,
        )

    @property
    def gx_quantized(self) -> bool:
        return not self.exact and self.gx_bits is not None

    @property
    def gw_exact(self) -> bool:
        return self.exact or (self.gw_bits is None and not self.hla_rows)


def _linear_geometry(spec: LayerSpec, x: torch.Tensor) -> tuple[torch.Tensor, int, tuple]:
    """``x`` as ``[N, S, I]`` samples × positions, the map width (0: sequence), and HLA rows.

    2-D inputs have one row per sample: no HLA unless ``hla_2d == "batch"`` (then the batch is
    one sequence). 4-D inputs ``[B, H, W, C]`` are spatial maps blocked in √n×√n patches.
    """
    I = x.shape[-1]
    if x.dim() == 2:
        rows = spec.hla_rows if spec.hla_2d == "batch" else ()
        return x.reshape(1, x.shape[0], I), 0, rows
    grid_w = x.shape[2] if x.dim() == 4 and patch_side(spec.block) else 0
    return x.reshape(x.shape[0], -1, I), grid_w, spec.hla_rows


_M32 = 0xFFFFFFFF


def _hash_signs(t3: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """±1 ``[N, S, 1]`` (t3's dtype): a hash of each sample and position, salted with the bits
    of the layer's first and last weight (which change at every optimizer step).

    Not an RNG draw: inside a compiled graph the min-cut partitioner recomputes input-less
    random ops (``torch.randint``, and ``rand_like`` once decomposed to ``aten.rand``) in the
    backward, with new values, so g_y would get other signs than x (seen on torch 2.13). Not a
    hash of the activation either: inductor may recompute an activation in the backward with
    other float rounding than the forward had (seen: LayerNorm's output), and one flipped bit
    flips a sign. The weight is a graph input: every recompute reads the same bits, and
    integer ops give the same hash on any device. The signs do not depend on the data, so
    over steps (salts) ``2·g_yᵀ D Π D x`` averages to ``g_yᵀ x``. A weight that stops
    changing (a frozen layer needs no g_w; lr 0) repeats its signs.
    """
    w = weight.detach().reshape(-1)
    ends = torch.stack([w[0], w[-1]]).float().view(torch.int32).to(torch.int64) & _M32
    salt = (ends[0] * 0x27D4EB2F + ends[1] * 0x165667B1) & _M32
    # the token's index first (inductor folds arange arithmetic into an index expression,
    # which Triton computes in int32: keep it small), then the salt, which no index folds
    # into; every multiplier is below 2^31 (Triton rejects larger literals next to int32
    # operands: seen on the H100) and every product of a 32-bit value by one fits int64
    n, s = t3.shape[0], t3.shape[1]
    token = torch.arange(n, device=t3.device).view(-1, 1, 1) * s
    token = token + torch.arange(s, device=t3.device).view(1, -1, 1)
    h = (token + salt) & _M32
    h = h ^ (h >> 16)  # lowbias32 (a 32-bit integer hash with full avalanche)
    h = (h * 0x21F0AAAD) & _M32
    h = h ^ (h >> 15)
    h = (h * 0x735A2D97) & _M32
    h = h ^ (h >> 15)
    return 1 - 2 * ((h >> 7) & 1).to(t3.dtype)


def _signs(spec: LayerSpec, rows, x3: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """HLA's signs D (:func:`_hash_signs` of the layer's ``weight``) when the layer runs HLA
    with ``hla_signs``, else None: the same D on x and g_y makes ``2·g_yᵀ D Π D x`` an
    unbiased estimate of ``g_yᵀ x`` over steps (``HotConfig.hla_signs``)."""
    return _hash_signs(x3, weight) if spec.hla_signs and rows else None


def _unbiased(gw: torch.Tensor, signs: torch.Tensor | None, rows, block: int) -> torch.Tensor:
    """g_w of the signed HLA times ``n/r``, since ``E[D Π D] = diag(Π) = (r/n)·I`` (Π projects
    onto r of the n ±1 Walsh rows of each block: every diagonal entry is r/n; 2 at the
    default r = 8 of 16); as is without signs."""
    return gw if signs is None else gw * (block / len(rows))


def _compress(
    spec: LayerSpec, x3: torch.Tensor, grid_w, rows, weight: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """What the forward saves for the weight gradient (ABC), given ``x3: [N, S, D]``; with
    ``hla_signs`` the compressed x is signed and the signs come last (:func:`_weight_grad`
    takes them). The quantized ops multiply by the signs as they read (no signed copies)."""
    signs = _signs(spec, rows, x3, weight)
    if spec.gw_bits is None:  # HLA without quantization: keep T x in float32
        xs = signed(x3, signs)
        out: tuple[torch.Tensor, ...] = (hla_transform(xs, grid_w, tuple(rows), spec.block),)
    else:
        out = tuple(
            ops.abc_compress(
                x3, grid_w, list(rows), spec.block, spec.gw_bits, spec.gw_rounding, signs
            )
        )
    return out if signs is None else (*out, signs)


def _weight_grad(spec: LayerSpec, gy3: torch.Tensor, saved, grid_w, rows) -> torch.Tensor:
    """HLA g_w ``[O, D]`` (float32) from ``gy3: [N, S, O]`` and what :func:`_compress` saved."""
    signs = None
    if spec.hla_signs and rows:
        *saved, signs = saved
    if spec.gw_bits is None:
        g_t = hla_transform(signed(gy3, signs), grid_w, tuple(rows), spec.block)
        return _unbiased(g_t.t() @ saved[0] / spec.block, signs, rows, spec.block)
    xq, sx = saved
    gw = ops.hla_grad_weight(
        gy3,
        xq,
        sx,
        grid_w,
        list(rows),
        spec.block,
        spec.gw_bits,
        spec.gw_rounding,
        spec.name,
        spec.check,
        signs,
    )
    return _unbiased(gw, signs, rows, spec.block)


def _weight_grad_dense(
    spec: LayerSpec, gy3: torch.Tensor, x3: torch.Tensor, grid_w, rows, weight: torch.Tensor
):
    """HOT's g_w from the full-precision activation (ABC off): x is what the forward saved."""
    if spec.gw_bits is None:
        return _weight_grad(spec, gy3, _compress(spec, x3, grid_w, rows, weight), grid_w, rows)
    signs = _signs(spec, rows, x3, weight)
    gw = ops.hla_grad_weight_dense(
        gy3,
        x3,
        grid_w,
        list(rows),
        spec.block,
        spec.gw_bits,
        spec.gw_rounding,
        spec.name,
        spec.check,
        signs,
    )
    return _unbiased(gw, signs, rows, spec.block)


def _probe_hla(spec: LayerSpec, gy3: torch.Tensor, x3: torch.Tensor, grid_w, rows) -> None:
    """Calibration only: record HLA's g_w error on this backward's real g_y and x."""
    if spec.hla_probe and rows and spec.lqs_key:
        lqs.observe_hla(spec.lqs_key, gy3, x3, grid_w, tuple(rows), spec.block)


def _input_grad(
    spec: LayerSpec, gy2: torch.Tensor, w2, raw_amax: bool = False, given: tuple | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """g_x ``[L, I]`` = ``gy2 [L, O] · w2 [O, I]``, through HQ unless exact; and, with
    ``raw_amax`` on the native CUDA path, g_y's max-abs bits from HQ's kernel (else None).
    On the native path ``w2`` is the pair ``(codes, scale)`` the forward quantized
    (:func:`_native_weight_codes`), and ``given`` HQ's operand of g_y where g_y's producer
    made it (:func:`_given_gy`)."""
    if not spec.gx_quantized:
        return gy2 @ w2.to(gy2.dtype), None
    if spec.lowering == "native":
        wq, sw = w2
        if gy2.shape[0] == 0:
            return gy2.new_zeros((0, wq.shape[0])), None
        return native.grad_input_codes(
            gy2, wq, sw, spec.gx_bits, spec.per_token, spec.gx_rounding, raw_amax, given,
            spec.fast_gx,
        )  # fmt: skip
    return ops.hq_grad_input(gy2, w2, *spec.hq_args), None


def _native_weight_codes(
    spec: LayerSpec, weight: torch.Tensor, dtype: torch.dtype | None, late: bool = False
) -> list[torch.Tensor]:
    """The weight's half of HQ on the native path: the weight's codes and scale
    (:func:`hotcompile.lowering.hot.weight_codes`) from the weight as the forward's GEMM reads
    it, cast to ``dtype`` (the autocast dtype inside an autocast region, which the forward
    casts anyway; None: as it is) — in the forward, saved in place of the weight, or with
    ``spec.weight_codes_late`` (``late``) in the backward, from the saved parameter. There
    nothing else reads the cast copy, so the codes are made from the parameter with the
    rounding in the kernel (CUDA, fp32 to bf16) and no copy is written."""
    cast = dtype is not None and weight.dtype != dtype and not late
    w = weight.to(dtype) if cast else weight
    rest = (spec.gx_bits, spec.gx_rounding, spec.weight_scale)
    return list(native.weight_codes(w, *rest, dtype=dtype if late else None))


@contextlib.contextmanager
def _traced_meta(key: str, value: Any) -> Iterator[None]:
    """Set ``meta[key] = value`` on every graph node traced inside: AOT copies a few fields
    of ``torch.fx.traceback``'s current meta onto each new node (``recompute``, ``custom``
    among them, since before torch 2.11). Outside a trace (eager, or no preserved node meta)
    it does nothing."""
    from torch.fx import traceback as fx_traceback

    if not fx_traceback.has_preserved_node_meta():
        yield
        return
    meta = fx_traceback.current_meta
    missing = object()
    before = meta.get(key, missing)
    meta[key] = value
    try:
        yield
    finally:
        if before is missing:
            meta.pop(key, None)
        else:
            meta[key] = before


def _recomputed() -> contextlib.AbstractContextManager[None]:
    """Tag the graph nodes traced inside as ``MUST_RECOMPUTE`` for the min-cut partitioner.

    AOTAutograd partitions the joint graph by data dependence, not by where a node was traced:
    a computation in the backward that reads only forward values (the weight's codes, made
    from the parameter) is placed in the forward and its result saved. The weight codes made
    late would then be saved anyway (a ``triton_op`` is never recomputed by choice: the GPU's
    Llama kept all 0.5 GiB of them, 2026-11-27). The tag — the one activation checkpointing
    uses — makes the partitioner run them in the backward."""
    from torch.utils.checkpoint import CheckpointPolicy

    return _traced_meta("recompute", CheckpointPolicy.MUST_RECOMPUTE)


def _saved() -> contextlib.AbstractContextManager[None]:
    """Tag the graph nodes traced inside as ``MUST_SAVE`` for the min-cut partitioner, unless
    a policy is already in force (activation checkpointing sets ``PREFER_RECOMPUTE`` while it
    traces a region: its choice stands).

    The forward's weight codes (``weight_codes="forward"``) read only the parameter, so the
    partitioner may recompute them in the backward from the parameter it holds anyway. It
    did so for every layer on the CPU (ATen quantizers) and, under ``forward="fp8"``, for the
    0.67B Llama's q/k/v/o/gate/up on the H200 (session 32: 48 weights, four launches each, in
    a backward whose host already lagged the GPU). With the tag the CPU suite's models and the
    GPU test's MLP (aot_eager) save them, as the option says. The Llama's, compiled by
    inductor, still went to the backward. Torch 2.11's min-cut bans recomputation only of
    nodes the forward's outputs need, and the codes are the backward's alone. Under inductor a
    parameter is free to save, so the cut lands at it
    (``experiments/results/step_code_llama_h200_s32.md``, read in the source; on the H200 in
    session 33 inductor's partition of a small SwiGLU also saved fewer codes than aot_eager's,
    tag or no tag: ``tools/results/fp8_forward_h200_s33.md``). Since session 33
    ``forward="fp8"`` makes the codes in the backward by default."""
    from torch.fx import traceback as fx_traceback
    from torch.utils.checkpoint import CheckpointPolicy

    if fx_traceback.has_preserved_node_meta() and "recompute" in fx_traceback.current_meta:
        return contextlib.nullcontext()
    return _traced_meta("recompute", CheckpointPolicy.MUST_SAVE)


def _traced_custom(key: str, value: Any) -> contextlib.AbstractContextManager[None]:
    """:func:`_traced_meta` of ``meta["custom"][key] = value``, the field user annotations
    use, kept alongside them."""
    from torch.fx import traceback as fx_traceback

    custom = fx_traceback.current_meta.get("custom") or {}
    return _traced_meta("custom", {**custom, key: value})


#: the key, in a traced node's ``meta["custom"]``, of the native ABC compression it belongs to
#: (one number per call): ``hotcompile.passes.abc_recompute`` finds the compressions by it
ABC_GROUP = "hotcompile_abc"
_abc_groups = itertools.count()


def _abc_group() -> contextlib.AbstractContextManager[None]:
    """Mark the graph nodes traced inside as one native ABC compression.

    On the ops path a compression is one ``hotcompile.abc_compress`` node, which the joint
    pass recognises; on the native path it is several (a max-abs written as ATen, the
    ``triton_op``'s kernel calls, their buffers), so each new node gets
    ``meta["custom"][ABC_GROUP]``."""
    return _traced_custom(ABC_GROUP, next(_abc_groups))


#: the key, in a traced node's ``meta["custom"]``, of the nodes that make codes the forward
#: saves in place of their input (``HotConfig.abc_swiglu``): they read that input for the
#: forward only (``hotcompile.passes.abc_recompute`` does not count them as the backward's)
SAVED_CODES = "hotcompile_codes"


def _saved_codes() -> contextlib.AbstractContextManager[None]:
    """Mark the graph nodes traced inside as making codes saved in place of their input."""
    return _traced_custom(SAVED_CODES, True)


def _autocast_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast runs this device's GEMMs in, when it is on."""
    dev = t.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


def _native_compress(spec: LayerSpec, x3: torch.Tensor, grid_w, rows, weight: torch.Tensor):
    """ABC on the native path (:func:`hotcompile.lowering.hot.compress`): the codes of x as
    the forward's GEMM reads it (the autocast dtype inside an autocast region, as the ops'
    autocast rule casts it), then the signs when the layer has them."""
    dtype = _autocast_dtype(x3)
    if dtype is not None and x3.is_floating_point() and x3.dtype != dtype:
        x3 = x3.to(dtype)
    if spec.gw_bits is None:  # unquantized HLA: no op layer to bypass, the ops path's own
        return _compress(spec, x3, grid_w, rows, weight)
    signs = _signs(spec, rows, x3, weight)
    with _abc_group():
        out = native.compress(
            x3, grid_w, tuple(rows), spec.gw_bits, spec.gw_rounding, signs,
            producer_amax=spec.abc_max_abs == "producer",
        )  # fmt: skip
    return out if signs is None else (*out, signs)


#: ABC codes of x computed while a graph is traced, by ``id(x)``: (a weak reference to x, the
#: settings and version they were computed for, the codes) — see :func:`_native_compress_once`
_TRACED_CODES: dict[int, tuple[weakref.ref, tuple, list]] = {}


def _native_compress_once(spec: LayerSpec, x, x3, grid_w, rows, weight: torch.Tensor):
    """:func:`_native_compress`, once per traced ``x`` and settings: layers that read one x
    (a Llama's gate and up, q/k/v) save one set of its codes, computed by one kernel.

    Inductor merges identical ATen (the CPU path's quantizers) but not two launches of a
    ``triton_op`` kernel, each of which allocates its own outputs: on CUDA gate and up each
    quantized the same x (34 µs a layer on the benchmark's Llama,
    ``experiments/results/layer_passes_h100.md``) and the forward saved both copies. Only while
    tracing (fake tensors: nothing is held across steps), keyed by the very tensor object and
    its version counter (an in-place change of x between the layers computes anew); layers
    with HLA's signs (a hash salted by each layer's weight) always compute their own."""
    from torch._subclasses.fake_tensor import is_fake

    if spec.gw_bits is None or (spec.hla_signs and rows) or not is_fake(x):
        return _native_compress(spec, x3, grid_w, rows, weight)
    key = (
        x._version, tuple(x3.shape), grid_w, tuple(rows), spec.gw_bits, spec.gw_rounding,
        spec.abc_max_abs, _autocast_dtype(x3),
    )  # fmt: skip
    hit = _traced_get(_TRACED_CODES, x, key)
    if hit is not None:
        return hit
    out = _native_compress(spec, x3, grid_w, rows, weight)
    _traced_put(_TRACED_CODES, x, key, out)
    return out


def _traced_get(cache: dict, t: torch.Tensor, key: tuple):
    """What :func:`_traced_put` kept for this very tensor object and ``key``, else None."""
    hit = cache.get(id(t))
    return hit[2] if hit is not None and hit[0]() is t and hit[1] == key else None


def _traced_put(cache: dict, t: torch.Tensor, key: tuple, value) -> None:
    """Keep ``value`` for ``t`` (by ``id``, dropped with ``t``) and ``key``."""
    i = id(t)
    cache[i] = (weakref.ref(t, lambda _r: cache.pop(i, None)), key, value)


#: HQ's operand of a g_y made by g_y's producer while a graph is traced, by ``id(g_y)``: see
#: :class:`HotSwiGLUFunction`
_TRACED_GY: dict[int, tuple[weakref.ref, tuple, tuple]] = {}


def _gy_key(spec: LayerSpec, in_features: int, gy: torch.Tensor) -> tuple:
    """What HQ's operand of ``gy`` depends on for a layer of ``spec`` with ``in_features``."""
    fp8, pad = native.gy_operand_layout(in_features, spec.gx_bits, spec.gx_rounding, gy.device)
    return (gy._version, spec.gx_bits, spec.gx_rounding, spec.per_token, fp8, pad)


def _given_gy(spec: LayerSpec, in_features: int, gy: torch.Tensor) -> tuple | None:
    """HQ's operand of ``gy`` if its producer made it for these settings (traced only)."""
    from torch._subclasses.fake_tensor import is_fake

    if not _TRACED_GY or spec.lowering != "native" or not spec.gx_quantized or not is_fake(gy):
        return None  # (nothing kept: swiglu_hq is off, or no SwiGLU in this trace)
    return _traced_get(_TRACED_GY, gy, _gy_key(spec, in_features, gy))


#: the g_w operand of a g_y made by g_y's producer while a graph is traced, by ``id(g_y)``:
#: see :class:`HotSwiGLUFunction`
_TRACED_GW: dict[int, tuple[weakref.ref, tuple, tuple]] = {}


def _gw_key(spec: LayerSpec, gy: torch.Tensor) -> tuple:
    """What the g_w operand of ``gy`` depends on besides its samples (kept with it)."""
    return (gy._version, spec.gw_bits, spec.gw_rounding)


def _given_gw(spec: LayerSpec, gy3: torch.Tensor, gy: torch.Tensor, grid_w, rows):
    """The g_w operand ``(codes [O, R], scale)`` of ``gy`` (as ``gy3 [N, S, O]``) if its
    producer made it for a layer of these settings whose operand is gy's plain rows over as
    many samples (traced only), else None. The samples are compared without a guard: a
    dynamic batch stays dynamic."""
    from torch._subclasses.fake_tensor import is_fake
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if not _TRACED_GW or not is_fake(gy) or spec.gw_bits is None:
        return None
    if not native.plain_rows(grid_w, tuple(rows), bool(spec.hla_signs and rows)):
        return None
    kept = _traced_get(_TRACED_GW, gy, _gw_key(spec, gy))
    if kept is None or not statically_known_true(gy3.shape[0] == kept[0]):
        return None
    return kept[1]


def _swiglu_gw_request(spec: LayerSpec, g: torch.Tensor) -> tuple | None:
    """``(samples, bits, rounding)`` of the g_w operand the gate and up layers of ``spec``
    will make of their g_y (:func:`_native_weight_grad`: ABC on the native path, plain
    rows), for the SwiGLU backward to make it instead; None where they make another. The
    layers' geometry is :func:`_linear_geometry`'s of their input, whose shape ``g`` shares;
    ``samples`` is its first size as it is (a symbolic size is not specialized)."""
    if (
        spec.lowering != "native"
        or spec.gw_exact
        or not spec.abc
        or spec.gw_bits is None
        or g.dim() not in (2, 3)
    ):
        return None
    g3, grid_w, rows = _linear_geometry(spec, g)
    if not native.plain_rows(grid_w, tuple(rows), bool(spec.hla_signs and rows)):
        return None
    return (g3.shape[0], spec.gw_bits, spec.gw_rounding)


def _shares_gy_amax(spec: LayerSpec, ctx) -> bool:
    """Both gradients on the native path, HQ quantizes g_y, and the g_w operand is g_y's plain
    rows: HQ's kernel takes g_y's max-abs for the g_w codes (one read of g_y fewer)."""
    return (
        spec.lowering == "native"
        and spec.gx_quantized
        and ctx.needs_input_grad[0]
        and ctx.needs_input_grad[1]
        and not spec.gw_exact
        and spec.abc
        and spec.gw_bits is not None
        and native.plain_rows(ctx.grid_w, tuple(ctx.rows), bool(spec.hla_signs and ctx.rows))
    )


def _native_weight_grad(
    spec: LayerSpec, gy3: torch.Tensor, saved, grid_w, rows, gy_amax=None, given=None
):  # fmt: skip
    """HLA g_w on the native path from what :func:`_native_compress` saved; ``given``: g_y's
    operand as its producer made it (:func:`_given_gw`)."""
    if spec.gw_bits is None:
        return _weight_grad(spec, gy3, saved, grid_w, rows)
    signs = None
    if spec.hla_signs and rows:
        *saved, signs = saved
    xq, sx = saved
    return native.grad_weight(
        gy3, xq, sx, grid_w, tuple(rows), spec.gw_bits, spec.gw_rounding, signs, gy_amax,
        given,
    )  # fmt: skip


def is_empty(t: torch.Tensor) -> bool:
    """``t`` has no elements, where that is certain (a symbolic size is not guarded on)."""
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    return bool(guard_or_false(t.numel() == 0))


def _weight_operands_together(spec: LayerSpec, x, weight, w_cast) -> bool:
    """Whether the forward makes W's FP8 copy and HQ's codes of W in one pair of passes
    (:func:`hotcompile.lowering.hot.weight_operands`): a rowwise FP8 forward that runs the
    FP8 GEMM, both operands of W as that GEMM reads it (HQ's codes of the autocast copy, or of
    W itself outside autocast, when that is the FP8 copy's dtype too), and a weight whose
    shape the fused pass was measured to pay for (``native.weight_operands_pay``)."""
    return (
        spec.forward == "fp8_rowwise"
        and fp8.takes_gemm(x, weight)
        and (w_cast or weight.dtype) == fp8.out_dtype(x)
        and native.weight_operands_pay(weight.shape, spec.gx_rounding, spec.weight_scale)
    )


class HotLinearFunction(torch.autograd.Function):
    """``F.linear`` with HOT's backward. An empty input (a zero-size batch) takes the exact
    backward: HOT's per-tensor scales would reduce over nothing."""

    @staticmethod
    def forward(ctx, x, weight, bias, spec: LayerSpec):
        if is_empty(x):
            spec = dataclasses.replace(spec, exact=True, forward="bf16")
        ctx.spec = spec
        ctx.x_shape = x.shape
        ctx.x_dtype = x.dtype
        ctx.b_dtype = bias.dtype if bias is not None else None
        need_gw = ctx.needs_input_grad[1]
        ctx.w_dtype = weight.dtype
        # native HQ: the weight's codes (quantized here, from the forward's copy) are saved,
        # and W itself only where the backward still reads it (HLA's signs without ABC); with
        # spec.weight_codes_late the backward makes the codes from W (a parameter: saving it
        # holds no memory of its own), cast as the forward's GEMM read it
        w_codes = spec.lowering == "native" and spec.gx_quantized and ctx.needs_input_grad[0]
        ctx.w_late = w_codes and spec.weight_codes_late
        ctx.w_early = w_codes and not ctx.w_late
        ctx.w_cast = _autocast_dtype(weight) if w_codes else None
        keep_w = not w_codes or (need_gw and not spec.abc and not spec.gw_exact)
        ctx.save_w = keep_w or ctx.w_late
        w_fp8 = None  # the forward's FP8 copy of W, where made with HQ's codes of it
        if ctx.w_early and _weight_operands_together(spec, x, weight, ctx.w_cast):
            hq, hq_scale, w8, w8_scale = native.weight_operands(
                weight, spec.gx_bits, spec.gx_rounding, spec.weight_scale, fp8.out_dtype(x)
            )
            saved, w_fp8 = [hq, hq_scale], (w8, w8_scale[None, :])
        elif ctx.w_early:
            with _saved():
                saved = _native_weight_codes(spec, weight, ctx.w_cast)
        else:
            saved = []
        if spec.forward == "bf16":
            y = F.linear(x, weight, bias)
        else:  # "fp8_rowwise" / "fp8_tensorwise"
            scaling = spec.forward.removeprefix("fp8_")
            x8 = _swiglu_fp8_operand(x) if scaling == "rowwise" else None
            y = fp8.linear(x, weight, bias, scaling, w_fp8, spec.fast_forward, x8)
        saved += [weight] if ctx.save_w else []
        if need_gw:
            if spec.gw_exact or not spec.abc:
                saved.append(x)
            else:
                x3, ctx.grid_w, ctx.rows = _linear_geometry(spec, x)
                ctx.x3_ns = x3.shape[:2]
                if spec.lowering == "native":
                    codes = _swiglu_codes_of(spec, x, ctx.rows)
                    if codes is not None:  # ABC of the SwiGLU product from its saved codes
                        saved.extend(_native_compress_swiglu(spec, x, x3, ctx.rows, codes))
                    else:
                        saved.extend(
                            _native_compress_once(spec, x, x3, ctx.grid_w, ctx.rows, weight)
                        )
                else:
                    saved.extend(_compress(spec, x3, ctx.grid_w, ctx.rows, weight))
        ctx.save_for_backward(*saved)
        return y

    @staticmethod
    def backward(ctx, gy):
        spec: LayerSpec = ctx.spec
        saved = list(ctx.saved_tensors)
        w_codes = (saved.pop(0), saved.pop(0)) if ctx.w_early else None
        weight = saved.pop(0) if ctx.save_w else None
        if ctx.w_late:  # (w_codes: the input needs its gradient)
            with _recomputed():
                w_codes = _native_weight_codes(spec, weight, ctx.w_cast, late=True)
        O = gy.shape[-1]
        gy2 = gy.reshape(-1, O)
        gx = gw = gb = gy_amax = None
        if ctx.needs_input_grad[0]:
            w2 = w_codes if w_codes is not None else weight
            given = _given_gy(spec, w_codes[0].shape[0], gy) if w_codes is not None else None
            gx, gy_amax = _input_grad(spec, gy2, w2, _shares_gy_amax(spec, ctx), given)
            gx = gx.reshape(ctx.x_shape).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            if spec.gw_exact:
                x = saved[0]
                gw = gy2.t() @ x.reshape(-1, x.shape[-1]).to(gy2.dtype)
            elif not spec.abc:  # HOT math, but x kept in full and compressed in the backward
                x3, grid_w, rows = _linear_geometry(spec, saved[0])
                gy3 = gy.reshape(x3.shape[0], x3.shape[1], O)
                _probe_hla(spec, gy3, x3, grid_w, rows)
                gw = _weight_grad_dense(spec, gy3, x3, grid_w, rows, weight)
            else:
                gy3 = gy.reshape(ctx.x3_ns[0], ctx.x3_ns[1], O)
                if spec.lowering == "native":
                    given_gw = _given_gw(spec, gy3, gy, ctx.grid_w, ctx.rows)
                    gw = _native_weight_grad(
                        spec, gy3, saved, ctx.grid_w, ctx.rows, gy_amax, given_gw
                    )
                else:
                    gw = _weight_grad(spec, gy3, saved, ctx.grid_w, ctx.rows)
            gw = gw.to(ctx.w_dtype)
        if ctx.needs_input_grad[2]:
            gb = gy2.sum(0).to(ctx.b_dtype)
        return gx, gw, gb, None


class HotSwiGLUFunction(torch.autograd.Function):
    """``silu(a) * b`` — a gated MLP's product of its gate and up layers' outputs — whose
    backward also makes HQ's operands of both gradients, for the HOT layers gate and up
    (``HotConfig.swiglu_hq``).

    The forward is the same ATen as the model's (inductor fuses it as before). The backward
    computes autograd's formulas for g_a and g_b and, while the graph is traced, keeps HQ's
    per-token operand of each (:func:`hotcompile.lowering.hot.swiglu_backward`: on CUDA made
    by the kernel that makes g_a / g_b, one pass; elsewhere by :func:`~hotcompile.lowering.
    hot.quantize_gy`, the same values) for the very g_y tensor it returns. The gate and up
    layers' backwards find it (:func:`_given_gy`) instead of reading their g_y again; a g_y
    that reaches a layer by another way (summed with another gradient, changed in place)
    is another tensor, and that layer quantizes its own.

    ``codes`` (``HotConfig.abc_swiglu``): the forward saves ``a`` and ``b`` as FP8 codes
    with a scale per token (:func:`hotcompile.lowering.hot.swiglu_codes`: half their bf16
    bytes, the largest tensors a Llama block saves) and the backward reads those instead."""

    @staticmethod
    def forward(ctx, a, b, spec: LayerSpec, in_features: int, codes: bool = False,
                share: bool = False, fp8_product: bool = False):  # fmt: skip
        ctx.spec, ctx.in_features, ctx.codes = spec, in_features, codes
        x8 = None
        if codes and share and fp8_product:
            # down reads neither the product (its FP8 operand comes from here) nor a's and
            # b's bf16 values (its ABC codes are derived from the codes): one kernel
            with _saved_codes():
                *saved, yq, ys = native.swiglu_forward(a, b, "fp8")
            x8 = (yq, ys)
            ctx.save_for_backward(*saved)
        elif codes:
            with _saved_codes():
                saved = (*native.swiglu_codes(a), *native.swiglu_codes(b))
            ctx.save_for_backward(*saved)
        else:
            ctx.save_for_backward(a, b)
        y = F.silu(a) * b  # (where nothing reads it, inductor drops it)
        if codes and share:
            _share_swiglu_codes(y, saved, x8)
        return y

    @staticmethod
    def backward(ctx, g):
        from torch._subclasses.fake_tensor import is_fake

        scales = {}
        if ctx.codes:  # 2-D codes, read as they are (lowering.hot.swiglu_backward)
            a, sa, b, sb = ctx.saved_tensors
            scales = {"a_scale": sa, "b_scale": sb}
        else:
            a, b = ctx.saved_tensors
        spec: LayerSpec = ctx.spec
        fp8, pad = native.gy_operand_layout(ctx.in_features, spec.gx_bits, spec.gx_rounding,
                                            g.device)  # fmt: skip
        gw = _swiglu_gw_request(spec, g) if is_fake(g) else None
        ga, gb, qa, qb, w_ops = native.swiglu_backward(
            a, b, g, spec.gx_bits, spec.gx_rounding, fp8, pad, **scales, gw=gw
        )
        if is_fake(ga):
            for i, (gy, q) in enumerate(((ga, qa), (gb, qb))):
                if q is None:  # no kernel for these rows: the operand as the layer makes it
                    gy2 = gy.reshape(-1, gy.shape[-1])
                    q = native.quantize_gy(
                        gy2, spec.gx_bits, spec.per_token, spec.gx_rounding, fp8, pad, True
                    )
                _traced_put(_TRACED_GY, gy, _gy_key(spec, ctx.in_features, gy), q)
                if w_ops is not None:
                    _traced_put(_TRACED_GW, gy, _gw_key(spec, gy), (gw[0], w_ops[i]))
        return ga, gb, None, None, None, None, None


def hot_swiglu(
    a, b, spec: LayerSpec | None = None, in_features: int = 0, codes: bool = False,
    share: bool = False, fp8_product: bool = False,
):  # fmt: skip
    """``F.silu(a) * b`` whose backward makes HQ's operands of g_a and g_b for the HOT layers
    that produced ``a`` and ``b`` (:class:`HotSwiGLUFunction`); ``spec``: theirs; ``codes``:
    save ``a`` and ``b`` as FP8 codes (``HotConfig.abc_swiglu``); ``share``: the HOT layer
    that reads the product derives its ABC codes from those codes
    (:func:`_share_swiglu_codes`); ``fp8_product`` (with both): that layer runs the rowwise
    FP8 forward, whose operand of the product the kernel that makes the codes writes too
    (:func:`hotcompile.lowering.hot.swiglu_forward`)."""
    if spec is None or not _wants_grad(a, b):
        return F.silu(a) * b
    return HotSwiGLUFunction.apply(a, b, spec, in_features, codes, share, fp8_product)


#: a SwiGLU's saved FP8 codes of its gate and up outputs, by ``id`` of its product, while a
#: graph is traced: see :func:`_share_swiglu_codes`
_TRACED_SWIGLU: dict[int, tuple[weakref.ref, tuple, tuple]] = {}


def _share_swiglu_codes(y: torch.Tensor, saved: tuple, x8: tuple | None = None) -> None:
    """Offer the down projection (the HOT layer that reads ``y = silu(a) * b``) the SwiGLU's
    saved codes ``(ca, sa, cb, sb)`` of ``a`` and ``b``, from which it derives ABC's codes of
    ``y`` (:func:`_native_compress_swiglu`) instead of from ``y`` itself, and ``x8``, the
    rowwise FP8 operand of ``y`` for its FP8 forward when made already
    (:func:`_swiglu_fp8_operand`).

    Why: under ``abc_swiglu="fp8"`` the backward keeps only the codes of ``a`` and ``b``, so
    down's ABC codes of ``y`` — the other 0.5 GiB of the Llama's MLP — could not be
    re-derived there and were saved (H100 run 39). Derived from the saved codes, the
    partitioner recomputes them in the backward where ``abc_recompute`` is ``"unary"``
    (:mod:`hotcompile.passes.abc_recompute` takes a compression that reads only codes saved
    in place of their input). The rewrite asks for this only then (``share``): elsewhere
    the derivation would be a pass of its own in the forward for nothing. Traced only (fake
    tensors)."""
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(y):
        _traced_put(_TRACED_SWIGLU, y, (y._version,), (tuple(saved), x8))


def _shared_by_swiglu(x: torch.Tensor) -> tuple[tuple, tuple | None] | None:
    """What a SwiGLU offered for its product ``x`` (:func:`_share_swiglu_codes`): its saved
    codes and the FP8 operand (or None), else None. Traced only (fake tensors)."""
    from torch._subclasses.fake_tensor import is_fake

    if not _TRACED_SWIGLU or not is_fake(x):
        return None
    return _traced_get(_TRACED_SWIGLU, x, (x._version,))


def _swiglu_codes_of(spec: LayerSpec, x: torch.Tensor, rows) -> tuple | None:
    """The saved codes ``(ca, sa, cb, sb)`` a SwiGLU shared for its product ``x``
    (:func:`_share_swiglu_codes`), where this layer's ABC can be derived from them — codes
    quantized per tensor, token sequences (no patches), no HLA signs (they hash x itself) —
    else None."""
    if spec.gw_bits is None or (spec.hla_signs and rows) or x.dim() == 4:
        return None
    shared = _shared_by_swiglu(x)
    return shared[0] if shared is not None else None


def _native_compress_swiglu(spec: LayerSpec, x, x3, rows, codes: tuple):
    """ABC's codes of a SwiGLU's product ``x`` (as ``x3 [N, S, D]``) from the SwiGLU's saved
    codes (:func:`hotcompile.lowering.hot.compress_swiglu`), traced as one native ABC
    compression that reads those codes only: ``hotcompile.passes.abc_recompute`` tags it for
    recompute in the backward, which reads the codes anyway (the SwiGLU's backward). On CUDA,
    past ``hot.SWIGLU_ABC_ATEN_MAX_WIDTH``, one kernel makes the product from the codes as it
    quantizes it and never writes it (inductor's product kernel there took 599 µs a layer at
    the 8B MLP's width, the kernel 336); narrower products keep inductor's fused ATen."""
    gemm_dtype = _autocast_dtype(x) if x.is_floating_point() else None
    with _abc_group():
        return native.compress_swiglu(
            codes, tuple(x3.shape), tuple(rows), spec.gw_bits, spec.gw_rounding, x.dtype,
            gemm_dtype or x.dtype, producer_amax=spec.abc_max_abs == "producer",
        )  # fmt: skip


def _swiglu_fp8_operand(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rowwise FP8 operand ``(codes [rows, O], scales [rows])`` of ``x`` a SwiGLU made
    with its codes (:func:`_share_swiglu_codes`), where the FP8 forward reads x in its own
    dtype (the kernel quantized the product in ``a``'s), else None. Traced only.

    Why: the lean plan's forward then reads gate's and up's outputs once for everything
    (:func:`hotcompile.lowering.hot.swiglu_forward`), and the bf16 product is never written."""
    shared = _shared_by_swiglu(x) if fp8.out_dtype(x) == x.dtype else None
    return shared[1] if shared is not None else None


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


class HotConv2dFunction(torch.autograd.Function):
    """``F.conv2d`` (groups == 1) with HOT's backward on the im2col GEMM.

    A conv is the linear layer ``cols(x) [L, C·k²] · W[O, C·k²]ᵀ`` over output positions L.
    g_x runs HQ on that GEMM and folds the columns back (col2im); g_w runs HLA with 4x4
    patches of the output map as blocks, on the compressed im2col matrix saved by the forward.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, spec: LayerSpec):
        y = F.conv2d(x, weight, bias, spec.stride, spec.padding, spec.dilation, 1)
        ctx.spec = spec
        ctx.x_shape = x.shape
        ctx.x_dtype = x.dtype
        ctx.b_dtype = bias.dtype if bias is not None else None
        saved = [weight]
        if ctx.needs_input_grad[1]:
            if spec.gw_exact or not spec.abc:
                saved.append(x)
            else:
                ctx.rows = spec.hla_rows
                cols = _cols(x, weight, spec)
                saved.extend(_compress(spec, cols, y.shape[-1], ctx.rows, weight))
        ctx.save_for_backward(*saved)
        return y

    @staticmethod
    def backward(ctx, gy):
        spec: LayerSpec = ctx.spec
        weight, *saved = ctx.saved_tensors
        N, O, Ho, Wo = gy.shape
        gx = gw = gb = None
        exact_conv = dict(stride=spec.stride, padding=spec.padding, dilation=spec.dilation)
        if ctx.needs_input_grad[0]:
            if not spec.gx_quantized:
                gx = torch.nn.grad.conv2d_input(ctx.x_shape, weight.to(gy.dtype), gy, **exact_conv)
            else:
                gx = ops.hq_conv_grad_input(
                    gy,
                    weight,
                    list(ctx.x_shape[-2:]),
                    list(spec.stride),
                    list(spec.padding),
                    list(spec.dilation),
                    *spec.hq_args,
                )
            gx = gx.to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            if spec.gw_exact:
                gw = torch.nn.grad.conv2d_weight(
                    saved[0].to(gy.dtype), weight.shape, gy, **exact_conv
                )
            else:
                gy3 = gy.permute(0, 2, 3, 1).reshape(N, Ho * Wo, O)
                if spec.abc:
                    gw = _weight_grad(spec, gy3, saved, Wo, spec.hla_rows)
                else:
                    cols = _cols(saved[0], weight, spec)
                    _probe_hla(spec, gy3, cols, Wo, spec.hla_rows)
                    gw = _weight_grad_dense(spec, gy3, cols, Wo, spec.hla_rows, weight)
                gw = gw.reshape(weight.shape)
            gw = gw.to(weight.dtype)
        if ctx.needs_input_grad[2]:
            gb = gy.sum((0, 2, 3)).to(ctx.b_dtype)
        return gx, gw, gb, None


def _cols(x: torch.Tensor, weight: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
    """im2col of x as ``[N, Ho·Wo, C·k²]``, raster order of the output map."""
    cols = F.unfold(x, weight.shape[-2:], spec.dilation, spec.padding, spec.stride)
    return cols.transpose(1, 2)


def _wants_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    )


def hot_linear(x, weight, bias=None, spec: LayerSpec | None = None):
    """``F.linear`` whose backward is HOT's. Without autograd it is exactly ``F.linear``."""
    if spec is None or not _wants_grad(x, weight, bias):
        return F.linear(x, weight, bias)
    return HotLinearFunction.apply(x, weight, bias, spec)


def hot_conv2d(x, weight, bias=None, spec: LayerSpec | None = None):
    """``F.conv2d`` (groups 1) whose backward is HOT's. Without autograd it is ``F.conv2d``."""
    if spec is None:
        raise ValueError("hot_conv2d needs a LayerSpec")
    if not _wants_grad(x, weight, bias):
        return F.conv2d(x, weight, bias, spec.stride, spec.padding, spec.dilation, 1)
    return HotConv2dFunction.apply(x, weight, bias, spec)

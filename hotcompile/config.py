"""The one frozen configuration object of hotcompile.

Every knob of the method lives here, is validated here, and is hashed into the compile
cache key (see ``backend.HotCachePass``), so that changing an option can never make
inductor's cache serve a backward compiled for other settings.

``torch.compile(model, backend="hot", options={...})`` hands the options dict to
:func:`HotConfig.from_options`; ``options={"config": HotConfig(...)}`` passes a ready object
(other keys then override its fields).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

ROUNDINGS = ("stochastic", "pseudo_stochastic", "nearest")
GW_FORMATS = ("auto", "int8", "fp8")
GX_FORMATS = ("int", "fp8")
WEIGHT_SCALES = ("sawb", "maxabs")
GX_SCALINGS = ("lqs", "per_token", "per_tensor")
LQS_METRICS = ("transformed", "raw")
HLA_ROW_SETS = ("lp_l1", "sequency")
HLA_2D_MODES = ("none", "batch")
CONV_ABC_MODES = ("im2col",)
#: what hotcompile.passes.abc_recompute may recompute in the backward instead of saving codes
ABC_RECOMPUTE = ("auto", "views", "unary", "off")
#: where ABC of x's plain rows (native path, CUDA) takes x's max-abs from
ABC_MAX_ABS = ("kernel", "producer")
#: when the native g_x path quantizes the weight (``HotConfig.weight_codes``)
WEIGHT_CODES = ("auto", "forward", "backward")
#: what a fused SwiGLU saves of its gate and up outputs (``HotConfig.abc_swiglu``)
ABC_SWIGLU = ("auto", "fp8", "off")
COMPILERS = ("inductor", "aot_eager", "eager")
NONFINITE_CHECKS = ("once", "off")
#: kernel families on CUDA (hotcompile.kernels.dispatch): "auto" measures per shape
KERNEL_IMPLS = ("auto", "cutlass", "cuda", "triton", "torch")
#: how HOT's backward reaches the GPU (``hotcompile.lowering``)
LOWERINGS = ("auto", "native", "ops")
#: which layers take HOT's backward (``hotcompile.lowering.gate``)
PREFERENCES = ("speed", "memory", "paper")
#: the precision of a HOT layer's forward GEMM (``HotConfig.forward``)
FORWARDS = ("bf16", "fp8")
#: FP8 forward scales (``HotConfig.forward_scaling``)
FORWARD_SCALINGS = ("rowwise", "tensorwise")
#: which FP8 GEMMs accumulate with Hopper's fast accumulation (``fp8_fast_accum``)
FP8_FAST_ACCUM = ("all", "forward", "off")
#: numerics per model family (``HotConfig.recipe``)
RECIPES = ("auto", "text", "vision", "paper")
#: what a recipe sets, group by group: a group is applied only when every field in it is still
#: at its default, so an option the user passed is never overridden and a group never lands
#: half-way (``gx_format="fp8"`` without ``gx_bits=8`` would be invalid)
RECIPE_FIELDS: dict[str, tuple[dict[str, Any], ...]] = {
    # issue 16, H100, 32M byte LM, 3 seeds: -0.86% of bf16's validation loss (the paper's
    # INT4 g_x + HLA: +16.9%); tools/results/accuracy_gpu_lm_issue16/
    "text": ({"gx_bits": 8, "gx_format": "fp8"}, {"hla": False}),
    "vision": (),
    # the paper's settings where hotcompile's defaults differ: no HLA signs, INT8 g_w codes,
    # HOT's backward on every eligible layer
    "paper": ({"hla_signs": False}, {"gw_format": "int8"}, {"prefer": "paper"}),
}
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _recipe_changes(config: Any, recipe: str) -> dict[str, Any]:
    """The fields ``recipe`` sets on ``config``: its groups whose fields are all at their
    defaults (``RECIPE_FIELDS``)."""
    defaults = {f.name: f.default for f in dataclasses.fields(HotConfig)}
    changes: dict[str, Any] = {}
    for group in RECIPE_FIELDS.get(recipe, ()):
        if all(getattr(config, k) == defaults[k] for k in group):
            changes.update(group)
    return changes


class HotConfigError(ValueError):
    """An unknown or invalid hotcompile option. The message lists what is valid."""


def _fields() -> list[str]:
    return [f.name for f in dataclasses.fields(HotConfig)]


@dataclasses.dataclass(frozen=True)
class HotConfig:
    """Settings of HOT's backward rewrite. Defaults follow ``shared/docs/hot-method.md``.

    Attributes:
        block_size: Hadamard block length n along the reduced dimension (a power of two; the
            paper uses 16). HLA's row sets are defined on 16-blocks.
        hla_rank: r, how many of the n Walsh-Hadamard coefficients per block HLA keeps (8).
        hla_rows: ``"lp_l1"`` (the block read as a 4x4 patch, 2-D Walsh functions ordered by
            L1 sequency: r=8 gives rows {0,2,3,8,10,11,12,14}, r=10 the official code's set),
            ``"sequency"`` (1-D sequency 0..r-1), or an explicit tuple of row indices of H_n.
        hadamard: transform g_y and W with the block Hadamard before quantizing on the g_x path
            (HQ). False quantizes them directly: the "naive INT4" ablation.
        gx_bits: bit-width of the g_x path (HQ): 4 (paper), 8, or None for an exact g_x.
        gx_format: the g_x path's codes: ``"int"`` (paper: integers on the INT-``gx_bits``
            grid; on Hopper INT4-grid codes already travel as FP8-e4m3 into an FP8 GEMM) or
            ``"fp8"`` (FP8-e4m3 *values* of the Hadamard-transformed g_y with a max-abs/448
            scale per token or tensor, the weight likewise per tensor; needs ``gx_bits=8``):
            the same FP8 GEMM on Hopper with a finer grid, ~2^-4 relative step instead of
            1/7 of the row's max-abs (issue 16's candidate for language models).
        gw_bits: bit-width of the g_w path (HLA operands): 8 (paper), 4, or None for
            unquantized operands.
        gw_format: the 8-bit g_w codes: ``"int8"`` (paper: integer codes, s8 × s8 → s32 GEMM),
            ``"fp8"`` (FP8-e4m3 values with a max-abs/448 scale; needs ``gw_bits=8``) or
            ``"auto"`` (default): FP8 on the native lowering, INT8 elsewhere. Why: on Hopper the
            FP8 GEMM of the g_w path is 1.5–2.5× faster than ``torch._int_mm`` (H100, ViT-B
            qkv 38 vs 66 µs, fc1 51 vs 127 µs, LLM down 107 vs 158 µs;
            experiments/results/native_stages_h100.md) and decides whether HOT beats bf16 at all on
            LLM layers; its accuracy matches INT8's within the seeds' spread (CPU study, variant
            ``hot_fp8_gw`` in tools/results/accuracy.md). The paper chose INT8 for GPUs without
            FP8. ``gw_bits=4`` always uses INT codes.
        hla: apply HLA (the low-rank projection along L) on the g_w path. With a plan from
            :func:`hotcompile.calibrate`, a layer whose plan entry says ``hla=False`` runs its
            g_w path without the projection (INT8 of x and g_y only; the forward then saves
            INT8 x, twice ABC's bytes). ``hla=False`` turns HLA off everywhere, plan or not.
        hla_signs: multiply x and g_y by the same pseudo-random ±1 per token (a hash of the
            sample and position salted with the layer's weight, so new signs every optimizer
            step) before HLA's projection, and g_w by n/r (2 at rank 8 of 16): HLA then
            estimates ``g_yᵀx`` without bias. The paper's fixed low-pass is biased — it never
            sees the high-sequency part of g_yᵀx — and that bias is what breaks language
            models (byte LM, unquantized, 3 seeds: low-pass +17.3%, with random signs +0.5%;
            ``experiments/hla_estimators_lm.py``). Costs a small integer hash per layer and
            step; the kernels multiply as they read, so no signed copy of x or g_y is made.
            ``"auto"`` (default): signs on the layers whose input is computed from a token
            embedding (an embedding lookup of integer inputs the user passes — not of the
            model's own buffers such as ``position_ids``: text), the low-pass elsewhere (image
            patches and feature maps, where it is at least as good: CPU study, variant
            ``hot_hla_signs``). A graph split off its embedding (a graph break, a DDP bucket
            boundary, an FSDP2 hook) still knows: ``hotcompile.passes.family`` carries the
            marks; where it cannot it logs so — pass ``True`` then, or wrap the first call in
            ``hotcompile.passes.family.assume("text")``. ``True`` /
            ``False``: signs on every HLA layer / on none (the paper). The plan table's g_w
            column says ``HLA r=8 signs`` where they are on.
        hla_threshold: the HLA choice of :func:`hotcompile.calibrate`: per layer it measures
            ``e_hla = ‖g_yᵀΠx − g_yᵀx‖/‖g_yᵀx‖`` (Π: HLA's projection along L) on the real
            g_y and x of its calibration backward and keeps HLA iff ``e_hla <= hla_threshold``.
            HLA helps where g_y and x are smooth along L (image patches: e_hla well below the
            default) and loses much of g_w where they are not (text tokens: e_hla near or above
            it); see ``docs/numerics.md`` for the measurement behind the default. ``None``
            keeps HLA wherever ``hla`` is True, as the paper does. There is no run-time
            ("auto") choice: ABC saves the projected x in the forward, before any backward can
            be measured, so the choice must be made ahead, by ``calibrate``, and applied at
            compile time through ``plan``.
        gx_scaling: quantizer of the g_x operand g_y·B: ``"lqs"`` (default: chosen per layer
            from real gradients, see ``hotcompile.lqs``), ``"per_token"`` (one scale per row)
            or ``"per_tensor"`` everywhere.
        lqs_calibration_steps: backward steps per layer that run the exact g_x while LQS
            measures both quantizers' errors; then the choice freezes.
        lqs_metric: measure on the operand actually quantized (``"transformed"``, g_y·B) or on
            raw g_y (``"raw"``, the official code).
        lqs_threshold: per-token iff e_token < lqs_threshold · e_tensor (0.5, official).
        plan: a :class:`hotcompile.lqs.Plan` (or its JSON dict, or a path to it) from
            :func:`hotcompile.calibrate`; its layers skip calibration.
        warmup_steps: precision warm-up: the g_x path runs INT8 for each layer's first N
            backward steps, then ``gx_bits`` (the paper's pre-training recipe).
        rounding: rounding of gradient and activation operands: ``"pseudo_stochastic"``
            (NITI's RNG-free rule, deterministic, the default), ``"stochastic"`` (torch RNG),
            or ``"nearest"``. Weights are always rounded to nearest.
        weight_scale: scale of the quantized weight on the g_x path: ``"sawb"`` (official code,
            4-bit only; other widths use max-abs) or ``"maxabs"``.
        abc: save the compressed activation (INT8 low-pass, half the rows) instead of x.
        conv_abc: operand compressed for conv layers; ``"im2col"`` is the paper's.
        abc_recompute: where the backward can re-derive a layer's input from tensors it reads
            anyway, recompute the ABC codes there instead of saving them
            (``hotcompile.passes.abc_recompute``): ``"unary"`` (through view/copy and
            elementwise ops — fc2's codes, the largest ABC buffer of a transformer block, from
            fc1's output, which the activation's backward reads; a SwiGLU's down projection's
            from its gate and up outputs; an activation and a compression per block more in
            the backward: ViT-B/16 on the H100 saves 0.70× of inductor's activation bytes
            instead of 0.76× for 1.6% more step time under CUDA graphs, ops path,
            tools/results/bench_train_runs/run2_6f362ac.md), ``"views"`` (view/copy chains
            only: the attention output feeding ``proj``; the compression moves to the
            backward, no work added), ``"off"`` (the partitioner's own choice), ``"auto"``
            (default: ``"unary"`` on the ops path; on the native path ``"unary"`` under
            ``prefer="memory"``, else ``"off"``). On the native path (CUDA) a compression is
            several nodes, Triton kernels among them, recognised since 2026-11-27: ``"unary"``
            there cut the H100 Llama's saved activations from 5.32 to 4.67 GiB under
            ``prefer="memory"`` with ``weight_codes="backward"`` (peak 0.89× → 0.85× of
            inductor's, step +1.8 ms, ``tools/results/bench_train_runs/run32_*``). Its codes
            are the saved ones' bit for bit (ABC's scales are max-abs: no order-dependent
            sums; ``tests/test_lowering_gpu.py``); the step time it costs is why it is
            ``prefer="memory"``'s only.
        abc_max_abs: where ABC's per-tensor scale of x's plain rows (no HLA: the text recipe;
            native path on CUDA) gets x's max-abs: ``"producer"`` (default: a row max written as
            ATen, ``hotcompile.lowering.hot.amax_bits``, which inductor can compute in the
            kernel that writes x — an RMSNorm's, a SwiGLU product's — so that HOT's kernel
            reads x once; the same codes, bit for bit; the Llama's step on the H100 69.3 ms
            against 69.6 ms with ``"kernel"``, ``tools/results/bench_train_runs/run23_*``) or
            ``"kernel"`` (HOT's kernel reads x twice, a max-abs pass, then the codes).
        swiglu_hq: a gated MLP's product ``silu(gate(x)) * up(x)`` whose gate and up layers
            both take HOT's native path (per-token HQ) becomes one op whose backward also
            makes HQ's operands of both gradients: on CUDA the kernel that makes g_gate and
            g_up writes their codes too (``hotcompile.kernels.swiglu_triton``; the Llama's
            8192-wide rows on the H100: 301.7 µs against 371.4 for the SwiGLU backward then
            HQ twice, ``experiments/results/swiglu_hq_h100.md``), and the layers skip their own pass
            over g_y. Same codes bit for bit; g_gate within one bf16 ulp of inductor's. On by
            default since the Llama's step on the H100 took 68.9 ms with it against 70.3
            without (fresh processes, ``tools/results/bench_train_runs/run26_*``); ``False``
            keeps the SwiGLU backward inductor's and HQ's pass over each g_y its own.
        weight_codes: when the native g_x path makes HQ's codes of the weight. ``"forward"``:
            in the forward, from the autocast copy the forward's GEMM reads anyway, and saved
            for the backward (one byte per weight of every HOT layer held from the forward to
            the backward: the benchmark's Llama, 0.53 GiB by arithmetic). ``"backward"``: in the
            backward, from the parameter (cast to the forward's autocast dtype first: the same
            codes bit for bit); the weight operand of a rewritten call is always a parameter or
            a view of one, so saving it holds no memory of its own (under FSDP2, the unsharded
            parameter whose storage FSDP2 frees and refills) — the memory-first choice, at the
            price of casting the weight again. On the H100 (2026-11-27, with
            ``prefer="memory"``) it cut the Llama's peak from 13.69 to 13.19 GiB for a step
            0.5–1.6 ms slower (``tools/results/bench_train_runs/run31_*``, ``run32_*``).
            Gradients: bit-equal to the forward codes' where the weight's scale is max-abs
            (the text recipe); with INT4 SAWB (the vision recipe) they differ under inductor,
            but as much as the forward codes' differ from themselves compiled twice (SAWB's
            sums are atomic float adds whose order changes launch to launch), with the same
            error against the exact backward (H100,
            ``experiments/results/late_codes_grads_h100.txt`` at b4bb969). ``"auto"``
            (default): ``"backward"`` under ``prefer="memory"`` and under ``forward="fp8"``,
            ``"forward"`` otherwise. Under ``forward="fp8"`` the late codes were faster and
            leaner on both benchmark Llamas (H200, sessions 32-33: the 0.67B Llama 1.016-1.037×
            torchao float8 where the forward's codes gave 1.011-1.030× in the same benches,
            runs 78-80, at 0.11 GiB less; the 8B widths 52.2 against 52.4 ms at 11.41 against
            11.75 GiB, run 82; ``tools/results/fp8_forward_h200_s33.md``). The speed gate times
            the forward's placement. The forward's codes are tagged ``MUST_SAVE`` for the
            min-cut partitioner, which had moved them into the backward under
            ``forward="fp8"``; on the benchmark Llama (H200, session 32) the codes of
            q/k/v/o/gate/up still ended up in the backward: torch 2.11's min-cut bans
            recomputing only what the forward's outputs need, and under inductor a parameter
            is free to save (``experiments/results/step_code_llama_h200_s32.md``).
        abc_swiglu: what a gated MLP's fused product (``swiglu_hq``: ``silu(gate(x)) * up(x)``
            with gate and up on HOT's native path) saves of its two inputs for its backward.
            ``"off"``: gate's and up's outputs as they are (bf16 under autocast: the Llama's
            largest saved tensors, 2 GiB of its 4.2 under ``prefer="memory"``, run 33's
            ``saved_groups``). ``"fp8"``: e4m3 codes with a max-abs/448 scale per token,
            half the bytes (``hotcompile.lowering.hot.swiglu_codes``, written in ATen so that
            inductor makes them in the kernel that reads those outputs anyway); the backward
            (on CUDA the kernel that also writes HQ's codes) reads the codes and their scales.
            ABC's idea taken past the paper, whose ABC compresses linear layers' inputs only:
            the SwiGLU backward's g_gate and g_up then carry e4m3's rounding of a and b (at
            most 2^-4 relative) before HQ quantizes them. With ``abc_recompute="unary"`` on
            the native path (``prefer="memory"``'s) the down projection's ABC codes are then
            derived from those codes too and recomputed in the backward, so the forward
            saves them no more (the Llama's other 0.5 GiB; down's g_w reads codes of the
            product of the dequantized gate and up); where the down projection also runs
            the rowwise FP8 forward, one kernel on CUDA writes gate's, up's and the product's
            codes from one read, and the bf16 product is never written
            (``hotcompile.lowering.hot.swiglu_forward``: 175 µs against inductor's 369 at the
            Llama's 8192 × 8192, H200). ``"auto"`` (default): ``"fp8"`` under
            ``prefer="memory"``, ``"off"`` otherwise.
        hla_2d: inputs with one row per sample (2-D): ``"none"`` (INT8 only, default) or
            ``"batch"`` (16-blocks across the batch, as the official code does).
        exact: turn every transform and quantizer off; the backward then equals autograd's.
            Useful to check the plumbing.
        include / exclude: glob patterns on layer names (``"blocks.*.attn.qkv"``). A layer is
            rewritten when it matches some include pattern (or include is empty) and no
            exclude pattern.
        min_weight_numel: layers whose weight has fewer elements (O·I·k²) keep autograd's
            backward: on tiny layers the transforms cost more than they save.
        compiler: inner compiler: ``"inductor"`` (default), ``"aot_eager"`` (inductor's
            decompositions and min-cut partitioner without code generation: fast, for CPU
            tests), or ``"eager"`` (no AOTAutograd; the rewritten graph runs as is).
        mode: the inductor mode (``"reduce-overhead"``, ``"max-autotune"``, ...), since a
            custom backend cannot get ``mode=`` and ``options=`` together from torch.compile.
        inductor_config: extra ``torch._inductor.config`` patches for the inner compiler, as
            a mapping or tuple of pairs (e.g. ``{"max_autotune": True}``). Inductor's own
            settings otherwise, comprehensive padding included (the buffers HOT's kernels
            touch are pinned unpadded: ``hotcompile.passes.layout``).
        check_nonfinite: ``"once"`` warns once per layer, naming it, when a NaN/Inf reaches a
            HOT backward on the ``ops`` lowering — in g_y or in the input x the g_w path reads
            (``hotcompile.nonfinite_layers()`` lists them; the NaN/Inf itself always
            propagates); ``"off"`` skips the check (on CUDA: the largest scale copied into a
            pinned ring without blocking, read when it has landed, so a report can come a step
            later).
        lowering: how HOT's backward is compiled. ``"native"``: as nodes inductor compiles,
            fuses and launches itself (``torch._scaled_mm`` / ``torch._int_mm`` GEMMs, the fused
            quantize kernels as ``triton_op``, ATen on CPU; ``hotcompile.lowering``) — no
            Python per call, every decision static: LQS's ``"lqs"`` becomes per-token unless a
            ``plan`` says otherwise (on this path per-token costs no more than per-tensor and
            its quantization step is never coarser), and there is no per-layer NaN/Inf warning.
            ``"ops"``: the ``torch.ops.hotcompile`` custom ops (run-time LQS calibration,
            warm-up, ``"stochastic"`` rounding, conv layers, the NaN/Inf warning; host-bound on
            a GPU). ``"auto"`` (default): native for linear layers on CUDA compiled by
            inductor or aot_eager when the settings allow it (rounding nearest or
            pseudo_stochastic, no warm-up), ops otherwise — so CPU runs keep run-time LQS.
        prefer: which layers take HOT's backward. ``"speed"`` (default): on a CUDA device,
            a layer gets HOT only where HOT's backward (its forward compression included) is
            measurably faster than the exact bf16 backward for that layer's shape on this
            GPU — timed once per shape under a CUDA graph and cached on disk
            (``hotcompile.lowering.gate``); elsewhere it keeps autograd's backward, and the
            plan says why, with both times. Conv layers keep autograd's backward on CUDA
            (no native path yet); linear layers on the ops lowering (asked for, or forced by
            warm-up or stochastic rounding) are not gated: those settings ask for HOT's
            numerics. On a CPU every eligible layer gets HOT (the CPU
            path is the reference, for accuracy work). ``"memory"``: every eligible layer
            (ABC's memory saving first, whatever the speed), with the weight codes made in the
            backward and the native ABC codes recomputed there (``weight_codes`` and
            ``abc_recompute`` at ``"auto"``) and a SwiGLU's inputs saved as FP8 codes
            (``abc_swiglu``): the H100 Llama's peak 0.79× of inductor's against 0.94× with
            ``prefer="speed"``, step 1.02× against 1.06× of inductor's in the same run
            (``tools/results/bench_train_runs/run35_*``). ``"paper"``: every eligible
            layer, as the paper does.
        kernels: which implementation runs the quantize kernels and low-precision GEMMs on
            CUDA: ``"auto"`` (default: the fastest measured per shape, cached on disk), or one
            family — ``"cutlass"``, ``"cuda"``, ``"triton"``, ``"torch"`` — used wherever it
            takes the shape (others fill in). Process-wide: a family is applied when a model
            is compiled, so the last one set holds; ``"auto"`` leaves the current choice
            (``HOTCOMPILE_GEMM`` from the environment, else measuring) in place. See
            ``hotcompile.kernels.dispatch``.
        recipe: HOT's numerics per model family. ``"auto"`` (default): layers whose input is
            computed from a token embedding (text: the same test as ``hla_signs="auto"``) get
            the *text* recipe, every other layer the *vision* one. ``"text"``: FP8-e4m3 values
            on the g_x path (``gx_bits=8, gx_format="fp8"``) and no HLA (the g_w path
            quantizes x and g_y in 8 bits; ABC saves every row of x in 8 bits, twice what
            HLA's half-rows cost) — on the 32M byte LM (H100, 3 seeds) -0.86% of bf16's
            validation loss against +16.9% for the paper's recipe; the g_x GEMM is the same
            FP8 GEMM on Hopper. ``"vision"``: the fields as they are (the paper's INT4 HQ +
            HLA, with hotcompile's defaults where it differs). ``"paper"``: the paper's
            settings everywhere (``hla_signs=False``, ``gw_format="int8"``, ``prefer="paper"``:
            HOT on every eligible layer). A recipe fills only fields left at their defaults,
            group by group (``gx_bits`` with ``gx_format``; ``hla``): an option you pass is
            never overridden — but a value equal to the default cannot be told from the
            default, so to keep e.g. INT4 g_x on text layers pass ``recipe="vision"``. The
            plan table's ``recipe`` column says which recipe each layer got.
        forward: the precision of a HOT layer's forward GEMM ``y = x Wᵀ``. ``"bf16"``
            (default): the paper's full-precision forward (bf16 under autocast). ``"fp8"``:
            ``torch._scaled_mm`` on FP8-e4m3 operands (``hotcompile.fp8``), composed with
            HOT's backward and ABC — the forward's GEMMs are the largest cost a bf16 forward
            leaves (``experiments/results/llama_ceiling.md``). The casts are ATen, so inductor
            computes them in the kernel that produces x (RMSNorm, SwiGLU, a residual add).
            Where the gate runs (``prefer="speed"`` on CUDA) it times the layer's whole step
            both ways (FP8 forward + HOT backward against bf16 forward + exact backward) and
            keeps bf16 where FP8 does not pay. Linear layers only; a layer keeps a bf16
            forward, with the reason in the plan's ``forward`` column, where a dim is not a
            multiple of 16 (the FP8 GEMM's alignment), for the model's head (the graph's last
            layer when nothing after it joins another activation: an LM or classifier head;
            FP8 recipes keep it in bf16, as torchao advises), under
            ``exact=True`` and for empty inputs. No delayed scaling: the scales are the
            current tensor's max-abs, as HOT's own quantizers.
        forward_scaling: ``forward="fp8"``'s scales: ``"rowwise"`` (default: one per token
            of x and one per output channel of W, max-abs/448) or ``"tensorwise"`` (one for
            x, one for W).
        fp8_fast_accum: which FP8 GEMMs of e4m3 *values* run with ``use_fast_accum=True``
            (Hopper's tensor cores keep the running sum in their own, narrower accumulator
            instead of promoting it to float32 every few steps): ``"all"`` (default: the FP8
            forward's GEMM, as torchao's float8 recipes run their forward, and HQ's g_x GEMM
            where its codes are FP8 values — the text recipe — which torchao runs without
            it), ``"forward"`` (the FP8 forward's GEMM only), ``"off"``. On an H200 it made
            one FP8 GEMM of the benchmark Llamas' shapes 5–16% faster, rowwise scales as
            tensorwise, adding ~1e-3 relative error where e4m3's rounding makes ~4e-2
            (``experiments/results/scaled_mm_scaling_h200.md``, ``scaled_mm_errors_h200.md``);
            the ~127M Llama's loss with ``"all"`` and the FP8 forward was bf16's (+0.01%, 3
            seeds, session 28). INT4-grid codes (the vision recipe's g_x) never take it: their
            integer sums are exact only in float32. The speed gate times both GEMMs as the
            step runs them.
    """

    block_size: int = 16
    hla_rank: int = 8
    hla_rows: str | tuple[int, ...] = "lp_l1"
    hadamard: bool = True
    gx_bits: int | None = 4
    gx_format: str = "int"
    gw_bits: int | None = 8
    gw_format: str = "auto"
    hla: bool = True
    hla_signs: bool | str = "auto"
    hla_threshold: float | None = 0.6
    gx_scaling: str = "lqs"
    lqs_calibration_steps: int = 1
    lqs_metric: str = "transformed"
    lqs_threshold: float = 0.5
    plan: Any = None
    warmup_steps: int = 0
    rounding: str = "pseudo_stochastic"
    weight_scale: str = "sawb"
    abc: bool = True
    conv_abc: str = "im2col"
    abc_recompute: str = "auto"
    abc_max_abs: str = "producer"
    swiglu_hq: bool = True
    weight_codes: str = "auto"
    abc_swiglu: str = "auto"
    hla_2d: str = "none"
    exact: bool = False
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    min_weight_numel: int = 0
    compiler: str = "inductor"
    mode: str | None = None
    inductor_config: tuple[tuple[str, Any], ...] = ()
    check_nonfinite: str = "once"
    kernels: str = "auto"
    lowering: str = "auto"
    prefer: str = "speed"
    recipe: str = "auto"
    forward: str = "bf16"
    forward_scaling: str = "rowwise"
    fp8_fast_accum: str = "all"

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise HotConfigError(
                f"hotcompile option recipe={self.recipe!r} is invalid: choose one of "
                f"{', '.join(map(repr, RECIPES))}"
            )
        for name, v in _recipe_changes(self, self.recipe).items():  # "text" / "paper"
            object.__setattr__(self, name, v)

        def bad(name: str, value: Any, valid: str) -> HotConfigError:
            return HotConfigError(f"hotcompile option {name}={value!r} is invalid: {valid}")

        def choice(name: str, valid: tuple[str, ...]) -> None:
            value = getattr(self, name)
            if value not in valid:
                raise bad(name, value, f"choose one of {', '.join(map(repr, valid))}")

        n = self.block_size
        if not isinstance(n, int) or n < 2 or n & (n - 1) or n > 256:
            raise bad("block_size", n, "a power of two between 2 and 256")
        for name in ("gx_bits", "gw_bits"):
            if getattr(self, name) not in (4, 8, None):
                raise bad(name, getattr(self, name), "4, 8 or None (no quantization)")
        for name in ("hla", "abc", "exact", "hadamard", "swiglu_hq"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, getattr(self, name), "True or False")
        if not isinstance(self.hla_signs, bool) and self.hla_signs != "auto":
            raise bad("hla_signs", self.hla_signs, "'auto', True or False")
        choice("gx_scaling", GX_SCALINGS)
        choice("rounding", ROUNDINGS)
        choice("gw_format", GW_FORMATS)
        choice("gx_format", GX_FORMATS)
        if self.gx_format == "fp8" and self.gx_bits != 8:
            raise bad(
                "gx_format",
                "fp8",
                f"FP8 values are 8 bits wide: needs gx_bits=8, not {self.gx_bits}",
            )
        if self.gw_format == "fp8" and self.gw_bits != 8:  # "auto" is INT8 then
            raise bad(
                "gw_format",
                "fp8",
                f"FP8 codes are 8 bits wide: needs gw_bits=8, not {self.gw_bits}",
            )
        choice("lqs_metric", LQS_METRICS)
        for name in ("lqs_calibration_steps", "warmup_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if "lqs" in name else 0):
                raise bad(name, v, "a positive integer" if "lqs" in name else "an integer >= 0")
        if not isinstance(self.lqs_threshold, (int, float)) or not 0 < self.lqs_threshold <= 1:
            raise bad("lqs_threshold", self.lqs_threshold, "a number in (0, 1]")
        t = self.hla_threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0):
            raise bad("hla_threshold", t, "a positive number (relative g_w error) or None")
        from hotcompile.lqs import as_plan

        try:
            object.__setattr__(self, "plan", as_plan(self.plan))
        except (TypeError, ValueError, OSError) as e:
            raise bad("plan", self.plan, f"a Plan, its JSON dict or a path to it ({e})") from None
        choice("weight_scale", WEIGHT_SCALES)
        choice("hla_2d", HLA_2D_MODES)
        choice("conv_abc", CONV_ABC_MODES)
        choice("abc_recompute", ABC_RECOMPUTE)
        choice("abc_max_abs", ABC_MAX_ABS)
        choice("weight_codes", WEIGHT_CODES)
        choice("abc_swiglu", ABC_SWIGLU)
        if self.abc_swiglu == "fp8" and not self.swiglu_hq:
            raise bad(
                "abc_swiglu",
                "fp8",
                "the codes are saved by the fused SwiGLU: needs swiglu_hq=True",
            )
        choice("compiler", COMPILERS)
        choice("check_nonfinite", NONFINITE_CHECKS)
        choice("kernels", KERNEL_IMPLS)
        choice("lowering", LOWERINGS)
        choice("prefer", PREFERENCES)
        choice("forward", FORWARDS)
        choice("forward_scaling", FORWARD_SCALINGS)
        choice("fp8_fast_accum", FP8_FAST_ACCUM)
        if self.lowering == "native":
            if self.rounding == "stochastic":
                raise bad(
                    "lowering",
                    "native",
                    "stochastic rounding draws its seed on the host; use rounding="
                    "'pseudo_stochastic' or 'nearest', or lowering='ops'",
                )
            if self.warmup_steps:
                raise bad(
                    "lowering",
                    "native",
                    "the INT8 warm-up switches precision at run time; use lowering='ops'",
                )
            if self.compiler == "eager":
                raise bad("lowering", "native", "needs compiler='inductor' or 'aot_eager'")
        if self.mode not in MODES:
            raise bad("mode", self.mode, f"one of {', '.join(map(repr, MODES))}")
        if isinstance(self.hla_rows, str):
            choice("hla_rows", HLA_ROW_SETS)
            if self.hla_rows == "lp_l1" and n != 16:
                raise bad("hla_rows", "lp_l1", "the 2-D L1 low-pass set needs block_size=16")
            if not isinstance(self.hla_rank, int) or not 1 <= self.hla_rank <= n:
                raise bad("hla_rank", self.hla_rank, f"an integer in 1..block_size ({n})")
        else:
            rows = tuple(self.hla_rows)
            if (
                not rows
                or len(set(rows)) != len(rows)
                or not all(isinstance(r, int) and 0 <= r < n for r in rows)
            ):
                raise bad("hla_rows", self.hla_rows, f"distinct row indices in 0..{n - 1}")
            object.__setattr__(self, "hla_rows", rows)
        for name in ("include", "exclude"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            if not all(isinstance(p, str) for p in value):
                raise bad(name, value, "a glob pattern or a sequence of them")
            object.__setattr__(self, name, tuple(value))
        if not isinstance(self.min_weight_numel, int) or self.min_weight_numel < 0:
            raise bad("min_weight_numel", self.min_weight_numel, "a non-negative integer")
        ic = self.inductor_config
        if isinstance(ic, Mapping):
            ic = tuple(sorted(ic.items()))
        try:
            ic = tuple((str(k), v) for k, v in ic)
        except (TypeError, ValueError):
            raise bad("inductor_config", ic, "a mapping of inductor config names") from None
        object.__setattr__(self, "inductor_config", ic)

    def for_layer(self, text: bool) -> HotConfig:
        """The config one layer runs with: under ``recipe="auto"`` a text layer (its input
        computed from a token embedding, ``hotcompile.passes.rewrite.token_sequence_nodes``)
        gets the text recipe's fields, every other layer this config as is."""
        if self.recipe != "auto" or not text:
            return self
        changes = _recipe_changes(self, "text")
        return dataclasses.replace(self, **changes) if changes else self

    @property
    def abc_recompute_modes(self) -> tuple[str, str]:
        """``abc_recompute`` resolved: the mode of the ops path's compressions and that of the
        native path's (``"auto"``: ``"unary"`` on the ops path; on the native path, where it
        moves Triton quantizers into the backward for ~2 ms of the Llama's step, ``"unary"``
        only under ``prefer="memory"``)."""
        if self.abc_recompute != "auto":
            return self.abc_recompute, self.abc_recompute
        return "unary", "unary" if self.prefer == "memory" else "off"

    @property
    def weight_codes_late(self) -> bool:
        """Whether the native g_x path quantizes the weight in the backward (``weight_codes``
        resolved: ``"auto"`` is ``"backward"`` under ``prefer="memory"`` or
        ``forward="fp8"``)."""
        if self.weight_codes == "auto":
            return self.prefer == "memory" or self.forward == "fp8"
        return self.weight_codes == "backward"

    @property
    def abc_swiglu_codes(self) -> bool:
        """Whether a fused SwiGLU saves FP8 codes of its inputs (``abc_swiglu`` resolved:
        ``"auto"`` is ``"fp8"`` under ``prefer="memory"``)."""
        if self.abc_swiglu == "auto":
            return self.prefer == "memory" and self.swiglu_hq
        return self.abc_swiglu == "fp8"

    @property
    def rank(self) -> int:
        """Number of HLA rows kept per block."""
        return len(self.hla_rows) if isinstance(self.hla_rows, tuple) else self.hla_rank

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | HotConfig | None = None) -> HotConfig:
        """Build a config from ``torch.compile``'s ``options`` dict, rejecting unknown keys."""
        if options is None:
            return cls()
        if isinstance(options, HotConfig):
            return options
        options = dict(options)
        base = options.pop("config", None)
        if base is not None and not isinstance(base, HotConfig):
            raise HotConfigError(f"options['config'] must be a HotConfig, got {type(base)!r}")
        valid = _fields()
        unknown = [k for k in options if k not in valid]
        if unknown:
            hints = []
            for k in unknown:
                close = difflib.get_close_matches(k, valid, n=1)
                hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise HotConfigError(
                f"unknown hotcompile option(s): {', '.join(hints)}. "
                f"Valid options: config, {', '.join(valid)}."
            )
        if base is not None:
            return dataclasses.replace(base, **options)
        return cls(**options)

    def to_options(self) -> dict[str, Any]:
        """The config as a plain ``options`` dict for ``torch.compile``."""
        return {f: getattr(self, f) for f in _fields()}

    def cache_key(self) -> str:
        """A stable string of every field, hashed into the compile cache key."""
        return repr(self.to_options())

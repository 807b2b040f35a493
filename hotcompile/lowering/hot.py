"""HOT's linear backward as graph nodes inductor compiles, fuses and launches itself.

The ``ops`` path calls opaque ``torch.ops.hotcompile`` custom ops from the autograd Function's
backward: correct, but every call runs Python (LQS lookups, the kernel dispatcher, Triton's
launcher), and the step becomes host-bound. Here the same mathematics is written so that the
backward graph holds only nodes inductor knows:

- the quantizers: on CUDA the fused Triton kernels as ``triton_op`` nodes
  (:mod:`hotcompile.lowering.triton_ops`), whose launches inductor emits in its wrapper;
  elsewhere (CPU, or no Triton) the reference's own ATen functions (butterfly Hadamard,
  max-abs, NITI rounding), which inductor fuses into the kernel that produces g_y;
- the GEMMs: ``torch._scaled_mm`` (FP8-e4m3 carrying INT4-grid codes, the dequantization as
  its row/tensor scales) and ``torch._int_mm`` (INT8 g_w), which inductor lowers itself.

Every decision is static (made at compile time), which is what lets inductor own the step:

- LQS: a plan's decision, or the configured scaling. ``"lqs"`` without a plan resolves to
  per-token here. On this path per-token is no dearer than per-tensor (the row max-abs is
  taken in the same pass that writes the codes, where per-tensor needs a second pass after a
  global reduction), and its quantization step is never coarser (each row's max-abs is at
  most the tensor's). LQS's run-time measurement needs the ``ops`` path
  (``HotConfig.lowering="ops"``) or :func:`hotcompile.calibrate` ahead of training.
- No NaN/Inf warning per layer (``check_nonfinite``): that needs a host read. A NaN/Inf in g_y
  still reaches the gradients, as in the reference (``docs/numerics.md``).

Numerics equal the reference ops: the codes bit for bit (the kernels are the tested ones, the
ATen formulation is the reference itself), the GEMMs exact on INT-grid codes, and the
dequantization the same products in the GEMM's epilogue (last-bit differences in the output
dtype). ``tests/test_lowering.py`` checks both against ``torch.ops.hotcompile``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hotcompile.hadamard import block_hadamard, padded
from hotcompile.hla import hla_operand, signed
from hotcompile.quant import FP8_E4M3, dequantize, has_fp8_gemm, hq_weight_quantizer, quantize

#: roundings the native path implements (no host-drawn seeds: ``stochastic`` needs the ops)
ROUNDINGS = ("nearest", "pseudo_stochastic")
ALL_ROWS = tuple(range(16))


def _plain(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` detached: the kernels' operands never carry autograd history (the Function owns
    the backward), and ``triton_op``'s functionalization must not see a leaf that requires
    grad (a weight) as a kernel argument."""
    return t.detach() if t is not None else None


def use_triton(t: torch.Tensor) -> bool:
    """The fused Triton kernels run on CUDA tensors when Triton is importable."""
    if t.device.type != "cuda":
        return False
    from hotcompile.lowering import available

    return available()


def _triton_ops():
    from hotcompile.lowering import triton_ops

    return triton_ops


# ----------------------------------------------------------------------------- quantizers


def quantize_gy(
    gy: torch.Tensor,
    bits: int,
    per_token: bool,
    rounding: str,
    fp8: bool,
    pad_rows_to: int,
    raw_amax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """HQ's g_y operand: codes of ``g_y·B_O`` ``[padded(L, pad_rows_to), padded(O, 16)]``
    (e4m3 when ``fp8``, else int8) and fp32 scales ``[L_out]`` (per token) or ``[1]``; third,
    with ``raw_amax`` on CUDA, the max-abs bits of g_y itself as int32 (taken in the same
    pass, for :func:`hla_codes`' ``amax``: per token one slot per program of the kernel,
    which that kernel reduces, per tensor one word), else None."""
    if use_triton(gy):
        q, s, raw = _triton_ops().hq_quantize(
            _plain(gy), bits, per_token, rounding, fp8, pad_rows_to, raw_amax
        )
        return q, s, (raw if raw_amax else None)
    q, s = quantize(block_hadamard(gy, 1, 16), bits, per_token, rounding, "maxabs")
    rows = padded(gy.shape[0], pad_rows_to) - gy.shape[0]
    if rows:
        q = torch.nn.functional.pad(q, (0, 0, 0, rows))
        s = torch.nn.functional.pad(s, (0, rows)) if per_token else s
    return (q.to(torch.float8_e4m3fn) if fp8 else q), s, None


def swiglu_backward(
    a: torch.Tensor,
    b: torch.Tensor,
    g: torch.Tensor,
    bits: int,
    rounding: str,
    fp8: bool,
    pad_rows_to: int,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    gw: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor, tuple | None, tuple | None, tuple | None]:
    """The backward of ``silu(a) * b`` for its gradient ``g``: ``g_a, g_b``, and with each
    HQ's per-token operand as :func:`quantize_gy` with ``raw_amax`` gives it (codes, scales,
    raw max-abs word), made by the kernel that makes g_a / g_b
    (``hotcompile.kernels.swiglu_triton``) where it takes the rows; else ``None`` for both
    (the layers quantize their g_y themselves). ``a``, ``b``, ``g``: ``[..., O]``, one shape.
    ``a_scale``/``b_scale`` (``HotConfig.abc_swiglu``): ``a`` and ``b`` are the forward's FP8
    codes of gate's and up's outputs, ``[rows, O]``, one float32 scale per row
    (:func:`swiglu_codes`).

    ``gw`` ``(samples, bits, rounding)``: the gate and up layers' g_w operand is the plain
    rows of ``samples`` sequences with these codes. Where the kernels take it, the fifth
    item is then ``((codes, scale) of g_a, (codes, scale) of g_b)`` as :func:`hla_codes`
    makes them with the shared max-abs, made from ``a``, ``b`` and ``g``
    (``swiglu_triton.swiglu_gw``), and the kernel does not store g_a and g_b: the two
    returned here are ATen that inductor drops where the layers take the given operands
    (2 × 2 bytes an element never written nor read back). Off CUDA the same operands come
    from :func:`hla_codes` of the returned gradients. Else (CUDA rows the kernels do not
    take) None: the layers make theirs.

    The formulas are autograd's (``silu_backward(g·b, a)`` and ``g·silu(a)``): on the CPU
    the same ATen, on CUDA the kernel's float32 arithmetic rounded once to ``g``'s dtype (the
    H100 found g_a one ulp off inductor's in 0.0014% of the values). Codes are dequantized to
    float32 (:func:`hotcompile.quant.dequantize`) before either."""
    O = g.shape[-1]
    scaled = a_scale is not None
    # (codes come 2-D and are passed on as they are: a view between them and the op that
    # reads them would make the partitioner recompute them; see ops.dequantize_rows)
    a2, b2 = (a, b) if scaled else (a.reshape(-1, O), b.reshape(-1, O))
    g2 = g.reshape(-1, O)
    fused = use_triton(a2) and a2.shape[0] > 0 and a.dtype == b.dtype
    fused = fused and (scaled or a.dtype == g.dtype)
    if fused:
        from hotcompile.kernels import swiglu_triton  # imports Triton: CUDA only

        fused = swiglu_triton.supported(a2, rounding)
    if fused:
        given = gw is not None and swiglu_triton.supported_gw(a2, g2, gw[0], (), gw[1], gw[2])
        ga, gb, ca, sa, ra, cb, sb, rb = _triton_ops().swiglu_backward_hq(
            _plain(a2), _plain(b2), _plain(g2), bits, rounding, fp8, pad_rows_to,
            a_scale, b_scale, not given,
        )  # fmt: skip
        if not given:
            return ga.view(g.shape), gb.view(g.shape), (ca, sa, ra), (cb, sb, rb), None
        qa, xa, qb, xb = _triton_ops().swiglu_gw(
            _plain(a2), _plain(b2), _plain(g2), ra, rb, *gw, a_scale, b_scale
        )
        ga, gb = _swiglu_grads(a, b, g, a_scale, b_scale)
        return ga, gb, (ca, sa, ra), (cb, sb, rb), ((qa, xa), (qb, xb))
    ga, gb = _swiglu_grads(a, b, g, a_scale, b_scale)
    operands = None
    if gw is not None and not use_triton(g2):
        # the layers' own ATen quantizer, run here: the same operands, and the CPU tests reach
        # the given-operand path. (Not on CUDA: there the layers' codes take the max-abs
        # word of their HQ kernel's pass over g_y, one pass where this would make two.)
        samples, bits_w, rounding_w = gw
        operands = tuple(
            hla_codes(t.reshape(samples, -1, O), 0, (), bits_w, rounding_w, None) for t in (ga, gb)
        )
    return ga, gb, None, None, operands


def _swiglu_grads(a, b, g, a_scale, b_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """``g_a, g_b`` (``g``'s shape) of ``silu(a) * b`` as ATen, autograd's formulas: ``a``
    and ``b`` values like ``g``, or with row scales 2-D FP8 codes, dequantized to float32
    first."""
    if a_scale is not None:
        import hotcompile.ops  # noqa: F401  (registers torch.ops.hotcompile)

        a = torch.ops.hotcompile.dequantize_rows(a, a_scale).view(g.shape)
        b = torch.ops.hotcompile.dequantize_rows(b, b_scale).view(g.shape)
        ga = torch.ops.aten.silu_backward(g * b, a).to(g.dtype)
        return ga, (g * torch.nn.functional.silu(a)).to(g.dtype)
    return torch.ops.aten.silu_backward(g * b, a), g * torch.nn.functional.silu(a)


def swiglu_codes(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the forward saves of a gated MLP's gate or up output under
    ``HotConfig.abc_swiglu="fp8"``: e4m3 codes ``[rows, O]`` and one max-abs/448 float32
    scale per row (a token), :func:`hotcompile.quant.quantize`'s per-token FP8 — ATen, so that
    inductor computes it in the kernels that read ``t`` anyway."""
    return quantize(t.reshape(-1, t.shape[-1]), 8, True, FP8_E4M3)


def swiglu_forward(
    a: torch.Tensor, b: torch.Tensor, product: str | None = None
) -> tuple[torch.Tensor, ...]:
    """The forward of ``silu(a) * b`` under ``HotConfig.abc_swiglu="fp8"``: ``(ca, sa, cb,
    sb, y, sy)``, :func:`swiglu_codes` of ``a`` and of ``b``, then by ``product``: ``"fp8"``,
    the product's rowwise FP8 operand as :func:`hotcompile.fp8.operands` makes it for the
    down projection's FP8 forward (e4m3 ``[rows, O]`` of the product in ``a``'s dtype, a
    float32 scale per row); ``"values"``, the product in ``a``'s shape and dtype and None;
    ``None``, two Nones.

    On CUDA one kernel reads ``a`` and ``b`` once and writes all of it
    (``hotcompile.kernels.swiglu_triton._swiglu_codes_kernel``; the codes of ``a`` and ``b``
    bit for bit, the product's from float32 arithmetic rounded once to ``a``'s dtype);
    elsewhere, or for operands it does not take, the same quantizers as ATen."""
    O = a.shape[-1]
    a2, b2 = a.reshape(-1, O), b.reshape(-1, O)
    if use_triton(a2):
        from hotcompile.kernels import swiglu_triton  # imports Triton: CUDA only

        if swiglu_triton.supported_codes(a2, b2):
            ca, sa, cb, sb, y, sy = _triton_ops().swiglu_codes(
                _plain(a2), _plain(b2), product or ""
            )
            if product == "values":
                return ca, sa, cb, sb, y.view(a.shape), None
            return ca, sa, cb, sb, (y if product else None), (sy if product else None)
    ca, sa = swiglu_codes(a)
    cb, sb = swiglu_codes(b)
    if product is None:
        return ca, sa, cb, sb, None, None
    y = torch.nn.functional.silu(a) * b
    if product == "values":
        return ca, sa, cb, sb, y, None
    return ca, sa, cb, sb, *swiglu_codes(y)  # (the same rowwise quantizer as fp8.operands)


def gx_weight_scale(s: torch.Tensor, I: int) -> torch.Tensor:
    """HQ's per-tensor weight scale ``s`` as the g_x GEMM takes it: ``s/16`` (the Hadamard's
    normalisation; a power of two, so exact) repeated over a contiguous row ``[1, I]``, the
    shape of ``torch._scaled_mm``'s rowwise ``scale_b``. On CUDA the weight's codes kernel
    writes this row itself (``scale_row``), so no kernel a layer expands it in the backward;
    this is the same row in ATen, for the paths without that kernel."""
    return (s.reshape(1, 1) / 16).expand(1, I).contiguous()


def quantize_weight(
    w: torch.Tensor,
    bits: int,
    weight_scale: str,
    fp8: bool,
    rounding: str = "nearest",
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HQ's weight operand ``Q(B_O·W)`` per tensor, K-major: ``[I, padded(O, 16)]``, and its
    scale as :func:`gx_weight_scale`'s row ``[1, I]``. INT codes
    round to nearest (``weight_scale``: SAWB or max-abs); ``rounding=FP8_E4M3`` gives e4m3
    values with the max-abs/448 scale (``gx_format="fp8"``). ``dtype``: the codes of
    ``w.to(dtype)`` (the forward's GEMM's copy); on CUDA a float32 ``w`` to bfloat16 is
    rounded in the kernel as it is read, so no copy is written (~6 bytes a parameter: the
    8B widths' backward wrote and read 0.44 G parameters' copies only for these codes)."""
    rounding, scale_mode = hq_weight_quantizer(rounding, weight_scale)
    in_kernel = dtype == torch.bfloat16 and w.dtype == torch.float32 and use_triton(w)
    if dtype is not None and w.dtype != dtype and not in_kernel:
        w = w.to(dtype)
    if use_triton(w):
        sawb = scale_mode == "sawb" and bits == 4
        return _triton_ops().hla_quantize(
            _plain(w)[None], 0, list(ALL_ROWS), bits, rounding, sawb, fp8, round_bf16=in_kernel,
            scale_row=True,
        )  # fmt: skip
    q, s = quantize(block_hadamard(w, 0, 16), bits, False, rounding, scale_mode)
    q = q.t().contiguous()  # [I, O_pad] row-major: its .t() is the column-major mat2
    return (q.to(torch.float8_e4m3fn) if fp8 else q), gx_weight_scale(s, w.shape[1])


def plain_rows(grid_w: int, rows: tuple[int, ...], signs_on: bool) -> bool:
    """The g_w operand is x's (g_y's) plain rows in token blocks — no HLA, patches or signs —
    so its per-tensor scale is g_y's own max-abs, which HQ's kernel can take for it."""
    return not rows and grid_w == 0 and not signs_on


def hla_codes(
    x3: torch.Tensor,
    grid_w: int,
    rows: tuple[int, ...],
    bits: int,
    rounding: str,
    signs: torch.Tensor | None,
    amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HLA's operand ``Q(T·signed(x3))`` per tensor, K-major ``[D, R]``, and its fp32 scale
    (``rows`` empty: no projection, the rows of x3 themselves; on CUDA the fused kernel writes
    them in HLA's block order with zero rows padding each sample to 16s, the same order for
    x and g_y, so the g_w GEMM is unchanged). Empty inputs give no rows. ``amax``: x3's
    max-abs bits from :func:`quantize_gy` (CUDA, :func:`plain_rows` only): one pass, not two."""
    if x3.numel() == 0:
        return x3.new_zeros((x3.shape[-1], 0), dtype=torch.int8), x3.new_zeros(
            (1,), dtype=torch.float32
        )
    if use_triton(x3):
        if amax is not None and not plain_rows(grid_w, rows, signs is not None):
            raise ValueError("a shared max-abs needs the g_w operand's plain rows")
        return _triton_ops().hla_quantize(
            _plain(x3), grid_w, list(rows), bits, rounding, False, False, _plain(signs), amax
        )
    q, s = quantize(hla_operand(signed(x3, signs), grid_w, rows), bits, False, rounding, "maxabs")
    return q.t().contiguous(), s  # [D, R] row-major, as the kernel writes it


# ----------------------------------------------------------------------------- GEMMs


def _fp8_ok(*dims: int) -> bool:
    return all(d > 0 and d % 16 == 0 for d in dims)


def _int_mm_ok(m: int, k: int, n: int, device: torch.device) -> bool:
    return device.type == "cpu" or (m > 16 and k % 8 == 0 and n % 8 == 0 and k > 0)


def gx_codes_fp8(I: int, bits: int, rounding: str, device: torch.device) -> bool:
    """Whether the g_x GEMM runs on FP8 (``torch._scaled_mm``): INT4-grid codes or FP8 values,
    I a multiple of 16, a device with FP8 GEMMs."""
    return (bits == 4 or rounding == FP8_E4M3) and _fp8_ok(I) and has_fp8_gemm(device)


def weight_codes(
    w: torch.Tensor, bits: int, rounding: str, weight_scale: str, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """HQ's weight operand for :func:`grad_input_codes`: ``Q(B_O·W)`` K-major ``[I, O_pad]``
    (e4m3 where the g_x GEMM is FP8) and its fp32 scale over 16 as a row ``[1, I]``
    (:func:`gx_weight_scale`).

    The autograd Function calls it in the *forward*, on the weight as the forward's GEMM reads
    it (the autocast copy, which the forward makes anyway), and saves the codes: one byte per
    weight, where autocast's bf16 backward saves the two-byte copy, and the backward no longer
    reads the fp32 master weight twice (gate/up of the benchmark's Llama: 68 µs,
    ``experiments/results/plain_gw_h100.md``). ``dtype``: the codes of ``w.to(dtype)``
    (:func:`quantize_weight`: on CUDA without the copy, where the backward makes the codes
    from the parameter and nothing else reads the copy)."""
    fp8 = gx_codes_fp8(w.shape[1], bits, rounding, w.device) or rounding == FP8_E4M3
    return quantize_weight(w, bits, weight_scale, fp8, rounding, dtype)


#: the shortest row (W's input channels) for which the fused weight pass beats the passes
#: apart, measured on an H200 (``experiments/weight_operands.py``, session 26, both at their
#: best tile): 2048 × 8192 97.6 µs against 116.8, 4096 × 4096 95.5 against 121.3 and
#: 14336 × 4096 276.6 against 392.4, but 8192 × 2048 96.2 against 85.4 and 2048 × 2048 28.9
#: against 24.6 (apart, the bf16 copy of a short-rowed weight is read back from L2); timed
#: with the text recipe's FP8 codes. With SAWB-scaled codes (the vision recipe's INT4) the
#: passes apart take one more over W for SAWB's sums and the fused pair won at every shape
#: timed (session 27, ``experiments/results/weight_operands_h200_s27.md``): ViT-L/16's 3072 × 1024
#: 28.7 µs against 51.4, 1024 × 1024 25.1 against 29.6, 4096 × 1024 34.3 against 65.1
WEIGHT_OPERANDS_MIN_I = 4096


def weight_operands_pay(shape: Sequence[int], rounding: str, weight_scale: str) -> bool:
    """Whether a weight of ``shape [O, I]`` makes its two FP8-forward operands in one pair of
    passes (:func:`weight_operands`) rather than the two quantizers apart: where it was
    measured faster — HQ codes with a SAWB scale at any shape, max-abs ones (the text
    recipe's FP8 values) for rows of :data:`WEIGHT_OPERANDS_MIN_I` inputs or more. Either
    way gives the same codes (SAWB's atomic sums may move its scale by an ulp)."""
    if hq_weight_quantizer(rounding, weight_scale)[1] == "sawb":
        return True
    return int(shape[-1]) >= WEIGHT_OPERANDS_MIN_I


def weight_operands(
    w: torch.Tensor, bits: int, rounding: str, weight_scale: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both per-step operands of a weight under ``forward="fp8"`` (rowwise), each of
    ``w.to(dtype)`` as the forward's GEMM reads it: HQ's :func:`weight_codes` and the FP8
    forward's rowwise e4m3 copy with its per-output-channel scales ``[O]``
    (:func:`hotcompile.fp8.operands`' weight half).

    On CUDA one kernel reads the fp32 parameter twice and writes both, rounding to bf16 in
    registers (:mod:`hotcompile.kernels.weight_triton`: ~10 bytes a parameter where the two
    quantizers apart took ~16, the bf16 copy written and read); elsewhere, and for a dtype
    it does not round to, the two quantizers one after the other — the same bits."""
    fused = use_triton(w) and (
        (w.dtype == torch.float32 and dtype in (torch.float32, torch.bfloat16))
        or (w.dtype == torch.bfloat16 and dtype == torch.bfloat16)
    )
    if fused:  # weight_codes' and quantize_weight's arguments of HQ's kernel
        fp8 = gx_codes_fp8(w.shape[1], bits, rounding, w.device) or rounding == FP8_E4M3
        hq_rounding, scale_mode = hq_weight_quantizer(rounding, weight_scale)
        sawb = scale_mode == "sawb" and bits == 4
        round_bf16 = w.dtype != dtype
        return _triton_ops().weight_operands(_plain(w), bits, hq_rounding, sawb, fp8, round_bf16)
    wc = w.to(dtype)
    hq, hs = weight_codes(wc, bits, rounding, weight_scale)
    w8, ws = quantize(wc, 8, True, FP8_E4M3)
    return hq, hs, w8, ws


def gy_operand_layout(I: int, bits: int, rounding: str, device: torch.device) -> tuple[bool, int]:
    """How :func:`grad_input_codes` asks :func:`quantize_gy` for g_y's operand of a layer with
    ``I`` inputs: e4m3 codes or not, and the rows padded to (16 for the FP8 GEMM). A producer
    that makes the operand itself (:func:`swiglu_backward`) asks the same."""
    fp8 = gx_codes_fp8(I, bits, rounding, device)
    return fp8 or rounding == FP8_E4M3, 16 if fp8 else 1


def grad_input(*args: Any) -> torch.Tensor:
    """HQ g_x ``[L, I]`` alone: :func:`grad_input_amax` ``(gy2, w, bits, per_token, rounding,
    weight_scale)`` without the max-abs."""
    return grad_input_amax(*args)[0]


def grad_input_amax(
    gy2: torch.Tensor,
    w: torch.Tensor,
    bits: int,
    per_token: bool,
    rounding: str,
    weight_scale: str,
    raw_amax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HQ g_x ``[L, I]`` from the weight itself: :func:`weight_codes`, then
    :func:`grad_input_codes`."""
    wq, sw = weight_codes(w, bits, rounding, weight_scale)
    return grad_input_codes(gy2, wq, sw, bits, per_token, rounding, raw_amax)


def grad_input_codes(
    gy2: torch.Tensor,
    wq: torch.Tensor,
    sw: torch.Tensor,
    bits: int,
    per_token: bool,
    rounding: str,
    raw_amax: bool = False,
    given: tuple | None = None,
    fast_accum: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HQ g_x ``[L, I]`` in gy's dtype from the weight's codes ``wq [I, O_pad]`` and scale row
    ``sw = s_w/16`` ``[1, I]`` (:func:`weight_codes`): ``diag(s_g)·(Ĝq·Ŵq)·s_w/16``; and with
    ``raw_amax`` on CUDA g_y's
    own max-abs bits, taken by the same kernel (:func:`quantize_gy`), else None. ``given``:
    g_y's operand as :func:`quantize_gy` would return it, already made by g_y's producer
    (:func:`swiglu_backward`): no pass over g_y here. ``fast_accum``: FP8 *values*
    (``rounding=FP8_E4M3``) go through the FP8 GEMM with ``use_fast_accum``
    (``HotConfig.fp8_fast_accum="all"``); INT4-grid codes never do (their sums are exact in
    float32 only).

    INT4 codes travel as e4m3 (exact) into ``torch._scaled_mm`` with the dequantization as its
    scales (rowwise for per-token); INT8 codes into ``torch._int_mm``; FP8 values
    (``rounding=FP8_E4M3``, ``gx_format="fp8"``) into ``torch._scaled_mm`` as well. Shapes a
    low-precision GEMM cannot take (I not a multiple of 16 for FP8, of 8 for INT8) multiply
    the codes in float32 (exact for INT4: |sum| < 49·O < 2^24; FP8 products are exact and
    accumulate in float32 as the FP8 GEMM does) or float64 (INT8).
    """
    L, I = gy2.shape[0], wq.shape[0]
    if tuple(sw.shape) != (1, I):  # a bare scale [1] would be 16x off, not an error
        raise ValueError(f"grad_input_codes takes the weight's scale row [1, {I}] "
                         f"(weight_codes), got {tuple(sw.shape)}")  # fmt: skip
    fp8_values = rounding == FP8_E4M3
    fp8 = gx_codes_fp8(I, bits, rounding, gy2.device)
    if given is not None:
        gq, sg, raw = given
    else:
        codes_fp8, pad = gy_operand_layout(I, bits, rounding, gy2.device)
        gq, sg, raw = quantize_gy(gy2, bits, per_token, rounding, codes_fp8, pad, raw_amax)
    if fp8:
        if per_token:  # the row is rowwise scale_b as it is: no kernel to expand s_w/16
            s_a, s_b = sg[:, None], sw
        else:  # tensorwise scales as 0-d tensors: inductor's lowering recognises that recipe
            s_a, s_b = sg.reshape(()), sw[:, :1].reshape(())
        out = torch._scaled_mm(
            gq, wq.t(), scale_a=s_a, scale_b=s_b, out_dtype=gy2.dtype,
            use_fast_accum=fast_accum and fp8_values,
        )  # fmt: skip
        return out[:L], raw
    s_row = sg[:, None] if per_token else sg
    if bits == 8 and not fp8_values and _int_mm_ok(gq.shape[0], gq.shape[1], I, gq.device):
        acc = torch._int_mm(gq, wq.t().contiguous().t()).to(torch.float32)
    else:
        dt = torch.float32 if bits == 4 or fp8_values else torch.float64
        acc = (gq.to(dt) @ wq.t().to(dt)).to(torch.float32)
    return (acc * s_row * sw).to(gy2.dtype)[:L], raw


def grad_weight(
    gy3: torch.Tensor,
    xq: torch.Tensor,
    sx: torch.Tensor,
    grid_w: int,
    rows: tuple[int, ...],
    bits: int,
    rounding: str,
    signs: torch.Tensor | None,
    gy_amax: torch.Tensor | None = None,
    given: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """HLA g_w ``[O, I]`` float32 from ``gy3 [N, S, O]`` and the saved ``xq [R, I]``
    (column-major, as :func:`compress` returns it): ``s_g·s_x·(g̃qᵀ·x̃q)/16`` (no /16 without
    HLA), times n/r with signs (the unbiasing factor of ``hla_signs``). ``gy_amax``: g_y's
    max-abs bits from :func:`grad_input_codes` (plain rows only). ``given``: g_y's operand
    ``(codes [O, R], scale)`` as :func:`hla_codes` makes it, made by g_y's producer
    (:func:`swiglu_backward`'s ``gw``); gy3 is then not read."""
    O, I = gy3.shape[-1], xq.shape[1]
    if gy3.numel() == 0 or xq.shape[0] == 0:  # no tokens: nothing to sum
        return gy3.new_zeros((O, I), dtype=torch.float32)
    if given is not None:
        gqt, sg = given
    else:
        gqt, sg = hla_codes(gy3, grid_w, rows, bits, rounding, signs, gy_amax)  # [O, R]
    sx = sx / 16 if rows else sx  # (a power of two: exact)
    R = gqt.shape[1]
    if rounding == FP8_E4M3 and _fp8_ok(O, R, I) and has_fp8_gemm(gqt.device):
        # the two per-tensor scales go to the GEMM as they are (cuBLAS multiplies them):
        # their product is not a kernel of its own, one launch a layer fewer (the step's
        # host time is what FSDP2's per-block frames wait on: fp8_forward_h200_s36.md)
        gw = torch._scaled_mm(
            gqt.contiguous(),
            xq,
            scale_a=sg.reshape(()),
            scale_b=sx.reshape(()),
            out_dtype=torch.float32,
        )
    else:
        if rounding == FP8_E4M3:
            acc = gqt.to(torch.float32) @ xq.to(torch.float32)
        elif _int_mm_ok(O, R, I, gqt.device):
            acc = torch._int_mm(gqt.contiguous(), xq).to(torch.float32)
        else:
            acc = (gqt.to(torch.float64) @ xq.to(torch.float64)).to(torch.float32)
        gw = acc * (sg * sx)
    return gw if signs is None else gw * (16 / len(rows))


def amax_bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s max-abs as the kernels' ``amax`` word (the int32 bits of a float32), written as
    ATen so that inductor computes it where ``x`` is produced: the max over each row first,
    a reduction over the rows the producer writes anyway (an RMSNorm's kernel already reduces
    them; a SwiGLU product's pointwise kernel becomes a row reduction that also stores the
    product), then a small reduction over the rows. The quantize kernel then reads ``x`` once
    (the codes) where alone it reads it twice (a max-abs by atomics, then the codes). The max
    is exact in any order, so the codes are the same bits."""
    rows = x.abs().amax(dim=-1) if x.dim() > 1 else x.abs()
    return rows.amax().to(torch.float32).reshape(1).view(torch.int32)


def compress(
    x3: torch.Tensor,
    grid_w: int,
    rows: tuple[int, ...],
    bits: int,
    rounding: str,
    signs: torch.Tensor | None,
    amax: torch.Tensor | None = None,
    producer_amax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ABC: the forward's saved ``Q(T·x)`` as ``[R, D]`` column-major (K-major for the g_w
    GEMM) and its scale — :func:`hotcompile.ops.abc_compress` without the op layer.

    On CUDA, for the plain rows of x (:func:`plain_rows`), ``amax``: x's max-abs word, which
    the kernel then does not take itself (e.g. the speed gate's, computed outside its timing
    as the step computes it in x's producer); ``producer_amax``: that word from
    :func:`amax_bits` (``HotConfig.abc_max_abs="producer"``)."""
    if (
        amax is None
        and producer_amax
        and x3.numel()
        and use_triton(x3)
        and plain_rows(grid_w, rows, signs is not None)
    ):
        amax = amax_bits(x3)
    codes, scale = hla_codes(x3, grid_w, rows, bits, rounding, signs, amax)
    return codes.t(), scale


#: the widest SwiGLU product whose lean-backward ABC codes (:func:`compress_swiglu`) stay with
#: inductor's ATen, measured on an H200 (``experiments/results/swiglu_abc_h200.md``, session
#: 30): inductor's fused product + max-abs kernel and the codes pass took 165 µs against the
#: kernel's 200 at 8192 × 8192, but 599 against 336 at 8192 × 14336 (the 8B MLP, where
#: inductor's kernel is slow). The kernel computes the product in both of its passes.
SWIGLU_ABC_ATEN_MAX_WIDTH = 8192


def compress_swiglu(
    codes: Sequence[torch.Tensor],
    x3_shape: Sequence[int],
    rows: tuple[int, ...],
    bits: int,
    rounding: str,
    x_dtype: torch.dtype,
    gemm_dtype: torch.dtype,
    producer_amax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compress` of a SwiGLU's product ``x = silu(a) · b`` (``x3_shape``: x as
    ``[N, S, D]`` token sequences) from the SwiGLU's saved rowwise FP8 codes ``(ca, sa, cb,
    sb)`` of ``a`` and ``b`` (``HotConfig.abc_swiglu``): the codes of ``silu(a')·b'`` in
    ``x_dtype``, as the GEMM reads it (``gemm_dtype``, the autocast dtype).

    On CUDA, for the g_w path's plain rows (the text recipe) of products wider than
    :data:`SWIGLU_ABC_ATEN_MAX_WIDTH`, one kernel quantizes the product as it makes it from
    the codes (``hotcompile.kernels.swiglu_triton.swiglu_abc``): the lean plan's backward,
    which re-derives these codes, then never writes the product.
    Elsewhere, or where it does not take the case, the same values from ATen (float32
    arithmetic, one rounding to ``x_dtype``, then to ``gemm_dtype``)."""
    ca, sa, cb, sb = codes
    N = int(x3_shape[0])
    one_rounding = x_dtype in (gemm_dtype, torch.float32)
    if use_triton(ca) and one_rounding and ca.shape[-1] > SWIGLU_ABC_ATEN_MAX_WIDTH:
        from hotcompile.kernels.swiglu_triton import supported_abc

        if supported_abc(ca, cb, N, rows, bits, rounding, gemm_dtype):
            c, s = _triton_ops().swiglu_abc(
                _plain(ca), sa, _plain(cb), sb, N, bits, rounding, gemm_dtype
            )
            return c.t(), s
    a, b = dequantize(ca, sa), dequantize(cb, sb)
    y = (torch.nn.functional.silu(a) * b).to(x_dtype).to(gemm_dtype).reshape(x3_shape)
    return compress(y, 0, rows, bits, rounding, None, producer_amax=producer_amax)

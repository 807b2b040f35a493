"""HOT's cost model as sympy formulas: FLOPs, bit-operations and the paper's activation memory.

The formulas are the ones of ``shared/docs/hot-method.md`` ("Cost model", "Memory"), i.e.
supplement Table 5 and the official analysis code (``utils/analysis_calculator.py`` of
sungonuni/HOT). They are kept symbolic in the layer's symbols ``L, O, I, n, r`` so the report
can print them and so that ``L`` may itself be an expression of a dynamic batch size; numbers
come from substituting one layer's values.

Everything is counted in *element operations* first (one Hadamard butterfly, one
quantize-or-dequantize of an element). Table 5 charges 2 FLOPs per element operation; the
official BOPs count charges ``32·32`` bit-operations for it (FP32, a MAC counted once) and
``bits_a·bits_b`` per MAC of an integer GEMM. Keeping both derived from one count is what
makes the FLOP and BOP views of a layer agree on what HOT does.

What a layer does depends on the rewrite pass's plan (:class:`PathCosts` is built from it):
a skipped or exact layer costs what autograd costs; a frozen weight (``gx_only``) computes no
weight gradient; a layer without HLA (one row per sample) quantizes full-length operands.
"""

from __future__ import annotations

import dataclasses
import functools

import sympy

L, O, I, n, r = sympy.symbols("L O I n r", positive=True)
SYMBOLS = (L, O, I, n, r)
FP32_BITS = 32
#: bit-operations of one FP32 multiply-accumulate or element operation (official analysis).
FP32_BOPS = FP32_BITS * FP32_BITS
BOPS_VARIANTS = ("table5", "code")


@dataclasses.dataclass(frozen=True)
class PathCosts:
    """What one layer's backward does, as far as the cost model is concerned.

    Attributes:
        path: the rewrite's path: ``"hot"``, ``"gx_only"``, ``"exact"`` or ``"skipped"``.
        weight_grad: the weight needs a gradient (so the baseline computes g_w too).
        gx_bits: bit-width of the HQ GEMM operands, None when g_x is computed in FP32.
        gw_bits: bit-width of the g_w operands (and of the saved ABC buffer), None for FP32.
        hla: HLA projects the token dimension (r of n rows kept).
        fwd_bits: bit-width of the forward GEMM's operands on HOT's side (8: an FP8 forward,
            ``HotConfig.forward="fp8"``), None for the paper's full-precision forward.
    """

    path: str
    weight_grad: bool = True
    gx_bits: int | None = 4
    gw_bits: int | None = 8
    hla: bool = True
    fwd_bits: int | None = None

    @property
    def rewritten(self) -> bool:
        """HOT's transforms run (not skipped, not exact)."""
        return self.path in ("hot", "gx_only")

    @property
    def hot_gw(self) -> bool:
        """The weight gradient goes through HOT's g_w path."""
        return self.rewritten and self.path == "hot" and self.weight_grad


def _log_n() -> sympy.Expr:
    return sympy.log(n, 2)


def _kept() -> sympy.Expr:
    """Fraction of the reduction length HLA keeps."""
    return r / n


@dataclasses.dataclass(frozen=True)
class Formulas:
    """The sympy expressions of one kind of layer (one :class:`PathCosts`)."""

    forward_flops: sympy.Expr
    vanilla_backward_flops: sympy.Expr
    hot_overhead_flops: sympy.Expr
    hot_backward_flops: sympy.Expr
    forward_bops: sympy.Expr
    hot_forward_bops: sympy.Expr
    fp_backward_bops: sympy.Expr
    hot_backward_bops: sympy.Expr
    paper_fp_bytes: sympy.Expr
    paper_hot_bytes: sympy.Expr

    def as_dict(self) -> dict[str, sympy.Expr]:
        return dataclasses.asdict(self)


def overhead_element_ops(p: PathCosts, bops_variant: str = "table5") -> sympy.Expr:
    """Element operations HOT adds to one layer's backward (Table 5 without its factor 2).

    g_x: Hadamard transform of g_y (L×O) and W (O×I) along O, quantize both;
    g_w: HLA of x (L×I) and g_y (L×O) along L, quantize both projected operands (``L·r/n``
    rows, or L without HLA); dequantize g_x (L·I) and g_w (I·O). ``bops_variant="code"``
    reproduces the official code's ``I·(r/n)·O`` for the quantization of the projected x,
    which Table 5 writes ``I·(r/n)·L``.
    """
    if bops_variant not in BOPS_VARIANTS:
        raise ValueError(f"bops_variant must be one of {BOPS_VARIANTS}, got {bops_variant!r}")
    if not p.rewritten:
        return sympy.Integer(0)
    ops = sympy.Integer(0)
    if p.gx_bits is not None:
        ops += L * O * _log_n() + I * O * _log_n() + L * O + I * O  # HT + quantize
        ops += L * I  # dequantize g_x
    if p.hot_gw:
        rows = L * _kept() if p.hla else L
        if p.hla:
            ops += L * I * _log_n() + L * O * _log_n()
        if p.gw_bits is not None:
            x_rows = O * _kept() if (bops_variant == "code" and p.hla) else rows
            ops += O * rows + I * x_rows  # quantize projected g_y and x
            ops += I * O  # dequantize g_w
    return ops


def _gemm_bops(bits: int | None) -> int:
    return FP32_BOPS if bits is None else bits * bits


@functools.lru_cache(maxsize=256)
def formulas(p: PathCosts, bops_variant: str = "table5", qkv_factor: int = 1) -> Formulas:
    """All cost formulas of a layer that follows ``p``.

    ``qkv_factor`` multiplies both memory formulas (the official analysis multiplies layers
    named ``qkv`` by 4, unexplained). As in the official analysis, a layer whose weight needs
    no gradient is charged no saved activation: g_x = g_y·W does not need x.
    """
    gemm = L * O * I
    gemms = 2 if p.weight_grad else 1
    vanilla = 2 * gemm * gemms
    fp_bops = FP32_BOPS * gemm * gemms
    ops = overhead_element_ops(p, "table5")
    if p.rewritten:
        gx_macs = gemm
        gw_macs = (gemm * _kept() if p.hla else gemm) if p.hot_gw else 0
        hot_flops = 2 * (gx_macs + gw_macs) + 2 * ops
        hot_bops = (
            FP32_BOPS * overhead_element_ops(p, bops_variant)
            + gx_macs * _gemm_bops(p.gx_bits)
            + gw_macs * _gemm_bops(p.gw_bits)
        )
    else:
        hot_flops, hot_bops = vanilla, fp_bops
    out_numel = L * O  # linear: L×O; conv: N·C_out·H_out·W_out = L·O
    fp_bytes = out_numel * (FP32_BITS // 8) * qkv_factor if p.weight_grad else sympy.Integer(0)
    if p.hot_gw and p.path == "hot":
        kept = _kept() if p.hla else 1
        bits = FP32_BITS if p.gw_bits is None else p.gw_bits
        hot_bytes = out_numel * kept * sympy.Rational(bits, 8) * qkv_factor
    elif p.path == "gx_only":
        hot_bytes = sympy.Integer(0)
    else:
        hot_bytes = fp_bytes
    return Formulas(
        forward_flops=2 * gemm,
        vanilla_backward_flops=vanilla,
        hot_overhead_flops=2 * ops,
        hot_backward_flops=hot_flops,
        forward_bops=FP32_BOPS * gemm,
        hot_forward_bops=_gemm_bops(p.fwd_bits if p.rewritten else None) * gemm,
        fp_backward_bops=fp_bops,
        hot_backward_bops=hot_bops,
        paper_fp_bytes=fp_bytes,
        paper_hot_bytes=hot_bytes,
    )


def evaluate(expr: sympy.Expr, values: dict[sympy.Symbol, object]) -> sympy.Expr:
    """Substitute a layer's values; the result is a number unless a value is symbolic.

    ``log(n)/log(2)`` does not cancel by itself in sympy, so for a power-of-two block the
    logarithm is replaced first: exact integers stay exact (the test table is printed to the
    last digit of exact rationals).
    """
    block = values.get(n)
    if block is not None and int(block) > 0 and int(block) & (int(block) - 1) == 0:
        expr = expr.subs(sympy.log(n), (int(block).bit_length() - 1) * sympy.log(2))
    return expr.subs(values)


def to_number(value: sympy.Expr) -> int | float:
    """A plain Python number for JSON/CSV (integers stay exact)."""
    value = sympy.sympify(value)
    if value.is_Integer:
        return int(value)
    return float(value)

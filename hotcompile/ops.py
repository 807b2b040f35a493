"""The ``torch.ops.hotcompile.*`` custom operators.

Each op is defined here with its pure-PyTorch reference implementation (CPU and CUDA
tensors), a fake implementation for tracing (symbolic-shape safe), and an autocast
registration. The references are the specification: fast GPU kernels register as extra
implementations of the same schemas and are tested against them.

Ops are functional (no mutation, no aliasing) so that AOTAutograd, the min-cut partitioner and
CSE can treat them like any other pure op; integer codes are ``int8`` and scales ``float32``.

Conventions: ``rows`` lists the kept Walsh-Hadamard rows of HLA (empty = no HLA: the operand is
only quantized); ``grid_w`` is 0 for sequences, the map width for spatial layouts; ``block`` is
the Hadamard block n.
"""

from __future__ import annotations

import torch

from hotcompile import lqs, numerics
from hotcompile.hadamard import block_hadamard, padded
from hotcompile.hla import hla_operand, hla_transform, patch_side, signed
from hotcompile.quant import FP8_E4M3, code_dtype, dequantize, hq_weight_quantizer
from hotcompile.quant import quantize as _quantize


def _op(fn):
    """Define ``hotcompile::<name>`` as a functional custom op from its reference."""
    return torch.library.custom_op(f"hotcompile::{fn.__name__}", mutates_args=())(fn)


def _hla_rows_out(N, S, grid_w: int, nrows: int, block: int):
    """Number of rows of ``T x`` for ``x: [N, S, D]`` (SymInt-safe)."""
    p = patch_side(block)
    if grid_w and p:
        H = S // grid_w
        nb = (padded(H, p) // p) * (padded(grid_w, p) // p)
    else:
        nb = padded(S, block) // block
    return N * nb * nrows


def _compressed_rows(N, S, grid_w: int, rows: list[int], block: int):
    return _hla_rows_out(N, S, grid_w, len(rows), block) if rows else N * S


# --------------------------------------------------------------------------- transforms


@_op
def hadamard(x: torch.Tensor, dim: int, block: int) -> torch.Tensor:
    """Block Hadamard transform ``x·(I ⊗ H_block)`` along ``dim`` (zero-padded), float32."""
    return block_hadamard(x, dim, block)


@hadamard.register_fake
def _(x, dim, block):
    shape = list(x.shape)
    d = dim % x.dim()
    shape[d] = padded(shape[d], block)
    return x.new_empty(shape, dtype=torch.float32)


@_op
def hla(x: torch.Tensor, grid_w: int, rows: list[int], block: int) -> torch.Tensor:
    """HLA's ``T x`` for ``x: [N, S, D]``: the kept coefficients of every block, ``[R, D]``."""
    return hla_transform(x, grid_w, tuple(rows), block)


@hla.register_fake
def _(x, grid_w, rows, block):
    N, S, D = x.shape
    return x.new_empty((_hla_rows_out(N, S, grid_w, len(rows), block), D), dtype=torch.float32)


# --------------------------------------------------------------------------- quantization


@_op
def quantize(
    x: torch.Tensor, bits: int, per_token: bool, rounding: str, scale_mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantization of a 2-D tensor: ``(codes int8, scale float32 [R] or [1])``."""
    return _quantize(x, bits, per_token, rounding, scale_mode)


@quantize.register_fake
def _(x, bits, per_token, rounding, scale_mode):
    R = x.shape[0]
    return (
        x.new_empty(x.shape, dtype=code_dtype(rounding)),
        x.new_empty((R if per_token else 1,), dtype=torch.float32),
    )


@_op
def dequantize_rows(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Float32 values of 2-D codes with one scale per row (:func:`hotcompile.quant.dequantize`).

    An op, not ATen, for what the forward saves as codes (``HotConfig.abc_swiglu``): the
    min-cut partitioner doubles the cost of saving a tensor whose readers it could fuse, and
    with the dequantization fusible it saved the bf16 tensor the codes come from and
    recomputed the codes in the backward instead (twice the bytes). Read by an opaque op the
    codes count at their size. (On CUDA the SwiGLU kernel reads the codes itself.)"""
    return dequantize(codes, scale)


@dequantize_rows.register_fake
def _(codes, scale):
    return codes.new_empty(codes.shape, dtype=torch.float32)


@_op
def int_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a · bᵀ`` with integer semantics: int8 ``[M, K]`` × int8 ``[N, K]`` -> int32 ``[M, N]``.

    (The "TN" layout the tensor-core GEMMs consume: both operands K-major.) Runs on
    ``torch._int_mm`` (int32 accumulation) where it takes the shape — any shape on CPU;
    on CUDA M > 16 and K, N multiples of 8 — and otherwise accumulates in float64, which is
    exact for |sum| < 2^53 (K < 5.5e11 for INT8).
    """
    if a.dtype != torch.int8 or b.dtype != torch.int8:
        raise TypeError(f"int_gemm takes int8 operands, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"int_gemm shapes do not match: {tuple(a.shape)} · {tuple(b.shape)}ᵀ")
    M, K = a.shape
    N = b.shape[0]
    if a.device.type == "cpu" or (M > 16 and K % 8 == 0 and N % 8 == 0 and K > 0):
        return torch._int_mm(a.contiguous(), b.contiguous().t())
    return (a.to(torch.float64) @ b.to(torch.float64).t()).to(torch.int32)


@int_gemm.register_fake
def _(a, b):
    torch._check(a.shape[1] == b.shape[1], lambda: "int_gemm: K mismatch")
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.int32)


# --------------------------------------------------------------------------- ABC


@_op
def abc_compress(
    x: torch.Tensor,
    grid_w: int,
    rows: list[int],
    block: int,
    bits: int,
    rounding: str,
    signs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ABC: the forward's compressed activation ``Q(T x)`` for ``x: [N, S, D]``.

    Returns ``(codes int8 [R, D], scale float32 [1])`` with R = N·nb·r (HLA) or N·S
    (``rows`` empty). This is what the forward saves instead of x.

    The codes are column-major (strides ``(1, R)``): the weight-gradient GEMM
    ``g̃qᵀ·x̃q`` reduces over R, and the tensor-core GEMMs want both operands K-major, so the
    forward writes them that way once instead of the backward transposing them every step.

    ``signs`` (``[N, S, 1]``, ±1; ``hla_signs``): compress ``x · signs`` instead; the CUDA
    kernel multiplies as it loads, so no signed copy of x is made.
    """
    x = signed(x, signs)
    q, s = _quantize(hla_operand(x, grid_w, rows, block), bits, False, rounding, "maxabs")
    return q.t().contiguous().t(), s


@abc_compress.register_fake
def _(x, grid_w, rows, block, bits, rounding, signs=None):
    N, S, D = x.shape
    R = _compressed_rows(N, S, grid_w, rows, block)
    codes = x.new_empty((D, R), dtype=code_dtype(rounding)).t()  # column-major, as the op
    return codes, x.new_empty((1,), dtype=torch.float32)


# --------------------------------------------------------------------------- backward paths


@_op
def hq_grad_input(
    gy: torch.Tensor,
    w: torch.Tensor,
    bits: int,
    scaling: str,
    rounding: str,
    weight_scale: str,
    block: int,
    layer: str,
    key: str,
    check: bool,
) -> torch.Tensor:
    """HQ g_x path: ``g_x ≈ g_y · W`` through Hadamard-transformed low-bit operands.

    ``Ĝ = g_y·B_O``, ``Ŵ = B_O·W`` (16-blocks along O, zero-padded), ``Ĝq = Q(Ĝ)`` per-token or
    per-tensor (``scaling``) with ``rounding``, ``Ŵq = Q(Ŵ)`` per-tensor (SAWB or max-abs,
    nearest), then ``g_x = diag(s_g)·(Ĝq·Ŵq)·s_w / block`` with an exact integer GEMM.
    ``gy: [L, O]``, ``w: [O, I]``; the result ``[L, I]`` has gy's dtype. With
    ``rounding="fp8_e4m3"`` (``gx_format="fp8"``, 8 bits) Ĝq and Ŵq are FP8-e4m3 values
    with max-abs/448 scales (the weight's per tensor) and the GEMM accumulates in float32.

    ``scaling="lqs"`` looks the layer's quantizer up by ``key`` in ``hotcompile.lqs``: while
    the layer calibrates, the exact product is returned and both errors are recorded. A
    non-empty ``key`` also applies the precision warm-up.
    """
    scaling, bits = lqs.resolve(key, scaling, gy, bits, block)
    if scaling == "exact":  # LQS is calibrating this layer
        return gy @ w.to(gy.dtype)
    per_token = scaling == "per_token"
    g_hat = block_hadamard(gy, 1, block)
    w_hat = block_hadamard(w, 0, block)
    gq, sg = _quantize(g_hat, bits, per_token, rounding, "maxabs")
    wq, sw = _quantize(w_hat, bits, False, *hq_weight_quantizer(rounding, weight_scale))
    if check:
        numerics.check_scale(sg, layer, "g_x")
    if rounding == FP8_E4M3:  # products exact in float32, sums accumulate there (as FP8 GEMMs)
        acc = gq.to(torch.float32) @ wq.to(torch.float32)
    else:
        acc = int_gemm(gq, wq.t().contiguous()).to(torch.float32)
    s_row = sg[:, None] if per_token else sg
    return (acc * s_row * (sw / block)).to(gy.dtype)


@hq_grad_input.register_fake
def _(gy, w, bits, scaling, rounding, weight_scale, block, layer, key, check):
    torch._check(gy.shape[1] == w.shape[0], lambda: "hq_grad_input: O mismatch")
    return gy.new_empty((gy.shape[0], w.shape[1]))


@_op
def hq_conv_grad_input(
    gy: torch.Tensor,
    w: torch.Tensor,
    input_hw: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    bits: int,
    scaling: str,
    rounding: str,
    weight_scale: str,
    block: int,
    layer: str,
    key: str,
    check: bool,
) -> torch.Tensor:
    """HQ g_x of a conv2d (groups 1): HQ on the im2col GEMM, then col2im.

    ``gy: [N, O, Ho, Wo]``, ``w: [O, C, kh, kw]``; rows of the GEMM are output positions
    (per-token = per position; ``scaling``/``key`` as in ``hq_grad_input``). Returns
    ``[N, C, H, W]`` in gy's dtype. The col2im lives inside the op on purpose: inductor
    (torch 2.13, CPU) miscompiles ``F.fold`` of a transposed operand followed by a pointwise
    op (experiments/inductor_fold_transposed.py).
    """
    N, O, Ho, Wo = gy.shape
    gy2 = gy.permute(0, 2, 3, 1).reshape(-1, O)
    cols = hq_grad_input(
        gy2, w.reshape(O, -1), bits, scaling, rounding, weight_scale, block, layer, key, check
    )
    cols = cols.reshape(N, Ho * Wo, -1).transpose(1, 2)
    return torch.nn.functional.fold(
        cols, tuple(input_hw), tuple(w.shape[-2:]), tuple(dilation), tuple(padding), tuple(stride)
    )


@hq_conv_grad_input.register_fake
def _(
    gy,
    w,
    input_hw,
    stride,
    padding,
    dilation,
    bits,
    scaling,
    rounding,
    weight_scale,
    block,
    layer,
    key,
    check,
):
    return gy.new_empty((gy.shape[0], w.shape[1], input_hw[0], input_hw[1]))


@_op
def hla_grad_weight(
    gy: torch.Tensor,
    xq: torch.Tensor,
    sx: torch.Tensor,
    grid_w: int,
    rows: list[int],
    block: int,
    bits: int,
    rounding: str,
    layer: str,
    check: bool,
    signs: torch.Tensor | None = None,
) -> torch.Tensor:
    """HLA g_w path: ``g_w ≈ g_yᵀ x`` from the saved compressed activation.

    ``g̃ = T·g_y`` (same geometry as the forward's ``abc_compress``), ``g̃q = Q(g̃)`` per-tensor,
    ``g_w = s_g·s_x·(g̃qᵀ·x̃q) / block`` (no ``/block`` without HLA). ``gy: [N, S, O]``,
    ``xq: [R, I]`` int8 (``float8_e4m3fn`` with ``rounding="fp8_e4m3"``: the FP8 g_w path),
    ``sx: [1]``; returns float32 ``[O, I]``. ``signs``: g_y is signed first, as x was by
    ``abc_compress`` (the caller applies HLA's n/r factor).
    """
    g_t = hla_operand(signed(gy, signs), grid_w, rows, block)
    gq, sg = _quantize(g_t, bits, False, rounding, "maxabs")
    if check:  # x first: a NaN/Inf in x (sx) is where one in both started
        numerics.check_scale(sx, layer, "x")
        numerics.check_scale(sg, layer, "g_w")
    if gq.dtype != xq.dtype:
        raise TypeError(f"hla_grad_weight: g_y codes are {gq.dtype}, the saved x codes {xq.dtype}")
    if gq.is_floating_point():  # FP8 codes: products are exact in float32, sums accumulate there
        acc = gq.to(torch.float32).t() @ xq.to(torch.float32)
    else:
        acc = int_gemm(gq.t().contiguous(), xq.t().contiguous()).to(torch.float32)
    return acc * (sg * sx / (block if rows else 1))


@hla_grad_weight.register_fake
def _(gy, xq, sx, grid_w, rows, block, bits, rounding, layer, check, signs=None):
    return gy.new_empty((gy.shape[-1], xq.shape[1]), dtype=torch.float32)


@_op
def hla_grad_weight_dense(
    gy: torch.Tensor,
    x: torch.Tensor,
    grid_w: int,
    rows: list[int],
    block: int,
    bits: int,
    rounding: str,
    layer: str,
    check: bool,
    signs: torch.Tensor | None = None,
) -> torch.Tensor:
    """HLA g_w from the full-precision activation ``x: [N, S, I]`` (ABC off).

    Same result as ``abc_compress`` followed by ``hla_grad_weight``; taking ``gy`` and ``x``
    in one op keeps the compression in the backward (the partitioner cannot hoist it into
    the forward), so x is what is saved.
    """
    x = signed(x, signs)
    xq, sx = _quantize(hla_operand(x, grid_w, rows, block), bits, False, rounding, "maxabs")
    return hla_grad_weight(gy, xq, sx, grid_w, rows, block, bits, rounding, layer, check, signs)


@hla_grad_weight_dense.register_fake
def _(gy, x, grid_w, rows, block, bits, rounding, layer, check, signs=None):
    return gy.new_empty((gy.shape[-1], x.shape[-1]), dtype=torch.float32)


# --------------------------------------------------------------------------- autocast

_LIB = torch.library.Library("hotcompile", "FRAGMENT")

#: per op, the positions of its floating "data" inputs: inside an autocast region these are
#: cast to the autocast dtype (what the forward GEMM consumes); scales stay float32.
AUTOCAST_DATA_ARGS: dict[str, tuple[int, ...]] = {
    "hadamard": (0,),
    "hla": (0,),
    "quantize": (0,),
    "int_gemm": (),
    "abc_compress": (0,),
    "hq_grad_input": (0, 1),
    "hla_grad_weight": (0,),
    "hq_conv_grad_input": (0, 1),
    "hla_grad_weight_dense": (0, 1),
}


def _register_autocast(name: str, data_args: tuple[int, ...]) -> None:
    op = getattr(torch.ops.hotcompile, name).default
    for device_type in ("cpu", "cuda"):
        key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

        def kernel(_ks, *args, _device_type=device_type, _keyset=keyset):
            dtype = torch.get_autocast_dtype(_device_type)
            args = tuple(
                a.to(dtype)
                if i in data_args and isinstance(a, torch.Tensor) and a.is_floating_point()
                else a
                for i, a in enumerate(args)
            )
            with torch._C._ExcludeDispatchKeyGuard(_keyset):
                return op(*args)

        _LIB.impl(name, kernel, key, with_keyset=True)


for _name, _args in AUTOCAST_DATA_ARGS.items():
    _register_autocast(_name, _args)

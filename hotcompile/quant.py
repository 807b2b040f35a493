"""Symmetric integer quantizers and roundings (reference implementation).

INT4 codes lie in [-7, 7] and INT8 codes in [-127, 127]; both are stored as ``int8`` (an
INT4-grid value is exact in int8 and in FP8-e4m3, which is how Hopper runs INT4 numerics).
No zero point. Scales are float32: max-abs / qmax for gradients and activations, SAWB
(official code) or max-abs for weights.

NaN/Inf never disappear: a non-finite max-abs gives a non-finite scale, and every value
dequantized with it is non-finite too.
"""

from __future__ import annotations

import torch

#: NITI pseudo-stochastic rounding: bits of "probability" and of "random number" per bit-width.
PSEUDO_BITS = {4: 10, 8: 8}

#: the g_w path's FP8 alternative (``HotConfig.gw_format="fp8"``), passed where a rounding goes:
#: values scaled so the max-abs lands on e4m3's largest finite value, then rounded to the
#: nearest e4m3 value (ties to even). Codes are ``float8_e4m3fn``, not integers.
FP8_E4M3 = "fp8_e4m3"
FP8_MAX = 448.0


def has_fp8_gemm(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` multiplies FP8-e4m3 on ``device``: the CPU, or a CUDA GPU of
    compute capability 8.9+ (Ada, Hopper). Older GPUs (A100) have no FP8 tensor cores: the
    kernels then write INT8 codes (exact for INT4-grid values too) and use ``_int_mm``."""
    if device.type != "cuda":
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index) >= (8, 9)


def qmax(bits: int) -> int:
    """Largest code of a symmetric ``bits``-bit quantizer (7 for INT4, 127 for INT8)."""
    if bits not in (4, 8):
        raise ValueError(f"only 4- and 8-bit quantizers exist, got {bits}")
    return (1 << (bits - 1)) - 1


def round_magnitude(a: torch.Tensor, rounding: str, bits: int) -> torch.Tensor:
    """Round non-negative float32 magnitudes ``a`` to integers (as float32).

    - ``nearest``: round half to even.
    - ``stochastic``: ``⌊a⌋ + [frac > u]``, u ~ U[0, 1): unbiased, draws torch RNG.
    - ``pseudo_stochastic`` (NITI): no RNG. ``F = ⌊frac·2^{2m}⌋``; its high m bits are the
      probability, its low m bits the random number; round up iff high > low. Unbiased as
      long as the low bits of the values behave like noise, which holds after division by a
      max-abs scale (and is tested statistically).
    """
    if rounding == "nearest":
        return torch.round(a)
    floor = torch.floor(a)
    frac = a - floor
    if rounding == "stochastic":
        up = frac > torch.rand_like(frac)
    elif rounding == "pseudo_stochastic":
        m = PSEUDO_BITS[bits]
        f = torch.floor(frac * float(1 << (2 * m))).to(torch.int32)
        up = (f >> m) > (f & ((1 << m) - 1))
    else:
        raise ValueError(f"unknown rounding {rounding!r}")
    return floor + up.to(a.dtype)


def sawb_scale(w: torch.Tensor, bits: int) -> torch.Tensor:
    """SAWB clipping scale of the official code (4-bit): ``α = 12.1·√mean(w²) − 12.2·mean|w|``.

    Falls back to max-abs when α ≤ 0 and for other bit-widths (SAWB's coefficients are
    fitted per bit-width; the official code only has the 4-bit pair).
    """
    w = w.to(torch.float32)
    amax = w.abs().amax()
    if bits != 4:
        return amax * (1.0 / qmax(bits))
    alpha = 12.1 * w.square().mean().sqrt() - 12.2 * w.abs().mean()
    alpha = torch.where(alpha > 0, torch.minimum(alpha, amax), amax)
    # keep NaN/Inf visible: a non-finite weight gives a non-finite scale
    alpha = torch.where(torch.isfinite(amax), alpha, amax)
    return alpha * (1.0 / qmax(bits))


#: smallest normal float32: a scale is never set below it (see :func:`normal_scale`)
MIN_NORMAL = 2.0**-126


def normal_scale(s: torch.Tensor) -> torch.Tensor:
    """A positive scale raised to at least the smallest normal float32, so that its reciprocal
    is finite: a tensor whose max-abs is below ``qmax · 2^-126`` (about 5e-36 for FP8, 9e-37 for
    INT4) gets codes below ``qmax`` rather than ``inf · x``. Zero, NaN and Inf stay as they are
    (no scale, or one that keeps the tensor's non-finite values visible)."""
    return torch.where(s > 0, torch.clamp_min(s, MIN_NORMAL), s)


def inverse(s: torch.Tensor) -> torch.Tensor:
    """``1 / s`` for the codes ``x · (1/s)``, 1 where there is no usable scale (0, NaN, Inf).

    The codes multiply by the correctly rounded float32 reciprocal of the scale rather than
    divide by it: every kernel then does one IEEE division per row (or tensor) and one multiply
    per element, where a division per element made the memory-bound quantize passes ALU-bound
    on the H100 (``experiments/results/layer_passes_h100.md``). ``x · (1/s)`` can differ from
    ``x / s`` in the last bit, so this, not the division, is the specification the kernels
    match bit for bit.
    """
    safe = torch.where((s > 0) & torch.isfinite(s), s, torch.ones_like(s))
    return torch.reciprocal(safe)


def quantize(
    x: torch.Tensor,
    bits: int,
    per_token: bool = False,
    rounding: str = "nearest",
    scale_mode: str = "maxabs",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D tensor. Returns ``(codes int8 [R, C], scale float32 [R] or [1])``.

    ``x ≈ codes * scale[:, None]`` (per-token) or ``codes * scale`` (per-tensor).

    ``rounding=FP8_E4M3`` (8 bits, max-abs scale) gives ``float8_e4m3fn`` codes instead: the
    g_w path's configurable alternative to INT8 (the issue asks for FP8 g_w with its accuracy
    measured). The scale maps the max-abs to 448, e4m3's largest finite value; the scaled values
    are clamped to ±448 (torch's cast turns larger ones into NaN) and cast with
    round-to-nearest-even. e4m3 keeps 3 mantissa bits (at most 2^-4 relative error) for values
    above 2^-6 in units of the scale, where INT8's uniform grid keeps 127 levels: small gradient
    entries fare better, large ones worse.
    """
    if x.dim() != 2:
        raise ValueError(f"quantize expects a 2-D tensor, got shape {tuple(x.shape)}")
    fp8 = rounding == FP8_E4M3
    if fp8 and bits != 8:
        raise ValueError(f"FP8 codes are 8 bits wide, got bits={bits}")
    if fp8 and scale_mode != "maxabs":
        raise ValueError("FP8 quantization supports only max-abs scales")
    q = FP8_MAX if fp8 else qmax(bits)
    # multiply by the float32 reciprocal rather than divide: CUDA turns division by a scalar
    # into exactly this multiplication, and the scales must agree bit for bit across devices
    inv_q = 1.0 / q
    xf = x.to(torch.float32)
    if per_token:
        if scale_mode != "maxabs":
            raise ValueError("per-token quantization supports only max-abs scales")
        scale = xf.abs().amax(dim=1) * inv_q
    elif scale_mode == "sawb":
        scale = sawb_scale(xf, bits).reshape(1)
    elif scale_mode == "maxabs":
        scale = (xf.abs().amax() * inv_q).reshape(1)
    else:
        raise ValueError(f"unknown scale mode {scale_mode!r}")
    scale = normal_scale(scale)
    s = scale[:, None] if per_token else scale
    v = torch.nan_to_num(xf * inverse(s), nan=0.0, posinf=float(q), neginf=-float(q))
    if fp8:
        return v.clamp_(-q, q).to(torch.float8_e4m3fn), scale
    mag = round_magnitude(v.abs(), rounding, bits).clamp_(max=q)
    codes = (torch.sign(v) * mag).to(torch.int8)
    return codes, scale


def hq_weight_quantizer(rounding: str, weight_scale: str) -> tuple[str, str]:
    """``(rounding, scale_mode)`` of HQ's weight operand ``Q(B_O·W)`` for the g_x path's
    ``rounding``: INT codes round to nearest with ``weight_scale`` (SAWB or max-abs); FP8
    values (``gx_format="fp8"``) are e4m3 with the max-abs/448 scale, as g_y's are."""
    if rounding == FP8_E4M3:
        return FP8_E4M3, "maxabs"
    return "nearest", weight_scale


def code_dtype(rounding: str) -> torch.dtype:
    """The dtype of :func:`quantize`'s codes for ``rounding``."""
    return torch.float8_e4m3fn if rounding == FP8_E4M3 else torch.int8


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Float32 values of ``quantize``'s output (per-token scales broadcast over rows)."""
    s = scale[:, None] if scale.numel() > 1 or codes.shape[0] == scale.shape[0] else scale
    return codes.to(torch.float32) * s

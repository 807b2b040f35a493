"""The rounding and scale rules of ``hotcompile.quant`` as Triton helpers, shared by every
quantize kernel.

Bit-exactness with the reference hinges on these few lines (the scale's IEEE reciprocal,
round-half-even, NITI's pseudo-stochastic rule, SAWB's clipping), so they exist once.
"""

import os

import triton
import triton.language as tl

from hotcompile.quant import FP8_E4M3, FP8_MAX, MIN_NORMAL, PSEUDO_BITS, qmax

_FLT_MAX = tl.constexpr(3.4028234663852886e38)
_MIN_NORMAL = tl.constexpr(MIN_NORMAL)
#: FP8 codes: on a GPU the float32 -> e4m3 conversion of the kernels' stores rounds to nearest,
#: ties to even (``cvt.rn.satfinite`` on sm_89+), as torch's cast does, so :func:`codes` leaves
#: it to the store; Triton's CPU interpreter converts otherwise, so there it rounds by hand
#: (:func:`_e4m3_rne`). On the H100 the hand rounding cost ~20% of a codes pass: the pass is
#: ALU-bound (experiments/results/plain_gw_h100.md)
_E4M3_BY_HAND = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
#: ``ROUNDING`` of the FP8 g_w codes (``hotcompile.quant.FP8_E4M3``); 0-2 are the INT roundings
FP8 = tl.constexpr(3)
#: rounding name -> the ``ROUNDING`` argument of :func:`codes`, for every kernel that calls it
ROUNDING_CODES = {"nearest": 0, "pseudo_stochastic": 1, "stochastic": 2, FP8_E4M3: 3}


def code_constexprs(bits: int, rounding: str) -> dict[str, int]:
    """The constexpr arguments :func:`codes` takes, as a kernel's launch passes them through:
    the rounding's code, the largest code (e4m3's 448 for FP8, else the INT grid's) and the
    pseudo-random bits of ``bits``-bit codes."""
    return dict(
        ROUNDING=ROUNDING_CODES[rounding],
        QMAX=int(FP8_MAX) if rounding == FP8_E4M3 else qmax(bits),
        PM=PSEUDO_BITS[bits],
    )


@triton.jit
def _e4m3_rne(v):
    """``v`` (|v| <= 448) rounded to the nearest float8-e4m3 value, ties to even, in float32.

    Done here rather than left to the float32 -> e4m3 conversion of the store, whose rounding
    is the hardware's (round-to-nearest-even on sm_89+) but not Triton's interpreter's: the
    codes are then exact in e4m3 and every conversion agrees. e4m3 keeps 3 fraction bits, so
    the grid step is 2^(e-3) for a value in [2^e, 2^(e+1)), e >= -6, and 2^-9 below 2^-6
    (subnormals); ``|v| / step`` and ``· step`` are exact (powers of two).
    """
    a = tl.abs(v)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 255) - 127  # a's binary exponent
    k = tl.maximum(e, -6) - 3  # log2 of the grid step
    step = ((k + 127) << 23).to(tl.float32, bitcast=True)
    inv = ((127 - k) << 23).to(tl.float32, bitcast=True)
    m = a * inv  # < 16: adding 2^23 rounds it half to even
    r = ((m + 8388608.0) - 8388608.0) * step
    return tl.where(v < 0.0, -r, r)


@triton.jit
def normal_scale(s):
    """``hotcompile.quant.normal_scale``: a positive scale raised to the smallest normal
    float32, so its reciprocal is finite; 0, NaN and Inf unchanged."""
    return tl.where(s > 0.0, tl.maximum(s, _MIN_NORMAL), s)


@triton.jit
def codes(x, s, offs, seed, ROUNDING: tl.constexpr, QMAX: tl.constexpr, PM: tl.constexpr):
    """Codes (float32) of ``x · (1/s)`` with the rounding of ``hotcompile.quant``: INT-grid
    integers, or (``ROUNDING == FP8``, QMAX 448) the scaled values clamped to ±448, to be
    rounded to the nearest e4m3 value, ties to even, as torch's cast rounds them — by the
    caller's store into an e4m3 tensor on a GPU, here under Triton's interpreter
    (``_E4M3_BY_HAND``). Every caller stores FP8 codes into float8_e4m3fn."""
    ok = (s > 0.0) & (s <= _FLT_MAX)
    # one IEEE division per scale (per row, or per tensor), one multiply per element, as
    # hotcompile.quant.inverse: a division per element made the passes ALU-bound
    inv = tl.math.div_rn(1.0, tl.where(ok, s, 1.0))
    v = x * inv
    v = tl.where(v != v, 0.0, v)
    if ROUNDING == FP8:
        v = tl.minimum(tl.maximum(v, QMAX * -1.0), QMAX * 1.0)
        if _E4M3_BY_HAND:
            v = _e4m3_rne(v)
        return v
    v = tl.where(v > _FLT_MAX, QMAX * 1.0, v)
    v = tl.where(v < -_FLT_MAX, QMAX * -1.0, v)
    a = tl.abs(v)
    if ROUNDING == 0:
        # round half to even: adding 2^23 leaves no fraction bits (a < 2^23)
        r = tl.where(a < 8388608.0, (a + 8388608.0) - 8388608.0, a)
    else:
        fl = tl.floor(a)
        frac = a - fl
        if ROUNDING == 1:
            f = tl.floor(frac * (1 << (2 * PM))).to(tl.int32)
            up = (f >> PM) > (f & ((1 << PM) - 1))
        else:
            up = frac > tl.rand(seed, offs)
        r = fl + up.to(tl.float32)
    mag = tl.minimum(r, QMAX * 1.0)
    return tl.where(v < 0.0, -mag, mag)


@triton.jit
def sawb_scale(amax, ssq, sab, numel, QMAX: tl.constexpr):
    """SAWB scale of ``hotcompile.quant.sawb_scale`` (4-bit) from max-abs, Σx², Σ|x|, numel.

    Max-abs when α ≤ 0; a non-finite max-abs stays visible in the scale.
    """
    # the count can arrive as fp64 (torch.library.triton_op's analysis and inductor's
    # wrapper type a Python float so) or as a Python float: divide, then float32 either way
    rms = tl.sqrt_rn((ssq / numel).to(tl.float32))
    alpha = 12.1 * rms - 12.2 * (sab / numel).to(tl.float32)
    alpha = tl.where(alpha > 0, tl.minimum(alpha, amax), amax)
    alpha = tl.where(amax <= _FLT_MAX, alpha, amax)
    return alpha * (1.0 / QMAX)


@triton.jit
def _round_bf16(v):
    """float32 ``v`` rounded to the nearest bfloat16, ties to even (torch's cast), kept in
    float32: by its bits, so that Triton's interpreter (which truncates a cast to bfloat16)
    and a GPU give the same values; NaN stays NaN."""
    b = v.to(tl.int32, bitcast=True)
    b = (b + (0x7FFF + ((b >> 16) & 1))) & -65536  # -65536: the int32 bits 0xFFFF0000
    return tl.where(v != v, v, b.to(tl.float32, bitcast=True))

"""The rounding and scale rules of ``hotcompile.quant`` as Triton helpers, shared by every
quantize kernel.

Bit-exactness with the reference hinges on these few lines (IEEE division by the scale,
round-half-even, NITI's pseudo-stochastic rule, SAWB's clipping), so they exist once.
"""

import triton
import triton.language as tl

_FLT_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def codes(x, s, offs, seed, ROUNDING: tl.constexpr, QMAX: tl.constexpr, PM: tl.constexpr):
    """INT-grid codes (float32) of ``x / s`` with the rounding of ``hotcompile.quant``."""
    ok = (s > 0.0) & (s <= _FLT_MAX)
    safe = tl.where(ok, s, 1.0)
    v = tl.math.div_rn(x, safe)  # IEEE division, like torch's x / s
    v = tl.where(v != v, 0.0, v)
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
    rms = tl.sqrt_rn(ssq / numel)
    alpha = 12.1 * rms - 12.2 * (sab / numel)
    alpha = tl.where(alpha > 0, tl.minimum(alpha, amax), amax)
    alpha = tl.where(amax <= _FLT_MAX, alpha, amax)
    return alpha * (1.0 / QMAX)

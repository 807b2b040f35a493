"""GPU tests of the CUTLASS sm_90a scaled GEMMs (hotcompile/kernels/cutlass.py, csrc/).

Skipped without CUDA, on a GPU other than sm_90, or when the JIT build is not possible or
fails (the skip reason says why). Covers, for every config id:
- INT8: the int32 accumulation is exact (fp32 out equals the float64 reference rounded once),
  then per-row / per-column / scalar scales and alpha, bf16 and fp32 out, accumulation into an
  fp32 ``out``;
- FP8 e4m3: against ``torch._scaled_mm`` (row-wise scales, bf16 out) and a float64 reference;
  INT4-grid codes (integers in [-7, 7]) give exact fp32 products while |sum| < 2**24, including
  K = 12608 (the HLA g_w shapes), which needs the per-k-tile fp32 promotion;
- the real layer shapes (ViT-B and LLM g_x / g_w) at reduced M, and unsupported shapes
  returning None while the C++ entry point raises a clear error.
"""

from __future__ import annotations

import pytest
import torch

from hotcompile.kernels import cutlass

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
I8 = torch.int8


@pytest.fixture(scope="module", autouse=True)
def _needs_kernels():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"needs sm_90 (H100/H200), got {torch.cuda.get_device_capability()}")
    if not cutlass.available():
        pytest.skip(f"CUTLASS kernels unavailable: {cutlass.error()}")


def _configs(dtype: torch.dtype) -> list[int]:
    return cutlass.CONFIGS[str(dtype).removeprefix("torch.")]


ALL = [(d, c) for d in (I8, FP8) for c in cutlass.CONFIGS[str(d).removeprefix("torch.")]]
IDS = [f"{str(d).removeprefix('torch.')}-cfg{c}" for d, c in ALL]

# (M, N, K): small odd-tile shapes, then the real layers' g_x (M = L reduced) and
# g_w with HLA (M = O reduced, K = L/2 = 12608 or 4096)
SHAPES = [
    (16, 16, 16),
    (48, 80, 112),
    (384, 272, 528),
    (512, 2304, 768),
    (512, 768, 3072),
    (256, 4096, 14336),
    (256, 14336, 4096),
    (256, 768, 12608),
    (768, 3072, 12608),
]


def _codes(m: int, k: int, dtype: torch.dtype, lo: int, hi: int, gen) -> torch.Tensor:
    x = torch.randint(lo, hi + 1, (m, k), generator=gen, device="cuda", dtype=torch.int32)
    return x.to(torch.int8) if dtype == I8 else x.to(torch.float32).to(FP8)


def _ref(a, b, sa=None, sb=None, alpha=1.0):
    acc = a.double() @ b.double().T
    if sa is not None:
        acc = acc * sa.double().reshape(-1, 1)
    if sb is not None:
        acc = acc * sb.double().reshape(1, -1)
    return alpha * acc


@pytest.mark.parametrize("dtype,config", ALL, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_integer_codes_are_exact(dtype, config, shape):
    """INT8 codes, or INT4-grid codes as e4m3: fp32 out == float64 product rounded once."""
    m, n, k = shape
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
    lo, hi = (-128, 127) if dtype == I8 else (-7, 7)
    a, b = _codes(m, k, dtype, lo, hi, g), _codes(n, k, dtype, lo, hi, g)
    ones_m, ones_n = torch.ones(m, device="cuda"), torch.ones(n, device="cuda")
    d = cutlass.scaled_gemm(a, b, ones_m, ones_n, out_dtype=torch.float32, config=config)
    assert d is not None and d.dtype == torch.float32 and d.shape == (m, n)
    ref = _ref(a, b)
    if dtype == FP8:
        assert ref.abs().max() < 2**24
    torch.testing.assert_close(d, ref.float(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype,config", ALL, ids=IDS)
@pytest.mark.parametrize("scales", ["row_col", "row_scalar", "scalar_col", "scalars", "floats"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_scales_and_alpha(dtype, config, scales, out_dtype):
    m, n, k = 272, 400, 640
    g = torch.Generator(device="cuda").manual_seed(1)
    lo, hi = (-128, 127) if dtype == I8 else (-7, 7)
    a, b = _codes(m, k, dtype, lo, hi, g), _codes(n, k, dtype, lo, hi, g)
    sa_v = torch.rand(m, device="cuda", generator=g) + 0.5
    sb_v = torch.rand(n, device="cuda", generator=g) * 1e-3 + 1e-4
    sa_s = torch.tensor([0.37], device="cuda")
    sb_s = torch.tensor([2.5e-3], device="cuda")
    sa, sb = {
        "row_col": (sa_v, sb_v),
        "row_scalar": (sa_v, sb_s),
        "scalar_col": (sa_s, sb_v),
        "scalars": (sa_s, sb_s),
        "floats": (0.37, 2.5e-3),
    }[scales]
    alpha = 1 / 16
    d = cutlass.scaled_gemm(a, b, sa, sb, alpha=alpha, out_dtype=out_dtype, config=config)
    assert d is not None and d.dtype == out_dtype
    ta = torch.as_tensor(sa, device="cuda", dtype=torch.float32)
    tb = torch.as_tensor(sb, device="cuda", dtype=torch.float32)
    ref = _ref(a, b, ta, tb, alpha)
    tol = 2**-8 if out_dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(d.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("dtype,config", ALL, ids=IDS)
def test_accumulate_into_out(dtype, config):
    m, n, k = 256, 384, 1024
    g = torch.Generator(device="cuda").manual_seed(2)
    lo, hi = (-128, 127) if dtype == I8 else (-7, 7)
    a, b = _codes(m, k, dtype, lo, hi, g), _codes(n, k, dtype, lo, hi, g)
    sa = torch.rand(m, device="cuda", generator=g) + 0.5
    sb = torch.rand(n, device="cuda", generator=g) + 0.5
    out = torch.randn(m, n, device="cuda", generator=g) * 100
    before = out.clone()
    res = cutlass.scaled_gemm(a, b, sa, sb, alpha=0.5, out=out, config=config)
    assert res is out
    ref = before.double() + _ref(a, b, sa, sb, 0.5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-6 * ref.abs().max().item())
    # twice = 2x the product (stream-K / in-place C == D must not double-count)
    cutlass.scaled_gemm(a, b, sa, sb, alpha=0.5, out=out, config=config)
    ref2 = ref + _ref(a, b, sa, sb, 0.5)
    torch.testing.assert_close(out.double(), ref2, rtol=1e-6, atol=1e-6 * ref2.abs().max().item())


@pytest.mark.parametrize("config", _configs(FP8))
@pytest.mark.parametrize("shape", [(512, 2304, 768), (256, 768, 3072), (256, 768, 12608)])
def test_fp8_matches_scaled_mm_and_float64(config, shape):
    m, n, k = shape
    g = torch.Generator(device="cuda").manual_seed(3)
    a = (torch.randn(m, k, device="cuda", generator=g) * 3).to(FP8)
    b = (torch.randn(n, k, device="cuda", generator=g) * 3).to(FP8)
    sa = torch.rand(m, device="cuda", generator=g) + 0.1
    sb = torch.rand(n, device="cuda", generator=g) + 0.1
    d = cutlass.scaled_gemm(a, b, sa, sb, out_dtype=torch.bfloat16, config=config)
    assert d is not None
    ref = _ref(a, b, sa, sb)
    atol = 1e-3 * ref.abs().max().item()
    torch.testing.assert_close(d.double(), ref, rtol=2**-8, atol=atol)
    sm = torch._scaled_mm(
        a, b.t(), scale_a=sa.view(-1, 1), scale_b=sb.view(1, -1), out_dtype=torch.bfloat16
    )
    torch.testing.assert_close(d.float(), sm.float(), rtol=2**-7, atol=atol)
    # fp32 out: the tensor cores add e4m3 products at reduced precision inside a 128-deep
    # k-tile before the fp32 promotion, so this is a tolerance check (integer codes: exact)
    d32 = cutlass.scaled_gemm(a, b, sa, sb, out_dtype=torch.float32, config=config)
    torch.testing.assert_close(d32.double(), ref, rtol=1e-3, atol=atol)


@pytest.mark.parametrize("dtype", [I8, FP8])
@pytest.mark.parametrize("shape", [(17, 32, 32), (32, 40, 32), (32, 32, 24), (0, 32, 32)])
def test_unsupported_shapes_return_none(dtype, shape):
    m, n, k = shape
    a = torch.zeros(m, k, device="cuda", dtype=dtype)
    b = torch.zeros(n, k, device="cuda", dtype=dtype)
    assert cutlass.scaled_gemm(a, b, 1.0, 1.0) is None


def test_unsupported_cases_return_none_on_cuda():
    a = torch.zeros(32, 64, device="cuda", dtype=I8)
    b = torch.zeros(48, 64, device="cuda", dtype=I8)
    assert cutlass.scaled_gemm(a, b.to(FP8), 1.0, 1.0) is None  # mixed dtypes
    assert cutlass.scaled_gemm(a, b, torch.ones(31, device="cuda"), 1.0) is None  # scale len
    assert cutlass.scaled_gemm(a, b, 1.0, 1.0, config=99) is None
    bf16_out = torch.zeros(32, 48, device="cuda", dtype=torch.bfloat16)
    assert cutlass.scaled_gemm(a, b, 1.0, 1.0, out=bf16_out) is None
    big = torch.zeros(64, 128, device="cuda", dtype=I8)
    assert cutlass.scaled_gemm(big[:, 8:72], b, 1.0, 1.0) is None  # strided (not contiguous)


def test_cpp_checks_return_clear_messages():
    """The bindings refuse bad calls with a message built without iostreams (a TORCH_CHECK's
    message, an ostringstream, killed the process on the device machine); the Python wrapper
    checks first and never reaches them."""
    mod = cutlass.EXTENSION.module
    assert mod is not None
    one = torch.ones(1, device="cuda")
    a = torch.zeros(24, 64, device="cuda", dtype=I8)
    b = torch.zeros(32, 64, device="cuda", dtype=I8)
    out = torch.empty(24, 32, device="cuda", dtype=torch.bfloat16)
    assert "multiples of 16" in mod.scaled_gemm(a, b, one, one, 1.0, out, False, 0)
    a = torch.zeros(32, 64, device="cuda", dtype=I8)
    out = torch.empty(32, 32, device="cuda", dtype=torch.bfloat16)
    assert "accumulate needs a float32" in mod.scaled_gemm(a, b, one, one, 1.0, out, True, 0)
    assert "config must be in" in mod.scaled_gemm(a, b, one, one, 1.0, out, False, 7)
    assert "scale_b must hold 1 or 32" in mod.scaled_gemm(
        a, b, one, torch.ones(5, device="cuda"), 1.0, out, False, 0
    )
    assert mod.scaled_gemm(a, b, one, one, 1.0, out, False, 0) == ""  # launched
    torch.cuda.synchronize()
    assert torch.equal(out, torch.zeros_like(out))
    assert len(mod.config_names()) == len(_configs(I8))

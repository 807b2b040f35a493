"""``hotcompile.lowering.ttir_cache``: HOT's kernels' TTIR generated once per signature.

The real ``generate_ttir`` needs a GPU driver; here a stand-in records its calls, which is what
the cache must get right: one call per distinct signature of a HOT kernel, the same result and
the same in-place effect on ``kwargs`` on a hit, and everything else passed through.
"""

from __future__ import annotations

import pytest
import torch
from torch._higher_order_ops import triton_kernel_wrap as tkw
from torch._subclasses.fake_tensor import FakeTensorMode

from hotcompile.lowering import ttir_cache


class _Kernel:  # a JITFunction stand-in: only its identity matters to the cache
    arg_names = ("x", "n", "BLOCK")


@pytest.fixture
def stub(monkeypatch):
    calls = []

    def generate_ttir(kernel, kwargs, tma):
        calls.append(dict(kwargs))
        kwargs.pop("num_warps", None)  # as torch does with backend options
        return object(), ["x", "n"]

    monkeypatch.setattr(tkw, "generate_ttir", generate_ttir)
    ttir_cache.clear()
    return calls


def _fake(shape, dtype=torch.bfloat16):
    with FakeTensorMode():
        return torch.empty(shape, dtype=dtype)


def test_one_generation_per_signature(stub):
    hot, other = _Kernel(), _Kernel()
    assert ttir_cache.install([hot])
    gen = tkw.generate_ttir
    a = gen(hot, {"x": _fake((8, 16)), "n": 16, "BLOCK": 64, "num_warps": 4}, {})
    kw = {"x": _fake((4, 32)), "n": 16, "BLOCK": 64, "num_warps": 4}
    b = gen(hot, kw, {})  # another shape, same dtype and values: the same TTIR
    assert len(stub) == 1 and a[0] is b[0] and b[1] == ["x", "n"]
    assert "num_warps" not in kw  # the hit has the uncached call's effect on kwargs
    gen(hot, {"x": _fake((8, 16), torch.float32), "n": 16, "BLOCK": 64}, {})  # dtype
    gen(hot, {"x": _fake((8, 16)), "n": 17, "BLOCK": 64}, {})  # a value (specialization)
    assert len(stub) == 3
    gen(other, {"x": _fake((8, 16)), "n": 16, "BLOCK": 64}, {})  # not a HOT kernel
    gen(other, {"x": _fake((8, 16)), "n": 16, "BLOCK": 64}, {})
    gen(hot, {"x": torch.empty(8, 16), "n": 16, "BLOCK": 64}, {})  # real tensor: address
    gen(hot, {"x": _fake((8, 16)), "n": 16, "BLOCK": 64}, {"x": ("tma",)})  # TMA metadata
    assert len(stub) == 7
    assert ttir_cache.install([hot]) and tkw.generate_ttir is gen  # idempotent


def test_symbolic_sizes_share_the_entry(stub):
    hot = _Kernel()
    ttir_cache.install([hot])
    import sympy

    tkw.generate_ttir(hot, {"x": _fake((8,)), "n": sympy.Symbol("s0"), "BLOCK": 64}, {})
    tkw.generate_ttir(hot, {"x": _fake((8,)), "n": sympy.Symbol("s1"), "BLOCK": 64}, {})
    assert len(stub) == 1  # torch compiles every symbolic size as 2


def test_off_switch(stub, monkeypatch):
    hot = _Kernel()
    ttir_cache.install([hot])
    monkeypatch.setenv("HOTCOMPILE_TTIR_CACHE", "0")
    for _ in range(2):
        tkw.generate_ttir(hot, {"x": _fake((8,)), "n": 1, "BLOCK": 64}, {})
    assert len(stub) == 2

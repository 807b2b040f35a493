"""The shared JIT-build machinery of the C++/CUDA extensions (hotcompile.kernels.jit), on CPU.

The CUTLASS GEMMs and the CUDA quantize kernel are built by it on a GPU machine; here a toy
C++ extension goes through the same code: build, cache hit in a fresh object, and the
"fail once, fall back" contract. Skipped without a C++ toolchain and ninja.
"""

from __future__ import annotations

import shutil
import warnings

import pytest
from torch.utils import cpp_extension

from hotcompile.kernels import jit

TOY = """
#include <pybind11/pybind11.h>
int answer() { return 42; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }
"""


@pytest.fixture
def toy_env(tmp_path, monkeypatch):
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "toy.cpp").write_text(TOY)
    monkeypatch.setenv("HOTCOMPILE_CSRC", str(src))
    monkeypatch.setenv("HOTCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def _toy(**kw) -> jit.Extension:
    return jit.Extension("hotcompile_test_toy", "a toy extension", ["toy.cpp"], **kw)


@pytest.mark.skipif(
    shutil.which("g++") is None or not cpp_extension.is_ninja_available(),
    reason="needs g++ and ninja",
)
def test_builds_once_then_loads_from_the_cache(toy_env, capsys):
    ext = _toy(with_cuda=False)
    assert ext.available() and ext.module.answer() == 42
    assert "building a toy extension" in capsys.readouterr().err
    (bdir,) = (toy_env / "cache").iterdir()
    assert bdir.name.startswith("hotcompile_test_toy-") and any(bdir.glob("*.so"))
    again = _toy(with_cuda=False)  # a new process would do the same: no rebuild message
    assert again.build() and again.module.answer() == 42
    assert "building" not in capsys.readouterr().err


def test_unavailable_is_warned_once_and_final(toy_env):
    ext = _toy(unavailable=lambda: "no GPU here")
    with pytest.warns(RuntimeWarning, match="a toy extension unavailable .no GPU here."):
        assert ext.available() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second call must not warn (nor retry)
        assert ext.available() is False and ext.build() is False
    assert ext.error == "no GPU here" and ext.module is None


def test_missing_sources_fall_back(toy_env):
    ext = jit.Extension("hotcompile_test_none", "a missing extension", ["absent.cu"])
    with pytest.warns(RuntimeWarning, match="not installed"):
        assert ext.available() is False
    assert jit.csrc_dir(["absent.cu"]) is None and jit.csrc_dir(["toy.cpp"]) is not None


@pytest.mark.skipif(
    shutil.which("g++") is None or not cpp_extension.is_ninja_available(),
    reason="needs g++ and ninja",
)
def test_a_cache_holding_only_the_library_loads_and_a_broken_one_is_rebuilt(
    toy_env, monkeypatch, capsys
):
    """A build directory copied from another machine (only the .so, no ninja files or objects)
    must load as is; a truncated library must be built again, not crash the import."""
    assert _toy(with_cuda=False).build()
    (bdir,) = (toy_env / "cache").iterdir()
    (so,) = bdir.glob("*.so")  # hotcompile_test_toy.so (_v1.so after another test's build)
    for f in bdir.iterdir():
        if f != so:
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    real_load = cpp_extension.load

    def no_compiler(*a, **kw):
        raise AssertionError("load() (ninja, the compiler) ran for a cached library")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    again = _toy(with_cuda=False)
    assert again.build() and again.module.answer() == 42
    capsys.readouterr()

    so.unlink()  # a new file: this process maps the old one
    so.write_bytes(b"\x7fELF truncated")
    monkeypatch.setattr(cpp_extension, "load", real_load)
    rebuilt = _toy(with_cuda=False)
    assert rebuilt.build() and rebuilt.module.answer() == 42
    assert "building a toy extension" not in capsys.readouterr().err  # it was "cached"

"""Shared fixtures and small models for the hotcompile test-suite."""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hotcompile
from hotcompile import numerics


@pytest.fixture(autouse=True)
def _fresh_state():
    torch._dynamo.reset()
    numerics.reset()
    hotcompile.clear_plans()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


class MLPBlock(nn.Module):
    """LN -> Linear -> GELU -> Linear, the transformer MLP."""

    def __init__(self, d: int = 64, hidden: int = 256, bias: bool = True):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, d, bias=bias)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.ln(x))))


class SmallCNN(nn.Module):
    """Conv layers of every kind HOT meets: strided, padded, dilated, 1x1, depthwise, head."""

    def __init__(self, c: int = 8, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, bias=False)
        self.dw = nn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2 * c)
        self.conv3 = nn.Conv2d(2 * c, 2 * c, 3, padding=2, dilation=2)
        self.pw = nn.Conv2d(2 * c, 2 * c, 1)
        self.head = nn.Linear(2 * c, classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.dw(x))
        x = F.relu(self.conv3(x))
        x = F.relu(self.pw(x))
        return self.head(x.mean((2, 3)))


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def run_step(model, x, backend=None, options=None, loss_fn=None, **compile_kw):
    """One forward+backward on a copy of ``model``; returns (output, grads, the copy)."""
    m = copy.deepcopy(model)
    fn = m if backend is None else torch.compile(m, backend=backend, options=options, **compile_kw)
    y = fn(x)
    loss = y.float().pow(2).mean() if loss_fn is None else loss_fn(y)
    loss.backward()
    return y, grads(m), m


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


AOT = {"compiler": "aot_eager"}


ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_tool(script: str, folder: str = "tools") -> types.ModuleType:
    """A script of tools/ (or of ``folder``: ``"experiments"``), not a package, imported from its
    path, once per session; registered in ``sys.modules`` so that its dataclasses and pickling
    work."""
    name = f"hotcompile_{folder}_" + script.removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / script)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def cli_env() -> dict[str, str]:
    """The environment a project command runs in: this interpreter's bin first on PATH (so
    that ``hotcompile`` is the installed entry point of this environment)."""
    env = dict(os.environ)
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@functools.cache
def help_text(program: tuple[str, ...]) -> str:
    """``--help`` of ``("tools/X.py",)`` or ``("hotcompile"[, SUB])``, run once per test session
    (a Python process importing torch, ~4 s on 2 cores) for every test that reads it;
    asserts that it exits 0."""
    if program[0] == "hotcompile":
        argv = [sys.executable, "-m", "hotcompile.cli", *program[1:], "--help"]
    else:
        argv = [sys.executable, program[0], "--help"]
    out = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=cli_env(), check=False
    )
    assert out.returncode == 0, f"{' '.join(program)} --help: {out.stderr[-2000:]}"
    return out.stdout


def skip_module_without_cuda_triton() -> None:
    """Skip the calling test module (at import, before it imports the Triton kernels) unless
    a CUDA GPU and Triton are both there: the GPU kernel test files start with it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU", allow_module_level=True)
    from torch.utils._triton import has_triton

    if not has_triton():
        pytest.skip("needs Triton", allow_module_level=True)


class LoRALinear(nn.Module):
    """A LoRA-style layer: a frozen base linear plus a trainable rank-r update."""

    def __init__(self, i: int, o: int, r: int = 4):
        super().__init__()
        self.base = nn.Linear(i, o)
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(i, r, bias=False)
        self.lora_b = nn.Linear(r, o, bias=False)

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x))

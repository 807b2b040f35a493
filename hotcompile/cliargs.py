"""Command-line arguments shared by ``hotcompile report`` and ``hotcompile diff``.

Both take a model as ``package.module:factory`` plus ``--input SHAPE[:DTYPE]`` and
``--option KEY=VALUE``; parsing them in one place keeps the two tools' conventions identical.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import sys
from typing import Any

import torch
import torch.nn as nn

DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "long": torch.int64,
    "int32": torch.int32,
}


def parse_input_spec(spec: str, device: str | None = None) -> torch.Tensor:
    """``2x3x32x32`` (float32, standard normal) or ``4x128:int64`` (token ids in [0, 100)).

    ``device="meta"`` gives a shape-only tensor (the static report needs no values).
    """
    shape_s, _, dtype_s = spec.partition(":")
    try:
        shape = [int(s) for s in shape_s.lower().split("x") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --input {spec!r}: want e.g. 2x3x32x32") from None
    if not shape or any(s <= 0 for s in shape):
        raise argparse.ArgumentTypeError(f"bad --input {spec!r}: want positive sizes")
    dtype = DTYPES.get(dtype_s or "float32")
    if dtype is None:
        raise argparse.ArgumentTypeError(f"bad dtype in {spec!r}; one of {sorted(DTYPES)}")
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    return torch.randint(0, 100, shape, dtype=dtype)


def parse_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as a Python literal when it is one (``gx_bits=8``)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--option {text!r}: expected KEY=VALUE")
    try:
        return key.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key.strip(), value


def load_factory(target: str) -> tuple[nn.Module, list[Any] | None]:
    """``package.module:factory`` -> (model, example inputs or None).

    The factory returns a module or ``(module, example_inputs)``; the current directory is
    importable, and ``factory`` may be dotted (``mod:Class.build``) or a module instance.
    """
    mod_name, _, attr = target.partition(":")
    if not mod_name or not attr:
        raise SystemExit(f"model {target!r}: expected 'package.module:factory'")
    sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(mod_name)
    finally:
        sys.path.pop(0)
    for part in attr.split("."):
        obj = getattr(obj, part)
    made = obj() if callable(obj) and not isinstance(obj, nn.Module) else obj
    example: list[Any] | None = None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        made, ex = made
        example = [ex] if isinstance(ex, torch.Tensor) else list(ex)
    if not isinstance(made, nn.Module):
        raise SystemExit(f"{target} returned {type(made).__name__}, not an nn.Module")
    return made, example

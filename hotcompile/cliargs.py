"""Command-line arguments shared by ``hotcompile report`` and ``hotcompile diff``.

Both take a model as ``package.module:factory`` or by library name (``--timm NAME``, ``--hf
NAME``), plus ``--input SHAPE[:DTYPE]`` and ``--option KEY=VALUE``; parsing them in one place
keeps the two tools' conventions identical.
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


def add_library_model_args(p: argparse.ArgumentParser) -> None:
    """``--timm``, ``--hf`` and ``--hf-config``: a model by library name, random weights."""
    p.add_argument("--timm", metavar="NAME", help="a timm model name (needs timm)")
    p.add_argument("--hf", metavar="NAME", help="a Hugging Face model type (gpt2, llama, ...: "
                   "its default configuration, no download), a local directory holding a "
                   "config.json, or a hub id; needs transformers")  # fmt: skip
    p.add_argument("--hf-config", action="append", type=parse_config_fields,
                   metavar="KEY=VALUE[,...]", help="set fields of the --hf configuration, "
                   "e.g. num_hidden_layers=2 (repeatable)")  # fmt: skip


def library_model(args: argparse.Namespace) -> nn.Module | None:
    """The model ``--timm`` / ``--hf`` name (built on the current default device), or None
    when neither is given."""
    from hotcompile import compat

    if getattr(args, "timm", None):
        try:
            timm = compat.import_module("timm")
        except ImportError:
            raise SystemExit("--timm needs the timm package (pip install timm)") from None
        return timm.create_model(args.timm, pretrained=False)
    if getattr(args, "hf", None):
        try:
            transformers = compat.import_module("transformers")
        except ImportError:
            raise SystemExit("--hf needs transformers (pip install transformers)") from None
        cfg = hf_config(transformers, args.hf, args.hf_config or [])
        return transformers.AutoModel.from_config(cfg)
    return None


def hf_config(transformers: Any, name: str, overrides: list[dict[str, Any]]) -> Any:
    """The configuration of ``--hf NAME``: a model type's default configuration
    (``AutoConfig.for_model``, no download: ``gpt2`` is GPT-2 small), else a local directory or
    a hub id (``from_pretrained``) — without the KV cache (a training step), then
    ``overrides`` (``--hf-config``) set fields, e.g. a model's size. A name that cannot be
    loaded exits with what to pass instead."""
    if name in transformers.CONFIG_MAPPING:
        cfg = transformers.AutoConfig.for_model(name)
    else:
        try:
            cfg = transformers.AutoConfig.from_pretrained(name)
        except (OSError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SystemExit(
                f"--hf {name}: no configuration could be loaded ({first}). Without a network, "
                "pass a local directory holding its config.json, or a model type (e.g. "
                "gpt2, llama, bert, mistral) with --hf-config KEY=VALUE for its size"
            ) from None
    if hasattr(cfg, "use_cache"):  # a training step: no KV cache (its empty tensors are real)
        cfg.use_cache = False
    derived = _derived_fields(cfg)
    given: set[str] = set()
    for fields in overrides:
        for key, value in fields.items():
            if not hasattr(cfg, key):
                raise SystemExit(f"--hf-config: {type(cfg).__name__} has no field {key!r}")
            setattr(cfg, key, value)
            given.add(key)
    # fields the config derived from others at construction follow them, as they would have
    # if the sizes had been passed to the config class (``num_attention_heads=16`` on Llama's
    # default config otherwise leaves 32 KV heads, and SDPA fails on the mismatch)
    for key, (sources, derive) in derived.items():
        if key not in given and given & sources:
            setattr(cfg, key, derive(cfg))
    return cfg


def _derived_fields(cfg: Any) -> dict[str, tuple[set[str], Any]]:
    """The config's fields that hold what its class derives from other fields by default
    (``num_key_value_heads`` = ``num_attention_heads``, ``head_dim`` = hidden / heads), with
    their sources and how to derive them again."""
    out: dict[str, tuple[set[str], Any]] = {}
    heads = getattr(cfg, "num_attention_heads", None)
    hidden = getattr(cfg, "hidden_size", None)
    if heads and getattr(cfg, "num_key_value_heads", None) == heads:
        out["num_key_value_heads"] = ({"num_attention_heads"}, lambda c: c.num_attention_heads)
    if heads and hidden and getattr(cfg, "head_dim", None) == hidden // heads:
        out["head_dim"] = (
            {"hidden_size", "num_attention_heads"},
            lambda c: c.hidden_size // c.num_attention_heads,
        )
    return out


def parse_config_fields(text: str) -> dict[str, Any]:
    """``KEY=VALUE[,KEY=VALUE...]`` with Python literals (``n_layer=2,use_cache=False``); a
    value that is not one stays a string (``attn_implementation=sdpa``)."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part or not part.partition("=")[0].strip():
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {part!r}")
        key, value = parse_option(part)
        out[key] = value
    return out

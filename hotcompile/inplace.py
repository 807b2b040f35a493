"""HOT for training loops that own the model object: compile the module in place.

``torch.compile(model, backend="hot")`` returns an ``OptimizedModule`` wrapper. A plain loop
does not care, but the training frameworks do: Hugging Face ``Trainer`` reads
``model.forward``'s signature to decide which batch columns to keep, and the wrapper's is
``(*args, **kwargs)``, so every column is dropped ("The batch received was empty"); its
``state_dict`` keys gain an ``_orig_mod.`` prefix; ``isinstance`` checks on the model class
fail. And the frameworks' own compile switches cannot name ``"hot"``: accelerate (which
``TrainingArguments(torch_compile_backend=...)`` goes through) validates the backend against
its fixed ``DynamoBackend`` enum.

:func:`compile_model` sidesteps both: it calls :meth:`torch.nn.Module.compile`, which keeps the
user's module (class, signature, parameter names, ``save_pretrained``) and routes every call of
it through the HOT-compiled graph. The framework is then told not to compile
(``TrainingArguments(torch_compile=False)``, the default; accelerate's ``dynamo_backend="no"``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, TypeVar

import torch

from hotcompile.backend import HotBackend
from hotcompile.config import HotConfig

M = TypeVar("M", bound=torch.nn.Module)

#: accelerate's environment switch for its own ``torch.compile`` (``accelerate launch``'s
#: config sets it): when it names a backend, ``Accelerator.prepare`` compiles the model again.
ACCELERATE_DYNAMO_ENV = "ACCELERATE_DYNAMO_BACKEND"


def accelerate_compile_backend() -> str | None:
    """The backend accelerate's environment asks it to compile with, or None when it would not
    compile (unset or ``"no"``)."""
    value = os.environ.get(ACCELERATE_DYNAMO_ENV, "no").strip().lower()
    return None if value in ("", "no") else value


def compile_model(
    model: M,
    config: HotConfig | None = None,
    *,
    dynamic: bool | None = None,
    fullgraph: bool = False,
    **options: Any,
) -> M:
    """Compile ``model`` in place with the HOT backend and return it (the same object).

    ``config`` and ``options`` are those of ``torch.compile(model, backend="hot",
    options=...)`` (:class:`HotConfig` fields; ``options`` override ``config``'s); they are
    validated here, so a typo fails at this call with the list of valid options instead of
    inside Dynamo at the first training step. ``dynamic`` and ``fullgraph`` are
    ``torch.compile``'s.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or is already a ``torch.compile``
            wrapper (pass the module it wraps: the wrapper is what frameworks cannot inspect).
        ValueError: ``model``'s ``forward`` is torch's own (``nn.Sequential``, a bare
            ``nn.Linear``): torch 2.13 does not trace such a module when it is compiled in
            place, so HOT would silently never run. Use ``torch.compile(model, backend="hot")``
            or wrap it in a module of your own.
        hotcompile.HotConfigError: an unknown or invalid option.
    """
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise TypeError(
            "compile_model() got a torch.compile wrapper (OptimizedModule); pass the module it "
            "wraps (`model._orig_mod`): the wrapper's forward(*args, **kwargs) hides the "
            "model's signature, which Hugging Face Trainer needs to keep the batch's columns"
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"compile_model() needs a torch.nn.Module, got {type(model).__name__}")
    forward_module = getattr(type(model).forward, "__module__", "") or ""
    if forward_module == "torch" or forward_module.startswith("torch."):
        raise ValueError(
            f"{type(model).__name__}.forward is torch's own ({forward_module}): torch does not "
            "trace such a module compiled in place, so HOT would never run. Use "
            "torch.compile(model, backend='hot') in a plain loop, or wrap the module in an "
            "nn.Module subclass with its own forward"
        )
    backend = HotBackend(config, **options)
    if (other := accelerate_compile_backend()) is not None:
        warnings.warn(
            f"{ACCELERATE_DYNAMO_ENV}={other!r}: accelerate will compile this model again with "
            f"its own backend; set it to 'no' (accelerate config / TrainingArguments("
            "torch_compile=False)) so HOT is the only compiler",
            stacklevel=2,
        )
    model.compile(backend=backend, dynamic=dynamic, fullgraph=fullgraph)
    return model

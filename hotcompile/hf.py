"""HOT with the Hugging Face ``Trainer`` (and Trainer subclasses such as TRL's).

``TrainingArguments(torch_compile_backend="hot")`` cannot work without patching accelerate:
the Trainer hands the name to accelerate's ``TorchDynamoPlugin``, which only accepts members of
its fixed ``DynamoBackend`` enum (``ValueError: 'HOT' is not a valid DynamoBackend``), and
hotcompile does not rewrite another library's enum behind the user's back. Passing
``torch.compile(model, backend="hot")`` to the Trainer fails too (the wrapper hides the
forward signature the Trainer filters batch columns by; see :mod:`hotcompile.inplace`).

The supported route keeps ``TrainingArguments``' compile switch off and adds a callback::

    trainer = Trainer(model=model, args=TrainingArguments(...), callbacks=[HotCallback()])

:class:`HotCallback` compiles the Trainer's model in place (:func:`compile_model`) when the
Trainer is built and again at ``train()`` if ``model_init`` replaced the model, and refuses
the configurations that would silently lose HOT or compile twice. Calling
``compile_model(model)`` before building the Trainer is equivalent when neither check nor
``model_init`` matters.

Importing this module imports transformers.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers import TrainerCallback

from hotcompile.config import HotConfig
from hotcompile.inplace import ACCELERATE_DYNAMO_ENV, accelerate_compile_backend, compile_model

__all__ = ["HotCallback", "compile_model"]


class HotCallback(TrainerCallback):
    """A ``TrainerCallback`` that trains the Trainer's model with HOT's backward.

    ``config`` / ``options``: as :func:`compile_model` (validated here, when the callback is
    built). The model is compiled in place at ``on_init_end`` (so ``trainer.model`` is the
    compiled model right after ``Trainer(...)``) and at ``on_train_begin`` for a model that
    ``model_init`` created since; a model this callback compiled already is left alone.
    """

    def __init__(self, config: HotConfig | None = None, **options: Any) -> None:
        self.config = HotConfig.from_options({"config": config, **options})
        self._compiled: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    def _check_args(self, args: Any) -> None:
        if getattr(args, "torch_compile", False):
            raise ValueError(
                "HotCallback compiles the model itself; TrainingArguments(torch_compile=True, "
                f"torch_compile_backend={args.torch_compile_backend!r}) would have accelerate "
                "wrap it in a second torch.compile. Leave torch_compile, torch_compile_backend "
                "and torch_compile_mode unset (HOT's mode: HotCallback(mode=...))"
            )
        if (other := accelerate_compile_backend()) is not None:
            raise ValueError(
                f"{ACCELERATE_DYNAMO_ENV}={other!r} (accelerate's config) makes the Trainer "
                "compile the model again with that backend; set it to 'no' when using "
                "HotCallback"
            )

    def _compile(self, model: torch.nn.Module | None) -> None:
        if model is None or model in self._compiled:
            return
        compile_model(model, self.config)
        self._compiled.add(model)

    def on_init_end(self, args, state, control, model=None, **kwargs):  # noqa: D102
        self._check_args(args)
        self._compile(model)
        return control

    def on_train_begin(self, args, state, control, model=None, **kwargs):  # noqa: D102
        self._compile(model)
        return control

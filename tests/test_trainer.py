"""HOT behind the training frameworks' front doors (issue 35): Hugging Face ``Trainer`` with
:class:`hotcompile.hf.HotCallback`, and :func:`hotcompile.compile_model` under PyTorch
Lightning. A tiny random Llama trains on bytes of a stdlib source file; HOT's loss curve must
follow the same Trainer's with plain ``torch_compile_backend="aot_eager"``.
"""

from __future__ import annotations

import inspect
import math
import pathlib

import pytest
import torch

import hotcompile
from hotcompile.compat import torchvision_without_ops

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")
torchvision_without_ops()  # transformers' Trainer imports torchvision (compat.py says why)

from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from hotcompile.hf import HotCallback  # noqa: E402

SEQ, BATCH, STEPS = 64, 8, 30
LIGHTNING_STEPS = 20  # Lightning: eager baseline and HOT, fewer steps to stay near 30 s
#: fast on 2 CPU cores: no code generation, the same saved tensors as inductor
HOT_OPTIONS = {"compiler": "aot_eager"}


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
        max_position_embeddings=SEQ,
    )
    return LlamaForCausalLM(cfg)


class _Bytes(torch.utils.data.Dataset):
    """Non-overlapping SEQ-byte windows of a stdlib source: deterministic, no download. Each
    item carries an extra ``source`` column the model does not take, which the Trainer must
    drop by the model's forward signature (what a torch.compile wrapper hides)."""

    def __init__(self) -> None:
        data = pathlib.Path(inspect.getfile(inspect)).read_bytes()[: SEQ * BATCH * STEPS]
        self.ids = torch.tensor(list(data), dtype=torch.long).view(-1, SEQ)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i], "source": "inspect.py"}


class _Losses(TrainerCallback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def _args(tmp_path: pathlib.Path, **kw) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=BATCH,
        max_steps=STEPS,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        data_seed=0,
        disable_tqdm=True,
        **kw,
    )


def _train(tmp_path, callbacks=(), **kw) -> tuple[list[float], Trainer]:
    losses = _Losses()
    trainer = Trainer(
        model=_model(),
        args=_args(tmp_path, **kw),
        train_dataset=_Bytes(),
        callbacks=[*callbacks, losses],
    )
    trainer.train()
    assert len(losses.losses) == STEPS
    return losses.losses, trainer


def _tail(xs: list[float]) -> float:
    return sum(xs[-5:]) / 5


@pytest.mark.slow
def test_trainer_hot_follows_aot_eager(tmp_path):
    base, _ = _train(tmp_path / "base", torch_compile_backend="aot_eager")
    assert hotcompile.plans() == []  # the baseline compiled without HOT

    hot, trainer = _train(tmp_path / "hot", callbacks=[HotCallback(**HOT_OPTIONS)])
    # HOT really ran: the Trainer's own model (not a wrapper) was compiled, every Linear of
    # the Llama is a HOT layer (2 blocks x 7 + lm_head), with the text recipe's layers
    assert type(trainer.model) is LlamaForCausalLM
    rewritten = {p.name for p in hotcompile.plans() if p.path != "skipped"}
    assert len(rewritten) >= 15, sorted(rewritten)
    assert any("lm_head" in n for n in rewritten), sorted(rewritten)

    for curve in (base, hot):
        assert all(math.isfinite(v) for v in curve), curve
        assert _tail(curve) < 0.8 * curve[0], curve  # learning: ln(256) = 5.55 at the start
    assert abs(hot[0] - base[0]) < 1e-3 * base[0]  # same model, same first batch
    assert hot != base  # HOT's backward is not autograd's
    assert abs(_tail(hot) - _tail(base)) < 0.05 * _tail(base), (_tail(hot), _tail(base))


def test_callback_keeps_the_models_signature_and_compiles_once(tmp_path):
    cb = HotCallback(**HOT_OPTIONS)
    trainer = Trainer(model=_model(), args=_args(tmp_path), callbacks=[cb])
    model = trainer.model
    assert type(model) is LlamaForCausalLM and model._compiled_call_impl is not None
    assert "input_ids" in inspect.signature(model.forward).parameters
    impl = model._compiled_call_impl
    cb.on_train_begin(trainer.args, trainer.state, trainer.control, model=model)
    assert model._compiled_call_impl is impl  # not recompiled


def test_callback_refuses_a_second_compiler(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="second torch.compile"):
        Trainer(model=_model(), args=_args(tmp_path, torch_compile=True), callbacks=[HotCallback()])
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    with pytest.raises(ValueError, match="ACCELERATE_DYNAMO_BACKEND='inductor'"):
        Trainer(model=_model(), args=_args(tmp_path), callbacks=[HotCallback()])


def test_hot_backend_name_is_rejected_by_accelerate(tmp_path):
    """Why HotCallback exists: the Trainer's own switch cannot name "hot" (accelerate's enum).
    If accelerate ever accepts it, this test fails and the docs should say so."""
    with pytest.raises(ValueError, match="DynamoBackend"):
        Trainer(model=_model(), args=_args(tmp_path, torch_compile_backend="hot"))


def test_bad_input_fails_early():
    with pytest.raises(hotcompile.HotConfigError, match="did you mean 'compiler'"):
        HotCallback(compilr="aot_eager")
    with pytest.raises(hotcompile.HotConfigError):
        hotcompile.compile_model(_model(), gx_bits=3)
    with pytest.raises(TypeError, match="OptimizedModule"):
        hotcompile.compile_model(torch.compile(_model(), backend="hot"))
    with pytest.raises(TypeError, match="nn.Module"):
        hotcompile.compile_model(lambda x: x)
    with pytest.raises(ValueError, match="torch's own"):
        hotcompile.compile_model(torch.nn.Sequential(torch.nn.Linear(4, 4)))


@pytest.mark.slow
def test_lightning_trains_a_compile_model_module(tmp_path):
    """PyTorch Lightning calls ``training_step``, not the module: HOT goes on the network the
    step calls, compiled in place, and its curve follows plain eager's."""
    lightning = pytest.importorskip("lightning")

    class Lit(lightning.LightningModule):
        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net, self.losses = net, []

        def training_step(self, batch, _index):
            loss = self.net(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    def fit(net: torch.nn.Module) -> list[float]:
        lit = Lit(net)
        loader = torch.utils.data.DataLoader(
            [{k: v for k, v in row.items() if k != "source"} for row in _Bytes()],
            batch_size=BATCH,
        )
        lightning.Trainer(
            max_steps=LIGHTNING_STEPS,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
        ).fit(lit, loader)
        return lit.losses

    base = fit(_model())
    hot = fit(hotcompile.compile_model(_model(), **HOT_OPTIONS))
    assert len({p.name for p in hotcompile.plans() if p.path != "skipped"}) >= 15
    assert len(hot) == len(base) == LIGHTNING_STEPS and hot != base
    assert _tail(hot) < 0.8 * hot[0] and _tail(base) < 0.8 * base[0], (hot, base)
    assert abs(_tail(hot) - _tail(base)) < 0.05 * _tail(base), (_tail(hot), _tail(base))

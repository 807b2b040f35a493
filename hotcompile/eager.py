"""Frames Dynamo runs eagerly under ``torch.compile``, and the layers that lose HOT there.

A layer reaches the backend only if the frame that calls it is compiled. Dynamo (torch 2.13)
skips a *whole* frame when a graph break happens inside a loop; under FSDP2, calling a
``fully_shard`` module is such a break (its hooks are ``torch._dynamo.disable``d), so a root
forward ``for blk in self.blocks: x = blk(x)`` runs eagerly, and the layers it calls itself (a
ViT's patch embedding and head) keep autograd's exact backward without any other sign. This
module finds such frames at compile time (they are on the call stack while Dynamo compiles a
block they call), records them (:func:`eager_frames`) and warns once per frame, naming the
layers and the fix (call the blocks through one module, as timm's ``nn.Sequential`` does).
Best effort: it reads Dynamo's private compilation metrics; if they move, nothing is found
and nothing fails (``experiments/fsdp2_image_blocks.py`` shows the patterns).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any

import torch

log = logging.getLogger("hotcompile")


@dataclasses.dataclass(frozen=True)
class EagerFrame:
    """A frame that Dynamo ran eagerly although it was under ``torch.compile``, found on the
    call stack of a graph the backend compiled, with the layers it runs itself.

    Why it matters: Dynamo (torch 2.13) cannot resume after a graph break inside a loop
    ("graph break in loop"): it skips the *whole* frame. Under FSDP2 calling a ``fully_shard``
    module is such a break (its hooks are ``torch._dynamo.disable``d), so a forward that loops
    over sharded blocks (``for blk in self.blocks: x = blk(x)``) runs eagerly. The blocks it
    calls are frames of their own, which Dynamo compiles and the backend sees; the torch layers
    the skipped frame calls itself (a ViT's patch embedding and head) never reach the backend
    and keep autograd's exact backward, with nothing else saying so.

    ``function``: ``Class.name`` of the frame; ``location``: ``file:line`` of its definition;
    ``reason``: Dynamo's reason in one line (its first line, where the break is, and whether
    it was in a loop);
    ``layers``: the ``nn.Linear``/``nn.Conv2d`` modules that frame runs itself, as paths
    relative to its ``self`` (empty: nothing of HOT's is lost, e.g. HF's ``LlamaModel``, whose
    embedding, norm and decoder layers are modules of their own)."""

    function: str
    location: str
    reason: str
    layers: tuple[str, ...]


#: the eager frames found so far, by code location: each is recorded and warned about once
EAGER_FRAMES: dict[tuple[str, int, str], EagerFrame] = {}


def eager_frames() -> list[EagerFrame]:
    """The frames :class:`EagerFrame` describes, found while compiling since the last
    :func:`clear_plans`."""
    return list(EAGER_FRAMES.values())


def _skipped_codes() -> dict[tuple[str, int, str], str]:
    """``(file, first line, name) -> reason`` of the frames Dynamo's latest attempt could not
    compile at all (``fail_type`` set; a frame split by graph breaks is compiled, not failed).

    Dynamo's compilation metrics are the one record of a skipped frame that survives it;
    ``torch._dynamo.reset()`` keeps them, so only the latest attempt per code counts (a frame
    that failed in one model and compiled later is not flagged). An API that moved: no
    detection, never an error."""
    try:
        from torch._dynamo.utils import get_compilation_metrics

        metrics = get_compilation_metrics()
    except Exception:  # noqa: BLE001 - a private API: detection is best effort
        return {}
    latest: dict[tuple[str, int, str], str | None] = {}
    for m in metrics:
        key = (getattr(m, "co_filename", None), getattr(m, "co_firstlineno", None))
        name = getattr(m, "co_name", None)
        if key[0] is None or key[1] is None or name is None:
            continue
        fail = getattr(m, "fail_type", None)
        latest[(key[0], key[1], name)] = _reason(m) if fail else None
    return {k: v for k, v in latest.items() if v}


def _reason(metrics: Any) -> str:
    """Dynamo's reason for failing a frame in one line: the first line of its message, where
    the break is, and whether it was in a loop (the usual cause of a whole frame run eagerly)."""
    full = str(getattr(metrics, "fail_reason", None) or getattr(metrics, "fail_type", ""))
    lines = full.strip().splitlines()
    reason = lines[0] if lines else "unsupported"
    where = getattr(metrics, "fail_user_frame_filename", None)
    if where:
        reason += f" at {where}:{getattr(metrics, 'fail_user_frame_lineno', '?')}"
    if "graph break in loop" in full:
        reason += ", inside a loop: Dynamo skips the whole frame"
    return reason


def _runs_in_torch(module: torch.nn.Module) -> bool:
    """``module``'s forward is torch's own code (``nn.Linear``, ``nn.Sequential``, also under
    ``fully_shard``, whose class is made in torch's files): Dynamo does not compile such a frame
    when an eager frame calls it, unlike a module class defined elsewhere (a model's block)."""
    cls = type(module)
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        FSDPModule = None  # noqa: N806
    if FSDPModule is not None and isinstance(module, FSDPModule):
        cls = next((c for c in cls.__mro__[1:] if not issubclass(c, FSDPModule)), cls)
    return cls.__module__.startswith("torch.")


def own_layers(module: torch.nn.Module) -> tuple[str, ...]:
    """The linear/conv2d layers that ``module``'s own forward frame runs when Dynamo skips it:
    its submodules of torch's classes (through torch's containers and torch modules such as
    ``nn.MultiheadAttention``); a submodule of a class defined elsewhere runs in a frame of its
    own, which Dynamo still compiles. Paths relative to ``module``. A matmul the frame writes
    with a parameter of its own (``x @ self.w``) is not listed."""
    out: list[str] = []

    def visit(m: torch.nn.Module, prefix: str) -> None:
        for name, child in m.named_children():
            if not _runs_in_torch(child):
                continue
            if isinstance(child, (torch.nn.Linear, torch.nn.Conv2d)):
                out.append(prefix + name)
            else:
                visit(child, f"{prefix}{name}.")

    visit(module, "")
    return tuple(out)


def note_eager_callers() -> None:
    """Record (and warn about, once each) the eager frames on the current call stack that
    Dynamo skipped, with the layers they run themselves (:class:`EagerFrame`).

    Called at compile time, because that is when the skipped frame can be seen: it is on the
    stack while Dynamo compiles a frame it calls (a block of a FSDP2 model whose forward loops
    over its blocks). A skipped frame that calls nothing Dynamo compiles is never seen."""
    skipped = _skipped_codes()
    if not skipped:
        return
    frame = sys._getframe(1)  # the backend's __call__, then its callers
    while frame is not None:
        code = frame.f_code
        key = (code.co_filename, code.co_firstlineno, code.co_name)
        if key in skipped and key not in EAGER_FRAMES:
            owner = frame.f_locals.get("self")
            layers = own_layers(owner) if isinstance(owner, torch.nn.Module) else ()
            cls = type(owner).__name__ + "." if isinstance(owner, torch.nn.Module) else ""
            rec = EagerFrame(
                f"{cls}{code.co_name}",
                f"{code.co_filename}:{code.co_firstlineno}",
                skipped[key],
                layers,
            )
            EAGER_FRAMES[key] = rec
            if layers:
                log.warning(
                    "hotcompile: torch.compile runs %s (%s) eagerly: Dynamo could not compile "
                    "it (%s). Its own layers %s get autograd's exact backward, not HOT's; the "
                    "modules it calls are compiled. Under FSDP2, calling a fully_shard module "
                    "inside a loop is such a break: call the blocks through one module "
                    "(self.blocks = nn.Sequential(...); x = self.blocks(x), as timm does), so "
                    "that the loop runs in a frame without layers of its own",
                    rec.function,
                    rec.location,
                    rec.reason,
                    ", ".join(layers),
                )
        frame = frame.f_back

"""The ``hot`` torch.compile backend.

``torch.compile(model, backend="hot", options={...})`` reaches :func:`hot_backend` through the
``torch_dynamo_backends`` entry point (no import of hotcompile needed). The backend rewrites
the Dynamo graph (``hotcompile.passes.rewrite``) and hands it to the inner compiler:

- ``inductor``: ``compile_fx`` with a :class:`HotCachePass` in ``post_grad_custom_post_pass``,
  whose ``uuid`` hashes hotcompile's sources and the config, so inductor's caches never serve a
  backward compiled from other code or options;
- ``aot_eager``: AOTAutograd with inductor's decompositions and the min-cut partitioner, but no
  code generation: the same saved-tensor decisions as inductor, compiled in a fraction of the
  time (CPU tests);
- ``eager``: the rewritten graph as is (autograd Functions run eagerly).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import importlib
import logging
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hotcompile import eager, lqs
from hotcompile.config import HotConfig
from hotcompile.lqs import QUANTIZERS, Plan, PlanEntry
from hotcompile.passes import (
    LayerPlan,
    pin_kernel_layouts,
    realize_kernel_inputs,
    rewrite,
    tag_recompute,
)
from hotcompile.plantable import PlanTable

log = logging.getLogger("hotcompile")

_SOURCE_ROOTS = (pathlib.Path(__file__).parent,)


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """Hash of every Python source of hotcompile and its passes (the cache-key ingredient)."""
    import hotcompile.passes as passes_pkg

    h = hashlib.sha256()
    roots = [*_SOURCE_ROOTS, pathlib.Path(passes_pkg.__file__).parent]
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


try:  # torch >= 2.6
    from torch._inductor.custom_graph_pass import CustomGraphPass as _CustomGraphPass
except ImportError:  # pragma: no cover
    _CustomGraphPass = object  # type: ignore[assignment,misc]


class HotCachePass(_CustomGraphPass):  # type: ignore[misc]
    """The post-grad pass: keys inductor's caches on hotcompile and, in the post-grad graph
    only (the subclass for the joint graph skips it), pins the layouts of the buffers HOT's
    kernels touch so that comprehensive padding cannot give them stale views, and has
    inductor write once a tensor several of HOT's kernels read (``hotcompile.passes.layout``).

    It wraps a pass the user already configured, if any (torch 2.11 takes one object per hook).
    """

    pin_layouts = True

    def __init__(self, config: HotConfig, inner: Any = None) -> None:
        self.config = config
        self.inner = inner

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.pin_layouts:
            pin_kernel_layouts(graph)
            realize_kernel_inputs(graph)
        if self.inner is not None:
            self.inner(graph)

    def uuid(self) -> str:
        inner = self.inner.uuid() if hasattr(self.inner, "uuid") else repr(self.inner)
        key = f"{type(self).__name__}|{source_hash()}|{self.config.cache_key()}|{inner}"
        return hashlib.sha256(key.encode()).hexdigest()


class HotJointPass(HotCachePass):
    """The joint-graph pass (before partitioning): ABC's compression is recomputed in the
    backward where the backward reads x anyway, and the weight's late codes start from a cast
    recomputed in the backward (``hotcompile.passes.abc_recompute.tag_recompute``), then the
    user's own joint pass, if any, runs."""

    pin_layouts = False

    def __call__(self, graph: torch.fx.Graph) -> None:
        tag_recompute(graph, self.config.abc_recompute_modes)
        super().__call__(graph)


def _tagging(partition_fn: Callable, abc_recompute: str | tuple[str, str]) -> Callable:
    """``partition_fn`` after :func:`tag_recompute` on the joint graph (what inductor's
    joint pass does in the inductor pipeline)."""

    def partition(joint_module: torch.fx.GraphModule, *args: Any, **kwargs: Any):
        tag_recompute(joint_module.graph, abc_recompute)
        return partition_fn(joint_module, *args, **kwargs)

    return partition


@functools.lru_cache(maxsize=1)
def _decompositions() -> dict:
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def _boxed_nop(gm: torch.fx.GraphModule, _inputs: Sequence[Any]) -> Callable:
    from functorch.compile import make_boxed_func

    return make_boxed_func(gm.forward)


def aot_decomp_partition(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    partition_fn: Callable | None = None,
    inference_compiler: Callable | None = None,
    abc_recompute: str | tuple[str, str] = "unary",
) -> Callable:
    """AOTAutograd with inductor's decompositions and min-cut partitioner, no code generation.

    The one pipeline behind ``compiler="aot_eager"``, the graph-diff tool and the static
    report: the same forward/backward split and saved tensors as inductor. ``partition_fn``
    (default: min-cut) may wrap min-cut to record what it decides; ``inference_compiler`` sees
    the graph compiled when no gradient is needed; ``abc_recompute``: as
    ``HotConfig.abc_recompute_modes`` (the joint graph is tagged before ``partition_fn`` sees
    it).
    """
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    # inductor's max_pool decomposition reads ``torch._inductor.lowering`` without importing
    # it (torch 2.13): without this, any model with max-pooling fails to trace here.
    importlib.import_module("torch._inductor.lowering")
    kwargs: dict[str, Any] = {}
    if inference_compiler is not None:
        kwargs["inference_compiler"] = inference_compiler
    return aot_autograd(
        fw_compiler=_boxed_nop,
        bw_compiler=_boxed_nop,
        decompositions=_decompositions(),
        partition_fn=_tagging(partition_fn or min_cut_rematerialization_partition, abc_recompute),
        keep_inference_input_mutations=True,
        **kwargs,
    )(gm, list(example_inputs))


def _inductor(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    config: HotConfig,
    rewritten: bool = True,
):
    """Inductor with HOT's passes. ``rewritten=False`` (no layer of this graph takes HOT: all
    gated, excluded or unsupported): plain inductor with only the user's ``mode`` and
    ``inductor_config``, so that such a graph compiles exactly as ``torch.compile`` would.

    Otherwise inductor's own settings too, comprehensive padding included: the post-grad pass
    pins the buffers HOT's kernels and ops touch (``hotcompile.passes.layout`` says why; until
    it existed the backend turned padding off, which cost GPT-2's unaligned logits ~1 ms a
    step on the H100)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    patches: dict[str, Any] = {}
    if config.mode not in (None, "default"):
        from torch._inductor import list_mode_options

        patches.update(list_mode_options(config.mode))
    patches.update(config.inductor_config)
    if not rewritten:
        return compile_fx(gm, example_inputs, config_patches=patches)
    user_pass = patches.pop("post_grad_custom_post_pass", None)
    if user_pass is None:
        user_pass = inductor_config.post_grad_custom_post_pass
    patches["post_grad_custom_post_pass"] = HotCachePass(config, user_pass)
    joint_pass = patches.pop("joint_custom_post_pass", None)
    if joint_pass is None:
        joint_pass = inductor_config.joint_custom_post_pass
    patches["joint_custom_post_pass"] = HotJointPass(config, joint_pass)
    return compile_fx(gm, example_inputs, config_patches=patches)


@dataclasses.dataclass
class CompileRecord:
    """One graph the backend compiled: its config and the per-layer plan. ``inference``: the
    graph was compiled without gradients (no backward; nothing rewritten)."""

    graph_index: int
    config: HotConfig
    layers: list[LayerPlan]
    num_inputs: int
    inference: bool = False


#: the most recent graphs compiled by any hot backend in this process (see ``plans()``).
RECORDS: collections.deque[CompileRecord] = collections.deque(maxlen=256)
_counter = {"graphs": 0}
#: whether a training graph of this process took HOT in some layer, and the reasons the
#: "HOT changes nothing" warning has given (both reset by :func:`clear_plans`)
_effect: dict[str, Any] = {"took_hot": False, "warned": set()}


def needs_backward(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd will trace a backward for this graph, by its own rule
    (``aot_module_simplified``: grad mode on and some input, parameters included, needing a
    gradient). Under ``torch.no_grad()`` / ``inference_mode`` Dynamo calls the backend with
    grad mode off (a change of grad mode is a guard: a training call recompiles)."""
    if not torch.is_grad_enabled():
        return False
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        return True
    return any(p.requires_grad for p in gm.parameters())


def _why_no_hot(layers: Sequence[LayerPlan]) -> str:
    """Why no layer of a training graph took HOT, in a few words (the warning's reason)."""
    if not layers:
        return "it has no linear or conv2d layer (nor a matmul with a weight)"
    reasons = [p.reason for p in layers]

    def share(text: str) -> int:
        return sum(text in r for r in reasons)

    causes = [
        ("excluded by pattern", "excluded by `exclude`"),
        ("not matched by any include", "not matched by `include`"),
        ("min_weight_numel", "below `min_weight_numel`"),
        ("no gradient needed", "frozen with inputs that need no grad"),
        ("speed:", "no faster than bf16 by the speed gate (prefer='speed')"),
    ]
    parts = [f"{n} {what}" for key, what in causes if (n := share(key))]
    rest = len(layers) - sum(share(key) for key, _ in causes)
    if rest:
        parts.append(f"{rest} unsupported (see the reason column of hotcompile.plans())")
    return f"all {len(layers)} linear/conv layers are skipped: " + ", ".join(parts)


def _warn_no_hot(record: CompileRecord) -> None:
    """Warn that a training compile changed nothing — its graph has no layer taking HOT's
    backward and no graph of this process took one before it — once per reason, as Python's
    default warning filter does once per message.

    Why this scope: a model recompiles (a new batch size, the last smaller batch, eval) and
    must not repeat the warning; a second model skipped for another reason must still get its
    own. Once a graph took HOT, a graph without HOT layers is a piece of a working model (the
    loss after a graph break, a DDP bucket holding only the gated head) rather than a sign of
    a wrong setting, and stays at INFO. :func:`clear_plans` re-arms it."""
    why = _why_no_hot(record.layers)
    if _effect["took_hot"] or why in _effect["warned"]:
        return
    _effect["warned"].add(why)
    log.warning(
        "hotcompile: graph %d runs no HOT backward: %s. Training it is plain torch.compile; "
        "print(hotcompile.plans()) shows each layer's reason. (Said once per reason until a "
        "graph takes HOT; TORCH_LOGS=+hotcompile logs every graph.)",
        record.graph_index,
        why,
    )


class HotBackend:
    """A ``torch.compile`` backend with a fixed :class:`HotConfig`.

    ``torch.compile(model, backend=HotBackend(cfg))`` is the object form of
    ``backend="hot", options=cfg.to_options()``; ``.records`` lists what it compiled.
    """

    def __init__(self, config: HotConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            config = HotConfig.from_options({"config": config, **options})
        self.config = config if config is not None else HotConfig.from_options(options)
        self.records: list[CompileRecord] = []
        #: set by :func:`calibrate` only: measure HLA's g_w error per layer (needs x in full
        #: and the eager compiler, which ``calibrate`` configures).
        self.probe_hla = False

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        # every compile sets the family (also "auto"): the choice is process-wide, and a
        # preference left behind by an earlier model's compile must not leak into this one
        from hotcompile.kernels import dispatch

        dispatch.set_preference(self.config.kernels)
        try:
            eager.note_eager_callers()
        except Exception:  # noqa: BLE001 - a diagnostic must never fail a compile
            log.debug("hotcompile: looking for eager callers failed", exc_info=True)
        inference = not needs_backward(gm, example_inputs)
        layers = rewrite(
            gm, self.config, example_inputs, probe_hla=self.probe_hla, inference=inference
        )
        _counter["graphs"] += 1
        index = _counter["graphs"]
        layers = [dataclasses.replace(p, graph=index) for p in layers]
        record = CompileRecord(index, self.config, layers, len(example_inputs), inference)
        self.records.append(record)
        RECORDS.append(record)
        n_hot = sum(p.rewritten for p in layers)
        if inference:
            log.info(
                "hotcompile: graph %d: inference compile (no gradient needed): no backward to "
                "rewrite, the forward runs as plain torch.compile; %d of %d linear/conv layers "
                "are eligible for HOT in training; compiler=%s",
                index,
                sum(p.path == "inference" for p in layers),
                len(layers),
                self.config.compiler,
            )
        else:
            log.info(
                "hotcompile: graph %d: %d of %d linear/conv layers rewritten; compiler=%s",
                index,
                n_hot,
                len(layers),
                self.config.compiler,
            )
            if n_hot:
                _effect["took_hot"] = True
            else:
                _warn_no_hot(record)
        if self.config.compiler == "eager":
            return gm.forward
        if self.config.compiler == "aot_eager":
            return aot_decomp_partition(
                gm, example_inputs, abc_recompute=self.config.abc_recompute_modes
            )
        return _inductor(gm, example_inputs, self.config, rewritten=n_hot > 0)

    @property
    def layers(self) -> PlanTable:
        """Every layer plan of every graph this backend compiled (a list that prints as the
        plan table, as :func:`plans` does)."""
        return PlanTable(p for r in self.records for p in r.layers)

    def lqs_plan(self) -> Plan:
        """The decisions of this backend's layers as a plan: the g_x quantizer (LQS-measured or
        given) and the HLA choice (measured by :func:`calibrate`, or given by the plan)."""
        entries, seen = [], set()
        hla_threshold = None
        for p in self.layers:
            q = p.quantizer if p.quantizer in QUANTIZERS else None
            hla = p.hla_choice
            if p.name in seen or (q is None and hla is None):
                continue
            seen.add(p.name)
            errs = p.lqs_errors or (None, None)
            entry = PlanEntry(p.name, q, errs[0], errs[1], p.quantizer_rule if q else "")
            if hla is not None:
                entry = dataclasses.replace(entry, hla=hla[0], e_hla=hla[1], hla_rule=hla[2])
                hla_threshold = self._hla_threshold(p)
            entries.append(entry)
        return Plan(
            tuple(entries), self.config.lqs_metric, self.config.lqs_threshold, hla_threshold
        )

    def _hla_threshold(self, layer: LayerPlan) -> float | None:
        """The threshold behind a layer's HLA choice: measured here, or recorded in the plan."""
        st = lqs.get(layer.spec.lqs_key) if layer.spec is not None else None
        if st is not None and st.hla is not None:
            return st.hla_threshold
        return self.config.plan.hla_threshold if self.config.plan is not None else None


def hot_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: dict[str, Any] | HotConfig | None = None,
    mode: str | None = None,
):
    """The registered ``hot`` backend.

    ``torch.compile`` passes its ``options`` dict (:class:`HotConfig` fields, or
    ``{"config": HotConfig(...)}``) or its ``mode`` (the inductor mode, e.g.
    ``"max-autotune"``; equivalent to ``options={"mode": ...}``). Unknown or invalid options
    raise :class:`HotConfigError` listing the valid ones.
    """
    config = HotConfig.from_options(options)
    if mode is not None:
        config = HotConfig.from_options({"config": config, "mode": mode})
    return HotBackend(config)(gm, example_inputs)


def calibrate(
    model: torch.nn.Module,
    example_batch: Any,
    loss_fn: Callable[[Any], torch.Tensor],
    config: HotConfig | dict[str, Any] | None = None,
) -> Plan:
    """LQS and the HLA choice ahead of training, on one forward/backward of ``example_batch``
    with the exact g_x and x kept in full, measuring per layer on the real gradients of
    ``loss_fn(model(batch))``:

    - both g_x quantizers' errors (LQS: per-token iff ``e_token < lqs_threshold·e_tensor``);
    - HLA's relative g_w error ``e_hla`` (keep HLA iff ``e_hla <= hla_threshold``; not
      measured with ``hla=False`` or ``hla_threshold=None``, nor on layers without HLA).

    Returns the :class:`Plan`; pass it as ``options={"plan": plan}`` (or save it with
    ``plan.save(path)``) and training starts with the decisions, no calibration step. The HLA
    choice needs the plan: it changes what the forward saves, so it is fixed at compile time.
    ``example_batch`` is one input or a tuple of positional inputs. The model's ``.grad``
    fields are left as they were.
    """
    base = HotConfig.from_options(config)
    cfg = dataclasses.replace(
        base,
        gx_scaling="lqs",
        plan=None,
        warmup_steps=0,
        compiler="eager",
        lqs_calibration_steps=1,
        abc=False,
    )
    backend = HotBackend(cfg)
    backend.probe_hla = base.hla and base.hla_threshold is not None
    args = example_batch if isinstance(example_batch, tuple) else (example_batch,)
    saved_grads = {p: p.grad for p in model.parameters()}
    try:
        for p in saved_grads:
            p.grad = None
        compiled = torch.compile(model, backend=backend)
        loss_fn(compiled(*args)).backward()
    finally:
        for p, g in saved_grads.items():
            p.grad = g
    plan = backend.lqs_plan()
    log.info(
        "hotcompile: calibration chose %s",
        {e.layer: (e.quantizer, e.hla) for e in plan.entries},
    )
    return plan


def plans() -> PlanTable:
    """Layer plans of the graphs compiled recently in this process, oldest first.

    A list of :class:`LayerPlan` (a :class:`~hotcompile.plantable.PlanTable`) that prints as a
    table — layer, op, weight, path, g_x, g_w, recipe, speed-up, reason — with a legend of the
    paths: ``print(hotcompile.plans())``. Every row but a ``hot`` one says why."""
    return PlanTable(p for r in RECORDS for p in r.layers)


def clear_plans() -> None:
    """Forget the recorded plans and eager frames (``torch._dynamo.reset()`` does not), and
    re-arm the once-per-process warning about a training compile that rewrote nothing."""
    RECORDS.clear()
    eager.EAGER_FRAMES.clear()
    _effect.update(took_hot=False, warned=set())

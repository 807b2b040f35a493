"""Text or image: the token marks of one model, carried across the graphs it is split into.

``hla_signs="auto"`` (and every other per-layer text/image decision) rests on
:func:`token_sequence_nodes`: the nodes computed from an embedding
lookup of integer graph inputs are text. A graph only sees its own nodes, and a model is often
compiled as several graphs:

- **DDPOptimizer pieces.** A DDP model under ``torch.compile`` (either order: ``DDP(compiled)``
  or ``compile(DDP(model))``) is split by dynamo's DDPOptimizer at the gradient-bucket
  boundaries, and the backend is called once per piece, in graph order. The pieces of one frame
  share the original graph's ``meta`` dict (the same object: DDPOptimizer's
  ``propagate_metadata``) and its compile id. A piece's placeholder for a value an earlier
  piece computes keeps the original node's name (``hidden_states_2``), but inside the earlier
  piece that value's node is renamed (``mul_4``), so names do not link the two; both nodes
  carry the *same* example-value object (``split_module`` copies ``node.meta`` shallowly).
  The marks are carried by that identity, exactly: a piece's layer is text iff it is in the
  unsplit graph.
- **Separate frames** (graph breaks, FSDP2 — whose hooks are ``torch._dynamo.disable``d, so
  every ``fully_shard`` module is its own frame, and a frame that calls them in a loop runs
  eagerly as a whole (``hotcompile.eager_frames``), embedding included — or blocks
  compiled one by one). A later graph's float inputs are real tensors at compile time, with
  their autograd history: a graph input is text when that history contains an embedding lookup
  of token ids (an eager ``EmbeddingBackward0`` whose saved indices are not position ids — rows
  of consecutive integers) or reaches the weight of an embedding that an earlier compiled graph
  looked up with token ids (a *token table*, registered when that graph was rewritten).
- **Explicit override.** :func:`assume` (``with assume("text"): model(x)`` around the first,
  compiling call) decides for every graph compiled inside it; the config's ``hla_signs=True``
  still forces the signs alone.

What cannot be carried is logged on the ``hotcompile`` logger, and :func:`records` lists the
decision of every graph with its evidence: a graph whose inputs have no readable history (fake
inputs only, no Dynamo source to read the real one from) is treated as an image graph unless
carried from earlier pieces or assumed. The decision is made at compile time: a graph reused
from dynamo's cache by another model keeps it.

The unsplit graph is untouched: its user inputs are leaves (no history) and its ``meta`` is its
own, so its marks are :func:`token_sequence_nodes`'s, as before.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from hotcompile.passes.matmul import (
    Scope,
    arg,
    parameter_nodes,
    source_name,
    value,
    weight_root,
)

#: embedding lookups: (target, position of the indices argument)
EMBEDDING_TARGETS = {F.embedding: 0, torch.embedding: 1}


def _module_state(node: fx.Node) -> bool:
    """A placeholder that Dynamo lifted from a module's buffers or parameters (its source reads
    ``..._buffers[...]`` / ``..._parameters[...]``): e.g. a ``position_ids`` buffer, which is
    the model's own index tensor, not the user's tokens. Unknown sources count as inputs."""
    name = source_name(node)
    return name is not None and ("._buffers[" in name or "._parameters[" in name)


def _from_discrete_input(node: fx.Node, scope: Scope | None = None) -> bool:
    """``node`` is computed from an integer graph input (token ids), not only from values built
    inside the graph (``arange`` positions), from module buffers (``position_ids``) or from
    parameters. In a HOP body (``scope``) a placeholder stands for the outer value passed."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        outer = scope.outer_node(n) if scope is not None else n
        if outer is not n:
            stack.append(outer)
            continue
        if n.op == "placeholder" and not _module_state(n):
            v = value(n)
            if isinstance(v, torch.Tensor) and not (
                v.is_floating_point() or v.is_complex() or v.dtype == torch.bool
            ):
                return True
        stack.extend(n.all_input_nodes)
    return False


def token_sequence_nodes(
    gm: fx.GraphModule,
    scope: Scope | None = None,
    outer: set | None = None,
    seeds: set | None = None,
) -> set[fx.Node]:
    """The nodes computed from a token embedding: an embedding lookup whose indices come from
    an integer input of the graph, and everything downstream of it.

    Why: HLA's fixed low-pass assumes that neighbouring tokens along L are alike (4x4 image
    patches). Tokens looked up one by one from an embedding table (text) are not, and the
    low-pass then drops a large part of g_w *systematically* (byte LM: +17% loss; 32 M-param LM
    on an H100: +87%). ``hla_signs="auto"`` gives exactly these layers HLA's random signs, which
    make the estimate unbiased. One pass in graph order suffices (FX graphs are topologically
    sorted). A graph sees only its own embedding; :mod:`hotcompile.passes.family` seeds the
    inputs of a graph split off it. In a HOP body
    (``scope``), placeholders fed by ``outer`` (the outer graph's token nodes) are token nodes;
    ``seeds``: nodes known to be token nodes from elsewhere (``hotcompile.passes.family``:
    the inputs a split graph continues a text model with).
    """
    marked: set[fx.Node] = set(seeds or ())
    for n in gm.graph.nodes:
        if n in marked:
            continue
        if n.op == "placeholder" and scope is not None and outer:
            if scope.inputs.get(n) in outer:
                marked.add(n)
            continue
        if n.op == "call_function" and n.target in EMBEDDING_TARGETS:
            indices = arg(
                n, EMBEDDING_TARGETS[n.target], "input" if n.target is F.embedding else "indices"
            )
            if isinstance(indices, fx.Node) and _from_discrete_input(indices, scope):
                marked.add(n)
                continue
        if any(i in marked for i in n.all_input_nodes):
            marked.add(n)
    return marked


log = logging.getLogger("hotcompile")

FAMILIES = ("text", "image")
#: at most this many autograd nodes are visited per graph input (a deep eager prefix is cheap,
#: an unbounded walk is not)
HISTORY_LIMIT = 200_000


@dataclasses.dataclass(frozen=True)
class FamilyRecord:
    """The text/image decision for one graph the rewrite saw.

    ``source``: ``"embedding"`` (the graph looks up token ids itself), ``"pieces"`` (carried
    from earlier DDPOptimizer pieces of the same frame), ``"history"`` (a graph input's
    autograd history holds a token lookup), ``"assumed"`` (:func:`assume`), ``"none"`` (no
    evidence: image). ``inputs``: the placeholders seeded as text by carrying (names);
    ``detail``: the evidence in words; ``piece``: 0-based index of the graph among the graphs
    of its frame (DDPOptimizer pieces share a frame)."""

    compile_id: str | None
    family: str
    source: str
    inputs: tuple[str, ...] = ()
    detail: str = ""
    piece: int = 0


@dataclasses.dataclass
class _Frame:
    """The marks of the pieces of one frame so far: ``id(example value) -> example value`` of
    every marked node (held, so that the ids stay unique; ``meta`` likewise)."""

    meta: dict
    compile_id: str | None
    marked: dict[int, Any] = dataclasses.field(default_factory=dict)
    pieces: int = 0
    #: ``id(example value) -> (value, reader layers)`` of the inputs weight calls read in the
    #: pieces so far (:func:`cut_readers`)
    read: dict[int, tuple[Any, list[str]]] = dataclasses.field(default_factory=dict)
    warned: bool = False


#: the recent decisions, oldest first (:func:`records`)
RECORDS: collections.deque[FamilyRecord] = collections.deque(maxlen=256)
#: frames whose pieces may follow, keyed by ``id(gm.meta)`` (bounded: a frame's pieces are
#: compiled back to back)
_FRAMES: collections.OrderedDict[int, _Frame] = collections.OrderedDict()
_MAX_FRAMES = 64
#: embedding weights looked up with token ids by a compiled graph: id -> weak reference
_TOKEN_TABLES: dict[int, weakref.ref] = {}
_ASSUMED: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "hotcompile_family", default=None
)


def records() -> list[FamilyRecord]:
    """The text/image decisions of the graphs rewritten recently in this process."""
    return list(RECORDS)


def clear() -> None:
    """Forget the recorded decisions, frames and token tables (tests; ``torch._dynamo.reset()``
    does not)."""
    RECORDS.clear()
    _FRAMES.clear()
    _TOKEN_TABLES.clear()


@contextlib.contextmanager
def assume(family: str | None) -> Iterator[None]:
    """Decide the family of every graph compiled inside the block: ``"text"`` (every layer fed
    by a user input is a text layer), ``"image"`` (none is), ``None`` (detect, the default).

    Why: the automatic carrying needs either the DDPOptimizer pieces' shared values or a real
    autograd history; a model that hides both (a graph compiled ahead from fake inputs, a
    custom wrapper that detaches its activations) can still say what it is. Compilation runs
    at the first call, so wrap that call (``with assume("text"): loss = model(x)``)."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES} or None, not {family!r}")
    token = _ASSUMED.set(family)
    try:
        yield
    finally:
        _ASSUMED.reset(token)


def _compile_id() -> str | None:
    cid = torch._guards.CompileContext.current_compile_id()
    return str(cid) if cid is not None else None


def _real(node: fx.Node, example: Any) -> Any:
    """The real object behind a placeholder: the example input when it is real, else Dynamo's
    own example (DDPOptimizer hands its pieces fake inputs but keeps the ``grapharg``)."""
    fake = torch._subclasses.fake_tensor.FakeTensor
    if isinstance(example, torch.Tensor) and not isinstance(example, fake):
        return example
    grapharg = node.meta.get("grapharg")
    try:
        obj = getattr(grapharg, "example", None)
    except Exception:  # noqa: BLE001 - a dead weak reference: nothing to read
        return None
    return obj if isinstance(obj, torch.Tensor) and not isinstance(obj, fake) else None


def _placeholders(gm: fx.GraphModule, example_inputs: Sequence[Any] | None) -> list:
    """``(node, real object or None)`` for each placeholder."""
    nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ex = list(example_inputs) if example_inputs is not None else []
    if len(ex) != len(nodes):
        ex = [None] * len(nodes)
    return [(n, _real(n, e)) for n, e in zip(nodes, ex)]


def is_position_ids(indices: torch.Tensor) -> bool:
    """Rows of consecutive integers (``arange`` positions, HF's ``position_ids``), not token ids.

    Why: an eager embedding lookup of positions (GPT-2's ``wpe``, CLIP's position embedding)
    leaves the same autograd node as one of token ids; in one graph the rewrite tells them
    apart by where the indices come from, in the history only their values are left."""
    if indices.dim() == 0 or indices.shape[-1] < 2 or indices.numel() == 0:
        return False
    return bool((indices.diff(dim=-1) == 1).all())


def _is_token_table(t: Any) -> bool:
    ref = _TOKEN_TABLES.get(id(t))
    return ref is not None and ref() is t


def history_evidence(t: torch.Tensor, limit: int = HISTORY_LIMIT) -> str:
    """Why ``t`` (a real tensor, an input of a graph) is computed from token ids, or ``""``:
    its autograd history holds an eager embedding lookup of indices that are not positions, or
    reaches a token table (an embedding weight an earlier compiled graph looked up with token
    ids: inside a compiled graph the lookup itself is not an autograd node)."""
    fn = getattr(t, "grad_fn", None)
    stack, seen = [fn], set()
    while stack and len(seen) < limit:
        f = stack.pop()
        if f is None or id(f) in seen:
            continue
        seen.add(id(f))
        if type(f).__name__.startswith("EmbeddingBackward"):
            try:
                idx = getattr(f, "_saved_indices", None)
            except RuntimeError:  # freed by an earlier backward: nothing to read
                idx = None
            if isinstance(idx, torch.Tensor) and not is_position_ids(idx):
                return f"eager embedding lookup of token ids {tuple(idx.shape)}"
        var = getattr(f, "variable", None)  # AccumulateGrad: a leaf (parameter)
        if var is not None and _is_token_table(var):
            return f"computed from token table {tuple(var.shape)} of an earlier graph"
        stack.extend(g for g, _ in getattr(f, "next_functions", ()))
    return ""


def _register_tables(gm: fx.GraphModule, own: set[fx.Node], objects: dict) -> None:
    """Remember the weights of the embedding lookups ``own`` starts from (token tables)."""
    params = parameter_nodes(gm, None) | set(objects)
    for n in own:
        if n.op != "call_function" or n.target not in EMBEDDING_TARGETS:
            continue
        pos = 1 if n.target is torch.nn.functional.embedding else 0
        root = weight_root(arg(n, pos, "weight"), params)
        obj = objects.get(root)
        if isinstance(obj, torch.Tensor):
            _TOKEN_TABLES[id(obj)] = weakref.ref(obj)
    for key in [k for k, r in _TOKEN_TABLES.items() if r() is None]:
        del _TOKEN_TABLES[key]


def _frame(gm: fx.GraphModule, compile_id: str | None) -> _Frame:
    """The frame ``gm`` is a piece of: the same ``meta`` object and compile id (DDPOptimizer)."""
    key = id(gm.meta)
    frame = _FRAMES.get(key)
    if frame is None or frame.meta is not gm.meta or frame.compile_id != compile_id:
        frame = _Frame(gm.meta, compile_id)
        _FRAMES[key] = frame
        while len(_FRAMES) > _MAX_FRAMES:
            _FRAMES.popitem(last=False)
    _FRAMES.move_to_end(key)
    return frame


def token_nodes(gm: fx.GraphModule, example_inputs: Sequence[Any] | None = None) -> set[fx.Node]:
    """The token (text) nodes of ``gm``: :func:`token_sequence_nodes` of the graph itself, plus
    what the graph continues of a text model (carried from earlier DDPOptimizer pieces,
    or read off its inputs' autograd history), or everything / nothing under :func:`assume`.

    Records the graph's marks for the pieces that follow and its decision (:func:`records`)."""
    compile_id = _compile_id()
    frame = _frame(gm, compile_id)
    phs = _placeholders(gm, example_inputs)
    user = [(n, obj) for n, obj in phs if not _module_state(n)]
    assumed = _ASSUMED.get()
    own = token_sequence_nodes(gm)
    seeds: dict[fx.Node, str] = {}
    if assumed is None:
        for n, obj in user:
            v = value(n)
            if v is not None and frame.marked.get(id(v)) is v:
                seeds[n] = "pieces"
            elif isinstance(obj, torch.Tensor) and obj.is_floating_point():
                why = history_evidence(obj)
                if why:
                    seeds[n] = why
    elif assumed == "text":
        seeds = {n: "assumed" for n, _ in user}
    if assumed == "image":
        marks: set[fx.Node] = set()
    else:  # the graph's own lookups and everything computed from them or from the seeds
        marks = token_sequence_nodes(gm, seeds=set(seeds)) if seeds else own
    _register_tables(gm, own, {n: obj for n, obj in phs if obj is not None})
    frame.marked.update({id(v): v for v in map(value, marks) if v is not None})
    if assumed is not None:
        source, detail = "assumed", f"hotcompile.passes.family.assume({assumed!r})"
    elif own:
        source, detail = "embedding", "token embedding lookup in this graph"
    elif seeds:
        carried = all(v == "pieces" for v in seeds.values())
        source = "pieces" if carried else "history"
        detail = (
            "continues the text marks of earlier DDPOptimizer pieces of this frame"
            if carried
            else "; ".join(sorted({v for v in seeds.values() if v != "pieces"}))
        )
    else:
        source, detail = "none", "no token embedding in this graph or upstream of its inputs"
    family = assumed or ("text" if marks else "image")
    record = FamilyRecord(
        compile_id, family, source, tuple(n.name for n in seeds), detail, frame.pieces
    )
    frame.pieces += 1
    RECORDS.append(record)
    if source in ("pieces", "history"):
        log.info(
            "hotcompile: graph %s (piece %d) continues a text model: %s (inputs %s)",
            compile_id,
            record.piece,
            detail,
            ", ".join(record.inputs),
        )
    elif source == "none" and (record.piece > 0 or any(obj is None for _, obj in user)):
        log.info(
            "hotcompile: graph %s (piece %d): no token embedding found in it or upstream of "
            "its inputs (%s), so its layers are image layers; for a language model whose "
            "activations cannot be traced back, compile under "
            "hotcompile.passes.family.assume('text') or pass hla_signs=True",
            compile_id,
            record.piece,
            "a DDPOptimizer piece" if record.piece > 0 else "some inputs have no real value",
        )
    return marks


def cut_readers(gm: fx.GraphModule, readers: dict[fx.Node, list[str]]) -> list[tuple[str, ...]]:
    """Groups of layers that read one input but sit in different DDPOptimizer pieces.

    HOT quantizes an input that several layers read once and the speed gate charges each
    reader its share; a piece boundary between them (DDP's gradient buckets: with the default
    25 MB, a Llama block's q/k and v land apart, and gate and up) makes each piece quantize
    that input for its own readers, and charges them alone. ``readers``: this piece's inputs
    of weight calls -> the layers reading them. Returns each cut group (earlier pieces'
    readers, then this piece's) and warns once per frame with the remedy; records this
    piece's readers for the pieces that follow."""
    frame = _frame(gm, _compile_id())
    cut = []
    for node, names in readers.items():
        v = value(node)
        if v is None:
            continue
        earlier = frame.read.get(id(v))
        if earlier is not None and earlier[0] is v:
            cut.append((*earlier[1], *names))
            earlier[1].extend(names)
        else:
            frame.read[id(v)] = (v, list(names))
    if cut and not frame.warned:
        frame.warned = True
        log.warning(
            "hotcompile: DDP's graph pieces cut apart layers that read one input (%s): each "
            "piece quantizes that input for its own layers and the speed gate charges them "
            "alone. DDP(model, bucket_cap_mb=...) of at least one block's gradients keeps a "
            "block in one piece",
            "; ".join(" + ".join(g) for g in cut[:3]) + (" ..." if len(cut) > 3 else ""),
        )
    return cut

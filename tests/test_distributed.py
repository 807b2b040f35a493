"""``backend="hot"`` under DDP (both orders) and FSDP2, with and without activation checkpointing:
2 processes on the CPU (gloo).

Each case runs in 2 worker processes (this file run as a script, one per rank). A worker
compares its distributed gradients with single-process HOT runs of the same model:

- ``halves``: HOT on each rank's half of the global batch in one process, averaged — what DDP
  and FSDP2 must compute exactly (HOT quantizes per rank's batch: HLA's per-token signs and the
  g_w scales see the local batch), so the tolerance is float round-off, and a wrong gradient
  (no 1/world average, an exact-path layer, low-pass instead of signs) fails it;
- ``global``: HOT on the global batch in one process: equal up to HOT's quantization, i.e.
  about as far from it as HOT is from the exact gradient (reported, loosely bounded);
- the per-layer plan: the same layers rewritten with the same treatment (``spec.hla_signs``:
  text layers take HLA's random signs) as in one process. DDP's buckets are forced small so
  that DDPOptimizer splits the graph, and the test asserts it did: a later piece cannot see the
  embedding, and only ``hotcompile.passes.family`` tells it that it is a text layer.

Deterministic numerics (``rounding="nearest"``, ``gx_scaling="per_token"``: no LQS state that
a first step would calibrate) make the comparisons exact up to round-off. FSDP2 uses fp32
parameters by default here; the ``bf16`` case runs ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)`` on the CPU (slow) and compares loosely.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

HERE = pathlib.Path(__file__).resolve()
WORLD = 2
OPTIONS = {"compiler": "aot_eager", "rounding": "nearest", "gx_scaling": "per_token"}
#: DDP bucket capacity (bytes): small enough that the tiny models split into several pieces
BUCKET_BYTES = 40_000


# ----------------------------------------------------------------------------- models (worker)


def build(kind: str, ckpt: bool):
    """The tiny text (HF Llama) or image (conv patch embedding + 2 ViT blocks) model.

    ``image``: timm's layout, the blocks in an ``nn.Sequential`` called once (``x =
    self.blocks(x)``); ``imageloop``: a ``ModuleList`` the root's forward loops over. The same
    parameters either way; under FSDP2 they compile differently (:data:`SLOW`'s comment)."""
    import torch

    torch.manual_seed(0)
    if kind == "text":
        from hotcompile.compat import import_module

        tf = import_module("transformers")
        cfg = tf.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=128, max_position_embeddings=64, use_cache=False,
            attn_implementation="sdpa",
        )  # fmt: skip
        model = tf.LlamaForCausalLM(cfg)
        if ckpt:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        return model
    return TinyViT(ckpt, loop=kind == "imageloop")


def blocks_of(model) -> list:
    """The modules FSDP2 shards one by one (the transformer blocks)."""
    return list(model.model.layers) if hasattr(model, "model") else list(model.blocks)


def _vit_classes():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.utils.checkpoint as cp

    class Block(nn.Module):
        def __init__(self, ckpt: bool, d: int = 64, heads: int = 4) -> None:
            super().__init__()
            self.heads, self.ckpt = heads, ckpt
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # checkpointing inside the block, as HF's layers do: FSDP2's hooks stay outside it
            # (checkpoint(fsdp_block, x) from the parent: dynamo then compiled no graph at all)
            if self.ckpt:
                return cp.checkpoint(self.body, x, use_reentrant=False)
            return self.body(x)

        def body(self, x: torch.Tensor) -> torch.Tensor:
            b, n, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, -1).unbind(2)
            a = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            )
            x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class ViT(nn.Module):
        def __init__(self, ckpt: bool, loop: bool) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, 64, 4, stride=4)
            self.pos = nn.Parameter(torch.randn(1, 16, 64) * 0.02)
            blocks = [Block(ckpt) for _ in range(2)]
            self.blocks = nn.ModuleList(blocks) if loop else nn.Sequential(*blocks)
            self.norm, self.head = nn.LayerNorm(64), nn.Linear(64, 16)
            self.loop = loop

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
            if self.loop:  # under FSDP2 Dynamo skips this whole frame (a break in a loop)
                for blk in self.blocks:
                    x = blk(x)
            else:  # timm: the loop runs in nn.Sequential's frame, which has no layers
                x = self.blocks(x)
            return self.head(self.norm(x).mean(1))

    return ViT


def TinyViT(ckpt: bool, loop: bool = False):  # noqa: N802 - a class factory (torch imported late)
    return _vit_classes()(ckpt, loop)


def batch(kind: str, n: int):
    """The fixed global batch: (inputs, targets)."""
    import torch

    g = torch.Generator().manual_seed(1)
    if kind == "text":
        ids = torch.randint(128, (n, 33), generator=g)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(16, (n,), generator=g)


def loss_of(out, target):
    import torch.nn.functional as F

    logits = out if not hasattr(out, "logits") else out.logits
    return F.cross_entropy(logits.float().flatten(0, -2), target.flatten())


# ----------------------------------------------------------------------------- worker


def _short(name: str) -> str:
    """A layer's name without the block index and wrappers (FSDP2 compiles one graph that
    every block runs, named relative to the block)."""
    parts = [p for p in name.split(".") if not p.isdigit()]
    for pre in ("model", "layers", "blocks"):
        while parts and parts[0] == pre:
            parts = parts[1:]
    return ".".join(parts)


def _plan(plans) -> list[list]:
    return sorted(
        {
            (_short(p.name), p.path, bool(p.spec.hla_signs) if p.spec else None, p.forward)
            for p in plans
        }
    )


def _grads(model, names) -> dict[str, Any]:
    out = {}
    for n, p in model.named_parameters():
        n = n.replace("_orig_mod.", "").replace("module.", "")
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[n] = None if g is None else g.detach().float().clone()
    return {n: out[n] for n in names}


def _rel(a: dict, b: dict) -> float:
    import torch

    num = sum(((a[n] - b[n]).double() ** 2).sum() for n in b)
    den = sum((b[n].double() ** 2).sum() for n in b)
    return float(torch.sqrt(num / den))


#: a worker's single-process references, by (model, checkpointing, options, blocks only)
_REFERENCES: dict[tuple, tuple] = {}


def run_case(case: str, rank: int, world: int) -> dict[str, Any]:
    """One case on this rank: ``kind-wrapper[-ckpt][-bf16][-fp8]`` (``fp8``: the FP8
    forward, ``forward="fp8"``)."""
    import torch
    import torch.distributed as dist

    import hotcompile
    from hotcompile.passes import family

    kind, wrapper, *flags = case.split("-")
    ckpt, bf16 = "ckpt" in flags, "bf16" in flags
    options = {**OPTIONS, "forward": "fp8"} if "fp8" in flags else OPTIONS
    # the root frame that loops over FSDP2 blocks runs eagerly: its patch embedding and head
    # keep autograd's backward, so the references compile the blocks alone, as FSDP2 does
    blocks_only = kind == "imageloop" and wrapper == "fsdp2"
    compile_kw: dict[str, Any] = dict(backend="hot", options=options, dynamic=False)
    base = build(kind, ckpt)
    names = [n for n, _ in base.named_parameters()]
    x, y = batch(kind, 2 * world)
    per = x.shape[0] // world
    local = (x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per])

    def fresh() -> None:
        torch._dynamo.reset()
        hotcompile.clear_plans()
        family.clear()

    def single(xb, yb, backend: bool, model=None, whole: bool = not blocks_only):
        m = model or copy.deepcopy(base)
        fn = m
        if backend and whole:
            fn = torch.compile(m, **compile_kw)
        elif backend:
            for blk in blocks_of(m):
                blk.compile(**compile_kw)
        loss_of(fn(xb), yb).backward()
        return m

    # single-process references (every rank computes them: deterministic), once per model,
    # checkpointing and options: the wrappers' cases of one model compare with the same ones
    key = (kind, ckpt, json.dumps(options, sort_keys=True), blocks_only)
    if key not in _REFERENCES:
        fresh()
        m = copy.deepcopy(base)
        halves = {n: torch.zeros_like(p) for n, p in base.named_parameters()}
        for r in range(world):
            m.zero_grad(set_to_none=True)
            single(x[r * per : (r + 1) * per], y[r * per : (r + 1) * per], True, m)
            for n, g in _grads(m, names).items():
                halves[n] += g / world
        fresh()
        ref = _grads(single(x, y, True), names)
        ref_plan = _plan(hotcompile.plans())
        exact = _grads(single(x, y, False), names)
        full_plan = ref_plan
        if blocks_only:  # what one process compiles of the whole model
            fresh()
            single(x, y, True, whole=True)
            full_plan = _plan(hotcompile.plans())
        _REFERENCES[key] = halves, ref, ref_plan, exact, full_plan
    halves, ref, ref_plan, exact, full_plan = _REFERENCES[key]

    # distributed
    fresh()
    model = copy.deepcopy(base)
    if wrapper in ("ddp", "ddpc"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        # DDPOptimizer's first bucket must not exceed the others': the tiny model then splits
        torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = BUCKET_BYTES
        cap = BUCKET_BYTES / 2**20
        if wrapper == "ddpc":  # compile(DDP(model))
            run = torch.compile(DDP(model, bucket_cap_mb=cap), **compile_kw)
        else:  # DDP(compile(model))
            run = DDP(torch.compile(model, **compile_kw), bucket_cap_mb=cap)
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32
        )
        for blk in blocks_of(model):
            fully_shard(blk, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        run = torch.compile(model, **compile_kw)  # the README's pattern, either layout
    loss_of(run(local[0]), local[1]).backward()
    got = _grads(model, names)
    plan = _plan(hotcompile.plans())
    flat = torch.cat([got[n].flatten() for n in names])
    every = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    return {
        "case": case,
        "rank": rank,
        "ranks_identical": all(torch.equal(every[0], e) for e in every),
        "rel_halves": _rel(got, halves),
        "rel_global": _rel(got, ref),
        "rel_hot_exact": _rel(ref, exact),
        "rel_dist_exact": _rel(got, exact),
        "rel_halves_x2": _rel({n: 2 * g for n, g in got.items()}, halves),
        "plan": plan,
        "ref_plan": ref_plan,
        "full_plan": full_plan,
        "eager": [[f.function, list(f.layers)] for f in hotcompile.eager_frames()],
        "families": [dataclass_dict(r) for r in family.records()],
        "finite": bool(torch.isfinite(flat).all()),
    }


def dataclass_dict(r) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(r)


def gate_case(rank: int) -> dict[str, Any]:
    """The speed gate's verdicts under torch.distributed (``gate.agree``): each rank brings its
    own timing of one shape (rank 1's says bf16, rank 0's HOT); a shape only rank 1 asks about
    gets no verdict from rank 0 and must neither hang nor fail."""
    from hotcompile.lowering import gate

    shape = gate.Shape(L=4096, O=2048, I=2048, N=2, S=2048)
    mine = gate.Speed(bf16_us=100.0, hot_us=90.0 if rank == 0 else 99.0, source="measured")
    took = gate.agree(shape, mine)
    import time

    import torch.distributed as dist

    alone, next_wait = mine, 0.0
    if rank:
        alone = gate.agree(gate.Shape(L=8, O=8, I=8, N=1, S=8), mine, timeout_s=1)
        t0 = time.monotonic()  # the graph's next layer: a short wait, not AGREE_TIMEOUT_S
        gate.agree(gate.Shape(L=8, O=16, I=8, N=1, S=8), mine)
        next_wait = time.monotonic() - t0
    dist.barrier()  # rank 0 (which hosts the store) stays until rank 1 is done waiting
    return {
        "case": "gate", "rank": rank, "hot": took.hot, "hot_us": took.hot_us,
        "source": took.source, "alone_hot_us": alone.hot_us, "next_wait_s": next_wait,
    }  # fmt: skip


def worker_main(cases: list[str], out: str) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    try:
        for case in cases:
            t0 = time.perf_counter()
            try:
                results.append(gate_case(rank) if case == "gate" else run_case(case, rank, world))
                results[-1]["seconds"] = time.perf_counter() - t0
            except Exception:  # that case's test fails with it; the later ones are not run
                import traceback

                results.append({"case": case, "rank": rank, "error": traceback.format_exc()})
                break
    finally:
        dist.destroy_process_group()
        pathlib.Path(out).joinpath(f"rank{rank}.json").write_text(json.dumps(results))


# ----------------------------------------------------------------------------- tests (parent)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cases: list[str], tmp: pathlib.Path, timeout: float = 600) -> list[dict]:
    """Run ``cases`` in ``WORLD`` worker processes; rank 0's results (rank 1's are checked to
    agree on the gradient through ``ranks_identical``)."""
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(
            os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
        )  # fmt: skip
        cmd = [sys.executable, str(HERE), "--out", str(tmp), *cases]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-6000:]
    return json.loads((tmp / "rank0.json").read_text())


def check(res: dict[str, Any]) -> None:
    """The assertions of one case (rank 0's view)."""
    case = res["case"]
    assert "error" not in res, f"{case} raised on rank 0:\n{res['error']}"
    assert res["finite"], case
    assert res["ranks_identical"], f"{case}: gradients differ across ranks"
    bf16 = "bf16" in case
    # the exact DDP/FSDP2 gradient of HOT on each rank's half batch
    tol = 0.05 if bf16 else 1e-4
    assert res["rel_halves"] < tol, f"{case}: {res['rel_halves']:.2e} from the halves reference"
    assert res["rel_halves_x2"] > 0.5  # a missing 1/world average would be this far off
    # the global batch's HOT gradient: as far as HOT is from exact, not more
    assert res["rel_global"] < max(2.0 * res["rel_hot_exact"], 0.05), res
    assert res["rel_dist_exact"] < max(2.0 * res["rel_hot_exact"], 0.05), res
    # the plan: every layer of the single-process plan, with the same treatment
    assert res["plan"] == res["ref_plan"], (case, res["plan"], res["ref_plan"])
    # layers that did not reach the backend: none, except the loop layout's root layers under
    # FSDP2, which the backend names (a warning) when it compiles the blocks that frame calls
    lost = sorted({n for n, *_ in res["full_plan"]} - {n for n, *_ in res["plan"]})
    named = sorted(n for _, layers in res["eager"] for n in layers)
    assert named == lost, (case, res["eager"], lost)
    if case.startswith("imageloop-fsdp2"):
        assert lost == ["head", "patch"], lost
        assert [f for f, layers in res["eager"] if layers] == ["FSDPViT.forward"], res["eager"]
    text = case.startswith("text")
    assert all(path == "hot" and signs is text for _, path, signs, _ in res["plan"]), res["plan"]
    # the FP8 forward on every layer but the model's head, whatever graph piece holds it (a DDP
    # piece or an FSDP2 block ends in the residual stream: its last layer keeps FP8)
    forwards = {name: fwd for name, *_, fwd in res["plan"]}
    want = {n: "bf16" if "fp8" not in case or n in ("lm_head", "head") else "fp8 rowwise"
            for n in forwards}  # fmt: skip
    assert forwards == want, (case, forwards)
    # graphs without layers (HF's mask, the rotary table) may say image: the plan is what counts
    fams = res["families"]
    assert fams and any(f["family"] == "text" for f in fams) is text, fams
    if case.split("-")[1] in ("ddp", "ddpc"):  # DDPOptimizer really split the graph
        assert max(f["piece"] for f in fams) >= 2, fams
        if text:
            assert any(f["source"] == "pieces" for f in fams), fams


DEFAULT = ["text-ddpc", "text-ddp", "text-fsdp2-ckpt", "image-fsdp2"]
#: ``imageloop-fsdp2``: the README's FSDP2 pattern on a root whose forward loops over the
#: sharded blocks. Calling a ``fully_shard`` module is a graph break (FSDP2's hooks are
#: ``torch._dynamo.disable``d) and torch 2.13's Dynamo cannot resume one inside a loop, so it
#: runs that whole frame eagerly: the blocks (frames of their own) are compiled with the same
#: plan as one process, the root's patch embedding and head are not, and the backend warns
#: naming them. timm's layout (``image``: the loop inside ``nn.Sequential``) compiles all.
SLOW = [
    "text-ddpc-ckpt", "text-fsdp2", "image-ddpc", "image-ddp-ckpt", "image-fsdp2-ckpt",
    "imageloop-fsdp2",
]  # fmt: skip


FP8 = ["text-ddpc-fp8", "text-fsdp2-fp8"]
BF16 = ["text-fsdp2-bf16"]
#: the cases of each test below: the tests of a session that are selected share one launch
CASES = {
    "test_distributed_default": DEFAULT,
    "test_distributed_more": SLOW,
    "test_fp8_forward_under_ddp_and_fsdp2": FP8,
    "test_fsdp2_bf16_params": BF16,
}


@pytest.fixture(scope="module")
def launched(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """One launch of 2 workers for the cases of every test of :data:`CASES` that this session
    runs (each launch pays two interpreters' start-up, and a worker computes a model's
    single-process references once for all its wrappers' cases): rank 0's result by case."""
    mine = [i for i in request.session.items if getattr(i, "module", None) is request.module]
    selected = {i.originalname for i in mine}
    cases = [c for test, cs in CASES.items() if test in selected for c in cs]
    return {res["case"]: res for res in launch(cases, tmp_path_factory.mktemp("distributed"))}


def _run(cases: list[str], launched: dict[str, dict[str, Any]]) -> None:
    for case in cases:
        assert case in launched, f"{case} did not run: an earlier case of the launch raised"
        check(launched[case])


@pytest.mark.slow
def test_distributed_default(launched: dict[str, dict[str, Any]]) -> None:
    """DDP both orders (graph split by DDPOptimizer) and FSDP2 with checkpointing, text model;
    FSDP2 on the image model in timm's layout (every layer, patch embedding and head too)."""
    _run(DEFAULT, launched)


@pytest.mark.slow
def test_every_rank_takes_rank_0s_speed_verdict(tmp_path: pathlib.Path) -> None:
    """Timed verdicts differ per GPU; a layer near the gate's margin must not take HOT on one
    rank and bf16 on another. Rank 1 measured 0.99x (bf16), rank 0 0.90x (HOT): both take HOT,
    and rank 1 says whose verdict it is. Shapes rank 0 never decides: rank 1 keeps its own,
    after one long wait and then short ones (no hang)."""
    launch(["gate"], tmp_path)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text())[0] for r in range(WORLD))
    assert r0["hot"] and r1["hot"] and r0["hot_us"] == r1["hot_us"] == 90.0, (r0, r1)
    assert r0["source"] == "measured" and r1["source"] == "measured (rank 0)"
    assert r1["alone_hot_us"] == 99.0  # waited 1 s, then its own
    # a graph only rank 1 compiles costs one long wait, then AGREE_AFTER_TIMEOUT_S a layer
    assert 4.0 < r1["next_wait_s"] < 60.0, r1


@pytest.mark.parametrize("bucket_bytes", [BUCKET_BYTES, 2**22], ids=["small", "whole"])
def test_ddp_pieces_that_cut_a_shared_input_are_named(
    bucket_bytes: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DDPOptimizer splits the graph at gradient buckets; where a bucket boundary falls between
    layers that read one x (q/k/v, gate/up), each piece quantizes x for its own layers, and the
    backend says so with the remedy (one process, gloo). Buckets holding the whole tiny model:
    one piece, nothing cut, no warning."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    monkeypatch.setattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", bucket_bytes)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    model = run = None
    try:
        model = DDP(build("text", False), bucket_cap_mb=bucket_bytes / 2**20)
        x, y = batch("text", 2)
        with caplog.at_level("WARNING", logger="hotcompile"):
            run = torch.compile(model, backend="hot", options=OPTIONS)
            loss_of(run(input_ids=x), y).backward()
    finally:
        # DDP's reducer (and the compiled graphs holding it) go before the process group:
        # freed after destroy_process_group, gloo's destructor once hung waiting on a thread
        del model, run
        torch._dynamo.reset()
        gc.collect()
        dist.destroy_process_group()
    warned = [r.getMessage() for r in caplog.records if "cut apart" in r.getMessage()]
    if bucket_bytes == BUCKET_BYTES:
        assert len(warned) == 1 and "bucket_cap_mb" in warned[0], caplog.text
        assert "_proj + model.layers" in warned[0], warned  # names the layers of a cut group
    else:
        assert not warned, warned


@pytest.mark.parametrize("loop", [True, False], ids=["loop", "sequential"])
def test_eager_frame_named_without_fsdp(loop: bool, caplog: pytest.LogCaptureFixture) -> None:
    """One process, no FSDP: a ``torch._dynamo.disable``d pre-hook on each block breaks the
    graph as FSDP2's hooks do. Looped over in the root's forward, the root frame runs eagerly
    and the backend names its layers (patch, head); through ``nn.Sequential`` every layer
    reaches the backend and nothing is named."""
    import torch

    import hotcompile

    model = TinyViT(False, loop=loop)
    for blk in blocks_of(model):
        blk.register_forward_pre_hook(torch._dynamo.disable(lambda mod, args: None))
    x, y = batch("image", 2)
    with caplog.at_level("WARNING", logger="hotcompile"):
        loss_of(torch.compile(model, backend="hot", options=OPTIONS)(x), y).backward()
    reached = {_short(p.name) for p in hotcompile.plans()}
    frames = [(f.function, f.layers) for f in hotcompile.eager_frames()]
    if loop:
        assert reached == {"qkv", "proj", "fc1", "fc2"}, reached
        assert frames == [("ViT.forward", ("patch", "head"))], frames
        assert "inside a loop: Dynamo skips the whole frame" in caplog.text
        assert "Its own layers patch, head get autograd's exact backward" in caplog.text
    else:
        assert reached == {"patch", "qkv", "proj", "fc1", "fc2", "head"}, reached
        assert frames == [] and "eagerly" not in caplog.text, frames


@pytest.mark.slow
def test_distributed_more(launched: dict[str, dict[str, Any]]) -> None:
    """Checkpointing on/off for DDP and FSDP2, the image model under each wrapper, and FSDP2 on
    the image model whose root loops over its blocks (root layers eager, named by a warning)."""
    _run(SLOW, launched)


@pytest.mark.slow
def test_fp8_forward_under_ddp_and_fsdp2(launched: dict[str, dict[str, Any]]) -> None:
    """``forward="fp8"`` composes with DDP (DDPOptimizer's pieces) and FSDP2 (per-block
    graphs): each rank's gradients are the single-process ones of its half batch, the plan
    (the FP8 forward on every layer but the LM head) is the single-process plan."""
    _run(FP8, launched)


@pytest.mark.slow
def test_fsdp2_bf16_params(launched: dict[str, dict[str, Any]]) -> None:
    """FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on the CPU."""
    _run(BF16, launched)


if __name__ == "__main__":
    args = sys.argv[1:]
    out = args[args.index("--out") + 1]
    worker_main([a for a in args if a not in ("--out", out)], out)

"""Which layers of a ViT reach ``backend="hot"`` under FSDP2, per model layout and compile
pattern? (issue 17: "the image model's sharded blocks ran eagerly")

2 processes on the CPU (gloo), the tiny ViT of ``tests/test_distributed.py`` (conv patch
embedding, 2 blocks, head), every block ``fully_shard``ed, then the root, in two layouts:

- ``loop``: ``self.blocks = nn.ModuleList(...)``, the root's forward runs ``for blk in
  self.blocks: x = blk(x)``;
- ``sequential``: timm's layout, ``self.blocks = nn.Sequential(...)``, ``x = self.blocks(x)``;

and these patterns:

- ``root``: ``torch.compile(root, backend="hot")`` (the README's);
- ``root+nested``: the same with ``torch._dynamo.config.nested_graph_breaks = True``;
- ``blocks``: ``block.compile(backend="hot")`` per block only (torchtitan's), root eager;
- ``blocks+root``: per-block compile, then the root compiled too.

For each: the backend's graphs, the layers that reached it against one process's
``torch.compile(model)`` plan, the frames Dynamo could not compile at all (its compilation
metrics) and the frames ``hotcompile.eager_frames()`` recorded (and warned about).

What it shows on torch 2.13: calling a ``fully_shard`` module is a graph break (FSDP2 wraps
its hooks in ``torch._dynamo.disable``); Dynamo cannot resume a graph break inside a loop
("graph break in loop"), so with ``loop`` it skips the *root's whole frame*: the blocks, frames
of their own, are compiled, the patch embedding and the head are not (``nested_graph_breaks``
does not change that; nor does compiling the blocks one by one). With ``sequential`` the break
happens at ``self.blocks(x)``, outside any loop of the root's frame: the root compiles in two
graphs around it and every layer reaches the backend.

    python experiments/fsdp2_image_blocks.py          # launches its 2 processes itself
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

LAYOUTS = ("loop", "sequential")
PATTERNS = ("root", "root+nested", "blocks", "blocks+root")


def one(layout: str, pattern: str) -> dict[str, Any]:
    """One layout and pattern on this rank: what reached the backend and what Dynamo skipped."""
    import test_distributed as td
    import torch
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics
    from torch.distributed.fsdp import fully_shard

    import hotcompile

    kind = "imageloop" if layout == "loop" else "image"
    kw: dict[str, Any] = dict(backend="hot", options=td.OPTIONS, dynamic=False)
    x, y = td.batch("image", 4)

    torch._dynamo.reset()
    hotcompile.clear_plans()
    single = td.build(kind, False)
    td.loss_of(torch.compile(single, **kw)(x), y).backward()
    reference = sorted({td._short(p.name) for p in hotcompile.plans()})

    torch._dynamo.reset()
    hotcompile.clear_plans()
    clear_compilation_metrics()
    model = td.build(kind, False)
    graphs = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        graphs.append(str(torch._guards.CompileContext.current_compile_id()))
        return hotcompile.hot_backend(gm, example_inputs, options=td.OPTIONS)

    kw["backend"] = counting
    kw.pop("options")
    for blk in td.blocks_of(model):
        fully_shard(blk)
    fully_shard(model)
    if pattern.startswith("blocks"):
        for blk in td.blocks_of(model):
            blk.compile(**kw)
    run = torch.compile(model, **kw) if "root" in pattern else model
    with torch._dynamo.config.patch(nested_graph_breaks="nested" in pattern):
        td.loss_of(run(x[:2]), y[:2]).backward()
    reached = sorted({td._short(p.name) for p in hotcompile.plans()})
    skipped = [
        f"{m.co_name} ({pathlib.Path(m.co_filename).name}:{m.co_firstlineno}): "
        + ("graph break in loop" if "graph break in loop" in (m.fail_reason or "") else "")
        for m in get_compilation_metrics()
        if m.fail_type and m.co_filename
    ]
    return {
        "layout": layout,
        "pattern": pattern,
        "graphs": graphs,
        "reached": reached,
        "missing": sorted(set(reference) - set(reached)),
        "dynamo_skipped": skipped,
        "hotcompile_eager": [[f.function, list(f.layers)] for f in hotcompile.eager_frames()],
    }


def worker(out: pathlib.Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        rows = [one(layout, pattern) for layout in LAYOUTS for pattern in PATTERNS]
    finally:
        dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        out.write_text(json.dumps(rows, indent=1))


def main() -> None:
    if "RANK" in os.environ:
        worker(pathlib.Path(sys.argv[sys.argv.index("--out") + 1]))
        return
    import tempfile

    from test_distributed import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "rows.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
            f"--master-port={free_port()}", __file__, "--out", str(out),
        ]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1")
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode:
            sys.exit(res.stdout[-3000:] + res.stderr[-6000:])
        lines = (res.stdout + res.stderr).splitlines()
        warnings = sorted({ln for ln in lines if "hotcompile: torch.compile" in ln})
        rows = json.loads(out.read_text())
    print("| layout | pattern | graphs | missing from one process's plan | Dynamo skipped "
          "| hotcompile.eager_frames() |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        eager = "; ".join(f"{f}: {', '.join(ls) or '-'}" for f, ls in r["hotcompile_eager"])
        print(
            f"| {r['layout']} | {r['pattern']} | {len(r['graphs'])} | "
            f"{', '.join(r['missing']) or 'none'} | {'; '.join(r['dynamo_skipped']) or '-'} | "
            f"{eager or '-'} |"
        )
    print("\nthe backend's warning (once per frame and process):")
    for w in warnings:
        print(" ", w)


if __name__ == "__main__":
    main()

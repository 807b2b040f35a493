"""Replay the memory of one inductor-generated module's ``call`` from its source, no GPU needed.

Why: ``experiments/peak_moment.py`` shows what is alive at a step's peak on the device. To ask
"what is alive where, and what would the peak be without X" without spending device time,
this script walks the generated wrapper code line by line (``empty_strided_cuda``
allocations, ``del``, inductor's ``# reuse`` renames, the arguments the module receives,
sized from the module's own ``rand_strided`` harness) and tracks the bytes alive. Two plans
over the same code:

- ``as-written``: the code as it ran (a dead buffer inductor keeps for a later buffer of the
  same size stays alive until then). On the 8B-width Llama's backward of five variants
  (session 35) it matched ``torch.cuda.max_memory_allocated`` to 0.01 GiB, with one offset
  for all five (7.872 GiB held when the backward starts: weights, AdamW's moments);
- ``last-use``: every buffer freed after the last line that reads it, a reuse rename being a
  new buffer: a lower bound for this schedule. Not a prediction of
  ``allow_buffer_reuse=False``: inductor then orders the kernels differently (the lean
  plan's 8B backward: 877 statements with reuse, 1047 without), so replay that module.

Parameters (``primals_*``) are the model's and never freed here; the returned gradients live
to the end. Extern ops without ``out=`` are sized where the code shows their shape; cuDNN's
attention backward gets its three outputs and the workspace peak_moment measured
(``--sdpa-workspace-mib``). ``--start-gib`` adds what the allocator held when the module
started (peak_moment's measured peak minus this replay's as-written peak).

    python3 experiments/backward_liveness.py /tmp/inductor_cache/3u/c3uz....py --top 25
    python3 experiments/backward_liveness.py MODULE --never '_swiglu_hq_kernel'   # without X

``--never REGEX``: allocations whose line, or the call that writes them, matches take no
memory. On the lean plan's 8B backward with reuse off, ``--never _swiglu_hq_kernel`` (the
buffers the SwiGLU backward kernel writes) gives 10.974 GiB, the end of the backward: what
run 88 then measured (10.97) once the kernel stored no g_a / g_b.

Modules to replay: ``experiments/peak_moment.py --modules DIR`` copies those a step ran;
session 35's are in ``experiments/results/backward_modules_s35.txz``.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

import torch

MIB = 2**20

ALLOC = re.compile(r"^(\w+) = empty_strided_cuda\(\(([^)]*)\), \(([^)]*)\), torch\.(\w+)\)")
ARG = re.compile(r"^\s*(\w+) = rand_strided\(\(([^)]*)\), \(([^)]*)\), device='cuda:\d+', "
                 r"dtype=torch\.(\w+)\)")  # fmt: skip
REUSE = re.compile(r"^(buf\w+) = (?:reinterpret_tensor\()?(buf\w+)\b.*; del \2\s+# reuse")
TUPLE = re.compile(r"^(buf\w+) = (buf\w+)\[(\d+)\]$")
EXTERN = re.compile(r"^(buf\w+) = torch\.ops\.\w+\.(\w+)")
NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*\b")  # (not attributes: extern_kernels.mm is no `mm`)


def nbytes(shape: str, stride: str, dtype: str) -> int:
    """Bytes of the storage a ``(shape), (stride)`` tensor spans."""
    dims = [int(s) for s in shape.replace(" ", "").split(",") if s]
    steps = [int(s) for s in stride.replace(" ", "").split(",") if s]
    if any(d == 0 for d in dims):
        return 0
    span = 1 + sum((d - 1) * s for d, s in zip(dims, steps, strict=True))
    return span * getattr(torch, dtype).itemsize


@dataclass
class Storage:
    size: int
    what: str
    line: int
    names: set[str] = field(default_factory=set)
    parts: int = 1  # outputs of one extern op (a tuple), each 1/parts of its size


def module_call(path: str) -> tuple[list[str], dict[str, tuple[int, str]]]:
    """The statements of the (last) ``call`` in a generated module, and its arguments' sizes
    from the module's own benchmark harness (``rand_strided`` lines)."""
    src = open(path).read().splitlines()
    starts = [i for i, s in enumerate(src) if s.strip().startswith("def call(self, args)")]
    if not starts:
        raise SystemExit(f"{path}: no `def call(self, args)`: not an inductor output module")
    body: list[str] = []
    indent = len(src[starts[-1]]) - len(src[starts[-1]].lstrip())
    for s in src[starts[-1] + 1 :]:
        if s.strip() and len(s) - len(s.lstrip()) <= indent:
            break
        t = s.strip()
        if t and not t.startswith("#"):
            body.append(t)
    args = {}
    for s in src:
        m = ARG.match(s)
        if m:
            args[m.group(1)] = (nbytes(m.group(2), m.group(3), m.group(4)), m.group(4))
    return body, args


def _writer(body: list[str], i: int, name: str) -> str:
    """The allocation at ``body[i]`` and the first later line that passes ``name`` to a
    call (the kernel that writes it), for ``--never`` to match either."""
    for s in body[i + 1 : i + 40]:
        if "(" in s and re.search(rf"\b{name}\b", s) and not s.startswith("del "):
            return body[i] + "\n" + s
    return body[i]


def replay(
    body: list[str], args: dict[str, tuple[int, str]], plan: str, sdpa_workspace: int,
    never: str = "",
) -> tuple[list[int], list[list[Storage]]]:  # fmt: skip
    """Bytes alive after each statement of ``body`` (and the storages alive there) under
    ``plan`` ("as-written" or "last-use"); ``never``: a regex of allocations (or of the calls
    that write them) that take no memory."""
    last: dict[str, int] = {}
    for i, s in enumerate(body):
        r = REUSE.match(s)  # a rename reads nothing: only the new name is used there
        for n in [r.group(1)] if r else NAME.findall(s.split("; del ")[0]):
            if not s.startswith("del "):
                last[n] = i
    live: dict[str, Storage] = {}  # name -> storage
    sizes: dict[str, int] = {n: size for n, (size, _) in args.items()}  # every name's bytes
    first = body[0].split(" = args")[0] if " = args" in body[0] else ""
    for n in [x.strip() for x in first.split(",") if x.strip()]:
        size, dtype = args.get(n, (0, "?"))
        if not n.startswith("primals_"):
            live[n] = Storage(size, f"argument {n} ({dtype})", -1, {n})
    curve: list[int] = []
    snaps: list[list[Storage]] = []

    def drop(name: str) -> None:
        st = live.pop(name, None)
        if st is not None:
            st.names.discard(name)

    for i, s in enumerate(body):
        transient = 0
        r = REUSE.match(s)
        for stmt in [p.strip() for p in re.split(r";\s*(?=del |buf)", s.split("  #")[0])]:
            m = ALLOC.match(stmt)
            if r and stmt.startswith(r.group(1) + " ="):
                new, old = r.group(1), r.group(2)
                st = live.get(old)
                if plan == "as-written" and st is not None:
                    live[new] = st
                    st.names.add(new)
                elif plan != "as-written" and old in sizes:  # (old may be freed already)
                    live[new] = Storage(sizes[old], f"{stmt[:110]}", i, {new})
                    sizes[new] = sizes[old]
                continue
            if stmt.startswith("del "):
                if plan == "as-written" or " # reuse" not in s:
                    for n in stmt[4:].split(","):
                        drop(n.strip())
                continue
            if m:
                size = nbytes(m.group(2), m.group(3), m.group(4))
                if never and re.search(never, _writer(body, i, m.group(1))):
                    size = 0  # "what if this were never made"
                live[m.group(1)] = Storage(size, stmt[:110], i, {m.group(1)})
                sizes[m.group(1)] = size
                continue
            t = TUPLE.match(stmt)
            if t and t.group(2) in live:
                parent = live[t.group(2)]
                size = parent.size // parent.parts
                live[t.group(1)] = Storage(size, f"{t.group(2)}[{t.group(3)}]", i, {t.group(1)})
                continue
            e = EXTERN.match(stmt)
            if e:
                size, parts = 0, 1
                if "attention_backward" in e.group(2):
                    shape = re.search(r"reinterpret_tensor\(\w+, \(([^)]*)\), \(([^)]*)\)", stmt)
                    one = nbytes(shape.group(1), shape.group(2), "bfloat16") if shape else 0
                    size, parts, transient = 3 * one, 3, sdpa_workspace
                live[e.group(1)] = Storage(size, stmt[:110], i, {e.group(1)}, parts)
        if plan != "as-written" and not s.startswith("return"):  # (the outputs live on)
            for n in list(live):
                if last.get(n, -1) <= i and not n.startswith("primals_"):
                    if any(last.get(o, -1) > i for o in live[n].names if o != n):
                        continue
                    drop(n)
        alive = {id(st): st for st in live.values()}
        curve.append(sum(st.size for st in alive.values()) + transient)
        snaps.append(sorted(alive.values(), key=lambda st: -st.size))
    return curve, snaps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("module", help="an inductor output module (.py) with a `call`")
    p.add_argument("--top", type=int, default=20, help="storages to list at each peak")
    p.add_argument(
        "--start-gib",
        type=float,
        default=0.0,
        help="GiB the allocator held when the module started (added to offsets)",
    )
    p.add_argument(
        "--sdpa-workspace-mib",
        type=float,
        default=129.0,
        help="cuDNN attention backward's workspace (peak_moment measured 129)",
    )
    p.add_argument(
        "--never",
        default="",
        help="a regex: allocations whose line, or the line of the call that writes them, "
        "matches take no memory (what would the peak be without them?), e.g. "
        "'_to_copy_\\d+\\.run\\(primals_' for the bf16 copies of the weights",
    )
    a = p.parse_args()
    body, args = module_call(a.module)
    for plan in ("as-written", "last-use"):
        curve, snaps = replay(body, args, plan, int(a.sdpa_workspace_mib * MIB), a.never)
        at = max(range(len(curve)), key=curve.__getitem__)
        print(
            f"\n## {plan}: peak {a.start_gib + curve[at] / 2**30:.3f} GiB "
            f"(+{curve[at] / 2**30:.3f} in the module) at statement {at} of {len(body)}:"
        )
        print(f"    {body[at][:160]}")
        print("\n| MiB | made at | by |\n|---|---|---|")
        for st in snaps[at][: a.top]:
            print(f"| {st.size / MIB:.1f} | {st.line} | `{st.what}` |")
        rest = snaps[at][a.top :]
        print(f"| {sum(s.size for s in rest) / MIB:.1f} | | {len(rest)} more |")


if __name__ == "__main__":
    main()

"""Every fenced code block of README.md and docs/*.md runs here, or says why not (issue 35).

The convention (also in docs/development.md): the last non-blank line before an opening fence
may be a marker, an HTML comment.

- ``<!-- docs-test: skip (KIND: why) -->``: the block is not run here. KIND is one of
  ``output`` (program output, a usage line, a file tree, maths: not code), ``gpu-only`` (needs
  CUDA; *why* says where it ran on the device), ``slow`` (minutes on 2 cores; *why* says what
  runs it, e.g. .ci/run), ``multi-process`` (needs several ranks; *why* names the test that runs
  it) and ``placeholder`` (commands on names the reader fills in, such as ``mypkg``).
  Every ``--flag`` of a ``hotcompile ...`` or ``python3 tools/X.py ...`` command in a skipped
  block (``$ ``-prefixed lines of output blocks included) must still appear in that command's
  ``--help``, so a renamed flag fails.
- ``<!-- docs-test: setup`` opens an HTML comment (hidden from readers) holding one fenced
  python block and closed by ``-->``: it runs before the file's next python blocks and defines
  the names they use (a model of the right shape, a loss).

Unmarked blocks run. ``python`` blocks run per file, in order, in one namespace prefilled with
``torch``, ``nn``, ``F``, ``hotcompile``, a tiny ``model`` (``hotcompile.demo.DigitsViT()``) and
an input ``x`` for it, in a temporary working directory; ``torch.compile(..., backend="hot",
options=...)`` checks its options at once (``HotConfig.from_options``) instead of at the first
call, so no snippet pays for a compile it does not run. ``bash`` blocks run command by command
from the repository root with a timeout. An unmarked block of another language fails: mark it.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import cli_env, help_text

import hotcompile
import hotcompile.demo
from hotcompile.config import HotConfig

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KINDS = ("output", "gpu-only", "slow", "multi-process", "placeholder")
TOOLS = sorted(p.name for p in (ROOT / "tools").glob("*.py"))
SUBCOMMANDS = ["demo", "build", "report", "diff"]

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_MARK = re.compile(r"<!--\s*docs-test:\s*(?:skip \((?P<reason>.+)\)\s*-->|(?P<setup>setup)\s*$)")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    mark: str | None  # None (run), "setup" or "skip"
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2), i
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            i += 1
        prev = next((s for s in reversed(lines[:start]) if s.strip()), "")
        mark = _MARK.search(prev)
        kind = None if mark is None else ("setup" if mark["setup"] else "skip")
        code = "\n".join(lines[start + 1 : i]) + "\n"
        found.append(Block(path, start + 1, lang, code, kind, mark["reason"] if mark else ""))
        i += 1
    return found


ALL = [b for p in DOCS for b in blocks(p)]


def test_blocks_are_found() -> None:
    """The extractor sees the blocks (a broken fence regex would pass every other test)."""
    assert len(ALL) >= 20
    assert any(b.mark is None and b.lang == "python" for b in ALL)


@pytest.mark.parametrize("block", ALL, ids=lambda b: b.id)
def test_block_is_runnable_or_marked(block: Block) -> None:
    if block.mark == "skip":
        kind = block.reason.split(":", 1)[0]
        assert kind in KINDS and ":" in block.reason, (
            f"{block.id}: a skip needs '(KIND: why)' with KIND one of {KINDS}, got {block.reason!r}"
        )
        if block.lang == "python":  # not run, but it must still parse
            compile(block.code, block.id, "exec")
    elif block.mark == "setup":
        assert block.lang == "python", f"{block.id}: a setup block is python"
    else:
        assert block.lang in ("python", "bash"), (
            f"{block.id}: an unmarked ```{block.lang} block is neither run nor marked: "
            "add <!-- docs-test: skip (KIND: why) --> before it (see tests/test_docs.py)"
        )


# --------------------------------------------------------------------------- python blocks


def _checked_compile(real):
    @functools.wraps(real)
    def compile_(model=None, *, backend="inductor", mode=None, options=None, **kwargs):
        if backend == "hot":  # the options a first call would check, checked now
            HotConfig.from_options({**(options or {}), **({"mode": mode} if mode else {})})
        return real(model, backend=backend, mode=mode, options=options, **kwargs)

    return compile_


def _namespace() -> dict:
    torch.manual_seed(0)
    return {
        "torch": torch,
        "nn": torch.nn,
        "F": torch.nn.functional,
        "hotcompile": hotcompile,
        "model": hotcompile.demo.DigitsViT(),
        "x": torch.randn(8, 1, 8, 8),
    }


PY_DOCS = [p for p in DOCS if any(b.lang == "python" and b.mark != "skip" for b in blocks(p))]


@pytest.mark.parametrize("path", PY_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # snippets write diff.html, lqs.json, vit.png
    monkeypatch.setattr(torch, "compile", _checked_compile(torch.compile))
    ns = _namespace()
    for block in blocks(path):
        if block.lang != "python" or block.mark == "skip":
            continue
        try:
            exec(compile(block.code, block.id, "exec"), ns)
        except Exception as e:
            raise AssertionError(f"{block.id} fails: {type(e).__name__}: {e}") from e


def test_a_bad_option_fails_in_a_snippet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The option check above can fail: a misspelt option raises at torch.compile."""
    monkeypatch.setattr(torch, "compile", _checked_compile(torch.compile))
    ns = _namespace()
    with pytest.raises(Exception, match="gx_bitz"):
        exec('model = torch.compile(model, backend="hot", options={"gx_bitz": 8})', ns)


# --------------------------------------------------------------------------- commands


def _commands(block: Block) -> list[str]:
    """The shell commands of a block: continuation lines joined, comments and prompts dropped;
    in an output block only the ``$ `` lines."""
    text = block.code.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if block.lang != "bash" and not line.startswith("$ "):
            continue
        line = line.removeprefix("$ ")
        for part in line.split("&&"):
            part = shlex.split(part, comments=True)
            if part:
                out.append(part)
    return out


def _program(argv: list[str]) -> tuple[str, ...] | None:
    """('tools/X.py',) or ('hotcompile', SUB) for commands of this project, else None."""
    if argv[0] in ("python", "python3") and len(argv) > 1 and argv[1].startswith("tools/"):
        return (argv[1],)
    if argv[0] == "hotcompile":
        sub = next((a for a in argv[1:] if not a.startswith("-")), None)
        return ("hotcompile", sub) if sub in SUBCOMMANDS else ("hotcompile",)
    return None


CMD_BLOCKS = [b for b in ALL if b.lang != "python" and any(map(_program, _commands(b)))]


@pytest.mark.slow  # a Python process per tool, each importing torch
@pytest.mark.parametrize("block", CMD_BLOCKS, ids=lambda b: b.id)
def test_command_flags_exist(block: Block) -> None:
    _check_flags(block)


@pytest.mark.slow
def test_a_renamed_flag_fails() -> None:
    block = Block(ROOT / "README.md", 0, "bash", "hotcompile report m:f --no-such-flag\n", None)
    with pytest.raises(AssertionError, match="no --no-such-flag"):
        _check_flags(block)


def _check_flags(block: Block) -> None:
    for argv in _commands(block):
        program = _program(argv)
        if program is None:
            continue
        text = help_text(program)
        for arg in argv:
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and flag != "--help":
                assert re.search(re.escape(flag) + r"\b", text), (
                    f"{block.id}: {' '.join(program)} has no {flag} (see its --help)"
                )


RUN_BASH = [b for b in ALL if b.lang == "bash" and b.mark is None]


@pytest.mark.parametrize("block", RUN_BASH, ids=lambda b: b.id)
def test_bash_blocks_run(block: Block) -> None:
    for argv in _commands(block):
        out = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=cli_env(), check=False
        )
        assert out.returncode == 0, f"{block.id}: {shlex.join(argv)}: {out.stderr[-2000:]}"


@pytest.mark.slow  # a Python process per tool, each importing torch (~5-10 s on 2 cores)
@pytest.mark.parametrize(
    "program",
    [(f"tools/{t}",) for t in TOOLS] + [("hotcompile",)] + [("hotcompile", s) for s in SUBCOMMANDS],
    ids=" ".join,
)
def test_help_exits_0(program: tuple[str, ...]) -> None:
    """Every maintained tool and every ``hotcompile`` subcommand answers --help on the CPU
    (none needs a GPU library to import)."""
    assert help_text(program).startswith("usage:")

"""README.md's option table is the one tools/readme_tables.py generates from the committed
benchmark runs, so it cannot go stale; the README stays short and its local links resolve."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _tool():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "tools/readme_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_readme_holds_exactly_the_generated_table():
    tool = _tool()
    generated = tool.block()
    assert generated in README.read_text(), (
        "README.md's option table differs from the committed runs: "
        "run python3 tools/readme_tables.py --write"
    )
    assert tool.readme_block(README.read_text()) == generated


def test_table_rows_come_from_one_run_each():
    """Every measured row names its run, and its ratios are against that run's inductor."""
    tool = _tool()
    runs = tool.load_runs()
    for model, label, _ in tool.MODELS:
        device, picks = tool.model_picks(runs, model)  # what the table and the plot show
        for row, picked in picks:
            if row.variant is None:
                continue
            if picked is None:  # said once under the table, with the model
                note = next(ln for ln in tool.table().splitlines() if ln.startswith("Not measured"))
                assert row.missing in note and label in note
                continue
            _, run, entry = picked
            assert {row.variant, tool.BASELINE} <= set(entry["variants"])
            assert run["device"] == device  # one GPU per model


def test_check_mode_passes():
    assert _tool().main(["--check"]) == 0


def test_readme_is_short_and_keeps_the_quick_start():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for command in (
        'python3 -m pip install torch==2.13.0 -e ".[demo]" && hotcompile demo',
        'python3 -m pip install torch==2.13.0 -e ".[test]" && python3 -m pytest tests -q',
        'python3 -m pytest tests -q -m "not slow"',
    ):
        assert command in text


def test_readme_local_links_resolve():
    """Relative links point at files that exist (experiments/ is being moved there: skipped
    while it is not)."""
    text = README.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http:", "https:", "#")):
            continue
        path = target.partition("#")[0]
        if path.startswith("experiments/") and not (ROOT / path).exists():
            continue  # tools/repros/ and its results are moving to experiments/
        assert (ROOT / path).exists(), target

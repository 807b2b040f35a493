"""The code base stays ruff-clean (ruff is in the test extra)."""

import pathlib
import shutil
import subprocess

import pytest
from conftest import help_text

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_clean():
    out = subprocess.run(["ruff", "check", str(ROOT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_cli_help_teaches():
    out = help_text(("hotcompile", "demo"))
    assert "digits" in out and "--epochs" in out and "examples:" in out


def test_options_reference_documents_every_option():
    """docs/options.md's options table has a row for every ``HotConfig`` field and none for a
    field that no longer exists, and the README's short table names only real fields: a user
    reads the options there."""
    import dataclasses
    import re

    from hotcompile.config import HotConfig

    def documented(text: str, heading: str) -> set[str]:
        table = text.split(heading)[1].split("\n## ")[0]
        rows = re.findall(r"^\| ((?:`\w+`(?: / )?)+) \|", table, re.M)
        return {name for row in rows for name in re.findall(r"`(\w+)`", row)}

    fields = {f.name for f in dataclasses.fields(HotConfig)}
    full = documented((ROOT / "docs/options.md").read_text(), "## Options (`HotConfig` fields)")
    assert fields - full == set(), "options missing from docs/options.md's table"
    assert full - fields == set(), "docs/options.md rows for options that do not exist"
    short = documented((ROOT / "README.md").read_text(), "\n## Options\n")
    assert short and short - fields == set(), "README rows for options that do not exist"

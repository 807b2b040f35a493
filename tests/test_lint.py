"""The code base stays ruff-clean (ruff is in the test extra)."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_clean():
    out = subprocess.run(["ruff", "check", str(ROOT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_cli_help_teaches():
    out = subprocess.run(
        [sys.executable, "-m", "hotcompile.cli", "demo", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "digits" in out and "--epochs" in out and "examples:" in out


def test_readme_documents_every_option():
    """The README's options table has a row for every ``HotConfig`` field and none for a field
    that no longer exists: a user reads the options there."""
    import dataclasses
    import re

    from hotcompile.config import HotConfig

    text = (ROOT / "README.md").read_text()
    table = text.split("### Options (`HotConfig` fields)")[1].split("\n### ")[0]
    rows = re.findall(r"^\| ((?:`\w+`(?: / )?)+) \|", table, re.M)
    documented = {name for row in rows for name in re.findall(r"`(\w+)`", row)}
    fields = {f.name for f in dataclasses.fields(HotConfig)}
    assert fields - documented == set(), "options missing from the README's table"
    assert documented - fields == set(), "README rows for options that do not exist"

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

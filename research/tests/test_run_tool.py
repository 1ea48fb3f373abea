"""research.cli.run_tool: a research tool run as `python -m research.TOOL` answers a user error in one
line and exit status 2, as `disan`'s commands do, instead of a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from disan.optional import MissingDependency
from research.cli import run_tool

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("error", [ValueError("x.pt: checkpoint not found"),
                                   FileNotFoundError("no such file: y"),
                                   MissingDependency("pytrec_eval", "eval")])
def test_a_user_error_is_one_line_and_status_2(error, capsys):
    def main():
        raise error

    assert run_tool(main, "research.some_tool") == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m research.some_tool: ") and err.count("\n") == 1
    assert str(error) in err


def test_the_tool_status_is_passed_on():
    assert run_tool(lambda: None, "research.t") == 0 and run_tool(lambda: 3, "research.t") == 3


def test_a_bug_still_shows_its_traceback():
    def main():
        raise KeyError("a programming error, not the user's")

    with pytest.raises(KeyError):
        run_tool(main, "research.t")


def test_a_missing_checkpoint_through_the_module(tmp_path):
    """Before: `python -m research.whiten_head --checkpoint MISSING` ended in a traceback."""
    out = str(tmp_path / "w.pt")
    args = ["--checkpoint", str(tmp_path / "no.pt"), "--corpus", str(tmp_path), "--out", out]
    proc = subprocess.run([sys.executable, "-m", "research.whiten_head", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("python -m research.whiten_head: ")

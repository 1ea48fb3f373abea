"""`disan eval --sts` and `--transfer` (sts_run, transfer) refuse what they cannot run in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sklearn")

from disan.cli import main  # noqa: E402


def test_unknown_baseline_is_one_line(tmp_path: Path, capsys) -> None:
    # It once ended in a KeyError traceback.
    code = main(["eval", "--sts", "--sts-baselines", "minilm,foo", "--data", str(tmp_path),
                 "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown --sts-baselines entry 'foo' (choose from minilm, mpnet)" in err
    assert "Traceback" not in err


def test_unknown_transfer_baseline_is_one_line_too(tmp_path: Path, capsys) -> None:
    # --transfer and --sts read their baseline lists with the same helper (disan.transfer.add_baselines).
    code = main(["eval", "--transfer", "--baselines", "glove,bar", "--data", str(tmp_path),
                 "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown --baselines entry 'bar' (choose from glove, minilm, mpnet)" in err
    assert "Traceback" not in err

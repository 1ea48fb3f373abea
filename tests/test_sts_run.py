"""`disan eval --sts` and `--transfer` (sts_run, transfer) refuse what they cannot run in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sklearn")

from disan.cli import main  # noqa: E402


# --sts once ended in a KeyError traceback; both lists are read by disan.transfer.add_baselines.
@pytest.mark.parametrize(("flags", "message"), [
    (["--sts", "--sts-baselines", "minilm,foo"],
     "unknown --sts-baselines entry 'foo' (choose from minilm, mpnet)"),
    (["--transfer", "--baselines", "glove,bar"],
     "unknown --baselines entry 'bar' (choose from glove, minilm, mpnet)"),
])
def test_unknown_baseline_is_one_line(tmp_path: Path, capsys, flags: list[str], message: str) -> None:
    code = main(["eval", *flags, "--data", str(tmp_path), "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err

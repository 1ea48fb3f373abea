"""disan.train.checkpoint: writes are all-or-nothing; a foreign file is a one-line error."""

from __future__ import annotations

import pytest
import torch

from disan.train.checkpoint import load_checkpoint, provenance, write_checkpoint


def test_a_failed_write_keeps_the_old_checkpoint_and_leaves_no_partial_file(tmp_path) -> None:
    path = tmp_path / "best.pt"
    write_checkpoint(path, {"step": 1})
    with pytest.raises(Exception):  # noqa: B017  (a lambda cannot be pickled: torch.save fails midway)
        write_checkpoint(path, {"step": 2, "unpicklable": lambda: None})
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]


def test_a_file_that_is_no_checkpoint_is_a_one_line_error(tmp_path) -> None:
    """torch's unpickling error runs to several lines of advice; the error names the file and the
    first line only, so a command's error stays one line."""
    path = tmp_path / "notes.pt"
    path.write_text("# not a checkpoint\n" * 20)
    with pytest.raises(ValueError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot read checkpoint (") and "\n" not in message


def test_provenance_names_the_file_and_every_step_the_checkpoint_records(tmp_path) -> None:
    """A bundle's manifest traces its encoder through this: a head whitened after training
    (`research.whiten_head`) is a step of its history like a recovery or a merge; the resume state is not."""
    path = tmp_path / "runs" / "w.pt"
    whitened = {"from": "embed.pt", "power": 0.25, "unit_length": True}
    write_checkpoint(path, {"step": 3, "whitened": whitened, "recovered_from": {"bundle": "b"},
                            "student_state": {"step": 3}})
    entry = provenance(path, torch.load(path, weights_only=True))
    assert entry["file"] == "w.pt" and len(entry["sha256"]) == 64 and str(tmp_path) not in str(entry)
    assert entry["whitened"] == whitened and entry["recovered_from"] == {"bundle": "b"}
    assert "student_state" not in entry

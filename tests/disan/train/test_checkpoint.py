"""disan.train.checkpoint: writes are all-or-nothing; a foreign file is a one-line error."""

from __future__ import annotations

import pytest
import torch

from disan.train.checkpoint import load_checkpoint, write_checkpoint


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

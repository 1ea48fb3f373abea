"""disan.checkpoint: writes are all-or-nothing."""

from __future__ import annotations

import pytest
import torch

from disan.checkpoint import write_checkpoint


def test_a_failed_write_keeps_the_old_checkpoint_and_leaves_no_partial_file(tmp_path) -> None:
    path = tmp_path / "best.pt"
    write_checkpoint(path, {"step": 1})
    with pytest.raises(Exception):  # noqa: B017  (a lambda cannot be pickled: torch.save fails midway)
        write_checkpoint(path, {"step": 2, "unpicklable": lambda: None})
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]

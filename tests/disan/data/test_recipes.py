"""disan/data/recipes.py: the learning-rate schedules shared by `disan pretrain` and `disan train`."""

from __future__ import annotations

import pytest

from disan.data.recipes import LR_DECAYS, decayed_lr


def test_learning_rate_decays_to_zero_over_the_steps() -> None:
    linear = [decayed_lr(0.4, "linear", d, 4) for d in range(5)]
    assert linear == pytest.approx([0.4, 0.3, 0.2, 0.1, 0])
    assert [decayed_lr(0.4, "cosine", d, 4) for d in (0, 2, 4)] == pytest.approx([0.4, 0.2, 0])
    assert decayed_lr(0.4, "none", 3, 4) == 0.4


def test_every_named_schedule_starts_at_the_base_rate() -> None:
    assert [decayed_lr(0.4, kind, 0, 10) for kind in LR_DECAYS] == pytest.approx([0.4] * len(LR_DECAYS))

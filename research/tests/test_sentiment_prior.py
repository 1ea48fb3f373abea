"""research/analyses/sentiment_prior.py: a per-class bias tuned on half of dev, scored on the other half."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from research.analyses.sentiment_prior import held_out_gains, tune_bias


def _scores(shift: float, n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities of a model that knows the label (+1.5 on it) but whose class 2 is pushed
    down by `shift` (a prior it learned wrong), with noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, n)
    logits = rng.normal(0, 1, (n, 5))
    logits[np.arange(n), labels] += 1.5
    logits[:, 2] -= shift
    return logits - np.log(np.exp(logits).sum(1, keepdims=True)), labels


def test_a_wrong_prior_is_found_and_the_fix_carries_to_the_held_out_half() -> None:
    logp, labels = _scores(shift=1.5)
    bias = tune_bias(logp, labels)
    assert 0.9 <= bias[2] - np.delete(bias, 2).mean() <= 2.1 and bias[0] == 0
    gains = held_out_gains(logp, labels, splits=10)
    assert gains.mean() > 3 and (gains > 0).all()


def test_without_a_wrong_prior_the_held_out_gain_is_about_nothing() -> None:
    logp, labels = _scores(shift=0.0)
    gains = held_out_gains(logp, labels, splits=10)
    assert abs(gains.mean()) < 1.5
    assert np.abs(tune_bias(logp, labels)).max() <= 1.0  # on GRID


def test_a_missing_file_is_a_one_line_error(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    got = subprocess.run([sys.executable, "-m", "research.analyses.sentiment_prior",
                          str(tmp_path / "nope.pt"),
                          "--bundle", str(tmp_path), "--data", str(tmp_path / "dev.jsonl.gz")],
                         capture_output=True, text=True, cwd=root, check=False)
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert got.stderr.strip().count("\n") == 0 and "error:" in got.stderr

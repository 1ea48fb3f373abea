"""research/analyses/sentiment_ensembles.py: every subset of an ensemble's models scored by the mean of their
probabilities, the first model alone as a bundle would serve it."""

from __future__ import annotations

import gzip
import json
import sys

import numpy as np
import pytest
from conftest import loaded, member_of, run_texts

torch = pytest.importorskip("torch")

from research.analyses import sentiment_ensembles as bench  # noqa: E402

TEXTS = ["the film was good", "the movie was bad", "good", "bad", "a man is playing"]


def test_subsets_score_the_mean_of_their_probabilities(tiny_checkpoints, tmp_path, monkeypatch, capsys):
    members = [member_of(tiny_checkpoints.sentiment, tmp_path / f"m{s}.pt", seed=s) for s in (21, 22)]
    data = tmp_path / "dev.jsonl.gz"
    labels = [0, 4, 3, 1, 2]
    with gzip.open(data, "wt") as f:
        f.writelines(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(TEXTS, labels, strict=True))
    vocab_file = tmp_path / "vocab.json"
    tiny_checkpoints.vocab.save(vocab_file)
    out = tmp_path / "report.json"
    monkeypatch.setattr(sys, "argv", ["x", str(tiny_checkpoints.sentiment), *map(str, members),
                                      "--data", str(data), "--vocab", str(vocab_file), "--json", str(out)])
    bench.main()
    report = json.loads(out.read_text())
    assert [r["models"] for r in report["subsets"]] == [[0], [1], [2], [0, 1], [0, 2], [1, 2], [0, 1, 2]]
    probs = []
    for path in [tiny_checkpoints.sentiment, *members]:
        model, vocab = loaded(path)
        probs.append(torch.softmax(torch.from_numpy(run_texts(model, vocab, TEXTS)), -1).numpy())
    for row in report["subsets"]:
        want = np.mean([probs[k] for k in row["models"]], axis=0).argmax(-1) == np.array(labels)
        assert row["accuracy"] == round(100 * want.mean(), 2)
    assert len(report["mean_entropy"]) == 3 and "0+1+2" in capsys.readouterr().out

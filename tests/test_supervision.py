"""disan.supervision: the labelled losses a distilled student may add (CoSENT, NLI triples)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from disan import supervision  # noqa: E402
from disan.recipes import HOLDOUT_SEED, HOLDOUT_SIZE, RECIPES  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def test_cosent_rewards_the_scores_order() -> None:
    scores = torch.tensor([0.9, 0.5, 0.1])
    right = supervision.cosent_loss(torch.tensor([0.8, 0.4, 0.0]), scores)
    wrong = supervision.cosent_loss(torch.tensor([0.0, 0.4, 0.8]), scores)
    assert right < wrong
    # Only the order counts: a shift of every cosine leaves the loss as it was.
    shifted = supervision.cosent_loss(torch.tensor([0.7, 0.3, -0.1]), scores)
    torch.testing.assert_close(right, shifted)


def test_cosent_of_equal_scores_is_zero() -> None:
    # No pair is ordered, so only the log(1 + 0) term is left.
    loss = supervision.cosent_loss(torch.tensor([0.3, -0.2]), torch.tensor([0.5, 0.5]))
    assert float(loss) == 0.0


def test_unknown_pair_loss_is_named() -> None:
    pairs = supervision.ScoredPairs.__new__(supervision.ScoredPairs)
    pairs.left = pairs.right = [[2], [2]]
    pairs.scores = torch.tensor([0.1, 0.9])
    encoder = torch.nn.Embedding(3, 4)
    encoder.forward = lambda ids, mask: torch.nn.functional.embedding(ids, encoder.weight).mean(1)
    with pytest.raises(ValueError, match="mse, cosent"):
        pairs.loss(encoder, np.random.default_rng(0), 2, "hinge")


@pytest.mark.skipif(not (DATA / RECIPES["nli"]["holdout_from"]).is_file(), reason="staged data not here")
def test_nli_triples_leave_out_the_held_out_slice() -> None:
    from disan.data import holdout_split, read_examples

    triples = supervision.nli_triples(DATA)
    assert len(triples) > 1000
    _, dev = read_examples(DATA / RECIPES["nli"]["holdout_from"])
    _, held = holdout_split(dev, HOLDOUT_SIZE, HOLDOUT_SEED)
    held_premises = {ex.texts[0] for ex in held}
    assert not held_premises & {t[0] for t in triples}
    # Every triple is a real (entailment, contradiction) pair of its premise.
    labels = {(ex.texts[0], ex.texts[1]): ex.label for ex in dev}
    from_dev = [t for t in triples if (t[0], t[1]) in labels]
    assert from_dev and all(labels[(p, pos)] == "entailment" and labels[(p, neg)] == "contradiction"
                            for p, pos, neg in from_dev)


def _phrases(root: Path, rows: list[tuple[str, int]]) -> Path:
    import gzip
    import json

    path = root / RECIPES["sst5"]["train"][0]
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows)
    path.write_bytes(gzip.compress(lines.encode()))
    return root


def test_sentiment_phrases_leave_out_short_and_evaluation_text(tmp_path: Path, monkeypatch) -> None:
    from disan.text import Vocab

    monkeypatch.setattr(supervision, "eval_keys", lambda _data: {"a dev sentence here"})
    data = _phrases(tmp_path, [("good", 3), ("very good", 4), ("a good film", 4),
                               ("A dev sentence here", 1), ("a bad film", 0)])
    phrases = supervision.SentimentPhrases(data, Vocab("a good bad film".split()))
    assert len(phrases) == 2 and phrases.excluded == 1
    assert phrases.labels.tolist() == [4, 0]


def test_sentiment_head_learns_what_the_vector_carries(tmp_path: Path, monkeypatch) -> None:
    from disan.text import Vocab

    monkeypatch.setattr(supervision, "eval_keys", lambda _data: set())
    data = _phrases(tmp_path, [("a good film", 4), ("a bad film", 0)] * 8)
    phrases = supervision.SentimentPhrases(data, Vocab("a good bad film".split()))
    encoder = torch.nn.Embedding(6, 8)
    encoder.forward = lambda ids, mask: torch.nn.functional.embedding(ids, encoder.weight).mean(1)
    head = torch.nn.Linear(8, supervision.SENTIMENT_CLASSES)
    optimizer = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=0.05)
    rng = np.random.default_rng(0)
    first = float(phrases.loss(encoder, head, rng, 8))
    for _ in range(60):
        optimizer.zero_grad()
        loss = phrases.loss(encoder, head, rng, 8)
        loss.backward()
        optimizer.step()
    assert first > 1.0 and float(loss) < 0.1  # the two labels are told apart from the vector


def test_no_sentiment_phrases_is_named(tmp_path: Path, monkeypatch) -> None:
    from disan.text import Vocab

    monkeypatch.setattr(supervision, "eval_keys", lambda _data: set())
    data = _phrases(tmp_path, [("good", 3), ("very good", 4)])
    with pytest.raises(ValueError, match="no SST-5 training phrases"):
        supervision.SentimentPhrases(data, Vocab(["good"]))

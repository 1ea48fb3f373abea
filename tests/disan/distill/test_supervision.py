"""disan.distill.supervision: the labelled losses a distilled student may add (CoSENT, NLI triples, NLI
classes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from disan.data.recipes import HOLDOUT_SEED, HOLDOUT_SIZE, RECIPES  # noqa: E402
from disan.distill import supervision  # noqa: E402

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"


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
    from disan.data.readers import holdout_split, read_examples

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
    from disan.text.tokenizer import Vocab

    monkeypatch.setattr(supervision, "eval_keys", lambda _data: {"a dev sentence here"})
    data = _phrases(tmp_path, [("good", 3), ("very good", 4), ("a good film", 4),
                               ("A dev sentence here", 1), ("a bad film", 0)])
    phrases = supervision.SentimentPhrases(data, Vocab("a good bad film".split()))
    assert len(phrases) == 2 and phrases.excluded == 1
    assert phrases.labels.tolist() == [4, 0]


def test_sentiment_head_learns_what_the_vector_carries(tmp_path: Path, monkeypatch) -> None:
    from disan.text.tokenizer import Vocab

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


class _MeanEncoder(torch.nn.Module):
    """Mean of word vectors, with a dropout that shows whether the probe reads in eval mode."""

    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.embed = torch.nn.Embedding(rows, dim)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, ids, mask):
        return self.drop(self.embed(ids)).mean(1)


def around_the_probe(term, encoder: _MeanEncoder, head: torch.nn.Linear) -> tuple[float, float, float]:
    """(the loss at the random head, the probe's accuracy, the loss at the probed head), each loss read
    without dropout and the probe run with it on (it must turn it off itself)."""
    rng = np.random.default_rng(0)
    encoder.drop.p = 0.0
    at_random = float(term.loss(encoder, head, rng, 16))
    encoder.drop.p = 0.5
    accuracy = term.probe(encoder, head)
    encoder.drop.p = 0.0
    return at_random, accuracy, float(term.loss(encoder, head, rng, 16))


@pytest.mark.parametrize("labels", [(4, 0), (4, 0, 2)])
def test_probe_starts_the_head_where_it_reads_the_vector(tmp_path: Path, monkeypatch, labels) -> None:
    from disan.text.tokenizer import Vocab

    monkeypatch.setattr(supervision, "eval_keys", lambda _data: set())
    words = ["good", "bad", "dull"][: len(labels)]
    data = _phrases(tmp_path, [(f"a {w} film", y) for w, y in zip(words, labels, strict=True)] * 8)
    phrases = supervision.SentimentPhrases(data, Vocab(["a", "film", *words]))
    torch.manual_seed(0)
    encoder = _MeanEncoder(8, 16).train()
    head = torch.nn.Linear(16, supervision.SENTIMENT_CLASSES)
    at_random, accuracy, probed = around_the_probe(phrases, encoder, head)
    assert accuracy == 1.0 and encoder.training  # read without dropout; the mode is given back
    assert at_random > 1.0 and probed < 0.5 * at_random
    with torch.no_grad():  # a class no phrase has is never the head's answer
        served = torch.randn(4, 16)
        assert set(head(served).argmax(-1).tolist()) <= set(labels)


def test_no_sentiment_phrases_is_named(tmp_path: Path, monkeypatch) -> None:
    from disan.text.tokenizer import Vocab

    monkeypatch.setattr(supervision, "eval_keys", lambda _data: set())
    data = _phrases(tmp_path, [("good", 3), ("very good", 4)])
    with pytest.raises(ValueError, match="no SST-5 training phrases"):
        supervision.SentimentPhrases(data, Vocab(["good"]))


@pytest.mark.skipif(not (DATA / RECIPES["nli"]["holdout_from"]).is_file(), reason="staged data not here")
def test_nli_classes_leave_out_sick_train() -> None:
    from disan.data.readers import nli_training_examples, read_examples
    from disan.text.tokenizer import Vocab

    every = nli_training_examples(DATA)
    kept = supervision.NLIClasses(DATA, Vocab(["a", "man"]))
    _, sick = read_examples(DATA / "senteval/SICK/sick_train.jsonl.gz")
    assert len(kept) == len(every) - len(sick) > 1000  # the SICK-E transfer task fits on SICK train
    assert set(kept.labels.tolist()) == {0, 1, 2}


def test_nli_head_reads_the_pair_features_and_is_probed_first(monkeypatch) -> None:
    from disan.data.readers import Example
    from disan.text.tokenizer import Vocab

    hypotheses = {"entailment": "a good film", "neutral": "a long film", "contradiction": "a bad film"}
    examples = [Example((("a", "good", "film"), tuple(text.split())), label, "x:1")
                for label, text in hypotheses.items()] * 8
    monkeypatch.setattr(supervision, "nli_training_examples", lambda _data, skip=(): examples)
    pairs = supervision.NLIClasses(Path("."), Vocab("a good long bad film".split()))
    torch.manual_seed(0)
    encoder = _MeanEncoder(8, 16).train()
    head = torch.nn.Linear(4 * 16, supervision.NLI_CLASSES)
    at_random, accuracy, probed = around_the_probe(pairs, encoder, head)
    assert accuracy == 1.0 and encoder.training  # read without dropout; the mode is given back
    assert probed < 0.5 * at_random
    assert pairs.labels.tolist()[:3] == [0, 1, 2]  # the manifest's NLI label order

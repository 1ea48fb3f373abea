"""disan.distill.supervision.StudentLabels: the STS, sentiment and NLI labels a student phase may keep
learning (--scored-weight, --sentiment-weight, --nli-weight, --nli-classes-weight), beside its teacher
and pairs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("sklearn", reason="the sentiment head's probe: pip install '.[train]'")

from student_tiny import WORDS, tiny_fixture  # noqa: E402, F401  (the `tiny` fixture)

from disan.data.readers import Example  # noqa: E402
from disan.data.recipes import RECIPES  # noqa: E402
from disan.distill import supervision  # noqa: E402
from disan.distill.student.config import StudentConfig  # noqa: E402
from disan.distill.student.train import train_student  # noqa: E402
from disan.text.pieces import PieceTokenizer  # noqa: E402
from disan.train.checkpoint import load_checkpoint  # noqa: E402


@pytest.fixture
def labelled(tmp_path, monkeypatch):
    """Staged data with SST-5 train phrases and (through `train_pairs`) scored train pairs."""
    rng = np.random.default_rng(0)
    phrases = [(" ".join(rng.choice(WORDS, 5)), int(rng.integers(0, 5))) for _ in range(40)]
    path = tmp_path / "data" / RECIPES["sst5"]["train"][0]
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress("".join(json.dumps({"text": t, "label": y}) + "\n"
                                           for t, y in phrases).encode()))
    left = [" ".join(rng.choice(WORDS, 4)) for _ in range(30)]
    right = [" ".join(rng.choice(WORDS, 4)) for _ in range(30)]
    scores = rng.uniform(size=30).astype(np.float32)
    monkeypatch.setattr(supervision, "train_pairs", lambda _data: (left, right, scores))
    triples = [tuple(tuple(rng.choice(WORDS, 4)) for _ in range(3)) for _ in range(20)]
    monkeypatch.setattr(supervision, "nli_triples", lambda _data: triples)
    examples = [Example((tuple(rng.choice(WORDS, 4)), tuple(rng.choice(WORDS, 4))), label, "x:1")
                for label in ("entailment", "neutral", "contradiction") for _ in range(10)]
    monkeypatch.setattr(supervision, "nli_training_examples", lambda _data, skip=(): examples)
    monkeypatch.setattr(supervision, "eval_keys", lambda _data: set())
    return tmp_path / "data"


def trained_start(tiny, tmp_path: Path, steps: int) -> tuple[dict, Path]:
    """(the tiny run's flags, a student trained with them) for a labelled phase to start from."""
    root, path = tiny
    values = dict(corpus=root / "corpus", tokenizer=path, embed_dim=8, d_h=8, proj_dim=16, dims=(16, 8),
                  batch_size=16, pairs_batch=8, steps=steps, val_rows=16, eval_every=steps // 2, lr=1e-2,
                  labels_batch=8)
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    train_student(StudentConfig(out=tmp_path / "one", **values), teacher_encode=table)
    return values, tmp_path / "one" / "student.pt"


def logged(run: Path) -> list[dict]:
    """The rows of RUN/metrics.jsonl, the start's first."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_phase_learns_the_labels_beside_its_teacher_and_resumes_with_its_head(tiny, labelled,
                                                                                  tmp_path) -> None:
    values, start = trained_start(tiny, tmp_path, steps=6)
    phase = dict(values, init=start, data=labelled, scored_weight=1.0, sentiment_weight=2.0)
    whole = train_student(StudentConfig(out=tmp_path / "labels", **phase))
    rows = logged(tmp_path / "labels")
    assert 0.0 <= rows[0]["sentiment_probe"] <= 1.0  # the head was probed on the start's vectors
    assert {"scored", "sentiment"} <= set(whole)
    plain = train_student(StudentConfig(out=tmp_path / "plain", **dict(values, init=start)))
    assert "scored" not in plain
    a = load_checkpoint(tmp_path / "labels" / "student.pt")["model_state"]
    b = load_checkpoint(tmp_path / "plain" / "student.pt")["model_state"]
    assert not torch.equal(a["proj.weight"], b["proj.weight"])  # the labels moved the encoder
    assert "sentiment" not in "".join(a)  # the training-only head is not in the student

    # a resumed run takes its head back from state.pt and ends where one run ends
    train_student(StudentConfig(out=tmp_path / "two", **dict(phase, max_minutes=0.0)))
    state = torch.load(tmp_path / "two" / "state.pt", weights_only=False)
    assert state["labels_head"]["sentiment.weight"].shape == (supervision.SENTIMENT_CLASSES, 16)
    with pytest.raises(ValueError, match="other sentiment_weight"):
        train_student(StudentConfig(out=tmp_path / "two", resume=True, **dict(phase, sentiment_weight=1.0)))
    resumed = train_student(StudentConfig(out=tmp_path / "two", resume=True, **phase))
    assert resumed["val_cosine"] == pytest.approx(whole["val_cosine"], abs=1e-4)


def test_a_phase_learns_nli_triples_and_resumes_only_with_the_same_weight(tiny, labelled, tmp_path) -> None:
    values, start = trained_start(tiny, tmp_path, steps=4)
    phase = dict(values, init=start, data=labelled, nli_weight=1.0)
    nli = train_student(StudentConfig(out=tmp_path / "nli", **phase))
    assert nli["nli"] > 0.0 and "scored" not in nli
    plain = train_student(StudentConfig(out=tmp_path / "plain", **dict(values, init=start)))
    assert "nli" not in plain
    a = load_checkpoint(tmp_path / "nli" / "student.pt")["model_state"]
    b = load_checkpoint(tmp_path / "plain" / "student.pt")["model_state"]
    assert not torch.equal(a["proj.weight"], b["proj.weight"])  # the triples moved the encoder
    with pytest.raises(ValueError, match="other nli_weight"):
        train_student(StudentConfig(out=tmp_path / "nli", resume=True, **dict(phase, nli_weight=0.5)))


def test_a_phase_learns_the_nli_classes_beside_the_sentiment_and_resumes_with_both_heads(tiny, labelled,
                                                                                         tmp_path) -> None:
    values, start = trained_start(tiny, tmp_path, steps=4)
    phase = dict(values, init=start, data=labelled, sentiment_weight=1.0, nli_classes_weight=1.0)
    whole = train_student(StudentConfig(out=tmp_path / "classes", **phase))
    rows = logged(tmp_path / "classes")
    assert 0.0 <= rows[0]["nli_classes_probe"] <= 1.0 and 0.0 <= rows[0]["sentiment_probe"] <= 1.0
    assert whole["nli_classes"] > 0.0 and "nli" not in whole
    train_student(StudentConfig(out=tmp_path / "plain", **dict(values, init=start, data=labelled,
                                                               sentiment_weight=1.0)))
    a = load_checkpoint(tmp_path / "classes" / "student.pt")["model_state"]
    b = load_checkpoint(tmp_path / "plain" / "student.pt")["model_state"]
    assert not torch.equal(a["proj.weight"], b["proj.weight"])  # the classes moved the encoder
    assert not any("nli_classes" in k for k in a)  # the training-only head is not in the student
    state = torch.load(tmp_path / "classes" / "state.pt", weights_only=False)
    assert state["labels_head"]["nli_classes.weight"].shape == (supervision.NLI_CLASSES, 4 * 16)
    with pytest.raises(ValueError, match="other nli_classes_weight"):
        train_student(StudentConfig(out=tmp_path / "classes", resume=True,
                                    **dict(phase, nli_classes_weight=0.5)))


def test_a_state_from_before_the_nli_classes_gives_its_sentiment_head_back(tiny, labelled, tmp_path) -> None:
    root, path = tiny
    cfg = StudentConfig(corpus=root / "corpus", out=tmp_path, tokenizer=path, data=labelled,
                        sentiment_weight=1.0)
    labels = supervision.StudentLabels(cfg, PieceTokenizer.from_file(path), out_dim=16)
    old = {"weight": torch.ones(supervision.SENTIMENT_CLASSES, 16), "bias": torch.zeros(5)}
    labels.load_state(old)  # the sentiment head's own state_dict, as state.pt held it
    assert torch.equal(labels.heads["sentiment"].weight, old["weight"])


def test_labels_need_the_staged_data(tmp_path) -> None:
    for weights in ({"scored_weight": 1.0}, {"sentiment_weight": 0.5}, {"nli_weight": 0.5},
                    {"nli_classes_weight": 0.5}):
        with pytest.raises(ValueError, match="give --data"):
            StudentConfig(corpus=tmp_path, out=tmp_path, **weights)
    for weights in ({"scored_weight": -1.0}, {"nli_weight": -0.5}, {"nli_classes_weight": -0.1}):
        with pytest.raises(ValueError, match="0 or more"):
            StudentConfig(corpus=tmp_path, out=tmp_path, data=tmp_path, **weights)


def test_a_fresh_run_without_a_fitted_head_still_probes_the_sentiment_head(tiny, labelled, tmp_path,
                                                                           monkeypatch) -> None:
    root, path = tiny
    probed = []
    monkeypatch.setattr(supervision.SentimentPhrases, "probe", lambda self, encoder, head: probed.append(1))
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    train_student(StudentConfig(corpus=root / "corpus", out=tmp_path / "fresh", tokenizer=path, embed_dim=8,
                                d_h=8, proj_dim=16, dims=(16, 8), batch_size=16, pairs_batch=8, steps=2,
                                val_rows=16, eval_every=2, fit_head_rows=0, data=labelled,
                                sentiment_weight=1.0, labels_batch=8), teacher_encode=table)
    assert probed == [1]

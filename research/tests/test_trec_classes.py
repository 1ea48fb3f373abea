"""research/analyses/trec_classes.py: the transfer probe's TREC accuracy split by question type, and the
questions a baseline gets right that DiSAN gets wrong."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

pytest.importorskip("sklearn")

from research.analyses import trec_classes as bench  # noqa: E402

TYPES = ["DESC", "HUM", "LOC", "NUM"]
WORDS = {"DESC": "what is", "HUM": "who was", "LOC": "where is", "NUM": "how many"}


def write(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def questions(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = TYPES[i % len(TYPES)]
        rows.append({"text": f"{WORDS[label]} the {rng.choice(['film', 'man', 'river', 'guitar'])} {i} ?",
                     "label": label})
    return rows


@pytest.mark.parametrize("protocol", ["fixed", "tuned"])
def test_types_split_the_probe_accuracy(tiny_bundle, tmp_path, monkeypatch, protocol):
    data = tmp_path / "data"
    train, test = questions(80, 0), questions(24, 1)
    write(data / "senteval/TREC/trec_train.jsonl.gz", train)
    write(data / "senteval/TREC/trec_test.jsonl.gz", test)
    label_of = {r["text"]: r["label"] for r in train + test}

    def oracle() -> object:  # a baseline that reads the type off the text: right on every question
        return lambda texts: np.array([[float(label_of[t] == k) for k in TYPES] for t in texts])

    monkeypatch.setitem(bench.transfer.BASELINES, "oracle", ("an oracle", oracle))
    out = tmp_path / "trec.json"
    assert bench.main(["--bundle", str(tiny_bundle), "--data", str(data), "--baselines", "oracle",
                       "--protocol", protocol, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["protocol"] == protocol
    assert report["accuracy"]["oracle"] == 100.0
    assert {t: row["questions"] for t, row in report["per_type"].items()} == {t: 6 for t in TYPES}
    # the overall accuracy is the question-weighted mean of the types'
    overall = sum(row["disan"] * row["questions"] for row in report["per_type"].values()) / len(test)
    assert report["accuracy"]["disan"] == pytest.approx(overall, abs=0.02)
    lost = report["disan_wrong_baseline_right"]["oracle"]
    assert lost["count"] == round(len(test) * (1 - report["accuracy"]["disan"] / 100))
    assert all(e["disan"] != e["gold"] for e in lost["examples"])


def test_an_unknown_baseline_is_named(tiny_bundle, tmp_path):
    with pytest.raises(ValueError, match="--baselines"):
        bench.main(["--bundle", str(tiny_bundle), "--data", str(tmp_path), "--baselines", "bert",
                    "--json", str(tmp_path / "x.json")])


def test_a_checkpoint_is_scored_instead_of_the_bundle(tmp_path, monkeypatch):
    """--checkpoint scores a student before export (in torch); the bundle is not read."""
    data = tmp_path / "data"
    train, test = questions(40, 0), questions(12, 1)
    write(data / "senteval/TREC/trec_train.jsonl.gz", train)
    write(data / "senteval/TREC/trec_test.jsonl.gz", test)
    label_of = {r["text"]: r["label"] for r in train + test}
    loaded = []

    def fake_checkpoint(path):
        loaded.append(path)
        return lambda texts: np.array([[float(label_of[t] == k) for k in TYPES] for t in texts])

    monkeypatch.setattr(bench, "checkpoint_encoder", fake_checkpoint)
    out = tmp_path / "trec.json"
    assert bench.main(["--checkpoint", str(tmp_path / "best.pt"), "--bundle", str(tmp_path / "absent"),
                       "--data", str(data), "--baselines", "", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert loaded == [tmp_path / "best.pt"] and report["checkpoint"] == str(tmp_path / "best.pt")
    assert report["accuracy"] == {"disan": 100.0} and "bundle" not in report

"""research/analyses/sentiment_served.py: a sentiment checkpoint scored in PyTorch as a bundle serves it (its
vocabulary, its tables and matrices as stored), so runs can be compared before one is exported."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import WORDS, make_tiny_checkpoint

from disan.text.tokenizer import Vocab

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from disan import Encoder  # noqa: E402
from disan.cli import main as disan_main  # noqa: E402
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from model_export.export import ExportConfig, build_bundle  # noqa: E402
from research.analyses import sentiment_served as bench  # noqa: E402

ONLY_EMBED = ["violin", "piano", "sunset", "harbor"]  # words only the encoder knows: read through the map
TEXTS = ["the film was good", "a man is playing the violin", "piano sunset harbor", "the movie was bad",
         "not good , really bad !", "a woman is cutting an onion"]
LABELS = [3, 2, 1, 0, 0, 4]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_checkpoints) -> tuple[Path, Path]:
    """(a sentiment checkpoint that borrows an encoder's words, a bundle built from it whose
    tables and matrices are stored in every rounded kind: int8, int8 with an int4 tail, fp16)."""
    root = tmp_path_factory.mktemp("served")
    words = ONLY_EMBED[:2] + list(reversed(WORDS)) + ONLY_EMBED[2:]
    lender = make_tiny_checkpoint(root / "student.pt", "encoder", Vocab(words), [], seed=5, proj_dim=24,
                                  embed_dim=12)
    borrowed = root / "sentiment.pt"
    assert disan_main(["distill", "borrow-words", str(tiny_checkpoints.sentiment), str(lender),
                       str(borrowed)]) == 0
    bundle = root / "bundle"
    build_bundle(ExportConfig(tiny_checkpoints.nli, borrowed, bundle, embed=lender, sets=("cpu",),
                              embedding_storage="int8,nli=fp16,embed=int8+int4:5",
                              matrix_storage="fp16"), log=lambda *_: None)
    return borrowed, bundle


def test_the_checkpoint_scores_what_the_bundle_serves(setup):
    borrowed, bundle = setup
    vocab = Vocab.load(bundle / "vocab.json")
    weights = json.loads((bundle / "manifest.json").read_text())["weights"]
    got = bench.probabilities(bench.served_model(borrowed, weights), vocab, TEXTS)
    served = Encoder(bundle, providers="cpu").sentiment(TEXTS)
    labels = load_checkpoint(borrowed)["labels"]
    want = np.array([[r["scores"][k] for k in labels] for r in served])
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
    # as trained (no rounding) the same checkpoint reads differently: the rounding is what matches
    raw = model_from_checkpoint(load_checkpoint(borrowed))[0].eval()
    assert np.abs(bench.probabilities(raw, vocab, TEXTS) - want).max() > 1e-5


def test_the_report_gives_each_checkpoint_its_accuracy_on_each_file(setup, tmp_path, monkeypatch, capsys):
    borrowed, bundle = setup
    data = tmp_path / "dev.jsonl.gz"
    with gzip.open(data, "wt") as f:
        f.writelines(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(TEXTS, LABELS, strict=True))
    out = tmp_path / "report.json"
    monkeypatch.setattr(sys, "argv", ["x", str(borrowed), str(borrowed), "--bundle", str(bundle),
                                      "--data", str(data), "--json", str(out)])
    bench.main()
    report = json.loads(out.read_text())
    served = Encoder(bundle, providers="cpu").sentiment(TEXTS)
    names = load_checkpoint(borrowed)["labels"]
    hits = [names.index(r["label"]) == y for r, y in zip(served, LABELS, strict=True)]
    want = round(100 * float(np.mean(hits)), 2)
    assert report["n"] == {"dev.jsonl.gz": len(TEXTS)}
    assert [run["dev.jsonl.gz"] for run in report["runs"]] == [want, want]
    assert str(borrowed) in capsys.readouterr().out


def test_subsets_score_the_mean_of_the_probabilities_and_probs_keeps_them(setup, tiny_checkpoints, tmp_path):
    borrowed, bundle = setup
    data = tmp_path / "dev.jsonl.gz"
    with gzip.open(data, "wt") as f:
        f.writelines(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(TEXTS, LABELS, strict=True))
    pair = [borrowed, tiny_checkpoints.sentiment]
    report = bench.score(pair, bundle, [data], with_subsets=True, probs_out=tmp_path / "probs.npz")
    weights, vocab = bench.read_bundle(bundle)
    probs = [bench.probabilities(bench.served_model(p, weights), vocab, TEXTS) for p in pair]
    with np.load(tmp_path / "probs.npz") as saved:
        assert sorted(saved.files) == ["dev.jsonl.gz/0", "dev.jsonl.gz/1", "dev.jsonl.gz/labels"]
        np.testing.assert_array_equal(saved["dev.jsonl.gz/1"], probs[1])
        assert saved["dev.jsonl.gz/labels"].tolist() == LABELS
    mean_hits = (np.mean(probs, axis=0).argmax(-1) == np.array(LABELS)).mean()
    rows = {tuple(r["models"]): r["accuracy"] for r in report["subsets"]["dev.jsonl.gz"]}
    assert rows == {(0,): report["runs"][0]["dev.jsonl.gz"], (1,): report["runs"][1]["dev.jsonl.gz"],
                    (0, 1): round(100 * float(mean_hits), 2)}
    assert "subsets" not in bench.score(pair, bundle, [data])


def test_bad_input_is_a_one_line_error(setup, tiny_checkpoints, tmp_path, monkeypatch, capsys):
    borrowed, bundle = setup
    data = tmp_path / "dev.jsonl.gz"
    with gzip.open(data, "wt") as f:
        f.write(json.dumps({"text": "good", "label": 3}) + "\n")
    for checkpoint, message in ((tiny_checkpoints.nli, "a sentiment checkpoint, not task 'nli'"),
                                (tmp_path / "nope.pt", "nope.pt")):
        monkeypatch.setattr(sys, "argv", ["x", str(checkpoint), "--bundle", str(bundle), "--data", str(data)])
        with pytest.raises(SystemExit) as exit_:
            bench.main()
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and message in err and len(err.splitlines()) == 1, err

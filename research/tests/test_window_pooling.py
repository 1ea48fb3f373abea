"""research.window_pooling: each pooling scored from one pass of window vectors; at the served lead
its scores are those `disan eval --retrieval` gives the bundle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disan.eval.encoders import disan_encoder
from disan.eval.retrieval import evaluate_set, load_set
from disan.runtime.encoder import Encoder
from disan.text.windowing import EMBEDDING_LEAD
from research.window_pooling import pooled_scores

pytest.importorskip("pytrec_eval", reason="pytrec_eval is not installed (pip install '.[eval]')")
pytest.importorskip("onnxruntime")

# Words of tests/conftest.py's tiny vocabulary; two documents longer than the 128-token window
# whose windows say different things.
DOCS = [
    {"_id": "d1", "title": "dog", "text": "a dog is running in the park"},
    {"_id": "d2", "title": "guitar", "text": "a man is playing the guitar in the street"},
    {"_id": "long1", "title": "rain",
     "text": "the children are walking in the rain . " * 12 + "a boring movie with a terrible plot . " * 12},
    {"_id": "long2", "title": "book",
     "text": "the woman is reading a book at the table . " * 12 + "a dog is running in the park . " * 12},
]
QUERIES = [{"_id": "q1", "text": "dog running"}, {"_id": "q2", "text": "children walking in the rain"},
           {"_id": "q3", "text": "woman reading a book"}]
QRELS = [("q1", "d1", 1), ("q2", "long1", 1), ("q3", "long2", 1)]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    (tmp_path / "qrels" / "test.tsv").write_text("".join(f"{q}\t{d}\t{s}\n" for q, d, s in QRELS))
    return tmp_path


def test_the_served_lead_scores_as_the_evaluation_does(tiny_bundle, folder):
    report = pooled_scores(Encoder(tiny_bundle), folder, [1.0, EMBEDDING_LEAD])
    assert report["docs"] == 4 and report["windows"] > 4  # the long documents were windowed
    served = evaluate_set(load_set(folder), disan_encoder(tiny_bundle))
    for key, value in report["raw"][str(EMBEDDING_LEAD)].items():
        assert value == pytest.approx(served[key], abs=1e-4)
    assert set(report["unit"]) == {"1.0", str(EMBEDDING_LEAD)}

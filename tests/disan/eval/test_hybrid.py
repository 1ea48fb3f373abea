"""disan.eval.hybrid and `disan eval --retrieval --hybrid W`: dense cosine plus the sparse dot of
the bundle's lexical vectors, ranked exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_retrieval import beir_folder, needs_pytrec_eval

from disan.cli import main
from disan.eval.hybrid import Postings, hybrid_top_k


def random_sparse(rng, vocab: int, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for _ in range(n):
        idx = np.sort(rng.choice(vocab, size=int(rng.integers(0, 6)), replace=False)).astype(np.int64)
        out.append((idx, rng.random(len(idx)).astype(np.float32)))
    return out


def dense_of(vectors, vocab: int) -> np.ndarray:
    out = np.zeros((len(vectors), vocab), np.float32)
    for row, (idx, val) in enumerate(vectors):
        out[row, idx] = val
    return out


def test_postings_score_as_the_dense_dot_product():
    rng = np.random.default_rng(0)
    docs, queries = random_sparse(rng, 30, 40), random_sparse(rng, 30, 7)
    postings = Postings(docs)
    want = dense_of(queries, 30) @ dense_of(docs, 30).T
    got = np.stack([postings.scores(q) for q in queries])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert Postings([]).scores(queries[0]).shape == (0,)


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_hybrid_top_k_ranks_by_the_weighted_sum(weight):
    rng = np.random.default_rng(1)
    docs, queries = random_sparse(rng, 25, 50), random_sparse(rng, 25, 9)
    d_dense, q_dense = rng.normal(size=(50, 4)).astype(np.float32), rng.normal(size=(9, 4)).astype(np.float32)
    scores = (1 - weight) * (q_dense @ d_dense.T) + weight * (dense_of(queries, 25) @ dense_of(docs, 25).T)
    idx, val = hybrid_top_k(q_dense, d_dense, queries, Postings(docs), weight, k=10, cells=120)  # 2 per block
    want = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    np.testing.assert_allclose(val, np.take_along_axis(scores, want, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.take_along_axis(scores, idx, 1), np.take_along_axis(scores, want, 1))
    with pytest.raises(ValueError, match="from 0 to 1"):
        hybrid_top_k(q_dense, d_dense, queries, Postings(docs), 1.5, k=10)


def test_cli_scores_each_weight_beside_the_dense_row(sparse_bundle: Path, tmp_path: Path, capsys):
    needs_pytrec_eval()
    folder = beir_folder(tmp_path / "alpha")
    out = tmp_path / "report.json"
    assert main(["eval", "--retrieval", str(folder), "--bundle", str(sparse_bundle), "--baselines", "",
                 "--report", str(out), "--hybrid", "0.5", "1"]) == 0
    stdout = capsys.readouterr().out
    label = f"DiSAN ({sparse_bundle})"
    assert f"| {label}, hybrid 0.5 | " in stdout and f"| {label}, hybrid 1.0 | " in stdout
    row = json.loads(out.read_text())["models"][label]["alpha"]
    assert set(row["hybrid"]) == {"0.5", "1.0"}
    assert all(0 < row["hybrid"][w]["ndcg@10"] <= 1 for w in row["hybrid"])


@pytest.mark.parametrize(("flags", "message"), [
    (["--hybrid", "0"], "--hybrid 0.0: a weight above 0, at most 1"),
    (["--hybrid", "0.5"], "has no lexical table (python -m model_export.lexical)"),
])
def test_cli_hybrid_errors_are_one_line(tiny_bundle: Path, tmp_path: Path, capsys, flags, message):
    needs_pytrec_eval()
    folder = beir_folder(tmp_path / "alpha")
    assert main(["eval", "--retrieval", str(folder), "--bundle", str(tiny_bundle), "--baselines", "",
                 *flags]) == 2
    assert message in capsys.readouterr().err



def test_a_hybrid_run_tokenizes_each_text_once(sparse_bundle: Path, tmp_path: Path, monkeypatch, capsys):
    """The dense and the sparse vectors read the same token ids: `disan eval --hybrid` prepares
    each text once (it tokenized every document and query a second time for the sparse pass), and
    its scores are those of the sparse vectors `Encoder.encode_sparse` gives."""
    needs_pytrec_eval()
    from disan.eval import retrieval
    from disan.runtime.encoder import Encoder

    prepared: list[str] = []
    prepare = Encoder.prepare

    def counted(self, texts, *args, **kwargs):
        prepared.extend(texts)
        return prepare(self, texts, *args, **kwargs)

    monkeypatch.setattr(Encoder, "prepare", counted)
    folder = beir_folder(tmp_path / "alpha")
    out = tmp_path / "report.json"
    assert main(["eval", "--retrieval", str(folder), "--bundle", str(sparse_bundle), "--baselines", "",
                 "--report", str(out), "--hybrid", "0.5"]) == 0
    dataset = retrieval.load_set(folder)
    assert sorted(prepared) == sorted(dataset.docs + dataset.queries)
    monkeypatch.setattr(Encoder, "prepare", prepare)
    encoder = Encoder(sparse_bundle, long_texts="window")
    want = retrieval.evaluate_set(dataset, lambda t: encoder.encode(t, normalize=True),
                                  sparse=encoder.encode_sparse, hybrid=[0.5])
    got = json.loads(out.read_text())["models"][f"DiSAN ({sparse_bundle})"]["alpha"]
    assert got["hybrid"] == want["hybrid"]

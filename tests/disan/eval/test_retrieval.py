"""`disan eval --retrieval` (disan.eval.retrieval): BEIR-layout folders read in both layouts, exact top-k
ranking, the metrics against pytrec_eval and known values, and the command's report and errors."""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from disan.cli import main
from disan.eval.retrieval import (
    cut,
    evaluate_set,
    format_table,
    load_set,
    metrics,
    read_qrels,
    top_k,
)


def needs_pytrec_eval():
    return pytest.importorskip("pytrec_eval", reason="pytrec_eval is not installed (pip install '.[eval]')")


# Tiny words of tests/conftest.py's WORDS, so the tiny bundle knows them.
DOCS = [
    {"_id": "d1", "title": "dog", "text": "a dog is running in the park"},
    {"_id": "d2", "title": "", "text": "the woman is reading a book at the table"},
    {"_id": "d3", "title": "guitar", "text": "a man is playing the guitar in the street"},
    {"_id": "d4", "title": "film", "text": "a boring movie with a terrible plot"},
    # longer than the tiny bundle's 128-token window: embedded in windows, never truncated
    {"_id": "long", "title": "rain", "text": " ".join(["the children are walking in the rain ."] * 30)},
]
QUERIES = [{"_id": "q1", "text": "dog running"}, {"_id": "q2", "text": "man playing guitar"},
           {"_id": "q3", "text": "children walking in the rain"}, {"_id": "q4", "text": "not judged"}]
QRELS = [("q1", "d1", 1), ("q2", "d3", 2), ("q2", "d1", 1), ("q3", "long", 1)]


def write(path: Path, text: str, gz: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text, encoding="utf-8")


def beir_folder(root: Path, layout: str = "beir", gz: bool = False, header: bool = True) -> Path:
    """A BEIR folder: `beir` (qrels/test.tsv) or `flat` (qrels.tsv, the staged sets' layout)."""
    jsonl = lambda rows: "".join(json.dumps(r) + "\n" for r in rows)  # noqa: E731
    write(root / "corpus.jsonl", jsonl(DOCS), gz)
    write(root / "queries.jsonl", jsonl(QUERIES), gz)
    tsv = "".join(f"{q}\t{d}\t{s}\n" for q, d, s in QRELS)
    tsv = ("query-id\tcorpus-id\tscore\n" if header else "") + tsv
    write(root / ("qrels/test.tsv" if layout == "beir" else "qrels.tsv"), tsv, gz)
    return root


@pytest.mark.parametrize(("layout", "gz", "header"), [
    ("beir", False, True), ("beir", True, False), ("flat", True, True), ("flat", False, False)])
def test_load_reads_both_layouts_plain_or_gzipped(tmp_path: Path, layout: str, gz: bool, header: bool):
    folder = beir_folder(tmp_path / "set", layout, gz, header)
    s = load_set(folder)
    suffix = ".gz" if gz else ""
    assert s.files == {"corpus": "corpus.jsonl" + suffix, "queries": "queries.jsonl" + suffix,
                       "qrels": ("qrels/test.tsv" if layout == "beir" else "qrels.tsv") + suffix}
    assert s.name == "set"
    assert s.doc_ids == ["d1", "d2", "d3", "d4", "long"]
    assert s.docs[0] == "dog a dog is running in the park"  # title + " " + text
    assert s.docs[1] == "the woman is reading a book at the table"  # no title: no leading blank
    assert s.query_ids == ["q1", "q2", "q3"] and s.unjudged_queries == 1  # q4 has no judgements
    assert s.qrels == {"q1": {"d1": 1}, "q2": {"d3": 2, "d1": 1}, "q3": {"long": 1}}
    assert s.summary()["qrels"] == 4 and s.judged_missing == 0


def test_a_split_reads_its_own_judgements(tmp_path: Path):
    """`split`: qrels/SPLIT.tsv; the flat qrels.tsv stands only for the test split."""
    folder = beir_folder(tmp_path / "set")
    (folder / "qrels" / "dev.tsv.gz").write_bytes(gzip.compress(b"q2\td2\t1\n"))
    dev = load_set(folder, "dev")
    assert dev.files["qrels"] == "qrels/dev.tsv.gz"
    assert dev.qrels == {"q2": {"d2": 1}} and dev.query_ids == ["q2"] and dev.unjudged_queries == 3
    assert load_set(folder).qrels["q1"] == {"d1": 1}  # test, as before
    flat = beir_folder(tmp_path / "flat", "flat")
    assert load_set(flat).files["qrels"] == "qrels.tsv"
    with pytest.raises(ValueError, match=r"no qrels \(qrels/dev.tsv or qrels/dev.tsv.gz\)$"):
        load_set(flat, "dev")


def test_a_missing_split_names_the_ones_the_folder_has(tmp_path: Path):
    folder = beir_folder(tmp_path / "set")
    (folder / "qrels" / "test.tsv").rename(folder / "qrels" / "dev.tsv")
    (folder / "qrels" / "train.tsv.gz").write_bytes(gzip.compress(b"q1\td1\t1\n"))
    others = r"; it has --split dev, --split train$"
    with pytest.raises(ValueError, match=r"no qrels \(qrels/test.tsv .*\)" + others):
        load_set(folder)

def test_qrels_errors_name_the_line(tmp_path: Path):
    bad = tmp_path / "test.tsv"
    bad.write_text("q1\td1\t1\nq1\td2\tyes\n")
    with pytest.raises(ValueError, match=r"test.tsv:2: score 'yes' is not an integer"):
        read_qrels(bad)
    bad.write_text("q1\td1\n")
    with pytest.raises(ValueError, match=r"test.tsv:1: 3 columns expected"):
        read_qrels(bad)


def test_judged_query_missing_from_queries_is_an_error(tmp_path: Path):
    folder = beir_folder(tmp_path / "set")
    (folder / "qrels" / "test.tsv").write_text("q1\td1\t1\nq9\td1\t1\n")
    with pytest.raises(ValueError, match="1 judged queries are not in queries.jsonl"):
        load_set(folder)


def test_top_k_is_exact_in_blocks():
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(37, 8)).astype(np.float32)
    docs = rng.normal(size=(1000, 8)).astype(np.float32)
    full = queries @ docs.T
    want = np.argsort(-full, axis=1, kind="stable")[:, :100]
    for cells in (1 << 24, 5000, 150):  # one block; blocks of queries and documents; one query a block
        idx, scores = top_k(queries, docs, 100, cells=cells)
        np.testing.assert_array_equal(idx, want)
        np.testing.assert_allclose(scores, np.take_along_axis(full, want, 1), rtol=1e-6)
    idx, _ = top_k(queries, docs[:7], 100)  # fewer documents than k: all of them, ranked
    assert idx.shape == (37, 7)


def test_metrics_known_values():
    needs_pytrec_eval()
    qrels = {"q1": {"a": 2, "b": 1}, "q2": {"c": 1}}
    perfect = {"q1": {"a": 0.9, "b": 0.8, "x": 0.1}, "q2": {"c": 0.5, "y": 0.4}}
    assert metrics(qrels, perfect) == {"ndcg@10": 1.0, "mrr@10": 1.0, "recall@100": 1.0}
    # q1 swapped: trec_eval's nDCG takes the judgements' gains as they are (not 2^gain - 1);
    # q2's one relevant document at rank 11: outside nDCG@10 and MRR@10, inside recall@100
    swapped = {"q1": {"b": 0.9, "a": 0.8}, "q2": {**{f"z{i}": 1 - i / 100 for i in range(10)}, "c": 0.01}}
    ndcg_q1 = (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    got = metrics(qrels, swapped)
    assert got["ndcg@10"] == pytest.approx(ndcg_q1 / 2, abs=1e-6)
    assert got["mrr@10"] == pytest.approx(0.5)  # q1: 1 (b is relevant too), q2: 0 (not 1/11)
    assert got["recall@100"] == pytest.approx(1.0)
    # a judged query the run lacks counts 0
    assert metrics(qrels, {"q1": perfect["q1"]}) == {"ndcg@10": 0.5, "mrr@10": 0.5, "recall@100": 0.5}


def test_metrics_are_pytrec_evals():
    pytrec_eval = needs_pytrec_eval()
    rng = np.random.default_rng(1)
    docs = [f"d{i}" for i in range(300)]
    qrels = {f"q{q}": {docs[j]: int(rng.integers(0, 4)) for j in rng.choice(300, 12, replace=False)}
             for q in range(20)}
    run = {q: {d: float(s) for d, s in zip(docs, rng.normal(size=300), strict=True)} for q in qrels}
    run = cut(run, 100)
    got = metrics(qrels, run)
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    top10 = {q: dict(sorted(r.items(), key=lambda kv: -kv[1])[:10]) for q, r in run.items()}
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    assert got["ndcg@10"] == pytest.approx(np.mean([v["ndcg_cut_10"] for v in ev.values()]))
    assert got["recall@100"] == pytest.approx(np.mean([v["recall_100"] for v in ev.values()]))
    assert got["mrr@10"] == pytest.approx(np.mean([v["recip_rank"] for v in rr.values()]))
    assert 0 < got["ndcg@10"] < 1 and got["mrr@10"] <= 1


def test_evaluate_set_with_a_perfect_encoder(tmp_path: Path):
    needs_pytrec_eval()
    s = load_set(beir_folder(tmp_path / "set"))
    # a text's vector: one-hot of the judged document it belongs to (queries point at their best)
    best = {"q1": "d1", "q2": "d3", "q3": "long"}
    texts = dict(zip(s.docs, s.doc_ids, strict=True)) | dict(zip(s.queries, [best[q] for q in s.query_ids],
                                                                 strict=True))

    def encode(batch: list[str]) -> np.ndarray:
        return np.stack([np.eye(len(s.doc_ids))[s.doc_ids.index(texts[t])] for t in batch])

    result = evaluate_set(s, encode)
    assert result["mrr@10"] == 1.0 and result["recall@100"] == 1.0 and result["ndcg@10"] < 1.0  # q2 misses d1
    assert result["docs"] == 5 and result["queries"] == 3 and "dimensions" not in result


def test_evaluate_set_scores_each_matryoshka_prefix_from_the_same_vectors(tmp_path: Path):
    needs_pytrec_eval()
    s = load_set(beir_folder(tmp_path / "set"))
    calls = []
    n = len(s.doc_ids)
    best = {"q1": "d1", "q2": "d3", "q3": "long"}
    owner = dict(zip(s.docs, s.doc_ids, strict=True)) | dict(zip(s.queries, [best[q] for q in s.query_ids],
                                                                 strict=True))

    def encode(batch: list[str]) -> np.ndarray:
        # first n components: everything alike (a useless prefix); the last n: one-hot of the owner
        calls.append(len(batch))
        return np.stack([np.concatenate([np.ones(n), 10 * np.eye(n)[s.doc_ids.index(owner[t])]])
                         for t in batch])

    result = evaluate_set(s, encode, dimensions=(n, 2 * n, 99))
    assert len(calls) == 2  # documents once, queries once, for every size
    assert set(result["dimensions"]) == {str(n)}  # the whole vector and sizes past it are not prefixes
    assert result["mrr@10"] == 1.0 and result["dimensions"][str(n)]["mrr@10"] < 1.0


def test_cli_prints_the_table_and_writes_the_report(tiny_bundle: Path, tmp_path: Path, capsys):
    needs_pytrec_eval()
    a = beir_folder(tmp_path / "alpha", "beir", gz=False)
    b = beir_folder(tmp_path / "beta", "flat", gz=True)
    out = tmp_path / "out" / "report.json"
    code = main(["eval", "--retrieval", str(a), str(b), "--bundle", str(tiny_bundle), "--baselines", "",
                 "--report", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    label = f"DiSAN ({tiny_bundle})"
    head = "| model | alpha nDCG@10 | alpha MRR@10 | alpha R@100 | beta nDCG@10 | beta MRR@10 | beta R@100 |"
    assert head in stdout
    assert f"| {label} | " in stdout and f"report: {out}" in stdout
    report = json.loads(out.read_text())
    assert report["sets"]["alpha"]["docs"] == 5 and report["sets"]["beta"]["queries"] == 3
    assert report["sets"]["beta"]["files"]["qrels"] == "qrels.tsv.gz"
    row = report["models"][label]
    assert set(row) == {"alpha", "beta"}
    for per_set in row.values():
        assert set(per_set) >= {"ndcg@10", "mrr@10", "recall@100", "docs", "queries", "seconds"}
        assert 0 <= per_set["ndcg@10"] <= 1 and per_set["recall@100"] == 1.0  # 5 documents, top 100
    assert row["alpha"]["ndcg@10"] == row["beta"]["ndcg@10"]  # the same texts in both layouts
    code = main(["eval", "--retrieval", str(a), "--bundle", str(tiny_bundle), "--baselines", "",
                 "--report", str(out), "--dimensions", "8"])
    assert code == 0 and f"| {label}, 8 dims | " in capsys.readouterr().out
    assert set(json.loads(out.read_text())["models"][label]["alpha"]["dimensions"]) == {"8"}
    assert format_table(report) in stdout


def test_cli_scores_the_split_it_is_given(tiny_bundle: Path, tmp_path: Path):
    needs_pytrec_eval()
    folder = beir_folder(tmp_path / "set")
    (folder / "qrels" / "test.tsv").rename(folder / "qrels" / "dev.tsv")
    out = tmp_path / "report.json"
    code = main(["eval", "--retrieval", str(folder), "--bundle", str(tiny_bundle), "--baselines", "",
                 "--split", "dev", "--report", str(out)])
    report = json.loads(out.read_text())
    summary = report["sets"]["set"]
    assert code == 0 and report["split"] == "dev"
    assert summary["files"]["qrels"] == "qrels/dev.tsv" and summary["queries"] == 3


def test_cli_scores_a_checkpoint_through_the_bundles_windows(tiny_bundle: Path, tiny_checkpoints,
                                                             tmp_path: Path, capsys):
    """`--checkpoint`: a student before export, scored as the bundle would serve it, in place of the
    bundle's own row (disan.eval.encoders.checkpoint_windows)."""
    needs_pytrec_eval()
    pytest.importorskip("torch")
    a = beir_folder(tmp_path / "alpha", "beir", gz=False)
    out = tmp_path / "report.json"
    code = main(["eval", "--retrieval", str(a), "--bundle", str(tiny_bundle), "--checkpoint",
                 str(tiny_checkpoints.nli), "--baselines", "", "--report", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert list(report["models"]) == [f"DiSAN checkpoint ({tiny_checkpoints.nli})"]
    assert report["checkpoints"] == [str(tiny_checkpoints.nli)]
    code = main(["eval", "--retrieval", str(a), "--bundle", str(tiny_bundle), "--checkpoint",
                 str(tiny_checkpoints.nli), "--hybrid", "0.5"])
    assert code == 2 and "without --hybrid" in capsys.readouterr().err


@pytest.mark.parametrize(("make", "flags", "message"), [
    ("no-queries", [], "no queries (queries.jsonl or queries.jsonl.gz)"),
    ("no-folder", [], "no such folder"),
    ("dev-only", [], "; it has --split dev"),
    ("ok", ["--baselines", "minilm,glove"], "unknown --baselines entry 'glove' for --retrieval"),
])
def test_cli_errors_are_one_line(tmp_path: Path, capsys, make: str, flags: list[str], message: str):
    folder = tmp_path / "set"
    if make != "no-folder":
        beir_folder(folder)
    if make == "no-queries":
        (folder / "queries.jsonl").unlink()
    if make == "dev-only":  # BEIR's MS MARCO: judgements for dev and train, none for test
        (folder / "qrels" / "test.tsv").rename(folder / "qrels" / "dev.tsv")
    code = main(["eval", "--retrieval", str(folder), "--bundle", str(tmp_path / "no-bundle"), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.startswith("disan eval: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_without_pytrec_eval_names_the_extra(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pytrec_eval", None)  # `import pytrec_eval` fails, as uninstalled
    code = main(["eval", "--retrieval", str(beir_folder(tmp_path / "set"))])
    err = capsys.readouterr().err
    assert code == 2
    want = "disan eval: pytrec_eval is not installed; `disan eval` needs: pip install '.[eval]'"
    assert err.strip() == want

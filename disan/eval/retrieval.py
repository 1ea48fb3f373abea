"""Retrieval evaluation on a folder in BEIR's layout (`disan eval --retrieval DIR`), TORCH-FREE.

    disan eval --retrieval ../shared/data/retrieval/scifact ../shared/data/retrieval/cranfield \\
        --bundle models/default --baselines minilm,mpnet --report runs/retrieval.json

A folder holds a corpus (`corpus.jsonl`: `_id`, `title`, `text`), queries (`queries.jsonl`: `_id`,
`text`) and judgements (`qrels/test.tsv`: query id, document id, integer gain; a header line
`query-id corpus-id score` or none), each plain or gzipped (`corpus.jsonl.gz`, ...); a flat
`qrels.tsv[.gz]` beside them is read as the test split (the staged dev sets' layout). `--split dev`
reads `qrels/dev.tsv` instead (BEIR's MS MARCO has no test split). As BEIR does, only
the queries that have judgements are run, and a document is `title + " " + text`.

Every model is scored the same way: documents and queries embedded and L2-normalised, documents
ranked by dot product (cosine; exact, in blocks, so memory is bounded by a block of scores, not
queries x documents), the first `TOP_K` kept per query, and nDCG@10, MRR@10 and recall@100 from
`pytrec_eval` (trec_eval's `ndcg_cut_10` with the judgements' gains, `recip_rank` of the first 10
and `recall_100`, as BEIR and MTEB compute them; mean over the judged queries). The bundle runs
through `disan.Encoder` with windows over long documents (never truncated: a text longer than the
bundle's window is cut into windows whose vectors are pooled, as `/embed` does); the baselines
(`--baselines minilm,mpnet`) are the sentence-transformers a user would pick instead, with their own
truncation (all-MiniLM-L6-v2: 256 word pieces, all-mpnet-base-v2: 384), loaded offline as
`disan.train.word_vectors` loads them.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from disan.bundle.dimensions import bundle_projection, require_within_the_axes, shorten
from disan.bundle.lexical import NO_TABLE, Postings
from disan.data.readers import open_text
from disan.eval.encoders import BASELINES, Encode, baseline_keys, checkpoint_windows, disan_encoders
from disan.eval.hybrid import Sparse, hybrid_top_k
from disan.optional import require

TOP_K = 100
# report key -> (trec_eval measure, pytrec_eval result key, depth of the run it is computed on)
MEASURES = {"ndcg@10": ("ndcg_cut.10", "ndcg_cut_10", TOP_K),
            "mrr@10": ("recip_rank", "recip_rank", 10),
            "recall@100": ("recall.100", "recall_100", TOP_K)}
COLUMNS = {"ndcg@10": "nDCG@10", "mrr@10": "MRR@10", "recall@100": "R@100"}
# the files of a folder, first match wins: BEIR's names, plain or gzipped, then the flat qrels
CORPUS_FILES = ("corpus.jsonl", "corpus.jsonl.gz")
QUERY_FILES = ("queries.jsonl", "queries.jsonl.gz")
QRELS_FILES = ("qrels/{split}.tsv", "qrels/{split}.tsv.gz")
FLAT_QRELS = ("qrels.tsv", "qrels.tsv.gz")  # a folder's only judgements: read as the test split
SCORE_CELLS = 1 << 24  # query x document scores computed at a time (64 MB of float32)


@dataclass
class RetrievalSet:
    """A BEIR-layout folder, read: documents and judged queries in file order."""

    name: str
    folder: Path
    files: dict[str, str]
    doc_ids: list[str]
    docs: list[str]  # title + " " + text
    query_ids: list[str]
    queries: list[str]
    qrels: dict[str, dict[str, int]]
    judged_missing: int = 0  # judged (query, document) pairs whose document is not in the corpus
    unjudged_queries: int = 0  # queries of queries.jsonl without judgements (not run)

    def summary(self) -> dict:
        return {"folder": str(self.folder), "files": self.files, "docs": len(self.docs),
                "queries": len(self.queries), "qrels": sum(map(len, self.qrels.values())),
                "unjudged_queries": self.unjudged_queries, "judged_docs_missing": self.judged_missing,
                "doc_text": 'title + " " + text'}


def find_file(folder: Path, names: Sequence[str], what: str) -> Path:
    """The first of `names` under `folder`, or a ValueError naming what is missing."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ValueError(f"{folder}: no {what} ({' or '.join(names)})")


def qrels_splits(folder: Path) -> list[str]:
    """The splits whose judgements `folder/qrels/` holds (`dev` for qrels/dev.tsv[.gz]), sorted."""
    found = {f.name.removesuffix(".gz").removesuffix(".tsv") for f in (folder / "qrels").glob("*.tsv*")
             if f.name.endswith((".tsv", ".tsv.gz"))}
    return sorted(found)


def read_jsonl_rows(path: Path) -> list[tuple[str, dict]]:
    """(`_id`, row) of each non-blank line of a BEIR JSONL file; errors name the file and line."""
    rows = []
    try:
        with open_text(path) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
                if not isinstance(row, dict) or "_id" not in row:
                    raise ValueError(f"{path}:{lineno}: a JSON object with an `_id` expected")
                rows.append((str(row["_id"]), row))
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ValueError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    return rows


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """query id -> {document id: gain} of a qrels TSV (query id, document id, integer gain; an
    optional header line; the columns split on tabs, or on blanks in a file without tabs)."""
    qrels: dict[str, dict[str, int]] = {}
    try:
        with open_text(path) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                parts = line.rstrip("\n\r").split("\t") if "\t" in line else line.split()
                if len(parts) != 3:
                    raise ValueError(f"{path}:{lineno}: 3 columns expected (query-id, corpus-id, "
                                     f"score), got {len(parts)}")
                qid, did, score = (p.strip() for p in parts)
                try:
                    gain = int(score)
                except ValueError:
                    if lineno == 1:  # the header, e.g. "query-id corpus-id score"
                        continue
                    raise ValueError(f"{path}:{lineno}: score {score!r} is not an integer") from None
                qrels.setdefault(qid, {})[did] = gain
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ValueError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    if not qrels:
        raise ValueError(f"{path}: no judgements")
    return qrels


def load_set(folder: Path, split: str = "test", name: str | None = None) -> RetrievalSet:
    """Read a BEIR-layout folder (see the module docstring); `split`: which qrels/SPLIT.tsv."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder (a BEIR-layout folder: corpus.jsonl, queries.jsonl, "
                         "qrels/test.tsv)")
    paths = {"corpus": find_file(folder, CORPUS_FILES, "corpus"),
             "queries": find_file(folder, QUERY_FILES, "queries")}
    try:
        names = [n.format(split=split) for n in QRELS_FILES] + list(FLAT_QRELS if split == "test" else ())
        paths["qrels"] = find_file(folder, names, "qrels")
    except ValueError as exc:
        others = [f"--split {name}" for name in qrels_splits(folder) if name != split]
        raise ValueError(f"{exc}; it has {', '.join(others)}" if others else str(exc)) from None
    qrels = read_qrels(paths["qrels"])
    doc_ids, docs, seen = [], [], set()
    for did, row in read_jsonl_rows(paths["corpus"]):
        if did in seen:
            raise ValueError(f"{paths['corpus']}: document id {did!r} appears twice")
        seen.add(did)
        doc_ids.append(did)
        docs.append(f"{row.get('title') or ''} {row.get('text') or ''}".strip())
    if not docs:
        raise ValueError(f"{paths['corpus']}: no documents")
    queries = {qid: str(row.get("text") or "") for qid, row in read_jsonl_rows(paths["queries"])}
    missing = [qid for qid in qrels if qid not in queries]
    if missing:
        raise ValueError(f"{paths['qrels']}: {len(missing)} judged queries are not in "
                         f"{paths['queries'].name} (first: {missing[0]!r})")
    query_ids = [qid for qid in queries if qid in qrels]
    return RetrievalSet(
        name=name or folder.resolve().name, folder=folder,
        files={k: str(p.relative_to(folder)) for k, p in paths.items()},
        doc_ids=doc_ids, docs=docs, query_ids=query_ids, queries=[queries[q] for q in query_ids],
        qrels=qrels, judged_missing=sum(d not in seen for j in qrels.values() for d in j),
        unjudged_queries=len(queries) - len(query_ids))


# ---- ranking ----
def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """float32 rows scaled to unit L2 norm (a zero row stays zero)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def top_k(queries: np.ndarray, docs: np.ndarray, k: int = TOP_K,
          cells: int = SCORE_CELLS) -> tuple[np.ndarray, np.ndarray]:
    """The `k` best documents per query by dot product, exact: (indices int64 [Q, k'], scores
    float32 [Q, k']), best first, k' = min(k, documents). Scores are computed a block of queries
    x a block of documents at a time (at most about `cells` of them), keeping a running top k."""
    n_q, n_d = len(queries), len(docs)
    k = min(k, n_d)
    q_step = max(1, min(n_q, cells // max(1, min(n_d, cells))))
    d_step = max(k, cells // q_step)
    best_idx = np.zeros((n_q, k), dtype=np.int64)
    best_val = np.zeros((n_q, k), dtype=np.float32)
    for q0 in range(0, n_q, q_step):
        qv = queries[q0:q0 + q_step]
        idx = np.empty((len(qv), 0), dtype=np.int64)
        val = np.empty((len(qv), 0), dtype=np.float32)
        for d0 in range(0, n_d, d_step):
            scores = qv @ docs[d0:d0 + d_step].T
            val = np.concatenate([val, scores], axis=1)
            idx = np.concatenate([idx, np.broadcast_to(np.arange(d0, d0 + scores.shape[1]), scores.shape)],
                                 axis=1)
            if val.shape[1] > k:
                keep = np.argpartition(-val, k - 1, axis=1)[:, :k]
                val, idx = np.take_along_axis(val, keep, 1), np.take_along_axis(idx, keep, 1)
        order = np.lexsort((idx, -val), axis=1)  # best first; ties: the earlier document first
        best_idx[q0:q0 + len(qv)] = np.take_along_axis(idx, order, 1)
        best_val[q0:q0 + len(qv)] = np.take_along_axis(val, order, 1)
    return best_idx, best_val


def run_of(dataset: RetrievalSet, idx: np.ndarray, scores: np.ndarray) -> dict[str, dict[str, float]]:
    """The trec run {query id: {document id: score}} of a ranking."""
    ids = dataset.doc_ids
    return {qid: {ids[j]: float(s) for j, s in zip(row_idx, row_val, strict=True)}
            for qid, row_idx, row_val in zip(dataset.query_ids, idx, scores, strict=True)}


def cut(run: dict[str, dict[str, float]], depth: int) -> dict[str, dict[str, float]]:
    """Each query's first `depth` documents in trec_eval's order (score down, then document id
    down, as trec_eval breaks ties)."""
    return {q: dict(sorted(docs.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:depth])
            for q, docs in run.items()}


def per_query(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]], key: str) -> list[float]:
    """The `MEASURES[key]` value of each judged query, in the order of `qrels`, from pytrec_eval (a
    judged query missing from `run` counts 0, as trec_eval -c)."""
    pytrec_eval = require("pytrec_eval", "eval")
    measure, result_key, depth = MEASURES[key]
    found = pytrec_eval.RelevanceEvaluator(qrels, {measure}).evaluate(cut(run, depth))
    return [found.get(q, {}).get(result_key, 0.0) for q in qrels]


def metrics(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]) -> dict[str, float]:
    """nDCG@10, MRR@10, recall@100 (`MEASURES`): the mean over the judged queries of `per_query`."""
    return {key: float(sum(per_query(qrels, run, key)) / len(qrels)) for key in MEASURES}


def evaluate_set(dataset: RetrievalSet, encode: Encode, k: int = TOP_K,
                 dimensions: Sequence[int] = (), projection: np.ndarray | None = None,
                 sparse: Sparse | None = None, hybrid: Sequence[float] = ()) -> dict:
    """Embed `dataset` with `encode` (texts -> vectors), rank, score: the metrics, the counts and
    the seconds spent embedding; with `dimensions`, also the metrics of each vector cut to m
    components as the bundle serves `dimensions=m` (its first m, or with `projection` its
    coordinates on the first m principal axes: disan.bundle.dimensions), normalised, under
    "dimensions" {m: metrics}, from the same vectors; with `hybrid` weights and `sparse` (texts ->
    sparse vectors), also the metrics of each hybrid score (disan.eval.hybrid) under "hybrid"
    {weight: metrics}."""
    start = time.perf_counter()
    doc_raw = np.asarray(encode(dataset.docs), dtype=np.float32)
    doc_s = time.perf_counter() - start
    query_raw = np.asarray(encode(dataset.queries), dtype=np.float32)
    query_s = time.perf_counter() - start - doc_s

    def score(size: int | None) -> dict[str, float]:
        cut_to = (lambda v: v) if size is None else (lambda v: shorten(v, size, projection))
        idx, scores = top_k(unit_rows(cut_to(query_raw)), unit_rows(cut_to(doc_raw)), k)
        return metrics(dataset.qrels, run_of(dataset, idx, scores))

    result = score(None) | {"docs": len(dataset.docs), "queries": len(dataset.queries),
                            "seconds": {"docs": round(doc_s, 1), "queries": round(query_s, 1)}}
    sizes = [m for m in dimensions if 0 < m < doc_raw.shape[1]]
    if sizes:
        result["dimensions"] = {str(m): score(m) for m in sizes}
    if hybrid and sparse is not None:
        postings, query_sparse = Postings(sparse(dataset.docs)), sparse(dataset.queries)
        queries, docs = unit_rows(query_raw), unit_rows(doc_raw)
        result["hybrid"] = {}
        for weight in hybrid:
            idx, scores = hybrid_top_k(queries, docs, query_sparse, postings, weight, k)
            result["hybrid"][str(weight)] = metrics(dataset.qrels, run_of(dataset, idx, scores))
    return result


def evaluate(folders: Sequence[Path], bundle: Path | None, baselines: Sequence[str] = (),
             variant: str = "auto", log: Callable[[str], None] = print,
             dimensions: Sequence[int] = (), hybrid: Sequence[float] = (),
             checkpoints: Sequence[Path] = (), split: str = "test") -> dict:
    """The report: every set's counts, and per model (the bundle, or each checkpoint as the bundle
    would serve it, then each baseline) per set its metrics (the bundle's `hybrid` scores too). All
    sets are read and all models loaded before any model runs, so a bad folder or a missing package
    fails at once, not after an hour of embedding."""
    sets = [load_set(Path(f), split) for f in folders]
    require("pytrec_eval", "eval")  # before the long embedding passes, not after them
    names = [s.name for s in sets]
    for s in sets:
        if names.count(s.name) > 1:
            s.name = str(s.folder)
    models: list[tuple[str, Callable[[], Encode]]] = []
    projections: dict[str, np.ndarray | None] = {}
    sparse: dict[str, Sparse] = {}
    if checkpoints and (bundle is None or hybrid):
        raise ValueError("--checkpoint is scored through a bundle's tokenizer and windows (--bundle), "
                         "without --hybrid")
    for path in checkpoints:  # no projection: --dimensions cuts a checkpoint's own prefixes
        models.append((f"DiSAN checkpoint ({path})", lambda path=path: checkpoint_windows(path, bundle)))
    if bundle is not None and not checkpoints:
        label = f"DiSAN ({bundle})"
        dense, sparse_of = disan_encoders(bundle, variant, keep_sparse=bool(hybrid))
        if hybrid and sparse_of is None:
            raise ValueError(f"--hybrid: {bundle} {NO_TABLE}")
        models.append((label, lambda: dense))
        projections[label] = bundle_projection(bundle) if dimensions else None
        require_within_the_axes(dimensions, projections[label], bundle)
        if hybrid and sparse_of is not None:
            sparse[label] = sparse_of
    models += [BASELINES[key] for key in baselines]
    encoders = [(label, make()) for label, make in models]  # a missing package fails before any run
    report: dict = {"top_k": TOP_K, "split": split, "measures": {k: m for k, (m, _, _) in MEASURES.items()},
                    "sets": {s.name: s.summary() for s in sets}, "models": {}}
    for label, encode in encoders:
        report["models"][label] = {}
        for s in sets:
            log(f"{label}: {s.name} ({len(s.docs)} documents, {len(s.queries)} queries) ...")
            report["models"][label][s.name] = evaluate_set(s, encode, dimensions=dimensions,
                                                           projection=projections.get(label),
                                                           sparse=sparse.get(label), hybrid=hybrid)
    return report


def format_table(report: dict) -> str:
    """Markdown table: a row per model, per set nDCG@10 | MRR@10 | R@100."""
    sets = list(report["sets"])
    head = ["model"] + [f"{s} {COLUMNS[k]}" for s in sets for k in MEASURES]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for label, per_set in report["models"].items():
        cells = [f"{per_set[s][k]:.4f}" for s in sets for k in MEASURES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        for m in per_set[sets[0]].get("dimensions", {}) if sets else ():
            cells = [f"{per_set[s]['dimensions'][m][k]:.4f}" for s in sets for k in MEASURES]
            lines.append(f"| {label}, {m} dims | " + " | ".join(cells) + " |")
        for w in per_set[sets[0]].get("hybrid", {}) if sets else ():
            cells = [f"{per_set[s]['hybrid'][w][k]:.4f}" for s in sets for k in MEASURES]
            lines.append(f"| {label}, hybrid {w} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_retrieval(args: argparse.Namespace) -> int:
    """`disan eval --retrieval DIR [DIR ...]`: table on stdout, JSON report in --report."""
    checkpoints = getattr(args, "checkpoint", None) or ()
    report = evaluate(args.retrieval, args.bundle, baseline_keys(args.baselines), args.variant,
                      dimensions=getattr(args, "dimensions", None) or (),
                      hybrid=getattr(args, "hybrid", None) or (), checkpoints=checkpoints,
                      split=getattr(args, "split", "test"))
    report["bundle"], report["variant"] = str(args.bundle), args.variant
    report["checkpoints"] = [str(p) for p in checkpoints]
    print(format_table(report))
    out = args.report or Path("runs") / "eval_retrieval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"report: {out}")
    return 0

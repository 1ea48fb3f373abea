"""research/analyses/teacher_directions.py: TREC from the teacher's loud and quiet principal directions, and
how much of each band a student's vector predicts."""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest

pytest.importorskip("sklearn")

from disan.distill.teacher import TeacherCache  # noqa: E402
from research.analyses import teacher_directions as bench  # noqa: E402

DIM = 17  # 16 loud coordinates and one quiet one: the band 16-64 is that one alone


def _write(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def _vectors(texts: list[str]) -> np.ndarray:
    """A fake teacher: loud random coordinates; the class is only in one quiet coordinate.

    Seeded by a checksum of the text, not hash(): hash() changes with PYTHONHASHSEED, so each run
    drew other coordinates and, in some draws, the student without the class predicted it by chance."""
    out = np.zeros((len(texts), DIM))
    for i, t in enumerate(texts):
        rng = np.random.default_rng(zlib.crc32(t.encode()))
        out[i, :-1] = rng.standard_normal(DIM - 1) * 5
        out[i, -1] = 0.5 if t.startswith("who") else -0.5
    return out


def test_the_class_lives_in_the_quiet_directions(tmp_path, monkeypatch) -> None:
    data, corpus = tmp_path / "data", tmp_path / "corpus"
    questions = [{"text": f"{w} thing {i} ?", "label": "HUM" if w == "who" else "NUM"}
                 for i in range(300) for w in ("who", "how many")]
    _write(data / "senteval/TREC/trec_train.jsonl.gz", questions[:500])
    _write(data / "senteval/TREC/trec_test.jsonl.gz", questions[500:])
    cache = TeacherCache.open(corpus / "teacher-fake", "sha", "fake", 2400, DIM)
    cache.write(0, _vectors([f"corpus sentence {i}" for i in range(1200)]
                            + [f"who else {i}" for i in range(600)] + [f"how much {i}" for i in range(600)]))
    monkeypatch.setitem(bench.BASELINES, "fake", ("fake", lambda: _vectors))
    # students: one that keeps the quiet coordinate, one that keeps only the loud ones
    keeps = lambda texts: _vectors(texts)[:, -8:]  # noqa: E731
    loses = lambda texts: _vectors(texts)[:, :8]  # noqa: E731
    monkeypatch.setattr(bench, "checkpoint_encoder", lambda path: keeps if path.name == "keeps.pt" else loses)
    out = tmp_path / "out.json"
    assert bench.main(["--corpus", str(corpus), "--teacher", "fake", "--data", str(data),
                       "--checkpoint", str(tmp_path / "keeps.pt"), str(tmp_path / "loses.pt"),
                       "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["trec_teacher"] == 100.0
    assert got["trec_top_k"]["16"] < 75 and got["trec_without_top_k"]["16"] == 100.0
    keeps_row = got["students"][str(tmp_path / "keeps.pt")]
    loses_row = got["students"][str(tmp_path / "loses.pt")]
    assert keeps_row["trec"] == 100.0 and loses_row["trec"] < 75
    quiet = "16-64"  # the quietest direction: the class
    assert keeps_row["r2_by_band"][quiet] > 0.9 > 0.1 > loses_row["r2_by_band"][quiet]


def test_an_unknown_teacher_is_one_line(tmp_path) -> None:
    with pytest.raises(SystemExit, match="--teacher nope"):
        bench.main(["--corpus", str(tmp_path), "--teacher", "nope", "--json", str(tmp_path / "o.json")])


def test_a_missing_cache_or_data_is_one_line(tmp_path) -> None:
    with pytest.raises(SystemExit, match="no teacher cache"):
        bench.main(["--corpus", str(tmp_path), "--json", str(tmp_path / "o.json")])
    TeacherCache.open(tmp_path / "teacher-mpnet", "sha", "mpnet", 4, 3)
    with pytest.raises(SystemExit, match="trec_train"):
        bench.main(["--corpus", str(tmp_path), "--data", str(tmp_path / "none"),
                    "--json", str(tmp_path / "o.json")])

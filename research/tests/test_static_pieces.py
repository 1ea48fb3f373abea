"""research.static_pieces: a piece table distilled as a static encoder from the teacher's cached
vectors (`--train`), a start for a piece student."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from conftest import WORDS, tiny_piece_tokenizer  # noqa: E402

from disan.distill.teacher import TeacherCache  # noqa: E402
from research.static_pieces import (  # noqa: E402
    cosine,
    main,
    mapped_encoder,
    static_encoder,
    train_static,
)


def corpus_with_a_static_teacher(root: Path, tok) -> tuple[Path, list[str], np.ndarray]:
    """A corpus whose teacher is itself static (a fixed vector per piece, averaged): a table that
    trains can reach it, a random start through a linear map cannot."""
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, rng.integers(3, 9))) for _ in range(1500)]
    body = ("\n".join(texts) + "\n").encode("utf-8")
    folder = root / "corpus"
    folder.mkdir()
    (folder / "sentences.txt").write_bytes(body)
    info = {"sha256": hashlib.sha256(body).hexdigest(), "sentences": len(texts)}
    (folder / "corpus.json").write_text(json.dumps(info), encoding="utf-8")
    secret = rng.normal(size=(len(tok), 24)).astype(np.float32)
    target = static_encoder(secret, tok)(texts)
    cache = TeacherCache.open(folder / "teacher-mpnet", info["sha256"], "mpnet", len(texts), 24)
    cache.write(0, target.astype(np.float16))
    return folder, texts, target


def test_a_trained_table_reaches_a_static_teacher_that_its_start_cannot(tmp_path: Path) -> None:
    tok = tiny_piece_tokenizer()
    folder, texts, target = corpus_with_a_static_teacher(tmp_path, tok)
    start = np.random.default_rng(1).normal(size=(len(tok), 24)).astype(np.float32)
    start[0] = 0
    table, w, history = train_static(start, tok, folder, epochs=12, lr=3e-2, batch_size=64, val=200,
                                     log=lambda _line: None)
    assert history[0] < 0.9 and history[-1] > 0.97, history
    assert table.shape == start.shape and not table[0].any()  # pieces.npy's layout: row 0 pads
    # the map it returns is the one it trained: the numpy encoder scores what training measured
    served = mapped_encoder(table, tok, w)(texts[:200])
    assert cosine(served, target[:200]) == pytest.approx(max(history), abs=2e-3)


def test_the_table_of_the_best_held_out_epoch_comes_back_not_the_last(tmp_path: Path) -> None:
    """Held-out rows that training moves away from (their teacher vectors negated): every epoch is
    worse on them than the start, so the start's table and map come back, not the last epoch's."""
    tok = tiny_piece_tokenizer()
    folder, texts, target = corpus_with_a_static_teacher(tmp_path, tok)
    vectors = np.load(folder / "teacher-mpnet" / "vectors.f16.npy", mmap_mode="r+")
    vectors[:200] = -vectors[:200]
    vectors.flush()
    start = np.random.default_rng(1).normal(size=(len(tok), 24)).astype(np.float32)
    start[0] = 0
    table, w, history = train_static(start, tok, folder, epochs=3, lr=3e-2, batch_size=64, val=200,
                                     log=lambda _line: None)
    assert history[0] > max(history[1:]), history
    np.testing.assert_array_equal(table, start)
    served = mapped_encoder(table, tok, w)(texts[:200])
    assert cosine(served, -target[:200]) == pytest.approx(history[0], abs=2e-3)


def test_saving_a_table_without_training_it_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--table", str(tmp_path / "pieces.npy"), "--save-table", str(tmp_path / "out.npy")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("it needs --train CORPUS")
    assert not (tmp_path / "pieces.npy").exists()  # refused before the teacher builds a start


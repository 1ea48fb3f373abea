"""research.cloze_pairs: a passage's sentence -> the rest of it, appended after the corpus's rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from disan.distill.corpus import build as corpus
from disan.distill.corpus.sources import Source
from research.cloze_pairs import add_cloze_pairs

STORY = ("The river rose slowly through the night. By morning the bridge was under water. The town "
         "opened its school to the families from the low streets. Boats carried food to the farms.")
SHORT = "A passage of two sentences only has room for one pair. It is left out of the cloze pairs here."


@pytest.fixture()
def built(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(corpus, "eval_keys", lambda _data: set())
    source = Source("news", "test", "CC0", lambda _root: iter([STORY, SHORT]), staged=True)
    corpus.build([source], tmp_path, None, tmp_path / "corpus", passage_words=(10, 60))
    return tmp_path / "corpus"


def test_cloze_pairs_keep_the_rows_and_pair_a_sentence_with_its_passage(built: Path, tmp_path: Path) -> None:
    before, info_before = corpus.read_corpus(built)
    info = add_cloze_pairs(built, tmp_path / "out")
    after, read_info = corpus.read_corpus(tmp_path / "out")  # the hash checks out
    assert read_info == info
    assert after[:len(before)] == before  # the anchor rows stay where they were
    pairs = np.load(tmp_path / "out" / "pairs.npy")
    kinds = np.load(tmp_path / "out" / "kinds.npy")
    assert len(kinds) == len(after) == info["sentences"]
    cloze = pairs[pairs[:, 2] == len(info_before["relations"])]
    assert len(cloze) == info["relations"]["cloze"] == 1  # the two-sentence passage has none
    query, rest = after[cloze[0, 0]], after[cloze[0, 1]]
    sentences = corpus.split_sentences(STORY)
    assert query in sentences and query not in rest
    assert corpus.split_sentences(rest) == [s for s in sentences if s != query]
    assert (kinds[cloze[0, 0]], kinds[cloze[0, 1]]) == (corpus.SENTENCE, corpus.PASSAGE)
    assert np.array_equal(pairs[:len(np.load(built / "pairs.npy"))], np.load(built / "pairs.npy"))


def test_cloze_pairs_refuse_a_corpus_that_has_them(built: Path, tmp_path: Path) -> None:
    add_cloze_pairs(built, tmp_path / "once")
    with pytest.raises(ValueError, match="already has cloze pairs"):
        add_cloze_pairs(tmp_path / "once", tmp_path / "twice")

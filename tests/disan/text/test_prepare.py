"""disan/text/prepare.py: the one preparation of texts that disan.Encoder and the service share."""

from __future__ import annotations

import numpy as np

from disan.text.prepare import flat_rows, pool, pool_embeddings, prepare_texts, row_bounds
from disan.text.tokenizer import UNK, Vocab
from disan.text.windowing import EMBEDDING_LEAD, LongTextPolicy, pool_windows, split_windows
from service.inference.longtext import Limits
from service.inference.longtext import prepare_texts as service_prepare

VOCAB = Vocab("a b c d e f g h".split())
LONG = " ".join("abcdefgh" * 3)  # 24 tokens


def test_fit_window_truncate_empty_and_refuse() -> None:
    items, refused = prepare_texts(["a b", LONG, "", LONG], VOCAB, 8, LongTextPolicy.WINDOW, overlap=2,
                                   max_tokens_per_text=20)
    assert [r.index for r in refused] == [1, 3] and all(r.size and r.limit == 20 for r in refused)
    items, refused = prepare_texts(["a b", LONG, ""], VOCAB, 8, LongTextPolicy.WINDOW, overlap=2)
    assert not refused
    ids = VOCAB.ids(VOCAB.tokens(LONG))
    assert items[0].rows == [VOCAB.ids(["a", "b"])] and not items[0].windowed
    assert items[1].rows == split_windows(ids, 8, 2) and items[1].windowed and items[1].length == 24
    assert items[2].rows == [[UNK]] and items[2].empty and items[2].note(2)["empty"]
    cut, _ = prepare_texts([LONG], VOCAB, 8, LongTextPolicy.TRUNCATE)
    assert cut[0].rows == [ids[:8]] and cut[0].truncated and cut[0].length == 24
    _, refused = prepare_texts(["a", LONG], VOCAB, 8, LongTextPolicy.ERROR)
    assert [(r.index, r.tokens, r.limit, r.size) for r in refused] == [(1, 24, 8, False)]


def test_pool_keeps_single_rows_and_weights_windows_by_tokens() -> None:
    items, _ = prepare_texts(["a b", LONG], VOCAB, 8, LongTextPolicy.WINDOW)
    rows = flat_rows(items)
    outputs = np.arange(len(rows) * 2, dtype=np.float32).reshape(len(rows), 2)
    bounds = row_bounds(items)
    pooled = pool(items, outputs)
    assert pooled.dtype == np.float32 and pooled.shape == (2, 2)
    np.testing.assert_array_equal(pooled[0], outputs[0])
    want = pool_windows(outputs[bounds[1]:bounds[2]], [len(r) for r in rows[1:]])
    np.testing.assert_allclose(pooled[1], want)


def test_embeddings_pool_with_the_first_window_counting_lead_times() -> None:
    items, _ = prepare_texts(["a b", LONG], VOCAB, 8, LongTextPolicy.WINDOW)
    rows = flat_rows(items)
    outputs = np.arange(len(rows) * 2, dtype=np.float32).reshape(len(rows), 2)
    pooled = pool_embeddings(items, outputs)
    np.testing.assert_array_equal(pooled[0], outputs[0])  # a text in one window: its own vector
    windows = outputs[1:]  # LONG: three windows of 8
    want = (EMBEDDING_LEAD * windows[0] + windows[1] + windows[2]) / (EMBEDDING_LEAD + 2)
    np.testing.assert_allclose(pooled[1], want)
    assert not np.allclose(pooled[1], pool(items, outputs)[1])


def test_the_service_prepares_as_the_core_does() -> None:
    limits = Limits(max_tokens=8, policy=LongTextPolicy.WINDOW, overlap=1)
    served = service_prepare(["a b", LONG, ""], VOCAB, limits)
    core, _ = prepare_texts(["a b", LONG, ""], VOCAB, 8, LongTextPolicy.WINDOW, overlap=1)
    assert [t.rows for t in served] == [t.rows for t in core]

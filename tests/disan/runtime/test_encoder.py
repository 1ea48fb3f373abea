"""disan.Encoder: the Python API returns what the service returns, on the same runtime."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from support_serving import wait_ready  # noqa: E402

from disan import Encoder  # noqa: E402
from disan.runtime.encoder import TextTooLong  # noqa: E402
from disan.runtime.runtime import load_offline  # noqa: E402
from disan.text.tokenizer import tokenize  # noqa: E402
from disan.text.windowing import EMBEDDING_LEAD, pool_windows, split_windows  # noqa: E402

TEXTS = ["a man is playing guitar", "the movie was great !", "dogs run in the park", "a",
         "the woman is not reading a book at the table in the rain", "zebra zebra", "the best film"]


@pytest.fixture(scope="module")
def encoder(tiny_bundle) -> Encoder:
    return Encoder(tiny_bundle)


@pytest.fixture(scope="module")
def client(tiny_bundle):
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(bundle=tiny_bundle, max_wait_ms=1.0))) as c:
        wait_ready(c.get)
        yield c


def test_runtime_refuses_text_with_a_clear_error(tiny_bundle):
    """Issue 23: `load_offline(bundle).embed(["a sentence"])` failed with numpy's
    `ValueError: invalid literal for int()`; it now says what the runtime takes and what takes text."""
    rt = load_offline(tiny_bundle)
    with pytest.raises(TypeError, match=r"token id rows.*disan\.Encoder"):
        rt.embed(["a sentence"])
    with pytest.raises(TypeError, match="not text"):
        rt.sentiment(["a sentence"])
    assert rt.embed([rt.text_ids("a sentence")]).shape == (1, rt.dim)


@pytest.mark.parametrize("normalize", [False, True])
def test_encode_matches_the_service(encoder, client, normalize):
    """The vectors of /embed, to float32 rounding: the batches differ (the service's micro-batcher
    packs by arrival, `encode` by length), and padding changes the kernels' summation order."""
    r = client.post("/embed", json={"texts": TEXTS, "normalize": normalize})
    assert r.status_code == 200, r.text
    served = np.asarray(r.json()["embeddings"], dtype=np.float32)
    ours = encoder.encode(TEXTS, normalize=normalize)
    assert ours.dtype == np.float32 and ours.shape == served.shape
    np.testing.assert_allclose(ours, served, rtol=1e-5, atol=1e-6)
    one = encoder.encode(TEXTS[1], normalize=normalize)
    assert one.shape == (encoder.dim,)
    np.testing.assert_allclose(one, served[1], rtol=1e-5, atol=1e-6)


def test_batch_size_and_progress_do_not_change_vectors(encoder):
    whole = encoder.encode(TEXTS)
    np.testing.assert_allclose(encoder.encode(TEXTS, batch_size=1, show_progress=True), whole,
                               rtol=1e-5, atol=1e-6)
    assert np.concatenate(list(encoder.iter_encode(TEXTS, chunk=3))).shape == whole.shape


def test_similarity_nli_sentiment_match_the_service(encoder, client):
    r = client.post("/similarity", json={"texts": TEXTS[:3], "query": TEXTS[3], "top_k": 3}).json()
    ours = encoder.similarity(TEXTS[3], TEXTS[:3])[0]
    for item in r["ranking"]:
        assert ours[item["index"]] == pytest.approx(item["score"], abs=1e-5)
    np.testing.assert_allclose(np.diag(encoder.similarity(TEXTS)), 1.0, atol=1e-5)

    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[4], TEXTS[0])]
    served = client.post("/nli", json={"pairs": [{"premise": p, "hypothesis": h} for p, h in pairs]})
    for mine, theirs in zip(encoder.nli(pairs), served.json()["results"], strict=True):
        assert mine["label"] == theirs["label"]
        assert mine["scores"] == pytest.approx(theirs["scores"], abs=1e-5)

    served = client.post("/sentiment", json={"texts": TEXTS}).json()["results"]
    for mine, theirs in zip(encoder.sentiment(TEXTS), served, strict=True):
        assert (mine["label"], mine["polarity"]) == (theirs["label"], theirs["polarity"])
        assert mine["scores"] == pytest.approx(theirs["scores"], abs=1e-5)


# 254 tokens, max_tokens 128: two windows that say different things, so how they are pooled shows
LONG = "the man is playing guitar in the park " * 16 + "a dog runs on the beach with a ball " * 14


def test_long_texts_are_windows_pooled_by_tokens_the_first_counting_twice(encoder, client):
    """`window` (the default): windows of max_tokens (disan.text.windowing), each embedded as the
    service embeds that window's text, pooled by token counts; short texts are untouched."""
    tokens = tokenize(LONG)
    for overlap in (0, 16):
        windows = split_windows(tokens, 128, overlap)
        served = np.asarray(client.post("/embed", json={"texts": [" ".join(w) for w in windows]}
                                        ).json()["embeddings"], dtype=np.float32)
        want = pool_windows(served, [len(w) for w in windows], EMBEDDING_LEAD)
        ours = Encoder(runtime=encoder.runtime, overlap=overlap).encode([TEXTS[0], LONG, TEXTS[1]])
        np.testing.assert_allclose(ours[1], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours[[0, 2]], encoder.encode(TEXTS[:2]), rtol=1e-5, atol=1e-6)
    prepared = encoder.prepare([TEXTS[0], LONG])
    assert (prepared.windowed, prepared.truncated, list(prepared.bounds)) == (1, 0, [0, 1, 3])
    with pytest.raises(ValueError, match="overlap"):
        Encoder(runtime=encoder.runtime, overlap=128)


def test_long_texts_cut_or_refused(encoder, client):
    """`truncate` gives /embed's truncate=true vector, `error` names the text."""
    served = client.post("/embed", json={"texts": [LONG], "truncate": True}).json()["embeddings"]
    cut = Encoder(runtime=encoder.runtime, long_texts="truncate")
    np.testing.assert_allclose(cut.encode([LONG]), served, rtol=1e-5, atol=1e-6)
    assert cut.prepare([LONG]).truncated == 1
    strict = Encoder(runtime=encoder.runtime, long_texts="error")
    with pytest.raises(TextTooLong, match="text 1: 254 tokens, at most 128"):
        strict.encode(["a", LONG])
    with pytest.raises(ValueError, match="long_texts"):
        Encoder(runtime=encoder.runtime, long_texts="drop")  # type: ignore[arg-type]


def test_provider_chosen_as_the_service_chooses(encoder, client):
    info = client.get("/info").json()
    rt = encoder.runtime
    assert (rt.provider, rt.graph_set, rt.variant) == (info["provider"], info["bundle"]["graph_set"],
                                                       info["variant"])
    batching = info["batching"]
    assert (encoder.limits.max_batch_size, encoder.limits.max_batch_cells) == (
        batching["max_batch_size"], batching["max_batch_cells"])


def test_spelling_reads_a_misspelt_word_unless_turned_off(encoder, tiny_bundle):
    misspelt, right = "a man playnig the guitarr", "a man playing the guitar"
    on = encoder.encode([misspelt, right])
    np.testing.assert_allclose(on[0], on[1], atol=1e-6)
    off = Encoder(tiny_bundle, spelling=False).encode([misspelt, right])
    assert not np.allclose(off[0], off[1], atol=1e-3)
    np.testing.assert_allclose(off[1], on[1], atol=1e-6)  # correctly spelt text: the same either way


@pytest.mark.parametrize("call", ["encode", "similarity", "sentiment", "nli"])
def test_a_text_that_is_not_a_string_is_named_in_a_type_error(encoder, call):
    """A non-string item (None from a missing value, bytes, a number) failed deep in the tokenizer
    with `AttributeError: 'NoneType' object has no attribute 'isascii'`; every text method now
    names the item and its type, and a non-sequence argument is refused the same way."""
    texts = ["a man is playing guitar", None, "dogs run"]
    args = {"nli": ([("a man", "a woman"), ("a dog", 7)],)}.get(call, (texts,))
    with pytest.raises(TypeError, match=r"\[1\].* (NoneType|int), not str"):
        getattr(encoder, call)(*args)
    if call == "encode":
        for bad in (42, None, [b"bytes"]):
            with pytest.raises(TypeError, match="str"):
                encoder.encode(bad)
    if call == "nli":  # any two-item rows pass, a numpy array of them too; a bare string does not
        for bad in (["ab"], [("a", "b", "c")], "ab"):
            with pytest.raises(TypeError, match="pair"):
                encoder.nli(bad)
        pairs = [("a man", "a woman"), ("a dog", "a cat")]
        assert encoder.nli(np.array(pairs)) == encoder.nli(pairs)


def test_batch_size_and_chunk_are_checked_and_iter_encode_streams(encoder):
    """batch_size=-1 ran as if unset and iter_encode(chunk=0) failed in range(); iter_encode took
    only sequences (len()), though streaming a generator is what it is for."""
    for bad in (0, -1):
        with pytest.raises(ValueError, match="batch_size"):
            encoder.encode(TEXTS, batch_size=bad)
        with pytest.raises(ValueError, match="chunk"):
            next(encoder.iter_encode(TEXTS, chunk=bad))
    chunks = list(encoder.iter_encode((t for t in TEXTS), chunk=3))
    assert [len(c) for c in chunks] == [3, 3, 1]
    np.testing.assert_allclose(np.concatenate(chunks), encoder.encode(TEXTS), rtol=1e-5, atol=1e-6)


def test_similarity_hybrid_adds_the_sparse_dot_products(sparse_bundle):
    from disan.bundle.lexical import sparse_dot

    enc = Encoder(sparse_bundle, variant="fp32")
    a, b = ["the man plays the guitar"], ["a man is playing the guitar", "the dog runs in the park"]
    dense = enc.similarity(a, b)
    sa, sb = enc.encode_sparse(a), enc.encode_sparse(b)
    lexical = np.array([[sparse_dot(x, y) for y in sb] for x in sa])
    np.testing.assert_allclose(enc.similarity(a, b, hybrid=0.3), 0.7 * dense + 0.3 * lexical, atol=1e-6)
    np.testing.assert_allclose(enc.similarity(a, b, hybrid=1.0), lexical, atol=1e-6)
    assert lexical[0, 0] > lexical[0, 1] > 0  # "guitar" and "man" are shared; only "the" with the park
    self_sim = enc.similarity(b, hybrid=0.5)
    np.testing.assert_allclose(np.diag(self_sim), 1.0, atol=1e-5)  # both halves are unit vectors
    with pytest.raises(ValueError, match="hybrid=2"):
        enc.similarity(a, b, hybrid=2)

"""The encoders `disan eval --retrieval` scores (disan.eval.encoders): the bundle's vectors from
windows over the whole text, a checkpoint through the bundle's windows, and the static baseline read
offline from its wheel."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_tiny_checkpoint

from disan.eval.encoders import checkpoint_windows, disan_encoder, wordllama_encoder
from disan.optional import MissingDependency
from disan.text.tokenizer import Vocab


def test_disan_vectors_come_from_windows_not_truncation(tiny_bundle: Path):
    from disan.runtime.encoder import Encoder  # onnxruntime: the bundle's own encoder

    # 120 + 120 tokens: most of the dogs are past the first window
    long_text = "the children are walking in the rain . " * 15 + "a dog is running in the park . " * 15
    encode = disan_encoder(tiny_bundle, "fp32")
    got = encode([long_text, "a dog"])
    windows = Encoder(tiny_bundle, variant="fp32", long_texts="window")
    want = windows.encode([long_text, "a dog"], normalize=True)
    truncated = Encoder(tiny_bundle, variant="fp32", long_texts="truncate")
    cut_vec = truncated.encode([long_text], normalize=True)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert np.linalg.norm(got[0] - cut_vec[0]) > 1e-3  # the windows see the whole text


def test_a_checkpoint_scores_as_the_bundle_made_from_it_serves(tiny_bundle: Path, tiny_checkpoints,
                                                               tmp_path: Path):
    """`disan eval --retrieval --checkpoint`: the checkpoint's weights through the bundle's tokenizer,
    windows and first-window weight give the bundle's own vectors (its fp32 graph); a checkpoint that
    reads another vocabulary is refused, not scored as if its ids were the bundle's."""
    pytest.importorskip("torch")
    long_text = "the children are walking in the rain . " * 15 + "a dog is running in the park . " * 15
    texts = [long_text, "a dog", ""]
    # the bundle was exported without --embed: /embed serves the NLI model's encoder
    got = checkpoint_windows(tiny_checkpoints.nli, tiny_bundle)(texts)
    np.testing.assert_allclose(got, disan_encoder(tiny_bundle, "fp32")(texts), atol=1e-5)
    assert checkpoint_windows(tiny_checkpoints.nli, tiny_bundle)([]).shape == (0, got.shape[1])
    other = make_tiny_checkpoint(tmp_path / "other.pt", "encoder", Vocab(["zebra", "dog"]), [], seed=3)
    with pytest.raises(ValueError, match="reads another tokenizer"):
        checkpoint_windows(other, tiny_bundle)


def test_the_static_baseline_reads_its_weights_from_the_wheel_offline(monkeypatch) -> None:
    """`--baselines wordllama`: the wheel carries its weights and tokenizer, but WordLlama.load
    looks for the tokenizer where the wheel does not put it and then downloads; here nothing may be
    downloaded, so any attempt fails the test."""
    pytest.importorskip("wordllama", reason="wordllama is not installed (pip install '.[wordllama]')")
    import requests  # wordllama downloads with requests: a download here is a failure

    def no_network(*args, **kwargs):
        raise AssertionError(f"a download was attempted: {args}")

    monkeypatch.setattr(requests, "get", no_network)
    encode = wordllama_encoder()
    v = encode(["curcumin inhibits mtorc1 signalling", "a cat sat on the mat", "curcumin blocks mtorc1"])
    assert v.shape == (3, 256) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert v[0] @ v[2] > v[0] @ v[1]


def test_the_static_baseline_gives_a_text_without_tokens_the_zero_vector() -> None:
    """WordLlama normalises a zero sum to NaN (Cranfield has two empty documents); a NaN row would
    score NaN against every query, so such a text gets zeros: it is never ranked above a real match."""
    pytest.importorskip("wordllama", reason="wordllama is not installed (pip install '.[wordllama]')")
    v = wordllama_encoder()(["", "a cat sat on the mat"])
    assert np.isfinite(v).all()
    assert not v[0].any() and np.linalg.norm(v[1]) == pytest.approx(1, abs=1e-5)


def test_a_missing_static_baseline_names_its_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wordllama", None)  # as if not installed
    with pytest.raises(MissingDependency) as missing:
        wordllama_encoder()
    assert missing.value.extra == "wordllama"

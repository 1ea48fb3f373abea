"""`disan eval --task`: the bundle scored through `disan.Encoder`, the path the service runs, so a
text over the window is windowed and pooled as /sentiment and /nli do it, not cut."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")

from disan.eval import evaluate as evaluate_module  # noqa: E402
from disan.runtime.encoder import Encoder  # noqa: E402
from disan.runtime.runtime import load_offline  # noqa: E402

WORDS = "good great bad worst terrible boring funny moving beautiful awful fine wonderful".split()
# Over the tiny bundle's window of 128 tokens: what follows the first window moves the result.
LONG = [" ".join(["the", "movie", "was"] + [WORDS[(i * 5 + k) % len(WORDS)] for k in range(200)])
        for i in range(4)]
SHORT = ["the movie was great", "a boring film", "the acting was awful !"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def scored_probs(monkeypatch, bundle: Path, task: str, data: Path) -> np.ndarray:
    """The class probabilities `evaluate_task` scores (what the report's numbers come from)."""
    seen = []
    real = evaluate_module.score
    monkeypatch.setattr(evaluate_module, "score", lambda *a: seen.append(a[3]) or real(*a))
    evaluate_module.evaluate_task(bundle, task, data)
    return seen[0]


def scores(results: list[dict], labels: list[str]) -> np.ndarray:
    return np.asarray([[r["scores"][k] for k in labels] for r in results], dtype=np.float32)


def test_task_eval_windows_long_texts_as_the_encoder_does(tiny_bundle, tmp_path, monkeypatch):
    """`disan eval --task` cut every text to max_tokens; its probabilities are now Encoder's (and
    the service's): a long text's are its windows' pooled ones, a short text's unchanged."""
    encoder = Encoder(runtime=load_offline(tiny_bundle, "fp32"))
    cut = Encoder(runtime=encoder.runtime, long_texts="truncate")
    texts = SHORT + LONG
    data = write_jsonl(tmp_path / "sst5.jsonl", [{"text": t, "label": i % 5} for i, t in enumerate(texts)])
    got = scored_probs(monkeypatch, tiny_bundle, "sst5", data)
    labels = encoder.runtime.labels["sentiment"]
    np.testing.assert_allclose(got, scores(encoder.sentiment(texts), labels), atol=1e-5, rtol=0)
    truncated = scores(cut.sentiment(texts), labels)
    np.testing.assert_allclose(got[:len(SHORT)], truncated[:len(SHORT)], atol=1e-5, rtol=0)
    assert np.abs(got[len(SHORT):] - truncated[len(SHORT):]).max(axis=1).min() > 1e-4  # each long text

    pairs = [(SHORT[0], SHORT[1])] + [(text, SHORT[2]) for text in LONG] + [(SHORT[1], LONG[0])]
    data = write_jsonl(tmp_path / "snli.jsonl", [
        {"sentence1": p, "sentence2": h, "gold_label": ["entailment", "neutral", "contradiction"][i % 3]}
        for i, (p, h) in enumerate(pairs)])
    got = scored_probs(monkeypatch, tiny_bundle, "snli", data)
    labels = encoder.runtime.labels["nli"]
    np.testing.assert_allclose(got, scores(encoder.nli(pairs), labels), atol=1e-5, rtol=0)
    assert np.abs(got[1:] - scores(cut.nli(pairs), labels)[1:]).max(axis=1).min() > 1e-4

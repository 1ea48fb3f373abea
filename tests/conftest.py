"""Shared fixtures: tiny random-weight checkpoints and the ONNX bundle exported from them.

torch / onnx are imported inside the fixtures, so test modules that do not use them still run
in an environment without torch (the service's), and the fixtures skip cleanly there.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from disan.bundle.manifest import NLI_LABELS
from disan.bundle.manifest import SST5_LABELS as SENTIMENT_LABELS
from disan.data.recipes import BENCH_SENTENCE_FILES
from disan.text.tokenizer import Vocab

# Real English words, so test texts tokenize to known ids (anything else maps to UNK = 1).
WORDS = """a an the man woman men women child children dog dogs cat people person is are was
were be not no and or but of in on at to with for from by this that it he she they there
playing plays play running runs sitting sits eating eats reading walks walking sleeping
guitar street park book table dinner field grass rain water ball car house beach
movie film story acting actors plot music scene time money year
good great best bad worst terrible boring funny moving beautiful awful fine wonderful
very really too so not quite . , ! ? ' n't 's""".split()
TINY_DIMS = {"embed_dim": 16, "d_h": 8, "head_dim": 16}


@dataclass
class TinyCheckpoints:
    """Paths of the tiny checkpoints plus what was put in them."""

    nli: Path
    sentiment: Path
    vocab: Vocab
    nli_labels: list[str]
    sentiment_labels: list[str]


def make_tiny_checkpoint(path: Path, task: str, vocab: Vocab, labels: list[str], seed: int,
                         **cfg_overrides) -> Path:
    """Save a random-weight model for `task` ("nli" | "sentiment" | "encoder", a distilled
    sentence encoder: no labels) with tiny dimensions."""
    torch = pytest.importorskip("torch")
    from disan.model import DiSANConfig, build_model
    from disan.train.checkpoint import save_checkpoint

    torch.manual_seed(seed)
    cfg = DiSANConfig(vocab_size=len(vocab), task=task, num_classes=len(labels),
                      **{**TINY_DIMS, **cfg_overrides})
    model = build_model(cfg).eval()
    # Metrics are placeholders (random weights); the export must copy them into the manifest.
    metrics = ({"dev": {"accuracy": round(1.0 / len(labels), 4)}, "test": {"accuracy": 0.0}} if labels
               else {"stsb": 0.0}) | {"note": "random weights (test fixture)"}
    save_checkpoint(path, model, vocab, labels, metrics=metrics, step=0, epoch=0)
    return path


def tiny_piece_tokenizer():
    """A WordPiece tokenizer (a `PieceTokenizer`) of 160 pieces trained on WORDS and a few more:
    some WORDS words ("man", "dog") are one piece, others ("guitar") and "phytosterol" several."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from disan.text.pieces import PieceTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    corpus = [" ".join(WORDS)] * 4 + ["phyto sterol cholesterol lowers plays playing"] * 4
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=160, special_tokens=["[UNK]"]))
    return PieceTokenizer(tok)


def member_of(first: Path, out: Path, seed: int, **cfg_overrides) -> Path:
    """A tiny sentiment model with its own attention blocks and head (`seed`) over `first`'s word
    table, as `disan train --init-words FIRST --freeze-words` leaves it: an ensemble member."""
    from disan.train.checkpoint import load_checkpoint, write_checkpoint

    payload = load_checkpoint(first)
    make_tiny_checkpoint(out, "sentiment", loaded(first)[1], payload["labels"], seed=seed, **cfg_overrides)
    member = load_checkpoint(out)
    member["model_state"]["encoder.embed.weight"] = payload["model_state"]["encoder.embed.weight"].clone()
    write_checkpoint(out, member)
    return out


def loaded(path: Path):
    """(model, vocab) of a checkpoint file, eval mode."""
    from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # torch

    model, vocab, _ = model_from_checkpoint(load_checkpoint(path))
    return model, vocab


def run_texts(model, vocab: Vocab, texts: list[str]):
    """A single-text model's output for `texts` in PyTorch (an encoder's vectors, a sentiment
    model's logits), the checkpoint's own vocabulary: the reference a bundle must reproduce."""
    import torch

    enc = vocab.encode(texts)
    with torch.no_grad():
        return model(torch.from_numpy(enc.ids), torch.from_numpy(enc.mask)).numpy()


@pytest.fixture(scope="session", autouse=True)
def shared_graph_cache(tmp_path_factory) -> Iterator[Path]:
    """One cache of traced graphs for the session (`model_export.graphs.cache`): the bundle
    fixtures export the same tiny models many times, and tracing is most of an export. Every
    bundle is still verified against PyTorch when it is built."""
    folder = tmp_path_factory.mktemp("graph-cache")
    with pytest.MonkeyPatch.context() as patch:  # the session's own monkeypatch, undone after it
        patch.setenv("DISAN_GRAPH_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="session")
def tiny_vocab() -> Vocab:
    """The shared vocabulary of the tiny checkpoints (PAD=0, UNK=1, then WORDS)."""
    return Vocab(WORDS)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, tiny_vocab) -> TinyCheckpoints:
    """A tiny NLI and a tiny sentiment checkpoint sharing one vocab (random weights)."""
    root = tmp_path_factory.mktemp("checkpoints")
    return TinyCheckpoints(
        nli=make_tiny_checkpoint(root / "nli.pt", "nli", tiny_vocab, NLI_LABELS, seed=1),
        sentiment=make_tiny_checkpoint(root / "sentiment.pt", "sentiment", tiny_vocab,
                                       SENTIMENT_LABELS, seed=2),
        vocab=tiny_vocab, nli_labels=NLI_LABELS, sentiment_labels=SENTIMENT_LABELS,
    )


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory, tiny_checkpoints) -> Path:
    """Bundle exported from `tiny_checkpoints`: the cpu graph set (chunked; fp32 + int8) and the
    gpu set (unchunked; fp16 + fp32), weights shared, verified.

    Session-scoped and shared: tests must not modify it (copy it first, see `bundle_copy`).
    """
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from model_export.export import ExportConfig, build_bundle

    out = tmp_path_factory.mktemp("bundle") / "tiny"
    build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, out, max_len=128, fp16=True,
                              int8=True, name="tiny-disan"), log=lambda *_: None)
    return out


# texts the tiny bundles' lexical table is counted from (model_export.lexical)
LEXICAL_TEXTS = ["a man is playing the guitar", "the dog runs in the park", "a woman plays music",
                 "a man and a woman", "the man is in the park"]


@pytest.fixture(scope="session")
def sparse_bundle(tmp_path_factory, tiny_bundle) -> Path:
    """`tiny_bundle` with a lexical table (POST /embed_sparse) counted from LEXICAL_TEXTS.
    Session-scoped and shared: tests must not modify it."""
    import shutil

    from model_export.lexical import add_lexical

    out = Path(shutil.copytree(tiny_bundle, tmp_path_factory.mktemp("sparse") / "tiny"))
    add_lexical(out, LEXICAL_TEXTS, bits=2)
    return out


@pytest.fixture(scope="module", params=[True, False], ids=["fastpath", "fastapi"])
def fast_path(request) -> bool:
    """`Settings.fast_path`: the API tests run with the inference routes served by
    service.http.fastpath and by FastAPI's router, which must behave the same."""
    return request.param


@pytest.fixture
def bench_sentences(tmp_path) -> Path:
    """A staged-data folder holding the offline benchmark's sentence files (tests/bench): 12 short
    sentences each (3 to 8 words, then two numbers), so every length bucket's reader finds them."""
    words = "the a man film good bad is was playing guitar".split()
    for i, rel in enumerate(BENCH_SENTENCE_FILES):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            for j in range(12):
                picked = [words[(i + j + k) % len(words)] for k in range(3 + j % 6)]
                f.write(json.dumps({"text": " ".join(picked) + f" {i} {j}"}) + "\n")
    return tmp_path


# ---- exported tiny bundles (tests/model_export/test_export.py, test_verify.py, test_weights.py) ----
@pytest.fixture
def bundle_copy(tiny_bundle, tmp_path) -> Path:
    """A private copy of the shared bundle, for tests that modify files."""
    import shutil

    return Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))


@pytest.fixture(scope="session")
def tiny_models(tiny_checkpoints):
    """(nli_model, sentiment_model) rebuilt from the fixture checkpoints, eval mode."""
    from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # torch

    nli, _, _ = model_from_checkpoint(load_checkpoint(tiny_checkpoints.nli))
    sent, _, _ = model_from_checkpoint(load_checkpoint(tiny_checkpoints.sentiment))
    return nli, sent


def ort_session(path: Path):
    import onnxruntime as ort  # the serve extra

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def padded_ids(rng, vocab_size: int, batch: int, n: int):
    """ids/mask [batch, n]: row 0 full length, the others random lengths 1..n (PAD = 0)."""
    import numpy as np

    lengths = np.concatenate([[n], rng.integers(1, n + 1, batch - 1)])
    mask = np.arange(n)[None, :] < lengths[:, None]
    return rng.integers(2, vocab_size, (batch, n)) * mask, mask


def bundle_graph_files(manifest) -> dict[str, str]:
    """file -> graph name, over every set and variant."""
    from disan.bundle.manifest import variant_files

    return {f: g for s, e in manifest["sets"].items() for v in e["variants"]
            for g, f in variant_files(manifest, s, v).items()}



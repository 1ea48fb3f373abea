"""Text in, vectors out (TORCH-FREE): the Python API on the runtime the service runs.

    from disan import Encoder
    enc = Encoder("models/default")
    vectors = enc.encode(["A man plays a guitar.", "Someone is eating."], normalize=True)
    short = enc.encode(["A man plays a guitar."], normalize=True,   # a size the model serves
                       dimensions=enc.matryoshka_dims[-1])           # (matryoshka_dims, dimensions_up_to)
    enc.similarity(["a query"], ["doc one", "doc two"])   # cosine matrix [1, 2]
    enc.encode_sparse(["a query"])                        # [(token ids, weights)]: /embed_sparse's
    enc.nli([("A man sleeps.", "Nobody is awake.")])      # [{"label", "scores"}]
    enc.sentiment(["What a film!"])                      # [{"label", "polarity", "scores"}]

One home for tokenize -> batch -> run outside the HTTP service: `disan embed` (disan.embed.cli),
its Ray actors (disan.embed.on_ray) and `disan eval --transfer` go through `Encoder` (the service
batches across requests in its micro-batcher, on the same pieces, and shares the normalisation
defined here and the predictions of disan.runtime.tasks). The pieces are the
service's own: `disan.text.tokenizer.tokenize` + the bundle's vocab, `disan.runtime.runtime.Runtime` with the
provider chosen as the service chooses it (`providers="auto"`: CUDA when it really loads, else
CPU, each with its graph set), and batches sorted by length and cut to the service's per-provider
limits (`disan.runtime.batching.PROVIDER_DEFAULTS`), so `encode` returns what `/embed` returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Literal

import numpy as np

from disan.bundle.dimensions import any_size_up_to, served_size_problem, shorten
from disan.bundle.lexical import NO_TABLE, SparseVector, hybrid_scores, sparse_dots, sparse_vector
from disan.bundle.manifest import matryoshka_dims
from disan.optional import require
from disan.runtime.batching import BatchLimits, cell_batches, provider_limits
from disan.runtime.runtime import Runtime, RuntimeOptions
from disan.runtime.tasks import nli_steps, run_steps, sentiment_prediction
from disan.text.prepare import PreparedText, flat_rows, pool, prepare_texts, row_bounds
from disan.text.windowing import EMBEDDING_LEAD, LONG_TEXT_POLICIES, LongTextPolicy

# What a text longer than the model's max_tokens becomes (disan.text.windowing, the service's policy):
# windows whose vectors are pooled, cut to max_tokens, or an error.
LongTexts = Literal["window", "truncate", "error"]
__all__ = ["LONG_TEXT_POLICIES", "Encoder", "Prepared", "TextTooLong", "normalized", "prefixed"]


class TextTooLong(ValueError):
    """A text has more tokens than `max_tokens` and the policy is `error`."""

    def __init__(self, where: int, tokens: int, limit: int):
        self.where, self.tokens, self.limit = where, tokens, limit
        super().__init__(f"text {where}: {tokens} tokens, at most {limit} (long_texts='window' embeds such "
                         "texts whole, 'truncate' cuts them)")


@dataclass
class Prepared:
    """Token id rows of some texts (`disan.text.prepare`, as the service prepares them): text i
    owns rows[bounds[i]:bounds[i + 1]] (one row, or its windows), and how many texts were cut to
    max_tokens or split into windows."""

    rows: list[list[int]]
    bounds: np.ndarray
    truncated: int = 0
    windowed: int = 0
    items: list[PreparedText] | None = None  # per text (what `pool` reads)

    @classmethod
    def of(cls, items: list[PreparedText]) -> Prepared:
        return cls(flat_rows(items), row_bounds(items), sum(t.truncated for t in items),
                   sum(t.windowed for t in items), items)

    @property
    def texts(self) -> int:
        return len(self.bounds) - 1

    @property
    def tokens(self) -> int:
        return sum(map(len, self.rows))


class Encoder:
    """A bundle's sentence encoder, NLI head and sentiment classifier, on raw text.

    `providers`/`variant`/`threads` as the service's `--providers`/`--variant`/`--intra-op-threads`
    (auto: CUDA if it really loads, else CPU; the provider's graph set in its default variant).
    `long_texts`: a text over `max_tokens` (default: the bundle's max_len) is cut into windows of
    `max_tokens` (sharing `overlap` tokens) whose vectors are pooled by their token counts
    (`window`, disan.text.windowing, as the service does), cut (`truncate`) or refused (`error`:
    `TextTooLong`). An empty text is embedded as one unknown token, as the offline runtime does.
    `spelling=False` leaves a misspelt word unknown instead of reading it as the known word one
    edit away (the service's `--spelling`).
    """

    def __init__(self, bundle: str | Path = "models/default", *, providers: str = "auto",
                 variant: str = "auto", threads: int = 0, max_tokens: int | None = None,
                 long_texts: LongTexts = "window", overlap: int = 0, spelling: bool = True,
                 runtime: Runtime | None = None):
        if long_texts not in LONG_TEXT_POLICIES:
            raise ValueError(f"long_texts={long_texts!r}: one of {', '.join(LONG_TEXT_POLICIES)}")
        self.long_texts = LongTextPolicy(long_texts)
        self.overlap = overlap
        self.runtime = runtime or Runtime(bundle, RuntimeOptions(
            providers=providers, variant=variant, intra_op_threads=threads,  # type: ignore[arg-type]
            max_tokens=max_tokens, spelling=spelling))
        self.limits: BatchLimits = provider_limits(self.runtime.provider)
        if not 0 <= overlap < self.runtime.max_tokens:
            raise ValueError(f"overlap={overlap}: from 0 to max_tokens - 1 ({self.runtime.max_tokens - 1})")

    @property
    def dim(self) -> int:
        return self.runtime.dim

    @property
    def max_tokens(self) -> int:
        return self.runtime.max_tokens

    @property
    def matryoshka_dims(self) -> list[int]:
        """The `dimensions` `encode` takes, largest (`dim`) first: the sizes the bundle's encoder
        was trained to serve as prefixes of its vector (disan.bundle.manifest.matryoshka_dims)."""
        return matryoshka_dims(self.runtime.manifest, self.dim)

    @property
    def dimensions_up_to(self) -> int:
        """Every `dimensions` from 1 to this is served too (a bundle with principal axes: the
        coordinates on its first m axes); 0 where only `matryoshka_dims` are (trained prefixes)."""
        return any_size_up_to(self.runtime.manifest)

    def __repr__(self) -> str:
        rt = self.runtime
        return (f"Encoder({rt.name!r}, dim={rt.dim}, {rt.graph_set}/{rt.variant} on {rt.provider}, "
                f"max_tokens={rt.max_tokens}, long_texts={self.long_texts.value!r})")

    # ---- tokenize ----
    def prepare(self, texts: Sequence[str], numbers: Sequence[int] | None = None,
                route: str = "embed") -> Prepared:
        """Token id rows of `texts` as `route`'s graph reads them: one per text, or a long text's
        windows (see the class). `numbers` name the texts in a `TextTooLong` message (corpus row
        numbers; default: index)."""
        items, refused = prepare_texts(texts, self.runtime.tokenizer(route), self.runtime.max_tokens,
                                       self.long_texts, self.overlap)
        if refused:
            first = refused[0]
            raise TextTooLong(numbers[first.index] if numbers is not None else first.index, first.tokens,
                              first.limit)
        return Prepared.of(items)

    def pool(self, prepared: Prepared, row_vectors: np.ndarray, lead: float = 1.0) -> np.ndarray:
        """Per-text vectors [texts, D] from per-row vectors: a windowed text's windows pooled by
        their token counts, the first window's times `lead` (disan.text.windowing.pool_windows)."""
        if prepared.windowed == 0:
            return row_vectors
        if prepared.items is None:
            raise ValueError("windows are pooled by their texts: build a Prepared with Prepared.of")
        return pool(prepared.items, row_vectors, lead)

    # ---- run ----
    def batches(self, rows: Sequence[Sequence[int]], batch_size: int | None = None) -> list[np.ndarray]:
        """Index batches of `rows`: sorted by length, cut to the provider's sentences and padded
        cells per call (`batch_size` lowers the sentences per call)."""
        limits = self.limits
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: at least 1 (None: the provider's default)")
        if batch_size:
            limits = BatchLimits(min(batch_size, limits.max_batch_size), limits.max_batch_cells)
        return cell_batches([len(r) for r in rows], limits)

    def embed_rows(self, rows: Sequence[Sequence[int]], batch_size: int | None = None,
                   progress: object | None = None, route: str = "embed") -> np.ndarray:
        """Sentence vectors float32 [len(rows), D] of token id rows, in input order (`route`
        "nli": the NLI model's vectors, what its head takes)."""
        graph = self.runtime.graph_for(route)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        for idx in self.batches(rows, batch_size):
            vectors = self.runtime.encode_with(graph, [list(rows[i]) for i in idx])
            if vectors.shape[1] != out.shape[1]:  # the NLI encoder beside a distilled one: its own width
                out = np.empty((len(rows), vectors.shape[1]), dtype=np.float32)
            out[idx] = vectors
            if progress is not None:
                progress.update(len(idx))  # type: ignore[attr-defined]
        return out

    def embed_prepared(self, prepared: Prepared, batch_size: int | None = None,
                       progress: object | None = None, route: str = "embed") -> np.ndarray:
        """Vectors float32 [texts, D] of prepared texts (windows pooled; the embed route's first
        window counting EMBEDDING_LEAD times, as the service pools them)."""
        lead = EMBEDDING_LEAD if route == "embed" else 1.0
        return self.pool(prepared, self.embed_rows(prepared.rows, batch_size, progress, route), lead)

    def encode(self, texts: str | Sequence[str], batch_size: int | None = None, normalize: bool = False,
               show_progress: bool = False, dimensions: int | None = None) -> np.ndarray:
        """Sentence vectors float32 [N, D] (a single string: [D]), L2-normalised if asked.
        `dimensions`: each vector cut to `dimensions` components (its first ones, Matryoshka; or its
        coordinates on the bundle's first principal axes), then normalised if asked; one of
        `matryoshka_dims` or any from 1 to `dimensions_up_to`, else ValueError naming them."""
        problem = None if dimensions is None else served_size_problem(dimensions, self.runtime.manifest,
                                                                      self.dim)
        if problem is not None:
            raise ValueError(problem)
        one = isinstance(texts, str)
        prepared = self.prepare(text_list([texts] if one else texts))
        with _progress(show_progress, len(prepared.rows)) as bar:
            vectors = self.embed_prepared(prepared, batch_size, bar)
        vectors = prefixed(vectors, dimensions, normalize, self.runtime.projection)
        return vectors[0] if one else vectors

    def encode_sparse(self, texts: str | Sequence[str]) -> list[SparseVector]:
        """Per text its sparse lexical vector (indices int64 ascending, values float32; unit length),
        as TEI's /embed_sparse sends it: the IDF-weighted bag of the ids `prepare` gives, every
        window of a long text (disan.bundle.lexical). A single string: a list of one. ValueError
        when the bundle has no lexical table."""
        self._idf()  # no table: the error before any tokenizing
        return self.sparse_prepared(self.prepare(text_list([texts] if isinstance(texts, str) else texts)))

    def sparse_prepared(self, prepared: Prepared) -> list[SparseVector]:
        """The sparse vectors of prepared texts (`encode_sparse` without tokenizing again: the ids
        `embed_prepared` reads); ValueError when the bundle has no lexical table."""
        idf = self._idf()
        return [sparse_vector(item.ids, idf) for item in prepared.items or []]

    def _idf(self) -> np.ndarray:
        if self.runtime.idf is None:
            raise ValueError(f"{self.runtime.bundle_dir}: this bundle {NO_TABLE}")
        return self.runtime.idf

    def iter_encode(self, texts: Iterable[str], chunk: int = 10_000, **kwargs) -> Iterator[np.ndarray]:
        """`encode` over `texts` (a list or a stream, e.g. a generator over a file) `chunk` at a
        time: memory is bounded by a chunk's tokens, not the whole input's."""
        if chunk < 1:
            raise ValueError(f"chunk={chunk}: at least 1")
        stream, first = iter(checked_container(texts)), 0
        while part := text_list(list(islice(stream, chunk)), first):
            yield self.encode(part, **kwargs)
            first += len(part)

    def similarity(self, a: str | Sequence[str], b: str | Sequence[str] | None = None,
                   hybrid: float = 0.0) -> np.ndarray:
        """Cosine similarities float64 [len(a), len(b)] (of `a` with itself without `b`); with
        `hybrid` w (0 to 1), (1 - w) x the cosine + w x the dot product of their sparse vectors
        (`encode_sparse`, from the same tokens), as /similarity's `hybrid` scores."""
        if not 0.0 <= hybrid <= 1.0:
            raise ValueError(f"hybrid={hybrid}: from 0 to 1")
        if hybrid:
            self._idf()  # no table: the error before any tokenizing

        def side(texts: str | Sequence[str]) -> tuple[np.ndarray, list[SparseVector]]:
            prepared = self.prepare(text_list([texts] if isinstance(texts, str) else texts))
            sparse = self.sparse_prepared(prepared) if hybrid else []
            return normalized(self.embed_prepared(prepared)), sparse

        va, sa = side(a)
        vb, sb = (va, sa) if b is None else side(b)
        scores = np.clip((va @ vb.T).astype(np.float64), -1.0, 1.0)
        return hybrid_scores(scores, hybrid, lambda: sparse_dots(sa, sb))

    def nli(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None) -> list[dict]:
        """Per (premise, hypothesis) pair {label, scores}: `nli_steps` (as /nli), its graphs run
        here in length-sorted batches."""
        head = self.runtime.graph_for("nli_head")
        if head not in self.runtime.graphs:
            raise ValueError(f"{self.runtime.bundle_dir}: this bundle has no nli_head graph")
        premises, hypotheses = pair_lists(pairs)
        steps = nli_steps(self.prepare(premises, route="nli").items or [],
                          self.prepare(hypotheses, route="nli").items or [], self.runtime.labels["nli"])
        return run_steps(steps, lambda route, payloads: self.run_route(route, payloads, batch_size))

    def run_route(self, route: str, payloads: list, batch_size: int | None = None) -> Sequence:
        """One result per payload of `route`'s graph: an encoder route's vectors of id rows
        (`embed_rows`), or nli_head's class probabilities of vector pairs, the provider's
        max_batch_size pairs per call."""
        if route != "nli_head":
            return self.embed_rows(payloads, batch_size, route=route)
        step = self.limits.max_batch_size
        return [probs for i in range(0, len(payloads), step)
                for probs in self.runtime.nli_head(payloads[i:i + step])]

    def sentiment(self, texts: Sequence[str], batch_size: int | None = None) -> list[dict]:
        """Per text {label, polarity, scores} (as /sentiment); a windowed text's class
        probabilities are its windows' pooled by token counts, as its vectors are."""
        if "sentiment" not in self.runtime.graphs:
            raise ValueError(f"{self.runtime.bundle_dir}: this bundle has no sentiment graph")
        prepared = self.prepare(text_list(texts), route="sentiment")
        rows = prepared.rows
        probs = np.empty((len(rows), len(self.runtime.labels["sentiment"])), dtype=np.float32)
        for idx in self.batches(rows, batch_size):
            probs[idx] = self.runtime.sentiment([rows[i] for i in idx])
        labels = self.runtime.labels["sentiment"]
        return [sentiment_prediction(p, labels) for p in self.pool(prepared, probs)]


def checked_container(items: Iterable, name: str = "texts", of: str = "str") -> Iterable:
    """`items`, or a TypeError where it is not a collection (a lone string or bytes would be read
    as one item per character)."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(f"{name}: a sequence of {of}, not {type(items).__name__}")
    return items


def text_list(texts: Iterable[str], first: int = 0) -> list[str]:
    """`texts` as a list, or a TypeError naming the first item that is not a string (a None from
    a missing value would otherwise fail deep in the tokenizer); `first`: the number of the
    first item, for a chunk of a longer input."""
    items = list(checked_container(texts))
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise TypeError(f"texts[{first + i}] is {type(text).__name__}, not str")
    return items


def pair_lists(pairs: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(premises, hypotheses) of (premise, hypothesis) pairs, or a TypeError naming the first
    pair that is not two strings."""
    checked_container(pairs, "pairs", "(premise, hypothesis) pairs")
    premises, hypotheses = [], []
    def not_a_pair(i: int, pair: object) -> TypeError:
        return TypeError(f"pairs[{i}] is not a (premise, hypothesis) pair: {pair!r:.80}")

    for i, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes)):  # "ab" would unpack into two texts
            raise not_a_pair(i, pair)
        try:
            premise, hypothesis = pair
        except (TypeError, ValueError):
            raise not_a_pair(i, pair) from None
        for part, text, out in (("premise", premise, premises), ("hypothesis", hypothesis, hypotheses)):
            if not isinstance(text, str):
                raise TypeError(f"pairs[{i}]: the {part} is {type(text).__name__}, not str")
            out.append(text)
    return premises, hypotheses


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (float32), as /embed's normalize=true."""
    vectors = vectors.astype(np.float32, copy=False)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def prefixed(vectors: np.ndarray, dimensions: int | None, normalize: bool,
             projection: np.ndarray | None) -> np.ndarray:
    """Rows cut to `dimensions` components (None: whole), then L2-normalised if `normalize`: their
    first ones (a Matryoshka vector), or with `projection` (the bundle's principal axes, Runtime.
    projection) their coordinates on its first axes (disan.bundle.dimensions)."""
    if dimensions is not None and dimensions < vectors.shape[-1]:
        vectors = shorten(vectors, dimensions, projection)
    return normalized(vectors) if normalize else vectors


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _progress(show: bool, total: int):
    """A tqdm bar in sentences (with rate and ETA), or a stand-in that shows nothing."""
    if not show:
        return _NoBar()
    tqdm = require("tqdm.auto", "embed").tqdm  # only when a bar is asked for (the `embed` extra)
    return tqdm(total=total, unit=" sentences", unit_scale=True, dynamic_ncols=True)

"""The inference engine: limits -> tokenize -> micro-batcher -> runtime -> numpy results.

HTTP-free: the handlers (service.handlers) call it. `Engine` owns the runtime, one
`MicroBatcher` per graph and the ready state. Loading and warm-up
run in the background so `/health` answers at once and `/ready` says 503 until the model is warm.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from disan.runtime import Runtime
from disan.text import tokenize
from service.batcher import BatchStats, MicroBatcher
from service.errors import InferenceError, InvalidRequest, NotReady, RequestTooLarge, ServiceError
from service.metrics import Metrics, multiprocess_dir
from service.settings import Settings
from service.timing import CURRENT
from service.workers import WorkerReadiness

log = logging.getLogger("disan.service")
# Requests with more characters than this are tokenized in a thread so the loop stays responsive.
_INLINE_CHARS = 20_000
# What /health and /ready say about a failed load: the reason (paths, onnxruntime's text) is logged,
# never served to clients that may not even hold the API key.
FAILED_DETAIL = "the model bundle failed to load; the reason is in the server log"
# After the drain deadline, how long the batchers may take to finish the onnxruntime calls already
# running (their callers were answered 503 at the deadline).
STOP_GRACE_S = 2.0


@dataclass
class Tokenized:
    """Token strings and ids of one text (already truncated)."""

    tokens: list[str]
    ids: list[int]


def polarity_of(label: str) -> str:
    """Coarse polarity of a fine sentiment label ('very negative' -> 'negative')."""
    low = label.lower()
    return "negative" if "neg" in low else "positive" if "pos" in low else "neutral"


class Engine:
    """Process-wide state of one app: runtime, batchers, readiness."""

    def __init__(self, settings: Settings, metrics: Metrics):
        self.settings = settings
        self.metrics = metrics
        self.state = "loading"
        self.detail: str | None = None
        self.runtime: Runtime | None = None
        self.batchers: dict[str, MicroBatcher] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._loader: asyncio.Task | None = None
        self.draining = False
        self._drain_timer: asyncio.TimerHandle | None = None
        self.workers = WorkerReadiness(multiprocess_dir(), settings.workers)

    # ---- lifecycle ----
    async def start(self) -> None:
        """Begin loading + warm-up in the background (the app serves /health meanwhile)."""
        self._loader = asyncio.create_task(self._load(), name="disan-load")

    async def wait_ready(self) -> None:
        """Wait until loading finished (successfully or not)."""
        if self._loader is not None:
            await asyncio.shield(self._loader)

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            runtime = await loop.run_in_executor(None, self._load_sync)
        except Exception as exc:  # noqa: BLE001 - reported by /ready and /health, then logged
            self.state, self.detail = "failed", FAILED_DETAIL
            log.error("cannot load the bundle: %s: %s", type(exc).__name__, exc)
            return
        self.runtime = runtime
        s = self.settings
        self._executor = ThreadPoolExecutor(max_workers=len(runtime.graphs) * runtime.batch_concurrency,
                                            thread_name_prefix="ort")
        stats = BatchStats(on_batch=self.metrics.on_batch, on_depth=self.metrics.on_depth)
        runners: dict[str, tuple[Any, Any]] = {
            "encoder": (runtime.embed, len),
            "nli": (runtime.nli, lambda pair: max(len(pair[0]), len(pair[1]))),
            "sentiment": (runtime.sentiment, len),
            "sentiment_explain": (runtime.explain, len),
        }
        for name in runtime.graphs:
            fn, length = runners[name]
            # Explain calls are rare and each one's memory is large (attention maps): one at a time
            # bounds what onnxruntime's arena grows to for them (bench/RESULTS.md, chaos).
            concurrency = 1 if name == "sentiment_explain" else runtime.batch_concurrency
            self.batchers[name] = MicroBatcher(
                name, fn, length=length, max_batch_size=s.max_batch_size, max_wait_ms=s.max_wait_ms,
                max_batch_cells=s.max_batch_cells, queue_limit=s.queue_limit,
                concurrency=concurrency, executor=self._executor,
                stats=stats)
            await self.batchers[name].start()
        self.state = "ready"
        if not self.draining:
            self.workers.mark_ready()
        log.info("ready: %s (dim %d) on %s", runtime.name, runtime.dim, runtime.providers)

    def _load_sync(self) -> Runtime:
        runtime = Runtime(self.settings.bundle, self.settings.runtime_options())
        runtime.warmup()
        if runtime.has_explain:
            # The explain graph's memory grows with the square of the longest sentence (attention
            # maps); one call at max_tokens takes it now, so no request grows a ready worker's RSS
            # by that much (the other graphs need little more at max_tokens: bench/RESULTS.md).
            runtime.explain([[1] * runtime.max_tokens])
        return runtime

    def begin_drain(self) -> None:
        """Shutdown began (SIGTERM): /ready says 503 at once; work in progress goes on until the
        drain deadline, then every request still waiting is answered 503 (`abort`). Idempotent."""
        if self.draining:
            return
        self.draining = True
        self.workers.mark_gone()
        loop = asyncio.get_running_loop()
        self._drain_timer = loop.call_later(self.settings.drain_timeout_s, self.abort,
                                            "drain deadline passed")
        log.info("draining: requests still waiting in %g s are answered 503", self.settings.drain_timeout_s)

    def abort(self, why: str) -> None:
        """Answer every queued or running request 503 now (they would be cut off otherwise)."""
        told = sum(b.abort(NotReady(f"server is shutting down ({why})")) for b in self.batchers.values())
        if told:
            log.warning("%s: %d sentences answered 503", why, told)

    async def stop(self) -> None:
        """Stop accepting work, drain every batcher (within what is left of the drain deadline),
        release the executor."""
        self.workers.mark_gone()
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
        if self.state == "ready":
            self.state = "draining"
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        timeout = STOP_GRACE_S if self.draining else self.settings.drain_timeout_s
        await asyncio.gather(*(b.stop(timeout) for b in self.batchers.values()))
        if self._executor is not None:
            # Calls still running after the batchers' timeout belong to answered requests.
            self._executor.shutdown(wait=False, cancel_futures=True)
        self.metrics.close()
        log.info("stopped: batchers drained")

    def queued_seconds(self) -> float:
        """Estimated seconds of model work waiting in the batchers (admission control)."""
        return sum(b.queued_seconds() for b in self.batchers.values())

    def readiness(self) -> tuple[str, str | None]:
        """(state, detail) for /ready: "ready" only when this worker and every other one is."""
        if self.state != "ready":
            return self.state, self.detail
        if self.draining:
            return "draining", None
        every, why = self.workers.all_ready()
        return ("ready", None) if every else ("loading", why)

    def require_ready(self) -> Runtime:
        """The runtime, or NotReady (503) while loading/draining/failed."""
        if self.state != "ready" or self.runtime is None:
            raise NotReady(f"model not ready ({self.state})")
        return self.runtime

    # ---- input checks ----
    def prepare(self, texts: list[str], truncate: bool, field: str = "texts", member: str = "",
                max_tokens: int | None = None) -> list[Tokenized]:
        """Enforce limits cheaply first (count, characters), then tokenize and check tokens.

        Locations in errors read ``{field}[i]{member}`` (``texts[0]``, ``pairs[2].premise``), the
        API's one notation; `max_tokens` lowers the bundle's limit (explain requests)."""
        runtime = self.require_ready()
        t0 = time.perf_counter()
        limit = min(runtime.max_tokens, max_tokens or runtime.max_tokens)
        s = self.settings
        if not texts:
            raise InvalidRequest(f"{field}: the list is empty")
        if len(texts) > s.max_texts_per_request:
            raise RequestTooLarge(f"{field}: {len(texts)} items, at most {s.max_texts_per_request} "
                                  "per request")
        for i, text in enumerate(texts):
            if len(text) > s.max_chars_per_text:
                raise RequestTooLarge(f"{field}[{i}]{member}: {len(text)} characters, at most "
                                      f"{s.max_chars_per_text}")
        out = []
        for i, text in enumerate(texts):
            tokens = tokenize(text)
            if not tokens:
                raise InvalidRequest(f"{field}[{i}]{member}: contains no tokens (only spaces or control "
                                     "characters)")
            if len(tokens) > limit:
                if not truncate:
                    raise InvalidRequest(f"{field}[{i}]{member}: {len(tokens)} tokens, at most {limit} "
                                         "(send truncate=true to cut it)")
                tokens = tokens[:limit]
            out.append(Tokenized(tokens, runtime.vocab.ids(tokens)))
        timing = CURRENT.get()
        if timing is not None:
            timing.tokenize_s += time.perf_counter() - t0
            timing.tokens += sum(len(t.ids) for t in out)
        return out

    async def prepare_async(self, texts: list[str], truncate: bool, field: str = "texts", member: str = "",
                            max_tokens: int | None = None) -> list[Tokenized]:
        """`prepare`, moved off the event loop when the request carries a lot of text."""
        if sum(map(len, texts)) > _INLINE_CHARS:
            return await asyncio.to_thread(self.prepare, texts, truncate, field, member, max_tokens)
        return self.prepare(texts, truncate, field, member, max_tokens)

    def check_explain(self, texts: list[str], field: str = "texts") -> None:
        """Explain answers grow with texts x tokens^2 (attention maps): bounded before any work."""
        if len(texts) > self.settings.max_explain_texts:
            raise RequestTooLarge(f"{field}: {len(texts)} items with explain=true, at most "
                                  f"{self.settings.max_explain_texts}")

    def check_explain_tokens(self, items: list[Tokenized]) -> None:
        """The tokens of an explain request, after tokenizing and before inference."""
        tokens = sum(len(t.ids) for t in items)
        if tokens > self.settings.max_explain_tokens:
            raise RequestTooLarge(f"explain: {tokens} tokens in the request, at most "
                                  f"{self.settings.max_explain_tokens} with explain=true")

    async def _run(self, graph: str, payloads: list[Any]) -> list[Any]:
        try:
            return await self.batchers[graph].run(payloads, CURRENT.get())
        except ServiceError:
            raise
        except Exception as exc:  # ORT failures etc.: logged in full, reported generically
            raise InferenceError(f"{graph}: {type(exc).__name__}: {exc}") from exc

    # ---- tasks ----
    async def embed(self, texts: list[str], normalize: bool, truncate: bool,
                    field: str = "texts") -> tuple[np.ndarray, int]:
        """Sentence vectors float32 [B, D] and the token count."""
        items = await self.prepare_async(texts, truncate, field)
        rows = await self._run("encoder", [t.ids for t in items])
        vectors = np.stack(rows).astype(np.float32, copy=False)
        if normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, 1e-12)
        return vectors, sum(len(t.ids) for t in items)

    async def nli(self, pairs: list[tuple[str, str]], truncate: bool) -> tuple[list[dict], int]:
        """Per pair {label, scores} and the token count."""
        runtime = self.require_ready()
        if len(pairs) > self.settings.max_texts_per_request:
            raise RequestTooLarge(f"pairs: {len(pairs)} items, at most "
                                  f"{self.settings.max_texts_per_request} per request")
        premises = await self.prepare_async([p for p, _ in pairs], truncate, "pairs", ".premise")
        hypotheses = await self.prepare_async([h for _, h in pairs], truncate, "pairs", ".hypothesis")
        probs = await self._run("nli", [(p.ids, h.ids) for p, h in zip(premises, hypotheses, strict=True)])
        labels = runtime.labels["nli"]
        tokens = sum(len(p.ids) + len(h.ids) for p, h in zip(premises, hypotheses, strict=True))
        return [self._prediction(row, labels) for row in probs], tokens

    async def sentiment(self, texts: list[str], truncate: bool, explain: bool) -> tuple[list[dict], int]:
        """Per text {label, polarity, scores[, explanation]} and the token count."""
        runtime = self.require_ready()
        if explain and not runtime.has_explain:
            raise InvalidRequest("explain: this bundle has no sentiment_explain graph")
        if explain:
            self.check_explain(texts)
        items = await self.prepare_async(texts, truncate)
        labels = runtime.labels["sentiment"]
        results = []
        if explain:
            self.check_explain_tokens(items)
            outs = await self._run("sentiment_explain", [t.ids for t in items])
            for item, out in zip(items, outs, strict=True):
                pred = self._sentiment_prediction(out["probs"], labels)
                pred["explanation"] = _explanation(item, out)
                results.append(pred)
        else:
            probs = await self._run("sentiment", [t.ids for t in items])
            results = [self._sentiment_prediction(row, labels) for row in probs]
        return results, sum(len(t.ids) for t in items)

    @staticmethod
    def _prediction(probs: np.ndarray, labels: list[str]) -> dict:
        scores = {label: float(p) for label, p in zip(labels, probs, strict=True)}
        return {"label": labels[int(np.argmax(probs))], "scores": scores}

    def _sentiment_prediction(self, probs: np.ndarray, labels: list[str]) -> dict:
        pred = self._prediction(probs, labels)
        coarse = {"negative": 0.0, "neutral": 0.0, "positive": 0.0}
        for label, p in pred["scores"].items():
            coarse[polarity_of(label)] += p
        pred["polarity"] = max(coarse, key=coarse.__getitem__)
        return pred


def _per_token(a: np.ndarray) -> list[float]:
    """[n] or [n, d] -> one float per token (mean over features)."""
    return (a.mean(axis=-1) if a.ndim > 1 else a).astype(float).tolist()


def _explanation(item: Tokenized, out: dict[str, np.ndarray]) -> dict:
    return {
        "tokens": item.tokens,
        "token_weights": _per_token(out["s2t"]),
        "gate_fw": _per_token(out["gate_fw"]),
        "gate_bw": _per_token(out["gate_bw"]),
        "attention_fw": out["attn_fw"].astype(float).tolist(),
        "attention_bw": out["attn_bw"].astype(float).tolist(),
    }

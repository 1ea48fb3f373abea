"""The inference engine: limits -> tokenize -> micro-batcher -> runtime -> numpy results.

HTTP-free: the handlers (service.http.handlers) call it. `Engine` owns the runtime, one
`MicroBatcher` per graph and the ready state. Loading and warm-up
run in the background so `/health` answers at once and `/ready` says 503 until the model is warm.
The requests that run no graph (tokens, ids, sparse vectors) are `service.inference.tokenizing`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

# the predictions' shape and the normalisation are disan.Encoder's too: the same answers offline
from disan.bundle.lexical import NO_TABLE
from disan.runtime.encoder import normalized
from disan.runtime.runtime import Runtime
from disan.runtime.tasks import nli_steps, prediction, run_steps_async, sentiment_prediction
from disan.text.windowing import LongTextPolicy
from service.backend.batcher import BatchStats, MicroBatcher
from service.backend.model import STOP_GRACE_S, load_runtime, make_batchers
from service.common.batching_defaults import Batching, resolve_batching
from service.common.errors import (
    InferenceError,
    InvalidRequest,
    NotReady,
    RequestTooLarge,
    ServiceError,
)
from service.common.metrics import Metrics, multiprocess_dir
from service.common.timing import CURRENT, Stage
from service.common.workers import WorkerReadiness
from service.inference.explain import (
    check_explain,
    check_explain_tokens,
    leave_one_out_rows,
    nli_explanation,
    sentiment_explanation,
    token_weights,
)
from service.inference.longtext import (
    TRUNCATE_LEFT,
    Limits,
    Tokenized,
    check_chars,
    flat_rows,
    pool_embedding_rows,
    pool_rows,
    prepare_texts,
    require_fitting,
)
from service.settings import Settings

log = logging.getLogger("disan.service")
# Requests with more characters than this are tokenized in a thread so the loop stays responsive.
INLINE_CHARS = 20_000
INLINE_TOKENS = 4_000  # about as many tokens
# What /health and /ready say about a failed load: the reason (paths, onnxruntime's text) is logged,
# never served to clients that may not even hold the API key.
FAILED_DETAIL = "the model bundle failed to load; the reason is in the server log"


class Engine:
    """Process-wide state of one app: runtime, batchers, readiness."""

    def __init__(self, settings: Settings, metrics: Metrics):
        self.settings = settings
        self.metrics = metrics
        self.state = "loading"
        self.detail: str | None = None
        self.runtime: Runtime | None = None
        self.batchers: dict[str, MicroBatcher] = {}
        self.batching: Batching | None = None  # resolved for the provider that loaded (/info)
        self._executor: ThreadPoolExecutor | None = None
        self._loader: asyncio.Task | None = None
        # Called with the reason when loading fails; `disan serve` sets it to end the process.
        self.on_load_failure: Callable[[str], None] | None = None
        self.draining = False
        self._drain_timer: asyncio.TimerHandle | None = None
        self.workers = WorkerReadiness(multiprocess_dir(), settings.workers)

    # ---- lifecycle ----
    async def start(self) -> None:
        """Begin loading + warm-up in the background (the app serves /health meanwhile)."""
        self._loader = asyncio.create_task(self._load(), name="disan-load")

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            runtime = await loop.run_in_executor(None, self._load_sync)
        except Exception as exc:  # noqa: BLE001 - reported by /ready and /health, then logged
            self.state, self.detail = "failed", FAILED_DETAIL
            reason = f"{type(exc).__name__}: {exc}"
            log.error("cannot load the bundle: %s", reason)
            if self.on_load_failure is not None:
                self.on_load_failure(reason)
            return
        self.runtime = runtime
        self._executor = ThreadPoolExecutor(max_workers=len(runtime.graphs) * runtime.batch_concurrency,
                                            thread_name_prefix="ort")
        stats = BatchStats(on_batch=self.metrics.on_batch, on_depth=self.metrics.on_depth)
        self.batching = resolve_batching(self.settings.max_batch_size, self.settings.max_batch_cells,
                                         runtime.provider, self.settings.batch_concurrency)
        self.batchers.update(make_batchers(runtime, self.settings, self.batching, self._executor, stats,
                                           self.settings.queue_limit))
        for batcher in self.batchers.values():
            await batcher.start()
        self.state = "ready"
        if not self.draining:
            self.workers.mark_ready()
        log.info("ready: %s (dim %d), graph set %s/%s on %s", runtime.name, runtime.dim, runtime.graph_set,
                 runtime.variant, runtime.providers)

    def _load_sync(self) -> Runtime:
        runtime = load_runtime(self.settings)
        if self.settings.rerank_hybrid and runtime.idf is None:
            raise ValueError(f"rerank_hybrid is {self.settings.rerank_hybrid}, but this bundle {NO_TABLE}")
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
    def check_sizes(self, texts: list[str], field: str, max_items: int | None = None,
                    member: str = "") -> None:
        """The cheap limits, before any tokenizing: item count (default max_texts_per_request), characters.

        Locations in errors read ``{field}[i]{member}`` (``texts[0]``, ``pairs[2].premise``), the
        API's one notation."""
        self.check_count(texts, field, max_items)
        check_chars(texts, field, member, self.settings.max_chars_per_text)

    def check_count(self, items: Sequence[object], field: str, max_items: int | None = None) -> None:
        """At least one item, at most `max_items` (default max_texts_per_request)."""
        limit = max_items or self.settings.max_texts_per_request
        if not items:
            raise InvalidRequest(f"{field}: the list is empty")
        if len(items) > limit:
            raise RequestTooLarge(f"{field}: {len(items)} items, at most {limit} per request")

    def limits(self, policy: LongTextPolicy | str) -> Limits:
        """The long-text limits of a request under `policy` (service.inference.longtext; its
        TRUNCATE_LEFT is truncate keeping the end)."""
        s = self.settings
        window = self.require_ready().max_tokens  # the setting, capped by the bundle's max_len
        keep_end = policy == TRUNCATE_LEFT
        return Limits(max_tokens=window, keep_end=keep_end,
                      policy=LongTextPolicy.TRUNCATE if keep_end else LongTextPolicy(policy),
                      overlap=min(s.window_overlap, window - 1), max_tokens_per_text=s.max_tokens_per_text,
                      max_tokens_per_request=s.max_tokens_per_request)

    def prepare(self, texts: list[str], policy: LongTextPolicy | str, field: str = "texts",
                max_items: int | None = None, member: str = "", route: str = "embed") -> list[Tokenized]:
        """Enforce limits cheaply first (count, characters), then tokenize (as `route`'s graph
        reads), window and check tokens."""
        runtime = self.require_ready()
        t0 = time.perf_counter()
        self.check_sizes(texts, field, max_items, member)
        out = prepare_texts(texts, runtime.tokenizer(route), self.limits(policy), field, member)
        timing = CURRENT.get()
        if timing is not None:
            t1 = time.perf_counter()
            timing.tokenize_s += t1 - t0
            tokens = sum(len(t.ids) for t in out)
            timing.tokens += tokens
            if timing.stages is not None:
                timing.stages.append(Stage("tokenize", t0, t1, {
                    "disan.texts": len(texts), "disan.rows": sum(len(t.rows) for t in out),
                    "disan.tokens": tokens}))
        return out

    async def prepare_async(self, texts: list[str], policy: LongTextPolicy | str, field: str = "texts",
                            max_items: int | None = None, member: str = "", route: str = "embed"
                            ) -> list[Tokenized]:
        """`prepare`, moved off the event loop when the request carries a lot of text."""
        if sum(map(len, texts)) > INLINE_CHARS:
            return await asyncio.to_thread(self.prepare, texts, policy, field, max_items, member, route)
        return self.prepare(texts, policy, field, max_items, member, route)

    async def _run(self, graph: str, payloads: list[Any]) -> list[Any]:
        try:
            return await self.batchers[graph].run(payloads, CURRENT.get())
        except ServiceError:
            raise
        except Exception as exc:  # ORT failures etc.: logged in full, reported generically
            raise InferenceError(f"{graph}: {type(exc).__name__}: {exc}") from exc

    async def _run_rows(self, graph: str, rows: list[Any]) -> list[Any]:
        """`rows` through one batcher, max_texts_per_request at a time, one chunk after the other:
        a request of many texts or long (windowed) ones never holds more of the queue than any
        request can, so it can never be refused for its size alone, and the batcher's
        fewest-left-first order lets short requests pass it."""
        step = self.settings.max_texts_per_request
        if len(rows) <= step:
            return await self._run(graph, rows)
        out: list[Any] = []
        for start in range(0, len(rows), step):
            out += await self._run(graph, rows[start:start + step])
        return out

    async def _run_route(self, route: str, rows: list[Any]) -> list[Any]:
        """`_run_rows` on the graph serving `route` (a driver's call of disan.runtime.encoder's steps)."""
        return await self._run_rows(self.require_ready().graph_for(route), rows)

    # ---- tasks ----
    async def embed(self, texts: list[str], normalize: bool, policy: LongTextPolicy | str,
                    field: str = "texts", max_items: int | None = None, member: str = ""
                    ) -> tuple[np.ndarray, list[Tokenized]]:
        """Vectors float32 [B, D] of up to `max_items` texts (default max_texts_per_request; a
        long text's is its windows' pooled vector, `pool_embedding_rows`) and the prepared texts (token
        counts, notes)."""
        items = await self.prepare_async(texts, policy, field, max_items, member)
        outs = await self._run_rows(self.require_ready().graph_for("embed"), flat_rows(items))
        vectors = pool_embedding_rows(items, outs)
        return normalized(vectors) if normalize else vectors, items

    async def embed_explained(self, texts: list[str], normalize: bool, policy: LongTextPolicy | str
                              ) -> tuple[np.ndarray, list[Tokenized], list[dict]]:
        """`embed` plus, per text, its tokens and source2token weights (one explain-graph call)."""
        runtime = self.require_ready()
        graph = runtime.graph_for("embed_explain")
        check_explain(runtime, len(texts), "texts", graph, self.settings.max_explain_texts)
        items = await self.prepare_async(texts, policy)
        require_fitting(items, "texts")
        check_explain_tokens(self.settings.max_explain_tokens, items)
        outs = await self._run(graph, [t.rows[0] for t in items])
        explanations = [token_weights(item.tokens, out) for item, out in zip(items, outs, strict=True)]
        vectors = np.stack([o["embedding"] for o in outs]).astype(np.float32, copy=False)
        return normalized(vectors) if normalize else vectors, items, explanations

    async def nli(self, pairs: list[tuple[str, str]], policy: LongTextPolicy | str, explain: bool = False
                  ) -> tuple[list[dict], int]:
        """Per pair {label, scores[, explanation]} and the token count: `nli_steps` (the NLI
        route's encoder on both sentences, a long one's windows pooled, in the /embed batches
        unless the bundle has a distilled encoder for /embed; then the head on the vector pairs).
        An explained pair runs the explain graph and one head row per token instead."""
        runtime = self.require_ready()
        encoder_explain, head = runtime.graph_for("nli_explain"), runtime.graph_for("nli_head")
        if len(pairs) > self.settings.max_texts_per_request:
            raise RequestTooLarge(f"pairs: {len(pairs)} items, at most "
                                  f"{self.settings.max_texts_per_request} per request")
        if explain:
            check_explain(runtime, len(pairs), "pairs", encoder_explain, self.settings.max_explain_texts)
        premises = await self.prepare_async([p for p, _ in pairs], policy, "pairs", member=".premise",
                                            route="nli")
        hypotheses = await self.prepare_async([h for _, h in pairs], policy, "pairs", member=".hypothesis",
                                              route="nli")
        labels = runtime.labels["nli"]
        tokens = sum(len(p.ids) + len(h.ids) for p, h in zip(premises, hypotheses, strict=True))
        if not explain:  # the one NLI path, its graph calls queued in this worker's batchers
            return await run_steps_async(nli_steps(premises, hypotheses, labels), self._run_route), tokens
        require_fitting(premises, "pairs", ".premise")
        require_fitting(hypotheses, "pairs", ".hypothesis")
        check_explain_tokens(self.settings.max_explain_tokens, premises, hypotheses)
        outs = await self._run_rows(encoder_explain, [t.rows[0] for t in premises + hypotheses])
        sides = list(zip(outs[:len(premises)], outs[len(premises):], strict=True))
        rows = await self._run(head, [leave_one_out_rows(p, h) for p, h in sides])
        results = []
        for (p_item, h_item), (p_out, h_out), probs in zip(zip(premises, hypotheses, strict=True), sides,
                                                           rows, strict=True):
            pred = prediction(probs[0], labels)
            pred["explanation"] = nli_explanation(p_item.tokens, h_item.tokens, p_out, h_out, probs)
            results.append(pred)
        return results, tokens

    async def sentiment(self, texts: list[str], policy: LongTextPolicy | str, explain: bool
                        ) -> tuple[list[dict], int]:
        """Per text {label, polarity, scores[, explanation]} and the token count (a long text's
        class probabilities: its windows' token-weighted mean)."""
        runtime = self.require_ready()
        if explain:
            check_explain(runtime, len(texts), "texts", runtime.graph_for("sentiment_explain"),
                          self.settings.max_explain_texts)
        items = await self.prepare_async(texts, policy, route="sentiment")
        labels = runtime.labels["sentiment"]
        results = []
        if explain:
            require_fitting(items, "texts")
            check_explain_tokens(self.settings.max_explain_tokens, items)
            outs = await self._run(runtime.graph_for("sentiment_explain"), [t.rows[0] for t in items])
            for item, out in zip(items, outs, strict=True):
                pred = sentiment_prediction(out["probs"], labels)
                pred["explanation"] = sentiment_explanation(item.tokens, out)
                results.append(pred)
        else:
            probs = pool_rows(items, await self._run_rows(runtime.graph_for("sentiment"), flat_rows(items)))
            results = [sentiment_prediction(row, labels) for row in probs]
        return results, sum(len(t.ids) for t in items)

    async def embed_together(self, groups: list[tuple[list[str], str]], policy: LongTextPolicy | str,
                             max_items: int | None = None) -> list[tuple[np.ndarray, list[Tokenized]]]:
        """Normalised vectors of several lists of texts (rerank's query and its texts), each list
        checked and tokenized under its own field (errors name `query`, `texts[3]`), then all their
        rows queued in the batcher at once: one pass, as /embed of them all would take."""
        prepared = [await self.prepare_async(texts, policy, field, max_items) for texts, field in groups]
        outs = await self._run_rows(self.require_ready().graph_for("embed"),
                                    [row for items in prepared for row in flat_rows(items)])
        results, start = [], 0
        for items in prepared:
            rows = len(flat_rows(items))
            results.append((normalized(pool_embedding_rows(items, outs[start:start + rows])), items))
            start += rows
        return results

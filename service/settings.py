"""Operational settings of the service (pydantic-settings, environment prefix ``DISAN_``).

Only operational knobs live here; the model's shape (dim, labels, max length) comes from the
bundle manifest. Every field is settable as ``DISAN_<FIELD>`` (e.g. ``DISAN_PORT=9000``,
``DISAN_CORS_ORIGINS='["https://example.org"]'``) and by the matching `disan serve` flag, which
wins over the environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from disan.runtime.ort_session import OptimizationLevel, Providers, Variant
from disan.runtime.runtime import RuntimeOptions
from disan.text.windowing import LongTextPolicy
from service.common.batching_defaults import PROVIDER_DEFAULTS

# service/ sits next to models/ in the repository (and in an editable install).
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BUNDLE_REL = Path("models") / "default"


def _auto(knob: str) -> str:
    """The auto values of a batching knob per provider, for its help text ("64 on CPU, ...")."""
    return ", ".join(f"{getattr(limits, knob)} on {provider.removesuffix('ExecutionProvider')}"
                     for provider, limits in PROVIDER_DEFAULTS.items())


def default_bundle_dir() -> Path:
    """The shipped bundle: ``./models/default`` if the working directory has one, else the repo's.

    The cwd is tried first so a container (WORKDIR holding ``models/default``) and a plain
    ``pip install .`` run from a checkout both work; an editable install finds the repo copy.
    """
    cwd_bundle = Path.cwd() / DEFAULT_BUNDLE_REL
    if cwd_bundle.is_dir():
        return cwd_bundle
    return PACKAGE_ROOT / DEFAULT_BUNDLE_REL


class Settings(BaseSettings):
    """Service configuration; see the module docstring for how to set each field."""

    # populate_by_name: the fields that also read a standard variable (validation_alias) are still
    # set by name (`disan serve`'s flags, tests).
    model_config = SettingsConfigDict(env_prefix="DISAN_", extra="ignore", validate_default=True,
                                      populate_by_name=True)

    # --- where and what to serve ---
    bundle: Path = Field(default_factory=default_bundle_dir,
                         description="bundle directory (manifest.json, *.onnx, vocab.json)")
    host: str = Field("127.0.0.1", description="interface to bind")
    port: int = Field(8000, ge=1, le=65535, description="TCP port")
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes (each loads the bundle)")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    access_log: bool = Field(
        False, description="uvicorn's access log, one line per request (off by default: its CPU cost "
        "per request is in bench/RESULTS.md; /metrics counts requests by route and status)")

    # --- onnxruntime ---
    providers: Providers = Field(
        "auto", description="auto: CUDA if it really loads, else CPU; cuda: fail if CUDA is unusable")
    intra_op_threads: int = Field(0, ge=0, le=256, description="ORT threads per call; 0: 1 with "
                                  "batch_concurrency auto on CPU, else onnxruntime's choice")
    inter_op_threads: int = Field(0, ge=0, le=256, description="0 lets onnxruntime choose")
    ort_spinning: bool = Field(
        False, description="let onnxruntime's idle threads spin (lowest latency when the CPU is "
        "otherwise idle; off by default: spinning steals the cores the HTTP layer needs)")
    graph_optimization_level: OptimizationLevel = "all"
    variant: Variant = Field(
        "auto", description="graph variant to load; auto: the default of the graph set of the "
        "provider that loaded (gpu set: fp16, cpu set: fp32)")

    # --- request limits (checked before tokenizing) ---
    max_texts_per_request: int = Field(256, ge=1, le=100_000)
    # 100,000 characters: a document at the 8,192-token limit below with room to spare (~5 per token).
    max_chars_per_text: int = Field(100_000, ge=1, le=10_000_000)
    # The window (bench/windows.py measures 128/256/512; bench/RESULTS.md says why this default).
    max_tokens: int = Field(128, ge=1, le=100_000,
                            description="the window: longest row fed to the model; longer texts are "
                            "handled by long_text; capped by the bundle's max_len")
    long_text: LongTextPolicy = Field(
        LongTextPolicy.WINDOW, description="texts over max_tokens on /embed, /similarity, /nli and "
        "/sentiment when the request does not say: window (cut into windows, pooled), truncate, "
        "error (422)")
    spelling: bool = Field(True, description="read an unknown word of 5 to 24 letters a-z that is one "
                           "edit from a known word as that word (/tokenize shows it); false: unknown")
    window_overlap: int = Field(0, ge=0, le=100_000, description="tokens consecutive windows share "
                                "(< max_tokens)")
    max_tokens_per_text: int = Field(8192, ge=1, le=10_000_000, description="longest text windowed "
                                     "(OpenAI's limit); longer -> 413 naming it")
    # Bounds a request's memory and model time; checked after tokenizing, before any model work.
    max_tokens_per_request: int = Field(1 << 20, ge=1, le=100_000_000,
                                        description="tokens in one request, all texts; more -> 413")

    # 16 MiB: LangChain's default 1,000 chunks of a few hundred tokens each is ~4 MiB of JSON.
    max_request_bytes: int = Field(16 * 1024 * 1024, ge=1024,
                                   description="request bodies above this are refused with 413 unread")

    # --- micro-batching ---
    queue_limit: int = Field(4096, ge=1, description="max sentences waiting per graph; more -> 429")
    # 0 = auto: chosen per execution provider once the runtime has loaded (batching_defaults).
    max_batch_size: int = Field(0, ge=0, le=4096, description="sentences per ORT call; 0 = auto: "
                                f"{_auto('max_batch_size')} (/info says which)")
    # 0 = continuous batching: a batch takes whatever queued while the previous call ran; waiting
    # to fill a batch cost throughput at low concurrency and gained nothing at high (RESULTS.md).
    max_wait_ms: float = Field(0.0, ge=0.0, le=1000.0,
                               description="how long a batch waits to fill (0: take what is queued)")
    # On a CPU, past a few thousand cells the [B,n,n,d] attention tensors leave the caches and a
    # bigger call is slower per sentence (bench/cells.py); a GPU needs far bigger calls (bench/gpu.py).
    max_batch_cells: int = Field(0, ge=0, description="padded-cells budget per ORT call: batch x "
                                 f"max_len^2; 0 = auto: {_auto('max_batch_cells')}")
    # Several single-threaded ORT calls at once beat one call with as many intra-op threads on a
    # CPU (intra-op threads scale poorly on small batches; bench/service.py).
    batch_concurrency: int = Field(
        0, ge=0, le=64, description="ORT calls in flight per graph; 0 = auto: 1 on CUDA, on CPU one "
        "call per core of this worker (cores / workers), each with 1 ORT thread unless "
        "intra_op_threads is set")

    # --- HTTP ---
    # FastAPI's per-request machinery costs about as much CPU as the model for one-sentence
    # requests (bench/overhead.py); the fast path serves the same contract without it.
    fast_path: bool = Field(True, description="serve the POST inference routes through "
                            "service.http.fastpath (same API; false: through FastAPI's router)")

    # --- access ---
    api_key: SecretStr | None = Field(None, description="if set, require `Authorization: Bearer <key>`")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="allowed CORS origins: JSON list or comma-separated")

    # --- identity reported by the API ---
    model_name: str | None = Field(None, description="name reported by the API (default: manifest's)")

    # --- reliability: admission, hostile clients, shutdown (issue 14; bench/chaos.py) ---
    # Requests are admitted before their body is read or parsed, so a refusal costs microseconds;
    # the batcher interleaves the admitted ones, so this bounds how long each one waits.
    max_concurrent_requests: int = Field(
        64, ge=1, le=100_000, description="inference requests in progress per worker; more -> 429 "
        "with Retry-After, answered before the body is read")
    max_queue_wait_s: float = Field(
        0.5, gt=0, le=3600, description="requests over 1 KiB wait while the work queued in this worker "
        "is estimated at more than this (small ones pass big ones in the batcher)")
    admission_wait_s: float = Field(
        1.0, ge=0, le=60, description="a request that cannot start waits this long at most (newest "
        "first, body unread) before its 429: clients retrying at once cannot storm the CPU")
    max_header_bytes: int = Field(32 * 1024, ge=1024, le=16 * 1024 * 1024,
                                  description="request line + headers above this -> 431, connection closed")
    header_timeout_s: float = Field(10.0, gt=0, le=3600, description="a connection that has not sent "
                                    "a complete request head this long after it started is closed")
    body_timeout_s: float = Field(30.0, gt=0, le=3600,
                                  description="a request body not received in full by then -> 408")
    # JSON parsing allocates per item and pydantic reports one error per bad item, so a 4 MiB body
    # of `[1,1,...]` would cost gigabytes; items are counted before parsing (strings excluded).
    max_json_items: int = Field(16_384, ge=64, description="commas, brackets and braces outside "
                                "strings per request body; more -> 413 before parsing")
    drain_timeout_s: float = Field(
        30.0, ge=1, le=3600, description="after SIGTERM, requests still unanswered this long are "
        "answered 503 (JSON) and the worker exits; compose's stop_grace_period and Kubernetes' "
        "terminationGracePeriodSeconds allow for it (service.cli.shutdown_deadline_s)")

    # --- OpenAI compatibility (/v1) ---
    # OpenAI accepts 2,048 inputs per embeddings call and LangChain sends 1,000 by default; the
    # engine runs them max_texts_per_request at a time, so the queue bound still holds.
    openai_max_inputs: int = Field(2048, ge=1, le=100_000,
                                   description="inputs per /v1/embeddings call (other routes: "
                                   "max_texts_per_request)")
    openai_long_text: LongTextPolicy = Field(
        LongTextPolicy.WINDOW, description="/v1/embeddings inputs over max_tokens (the OpenAI API "
        "has no field for it): window (default: ordinary documents are never refused), truncate, "
        "error (422); counted in usage.windowed_inputs / truncated_inputs")
    openai_truncate: bool = Field(False, description="deprecated: openai_long_text=truncate")
    openai_strict_model: bool = Field(
        False, description="404 for a `model` that is neither the served model nor an alias; by "
        "default any name is answered by the served model (as text-embeddings-inference does), "
        "since clients send their own default name (text-embedding-ada-002)")
    model_aliases: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="more names /v1 accepts as `model` (e.g. "
        "text-embedding-3-small for clients that insist on one): JSON list or comma-separated")

    # --- rerank (/rerank, /v1/rerank, /v2/rerank) ---
    # Stock TEI, Cohere and Jina clients cannot send our `hybrid` field; this sets it for them.
    rerank_hybrid: float = Field(
        0.0, ge=0, le=1, description="w of a rerank request that does not send `hybrid`: each score is "
        "(1 - w) x the cosine + w x the dot product of the sparse vectors (/embed_sparse's); 0: the "
        "cosine alone; over 0 needs a bundle with a lexical table, or the load fails")

    # --- explanations (bundle graph sets; /embed, /nli and /sentiment with explain=true) ---
    # An explained text runs the unchunked attention with its maps, and on /nli one head row per
    # token: bounded per request (texts before tokenizing, tokens before inference).
    max_explain_texts: int = Field(16, ge=1, le=4096,
                                   description="texts (or pairs) per request with explain=true; more -> 413")
    max_explain_tokens: int = Field(1024, ge=1, le=10_000_000, description="tokens (after truncation) "
                                    "per request with explain=true; more -> 413, checked before inference")

    # --- tracing (OpenTelemetry; needs the `tracing` extra) ---
    # Off unless an endpoint is set; the standard OTEL_* variables work as for any OpenTelemetry SDK
    # (as text-embeddings-inference's --otlp-endpoint). service.http.tracing says what is traced.
    otlp_endpoint: str | None = Field(
        None, validation_alias=AliasChoices("DISAN_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        description="OTLP/HTTP collector to send a trace of each request to (base URL, e.g. "
        "http://otel-collector:4318; /v1/traces is added); also read from the standard "
        "OTEL_EXPORTER_OTLP_ENDPOINT; unset: no tracing. Needs the tracing extra")
    otlp_service_name: str = Field(
        "disan-serve", min_length=1,
        validation_alias=AliasChoices("DISAN_OTLP_SERVICE_NAME", "OTEL_SERVICE_NAME"),
        description="service.name of the traces; also read from the standard OTEL_SERVICE_NAME")

    @field_validator("cors_origins", "model_aliases", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        """Accept a JSON list or a comma-separated string (friendlier in env files and compose)."""
        if isinstance(value, str):
            value = value.strip()
            if value.startswith("["):
                return json.loads(value)
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_key_is_no_key(cls, value: object) -> object:
        # `DISAN_API_KEY=` (an empty line in an .env file) must not lock every client out.
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("otlp_endpoint", mode="before")
    @classmethod
    def _empty_endpoint_is_none(cls, value: object) -> object:
        # `OTEL_EXPORTER_OTLP_ENDPOINT=` (set empty in a compose file) means no tracing.
        if isinstance(value, str):
            return value.strip() or None
        return value

    @model_validator(mode="after")
    def _queue_fits_a_request(self) -> Settings:
        # A request is queued all-or-nothing: a queue smaller than one request would refuse it forever.
        if self.queue_limit < self.max_texts_per_request:
            raise ValueError(f"queue_limit ({self.queue_limit}) must be >= max_texts_per_request "
                             f"({self.max_texts_per_request})")
        return self

    @model_validator(mode="after")
    def _overlap_fits_the_window(self) -> Settings:
        if self.window_overlap >= self.max_tokens:
            raise ValueError(f"window_overlap ({self.window_overlap}) must be < max_tokens "
                             f"({self.max_tokens})")
        return self

    @model_validator(mode="after")
    def _json_items_fit_a_request(self) -> Settings:
        # A request at max_texts_per_request pairs has about 3 items per pair.
        if self.max_json_items < 4 * self.max_texts_per_request + 16:
            raise ValueError(f"max_json_items ({self.max_json_items}) must be >= 4 x "
                             f"max_texts_per_request + 16 ({4 * self.max_texts_per_request + 16})")
        return self

    def runtime_options(self) -> RuntimeOptions:
        """What the runtime needs of these settings (the runtime never reads settings itself)."""
        return RuntimeOptions(
            providers=self.providers, variant=self.variant, intra_op_threads=self.intra_op_threads,
            inter_op_threads=self.inter_op_threads, graph_optimization_level=self.graph_optimization_level,
            ort_spinning=self.ort_spinning, batch_concurrency=self.batch_concurrency, workers=self.workers,
            max_tokens=self.max_tokens, model_name=self.model_name, spelling=self.spelling)

"""Request/response models (pydantic v2). They are the API's OpenAPI schema, examples included.

Static checks (types, empty lists, empty strings) live here; limits that depend on settings
(texts per request, characters, tokens) are checked in `service.inference.engine`, before tokenizing.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

Text = Annotated[str, StringConstraints(min_length=1)]
# The schema states OpenAI's 2,048-input limit; the engine enforces the server's openai_max_inputs.
OPENAI_MAX_INPUTS = 2048
TextList = Annotated[list[Text], Field(min_length=1, json_schema_extra={"maxItems": OPENAI_MAX_INPUTS})]
LongText = Literal["window", "truncate", "error"]
_LONG_TEXT = ("texts over max_tokens: window (cut into windows of max_tokens, each run, pooled by "
              "token-weighted mean), truncate (keep the first max_tokens), error (422); omitted: the "
              "server's long_text (window by default)")
_TRUNCATE = "same as long_text=truncate (kept for older clients)"
DIMENSIONS_HELP = ("vectors of this many components: each vector's first `dimensions` (Matryoshka), or its "
               "coordinates on the bundle's first `dimensions` principal axes, then normalised where "
               "asked; a size the model serves (GET /info `matryoshka_dims`, the largest its dim, or "
               "any from 1 to `dimensions_up_to`), any other a 422 naming them; omitted: dim")
# Requests are strict (no 0 -> False, "5" -> 5 coercion) so the API accepts exactly what its
# OpenAPI schema says, and unknown fields are errors (a typo like "text" is reported, not ignored).
_STRICT = ConfigDict(extra="forbid", strict=True)


def _examples(*examples: dict) -> ConfigDict:
    return ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": list(examples)})


class Usage(BaseModel):
    tokens: int = Field(description="tokens of the texts the model saw: every token of a windowed "
                        "text, the kept ones of a truncated one")


class EmbedRequest(BaseModel):
    model_config = _examples({"texts": ["A man is playing a guitar.", "Someone plays music."],
                              "normalize": True})
    texts: list[Text] = Field(min_length=1, description="sentences to embed")
    normalize: bool = Field(False, description="L2-normalise each vector (cosine = dot product)")
    long_text: LongText | None = Field(None, description=_LONG_TEXT)
    truncate: bool = Field(False, description=_TRUNCATE)
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: lists of numbers; base64: each vector as base64 of little-endian "
        "float32 (smaller and cheaper to write and read, as on /v1/embeddings)")
    explain: bool = Field(False, description="also return each text's tokens and source2token "
                          "weights (at most max_explain_texts texts; needs the encoder_explain graph)")
    dimensions: int | None = Field(None, description=DIMENSIONS_HELP)


class TokenWeights(BaseModel):
    tokens: list[str] = Field(description="the tokens the model saw")
    token_weights: list[float] = Field(description="source2token attention per token (mean over "
                                       "features; sums to 1): each token's share of the sentence vector")


class TextNote(BaseModel):
    index: int = Field(description="position in `texts`")
    tokens: int = Field(description="the text's tokens the model saw")
    windows: int = Field(description="windows of at most max_tokens it was cut into (1: not cut)")
    truncated: bool = Field(description="cut to max_tokens (long_text=truncate)")
    empty: bool = Field(description="no tokens (only spaces or control characters): the empty text's vector")


class EmbedResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"model": "default", "dim": 4, "embeddings": [[0.1, -0.2, 0.3, 0.0]], "usage": {"tokens": 7}}]})
    model: str
    dim: int
    embeddings: list[list[float]] | list[str] = Field(
        description="one vector per text: floats, or base64 strings with encoding_format=base64")
    usage: Usage
    explanations: list[TokenWeights] | None = Field(None, description="per text, with explain=true")
    notes: list[TextNote] | None = Field(None, description="only the texts that were windowed, "
                                         "truncated or empty; absent when none was")


class NLIPair(BaseModel):
    model_config = _STRICT
    premise: Text
    hypothesis: Text


class NLIRequest(BaseModel):
    model_config = _examples({"pairs": [{"premise": "A man is playing a guitar on stage.",
                                         "hypothesis": "A man is performing music."}]})
    pairs: list[NLIPair] = Field(min_length=1, description="premise/hypothesis pairs")
    long_text: LongText | None = Field(None, description=_LONG_TEXT)
    truncate: bool = Field(False, description=_TRUNCATE)
    explain: bool = Field(False, description="also return which premise/hypothesis tokens drive the "
                          "label (at most max_explain_texts pairs; needs the encoder_explain graph)")


class Prediction(BaseModel):
    label: str = Field(description="the most probable class")
    scores: dict[str, float] = Field(description="probability of every class")


class NLISide(TokenWeights):
    attribution: list[float] = Field(
        description="per token: the predicted label's probability minus its probability with the "
        "token left out of its sentence's source2token pooling (positive: the token supports the "
        "label; computed by the head on the graph's leave-one-out vectors, no gradients)")


class NLIExplanation(BaseModel):
    premise: NLISide
    hypothesis: NLISide


class NLIPrediction(Prediction):
    explanation: NLIExplanation | None = None


class NLIResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "model": "default", "usage": {"tokens": 14},
        "results": [{"label": "entailment",
                     "scores": {"entailment": 0.91, "neutral": 0.07, "contradiction": 0.02}}]}]})
    model: str
    results: list[NLIPrediction]
    usage: Usage


class SentimentRequest(BaseModel):
    model_config = _examples({"texts": ["A gorgeous, witty, seductive movie."], "explain": False})
    texts: list[Text] = Field(min_length=1)
    long_text: LongText | None = Field(None, description=_LONG_TEXT)
    truncate: bool = Field(False, description=_TRUNCATE)
    explain: bool = Field(False, description="also return attention maps (needs the explain graph)")


class Explanation(BaseModel):
    tokens: list[str] = Field(description="the tokens the model saw")
    token_weights: list[float] = Field(description="source2token attention per token (sums to 1)")
    gate_fw: list[float] = Field(description="forward fusion gate per token (mean over features)")
    gate_bw: list[float] = Field(description="backward fusion gate per token (mean over features)")
    attention_fw: list[list[float]] = Field(description="forward token2token attention [n][n]")
    attention_bw: list[list[float]] = Field(description="backward token2token attention [n][n]")


class SentimentPrediction(Prediction):
    polarity: Literal["negative", "neutral", "positive"] = Field(
        description="coarse class: argmax of the class probabilities summed by polarity")
    explanation: Explanation | None = None


class SentimentResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "model": "default", "usage": {"tokens": 8},
        "results": [{"label": "very positive", "polarity": "positive",
                     "scores": {"very negative": 0.01, "negative": 0.02, "neutral": 0.05,
                                "positive": 0.32, "very positive": 0.6}}]}]})
    model: str
    results: list[SentimentPrediction]
    usage: Usage


# JSON's names for what was sent, in messages (a client reads JSON, not Python).
_JSON_TYPES = {type(None): "null", bool: "boolean", int: "number", float: "number", dict: "object",
               list: "array", str: "string"}


def _is_token_ids(value: object) -> bool:
    """An OpenAI token-id input: a list of ints, or a list of such lists."""
    def ints(v: object) -> bool:
        return isinstance(v, list) and bool(v) and all(type(i) is int for i in v)
    return ints(value) or (isinstance(value, list) and bool(value) and all(ints(v) for v in value))


def _locations(indices: list[int], field: str) -> str:
    return ", ".join(f"{field}[{i}]" for i in indices)


def input_problem(value: object, field: str, token_ids: str) -> str | None:
    """What is wrong with an OpenAI `input` or TEI's `inputs` (`field`), naming every offending
    item; None when nothing is. `token_ids` is the family's answer to token-id input.

    Each case has its own message (pydantic's union errors said "Input should be a valid string
    (and 1 more)" to all of them)."""
    if isinstance(value, str):
        return f"{field}: the empty string; send at least one character" if not value else None
    if not isinstance(value, list):
        return (f"{field}: got {_JSON_TYPES.get(type(value), type(value).__name__)}, expected a string "
                "or a non-empty list of strings")
    if not value:
        return f"{field}: the list is empty; send at least one string"
    if _is_token_ids(value):
        return token_ids
    empty = [i for i, v in enumerate(value) if v == ""]
    wrong = [i for i, v in enumerate(value) if not isinstance(v, str)]
    parts = []
    if empty:
        parts.append(f"{_locations(empty, field)}: the empty string (send at least one character; texts "
                     "of only spaces or control characters are embedded as the empty text)")
    if wrong:
        kinds = sorted({_JSON_TYPES.get(type(value[i]), type(value[i]).__name__) for i in wrong})
        parts.append(f"{_locations(wrong, field)}: not a string (got {', '.join(kinds)})")
    return "; ".join(parts) or None


def checked_input(value: object, field: str, token_ids: str) -> object:
    """`value` unchanged, or the pydantic error `input_problem` names (a `mode="before"` validator)."""
    problem = input_problem(value, field, token_ids)
    if problem is not None:
        raise PydanticCustomError("input_items", problem)
    return value


class ErrorDetail(BaseModel):
    type: str = Field(description="stable machine-readable error type (see the error table)")
    message: str


class ErrorResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"error": {"type": "invalid_request",
                   "message": "texts[0]: String should have at least 1 character"}}]})
    error: ErrorDetail


class Status(BaseModel):
    status: Literal["ok", "ready", "loading", "draining", "failed"]
    detail: str | None = None


class RerankInfo(BaseModel):
    method: str = Field(description="the cosine of the query's and each text's served vectors (a bi-encoder "
                        "ranking, not a cross-encoder), mixed with their sparse vectors' dot product at w")
    routes: list[str]
    hybrid: float = Field(description="w of a request that does not send `hybrid` (rerank_hybrid; 0: the "
                          "cosine alone)")


class Info(BaseModel):
    # text-embeddings-inference's fields (its GET /info), for clients written for TEI
    model_id: str = Field(description="TEI's: the served model's name")
    served_model_name: str = Field(description="TEI's: the served model's name")
    model_sha: str | None = Field(description="TEI's: the embed route's fingerprint "
                                  "(bundle.route_fingerprints)")
    model_dtype: str = Field(description="TEI's: the graph variant's number type (float32, float16, int8)")
    model_type: dict[str, dict[str, str]] = Field(description="TEI's: {embedding: {pooling: source2token}}; "
                                                  "/predict and /rerank are served too")
    max_concurrent_requests: int = Field(description="TEI's: = limits.max_concurrent_requests")
    max_input_length: int = Field(description="TEI's: the window (limits.max_tokens); longer texts are "
                                  "windowed or truncated as long_text says")
    max_batch_tokens: int = Field(description="TEI's: max_batch_size x max_input_length")
    max_batch_requests: int | None = Field(description="TEI's: null (no such limit)")
    max_client_batch_size: int = Field(description="TEI's: texts per request (limits.max_texts_per_request)")
    auto_truncate: bool = Field(description="TEI's: true when long texts are accepted without truncate "
                                "(the server's long_text is window or truncate)")
    tokenization_workers: int
    version: str = Field(description="this server's version")
    sha: str | None = None
    docker_label: str | None = None
    rerank: RerankInfo = Field(description="how /rerank, /v1/rerank and /v2/rerank score")
    # ours
    model: str
    dim: int
    matryoshka_dims: list[int] = Field(description="the `dimensions` /embed and /v1/embeddings take, "
                                       "largest (dim) first (the bundle manifest's; the model card "
                                       "gives each one's quality): trained prefixes, or coordinates on "
                                       "the bundle's principal axes where `dimensions_by` is "
                                       "`principal_axes`")
    dimensions_up_to: int = Field(description="`dimensions` from 1 to this are taken too (the "
                                  "coordinates on the bundle's first principal axes: any size is the "
                                  "best summary of that size; past axes that span the vector, its "
                                  "coordinates on all of them and zeros); 0: only `matryoshka_dims` "
                                  "(trained prefixes)")
    dimensions_by: str = Field(description="how a shorter vector is made: `prefix` (the encoder was "
                                           "trained with Matryoshka prefixes, or serves only dim) or "
                                           "`principal_axes` (the bundle's dimensions.npy)")
    sparse: dict[str, bool | str] = Field(
        description="whether POST /embed_sparse serves sparse lexical vectors (the bundle's lexical table) "
        "and how they are weighted")
    provider: str = Field(description="execution provider the live encoder session uses")
    providers: dict[str, str] = Field(description="graph -> provider actually in use")
    variant: str = Field(description="graph variant in use (the graph set is in bundle.graph_set)")
    labels: dict[str, list[str]]
    explain: bool = Field(description="whether /sentiment can return explanations")
    routes: dict[str, str] = Field(description="which graph serves what: embed (/embed, /v1/embeddings, "
                                   "/similarity), nli (the encoder feeding nli_head), sentiment, and "
                                   "their _explain graphs; see disan.bundle.manifest")
    limits: dict[str, int]
    batching: dict[str, int | float | dict[str, str]] = Field(
        description="limits in use (auto ones resolved for the provider) and `source`: why each")
    metrics: dict[str, dict] = Field(description="evaluation metrics recorded in the bundle manifest")
    bundle: dict[str, object] = Field(description="manifest facts: created, max_len, versions, and "
                                      "borrowed_words: per NLI/sentiment model that reads the words past "
                                      "its own table through the embedding encoder's, how many; "
                                      "ensemble_members: per model that averages several (disan "
                                      "ensemble), how many; sources: per model, the checkpoint it "
                                      "was exported from (file name and sha256); route_fingerprints: "
                                      "per route, what the graph in use computes (graph, weights, "
                                      "tokenizer): the same embed fingerprint means the same vectors")


class TokenizeRequest(BaseModel):
    model_config = _examples({"texts": ["A man isn't playing the guitar."]})
    texts: list[Text] = Field(min_length=1, description="texts to tokenize (nothing is run)")


class TokenizedText(BaseModel):
    tokens: list[str] = Field(description="the model's tokens (lowercased, PTB-style), uncut")
    ids: list[int] = Field(description="vocabulary ids of the tokens; an unknown word has 1, or, where "
                           "the vocabulary has unknown_rows, the id of one of its last words, always the "
                           "same for the same word")
    unknown: list[int] = Field(description="positions (in tokens) of the words the vocabulary lacks")
    count: int = Field(description="number of tokens")
    over_limit: bool = Field(description="count > max_tokens: windowed, truncated or refused as "
                             "long_text says")


class TokenizeResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "model": "default", "max_tokens": 128, "results": [{
            "tokens": ["a", "man", "is", "n't", "playing", "the", "guitar", "."],
            "ids": [5, 21, 9, 880, 310, 2, 954, 4], "unknown": [], "count": 8, "over_limit": False}]}]})
    model: str
    max_tokens: int = Field(description="the most tokens a text may have (the served limit)")
    results: list[TokenizedText]


class TextPair(BaseModel):
    model_config = _STRICT
    a: Text
    b: Text


class SimilarityRequest(BaseModel):
    """One of three forms: `pairs`; `query` + `texts` (ranked); `texts` alone (the full matrix)."""

    model_config = _examples(
        {"query": "A man is playing a guitar.",
         "texts": ["Someone plays music.", "A dog runs in the park.", "A man performs a song."]},
        {"pairs": [{"a": "A man is playing a guitar.", "b": "Someone plays music."}]},
        {"texts": ["A man is playing a guitar.", "Someone plays music.", "A dog runs."]})
    pairs: list[TextPair] | None = Field(None, min_length=1, description="cosine of each pair, in order")
    query: Text | None = Field(None, description="rank `texts` by cosine to this text")
    texts: list[Text] | None = Field(None, min_length=1,
                                     description="with `query`: the candidates; alone: all pairs")
    top_k: int | None = Field(None, ge=1, description="with `query`: keep the best k")
    long_text: LongText | None = Field(None, description=_LONG_TEXT)
    truncate: bool = Field(False, description=_TRUNCATE)
    hybrid: float | None = Field(None, ge=0, le=1, description="w from 0 to 1: each score is (1 - w) x the "
                                 "cosine + w x the dot product of the texts' sparse vectors (POST "
                                 "/embed_sparse's), hybrid search; a 424 where the bundle has none")

    @model_validator(mode="after")
    def _one_form(self) -> SimilarityRequest:
        one_form = (self.pairs is None) != (self.texts is None) and (self.pairs is None or self.query is None)
        if not one_form:
            raise PydanticCustomError("similarity_form", "give `pairs`, or `texts` with an optional `query`")
        if self.top_k is not None and self.query is None:
            raise PydanticCustomError("similarity_form", "top_k needs `query`")
        return self


class RankedText(BaseModel):
    index: int = Field(description="position in `texts`")
    score: float = Field(description="cosine similarity to the query (with `hybrid`: the hybrid score)")


class SimilarityResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "model": "default", "usage": {"tokens": 21},
        "ranking": [{"index": 2, "score": 0.83}, {"index": 0, "score": 0.71}, {"index": 1, "score": 0.12}]}]})
    model: str
    scores: list[float] | None = Field(None, description="`pairs`: cosine (or hybrid score) of each pair, "
                                       "in order")
    ranking: list[RankedText] | None = Field(None, description="`query`: texts by cosine (or hybrid score), "
                                             "best first")
    matrix: list[list[float]] | None = Field(None, description="`texts` alone: cosine (or hybrid score) of "
                                             "every pair")
    usage: Usage

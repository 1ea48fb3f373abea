"""Request/response models (pydantic v2). They are the API's OpenAPI schema, examples included.

Static checks (types, empty lists, empty strings) live here; limits that depend on settings
(texts per request, characters, tokens) are checked in `service.engine`, before tokenizing.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Text = Annotated[str, StringConstraints(min_length=1)]
TextList = Annotated[list[Text], Field(min_length=1)]
# Requests are strict (no 0 -> False, "5" -> 5 coercion) so the API accepts exactly what its
# OpenAPI schema says, and unknown fields are errors (a typo like "text" is reported, not ignored).
_STRICT = ConfigDict(extra="forbid", strict=True)


def _examples(*examples: dict) -> ConfigDict:
    return ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": list(examples)})


class Usage(BaseModel):
    tokens: int = Field(description="tokens fed to the model (after truncation)")


class EmbedRequest(BaseModel):
    model_config = _examples({"texts": ["A man is playing a guitar.", "Someone plays music."],
                              "normalize": True})
    texts: list[Text] = Field(min_length=1, description="sentences to embed")
    normalize: bool = Field(False, description="L2-normalise each vector (cosine = dot product)")
    truncate: bool = Field(False, description="cut texts over max_tokens instead of rejecting them")
    explain: bool = Field(False, description="also return each text's tokens and source2token "
                          "weights (at most max_explain_texts texts; needs the encoder_explain graph)")


class TokenWeights(BaseModel):
    tokens: list[str] = Field(description="the tokens the model saw")
    token_weights: list[float] = Field(description="source2token attention per token (mean over "
                                       "features; sums to 1): each token's share of the sentence vector")


class EmbedResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"model": "default", "dim": 4, "embeddings": [[0.1, -0.2, 0.3, 0.0]], "usage": {"tokens": 7}}]})
    model: str
    dim: int
    embeddings: list[list[float]]
    usage: Usage
    explanations: list[TokenWeights] | None = Field(None, description="per text, with explain=true")


class NLIPair(BaseModel):
    model_config = _STRICT
    premise: Text
    hypothesis: Text


class NLIRequest(BaseModel):
    model_config = _examples({"pairs": [{"premise": "A man is playing a guitar on stage.",
                                         "hypothesis": "A man is performing music."}]})
    pairs: list[NLIPair] = Field(min_length=1, description="premise/hypothesis pairs")
    truncate: bool = Field(False, description="cut texts over max_tokens instead of rejecting them")
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
    truncate: bool = Field(False, description="cut texts over max_tokens instead of rejecting them")
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


class OpenAIEmbeddingsRequest(BaseModel):
    """OpenAI `POST /v1/embeddings` request; unknown fields are ignored like OpenAI's own clients."""

    model_config = ConfigDict(extra="ignore", strict=True, json_schema_extra={"examples": [
        {"input": ["The food was delicious.", "The waiter was friendly."], "model": "default"},
        {"input": "hello world", "encoding_format": "base64"}]})
    input: Text | TextList = Field(description="a string or a non-empty list of strings")
    model: str | None = Field(None, description="accepted for compatibility; the loaded model answers")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="must equal the model's dim if given")
    user: str | None = None


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class ErrorDetail(BaseModel):
    type: str = Field(description="stable machine-readable error type (see the error table)")
    message: str


class ErrorResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"error": {"type": "invalid_request",
                   "message": "texts.0: String should have at least 1 character"}}]})
    error: ErrorDetail


class Status(BaseModel):
    status: Literal["ok", "ready", "loading", "draining", "failed"]
    detail: str | None = None


class Info(BaseModel):
    model: str
    dim: int
    provider: str = Field(description="execution provider the live encoder session uses")
    providers: dict[str, str] = Field(description="graph -> provider actually in use")
    variant: str = Field(description="graph variant in use (the graph set is in bundle.graph_set)")
    labels: dict[str, list[str]]
    explain: bool = Field(description="whether /sentiment can return explanations")
    limits: dict[str, int]
    batching: dict[str, int | float]
    metrics: dict[str, dict] = Field(description="evaluation metrics recorded in the bundle manifest")
    bundle: dict[str, object] = Field(description="manifest facts: created, max_len, versions")

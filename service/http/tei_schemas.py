"""The request/response models of the other families' APIs served beside ours (pydantic v2):
Hugging Face text-embeddings-inference's (TEI: `POST /`, `/embed`, `/rerank`, `/predict`,
`/similarity`, `/tokenize`, `/decode`, as its docs/openapi.json states them) and Cohere's / Jina's rerank
(`POST /v1/rerank`), and how a request is told to be TEI's.

On the routes both families share (/embed, /similarity, /tokenize) the body's keys decide: one
with `inputs` is TEI's (our bodies have no such key), any other ours; the OpenAPI schema shows
both (`oneOf`). A TEI-shaped request is answered as TEI answers, errors included (`is_tei`).
Like TEI, unknown fields in its bodies are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, field_validator
from pydantic_core import PydanticCustomError

from service.http.schemas import (
    EmbedRequest,
    SimilarityRequest,
    Text,
    TokenizeRequest,
    checked_input,
)

# Routes only TEI has: every request there is TEI's, whatever its body.
TEI_PATHS = frozenset({"/", "/rerank", "/predict", "/embed_sparse", "/decode"})
# Routes both families share: a body with `inputs` is TEI's.
SHARED_PATHS = frozenset({"/embed", "/similarity", "/tokenize"})
TOKEN_IDS_MESSAGE = (
    "inputs: token-id arrays are not supported: this server tokenizes text itself, and its tokens are "
    "not your tokenizer's (POST /tokenize shows them). Send strings")
TruncationDirection = Literal["right", "left", "Right", "Left"]
_TRUNCATE = ("true: texts over max_input_length keep their first max_input_length tokens (their last "
             "with truncation_direction=left); false or omitted: the server's long_text (window by "
             "default: cut into windows whose vectors are pooled; TEI itself refuses them)")
_DIRECTION = "which end truncate=true cuts: right (default) keeps the start, left keeps the end"
_HYBRID = ("w from 0 to 1: each score is (1 - w) x the cosine + w x the dot product of the sparse "
           "vectors (POST /embed_sparse's), hybrid search; omitted: the server's rerank_hybrid (0 "
           "unless set: the cosine); a 424 where the bundle has no lexical table")
_NO_PROMPTS = "this model has no prompts (sentence-transformers' `prompts`); send the text as is"


def _tei(*examples: dict) -> ConfigDict:
    # strict like ours (no "5" -> 5), unknown fields ignored like TEI's own server
    return ConfigDict(extra="ignore", strict=True, json_schema_extra={"examples": list(examples)})


def _no_prompt(value: object) -> object:
    if value is not None:
        raise PydanticCustomError("no_prompts", _NO_PROMPTS)
    return value


class TEITexts(BaseModel):
    """What TEI's `/embed` and `/embed_sparse` bodies share: the texts and how long ones are cut."""

    model_config = _tei()
    inputs: Text | Annotated[list[Text], Field(min_length=1)] = Field(
        description="a string or a non-empty list of strings (up to max_client_batch_size, GET /info); "
        "token-id arrays are refused with a 422")
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: TruncationDirection = Field("right", description=_DIRECTION)
    prompt_name: str | None = Field(None, description="not supported: this model has no prompts")

    @field_validator("inputs", mode="before")
    @classmethod
    def _check_inputs(cls, value: object) -> object:
        return checked_input(value, "inputs", TOKEN_IDS_MESSAGE)

    _check_prompt = field_validator("prompt_name")(_no_prompt)


class TEIEmbedRequest(TEITexts):
    """TEI's `POST /embed` (and `POST /`): the answer is a bare list of vectors."""

    model_config = _tei({"inputs": ["A man is playing a guitar.", "Someone plays music."]},
                        {"inputs": "A man is playing a guitar.", "truncate": True})
    normalize: bool = Field(True, description="L2-normalise each vector (TEI's default: true)")
    dimensions: int | None = Field(None, description="a size the model serves (GET /info `matryoshka_dims`, "
                                   "or any from 1 to `dimensions_up_to`): "
                                   "each vector cut to `dimensions` components (its first ones, or its "
                                   "coordinates on the bundle's principal axes), then normalised where "
                                   "asked; any other a 422 naming them")


class TEIEmbedSparseRequest(TEITexts):
    """TEI's `POST /embed_sparse`: per input its sparse lexical vector, for hybrid search."""

    model_config = _tei({"inputs": ["What does curcumin do to cancer cells?", "Curcumin and apoptosis."]})


class TEISparseValue(BaseModel):
    index: int = Field(description="a token id of the embed route (POST /tokenize shows them)")
    value: float = Field(description="its weight: IDF x (1 + ln count); the vector has unit length, so "
                         "the dot product of two is their lexical cosine")


class TEISimilarityInput(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    source_sentence: Text = Field(description="the text the others are compared with")
    sentences: list[Text] = Field(min_length=1, description="texts compared with source_sentence")


class TEISimilarityParameters(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: TruncationDirection = Field("right", description=_DIRECTION)
    prompt_name: str | None = Field(None, description="not supported: this model has no prompts")

    _check_prompt = field_validator("prompt_name")(_no_prompt)


class TEISimilarityRequest(BaseModel):
    """TEI's `POST /similarity` (and `POST /` with this body): a cosine per sentence, in order."""

    model_config = _tei({"inputs": {"source_sentence": "A man is playing a guitar.",
                                    "sentences": ["Someone plays music.", "A dog runs in the park."]}})
    inputs: TEISimilarityInput
    parameters: TEISimilarityParameters | None = None


class TEITokenizeRequest(BaseModel):
    """TEI's `POST /tokenize`: per text, its tokens as TEI's SimpleToken objects."""

    model_config = _tei({"inputs": "A man isn't playing the guitar."})
    inputs: Text | Annotated[list[Text], Field(min_length=1)]
    add_special_tokens: bool = Field(True, description="accepted; this model has no special tokens")
    prompt_name: str | None = Field(None, description="not supported: this model has no prompts")

    _check_prompt = field_validator("prompt_name")(_no_prompt)


MAX_TOKEN_ID = 2**31 - 1  # TEI's ids are int32, as ours
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]


def _one_message(problem_of: Callable[[object], str | None]) -> Callable[[object], object]:
    """A before-validator refusing a value with `problem_of`'s one line, which names every offending
    item (service.common.errors passes an `input_items` error's message on as it is)."""
    def check(value: object) -> object:
        problem = problem_of(value)
        if problem is not None:
            raise PydanticCustomError("input_items", problem)
        return value
    return check


def ids_problem(value: object) -> str | None:
    """What is wrong with TEI's decode `ids` (a sequence of token ids or a list of them), naming
    the first offending item, in one line; None when nothing is."""
    if not isinstance(value, list) or not value:
        return "ids: a non-empty list of token ids, or a non-empty list of such lists"
    nested = [isinstance(v, list) for v in value]
    if any(nested) and not all(nested):
        return "ids: token ids or lists of them, not both"
    for i, seq in enumerate(value if all(nested) else [value]):
        where = f"ids[{i}]" if all(nested) else "ids"
        if not seq:
            return f"{where}: an empty sequence; send at least one id"
        bad = next((j for j, v in enumerate(seq) if type(v) is not int or not 0 <= v <= MAX_TOKEN_ID), None)
        if bad is not None:
            return f"{where}[{bad}]: {seq[bad]!r} is no token id (an integer from 0 to {MAX_TOKEN_ID})"
    return None


def _sequence_problem(value: object, where: str) -> str | None:
    """What is wrong with one TEI predict sequence given as a list: [text] or [text, text]."""
    if not isinstance(value, list) or not 1 <= len(value) <= 2:
        return f"{where}: a batch item is [text] or [text, text]"
    if not all(isinstance(v, str) and v for v in value):
        return f"{where}: texts must be non-empty strings"
    return None


def predict_problem(value: object) -> str | None:
    """What is wrong with TEI's predict `inputs` (a text, a pair, or a batch of both), naming every
    offending item; None when nothing is."""
    if isinstance(value, str):
        return "inputs: the empty string; send at least one character" if not value else None
    if not isinstance(value, list) or not value:
        return "inputs: a text, a pair [text, text], or a non-empty batch [[text], [text, text], ...]"
    if all(isinstance(v, str) for v in value):
        if len(value) > 2:
            return (f"inputs: a list of strings is one text or a pair (got {len(value)} strings); send "
                    "a batch as a list of lists: [[text], [text], ...]")
        return _sequence_problem(value, "inputs")
    problems = [p for i, v in enumerate(value) if (p := _sequence_problem(v, f"inputs[{i}]"))]
    return "; ".join(problems) or None


# The shipped bundle's ids of "a man is playing the guitar" (tests/repo/test_shipped_bundle.py)
DECODE_EXAMPLE = [7751, 7762, 7754, 7788, 7753, 7934]


class TEIDecodeRequest(BaseModel):
    """TEI's `POST /decode`: token ids (one sequence, or a batch of them) -> the text of each."""

    model_config = _tei({"ids": DECODE_EXAMPLE})
    ids: Annotated[list[TokenId], Field(min_length=1)] | Annotated[
        list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)] = Field(
        description="the embed route's token ids (POST /tokenize's `id`): one sequence, or a list of "
        "them (up to max_client_batch_size)")
    skip_special_tokens: bool = Field(True, description="leave out padding and the tokenizer's special "
                                      "tokens")

    _check_ids = field_validator("ids", mode="before")(_one_message(ids_problem))


class TEIRerankRequest(BaseModel):
    """TEI's `POST /rerank`."""

    model_config = _tei({"query": "What is a guitar?",
                         "texts": ["A guitar is a string instrument.", "Paris is in France."]})
    query: Text
    texts: list[Text] = Field(min_length=1, description="texts to rank (up to max_client_batch_size)")
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: TruncationDirection = Field("right", description=_DIRECTION)
    raw_scores: bool = Field(False, description="accepted; the score is the cosine either way (there "
                             "is no logit to send raw)")
    return_text: bool = Field(False, description="also send each text")
    hybrid: float | None = Field(None, ge=0, le=1, description=_HYBRID)


PredictPair = Annotated[list[Text], Field(min_length=1, max_length=2)]


class TEIPredictRequest(BaseModel):
    """TEI's `POST /predict`: a single text goes to the sentiment model, a pair [premise, hypothesis]
    to the NLI model."""

    model_config = _tei({"inputs": "A gorgeous, witty, seductive movie."},
                        {"inputs": [["A gorgeous movie."], ["A man plays music.", "A man is silent."]]})
    inputs: Text | PredictPair | Annotated[list[PredictPair], Field(min_length=1)] = Field(
        description="a text, a pair [text, text], or a batch of both [[text], [text, text], ...]")
    raw_scores: bool = Field(False, description="scores as the log of each class probability (the "
                             "logits up to a constant) instead of the probabilities")
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: TruncationDirection = Field("right", description=_DIRECTION)

    _check_inputs = field_validator("inputs", mode="before")(_one_message(predict_problem))


class TEIRank(BaseModel):
    index: int = Field(description="position in `texts`")
    score: float = Field(description="cosine of the query's and the text's vectors (a bi-encoder "
                         "ranking, not a cross-encoder's relevance; with hybrid: the hybrid score)")
    text: str | None = Field(None, description="the text, with return_text=true")


class TEIPrediction(BaseModel):
    label: str
    score: float = Field(description="the class probability (with raw_scores: its log)")


class TEISimpleToken(BaseModel):
    id: int = Field(description="vocabulary id (see POST /tokenize with our body for the details)")
    text: str = Field(description="the token as the model reads it (lowercased, PTB-style)")
    special: bool = Field(description="always false: the model has no special tokens")
    start: int | None = Field(None, description="character offset of the token in the input, where it "
                              "is found there as it is (lowercase); null where it is not (a spelling "
                              "correction, a quote rewritten)")
    stop: int | None = Field(None, description="character offset just past the token, or null")


class TEIErrorResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"error": "inputs: the list is empty; send at least one string", "error_type": "Validation"}]})
    error: str
    error_type: Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"] = Field(
        description="TEI's error type: Overloaded (429), Unhealthy (503), Backend (500), Validation "
        "(every other status: the status code is this server's error table's)")


# ---- Cohere / Jina rerank (POST /v1/rerank) ----
class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    text: Text


class CohereRerankRequest(BaseModel):
    """Cohere's and Jina's `POST /v1/rerank`; their other fields (`rank_fields`, `max_chunks_per_doc`,
    ...) are ignored, `model` is answered by the served model."""

    model_config = _tei({"query": "What is a guitar?",
                         "documents": ["A guitar is a string instrument.", "Paris is in France."],
                         "top_n": 1})
    query: Text
    documents: list[Text | RerankDocument] = Field(
        min_length=1, description="strings, or objects with `text` (up to max_texts_per_request)")
    top_n: int | None = Field(None, ge=1, description="keep the best n (default: all)")
    return_documents: bool = Field(True, description="send each result's document as {text}")
    model: str | None = Field(None, description="any name: the served model answers")
    hybrid: float | None = Field(None, ge=0, le=1, description=_HYBRID)


class CohereRerankResult(BaseModel):
    index: int = Field(description="position in `documents`")
    relevance_score: float = Field(description="cosine of the query's and the document's vectors (a "
                                   "bi-encoder ranking; in [-1, 1], not Cohere's calibrated [0, 1]; with "
                                   "hybrid: the hybrid score)")
    document: RerankDocument | None = Field(None, description="with return_documents=true")


class CohereRerankUsage(BaseModel):
    total_tokens: int = Field(description="tokens of the query and the documents the model saw")


class CohereRerankResponse(BaseModel):
    id: str
    model: str
    results: list[CohereRerankResult] = Field(description="best first")
    usage: CohereRerankUsage


# ---- telling the families apart ----
TEI_MODELS = (TEIEmbedRequest, TEISimilarityRequest, TEITokenizeRequest, TEIRerankRequest, TEIDecodeRequest,
              TEIPredictRequest, TEIEmbedSparseRequest)


def is_tei(path: str, body: object) -> bool:
    """Whether a request to `path` with this body (parsed JSON, a request model, or None when it
    was not read or is not JSON) is TEI's: answered, errors included, in TEI's shapes."""
    if path in TEI_PATHS or isinstance(body, TEI_MODELS):
        return True
    return path in SHARED_PATHS and isinstance(body, dict) and "inputs" in body


def _family(body: Any) -> str:
    return "TEI body" if isinstance(body, TEI_MODELS) or (isinstance(body, dict) and "inputs" in body) \
        else "our body"


def _tei_route(body: Any) -> str:
    if isinstance(body, TEISimilarityRequest):
        return "TEI similarity"
    inputs = body.get("inputs") if isinstance(body, dict) else None
    return "TEI similarity" if isinstance(inputs, dict) else "TEI embed"


def _either(ours: type[BaseModel], tei: type[BaseModel]) -> Any:
    # Tags are not identifiers, so error locations leave them out (service.common.errors.format_loc).
    return Annotated[Annotated[ours, Tag("our body")] | Annotated[tei, Tag("TEI body")],
                     Discriminator(_family)]


EMBED_BODY = _either(EmbedRequest, TEIEmbedRequest)
SIMILARITY_BODY = _either(SimilarityRequest, TEISimilarityRequest)
TOKENIZE_BODY = _either(TokenizeRequest, TEITokenizeRequest)
# POST /: TEI's embed, or its similarity (`inputs` an object), as huggingface_hub's
# InferenceClient(base_url=...) posts both feature_extraction and sentence_similarity there.
ROOT_BODY = Annotated[Annotated[TEIEmbedRequest, Tag("TEI embed")]
                      | Annotated[TEISimilarityRequest, Tag("TEI similarity")], Discriminator(_tei_route)]


class OneOf:
    """A request body that is one of several models, told apart by its keys: validated like a
    model (`model_validate`, as the fast path does) from the annotation FastAPI's route takes."""

    def __init__(self, annotation: Any):
        self.annotation = annotation
        self._adapter = TypeAdapter(annotation)

    def model_validate(self, data: Any, from_attributes: bool | None = None) -> Any:
        return self._adapter.validate_python(data, from_attributes=from_attributes)

"""OpenAI's `/v1/embeddings` and `/v1/models` request and response models (pydantic v2): the OpenAI
family's part of the API's OpenAPI schema. The native models are in `service.http.schemas`, TEI's in
`service.http.tei_schemas`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.http.schemas import DIMENSIONS_HELP, Text, TextList, checked_input

# What a client that pre-tokenizes with tiktoken (LangChain's OpenAIEmbeddings by default) is told;
# also the answer to such a body that is over the size limits (service.http.asgi).
TOKEN_IDS_MESSAGE = (
    "input: token-id arrays are not supported: this server tokenizes text itself, and its tokens are "
    "not tiktoken's (POST /tokenize shows them). Send strings; with LangChain set "
    "OpenAIEmbeddings(check_embedding_ctx_length=False). Texts of any length are embedded (long "
    "ones in windows)")


class OpenAIEmbeddingsRequest(BaseModel):
    """OpenAI `POST /v1/embeddings` request; unknown fields are ignored like OpenAI's own clients."""

    model_config = ConfigDict(extra="ignore", strict=True, json_schema_extra={"examples": [
        # no `model`: an example must work against any server, whatever name it serves
        {"input": ["The food was delicious.", "The waiter was friendly."]},
        {"input": "hello world", "encoding_format": "base64"}]})
    input: Text | TextList = Field(
        description="a string or a non-empty list of strings (up to openai_max_inputs, 2,048 by "
        "default), each of any length (long ones are embedded in windows, the server's "
        "openai_long_text); token-id arrays are refused with a 422 saying what to set instead")
    model: str | None = Field(None, description="any name: the served model answers and is named in "
                              "the response (a server with openai_strict_model accepts only its name "
                              "and model_aliases)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description=DIMENSIONS_HELP)
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _check_input(cls, value: object) -> object:
        return checked_input(value, "input", TOKEN_IDS_MESSAGE)


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    truncated_inputs: int = Field(0, description="inputs cut to max_tokens (server setting "
                                  "openai_long_text=truncate)")
    windowed_inputs: int = Field(0, description="inputs over max_tokens embedded in windows (the default)")
    empty_inputs: int = Field(0, description="inputs of only spaces or control characters, embedded "
                              "as the empty text")


class OpenAIEmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="bundle creation time (Unix seconds; 0 if the manifest has none)")
    owned_by: str


class OpenAIModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]

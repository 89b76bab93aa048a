"""The error bodies routes declare in their OpenAPI `responses`, by the shape they answer errors in
(`errors.ErrorShape`): TEI's `{"error", "error_type"}`, OpenAI's `{"message", "code", "type"}`
(Cohere's the same with 400 for a bad request), or vLLM's `{"error": {"message", "type", "param",
"code"}}`."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field

from prensa.gateway.errors import ROUTE_ERROR_STATUSES, ErrorShape


class ErrorResponse(BaseModel):
    # what a route declaring this model answers errors with
    shape: ClassVar[ErrorShape] = ErrorShape.TEI

    error: str = Field(description="What went wrong.")
    error_type: str = Field(
        description="Validation, Tokenizer, Empty, Overloaded, Backend, Unhealthy, ..."
    )
    request_id: str | None = Field(
        None, description="The request's id, as the `x-request-id` header says."
    )


# The error bodies a TEI-shaped route documents (its OpenAPI `responses`): TEI's, bge-m3's and
# Ollama's routes.
TEI_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in ROUTE_ERROR_STATUSES
}


class OpenAIError(BaseModel):
    # what a route declaring this model answers errors with
    shape: ClassVar[ErrorShape] = ErrorShape.OPENAI

    message: str = Field(description="What went wrong.")
    code: int = Field(description="The HTTP status code.")
    type: str = Field(
        description="Error kind: Validation, Empty, NotFound, Overloaded, Backend, Unhealthy, ..."
    )
    request_id: str | None = Field(
        None, description="The request's id, as the `x-request-id` header says."
    )


# The error bodies an OpenAI-shaped route documents (`{"message", ...}`, which NIM's clients read
# too): the OpenAI and NIM routes.
MESSAGE_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": OpenAIError} for status in ROUTE_ERROR_STATUSES
}


class CohereError(OpenAIError):
    # 400 for a body it cannot read, as Cohere's API answers (docs.cohere.com's errors reference)
    shape: ClassVar[ErrorShape] = ErrorShape.COHERE


# The error bodies Cohere's and Jina's routes document: OpenAI's body, Cohere's statuses.
COHERE_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": CohereError} for status in ROUTE_ERROR_STATUSES
}


class VllmErrorInfo(BaseModel):
    message: str = Field(description="What went wrong.")
    type: str = Field(description="BadRequestError (400), NotFoundError (404), Overloaded, ...")
    param: str | None = Field(None, description="Always null.")
    code: int = Field(description="The HTTP status code.")


class VllmError(BaseModel):
    # what a route declaring this model answers errors with
    shape: ClassVar[ErrorShape] = ErrorShape.VLLM

    error: VllmErrorInfo = Field(description="OpenAI's error object, as vLLM's server answers.")
    request_id: str | None = Field(
        None, description="The request's id, as the `x-request-id` header says."
    )


# The error bodies vLLM's own routes document (`/pooling`); on a path vLLM shares with another
# vendor, a vLLM body's errors come in this shape too (`apis.dialects`).
VLLM_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": VllmError} for status in ROUTE_ERROR_STATUSES
}

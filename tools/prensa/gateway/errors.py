"""Every error the gateway returns: one table from kind to status code and `error_type`, and the
body shapes (TEI's `{"error","error_type"}`, OpenAI's `{"message","code","type"}` as TEI's OpenAI
route answers, vLLM's `{"error": {"message","type","param","code"}}`), written here alone. Which
shape a path answers is what its route declares (`http.routing.ErrorShapes`), or on a path several
vendors share, what the body's dialect answers (`apis.dialects`)."""

from __future__ import annotations

from enum import Enum

import orjson


class ErrorShape(Enum):
    TEI = "tei"  # {"error", "error_type"}: TEI's clients, and every route that declares no other shape
    OPENAI = "openai"  # {"message", "code", "type"}: the OpenAI, Cohere, Jina and NIM SDKs
    # {"error": {...}} and 400 for any bad request, as vLLM answers (the OpenAI SDK's BadRequestError)
    VLLM = "vllm"
    # OpenAI's body and 400 for any bad request, as Cohere's API answers (its SDK's BadRequestError)
    COHERE = "cohere"


# The shapes whose vendors answer every request they cannot read with 400 (TEI's 422)
BAD_REQUEST_SHAPES = frozenset({ErrorShape.VLLM, ErrorShape.COHERE})


class ErrorKind(str, Enum):
    """The value is the `err` label of `te_request_failure`."""

    VALIDATION = "validation"
    TOKENIZER = "tokenizer"
    EMPTY = "empty"
    MALFORMED = "malformed"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"  # what the request would create exists already (a served model's name)
    UNSUPPORTED = "unsupported"  # a valid request the model cannot serve well (`dimensions` without Matryoshka)
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    OVERLOADED = "overloaded"
    SENDING = (
        "sending"  # too many bytes of answers wait for clients to read them (--max-unsent-bytes)
    )
    BACKEND = "backend"
    UNHEALTHY = "unhealthy"


# The statuses an inference route may answer with an error body (its OpenAPI `responses`).
ROUTE_ERROR_STATUSES = (400, 404, 413, 422, 424, 429, 503)

# kind -> (HTTP status, `error_type` / OpenAI `type`)
ERROR_TABLE: dict[ErrorKind, tuple[int, str]] = {
    ErrorKind.VALIDATION: (422, "Validation"),
    ErrorKind.TOKENIZER: (422, "Tokenizer"),
    ErrorKind.EMPTY: (400, "Empty"),
    ErrorKind.MALFORMED: (400, "Validation"),
    ErrorKind.NOT_FOUND: (404, "NotFound"),
    ErrorKind.CONFLICT: (409, "Conflict"),
    ErrorKind.UNSUPPORTED: (400, "Validation"),
    ErrorKind.PAYLOAD_TOO_LARGE: (413, "PayloadTooLarge"),
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: (415, "UnsupportedMediaType"),
    ErrorKind.OVERLOADED: (429, "Overloaded"),
    ErrorKind.SENDING: (503, "Overloaded"),
    ErrorKind.BACKEND: (424, "Backend"),
    ErrorKind.UNHEALTHY: (503, "Unhealthy"),
}


class GatewayError(Exception):
    """Raised anywhere below the routes; the app turns it into a response of the right shape."""

    def __init__(self, kind: ErrorKind, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        # sent as `Retry-After`: when the condition should have passed
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str] | None:
        return None if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}

    @property
    def status(self) -> int:
        return ERROR_TABLE[self.kind][0]


# vLLM's error types by status; other statuses keep ERROR_TABLE's
VLLM_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError"}


def error_status(error: GatewayError, shape: ErrorShape = ErrorShape.TEI) -> int:
    """The status `error` answers with in `shape`: vLLM's and Cohere's 400 for every request they
    cannot read (TEI's 422)."""
    return 400 if shape in BAD_REQUEST_SHAPES and error.status == 422 else error.status


def error_body(
    error: GatewayError, shape: ErrorShape = ErrorShape.TEI, request_id: str = ""
) -> bytes:
    """The JSON body for `error` in `shape`, with the request's id (one field more than the
    vendors' shapes, which their clients ignore)."""
    status, error_type = error_status(error, shape), ERROR_TABLE[error.kind][1]
    body: dict[str, object]
    if shape is ErrorShape.VLLM:
        body = {
            "error": {
                "message": error.message,
                "type": VLLM_ERROR_TYPES.get(status, error_type),
                "param": None,
                "code": status,
            }
        }
    elif shape in (ErrorShape.OPENAI, ErrorShape.COHERE):
        body = {"message": error.message, "code": status, "type": error_type}
    else:
        body = {"error": error.message, "error_type": error_type}
    if request_id:
        body["request_id"] = request_id
    return orjson.dumps(body)


def overloaded() -> GatewayError:
    return GatewayError(ErrorKind.OVERLOADED, "Model is overloaded")


def queue_time_passed(max_wait_s: float | None) -> GatewayError:
    """A request that found no room in Triton within --max-queue-time."""
    return GatewayError(
        ErrorKind.OVERLOADED,
        f"Model is overloaded: no room in Triton within --max-queue-time {max_wait_s:g} s",
    )


def validation(message: str) -> GatewayError:
    """TEI prefixes input validation messages this way."""
    return GatewayError(ErrorKind.VALIDATION, f"Input validation error: {message}")

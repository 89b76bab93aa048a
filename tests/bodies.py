"""What tests read of the gateway's error responses."""

from __future__ import annotations

from typing import Any


def error_of(response: Any) -> dict[str, Any]:
    """An error body without its `request_id`, which must be the one the response's header echoes."""
    body = dict(response.json())
    assert body.pop("request_id") == response.headers["x-request-id"], body
    return body


def declared_error(path: str) -> Any:
    """The error model the route at `path` declares in its OpenAPI `responses`: what its clients
    read, hence the body every error of that route must validate against."""
    from prensa.gateway.app import ROUTERS

    route = next(r for router in ROUTERS for r in router.routes if r.path == path.split("?")[0])
    return next(spec["model"] for spec in route.responses.values() if "model" in spec)


def error_kind(path: str, body: dict[str, Any]) -> str:
    """The error's type as the declared model names it: TEI's `error_type`, OpenAI's `type`, vLLM's
    `error.type`. On a path several vendors share, a vLLM body's error comes in vLLM's shape."""
    from prensa.gateway.apis.dialects import SHARED_PATHS
    from prensa.gateway.apis.errors import VllmError

    model = declared_error(path)
    if path.split("?")[0] in SHARED_PATHS and isinstance(body.get("error"), dict):
        model = VllmError
    model.model_validate(body)
    assert set(body) <= set(model.model_fields), (path, body)
    if model is VllmError:
        return str(body["error"]["type"])
    return str(body["error_type"] if "error_type" in model.model_fields else body["type"])

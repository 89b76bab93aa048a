"""What tests read of the gateway's error responses."""

from __future__ import annotations

from typing import Any


def error_of(response: Any) -> dict[str, Any]:
    """An error body without its `request_id`, which must be the one the response's header echoes."""
    body = dict(response.json())
    assert body.pop("request_id") == response.headers["x-request-id"], body
    return body

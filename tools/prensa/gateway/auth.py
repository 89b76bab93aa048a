"""The API key check both servers make (HTTP's `Authorization` header, gRPC's metadata)."""

from __future__ import annotations

import hmac


def key_matches(authorization: str, api_key: str) -> bool:
    """A `Bearer` token equal to the key; compared in constant time so timing leaks no prefix."""
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        token.strip().encode(), api_key.encode()
    )

"""Gateway settings: one frozen value built by the CLI (or a test) and read everywhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class GatewaySettings:
    triton_url: str = "127.0.0.1:8001"  # several replicas: comma-separated gRPC addresses
    repo: Path = Path("model_repo")  # where `<name>_tokenize/1/<tokenizer file>` is read from
    default_model: str | None = None
    max_concurrent_requests: int = 512  # permits; one per input, try-acquire (TEI)
    max_client_batch_size: int = 32
    split_large_batches: bool = False  # over the batch limit: split server-side instead of 422
    payload_limit: int = 2_000_000  # bytes of request body, checked before JSON parsing
    auto_truncate: bool = True  # what `truncate: null` means
    api_key: str | None = None
    cors_allow_origins: tuple[str, ...] = field(default_factory=tuple)
    triton_timeout_s: float = 30.0  # per inference call; health and metadata calls use min(2 s, this)
    # Idle HTTP connections stay open this long. Longer than clients keep theirs (httpx and the OpenAI
    # SDK: 5 s) and than proxies' idle timeouts (60 s), so the client closes first: a server closing
    # the same moment a client reuses the connection loses that request with no response.
    keep_alive_s: float = 75.0

    @property
    def triton_urls(self) -> list[str]:
        return [url.strip() for url in self.triton_url.split(",") if url.strip()]

    @property
    def probe_timeout_s(self) -> float:
        return min(2.0, self.triton_timeout_s)

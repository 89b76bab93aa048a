"""Gateway settings: one frozen value built by the CLI (or a test) and read everywhere.

Each field carries its command-line flag and help text (`prensa.options.setting`): `prensa.cli.gateway`
builds the gateway options of `prensa gateway`, `serve` and `up` from these fields, so no command can
miss one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prensa.addresses import TRITON_GRPC_URL
from prensa.options import InvalidSetting, require_positive, setting
from prensa.triton.repo import DEFAULT_REPO

LOG_LEVELS = ("debug", "info", "warning", "error")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")


@dataclass(frozen=True)
class GatewaySettings:
    triton_url: str = setting(
        TRITON_GRPC_URL,
        "Triton gRPC address; several replicas as a comma-separated list (least outstanding "
        "requests, health-checked).",
        gateway_only=True,
    )
    repo: Path = setting(
        DEFAULT_REPO, "Triton's model repository, read for tokenizer files.", gateway_only=True
    )
    default_model: str | None = setting(
        None, "Model for requests naming none (if it fits the route)."
    )
    # Permits, one per input, taken by try-acquire (TEI).
    max_concurrent_requests: int = setting(512, "Inputs in flight before requests get 429.")
    max_client_batch_size: int = setting(32, "Inputs per request before 422.")
    split_large_batches: bool = setting(
        False, "Split larger requests into Triton calls instead of 422."
    )
    coalesce_requests: bool = setting(
        True,
        "Merge concurrent requests' texts into one Triton call while the "
        "model is busy (a lone request is sent at once).",
    )
    priority: bool = setting(
        True,
        "Online requests go before bulk work (batch jobs; requests with the header "
        "x-prensa-priority: bulk, or vLLM's priority above 0) wherever they wait in the gateway; "
        "off: first come, first served.",
    )
    bulk_call_time_s: float = setting(
        0.025,
        "With --priority: seconds one Triton call of bulk work should take; its inputs are cut "
        "into calls of as many rows as the model computes in that time (at least one), learnt "
        "from its calls, so an online query waits about that long behind bulk work at most.",
        flag="--bulk-call-time",
    )
    # checked before JSON parsing
    payload_limit: int = setting(2_000_000, "Max request body in bytes (413 above).")
    data_dir: Path | None = setting(
        None,
        "Directory of the Files and Batch APIs' jobs and files (SQLite and the files beside it); "
        "jobs there survive restarts. Unset: those routes answer 404, saying so.",
    )
    model_admin: bool = setting(
        False,
        "Serve /admin/models: add an export to the running server and remove a served model "
        "(behind --api-key when set). Off: those routes answer 404, saying so.",
    )
    upload_limit: int = setting(
        200_000_000,
        "Max file upload (POST /v1/files, multipart) in bytes, as OpenAI's (413 above).",
    )
    max_tokenize_tokens: int | None = setting(
        None,
        "Tokens a /tokenize request may hold, and ids a /decode request, before 413; default: "
        "--max-client-batch-size x the model's max length.",
    )
    # `truncate: null`
    auto_truncate: bool = setting(True, "Truncate too long inputs when a request does not say.")
    chunk_long_inputs: bool = setting(
        False,
        "Embed inputs over the model's max length as overlapping windows "
        "combined into one answer, when a request does not say (`chunking`).",
    )
    allow_any_dimensions: bool = setting(
        False,
        "Serve `dimensions` on models that declare no Matryoshka sizes (their cut vectors are poor ones); "
        "otherwise such a request gets 400.",
    )
    # vLLM's, Cohere's and Jina's clients read `{"text": ...}`; LiteLLM's `infinity/` posts the same
    # body to the same path and reads a string
    rerank_document_strings: bool = setting(
        False,
        "Echo each document of a `/rerank` body with `documents` and `return_documents: true` as a "
        "string (Infinity's answer) instead of `{\"text\": ...}` (vLLM's); a body with Infinity's "
        "`raw_scores` gets strings either way.",
    )
    api_key: str | None = setting(None, "Require `Authorization: Bearer KEY` on inference routes.")
    cors_allow_origins: tuple[str, ...] = setting(
        (), "Allowed CORS origin; repeatable.", flag="--cors-allow-origin"
    )
    # Per inference call; health and metadata calls use min(2 s, this).
    triton_timeout_s: float = setting(
        30.0, "Seconds a Triton inference call may take before 503.", flag="--triton-timeout"
    )
    # Idle HTTP connections stay open this long. Longer than clients keep theirs (httpx and the OpenAI
    # SDK: 5 s) and than proxies' idle timeouts (60 s), so the client closes first: a server closing
    # the same moment a client reuses the connection loses that request with no response.
    keep_alive_s: float = setting(
        75.0,
        "Seconds an idle client connection stays open; keep it above your clients' and proxies' idle "
        "timeouts.",
        flag="--keep-alive",
    )
    default_prompt_name: str | None = setting(
        None,
        "Prompt (from the model's sentence-transformers config) prepended to inputs of requests that name "
        "none; models without it get none.",
    )
    default_prompt: str | None = setting(
        None,
        "Text prepended to every embedding input of requests that name no prompt; exclusive with "
        "--default-prompt-name.",
    )
    # Slow or hostile clients (prensa.gateway.server): each connection holds a file descriptor and
    # its buffers, and uvicorn bounds neither how long a request may take to arrive nor how long
    # an unread answer may sit in memory.
    request_read_timeout_s: float = setting(
        30.0,
        "Seconds a request (line, headers and body) may take to arrive, counted from the connection opening "
        "or the request's first byte; slower clients get 408 or are disconnected.",
        flag="--request-read-timeout",
    )
    write_timeout_s: float = setting(
        30.0,
        "Seconds a client may read nothing of its answer before it is disconnected and the answer freed.",
        flag="--write-timeout",
    )
    max_unsent_bytes: int = setting(
        256 << 20,
        "Bytes of answers a gateway process holds for clients that have not read them yet; past it, "
        "requests get 503 with Retry-After, and an answer that would not fit is replaced by that 503.",
    )
    max_header_size: int = setting(65_536, "Max bytes of a request's URL and headers (431 above).")
    max_connections: int | None = setting(
        None,
        "Open HTTP client connections before new ones get 503 and are closed; default and ceiling: the "
        "file-descriptor limit (ulimit -n, whose soft value prensa raises to the hard one at start) less 64 "
        "kept for the gateway's own files and sockets, less what --max-grpc-connections takes.",
    )
    # The TEI gRPC port's own bounds: grpc core closes its connections, not the HTTP server.
    max_grpc_connections: int | None = setting(
        None,
        "With --tei-grpc-port: open gRPC connections before new ones are closed before their handshake "
        "(UNAVAILABLE); their own budget, so silent gRPC connections cannot lock HTTP clients out, nor "
        "silent HTTP ones gRPC clients. Default: a quarter of the file-descriptor ceiling.",
    )
    grpc_handshake_timeout_s: float = setting(
        10.0,
        "Seconds a new gRPC connection may take to send its HTTP/2 preface and settings before it is closed.",
        flag="--grpc-handshake-timeout",
    )
    grpc_idle_timeout_s: float = setting(
        300.0,
        "Seconds a gRPC connection with no call in flight stays open (then GOAWAY: clients reconnect "
        "on their next call).",
        flag="--grpc-idle-timeout",
    )
    grpc_max_connection_age_s: float = setting(
        3600.0,
        "Seconds a gRPC connection may live before it is asked to go away (GOAWAY), so that clients "
        "spread again over workers and replicas.",
        flag="--grpc-max-connection-age",
    )
    grpc_connection_age_grace_s: float = setting(
        60.0,
        "Seconds the calls and streams of a gRPC connection past its age get to finish before it is closed.",
        flag="--grpc-connection-age-grace",
    )
    max_queue_time_s: float | None = setting(
        None,
        "Seconds an admitted request (HTTP, or a gRPC call or stream message) may wait for room in Triton "
        "before it is refused (429, RESOURCE_EXHAUSTED); unset: it waits its turn.",
        flag="--max-queue-time",
    )
    log_level: str = setting("info", "Level of prensa's log: debug, info, warning or error.")
    json_output: bool = setting(False, "Log JSON lines instead of text (TEI's flag).")
    access_log: bool = setting(
        True,
        "One log line per request: route, status, model, inputs, tokens, each stage's "
        "milliseconds, request id and the reason of an error.",
    )
    # Tracing (prensa.gateway.tracing): TEI's two flags, the exporter's protocol and a sampling rate.
    otlp_endpoint: str | None = setting(
        None,
        "OpenTelemetry collector that receives traces, e.g. http://127.0.0.1:4317 (gRPC, as TEI's flag); "
        "`prensa serve` points Triton's own tracing at it too. Unset: no tracing, at no cost.",
    )
    otlp_service_name: str = setting(
        "prensa", "service.name of the gateway's spans (Triton's: NAME-triton)."
    )
    otlp_protocol: str = setting("grpc", "How spans reach --otlp-endpoint: grpc or http/protobuf.")
    otlp_sample_rate: float = setting(
        1.0,
        "Share of requests traced when the client's traceparent does not decide (0 to 1); a client's "
        "sampled traceparent is always traced.",
    )
    # Processes accepting on one listening socket (prensa.gateway.workers); None: `default_workers()`.
    workers: int | None = setting(
        None,
        "Gateway processes serving the one port, each with its own Triton channels; --max-concurrent-requests "
        "and /metrics count them all together. Default: one per four CPU cores (a container CPU limit counts), at least one.",
    )
    # TEI's gRPC API (prensa.gateway.grpc) beside the HTTP one, in the same event loop and on the
    # same host; off by default. prensa's own --grpc-port is Triton's.
    tei_grpc_port: int | None = setting(
        None,
        "Serve TEI's gRPC API (package tei.v1, with server reflection and gRPC's health service) "
        "on this port, on the gateway's host; with several --workers each binds it (SO_REUSEPORT). "
        "Unset: no gRPC server.",
    )
    # uvicorn's own default waits for every request however long its client takes.
    graceful_timeout_s: float = setting(
        5.0,
        "Seconds in-flight requests get to finish on shutdown before they are cancelled.",
        flag="--graceful-timeout",
    )

    def __post_init__(self) -> None:
        if self.log_level.lower() not in LOG_LEVELS:
            raise InvalidSetting(
                "log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {self.log_level}"
            )
        if self.otlp_protocol not in OTLP_PROTOCOLS:
            raise InvalidSetting(
                "otlp_protocol",
                f"must be one of {', '.join(OTLP_PROTOCOLS)}, got {self.otlp_protocol}",
            )
        if not 0.0 <= self.otlp_sample_rate <= 1.0:
            raise InvalidSetting(
                "otlp_sample_rate", f"must be between 0 and 1, got {self.otlp_sample_rate}"
            )
        if self.api_key is not None and not self.api_key.strip():
            raise InvalidSetting(
                "api_key",
                "an empty API key would turn authentication off; give a key, or leave "
                "--api-key and PRENSA_API_KEY unset",
            )
        require_positive(
            self,
            "request_read_timeout_s",
            "write_timeout_s",
            "graceful_timeout_s",
            "max_header_size",
            "max_connections",
            "max_grpc_connections",
            "max_unsent_bytes",
            "grpc_handshake_timeout_s",
            "grpc_idle_timeout_s",
            "grpc_max_connection_age_s",
            "grpc_connection_age_grace_s",
            "max_queue_time_s",
            "bulk_call_time_s",
            "max_tokenize_tokens",
            "workers",
        )
        if self.tei_grpc_port is not None and not 0 < self.tei_grpc_port < 65536:
            raise InvalidSetting(
                "tei_grpc_port", f"must be a port number (1 to 65535), got {self.tei_grpc_port}"
            )

    @property
    def triton_urls(self) -> list[str]:
        return [url.strip() for url in self.triton_url.split(",") if url.strip()]

    @property
    def probe_timeout_s(self) -> float:
        return min(2.0, self.triton_timeout_s)

"""What one request carries through the gateway besides its body: see `RequestContext`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from prensa.gateway.core.tokenization import Item
from prensa.gateway.tracing import past_stage

# The header that marks a request bulk work (or online), as any client library can send it.
PRIORITY_HEADER = "x-prensa-priority"


class Priority(IntEnum):
    """Who goes first where requests wait in the gateway: online queries before bulk work (batch
    jobs, requests marked bulk), which fills what online leaves. The values are Triton's priority
    levels, 1 first."""

    ONLINE = 1
    BULK = 2

    @classmethod
    def named(cls, name: str) -> Priority | None:
        """The priority a header names (`online` or `bulk`), None for any other."""
        return cls.__members__.get(name.strip().upper())


def priority_refusal(name: str) -> str:
    return f"{PRIORITY_HEADER} must be `online` or `bulk`, got {name!r}"


@dataclass
class RequestContext:
    """One request from arrival to answer: its id, the model that answered, what it carried and
    its time by stage, which its timing headers, access line, trace span and metrics report (see
    docs/api.md's headers for each field). Built once per request (`http.routing.GatewayRequest`, or
    a gRPC call), it changes only through the events below."""

    received: float  # perf_counter when the request arrived
    request_id: str = ""  # see `logs.request_id`; Triton gets it as the inference request's id
    model: str = ""  # the served model that answered
    inputs: int = 0
    tokenization_s: float = 0.0
    queue_s: float | None = None
    inference_s: float = 0.0
    tokens: int = 0
    characters: int = 0
    chunks: list[int] | None = None  # windows per input, when long inputs were chunked
    priority: Priority = Priority.ONLINE
    client: str = ""  # the connection it came on: whose turn it waits for (`turns.Turns`)
    refusal: str | None = None  # what its headers got wrong, refused where it reaches the service

    def read_priority(self, header: str | None) -> None:
        """The priority its header names; a wrong one is kept as its refusal, not raised here,
        since a context is read after an answer too (its metrics and log line)."""
        if header is None:
            return
        named = Priority.named(header)
        if named is None:
            self.refusal = priority_refusal(header)
        else:
            self.priority = named

    def began(self, model: str, items: Sequence[Item], pairs: Sequence[str] | None) -> None:
        """A Triton call of this request starts; the first one ends its parsing and validation."""
        if not self.inputs:
            past_stage("parse and validate", self.received)
        self.model, self.inputs = model, self.inputs + len(items)
        self.characters += sum(len(item) for item in items if isinstance(item, str)) + sum(
            map(len, pairs or ())
        )

    def served(self, model: str, inputs: int) -> None:
        """A request answered without Triton (tokenizer work, model information) names its model."""
        self.model, self.inputs = model, inputs

    def tokenized(self, seconds: float) -> None:
        self.tokenization_s += seconds

    def chunked(self, counts: list[int], seconds: float) -> None:
        self.chunks = counts
        self.tokenization_s += seconds

    def dispatched(self, now: float) -> float | None:
        """The request's queue time (parsing, validation, admission) when this is its first dispatch,
        else None: a `TritonWindow` wait counts as inference."""
        if self.queue_s is not None:
            return None
        self.queue_s = max(now - self.received - self.tokenization_s, 0.0)
        return self.queue_s

    def inferred(self, seconds: float, tokens: int) -> None:
        self.inference_s += seconds
        self.tokens += tokens

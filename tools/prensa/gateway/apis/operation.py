"""An inference route's work, whichever dialect's path it runs on: the body it takes, what it needs
of a model, and the payload it answers. A dialect's operation reads its body into an `Ask`
(`core.asks`), runs it on the service and renders the answer in its vendor's shape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Response
from pydantic import BaseModel

from prensa.gateway.apis.common import read_priority
from prensa.gateway.core.registry import ServedModel, named_model
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.http.routing import GatewayRequest, json_response
from prensa.gateway.state import Gateway
from prensa.layouts import Capability


@dataclass(frozen=True)
class Operation:
    """One inference route's work: its body, what it needs of a model, and the JSON it answers."""

    name: str  # the route's name, and its `method` label in the metrics
    request: type[BaseModel]
    capability: Capability | None  # None: any model, the operation tells them apart
    run: Callable[[Any, Gateway, ServedModel, RequestContext], Awaitable[Any]]
    # what the body asks of a model, where that depends on the body (in place of `capability`)
    needs: Callable[[Any], Capability] | None = None

    async def answer(self, request: Any, http: GatewayRequest, query_model: str | None) -> Any:
        """The payload for `request`, on the model it names (or the default one)."""
        gw = http.gateway
        capability = self.needs(request) if self.needs else self.capability
        served = await gw.registry.pick(capability, named_model(query_model, request.model))
        read_priority(request, http.context)
        return await self.run(request, gw, served, http.context)

    async def respond(
        self, request: Any, http: GatewayRequest, query_model: str | None
    ) -> Response:
        """`answer` as the HTTP response; an operation that builds its own (a large `/tokenize`,
        serialised in a thread) hands it back as it is."""
        payload = await self.answer(request, http, query_model)
        if isinstance(payload, Response):
            return payload
        return json_response(payload, http.context)

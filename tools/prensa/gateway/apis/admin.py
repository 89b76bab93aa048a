"""Models added to and removed from the running server (`--model-admin`), behind the API key.

Adding renders an export into Triton's repository, loads it on every Triton the gateway calls and
reads the model list again, so it is served as soon as the answer comes. Removing first stops
taking requests for the model and waits for the ones it holds (up to --graceful-timeout), then
unloads it and removes its directories. The repository and Triton do the work
(`prensa.triton.models`); these routes order it around the registry.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from prensa.gateway.apis.errors import TEI_ERRORS
from prensa.gateway.apis.tei.routes import model_info
from prensa.gateway.errors import ErrorKind, GatewayError
from prensa.gateway.http.routing import GatewayRequest, GatewayRoute, json_response
from prensa.gateway.state import Gateway
from prensa.triton.models import ModelChangeError, add_model, remove_model

router = APIRouter(route_class=GatewayRoute, responses=TEI_ERRORS, tags=["Admin"])

MODELS_PATH = "/admin/models"
NO_ADMIN = (
    "adding and removing models on the running server is off: start the gateway with "
    "--model-admin (PRENSA_MODEL_ADMIN)"
)


class ModelAdd(BaseModel):
    name: str = Field(description="The name clients will call it by.")
    export_dir: Path = Field(
        description="A `prensa export` directory, as the gateway's machine sees it."
    )


def admin_of(http: GatewayRequest) -> Gateway:
    gateway = http.gateway
    if not gateway.settings.model_admin:
        raise GatewayError(ErrorKind.NOT_FOUND, NO_ADMIN)
    return gateway


@router.post(MODELS_PATH, summary="Add an export to the running server")
async def add(body: ModelAdd, http: GatewayRequest) -> Response:
    """Render, load and serve `export_dir` as `name`; 409 when the name is served already, 400
    when the export or its load fails (Triton's reason in the message)."""
    gateway = admin_of(http)
    if body.name in gateway.registry.models:
        raise GatewayError(ErrorKind.CONFLICT, f"The model `{body.name}` is served already")
    settings = gateway.settings
    try:
        await asyncio.to_thread(
            add_model, settings.repo, settings.triton_urls, body.name, body.export_dir
        )
    except ModelChangeError as exc:
        raise GatewayError(ErrorKind.MALFORMED, str(exc)) from None
    await gateway.registry.refresh()
    served = gateway.registry.models.get(body.name)
    if served is None:
        raise GatewayError(
            ErrorKind.UNHEALTHY, f"`{body.name}` loaded, but Triton does not report it ready yet"
        )
    return json_response(model_info(served))


@router.delete(MODELS_PATH + "/{name}", summary="Remove a served model")
async def remove(name: str, http: GatewayRequest) -> Response:
    """Stop taking requests for `name`, let the ones it holds finish, unload it and remove it
    from the repository."""
    gateway = admin_of(http)
    registry = gateway.registry
    served = registry.models.get(name)
    if served is None or name in registry.uses.retiring:
        raise GatewayError(ErrorKind.NOT_FOUND, f"The model `{name}` is not served")
    registry.uses.retiring.add(name)
    try:
        drained = await registry.uses.drained(name, gateway.settings.graceful_timeout_s)
        settings = gateway.settings
        await asyncio.to_thread(
            remove_model, settings.repo, settings.triton_urls, served.triton_models
        )
        await registry.refresh()
    finally:
        registry.uses.retiring.discard(name)
    return json_response({"id": name, "object": "model", "deleted": True, "drained": drained})

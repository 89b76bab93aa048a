"""Models changed on the running server (`--model-admin`), behind the API key.

Adding renders an export into Triton's repository as a model's next version, loads it on every
Triton the gateway calls and reads the model list again, so it is served as soon as the answer
comes. Promotion and rollback move the version a name reaches. A version goes on trial beside it
by kind: a relevance model's canary answers a share of the name's requests; an embedder's shadow
gets a copy of them and answers none (`core.shadow`). Removing first stops taking
requests for a version and waits for the ones it holds (up to --graceful-timeout), then unloads it
and removes its directories. The repository and Triton do the work (`prensa.triton.models`);
these routes order it around the registry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from prensa.gateway.apis.errors import TEI_ERRORS
from prensa.gateway.apis.tei.routes import model_info
from prensa.gateway.core.registry import Registry, ServedModel
from prensa.gateway.errors import ErrorKind, GatewayError
from prensa.gateway.http.routing import GatewayRequest, GatewayRoute, json_response
from prensa.gateway.state import Gateway
from prensa.layouts import VECTORS, Capability
from prensa.triton.models import (
    ModelChangeError,
    VersionConflict,
    add_model,
    end_trial,
    promote,
    remove_model,
    rollback,
    set_trial,
)
from prensa.triton.versions import Lineage, pinned, version_name

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


@router.post(MODELS_PATH, summary="Add an export, or a new version of a served model")
async def add(body: ModelAdd, http: GatewayRequest) -> Response:
    """Render, load and serve `export_dir` as `name`'s next version: the first is what the name
    reaches, a later one answers pinned (`name@N`) until promoted. 400 when the export or its
    load fails (Triton's reason in the message)."""
    gateway = admin_of(http)
    settings = gateway.settings
    async with gateway.model_changes:
        try:
            model, version = await asyncio.to_thread(
                add_model, settings.repo, settings.triton_urls, body.name, body.export_dir
            )
        except ModelChangeError as exc:
            raise GatewayError(ErrorKind.MALFORMED, str(exc)) from None
        gateway.registry.uses.gone.discard(model)
        await gateway.registry.refresh()
    served = gateway.registry.models.get(model)
    if served is None:
        raise GatewayError(
            ErrorKind.UNHEALTHY, f"`{model}` loaded, but Triton does not report it ready yet"
        )
    return json_response(
        {**model_info(served), "version": version, "current": gateway.registry.is_current(model)}
    )


class Promotion(BaseModel):
    version: int = Field(ge=1, description="The version the name alone reaches from now on.")


@router.post(MODELS_PATH + "/{name}/promote", summary="Point a model's name at one of its versions")
async def promote_version(name: str, body: Promotion, http: GatewayRequest) -> Response:
    gateway = admin_of(http)
    target = version_name(name, body.version)
    if target not in gateway.registry.models:
        raise GatewayError(ErrorKind.NOT_FOUND, f"`{target}` is not served (not loaded, or gone)")
    return await _moved(gateway, name, lambda: promote(gateway.settings.repo, name, body.version))


@router.post(MODELS_PATH + "/{name}/rollback", summary="Point a model's name back where it was")
async def rollback_version(name: str, http: GatewayRequest) -> Response:
    gateway = admin_of(http)
    return await _moved(gateway, name, lambda: rollback(gateway.settings.repo, name))


class Canary(BaseModel):
    version: int = Field(ge=1, description="The version on trial.")
    share: float = Field(
        ge=0.0, le=1.0, description="The share of the name's requests it answers; 0 ends the trial."
    )


class Shadow(BaseModel):
    version: int = Field(ge=1, description="The version that gets a copy of the name's requests.")


@router.post(MODELS_PATH + "/{name}/canary", summary="Let a version answer a share of requests")
async def canary(name: str, body: Canary, http: GatewayRequest) -> Response:
    """A relevance model's version answers `share` of the requests that name the model alone
    (pinned ones go where they are pinned). 409 for a model that answers with vectors."""
    gateway = admin_of(http)
    served = _trial_version(gateway, name, body.version)
    if served.capabilities & VECTORS:
        raise GatewayError(
            ErrorKind.CONFLICT,
            f"`{name}` answers with vectors, and vectors of two versions do not mix: no share of "
            f"its requests may go to `{served.name}`. Pin it, or compare it with "
            f"`prensa models shadow {served.name}`",
        )
    return await _moved(
        gateway,
        name,
        lambda: set_trial(gateway.settings.repo, name, body.version, share=body.share),
    )


@router.post(MODELS_PATH + "/{name}/shadow", summary="Copy an embedder's requests to a version")
async def shadow(name: str, body: Shadow, http: GatewayRequest) -> Response:
    """An embedder's version gets a copy of each dense request the name's version answers, and
    the gateway's metrics compare the two (`prensa_shadow_*`); it answers none of them. 409 for
    a model without dense vectors."""
    gateway = admin_of(http)
    served = _trial_version(gateway, name, body.version)
    if not served.can(Capability.DENSE):
        raise GatewayError(
            ErrorKind.CONFLICT,
            f"a shadow compares dense vectors, which `{served.name}` does not give; a relevance "
            f"model's version takes a share of requests instead: `prensa models canary`",
        )
    return await _moved(
        gateway, name, lambda: set_trial(gateway.settings.repo, name, body.version, shadow=True)
    )


@router.delete(MODELS_PATH + "/{name}/trial", summary="End a model's canary or shadow")
async def stop_trial(name: str, http: GatewayRequest) -> Response:
    gateway = admin_of(http)
    return await _moved(gateway, name, lambda: end_trial(gateway.settings.repo, name))


def _trial_version(gateway: Gateway, name: str, version: int) -> ServedModel:
    """The served version to put on trial beside `name`'s current one."""
    target = version_name(name, version)
    served = gateway.registry.models.get(target)
    if served is None:
        raise GatewayError(ErrorKind.NOT_FOUND, f"`{target}` is not served (not loaded, or gone)")
    return served


async def _moved(gateway: Gateway, name: str, move: Callable[[], Lineage]) -> Response:
    """`move` the name's pointer, then read it again: requests after the answer reach the new one."""
    async with gateway.model_changes:
        try:
            lineage = await asyncio.to_thread(move)
        except VersionConflict as exc:
            raise GatewayError(ErrorKind.CONFLICT, str(exc)) from None
        except ModelChangeError as exc:
            raise GatewayError(ErrorKind.NOT_FOUND, str(exc)) from None
        await gateway.registry.refresh()
    record = lineage.as_record()
    return json_response(
        {"id": name, "object": "model", "version": record.pop("current"), **record}
    )


def versions_of(registry: Registry, model: str) -> list[str]:
    """The served versions of `model`'s name."""
    name = pinned(model)[0]
    return [served for served in registry.models if pinned(served)[0] == name]


@router.delete(MODELS_PATH + "/{name}", summary="Remove a served model, or one of its versions")
async def remove(name: str, http: GatewayRequest) -> Response:
    """Stop taking requests for `name` (a version pinned, `name@N`, or a model's first), let the
    ones it holds finish, unload it and remove it from the repository; 409 for the version its
    name reaches while it has others."""
    gateway = admin_of(http)
    registry = gateway.registry
    base, version = pinned(name)
    model = version_name(base, version) if version else name  # `name@1` is `name` itself
    async with gateway.model_changes:
        served = registry.models.get(model)
        if served is None or model in registry.uses.retiring:
            raise GatewayError(ErrorKind.NOT_FOUND, f"The model `{name}` is not served")
        if registry.is_current(model) and len(versions_of(registry, model)) > 1:
            raise GatewayError(
                ErrorKind.CONFLICT,
                f"`{name}` is the version its name reaches; promote another version first",
            )
        registry.uses.retiring.add(model)
        try:
            drained = await registry.uses.drained(model, gateway.settings.graceful_timeout_s)
            settings = gateway.settings
            await asyncio.to_thread(
                remove_model, settings.repo, settings.triton_urls, served.triton_models
            )
            registry.uses.gone.add(model)
            await registry.refresh()
        except ModelChangeError as exc:
            raise GatewayError(ErrorKind.CONFLICT, str(exc)) from None
        finally:
            registry.uses.retiring.discard(model)
    return json_response({"id": name, "object": "model", "deleted": True, "drained": drained})

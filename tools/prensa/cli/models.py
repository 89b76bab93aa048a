"""`prensa models`: add an export (or a new version of a served model) to a running server,
promote or roll back a version, or remove one, through the gateway's admin routes
(`--model-admin`), which render, load, drain and unload in order."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from prensa.addresses import GATEWAY_URL
from prensa.triton.versions import pinned

app = typer.Typer(help="Add and remove models on a running server (its gateway's --model-admin).")
console = Console()

Url = Annotated[str, typer.Option(help="The running gateway.")]
ApiKey = Annotated[
    str | None,
    typer.Option(envvar="PRENSA_API_KEY", help="The gateway's --api-key, if it has one."),
]
# loading a large graph, or draining a model's long requests, takes minutes
TIMEOUT_S = 900.0


def _call(method: str, url: str, api_key: str | None, **kwargs: Any) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.request(method, url, headers=headers, timeout=TIMEOUT_S, **kwargs)
    except httpx.HTTPError as exc:
        console.print(f"[red]error:[/] {url}: {exc}")
        raise typer.Exit(1) from exc
    body: dict[str, Any] = response.json() if response.content else {}
    if response.status_code >= 400:
        console.print(f"[red]error:[/] {body.get('error') or body or response.status_code}")
        raise typer.Exit(1)
    return body


@app.command()
def add(
    name: Annotated[str, typer.Argument(help="The name clients will call it by.")],
    export_dir: Annotated[
        Path,
        typer.Argument(help="A `prensa export` directory, as the gateway's machine sees it."),
    ],
    url: Url = GATEWAY_URL,
    api_key: ApiKey = None,
) -> None:
    """Render EXPORT_DIR into the server's repository, load it in Triton and serve it as NAME."""
    with console.status(f"adding {name}: rendering, loading and warming it up"):
        info = _call(
            "POST",
            f"{url}/admin/models",
            api_key,
            json={"name": name, "export_dir": str(export_dir.resolve())},
        )
    served = info.get("served_model_name", name)
    console.print(f"serving {served} ({info.get('task', '?')}), version {info.get('version')}")
    if not info.get("current", True):
        console.print(
            f"`{name}` alone still reaches its current version; `{served}` answers pinned until "
            f"`prensa models promote {served}`"
        )


@app.command()
def promote(
    model: Annotated[str, typer.Argument(help="A model's version, as NAME@VERSION.")],
    url: Url = GATEWAY_URL,
    api_key: ApiKey = None,
) -> None:
    """Point NAME at VERSION: requests naming NAME alone reach it from the answer on."""
    name, version = split_pin(model)
    moved = _call("POST", f"{url}/admin/models/{name}/promote", api_key, json={"version": version})
    console.print(f"{name} -> version {moved['version']} (before: {moved['before']})")


@app.command()
def rollback(
    name: Annotated[str, typer.Argument(help="A served model's name.")],
    url: Url = GATEWAY_URL,
    api_key: ApiKey = None,
) -> None:
    """Point NAME back at the version it reached before its last promotion."""
    moved = _call("POST", f"{url}/admin/models/{name}/rollback", api_key, json={})
    console.print(f"{name} -> version {moved['version']}")


def split_pin(text: str) -> tuple[str, int]:
    name, version = pinned(text)
    if version is None:
        raise typer.BadParameter(f"name a version, as {text}@2", param_hint="MODEL")
    return name, version


@app.command()
def remove(
    name: Annotated[
        str, typer.Argument(help="A served model, or one of its versions as NAME@VERSION.")
    ],
    url: Url = GATEWAY_URL,
    api_key: ApiKey = None,
) -> None:
    """Stop taking requests for NAME, let those it holds finish, unload it and remove it from the
    repository."""
    with console.status(f"removing {name}: draining its requests, then unloading it"):
        result = _call("DELETE", f"{url}/admin/models/{name}", api_key)
    drained = "" if result.get("drained", True) else " (its last requests did not finish in time)"
    console.print(f"removed {name}{drained}")

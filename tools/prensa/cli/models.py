"""`prensa models`: add an export to a running server, or remove a served model, through the
gateway's admin routes (`--model-admin`), which render, load, drain and unload in order."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from prensa.addresses import GATEWAY_URL

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
    console.print(f"serving {info.get('served_model_name', name)} ({info.get('task', '?')})")


@app.command()
def remove(
    name: Annotated[str, typer.Argument(help="A served model.")],
    url: Url = GATEWAY_URL,
    api_key: ApiKey = None,
) -> None:
    """Stop taking requests for NAME, let those it holds finish, unload it and remove it from the
    repository."""
    with console.status(f"removing {name}: draining its requests, then unloading it"):
        result = _call("DELETE", f"{url}/admin/models/{name}", api_key)
    drained = "" if result.get("drained", True) else " (its last requests did not finish in time)"
    console.print(f"removed {name}{drained}")

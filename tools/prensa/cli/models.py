"""`prensa models`: add an export (or a new version of a served model) to a running server,
put a version on trial (a canary, or an embedder's shadow), promote or roll back a version, or
remove one, through the gateway's admin routes (`--model-admin`), which render, load, drain and
unload in order."""

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


@app.command()
def canary(
    model: Annotated[str, typer.Argument(help="A relevance model's version, as NAME@VERSION.")],
    share: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="The share of the requests naming NAME alone that VERSION answers; 0 ends it.",
        ),
    ] = 0.1,
    url: Url = GATEWAY_URL,
    api_key: ApiKey = None,
) -> None:
    """Let VERSION of a reranker, cross-encoder or classifier answer a share of NAME's requests
    (refused for embedders: their vectors do not mix; see `shadow`)."""
    name, version = split_pin(model)
    body = {"version": version, "share": share}
    trial = _call("POST", f"{url}/admin/models/{name}/canary", api_key, json=body)
    console.print(_trial_line(name, trial))


@app.command()
def shadow(
    model: Annotated[str, typer.Argument(help="An embedder's version, as NAME@VERSION.")],
    url: Url = GATEWAY_URL,
    api_key: ApiKey = None,
) -> None:
    """Send VERSION a copy of the dense requests NAME answers, never answering with it; the
    gateway's metrics compare the two (prensa_shadow_cosine, prensa_shadow_top_k_agreement)."""
    name, version = split_pin(model)
    trial = _call("POST", f"{url}/admin/models/{name}/shadow", api_key, json={"version": version})
    console.print(_trial_line(name, trial))


@app.command("end-trial")
def end_trial(
    name: Annotated[str, typer.Argument(help="A served model's name.")],
    url: Url = GATEWAY_URL,
    api_key: ApiKey = None,
) -> None:
    """End NAME's canary or shadow: the version NAME reaches answers everything again."""
    trial = _call("DELETE", f"{url}/admin/models/{name}/trial", api_key)
    console.print(_trial_line(name, trial))


def _trial_line(name: str, trial: dict[str, Any]) -> str:
    line = f"{name} -> version {trial['version']}"
    if trial.get("canary"):
        return f"{line}; version {trial['canary']} answers {trial['share']:.0%} of its requests"
    if trial.get("shadow"):
        return f"{line}; version {trial['shadow']} shadows it"
    return f"{line}; no version on trial"


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

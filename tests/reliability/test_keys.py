"""An API key set but empty (`--api-key ''`, `PRENSA_API_KEY=`, or only spaces) is refused at
start-up by `prensa gateway`, `serve` and `up` alike: click reads an empty variable as unset, so
the gateway would otherwise serve with no authentication where the operator asked for some.

The real `prensa` executable, as a shell runs it; a command that starts serving instead of
refusing is stopped by PID after `START_S`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prensa.addresses import free_port
from tests.reliability.conftest import stop_tree

PRENSA = str(Path(sys.executable).parent / "prensa")
START_S = 60.0  # far more than the CLI takes to parse its options and refuse


def ports(gateway_flag: str) -> list[str]:
    """Free ports for everything the command would open, were it to start."""
    triton = ["--http-port", str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    return [gateway_flag, str(free_port())] if gateway_flag == "--port" else [*triton, gateway_flag, str(free_port())]


def command(name: str, tmp_path: Path) -> list[str]:
    if name == "gateway":
        return ["gateway", "--triton-url", f"127.0.0.1:{free_port()}", "--repo", str(tmp_path), *ports("--port")]
    if name == "serve":
        return ["serve", "--repo", str(tmp_path), *ports("--gateway-port")]
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "models" / "tiny" / "prensa.json").write_text("{}")
    return ["up", "--models-dir", str(tmp_path / "models"), "--model", "tiny=unused", "--repo", str(tmp_path / "repo"),
            *ports("--gateway-port")]


def run(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PRENSA_")} | {"COLUMNS": "300"} | env
    process = subprocess.Popen([PRENSA, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environ)
    try:
        output, _ = process.communicate(timeout=START_S)
    except subprocess.TimeoutExpired:
        stop_tree(process)
        pytest.fail(f"`prensa {args[0]}` served instead of refusing the empty key")
    return process.returncode, " ".join(output.decode(errors="replace").split())


@pytest.mark.parametrize("name", ["gateway", "serve", "up"])
@pytest.mark.parametrize("given", ["flag", "variable", "spaces"])
def test_an_empty_api_key_is_refused_at_start_up(name, given, tmp_path):
    args, env = command(name, tmp_path), {}
    if given == "flag":
        args += ["--api-key", ""]
    else:
        env["PRENSA_API_KEY"] = "" if given == "variable" else "   "
    code, output = run(args, env)
    assert code == 2, output
    assert "Invalid value for '--api-key' / PRENSA_API_KEY: an empty API key would turn authentication off" in output
    assert "tritonserver" not in output  # refused before anything started


"""A wheel that serves: `pip wheel` of this checkout carries the stage code, and installed with its
core dependencies only into a fresh venv (no torch, no pyarrow) its own `prensa` renders a
repository from an existing export and serves it, answering /embed as the dev venv's Triton and
gateway do. Also: importing the command line pulls in none of the extras' heavy packages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from prensa.addresses import free_port
from prensa.gateway.settings import GatewaySettings
from tests.gateway.conftest import running_gateway
from tests.reliability.conftest import status_of, stop_tree, wait_until

ROOT = Path(__file__).resolve().parents[2]
# Imported only by the commands that need them (onnx: repo build; the rest: the export, corpus, distributed and bench extras).
HEAVY = ("torch", "transformers", "sentence_transformers", "onnxscript", "onnx", "pyarrow", "ray", "matplotlib", "locust",
         "aiohttp")
STAGE_FILES = ("prensa/ensembles/prensa_stage.py", "prensa/ensembles/README.md",
               *(f"prensa/ensembles/{stage}/model.py" for stage in ("tokenize", "encode", "pool", "fused")))
TEXT = "a wheel that serves"


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_cli_imports_no_extra():
    """`import prensa.cli` (every command module, for --help) in the dev venv, where every extra is
    installed: none of their heavy packages is imported until a command that needs it runs."""
    code = f"import json, sys, prensa.cli; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel --no-deps` of a copy of the checkout's package files (no stale build/ folder)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "tools" / "prensa", source / "tools" / "prensa",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    result = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(root / "dist"), str(source)], root)
    assert result.returncode == 0, result.stdout + result.stderr
    [built] = (root / "dist").glob("prensa-*.whl")
    return built


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory, wheel) -> Path:
    """A fresh venv (no system site packages) with the wheel and its core dependencies only."""
    venv = tmp_path_factory.mktemp("core") / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # --no-compile: about 20 s less here (2 cores); what runs is compiled on import instead
    result = run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", str(wheel)], venv.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"core venv: created and installed in {time.monotonic() - started:.1f} s")
    return venv


def venv_environment(venv: Path) -> dict[str, str]:
    """The venv's bin first on PATH (Triton's Python stub takes its packages from the python found
    there) and nothing of the dev venv's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join((str(venv / "bin"), env.get("PATH", "")))
    env["VIRTUAL_ENV"] = str(venv)
    return env


@pytest.mark.triton
def test_the_wheel_carries_the_stage_code(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert set(STAGE_FILES) <= set(names), sorted(n for n in names if "ensembles" in n)
    assert not [n for n in names if n.startswith(("ensembles/", "tests/"))]


@pytest.mark.triton
def test_the_core_install_has_no_torch_or_pyarrow_and_its_cli_runs(core_venv, tmp_path):
    python, prensa, env = str(core_venv / "bin" / "python"), str(core_venv / "bin" / "prensa"), venv_environment(core_venv)
    for module in ("torch", "pyarrow", "transformers", "ray"):
        assert run([python, "-c", f"import {module}"], tmp_path, env).returncode != 0, f"{module} is installed"
    located = run([python, "-c", "import prensa.cli, prensa.stages; print(prensa.stages.ENSEMBLES_DIR)"], tmp_path, env)
    assert located.returncode == 0, located.stderr
    assert Path(located.stdout.strip()).is_relative_to(core_venv.resolve()), "prensa is not the wheel's"
    for command in ([], ["gateway"], ["serve"], ["repo", "build"], ["export"], ["embed-corpus"], ["bench"]):
        shown = run([prensa, *command, "--help"], tmp_path, env)
        assert shown.returncode == 0 and "Usage" in shown.stdout, (command, shown.stdout + shown.stderr)
    for command, extra in ((["export", "some/model", "--out", "x"], "export"), (["embed-corpus", "in", "out"], "corpus")):
        refused = run([prensa, *command], tmp_path, {**env, "COLUMNS": "200"})
        assert refused.returncode == 2 and f"pip install 'prensa[{extra}]'" in refused.stderr, refused.stderr


@pytest.mark.triton
def test_the_core_install_builds_and_serves_an_export(core_venv, tmp_path, exports, request):
    prensa, env = str(core_venv / "bin" / "prensa"), venv_environment(core_venv)
    built = run([prensa, "repo", "build", str(exports["minilm"]), "--name", "minilm", "--repo", str(tmp_path / "repo")],
                tmp_path, env)
    assert built.returncode == 0, built.stdout + built.stderr
    ports = [str(free_port()) for _ in range(4)]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen([prensa, "serve", "--repo", str(tmp_path / "repo"), "--http-port", ports[0],
                                  "--grpc-port", ports[1], "--metrics-port", ports[2], "--gateway-port", ports[3]],
                                 cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{ports[3]}"
    try:
        def healthy() -> bool:
            assert serve.poll() is None, log.read_text(errors="replace")
            return status_of(f"{url}/health") == 200

        print(f"core venv: prensa serve healthy in {wait_until(healthy, 180, 'the wheel gateway healthy'):.1f} s")
        response = httpx.post(f"{url}/embed", json={"inputs": TEXT}, timeout=60)
        assert response.status_code == 200, response.text
        served = np.array(response.json()[0])
        assert stop_tree(serve) == 0, log.read_text(errors="replace")
    finally:
        stop_tree(serve)
    triton = request.getfixturevalue("triton")  # the dev venv's, started after ours stopped (2 cores)
    settings = GatewaySettings(triton_url=triton.grpc_url, repo=triton.options.repo, default_model="minilm")
    with running_gateway(settings) as dev_url:
        reference = np.array(httpx.post(f"{dev_url}/embed", json={"inputs": TEXT}, timeout=60).json()[0])
    assert served.shape == reference.shape and served.ndim == 1
    np.testing.assert_allclose(served, reference, atol=1e-5)

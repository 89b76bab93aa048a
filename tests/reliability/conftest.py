"""Helpers for the reliability tests: Tritons of their own (free loopback ports, stopped by PID) for
tests that overload or kill them, gateways in front of the session's Triton for the rest, and
the check that an error body leaks nothing about the machine."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest

from prensa.addresses import free_port
from prensa.gateway.settings import GatewaySettings
from prensa.manifest import Manifest
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
from tests.gateway.conftest import direct, running_gateway  # noqa: F401 - `direct` is a fixture shared with tests/gateway

# What an error body must never contain: stack traces and source locations.
LEAK_MARKERS = ("Traceback", "At:\n", ".py", "/tmp/", str(Path.home()), sys.prefix)


def build_repo(exports: dict[str, Path], names: list[str], repo: Path, options: ServingOptions) -> Path:
    build_repository([ModelSource(n, exports[n], Manifest.read(exports[n])) for n in names], repo, options)
    return repo


@contextmanager
def own_triton(repo: Path, log: Path) -> Iterator[TritonProcess]:
    """A Triton only this test talks to; SIGTERM (then SIGKILL) by PID on exit."""
    ports = TritonPorts(free_port(), free_port(), free_port())
    with TritonProcess(TritonOptions(repo, ports=ports), log_path=log) as triton:
        yield triton


@pytest.fixture
def gateway_on(triton) -> Iterator[Callable[..., str]]:
    """Start gateways in front of the session's Triton with some settings; all stop after the test."""
    with ExitStack() as stack:
        def start(**changes: object) -> str:
            settings = GatewaySettings(triton_url=triton.grpc_url, repo=triton.options.repo, default_model="minilm")
            return stack.enter_context(running_gateway(replace(settings, **changes)))

        yield start


def assert_no_leak(body: bytes, *secrets: Path) -> None:
    """No traceback, source file or filesystem path (the repository, home, the venv) in a body."""
    text = body.decode("utf-8", errors="replace")
    for marker in (*LEAK_MARKERS, *(str(s) for s in secrets)):
        assert marker not in text, f"{marker!r} leaks in {text[:300]!r}"


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll `check` every 0.1 s; the seconds it took, or fail naming `what`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what} not within {timeout_s:g} s"
        time.sleep(0.1)
    return time.monotonic() - started


def status_of(url: str, timeout_s: float = 5.0) -> int | None:
    """GET status, or None while nothing listens."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code
    except httpx.TransportError:
        return None


def stop_tree(process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> int:
    """SIGTERM by PID, SIGKILL if it lingers; then SIGKILL, by PID, any descendant it left behind
    (a Triton started in its own session survives its parent). Returns the process's exit code."""
    descendants = psutil.Process(process.pid).children(recursive=True) if process.poll() is None else []
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    code = process.wait()
    for child in descendants:
        with suppress(psutil.NoSuchProcess):
            child.kill()
    return code


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback  # ::ffff:127.0.0.1 too


def listens_on_loopback_only(pid: int) -> bool:
    """`pid` listens somewhere, and only on loopback addresses."""
    addresses = [c.laddr.ip for c in psutil.Process(pid).net_connections("inet") if c.status == psutil.CONN_LISTEN]
    assert addresses, f"process {pid} listens nowhere"
    return all(map(is_loopback, addresses))

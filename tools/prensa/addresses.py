"""Where prensa listens and what it connects to by default: loopback only (nothing is reachable
from the network unless a flag says so), Triton's three ports and the gateway's, as TEI and
Triton number them."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"
LOOPBACK_NAMES = frozenset({LOOPBACK, "localhost", "::1"})
ANY_ADDRESS = frozenset({"0.0.0.0", "::"})  # binding these listens on every interface

TRITON_HTTP_PORT, TRITON_GRPC_PORT, TRITON_METRICS_PORT = 8000, 8001, 8002
GATEWAY_PORT = 8080

TRITON_GRPC_URL = f"{LOOPBACK}:{TRITON_GRPC_PORT}"
TRITON_METRICS_URL = f"http://{LOOPBACK}:{TRITON_METRICS_PORT}/metrics"
GATEWAY_URL = f"http://{LOOPBACK}:{GATEWAY_PORT}"


def http_url(port: int, path: str = "") -> str:
    """`http://127.0.0.1:<port><path>`: a server this process started on loopback."""
    return f"http://{LOOPBACK}:{port}{path}"


# the kernel may give a just-closed port again: never twice to this process
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now, for a server this process starts (tests, bench,
    tools), never one it handed out before."""
    while True:
        with socket.socket() as sock:
            sock.bind((LOOPBACK, 0))
            port: int = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port

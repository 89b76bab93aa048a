"""Waiting calls taken in turn by client, so that one client's flood cannot queue ahead of
another's small call (as a fair queue shares a link among flows).

A client is the connection a request came on (`RequestContext.client`): an HTTP connection, or a
gRPC channel whose calls and stream messages share one. Each client's calls keep their arrival
order; clients take one call each in turn. A client with a thousand calls waiting therefore delays
another client's single call by one of them, not by all of them. Which calls go first by priority
is decided above this (one `Turns` per priority).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Turns(Generic[T]):
    """Calls waiting, each under its client: `first` and `take` go round the clients in the order
    they began waiting, a client taken from moving behind the others."""

    def __init__(self) -> None:
        self._lines: dict[Hashable, deque[T]] = {}  # in turn order (dicts keep insertion order)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, call: object) -> bool:
        return any(call in line for line in self._lines.values())

    def add(self, client: Hashable, call: T) -> None:
        self._lines.setdefault(client, deque()).append(call)
        self._count += 1

    def discard(self, client: Hashable, call: T) -> bool:
        """Take `call` out if it still waits; whether it did."""
        line = self._lines.get(client)
        if line is None or call not in line:
            return False
        line.remove(call)
        self._count -= 1
        if not line:
            del self._lines[client]
        return True

    def first(self) -> T:
        """The call whose turn it is (there must be one)."""
        return next(iter(self._lines.values()))[0]

    def take(self) -> T:
        """The call whose turn it is, out of the line; its client goes behind the others."""
        client = next(iter(self._lines))
        line = self._lines.pop(client)
        call = line.popleft()
        self._count -= 1
        if line:
            self._lines[client] = line
        return call

"""SIGTERM for commands that start servers of their own (`prensa bench`, `prensa tune`)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def sigterm_exits() -> Iterator[None]:
    """While the block runs, SIGTERM raises SystemExit(143) in the main thread, as Ctrl-C raises
    KeyboardInterrupt: the command's `finally` blocks then stop the Triton and gateway it started,
    in order. Further SIGTERMs are ignored while they do (SIGKILL still ends it, and its children
    die with it by their parent-death signal)."""

    def exit_now(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_now)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

"""What one of prensa's loggers logs during a test, taken on that logger itself: a CLI test may have
configured prensa's loggers (`configure_logging`) not to propagate to the root, where pytest's
caplog listens."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Records(logging.Handler):
    def __init__(self, keep: Callable[[logging.LogRecord], bool]) -> None:
        super().__init__(logging.INFO)
        self.keep = keep
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.keep(record):
            self.records.append(record)


@contextmanager
def records_of(name: str, keep: Callable[[logging.LogRecord], bool] = lambda _: True) -> Iterator[Records]:
    """The INFO and higher records of logger `name` that `keep` accepts, while the block runs."""
    logger, handler = logging.getLogger(name), Records(keep)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)

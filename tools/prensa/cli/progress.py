"""Step-by-step progress for long commands: a spinner per step, ticked off when it ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


@contextmanager
def step_progress(console: Console) -> Iterator[Any]:
    """Yields `step(description)`, a context manager that shows one step while it runs."""
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    ) as progress:

        @contextmanager
        def step(description: str) -> Iterator[None]:
            handle = progress.add_task(description, total=1)
            yield
            progress.update(handle, completed=1, description=f"[green]✓[/] {description}")

        yield step

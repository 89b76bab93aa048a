"""What runs on the written graph, each step a module with `applies` (whether this export needs it)
and `apply` (the step itself). `GRAPH_STEPS` run in order once the graph is written and checked;
`calibrate` runs on the assembled manifest, since it measures the export through it."""

from __future__ import annotations

from typing import Protocol

from prensa.export.run import ExportRun
from prensa.export.steps import calibrate, engine, int8, pack


class GraphStep(Protocol):
    """A step on the written graph: reads the run, leaves its graph, figures or files on it."""

    def applies(self, run: ExportRun) -> bool: ...

    def apply(self, run: ExportRun) -> None: ...


# In order, each when it applies: the packed graph's step reads the graph the int8 step left.
GRAPH_STEPS: tuple[GraphStep, ...] = (int8, engine, pack)

__all__ = ["GRAPH_STEPS", "GraphStep", "calibrate"]

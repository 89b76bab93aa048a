"""The local runner: one backend, parts written one after another, a progress bar, resumable.

Also the checks both runners make before any embedding: input columns, unique ids, requested
outputs, and what OUTPUT already holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from prensa.corpus.backends import BackendSpec, ModelInfo
from prensa.corpus.io import (
    Columns,
    CorpusInput,
    Resume,
    iter_chunks,
    open_output,
    read_ids,
    to_table,
    write_part,
)


@dataclass(frozen=True)
class Job:
    input: Path
    output: Path
    columns: Columns = field(default_factory=Columns)
    outputs: str | None = None  # comma-separated kinds; None: the model's default
    rows_per_part: int = 2048


@dataclass(frozen=True)
class Plan:
    corpus: CorpusInput
    total: int  # input rows
    pending: int  # input rows not yet in OUTPUT
    kinds: tuple[str, ...]
    resume: Resume

    def summary(self, started: float) -> Summary:
        """What a run of this plan did, `started` being its `time.monotonic()` start."""
        return Summary(
            self.total,
            self.total - self.pending,
            self.pending,
            time.monotonic() - started,
            self.kinds,
            self.resume.removed,
        )


@dataclass(frozen=True)
class Summary:
    total: int
    skipped: int  # rows already in OUTPUT when the run started
    written: int
    seconds: float
    kinds: tuple[str, ...]
    removed: list[str]  # leftovers of an interrupted run, deleted before starting

    @property
    def rows_per_s(self) -> float:
        return self.written / self.seconds if self.seconds else 0.0


def plan(job: Job, info: ModelInfo) -> Plan:
    """Everything checked before the first text is embedded; OUTPUT is created or reopened."""
    if job.rows_per_part < 1:
        raise ValueError("rows per part must be positive")
    corpus = CorpusInput.find(job.input)
    ids = read_ids(corpus, job.columns)
    kinds = info.choose(job.outputs)
    record = {
        "model": info.name,
        "source": info.source,
        "revision": info.revision,
        "dtype": info.dtype,
        "max_length": info.max_length,
        "outputs": list(kinds),
        "id_column": job.columns.id,
        "text_column": job.columns.text,
    }
    resume = open_output(job.output, record, ids.type)
    done = (pc.sum(pc.is_in(ids, value_set=resume.done)).as_py() or 0) if len(resume.done) else 0
    return Plan(corpus, len(ids), len(ids) - done, kinds, resume)


def run_local(job: Job, spec: BackendSpec, console: Console) -> Summary:
    backend = spec.open()
    try:
        work = plan(job, backend.info)
        started = time.monotonic()
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("rows"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console) as progress:
            task = progress.add_task(
                f"{backend.info.name} -> {job.output}",
                total=work.total,
                completed=work.total - work.pending,
            )
            index = work.resume.next_part
            for chunk in iter_chunks(work.corpus, job.columns, work.resume.done, job.rows_per_part):
                responses = backend.embed(chunk.column(job.columns.text).to_pylist(), work.kinds)
                table = to_table(
                    chunk.column(job.columns.id), job.columns.id, responses, work.kinds
                )
                write_part(job.output, index, table)
                index += 1
                progress.advance(task, chunk.num_rows)
    finally:
        backend.close()
    return work.summary(started)

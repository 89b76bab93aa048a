"""The Ray runner: Ray Data reads the corpus, a pool of actors embeds it, Ray writes Parquet.

Each actor opens one backend from a `BackendSpec` (a Triton gRPC client, or an onnxruntime
session of the export) and `map_batches` hands it `rows_per_part` rows at a time as Arrow tables,
so the columns are exactly the local runner's. The driver makes the same checks first (unique
ids, outputs, the run record) and drops ids already in OUTPUT, so a failed run resumes by running
it again; a file a killed worker left without its Parquet footer is deleted before that.

Every Ray node must reach INPUT and OUTPUT under the same paths (one machine, or a shared
filesystem) and have prensa installed (`pip install 'prensa[distributed]'`).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pyarrow as pa
from rich.console import Console

from prensa.corpus.backends import BackendSpec
from prensa.corpus.io import Columns, drop_done, require_texts, to_table
from prensa.corpus.local import Job, Summary, plan


class EmbedBatches:
    """The callable class Ray instantiates once per actor: the backend is opened once, not per batch."""

    def __init__(self, spec: BackendSpec, kinds: tuple[str, ...], columns: Columns) -> None:
        self.backend = spec.open()
        self.kinds, self.columns = kinds, columns

    def __call__(self, batch: pa.Table) -> pa.Table:
        require_texts(batch, self.columns)
        responses = self.backend.embed(batch.column(self.columns.text).to_pylist(), self.kinds)
        return to_table(
            batch.column(self.columns.id).combine_chunks(), self.columns.id, responses, self.kinds
        )


def run_on_ray(
    job: Job,
    spec: BackendSpec,
    address: str,
    workers: int,
    cpus_per_worker: float,
    console: Console,
) -> Summary:
    """`address` "local" starts a Ray on this machine unless this process already joined one."""
    import ray

    work = plan(job, spec.describe())
    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address)
    started = time.monotonic()
    files = [str(path.resolve()) for path in work.corpus.files]
    # Reading, filtering and writing reserve no CPU: the encoders own the cores. Were these tasks to
    # reserve one, workers x CPUs equal to the cluster's would leave the first read waiting forever
    # for a core the idle actors hold. Ray Data's backpressure still bounds how many run at once.
    if work.corpus.format == "parquet":
        dataset = ray.data.read_parquet(
            files, columns=[job.columns.id, job.columns.text], num_cpus=0
        )
    else:  # JSON has no column projection; the actors read the two columns they need
        options = work.corpus.parse_options(job.columns)
        dataset = ray.data.read_json(files, num_cpus=0, parse_options=options)
    if len(work.resume.done):
        # Ray's UDF type takes the batch alone; `fn_kwargs` supplies the rest (a wrapper would change the call).
        dataset = dataset.map_batches(
            drop_done,  # type: ignore[arg-type]
            fn_kwargs={"done": work.resume.done, "column": job.columns.id},
            batch_format="pyarrow",
            num_cpus=0,
        )
    # onnxruntime in an actor uses the cores Ray reserved for it, not every core of the node.
    worker_spec = replace(spec, threads=spec.threads or max(int(cpus_per_worker), 1))
    console.print(f"embedding {work.pending} of {work.total} rows on Ray with {workers} workers")
    dataset.map_batches(
        EmbedBatches,
        fn_constructor_kwargs={"spec": worker_spec, "kinds": work.kinds, "columns": job.columns},
        batch_size=job.rows_per_part,
        batch_format="pyarrow",
        concurrency=workers,
        num_cpus=cpus_per_worker,
    ).write_parquet(str(job.output.resolve()), ray_remote_args={"num_cpus": 0})
    return work.summary(started)

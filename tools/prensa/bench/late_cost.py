"""Per-token outputs against pooled ones on the same encoder (`prensa bench late`).

A late-interaction model answers a vector per kept token where an embedder answers one per text,
and the gateway serialises every one of them. One encoder is exported twice: the PyLate model as
`late` (its `/embed_colbert`) and its transformer alone as a CLS-pooled embedder (`/embed`), both
behind one Triton and one gateway. Each is sent documents (cut at the model's document length)
and queries (a late-interaction query expanded to its query length) by concurrent clients; per
case: answer bytes per sequence, the gateway's CPU per sequence, sequences per second end to end.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from prensa.addresses import free_port
from prensa.bench.load import Workload, closed_loop
from prensa.bench.systems import gateway_server
from prensa.export.pipeline import ExportOptions, Step, export_model
from prensa.export.st_layout import MODULES_FILE
from prensa.layouts import of_manifest
from prensa.manifest import Manifest, Task
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
from prensa.workload import passages, query_texts

LATE, POOLED = "late", "pooled"
# what makes a directory PyLate's rather than a plain transformer's
PYLATE_FILES = (MODULES_FILE, "config_sentence_transformers.json", "sentence_bert_config.json")
WARMUP_REQUESTS = 8


class NotLateInteraction(ValueError):
    """The source exports as another task: there is nothing per-token to weigh."""


@dataclass(frozen=True)
class Case:
    """One kind of traffic on one route: what the clients send."""

    texts: str  # "documents" or "queries"
    output: str  # "per-token" or "pooled"
    path: str
    model: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Figures:
    bytes_per_sequence: float
    gateway_cpu_ms_per_sequence: float
    sequences_per_s: float
    p50_ms: float
    errors: int


CASES = (
    Case("documents", "pooled", "/embed", POOLED, {}),
    Case("documents", "per-token", "/embed_colbert", LATE, {}),
    Case("queries", "pooled", "/embed", POOLED, {}),
    Case("queries", "per-token", "/embed_colbert", LATE, {"is_query": True}),
)


def pooled_twin(source: Path, target: Path) -> Path:
    """The PyLate model's transformer alone (its top-level files but PyLate's): the same encoder,
    which prensa exports as a plain embedder."""
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name not in PYLATE_FILES:
            shutil.copy2(path, target / path.name)
    return target


def exports(source: Path, work: Path) -> dict[str, Manifest]:
    """The late-interaction export and its pooled twin, cut at the same length."""
    late, _ = export_model(ExportOptions(str(source), work / LATE))
    if not of_manifest(late).token_vectors:
        raise NotLateInteraction(
            f"{source} exports as a {late.task} model, not a late-interaction one"
        )
    twin = pooled_twin(source, work / "twin")
    pooled, _ = export_model(
        ExportOptions(str(twin), work / POOLED, task=Task.EMBED, max_length=late.max_length)
    )
    return {LATE: late, POOLED: pooled}


def batches(texts: list[str], size: int, count: int) -> list[list[str]]:
    return [[texts[(i * size + j) % len(texts)] for j in range(size)] for i in range(count)]


async def drive(
    url: str, case: Case, items: list[list[str]], concurrency: int, gateway_pid: int
) -> Figures:
    """`items` sent to `case`'s route by `concurrency` clients after a warm-up; the answers' bytes
    and the gateway's CPU over the run."""
    received: list[int] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def send(texts: list[str]) -> None:
            body = {"inputs": texts, "model": case.model, **case.fields}
            response = await client.post(case.path, json=body)
            response.raise_for_status()
            received.append(len(response.content))

        warm = items[:WARMUP_REQUESTS]
        await closed_loop(send, Workload(warm, [len(i) for i in warm], [0] * len(warm)), 1)
        received.clear()
        work = Workload(items, [len(i) for i in items], [0] * len(items))
        result = await closed_loop(send, work, concurrency, [gateway_pid])
    sequences = max(result.sequences, 1)
    return Figures(
        bytes_per_sequence=sum(received) / sequences,
        gateway_cpu_ms_per_sequence=(result.server_cpu_s or 0.0) * 1000 / sequences,
        sequences_per_s=result.sequences / result.seconds,
        p50_ms=statistics.median(result.latencies_ms) if result.latencies_ms else 0.0,
        errors=result.errors,
    )


def run(
    source: Path,
    work: Path,
    batch: int,
    requests: int,
    concurrency: int,
    step: Step,
) -> list[tuple[Case, Figures]]:
    """Every case of CASES through one Triton and one gateway, one case at a time."""
    with step("Exporting the late-interaction model and its pooled twin"):
        manifests = exports(source, work)
    repo = work / "repo"
    build_repository(
        [ModelSource(name, work / name, manifest) for name, manifest in manifests.items()],
        repo,
        ServingOptions(),
    )
    documents = [text for text in passages() if len(text.split()) >= 150]
    texts = {"documents": documents, "queries": query_texts(512)}
    ports = TritonPorts(free_port(), free_port(), free_port())
    results = []
    with step("Starting Triton"):
        triton = TritonProcess(TritonOptions(repo, ports=ports), log_path=work / "tritonserver.log")
        triton.start()
        triton.wait_ready()
    try:
        gateway = gateway_server(triton.grpc_url, repo, free_port(), work / "gateway.log")
        gateway.start()
        try:
            for case in CASES:
                items = batches(texts[case.texts], batch, requests)
                with step(f"{case.texts}, {case.output} ({case.path})"):
                    figures = asyncio.run(
                        drive(gateway.base_url, case, items, concurrency, gateway.pid)
                    )
                results.append((case, figures))
        finally:
            gateway.stop()
    finally:
        triton.stop()
    return results

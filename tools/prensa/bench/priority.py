"""Online queries beside a batch job on one server (`prensa bench priority`).

One Triton and one gateway with a data directory serve an embedding export. A lone client sends
short queries to `/embed`, one at a time, while a batch job (OpenAI's Batch API, its lines bulk
work) embeds passages through the same gateway; the same job runs alone, and `prensa
embed-corpus` embeds the same passages straight to Triton, the throughput it is held against. The
gateway runs twice, with its priority on and off, so each figure has its twin.
"""

from __future__ import annotations

import http.client
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import orjson

from prensa.addresses import LOOPBACK, free_port
from prensa.bench.systems import ServerProcess, gateway_server
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.workload import embedding_texts, query_texts

TEXTS_PER_LINE = 8
POLL_S = 0.1
# an online client's pause between queries: a query stream, not a second load
THINK_S = 0.05


@dataclass
class Latencies:
    """A lone client's query times, in milliseconds."""

    ms: list[float] = field(default_factory=list)

    @property
    def p50(self) -> float:
        return statistics.median(self.ms) if self.ms else float("nan")

    @property
    def p99(self) -> float:
        return float(np.percentile(self.ms, 99)) if self.ms else float("nan")


@dataclass
class Round:
    """One measured round: the online queries' times, and the job's texts per second (if any)."""

    name: str
    online: Latencies | None = None
    texts_per_s: float | None = None


class OnlineClient:
    """Short distinct queries to `/embed`, one at a time over one keep-alive connection."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection(LOOPBACK, port, timeout=120)
        self.queries = iter(query_texts(1_000_000, seed=7))

    def query(self) -> float:
        body = orjson.dumps({"inputs": next(self.queries)})
        started = time.perf_counter()
        self.connection.request(
            "POST", "/embed", body=body, headers={"content-type": "application/json"}
        )
        response = self.connection.getresponse()
        response.read()
        elapsed = (time.perf_counter() - started) * 1000
        if response.status != 200:
            raise RuntimeError(f"an online query got HTTP {response.status}")
        return elapsed

    def until(self, done: Callable[[], bool], latencies: Latencies) -> None:
        while not done():
            latencies.ms.append(self.query())
            time.sleep(THINK_S)


def batch_lines(model: str, texts: list[str]) -> bytes:
    """The job's JSONL: `/v1/embeddings` lines of TEXTS_PER_LINE passages."""
    lines = [
        orjson.dumps(
            {
                "custom_id": f"line-{start}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": model, "input": texts[start : start + TEXTS_PER_LINE]},
            }
        )
        for start in range(0, len(texts), TEXTS_PER_LINE)
    ]
    return b"\n".join(lines) + b"\n"


def run_job(base_url: str, lines: bytes, texts: int) -> float:
    """Submit `lines` as a batch job and wait for it: texts per second from creation to the end."""
    with httpx.Client(base_url=base_url, timeout=120) as client:
        upload = client.post(
            "/v1/files", files={"file": ("job.jsonl", lines)}, data={"purpose": "batch"}
        )
        upload.raise_for_status()
        started = time.perf_counter()
        created = client.post(
            "/v1/batches",
            json={
                "input_file_id": upload.json()["id"],
                "endpoint": "/v1/embeddings",
                "completion_window": "24h",
            },
        )
        created.raise_for_status()
        job = created.json()
        while job["status"] not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(POLL_S)
            job = client.get(f"/v1/batches/{job['id']}").json()
        seconds = time.perf_counter() - started
        if job["status"] != "completed" or job["request_counts"]["failed"]:
            raise RuntimeError(f"the batch job ended {job['status']}: {job['request_counts']}")
    return texts / seconds


def job_beside_queries(port: int, base_url: str, lines: bytes, texts: int) -> Round:
    """The job, and the lone client's queries for as long as it runs."""
    latencies, finished = Latencies(), threading.Event()
    client = OnlineClient(port)
    online = threading.Thread(target=client.until, args=(finished.is_set, latencies))
    online.start()
    try:
        rate = run_job(base_url, lines, texts)
    finally:
        finished.set()
        online.join()
    return Round("", latencies, rate)


@contextmanager
def serving(repo: Path, work: Path, priority: bool) -> Iterator[tuple[int, str]]:
    """Triton and the gateway on `repo` (data directory in `work`): the gateway's port and URL."""
    ports = TritonPorts(free_port(), free_port(), free_port())
    triton = TritonProcess(TritonOptions(repo=repo, ports=ports), log_path=work / "triton.log")
    triton.start()
    try:
        triton.wait_ready()
        port = free_port()
        gateway: ServerProcess = gateway_server(
            triton.grpc_url,
            repo,
            port,
            work / f"gateway-{'on' if priority else 'off'}.log",
            extra=["--data-dir", str(work / "data"), "--priority" if priority else "--no-priority"],
        )
        gateway.start()
        try:
            yield port, gateway.base_url
        finally:
            gateway.stop()
    finally:
        triton.stop()


def embed_corpus_alone(triton_repo: Path, model: str, texts: list[str], work: Path) -> float:
    """`prensa embed-corpus` on the same passages straight to Triton: texts per second."""
    source = work / "corpus.jsonl"
    source.write_bytes(
        b"\n".join(orjson.dumps({"id": str(i), "text": t}) for i, t in enumerate(texts)) + b"\n"
    )
    ports = TritonPorts(free_port(), free_port(), free_port())
    triton = TritonProcess(
        TritonOptions(repo=triton_repo, ports=ports), log_path=work / "triton-corpus.log"
    )
    triton.start()
    try:
        triton.wait_ready()
        command = [
            str(Path(sys.executable).parent / "prensa"),
            "embed-corpus",
            str(source),
            str(work / "corpus-out"),
            "--triton-url",
            triton.grpc_url,
            "--model",
            model,
        ]
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        return len(texts) / (time.perf_counter() - started)
    finally:
        triton.stop()


def measure(
    repo: Path, model: str, passages: int, queries: int, say: Callable[[str], None]
) -> list[Round]:
    """Every round, in order: idle queries, then per priority setting the job alone and the job
    beside the queries; last, embed-corpus alone."""
    texts = embedding_texts(passages, seed=3)
    lines = batch_lines(model, texts)
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="prensa-priority-") as scratch:
        work = Path(scratch)
        for priority in (True, False):
            setting = "on" if priority else "off"
            with serving(repo, work / setting, priority) as (port, url):
                if priority:
                    say("idle: lone queries")
                    client, idle = OnlineClient(port), Latencies()
                    for _ in range(queries):
                        idle.ms.append(client.query())
                        time.sleep(THINK_S)
                    rounds.append(Round("lone queries, idle", online=idle))
                say(f"priority {setting}: the job alone")
                rounds.append(
                    Round(f"job alone, priority {setting}", None, run_job(url, lines, len(texts)))
                )
                say(f"priority {setting}: the job beside lone queries")
                beside = job_beside_queries(port, url, lines, len(texts))
                beside.name = f"job + lone queries, priority {setting}"
                rounds.append(beside)
        say("embed-corpus alone")
        rounds.append(
            Round(
                "embed-corpus alone (Triton gRPC)",
                None,
                embed_corpus_alone(repo, model, texts, work),
            )
        )
    return rounds

"""The systems `prensa bench` compares, each behind the same small interface.

In-process systems (the onnxruntime limit, prensa's encode stage alone, sentence-transformers)
are timed on the whole workload at once; servers (prensa through Triton gRPC or the gateway, a
plain FastAPI app, Infinity) are driven by the closed-loop client in `load.py`, one system
running at a time so they never compete for the CPU. A single query's latency is timed for every
system by one blocking caller: the in-process ones have no client at all (their figure includes
tokenizing the query), and the servers get the lightest there is (stdlib `http.client` on a
kept-alive connection, tritonclient's synchronous gRPC), so the figure is the server's rather than
an asyncio client's, whose own overhead per request would be in it.
"""

from __future__ import annotations

import functools
import http.client
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np
import orjson

from prensa.addresses import LOOPBACK, http_url
from prensa.bench.plain_server import PAIRS, TEXTS
from prensa.bench.report import LIMIT_NAME
from prensa.layouts import Layout
from prensa.manifest import Manifest
from prensa.stages import contract, load_stage
from prensa.tensors import texts_tensor
from prensa.triton.launcher import die_with_parent
from prensa.triton.repo import ServingOptions, encoder_token_budget
from prensa.workload import RerankCase

if TYPE_CHECKING:
    import aiohttp

LIMIT_BATCH = 32
ARRIVAL_SEED = 0  # the order `EncodeStageAlone` draws requests in: the same in every run
# Calls before a single-query latency is timed, for every system alike: a server just started (and
# onnxruntime on a new shape) answers its first requests slower than it will from then on.
WARMUP_CALLS = 10


@dataclass(frozen=True)
class InProcessResult:
    seconds: float
    sequences: int
    tokens: int


class ServerProcess:
    """A benchmark peer started as a subprocess on loopback and stopped by PID; it dies with the
    thread that started it, as Triton does (`die_with_parent`)."""

    def __init__(
        self, command: list[str], health_url: str, log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.command, self.health_url, self.log, self.env = command, health_url, log, env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 300.0) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env or dict(os.environ),
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),  # noqa: PLW1509 - prctl only
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.command[0]} exited with {self.process.returncode}; see {self.log}"
                )
            try:
                with urllib.request.urlopen(self.health_url, timeout=2) as response:  # noqa: S310 - loopback
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"{self.command[0]} was not healthy after {timeout_s:.0f} s; see {self.log}"
        )

    @property
    def pid(self) -> int:
        assert self.process is not None, "start() first"
        return self.process.pid

    @property
    def base_url(self) -> str:
        """Where it serves: its health URL without the path."""
        url = urlsplit(self.health_url)
        return f"{url.scheme}://{url.netloc}"

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def median_ms(call: Callable[[], object], repeats: int) -> float:
    """Median wall time of `call` over `repeats` runs, after `WARMUP_CALLS` untimed ones."""
    for _ in range(WARMUP_CALLS):
        call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return float(np.median(samples))


def text_encoder(export_dir: Path, manifest: Manifest) -> Any:
    """The tokenize stage's own encoder, so every system sees exactly the served tokens."""
    return load_stage("tokenize").TextEncoder(
        export_dir / manifest.tokenizer_file,
        manifest.max_length,
        "right",
        manifest.pair_truncation,
        strip=manifest.strip_texts,
    )


def count_tokens(encoder: Any, inputs: list[Any]) -> int:
    return sum(  # the tokenize stage is loaded at run time: untyped
        len(e.ids) for e in encoder.encode_requests([list(inputs)])[0]
    )


class OnnxLimit:
    """onnxruntime on the served graph with ideal batches: the whole workload tokenized (timed) and
    sorted by length, 32 rows a pass, no server."""

    name = LIMIT_NAME

    def __init__(self, export_dir: Path) -> None:
        import onnxruntime as ort

        self.manifest = Manifest.read(export_dir)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(export_dir / self.manifest.onnx_file), options, providers=["CPUExecutionProvider"]
        )
        self.encoder = text_encoder(export_dir, self.manifest)
        self.tokenize = load_stage("tokenize")

    def _run(self, encodings: list[Any]) -> None:
        padded = self.tokenize.pad_encodings(encodings, self.manifest.pad_id)
        self.session.run(None, {n: padded[n] for n in self.manifest.inputs})

    def run(self, items: list[str] | list[RerankCase]) -> InProcessResult:
        inputs = _pairs(items) if items and isinstance(items[0], RerankCase) else items
        started = time.perf_counter()
        encodings = sorted(self.encoder.encode_requests([inputs])[0], key=lambda e: len(e.ids))
        for start in range(0, len(encodings), LIMIT_BATCH):
            self._run(encodings[start : start + LIMIT_BATCH])
        return InProcessResult(
            time.perf_counter() - started, len(encodings), sum(len(e.ids) for e in encodings)
        )

    def single_latency_ms(self, text: str | tuple[str, str], repeats: int) -> float:
        return median_ms(lambda: self._run(self.encoder.encode_requests([[text]])[0]), repeats)


class EncodeStageAlone:
    """The encode stage's own encoder (its session options, sub-batch cut and token budget) on
    batches as a busy server receives them: the workload shuffled, 32 one-sequence requests a batch,
    tokenized per batch (timed), no server. Beside the limit it shows what arrival order costs a
    server (random lengths, cut into sub-batches); beside prensa, what serving adds on top."""

    name = f"encode stage alone (random batches of {LIMIT_BATCH})"

    def __init__(self, export_dir: Path, serving: ServingOptions) -> None:
        self.manifest = Manifest.read(export_dir)
        stage = load_stage("encode")
        session = stage.create_session(
            export_dir / self.manifest.onnx_file, serving.cpu_threads, "cpu", True
        )
        self.stage = stage.TokenBudgetEncoder(
            session,
            self.manifest.pad_id,
            encoder_token_budget(self.manifest, serving),
            serving.length_ratio,
            serving.max_batch_size,
            set(),
        )
        self.encoder = text_encoder(export_dir, self.manifest)
        self.tokenize = load_stage("tokenize")

    def _run(self, inputs: list[Any]) -> int:
        """Encode one batch of one-sequence requests; its token count."""
        encodings = self.encoder.encode_requests([inputs])[0]
        self.stage.encode(
            [self.tokenize.pad_encodings([e], self.manifest.pad_id) for e in encodings]
        )
        return sum(len(e.ids) for e in encodings)

    def run(self, items: list[str] | list[RerankCase]) -> InProcessResult:
        inputs: list[Any] = (
            _pairs(items) if items and isinstance(items[0], RerankCase) else list(items)
        )
        shuffled = random.Random(ARRIVAL_SEED).sample(inputs, len(inputs))
        started = time.perf_counter()
        tokens = sum(
            self._run(shuffled[start : start + LIMIT_BATCH])
            for start in range(0, len(shuffled), LIMIT_BATCH)
        )
        return InProcessResult(time.perf_counter() - started, len(shuffled), tokens)

    def single_latency_ms(self, text: str | tuple[str, str], repeats: int) -> float:
        return median_ms(lambda: self._run([text]), repeats)


class SentenceTransformersInProcess:
    """sentence-transformers' own batched encode (it sorts by length too): the library baseline."""

    name = "sentence-transformers (in-process)"

    def __init__(self, model_dir: Path, kind: Layout) -> None:
        from sentence_transformers import CrossEncoder, SentenceTransformer

        self.pairs = kind.scores_pairs
        self.model = (
            CrossEncoder(str(model_dir), device="cpu")
            if self.pairs
            else SentenceTransformer(str(model_dir), device="cpu")
        )

    def _call(self, inputs: list[Any]) -> None:
        if self.pairs:
            self.model.predict(inputs, batch_size=LIMIT_BATCH)
        else:
            self.model.encode(inputs, batch_size=LIMIT_BATCH)

    def run(self, items: list[Any], encoder: Any) -> InProcessResult:
        inputs = _pairs(items) if self.pairs else items
        started = time.perf_counter()
        self._call(inputs)
        return InProcessResult(
            time.perf_counter() - started, len(inputs), count_tokens(encoder, inputs)
        )

    def single_latency_ms(self, text: Any, repeats: int) -> float:
        return median_ms(lambda: self._call([text]), repeats)


def _pairs(cases: list[RerankCase]) -> list[tuple[str, str]]:
    return [(case.query, passage) for case in cases for passage in case.passages]


class TritonClient:
    """prensa through Triton's gRPC endpoint, as `tritonclient` users call it."""

    def __init__(self, name: str, url: str, model: str) -> None:
        self.name, self.url, self.model = name, url, model
        self.client: Any = None  # tritonclient.grpc.aio.InferenceServerClient once open (untyped)

    async def open(self) -> None:
        import tritonclient.grpc.aio as grpcclient

        self.module = grpcclient
        self.client = grpcclient.InferenceServerClient(self.url)

    async def close(self) -> None:
        await self.client.close()

    @staticmethod
    def _inputs(module: Any, item: list[str] | RerankCase) -> list[Any]:
        """The text tensors of an embed item (its texts) or a rerank case (query x passages)."""
        columns = (
            {contract.TEXT: item}
            if not isinstance(item, RerankCase)
            else {
                contract.TEXT: [item.query] * len(item.passages),
                contract.TEXT_PAIR: item.passages,
            }
        )
        tensors = []
        for name, texts in columns.items():
            tensor = module.InferInput(name, [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(texts_tensor(texts))
            tensors.append(tensor)
        return tensors

    async def embed(self, texts: list[str]) -> None:
        await self.client.infer(self.model, self._inputs(self.module, texts))

    async def rerank(self, case: RerankCase) -> None:
        await self.client.infer(self.model, self._inputs(self.module, case))

    def single_latency_ms(self, item: list[str] | RerankCase, repeats: int) -> float:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.url)
        try:
            return median_ms(
                lambda: client.infer(self.model, self._inputs(grpcclient, item)), repeats
            )
        finally:
            client.close()


class HttpClient:
    """Any server speaking TEI's `/embed` + `/rerank` or OpenAI's `/embeddings` + `/rerank`."""

    def __init__(self, name: str, base_url: str, model: str, style: str) -> None:
        self.name, self.base_url, self.model, self.style = name, base_url.rstrip("/"), model, style
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=300)
        )

    async def close(self) -> None:
        assert self.session is not None, "close() before open()"
        await self.session.close()

    def _tei_path(self, route: str) -> str:
        # prensa serves several models
        return f"{route}?model={self.model}" if self.model else route

    def _request(self, item: list[str] | RerankCase) -> tuple[str, dict[str, Any]]:
        """Path and JSON body for an embed item (its texts) or a rerank case."""
        if isinstance(item, RerankCase):
            if self.style == "openai":
                return "/rerank", {
                    "model": self.model,
                    "query": item.query,
                    "documents": item.passages,
                }
            return self._tei_path("/rerank"), {"query": item.query, "texts": item.passages}
        if self.style == "openai":
            return "/embeddings", {"model": self.model, "input": item}
        return self._tei_path("/embed"), {"inputs": item}

    async def _post(self, item: list[str] | RerankCase) -> None:
        path, body = self._request(item)
        assert self.session is not None, "a request before open()"
        async with self.session.post(self.base_url + path, json=body) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"{path}: HTTP {response.status}")

    async def embed(self, texts: list[str]) -> None:
        await self._post(texts)

    async def rerank(self, case: RerankCase) -> None:
        await self._post(case)

    def single_latency_ms(self, item: list[str] | RerankCase, repeats: int) -> float:
        path, body = self._request(item)
        url = urlsplit(self.base_url)
        assert url.hostname is not None, f"no host in {self.base_url}"
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
        payload, headers = orjson.dumps(body), {"content-type": "application/json"}

        def call() -> None:
            connection.request("POST", url.path + path, body=payload, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{path}: HTTP {response.status}")

        try:
            return median_ms(call, repeats)
        finally:
            connection.close()


def gateway_server(
    triton_grpc_url: str,
    repo: Path,
    port: int,
    log: Path,
    coalesce: bool = True,
    extra: Sequence[str] = (),
) -> ServerProcess:
    """`prensa gateway` on `repo`'s Triton, with no admission limit: a benchmark measures speed,
    not 429s; `extra`: more of its flags."""
    return ServerProcess(
        [
            str(Path(sys.executable).parent / "prensa"),
            "gateway",
            "--triton-url",
            triton_grpc_url,
            "--repo",
            str(repo),
            "--port",
            str(port),
            "--max-concurrent-requests",
            "100000",
            "--coalesce-requests" if coalesce else "--no-coalesce-requests",
            *extra,
        ],
        http_url(port, "/health"),
        log,
    )


def plain_fastapi_server(model_dir: Path, layout: Layout, port: int, log: Path) -> ServerProcess:
    """The baseline of `layout`: a CrossEncoder where it scores pairs, else a SentenceTransformer."""
    command = [
        sys.executable,
        "-m",
        "prensa.bench.plain_server",
        str(model_dir),
        PAIRS if layout.scores_pairs else TEXTS,
        str(port),
    ]
    return ServerProcess(command, http_url(port, "/health"), log)


def infinity_server(binary: str, model_dir: Path, port: int, log: Path) -> ServerProcess:
    command = [
        binary,
        "v2",
        "--model-id",
        str(model_dir),
        "--port",
        str(port),
        "--host",
        LOOPBACK,
        "--device",
        "cpu",
        "--engine",
        "torch",
        "--no-bettertransformer",
    ]
    return ServerProcess(
        command,
        http_url(port, "/health"),
        log,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"},
    )

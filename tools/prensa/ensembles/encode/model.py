"""Encode stage: onnxruntime over token-budget sub-batches, TEI style.

Inputs allow ragged batches, so one `execute` receives requests of different lengths. Their
rows are merged, sorted by length and cut into sub-batches, each padded only to its own longest
row: a new sub-batch starts when the next row is longer than `length_ratio` x the sub-batch's
shortest, or when rows x padded length would exceed `max_batch_tokens`. A row longer than the
budget runs alone. Outputs are scattered back to each request, per-token outputs padded to the
request's own width. A sub-batch that raises is run again request by request, so only a request
that fails on its own gets an error response. A request Triton marks cancelled (its client hung
up) is answered CANCELLED: asked at the start of `execute` and before each of its sub-batches, so
rows not yet computed are not computed at all. Config parameters: `onnx_file`,
`max_batch_tokens`, `length_ratio`, `max_rows`, `pad_id`, `intra_op_threads`,
`execution_provider` (cpu|cuda), `per_token_outputs`, `allow_spinning` (true|false), and for the
GPU policy below `batching` (auto|cpu|gpu), `gpu_max_batch_tokens`, `max_length`,
`length_buckets`, `warmup_buckets` (true|false).

On a GPU the length-ratio cut costs more than it saves: the GPU wants large batches, pays little
for padding until it is compute-bound, and pays a one-off cost for each new input shape. So with
`execution_provider` cuda (unless the config sets `length_ratio`, or `batching` says otherwise)
the stage uses `GpuBatching`: rows sorted longest first, each forward pass as many rows as the
token budget `gpu_max_batch_tokens` and `max_rows` allow, padded to a length bucket and a row
bucket (see the contract's GPU defaults), so a few shapes recur and are warmed at load.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import prensa_stage as contract

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton, e.g. by unit tests of the functions above the model
    pb_utils = None


CUDA_PROVIDER = "CUDAExecutionProvider"


def plan_sub_batches(
    lengths: npt.NDArray[Any], max_batch_tokens: int, length_ratio: float, max_rows: int
) -> list[npt.NDArray[Any]]:
    """Indices of rows per sub-batch, ascending by length; never loops on an over-budget row."""
    order = np.argsort(lengths, kind="stable")
    batches: list[list[int]] = []
    current: list[int] = []
    shortest = 0
    for index in order:
        length = max(int(lengths[index]), 1)
        fits = (
            current
            and length <= length_ratio * shortest
            and (len(current) + 1) * length <= max_batch_tokens
            and len(current) < max_rows
        )
        if not fits:
            if current:
                batches.append(current)
            current, shortest = [], length
        current.append(int(index))
    if current:
        batches.append(current)
    return [np.asarray(batch, dtype=np.int64) for batch in batches]


def bucket(value: int, buckets: Sequence[int]) -> int:
    """The smallest of the ascending `buckets` holding `value`; `value` itself past the last one."""
    return next((b for b in buckets if b >= value), value)


def gpu_length_buckets(
    max_length: int | None, smallest: int = contract.GPU_SMALLEST_LENGTH_BUCKET
) -> tuple[int, ...]:
    """Powers of two from `smallest` below `max_length`, then `max_length`; without a max length,
    powers of two up to the contract's GPU_UNTOLD_MAX_BUCKET (longer rows keep their own width)."""
    top = contract.GPU_UNTOLD_MAX_BUCKET if max_length is None else max_length
    powers = [
        2**k
        for k in range(max(smallest, 1).bit_length() - 1, top.bit_length())
        if smallest <= 2**k < top
    ]
    return (*powers, top)


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """Powers of two below `max_rows`, then `max_rows`."""
    return (*(2**k for k in range(max_rows.bit_length()) if 2**k < max_rows), max(max_rows, 1))


def plan_bucketed_batches(
    lengths: npt.NDArray[Any], max_batch_tokens: int, max_rows: int, length_buckets: Sequence[int]
) -> list[npt.NDArray[Any]]:
    """Indices of rows per forward pass, longest rows first, with no length-ratio cut: each pass
    takes as many rows as fit `max_rows` and the budget at its longest row's length bucket (rows x
    bucket length <= `max_batch_tokens`); a row whose bucket alone passes the budget runs alone."""
    order = np.argsort(-np.maximum(np.asarray(lengths, dtype=np.int64), 1), kind="stable")
    batches: list[npt.NDArray[Any]] = []
    start = 0
    while start < len(order):
        width = bucket(max(int(lengths[order[start]]), 1), length_buckets)
        take = max(1, min(max_rows, max_batch_tokens // width))
        batches.append(order[start : start + take].astype(np.int64))
        start += take
    return batches


@dataclass(frozen=True)
class CpuBatching:
    """Length-sorted sub-batches cut at `length_ratio`, each padded to its own longest row."""

    max_batch_tokens: int
    length_ratio: float
    max_rows: int

    def plan(self, lengths: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
        return plan_sub_batches(lengths, self.max_batch_tokens, self.length_ratio, self.max_rows)

    def shape(self, lengths: Sequence[int]) -> tuple[int, int]:
        """(rows, width) of the forward pass over rows of these lengths."""
        return len(lengths), max(max(lengths), 1)


@dataclass(frozen=True)
class GpuBatching:
    """Few fixed shapes: passes filled to the budget, padded to a length bucket and a row bucket."""

    max_batch_tokens: int
    max_rows: int
    length_buckets: tuple[int, ...]

    def plan(self, lengths: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
        return plan_bucketed_batches(
            lengths, self.max_batch_tokens, self.max_rows, self.length_buckets
        )

    def row_cap(self, width: int) -> int:
        """The most rows one pass of `width` tokens takes."""
        return max(1, min(self.max_rows, self.max_batch_tokens // width))

    def shape(self, lengths: Sequence[int]) -> tuple[int, int]:
        """(rows, width) of the forward pass over rows of these lengths: the length bucket of the
        longest, and the row bucket of their count (never past what the budget allows there)."""
        width = bucket(max(max(lengths), 1), self.length_buckets)
        cap = self.row_cap(width)
        return min(bucket(len(lengths), row_buckets(self.max_rows)), cap), width

    def shapes(self) -> list[tuple[int, int]]:
        """Every (rows, width) `shape` can return for rows within the length buckets."""
        return sorted(
            {
                (min(rows, self.row_cap(width)), width)
                for width in self.length_buckets
                for rows in row_buckets(self.max_rows)
            }
        )


Batching = CpuBatching | GpuBatching
BATCHING_CHOICES = ("auto", "cpu", "gpu")


def batching_policy(params: dict[str, str], max_rows: int, cuda_active: bool = True) -> Batching:
    """The policy a config's parameters ask for: `batching` gpu, or auto on `execution_provider`
    cuda where no `length_ratio` is set and CUDA is live (`cuda_active`: onnxruntime did not fall
    back to the CPU), gets GpuBatching; everything else the CPU rule."""
    choice = params.get("batching", "auto")
    if choice not in BATCHING_CHOICES:
        raise ValueError(f"batching {choice!r}: one of {', '.join(BATCHING_CHOICES)}")
    gpu = choice == "gpu" or (
        choice == "auto"
        and params.get("execution_provider", "cpu") == "cuda"
        and "length_ratio" not in params
        and cuda_active
    )
    if not gpu:
        return CpuBatching(
            int(params["max_batch_tokens"]),
            float(params.get("length_ratio", contract.DEFAULT_LENGTH_RATIO)),
            max_rows,
        )
    max_length = int(params["max_length"]) if params.get("max_length") else None
    buckets = tuple(contract.int_list(params.get("length_buckets", ""))) or gpu_length_buckets(
        max_length
    )
    return GpuBatching(
        int(params.get("gpu_max_batch_tokens", contract.DEFAULT_GPU_MAX_BATCH_TOKENS)),
        max_rows,
        tuple(sorted(buckets)),
    )


@dataclass
class Row:
    request: int
    row: int
    length: int


def create_session(
    onnx_path: Path, threads: int, provider: str, spinning: bool = True
) -> ort.InferenceSession:
    """`spinning`: onnxruntime's idle threads spin for more work (fastest for one busy session);
    off where several sessions share the cores, so an idle one does not slow the busy one."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads > 0:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if provider != "cuda":
        return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    # CUDA and cuDNN from the nvidia-* wheels: the stub imports no torch to load them
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    available = ort.get_available_providers()
    session = ort.InferenceSession(
        str(onnx_path),
        options,
        providers=[p for p in (CUDA_PROVIDER, "CPUExecutionProvider") if p in available],
    )
    if session.get_providers()[0] != CUDA_PROVIDER:
        print(
            f"prensa encode: execution_provider cuda asked, running on {session.get_providers()[0]}: "
            f"onnxruntime {ort.__version__} has {available}",
            file=sys.stderr,
            flush=True,
        )
    return session


class TokenBudgetEncoder:
    """Runs one ONNX encoder over many padded requests with as little padding as possible."""

    def __init__(
        self,
        session: ort.InferenceSession,
        pad_id: int,
        max_batch_tokens: int,
        length_ratio: float,
        max_rows: int,
        per_token_outputs: set[str],
        *,
        batching: Batching | None = None,
    ) -> None:
        """`batching` None: the CPU rule with the budget, ratio and rows given here."""
        self.session = session
        self.input_names = {i.name for i in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]
        self.pad_id = pad_id
        self.max_batch_tokens = max_batch_tokens
        self.length_ratio = length_ratio
        self.max_rows = max_rows
        self.per_token_outputs = per_token_outputs
        self.batching: Batching = batching or CpuBatching(max_batch_tokens, length_ratio, max_rows)
        self.padded_tokens = 0  # rows x padded width, summed over forward passes
        self.real_tokens = 0  # tokens under the attention mask

    def encode(
        self, requests: list[dict[str, npt.NDArray[Any]]]
    ) -> list[dict[str, npt.NDArray[Any]]]:
        """Outputs per request; raises the error of the first request that fails."""
        results = self.encode_each(requests)
        failed = next((result for result in results if isinstance(result, Exception)), None)
        if failed is not None:
            raise failed
        return cast(list[dict[str, npt.NDArray[Any]]], results)  # no Exception left: raised above

    def encode_each(
        self,
        requests: list[dict[str, npt.NDArray[Any]]],
        cancelled: Callable[[int], bool] = lambda _: False,
    ) -> list[dict[str, npt.NDArray[Any]] | Exception]:
        """Outputs per request, or the exception that request alone raises (see `_run_isolated`), or
        `Cancelled` for a request that `cancelled(index)` reports before one of its sub-batches: its
        remaining rows are not computed."""
        rows = [
            Row(r, i, int(length))
            for r, tensors in enumerate(requests)
            for i, length in enumerate(contract.token_counts(tensors[contract.ATTENTION_MASK]))
        ]
        results: list[dict[str, npt.NDArray[Any]] | Exception] = [{} for _ in requests]
        if not rows:
            return results
        lengths = np.array([row.length for row in rows])
        for batch in self.batching.plan(lengths):
            for request in dict.fromkeys(rows[i].request for i in batch):
                if not isinstance(results[request], Exception) and cancelled(request):
                    results[request] = contract.Cancelled()
            members = [
                rows[i] for i in batch if not isinstance(results[rows[i].request], Exception)
            ]
            for group, outputs in self._run_isolated(requests, members):
                if isinstance(outputs, Exception):
                    for member in group:
                        results[member.request] = outputs
                    continue
                for position, member in enumerate(group):
                    self._scatter(
                        requests, results, member, {k: v[position] for k, v in outputs.items()}
                    )
        return results

    def _run_isolated(
        self, requests: list[dict[str, npt.NDArray[Any]]], members: list[Row]
    ) -> list[tuple[list[Row], dict[str, npt.NDArray[Any]] | Exception]]:
        """Run a sub-batch; if it raises (an out-of-vocabulary id, say), run each request's rows of it
        on their own, so the error reaches only the requests that fail alone, not their neighbours."""
        if not members:
            return []
        try:
            return [(members, self._run(requests, members))]
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises plain exceptions; find the culprit below
            if len({m.request for m in members}) == 1:
                return [(members, exc)]
        by_request: dict[int, list[Row]] = {}
        for member in members:
            by_request.setdefault(member.request, []).append(member)
        outcomes: list[tuple[list[Row], dict[str, npt.NDArray[Any]] | Exception]] = []
        for group in by_request.values():
            try:
                outcomes.append((group, self._run(requests, group)))
            except Exception as exc:  # noqa: BLE001 - reported to this request only
                outcomes.append((group, exc))
        return outcomes

    def _run(
        self, requests: list[dict[str, npt.NDArray[Any]]], members: list[Row]
    ) -> dict[str, npt.NDArray[Any]]:
        """The outputs of `members`' rows, one per member: the pass runs at the policy's shape, and
        rows past the members repeat the last one (a real row: no all-masked row reaches the graph)."""
        height, width = self.batching.shape([m.length for m in members])
        feed: dict[str, npt.NDArray[Any]] = contract.token_arrays(height, width, self.pad_id)
        for position, m in enumerate(members):
            for name, array in feed.items():
                array[position, : m.length] = requests[m.request][name][m.row, : m.length]
        for array in feed.values():
            array[len(members) :] = array[len(members) - 1]
        self.padded_tokens += width * height
        self.real_tokens += sum(m.length for m in members)
        values = self.session.run(
            self.output_names, {k: v for k, v in feed.items() if k in self.input_names}
        )
        return {name: value[: len(members)] for name, value in zip(self.output_names, values)}

    def warm_up(self, shapes: Sequence[tuple[int, int]]) -> None:
        """Run each (rows, width) once on pad tokens, so no request pays a new shape's first run."""
        for height, width in shapes:
            feed = contract.token_arrays(height, width, self.pad_id)
            feed[contract.ATTENTION_MASK][:] = 1
            self.session.run(
                self.output_names, {k: v for k, v in feed.items() if k in self.input_names}
            )

    def _scatter(
        self,
        requests: list[dict[str, npt.NDArray[Any]]],
        results: list[dict[str, npt.NDArray[Any]] | Exception],
        member: Row,
        values: dict[str, npt.NDArray[Any]],
    ) -> None:
        shape = requests[member.request][contract.ATTENTION_MASK].shape
        request_results = results[member.request]
        assert not isinstance(request_results, Exception)  # members exclude requests already failed
        for name, value in values.items():
            out = request_results.get(name)
            if out is None:
                trailing = value.shape[1:] if name in self.per_token_outputs else value.shape
                leading = (shape[0], shape[1]) if name in self.per_token_outputs else (shape[0],)
                out = request_results[name] = np.zeros(leading + trailing, dtype=np.float32)
            if name in self.per_token_outputs:
                out[member.row, : member.length] = value[: member.length]
            else:
                out[member.row] = value


def load_encoder(config: dict[str, Any], version_dir: Path) -> TokenBudgetEncoder:
    """The encoder a model config's parameters describe (see the module docstring)."""
    params = contract.parameters(config)
    max_rows = int(
        params.get("max_rows", str(config.get("max_batch_size", contract.DEFAULT_MAX_BATCH_SIZE)))
    )
    session = create_session(
        version_dir / params["onnx_file"],
        int(params.get("intra_op_threads", "0")),
        params.get("execution_provider", "cpu"),
        params.get("allow_spinning", "true") == "true",
    )
    batching = batching_policy(params, max_rows, session.get_providers()[0] == CUDA_PROVIDER)
    encoder = TokenBudgetEncoder(
        session,
        pad_id=int(params["pad_id"]),
        max_batch_tokens=int(params["max_batch_tokens"]),
        length_ratio=float(params.get("length_ratio", contract.DEFAULT_LENGTH_RATIO)),
        max_rows=max_rows,
        per_token_outputs=set(filter(None, params.get("per_token_outputs", "").split(","))),
        batching=batching,
    )
    # Only where the max length is known: a bucket past the model's positions would not run.
    if (
        isinstance(batching, GpuBatching)
        and params.get("max_length")
        and params.get("warmup_buckets", "true") == "true"
    ):
        encoder.warm_up(batching.shapes())
    return encoder


def read_token_inputs(request: Any) -> dict[str, npt.NDArray[Any]]:
    """A request's token tensors, zero `token_type_ids` where it sent none; ValueError without a mask."""
    given = {
        name: tensor.as_numpy()
        for name in (contract.INPUT_IDS, contract.ATTENTION_MASK, contract.TOKEN_TYPE_IDS)
        if (tensor := pb_utils.get_input_tensor_by_name(request, name)) is not None
    }
    if contract.ATTENTION_MASK not in given:
        raise ValueError(f"{contract.INPUT_IDS} needs {contract.ATTENTION_MASK}")
    given.setdefault(contract.TOKEN_TYPE_IDS, np.zeros_like(given[contract.INPUT_IDS]))
    return given


class TokenCounters:
    """Real vs computed tokens on Triton's metrics port (`prensa_encoder_{real,padded}_tokens`): the
    padding overhead, per model. The families must outlive their metrics, so both are kept.

    Each increment is a blocking round trip to the Triton process, and two per `execute` showed in a
    lone short query's latency. So `execute` only adds to pending totals, and a
    daemon thread sends them `FLUSH_DELAY_S` later, many executes' worth at once: the counters lag
    by about that much. `close` sends what is still pending."""

    FLUSH_DELAY_S = 0.05

    def __init__(self, model_name: str) -> None:
        self.families = {
            kind: pb_utils.MetricFamily(
                name=f"prensa_encoder_{kind}_tokens",
                description=f"{kind} tokens in the encoder's forward passes",
                kind=pb_utils.MetricFamily.COUNTER,
            )
            for kind in ("real", "padded")
        }
        self.metrics = {
            kind: family.Metric(labels={"model": model_name})
            for kind, family in self.families.items()
        }
        self._pending = dict.fromkeys(self.metrics, 0)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._flusher = threading.Thread(
            target=self._flush_loop, name="prensa-token-counters", daemon=True
        )
        self._flusher.start()

    @contextmanager
    def counting(self, encoder: TokenBudgetEncoder) -> Iterator[None]:
        """Add what `encoder` computes inside the block to the counters (sent by the flusher)."""
        real, padded = encoder.real_tokens, encoder.padded_tokens
        try:
            yield
        finally:
            with self._lock:
                self._pending["real"] += encoder.real_tokens - real
                self._pending["padded"] += encoder.padded_tokens - padded
            self._wake.set()

    def close(self) -> None:
        """Stop the flusher once it has sent everything pending."""
        self._closing = True
        self._wake.set()
        self._flusher.join()

    def _flush_loop(self) -> None:
        while not self._closing:
            self._wake.wait()
            if not self._closing:
                time.sleep(self.FLUSH_DELAY_S)
            self._wake.clear()
            self._flush()
        self._flush()  # what the last executes added while the loop was flushing

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, dict.fromkeys(self.metrics, 0)
        try:
            for kind, value in pending.items():
                if value:
                    self.metrics[kind].increment(value)
        except Exception as exc:  # noqa: BLE001 - a failed send must not stop the ones after it
            pb_utils.Logger.log_warn(f"prensa token counters not updated: {exc}")


def encoder_response(result: dict[str, npt.NDArray[Any]] | Exception) -> Any:
    """A request's outputs, CANCELLED for one skipped, or the error it alone raised."""
    if isinstance(result, contract.Cancelled):
        return contract.cancelled_response()
    if isinstance(result, Exception):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"encoder failed: {result}"))
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor(name, value) for name, value in result.items()]
    )


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.encoder = load_encoder(
            json.loads(args["model_config"]), Path(args["model_repository"]) / args["model_version"]
        )
        self.token_metrics = TokenCounters(args["model_name"])

    def execute(self, requests: list[Any]) -> list[Any]:
        cancelled = contract.CancelCheck(requests)
        live = cancelled.live()
        tensors = [read_token_inputs(requests[i]) for i in live]  # the config requires ids and mask
        with self.token_metrics.counting(self.encoder):
            results = dict(
                zip(live, self.encoder.encode_each(tensors, lambda j: cancelled(live[j])))
            )
        return [
            encoder_response(results.get(i, contract.Cancelled())) for i in range(len(requests))
        ]

    def finalize(self) -> None:
        self.token_metrics.close()

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
`length_buckets`, `warmup_buckets` (true|false), `gpu_pass_overhead_tokens`,
`gpu_graph_overhead_tokens`, `cuda_graphs` (true|false), `cuda_graph_max_tokens`,
`packed_onnx_file` and `packed_max_tokens`.

On a GPU the length-ratio cut costs more than it saves: every pass of a deep encoder pays
milliseconds of kernel launches however few its rows, and each new input shape a one-off cost. So
with `execution_provider` cuda (unless the config sets `length_ratio`, or `batching` says
otherwise) the stage uses `GpuBatching`: rows sorted longest first and cut into the passes that
cost least, launches and computed tokens together, each padded to a length bucket and a row bucket
(see the contract's GPU defaults), so a few shapes recur and are warmed at load. Two things lower
those costs where they load and agree with the plain graph on this device: CUDA graphs captured for
the small shapes (queries, small batches) replay a pass's launches at once, and the export's packed
graph (`prensa.export.formats.packing`) computes a larger pass over its real tokens only, so padding
no longer costs compute.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
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


@lru_cache(maxsize=8)
def padded_row_counts(max_rows: int) -> npt.NDArray[Any]:
    """For each count of rows up to `max_rows` (its index), the row bucket it is padded to."""
    buckets = contract.row_buckets(max_rows)
    return np.array([0, *(bucket(rows, buckets) for rows in range(1, max_rows + 1))])


def longest_first(lengths: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Row indices by length, longest first (ties in arrival order); a length under 1 counts 1."""
    return np.argsort(-np.maximum(np.asarray(lengths, dtype=np.int64), 1), kind="stable")


def plan_gpu_passes(lengths: npt.NDArray[Any], policy: GpuBatching) -> list[npt.NDArray[Any]]:
    """Indices of rows per forward pass, longest rows first, cut where the passes cost least in all
    (`GpuBatching.cost`), within the row limit and the padded-token budget (a row whose bucket
    alone passes the budget runs alone). So one long row no longer pads a whole pass of short
    ones, and short rows are not split into passes that each pay the launches: a dynamic programme
    over the cut points, each pass the rows from one cut to the next."""
    order = longest_first(lengths)
    count = len(order)
    if not count:
        return []
    sizes = np.maximum(np.asarray(lengths, dtype=np.int64)[order], 1)
    real = np.concatenate([[0], np.cumsum(sizes)])
    cost = np.full(count + 1, np.inf)
    cost[0] = 0.0
    start_of = np.zeros(
        count + 1, dtype=np.int64
    )  # where the pass that ends before each row starts
    for start in range(count):
        width = bucket(
            int(sizes[start]), policy.length_buckets
        )  # its longest row: rows come longest first
        rows = np.arange(1, min(count - start, policy.row_cap(width)) + 1)
        candidate = cost[start] + policy.cost(rows, width, real[start + rows] - real[start])
        ends = start + rows
        better = candidate < cost[ends]
        cost[ends[better]] = candidate[better]
        start_of[ends[better]] = start
    cuts, end = [], count
    while end > 0:
        cuts.append((int(start_of[end]), end))
        end = int(start_of[end])
    return [order[a:b].astype(np.int64) for a, b in reversed(cuts)]


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
    """Few fixed shapes: passes cut where they cost least (`plan_gpu_passes`), each padded to a
    length bucket and a row bucket. A pass costs its launches plus what it computes: a shape with a
    CUDA graph (`captured`) launches for `graph_overhead_tokens`' worth of compute instead of
    `pass_overhead_tokens`; a pass of the packed graph (`packed_max_tokens` set) computes its real
    tokens, up to that many, and takes its own rows and longest length as its shape."""

    max_batch_tokens: int
    max_rows: int
    length_buckets: tuple[int, ...]
    pass_overhead_tokens: int = contract.DEFAULT_GPU_PASS_OVERHEAD_TOKENS
    captured: frozenset[tuple[int, int]] = frozenset()
    graph_overhead_tokens: int = contract.DEFAULT_GPU_GRAPH_OVERHEAD_TOKENS
    packed_max_tokens: int | None = None

    def plan(self, lengths: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
        return plan_gpu_passes(lengths, self)

    def row_cap(self, width: int) -> int:
        """The most rows one pass of `width` tokens takes."""
        return max(1, min(self.max_rows, self.max_batch_tokens // width))

    def bucket_shape(self, rows: int, width: int) -> tuple[int, int]:
        """(rows, width) padded to their buckets, never past what the budget allows there."""
        width = bucket(max(width, 1), self.length_buckets)
        return min(bucket(rows, contract.row_buckets(self.max_rows)), self.row_cap(width)), width

    def shape(self, lengths: Sequence[int]) -> tuple[int, int]:
        """(rows, width) of the forward pass over rows of these lengths: its bucket shape where that
        is captured or there is no packed graph, else the rows' own (the packed graph's)."""
        rows, width = len(lengths), max(max(lengths), 1)
        padded = self.bucket_shape(rows, width)
        if self.packed_max_tokens is None or padded in self.captured:
            return padded
        return rows, width

    def cost(self, rows: npt.NDArray[Any], width: int, real: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """What passes of `rows` rows (an array), their longest `width` and `real` tokens cost, in
        tokens' worth of compute, as `shape` would run them."""
        width = bucket(width, self.length_buckets)
        heights = np.minimum(padded_row_counts(self.max_rows)[rows], self.row_cap(width))
        captured = np.isin(heights, [r for r, w in self.captured if w == width])
        padded = heights * width
        eager = self.pass_overhead_tokens + (
            padded
            if self.packed_max_tokens is None
            else np.where(real <= self.packed_max_tokens, real, np.inf)
        )
        return np.where(captured, self.graph_overhead_tokens + padded, eager)

    def shapes(self) -> list[tuple[int, int]]:
        """Every bucket shape a pass can take: those warmed at load, and those a CUDA graph may hold."""
        return sorted(
            {
                (min(rows, self.row_cap(width)), width)
                for width in self.length_buckets
                for rows in contract.row_buckets(self.max_rows)
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
    buckets = tuple(
        contract.int_list(params.get("length_buckets", ""))
    ) or contract.gpu_length_buckets(max_length)
    return GpuBatching(
        int(params.get("gpu_max_batch_tokens", contract.DEFAULT_GPU_MAX_BATCH_TOKENS)),
        max_rows,
        tuple(sorted(buckets)),
        int(params.get("gpu_pass_overhead_tokens", contract.DEFAULT_GPU_PASS_OVERHEAD_TOKENS)),
        graph_overhead_tokens=int(
            params.get("gpu_graph_overhead_tokens", contract.DEFAULT_GPU_GRAPH_OVERHEAD_TOKENS)
        ),
    )


def captured_shapes(batching: GpuBatching, max_tokens: int) -> tuple[tuple[int, int], ...]:
    """The GPU policy's shapes of at most `max_tokens` tokens: those worth a CUDA graph."""
    return tuple(s for s in batching.shapes() if s[0] * s[1] <= max_tokens)


@dataclass
class Row:
    request: int
    row: int
    length: int


def log(message: str) -> None:
    """A line on the stub's stderr, which Triton's log keeps."""
    print(f"prensa encode: {message}", file=sys.stderr, flush=True)


def create_session(
    onnx_path: Path, threads: int, provider: str, spinning: bool = True, cuda_graph: bool = False
) -> ort.InferenceSession:
    """`spinning`: onnxruntime's idle threads spin for more work (fastest for one busy session);
    off where several sessions share the cores, so an idle one does not slow the busy one.
    `cuda_graph`: on CUDA, a session that can capture CUDA graphs (`CudaGraphs`), or a plain one
    where onnxruntime cannot give it (some node off the GPU), saying why."""
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
    if cuda_graph and CUDA_PROVIDER in available:
        try:
            return ort.InferenceSession(
                str(onnx_path), options, providers=[(CUDA_PROVIDER, {"enable_cuda_graph": "1"})]
            )
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises plain exceptions
            log(f"no CUDA graphs for {onnx_path.name}: {str(exc).splitlines()[0]}")
    session = ort.InferenceSession(
        str(onnx_path),
        options,
        providers=[p for p in (CUDA_PROVIDER, "CPUExecutionProvider") if p in available],
    )
    if session.get_providers()[0] != CUDA_PROVIDER:
        log(
            f"execution_provider cuda asked, running on {session.get_providers()[0]}: "
            f"onnxruntime {ort.__version__} has {available}"
        )
    return session


def graph_run(graph_id: int) -> ort.RunOptions:
    """Run options naming a CUDA graph: `graph_id` >= 1 captures (then replays) it, -1 runs eagerly."""
    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", str(graph_id))
    return options


def eager(session: Any) -> ort.RunOptions | None:
    """The run options of an eager run: on a session that captures CUDA graphs, none captured."""
    options = session.get_provider_options().get(CUDA_PROVIDER, {})
    return graph_run(-1) if options.get("enable_cuda_graph") in ("1", "True", "true") else None


def check_feed(max_length: int, pad_id: int, rows: int = 6) -> dict[str, npt.NDArray[Any]]:
    """Ragged rows of made-up token ids (the lowest 100 past the special ones: every vocabulary has
    them), one of the model's full length: what `packed_refusal` and `CudaGraphs` compare on."""
    lengths = [max_length, 1, 7, min(33, max_length), max(max_length // 3, 1), 2][:rows]
    rng = np.random.default_rng(0)
    feed: dict[str, npt.NDArray[Any]] = contract.token_arrays(len(lengths), max(lengths), pad_id)
    for row, length in enumerate(lengths):
        feed[contract.INPUT_IDS][row, :length] = rng.integers(5, 100, size=length)
        feed[contract.ATTENTION_MASK][row, :length] = 1
    return feed


def disagreement(
    got: Sequence[npt.NDArray[Any]],
    want: Sequence[npt.NDArray[Any]],
    names: Sequence[str],
    mask: npt.NDArray[Any],
    per_token: set[str],
) -> str | None:
    """Which output of `got` differs from `want` past fp16's noise, or None: per real token (and per
    pooled row) a cosine of at least 0.999, logits within 0.02."""
    for name, a, b in zip(names, got, want):
        a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
        if name in per_token:
            a, b = a[mask.astype(bool)], b[mask.astype(bool)]
        if name == contract.LOGITS:
            worst = float(np.abs(a - b).max(initial=0.0))
            if worst > 0.02:
                return f"{name} differ by {worst:.3g}"
            continue
        a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
        norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        cosine = np.where(norms > 0, (a * b).sum(axis=1) / np.maximum(norms, 1e-30), 1.0)
        if len(cosine) and float(cosine.min()) < 0.999:
            return f"{name}: cosine {float(cosine.min()):.5f}"
    return None


def packed_refusal(
    session: Any,
    packed: Any,
    pad_id: int,
    max_length: int,
    per_token: set[str],
) -> str | None:
    """Why the packed session may not serve, or None: it must run, and give the unpacked graph's
    outputs on a ragged batch (`check_feed`), on this very device."""
    feed = check_feed(max_length, pad_id)
    names = [o.name for o in session.get_outputs()]
    try:
        want = session.run(names, inputs_of(session, feed), eager(session))
        got = packed.run(names, inputs_of(packed, feed))
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises plain exceptions
        return f"it does not run: {str(exc).splitlines()[0]}"
    return disagreement(got, want, names, feed[contract.ATTENTION_MASK], per_token)


def inputs_of(session: Any, feed: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
    names = {i.name for i in session.get_inputs()}
    return {k: v for k, v in feed.items() if k in names}


@dataclass
class BoundGraph:
    binding: Any  # onnxruntime's IOBinding, its buffers at the addresses the graph replays
    options: ort.RunOptions
    inputs: dict[str, Any]  # OrtValues on the device
    outputs: list[Any]


class CudaGraphs:
    """One CUDA graph per (rows, width), captured on a session made with `cuda_graph`: a replay
    launches a whole pass at once, where an eager pass of a deep encoder spends milliseconds
    launching kernels (docs/gpu.md). Each shape keeps its own buffers on the device, since a graph
    replays at fixed addresses: a pass is copied into them, replayed and copied back. Each graph is
    checked against an eager run of its shape when captured."""

    def __init__(
        self, session: Any, shapes: Sequence[tuple[int, int]], pad_id: int, per_token: set[str]
    ) -> None:
        self.session = session
        self.output_names = [o.name for o in session.get_outputs()]
        self.bound = {
            shape: self._capture(graph_id, shape, pad_id, per_token)
            for graph_id, shape in enumerate(shapes, start=1)
        }

    def _capture(
        self, graph_id: int, shape: tuple[int, int], pad_id: int, per_token: set[str]
    ) -> BoundGraph:
        rows, width = shape
        feed = inputs_of(self.session, check_feed(width, pad_id, rows=1))
        feed = {k: np.ascontiguousarray(np.repeat(v, rows, axis=0)) for k, v in feed.items()}
        reference = self.session.run(self.output_names, feed, eager(self.session))
        binding = self.session.io_binding()
        inputs = {}
        for name, array in feed.items():
            inputs[name] = ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0)
            binding.bind_ortvalue_input(name, inputs[name])
        outputs = []
        for name, array in zip(self.output_names, reference):
            outputs.append(
                ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, "cuda", 0)
            )
            binding.bind_ortvalue_output(name, outputs[-1])
        options = graph_run(graph_id)
        for _ in range(2):  # onnxruntime runs once before it captures, then replays
            self.session.run_with_iobinding(binding, options)
        replayed = [value.numpy() for value in outputs]
        mask = feed[contract.ATTENTION_MASK]
        if wrong := disagreement(replayed, reference, self.output_names, mask, per_token):
            raise RuntimeError(
                f"the CUDA graph of {rows} x {width} replays other outputs ({wrong})"
            )
        return BoundGraph(binding, options, inputs, outputs)

    def __contains__(self, shape: object) -> bool:
        return shape in self.bound

    def run(self, feed: dict[str, npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        bound = self.bound[cast(tuple[int, int], feed[contract.INPUT_IDS].shape)]
        for name, value in bound.inputs.items():
            value.update_inplace(np.ascontiguousarray(feed[name]))
        self.session.run_with_iobinding(bound.binding, bound.options)
        return [value.numpy() for value in bound.outputs]


class TokenBudgetEncoder:
    """Runs one ONNX encoder over many padded requests with as little padding as possible.

    On a GPU a pass may run three ways: replayed from a CUDA graph (`graphs`) where its shape has
    one, on the packed graph (`packed`) otherwise, else on `session` (`GpuBatching` plans for the
    same three)."""

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
        packed: ort.InferenceSession | None = None,
        graphs: CudaGraphs | None = None,
        eager_options: ort.RunOptions | None = None,
    ) -> None:
        """`batching` None: the CPU rule with the budget, ratio and rows given here.
        `eager_options`: `session`'s runs outside its CUDA graphs (`eager`)."""
        self.session = session
        self.packed = packed
        self.graphs = graphs
        self.eager = eager_options
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
        real = sum(m.length for m in members)
        replayed = self.graphs is not None and (height, width) in self.graphs
        packed = self.packed is not None and not replayed
        self.real_tokens += real
        # what the pass computes: the packed graph, its real tokens; any other, every padded one
        self.padded_tokens += real if packed else width * height
        values = self._forward(feed, replayed, packed)
        return {name: value[: len(members)] for name, value in zip(self.output_names, values)}

    def _forward(
        self, feed: dict[str, npt.NDArray[Any]], replayed: bool, packed: bool
    ) -> Sequence[npt.NDArray[Any]]:
        """One pass: replayed where its shape has a CUDA graph, else on the packed or plain session."""
        if replayed and self.graphs is not None:
            return self.graphs.run(feed)
        if packed and self.packed is not None:
            return cast(
                list[npt.NDArray[Any]],
                self.packed.run(self.output_names, inputs_of(self.packed, feed)),
            )
        return cast(
            list[npt.NDArray[Any]],
            self.session.run(self.output_names, inputs_of(self.session, feed), self.eager),
        )

    def warm_up(self, shapes: Sequence[tuple[int, int]]) -> None:
        """Run each (rows, width) once on pad tokens, so no request pays a new shape's first run."""
        for height, width in shapes:
            feed = contract.token_arrays(height, width, self.pad_id)
            feed[contract.ATTENTION_MASK][:] = 1
            self.session.run(self.output_names, inputs_of(self.session, feed), self.eager)

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


def load_packed(
    session: Any, path: Path, threads: int, pad_id: int, max_length: int, per_token: set[str]
) -> Any:
    """The packed graph's session when it gives the unpacked graph's outputs here, else None with
    the reason logged (the unpacked graph then serves every pass)."""
    try:
        packed = create_session(path, threads, "cuda")
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises plain exceptions
        log(f"serving {path.name} unpacked: the packed graph does not load: {exc}")
        return None
    reason = (
        f"it runs on {packed.get_providers()[0]}"
        if packed.get_providers()[0] != CUDA_PROVIDER
        else packed_refusal(session, packed, pad_id, max_length, per_token)
    )
    if reason:
        log(f"serving unpacked: the packed graph {path.name} is not used: {reason}")
        return None
    log(f"the packed graph {path.name} serves passes of more than a captured shape")
    return packed


def load_graphs(
    session: Any, batching: GpuBatching, params: dict[str, str], pad_id: int, per_token: set[str]
) -> CudaGraphs | None:
    """CUDA graphs for the small shapes (`captured_shapes`), or None with the reason logged."""
    if eager(session) is None:
        return None
    max_tokens = int(params.get("cuda_graph_max_tokens", contract.DEFAULT_CUDA_GRAPH_MAX_TOKENS))
    shapes = captured_shapes(batching, max_tokens)
    try:
        graphs = CudaGraphs(session, shapes, pad_id, per_token)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises plain exceptions
        log(f"no CUDA graphs: {str(exc).splitlines()[0]}")
        return None
    log(f"CUDA graphs captured for {len(shapes)} shapes of up to {max_tokens} tokens")
    return graphs


def load_encoder(config: dict[str, Any], version_dir: Path) -> TokenBudgetEncoder:
    """The encoder a model config's parameters describe (see the module docstring). On CUDA with
    its max length known: CUDA graphs for the small shapes (unless `cuda_graphs` is false) and the
    packed graph (`packed_onnx_file`), each where it loads and agrees with the plain graph."""
    params = contract.parameters(config)
    max_rows = int(
        params.get("max_rows", str(config.get("max_batch_size", contract.DEFAULT_MAX_BATCH_SIZE)))
    )
    threads, provider = (
        int(params.get("intra_op_threads", "0")),
        params.get("execution_provider", "cpu"),
    )
    max_length = int(params["max_length"]) if params.get("max_length") else None
    session = create_session(
        version_dir / params["onnx_file"],
        threads,
        provider,
        params.get("allow_spinning", "true") == "true",
        cuda_graph=provider == "cuda"
        and max_length is not None
        and params.get("cuda_graphs", "true") == "true",
    )
    pad_id = int(params["pad_id"])
    per_token = set(filter(None, params.get("per_token_outputs", "").split(",")))
    batching = batching_policy(params, max_rows, session.get_providers()[0] == CUDA_PROVIDER)
    packed = graphs = None
    if isinstance(batching, GpuBatching) and max_length is not None:
        graphs = load_graphs(session, batching, params, pad_id, per_token)
        if params.get("packed_onnx_file"):
            packed = load_packed(
                session,
                version_dir / params["packed_onnx_file"],
                threads,
                pad_id,
                max_length,
                per_token,
            )
        batching = replace(
            batching,
            captured=frozenset(graphs.bound) if graphs is not None else frozenset(),
            packed_max_tokens=int(
                params.get("packed_max_tokens", contract.DEFAULT_PACKED_MAX_TOKENS)
            )
            if packed is not None
            else None,
        )
    encoder = TokenBudgetEncoder(
        session,
        pad_id=pad_id,
        max_batch_tokens=int(params["max_batch_tokens"]),
        length_ratio=float(params.get("length_ratio", contract.DEFAULT_LENGTH_RATIO)),
        max_rows=max_rows,
        per_token_outputs=per_token,
        batching=batching,
        packed=packed,
        graphs=graphs,
        eager_options=eager(session),
    )
    # Only where the max length is known: a bucket past the model's positions would not run.
    if (
        isinstance(batching, GpuBatching)
        and packed is None
        and max_length is not None
        and params.get("warmup_buckets", "true") == "true"
    ):
        encoder.warm_up([s for s in batching.shapes() if graphs is None or s not in graphs])
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

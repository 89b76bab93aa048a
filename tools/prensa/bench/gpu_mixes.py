"""GPU traffic on paper: the token-length mixes the GPU batching policy is judged on, and what a pass
costs an H200 by the figures measured there (docs/gpu.md, "Measured on an H200").

Four mixes of single texts: the realistic one (token lengths lognormal, median 88, p90 245, cut at
512), short queries only (8-32 tokens), full 512-token passages only, and half of each. The cost
of a pass is its launches plus its computed tokens, each token's cost growing with the pass's
width (attention): fitted to bge-m3 fp16 on the H200 (5,596 seq/s at 128 tokens and 1,317 at 512
in passes of 65,536 tokens, 12 ms of launches a pass, 1.5 ms replayed from a CUDA graph). A plan
is judged against sorted batches (every text sorted by length, passes of similar length under
32,768 tokens) on the same engine. The model stands in for the device on a CPU: the device's
own figures (`tools/gpu_check.py --bench`) are what count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

MIXES = ("realistic", "queries", "passages", "half")
SORTED_PASS_TOKENS = 32768  # sorted batches: passes under this many tokens (rows x longest)


def token_lengths(
    mix: str, count: int = 8192, max_length: int = 512, seed: int = 0
) -> npt.NDArray[Any]:
    """`count` token lengths (special tokens included) of one of MIXES, in arrival order."""
    rng = np.random.default_rng(seed)
    if mix == "realistic":  # lognormal with median 88 and p90 245: sigma = ln(245 / 88) / 1.2816
        drawn = rng.lognormal(np.log(88), np.log(245 / 88) / 1.2816, size=count)
        realistic: npt.NDArray[Any] = np.clip(np.rint(drawn), 3, max_length).astype(np.int64)
        return realistic
    if mix == "queries":
        return rng.integers(8, 33, size=count)
    if mix == "passages":
        return np.full(count, max_length, dtype=np.int64)
    if mix == "half":
        both = np.concatenate(
            [rng.integers(8, 33, size=count // 2), np.full(count - count // 2, max_length)]
        )
        mixed: npt.NDArray[Any] = rng.permutation(both)
        return mixed
    raise ValueError(f"unknown mix {mix!r}: one of {', '.join(MIXES)}")


@dataclass(frozen=True)
class PassCost:
    """Milliseconds of one pass: launches, plus per computed token `token_ms + width x width_ms`."""

    launch_ms: float = 12.0
    graph_launch_ms: float = 1.5
    token_ms: float = 0.0011843
    width_ms: float = 2.27e-7

    def __call__(self, computed: int, width: int, captured: bool = False) -> float:
        launches = self.graph_launch_ms if captured else self.launch_ms
        return launches + computed * (self.token_ms + width * self.width_ms)


H200_BGE_M3 = PassCost()


def sorted_passes(
    lengths: npt.NDArray[Any], budget: int = SORTED_PASS_TOKENS
) -> list[npt.NDArray[Any]]:
    """The reference: every row sorted by length, passes of consecutive rows under `budget` tokens
    (rows x the pass's longest)."""
    order = np.argsort(lengths, kind="stable")
    passes: list[list[int]] = [[]]
    for index in order:
        if passes[-1] and (len(passes[-1]) + 1) * int(lengths[index]) > budget:
            passes.append([])
        passes[-1].append(int(index))
    return [np.asarray(p, dtype=np.int64) for p in passes if p]


def sorted_ms(
    lengths: npt.NDArray[Any], cost: PassCost = H200_BGE_M3, packed: bool = False
) -> float:
    """What sorted batches cost on an engine, padded (each pass to its longest row) or packed."""
    total = 0.0
    for rows in sorted_passes(lengths):
        width = int(lengths[rows].max())
        total += cost(int(lengths[rows].sum()) if packed else len(rows) * width, width)
    return total


def windows(lengths: npt.NDArray[Any], rows: int) -> list[npt.NDArray[Any]]:
    """The mix as the encode stage sees it: consecutive windows of `rows` rows, one per `execute`."""
    return [lengths[start : start + rows] for start in range(0, len(lengths), rows)]


@dataclass(frozen=True)
class PlanFigures:
    ms: float
    passes: int
    replayed: int  # passes replayed from a CUDA graph
    real_tokens: int
    computed_tokens: int  # what the passes compute: padded tokens, or real ones on the packed graph

    @property
    def padding(self) -> float:
        return self.computed_tokens / self.real_tokens


def plan_figures(
    shapes: Sequence[tuple[tuple[int, int], int, bool, bool]], cost: PassCost = H200_BGE_M3
) -> PlanFigures:
    """Totals over passes given as ((rows, width), real tokens, packed, captured)."""
    ms, computed, real = 0.0, 0, 0
    for (rows, width), tokens, packed, captured in shapes:
        work = tokens if packed else rows * width
        ms += cost(work, width, captured)
        computed += work
        real += tokens
    replayed = sum(1 for *_, captured in shapes if captured)
    return PlanFigures(float(ms), len(shapes), replayed, int(real), int(computed))


def policy_figures(mix: str, window: int, packed: bool, graphs: bool) -> tuple[PlanFigures, float]:
    """The encode stage's GPU policy on `mix`, `window` rows an `execute`, with or without the packed
    graph and CUDA graphs: its figures, and its speed as a share of sorted batches on the engine."""
    from dataclasses import replace

    from prensa.stages import contract, load_stage

    encode = load_stage("encode")
    lengths = token_lengths(mix)
    policy = encode.GpuBatching(
        contract.DEFAULT_GPU_MAX_BATCH_TOKENS, window, contract.gpu_length_buckets(512)
    )
    captured = encode.captured_shapes(policy, contract.DEFAULT_CUDA_GRAPH_MAX_TOKENS)
    policy = replace(
        policy,
        captured=frozenset(captured if graphs else ()),
        packed_max_tokens=contract.DEFAULT_PACKED_MAX_TOKENS if packed else None,
    )
    figures = planned(lengths, policy, window)
    return figures, sorted_ms(lengths, packed=packed) / figures.ms


def planned(lengths: npt.NDArray[Any], policy: Any, window: int) -> PlanFigures:
    """`lengths` through the stage's GPU `policy` a window of rows at a time, as the stage sees them:
    each pass's shape, its real tokens and how it runs (packed, or replayed from a CUDA graph)."""
    shapes = []
    for rows in windows(lengths, window):
        for batch in policy.plan(rows):
            shape = policy.shape(rows[batch].tolist())
            replayed = shape in policy.captured
            packed = policy.packed_max_tokens is not None and not replayed
            shapes.append((shape, int(rows[batch].sum()), packed, replayed))
    return plan_figures(shapes)


def main() -> None:
    """The table docs/gpu.md shows: every mix, window and engine, on paper."""
    print(
        "| mix | rows an execute | graph | CUDA graphs | share of sorted | computed / real | passes (replayed) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mix in MIXES:
        for window in (64, 256, 1024):
            for packed in (False, True):
                for graphs in (False, True):
                    figures, share = policy_figures(mix, window, packed, graphs)
                    print(
                        f"| {mix} | {window} | {'packed' if packed else 'padded'} | "
                        f"{'yes' if graphs else 'no'} | {share:.2f} | {figures.padding:.2f} | "
                        f"{figures.passes} ({figures.replayed}) |"
                    )


if __name__ == "__main__":
    main()

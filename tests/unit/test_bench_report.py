"""The bench's references: ratios to the mean of the limit's measurements, and the encode stage
alone computing the same sequences and tokens as the limit."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from prensa.bench.report import add_ratios, print_table
from prensa.bench.systems import EncodeStageAlone, OnnxLimit
from prensa.triton.repo import ServingOptions
from prensa.workload import RerankCase, query_texts


def _system(name: str, seq_per_s: float, kind: str = "in-process") -> dict[str, object]:
    run = {"concurrency": None if kind == "in-process" else 8, "seq_per_s": seq_per_s, "tok_per_s": 10 * seq_per_s}
    return {"name": name, "kind": kind, "single_query_p50_ms": 1.0, "runs": [run]}


def test_ratios_are_to_the_mean_of_the_limits_measurements_and_their_spread_is_printed():
    report = {"task": "embed", "model": "m", "dtype": "fp32", "cpus": 2,
              "workload": {"requests": 4, "mean_tokens": 10.0},
              "systems": [_system("onnxruntime limit", 100.0), _system("encode stage alone", 90.0),
                          _system("prensa (Triton gRPC)", 55.0, "server"),
                          _system("onnxruntime limit, again after the servers", 120.0)]}
    add_ratios(report)
    assert [s["runs"][0]["vs_limit"] for s in report["systems"]] == pytest.approx([100 / 110, 90 / 110, 0.5, 120 / 110])
    assert report["limit"]["measured"] == [100.0, 120.0]
    assert report["limit"]["spread"] == pytest.approx(20 / 110)
    out = io.StringIO()
    print_table(report, Console(file=out, width=300))
    assert "100.0, 120.0 seq/s" in out.getvalue() and "18%" in out.getvalue()


@pytest.mark.parametrize("export", ["minilm", "reranker"])
def test_the_encode_stage_alone_computes_what_the_limit_computes(exports, export):
    """Shuffled and cut into batches, the same workload: every sequence once, every token counted."""
    texts = query_texts(70)
    items: list[str] | list[RerankCase] = texts if export == "minilm" else \
        [RerankCase(q, texts[i : i + 3]) for i, q in enumerate(texts[:20])]
    alone = EncodeStageAlone(exports[export], ServingOptions()).run(items)
    limit = OnnxLimit(exports[export]).run(items)
    assert (alone.sequences, alone.tokens) == (limit.sequences, limit.tokens)
    assert alone.sequences == (70 if export == "minilm" else 60)

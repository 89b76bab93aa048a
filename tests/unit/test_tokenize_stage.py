"""Tokenize stage: truncation rules and per-request failure isolation, against transformers."""

from __future__ import annotations

from transformers import AutoTokenizer

from prensa.stages import load_stage

tokenize = load_stage("tokenize")


def test_long_single_texts_and_pairs_truncate_like_transformers(exports):
    export = exports["reranker"]
    reference = AutoTokenizer.from_pretrained(export)
    encoder = tokenize.TextEncoder(export / "tokenizer.json", 64, "right", "only_second")
    long = "Berlin is the capital of Germany. " * 40
    single, pair = encoder.encode_requests([[long], [("a short query", long)]])
    assert single[0].ids == reference(long, truncation=True, max_length=64)["input_ids"]
    assert pair[0].ids == reference("a short query", long, truncation="only_second", max_length=64)["input_ids"]


def test_a_failing_request_does_not_fail_its_neighbours(exports):
    export = exports["reranker"]
    encoder = tokenize.TextEncoder(export / "tokenizer.json", 16, "right", "only_second")
    long_query = "query words " * 40  # only_second cannot fit a query longer than max_length
    ok, bad, also_ok = encoder.encode_requests([["fine"], [(long_query, "passage")], [("q", "p")]])
    assert isinstance(bad, Exception)
    assert len(ok) == 1 and len(also_ok) == 1 and len(also_ok[0].ids) <= 16

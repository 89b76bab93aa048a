"""Tokenize stage: truncation rules and per-request failure isolation, against transformers."""

from __future__ import annotations

from transformers import AutoTokenizer

from prensa.stages import load_stage

tokenize = load_stage("tokenize")


def test_long_single_texts_and_pairs_truncate_like_transformers(exports):
    export = exports["reranker"]
    reference = AutoTokenizer.from_pretrained(export)
    encoder = tokenize.TextEncoder(export / "tokenizer.json", 64)
    long = "Berlin is the capital of Germany. " * 40
    single, pair = encoder.encode_requests([[long], [("a short query", long)]])
    assert single[0].ids == reference(long, truncation=True, max_length=64)["input_ids"]
    assert pair[0].ids == reference("a short query", long, truncation=True, max_length=64)["input_ids"]


def test_a_failing_request_does_not_fail_its_neighbours(exports):
    export = exports["reranker"]
    encoder = tokenize.TextEncoder(export / "tokenizer.json", 16)
    # no text decoded from a request is anything but a str: a None stands in for what tokenizers refuses
    ok, bad, also_ok = encoder.encode_requests([["fine"], [("query", None)], [("q", "p")]])
    assert isinstance(bad, Exception)
    assert len(ok) == 1 and len(also_ok) == 1 and len(also_ok[0].ids) <= 16

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


def test_a_stripping_model_reads_texts_alike_in_the_stage_and_the_gateway(tmp_path):
    """`strip_texts` (PyLate's reading): the tokenize stage, the gateway's token path and `/tokenize`
    read each text stripped, on a byte-level tokenizer that would keep the whitespace as tokens; a
    model that does not strip keeps it everywhere."""
    from prensa.gateway.core.tokenization import (
        PromptedText,
        Truncation,
        read_item,
        simple_tokens,
        tokenize_items,
    )
    from tests.tiny_layouts import WHITESPACE_TEXTS, byte_level_tokenizer

    byte_level_tokenizer(tmp_path)
    path = tmp_path / "tokenizer.json"
    texts = [*WHITESPACE_TEXTS, "  Émilie à Montréal "]
    stripped = [t.strip() for t in texts]
    for strip, read in ((True, stripped), (False, texts)):
        stage = tokenize.TextEncoder.from_parameters(
            {"tokenizer_file": path.name, "max_length": "64", "strip_texts": str(strip).lower()}, tmp_path)
        plain = tokenize.TextEncoder(path, 64)
        [got], [want] = stage.encode_requests([texts]), plain.encode_requests([read])
        assert [e.ids for e in got] == [e.ids for e in want]
        [pairs] = stage.encode_requests([[(t, t) for t in texts]])
        [want_pairs] = plain.encode_requests([[(t, t) for t in read]])
        assert [e.ids for e in pairs] == [e.ids for e in want_pairs]
        gateway = tokenize_items(plain.whole, [read_item(t, strip) for t in texts], None, 64,
                                 Truncation(True, "right"), 10**6)
        assert gateway.ids == [e.ids for e in got]
    assert [e.ids for e in got] != [e.ids for e in stage.encode_requests([stripped])[0]]  # whitespace is read
    prompted = read_item(PromptedText("query: ", " berlin "), True)
    assert (str(prompted), prompted.prompt) == ("query:  berlin", "query: ")  # the whole stripped, as ST 5.3
    tokens = list(simple_tokens(plain.whole, "  Émilie\t", False, strip=True))
    assert [(t["start"], t["stop"]) for t in tokens] == [(2, 9)]  # bytes of the text as sent: É takes two
    assert tokens[0]["text"] == "Émilie"


# Where each task's texts go with whitespace around and inside them (`tiny_layouts.WHITESPACE_TEXTS`)
# and are compared with its reference library's answers. A new task must name its check here.
WHITESPACE_CHECKS = {
    "embed": "tests/e2e/test_layouts_triton.py",  # sentence-transformers 5.7 on ModernBERT and Qwen3
    "splade": "tests/e2e/test_layouts_triton.py",  # SparseEncoder on ModernBERT
    "rerank": "tests/e2e/test_layouts_triton.py",  # CrossEncoder on ModernBERT, Qwen3-Reranker's card
    "classify": "tests/e2e/test_layouts_triton.py",  # the cross-encoders' export: *ForSequenceClassification
    "m3": "tests/e2e/test_embeddings_triton.py",  # FlagEmbedding
    "late": "tests/e2e/test_late_interaction_triton.py",  # PyLate on ModernBERT
}


def test_every_task_reads_whitespace_against_its_reference():
    from pathlib import Path

    from prensa.manifest import Task

    assert set(WHITESPACE_CHECKS) == {task.value for task in Task}
    root = Path(__file__).resolve().parents[2]
    for task, path in WHITESPACE_CHECKS.items():
        assert "tiny_layouts.WHITESPACE_TEXTS" in (root / path).read_text(), (task, path)

"""Bounded work and memory per request: `/tokenize` and `/decode` obey the batch limit and run off
the event loop; a long rerank query (or passage) is cut to what the model reads once, not
tokenized whole for every pair, and the answers stay those of the text the model reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from tokenizers import Tokenizer

from prensa.gateway.core.tokenization import (
    TOKENIZE_WINDOW,
    Truncation,
    bound_texts,
    simple_tokens,
    tokenize_items,
    window_chars,
)
from prensa.gateway.errors import GatewayError
from tests.bodies import error_of
from tests.gateway.conftest import need, tokenizer  # noqa: F401 - fixtures shared with tests/gateway
from tests.tiny_models import xlmr_tokenizer

SENTENCES = ["Berlin is the capital and largest city of Germany. ", "Émilie a mangé une pomme à Montréal; ",
             "東京は日本の首都です。 ", "Dense retrieval encodes queries and passages into vectors.\n",
             "Late interaction keeps one vector per token (ColBERT), and scores with max similarity!  "]
PASSAGES = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "The fox jumps over the dog.",
            "Rerankers score a query together with each candidate passage."]


def prose(chars: int, offset: int = 0) -> str:
    """`chars` characters of varied text (several scripts, punctuation, runs of spaces)."""
    cycle = "".join(SENTENCES[(offset + i) % len(SENTENCES)] for i in range(len(SENTENCES)))
    return (cycle * (chars // len(cycle) + 1))[:chars]


@pytest.fixture(scope="module")
def local_tokenizers(minilm_dir, tmp_path_factory) -> dict[str, Tokenizer]:
    """A WordPiece (MiniLM) and a unigram (XLM-R's kind) tokenizer, as the gateway loads them."""
    xlmr = tmp_path_factory.mktemp("xlmr-tokenizer")
    xlmr_tokenizer(xlmr)
    loaded = {}
    for name, path in (("wordpiece", minilm_dir / "tokenizer.json"), ("unigram", xlmr / "tokenizer.json")):
        tokenizer = Tokenizer.from_file(str(path))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        loaded[name] = tokenizer
    return loaded


# Each many windows long for `max_length` 64 (520 characters); the hard ones hold few tokens per character.
LONG_TEXTS = {
    "prose": prose(8_000),
    "one long word": "x" * 6_000 + " " + prose(2_000),
    "runs of spaces": "ok " + " " * 6_000 + prose(2_000),
    "control characters": prose(1_500) + "\u0000" * 5_000 + prose(1_500, 2),
}


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
@pytest.mark.parametrize("direction", ["right", "left"])
@pytest.mark.parametrize("text", list(LONG_TEXTS), ids=list(LONG_TEXTS))
def test_cut_texts_give_the_same_rows(local_tokenizers, kind, direction, text):
    """Cutting first changes no token the model reads, for lone texts and pairs, nor the count a
    refusal names."""
    tok, long_text, max_length = local_tokenizers[kind], LONG_TEXTS[text], 64
    items, pairs = [long_text, "a short query", long_text], ["a passage", long_text, long_text]
    for batch, second in ((items, None), (items, pairs)):
        expected = tokenize_items(tok, batch, second, max_length, Truncation(True, direction), 10**6)
        cut_items, cut_pairs = bound_texts(tok, batch, second, max_length, direction)
        assert max(map(len, cut_items + (cut_pairs or []))) < len(long_text)
        got = tokenize_items(tok, cut_items, cut_pairs, max_length, Truncation(True, direction), 10**6)
        assert (got.ids, got.type_ids, got.cut) == (expected.ids, expected.type_ids, expected.cut)
    count = len(tok.encode(long_text, add_special_tokens=False)) + tok.num_special_tokens_to_add(False)
    with pytest.raises(GatewayError, match=f"Given: {count}$"):
        tokenize_items(tok, [long_text], None, max_length, Truncation(False, direction), 10**6)


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_tokenize_in_pieces_gives_the_whole_texts_tokens(local_tokenizers, kind, add_special_tokens):
    """`/tokenize` tokenizes a text longer than `TOKENIZE_WINDOW` in pieces, with the same answer."""
    tok = local_tokenizers[kind]
    text = prose(TOKENIZE_WINDOW * 3) + " " + "x" * TOKENIZE_WINDOW + prose(1_000, 3)
    encoding = tok.encode(text, add_special_tokens=add_special_tokens)
    byte_at = np.cumsum([0, *(len(c.encode()) for c in text)])
    expected = [(i, bool(s), None if s else (int(byte_at[a]), int(byte_at[b])))
                for i, s, (a, b) in zip(encoding.ids, encoding.special_tokens_mask, encoding.offsets)]
    got = [(t["id"], t["special"], None if t["special"] else (t["start"], t["stop"]))
           for t in simple_tokens(tok, text, add_special_tokens)]
    assert got == expected


@contextmanager
def peak_growth_mb() -> Iterator[Callable[[], float]]:
    """This process's peak RSS growth (MB) while the block runs: the kernel's high-water mark,
    reset first. The gateway under test runs in a thread of this process."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")

    def kb(field: str) -> int:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field))
        return int(line.split()[1])

    before = kb("VmRSS:")
    peak: list[float] = []
    yield lambda: peak[0]
    peak.append((kb("VmHWM:") - before) / 1024)


@pytest.mark.triton
def test_tokenize_and_decode_obey_the_batch_limit(gateway_on):
    url = gateway_on()
    embed = httpx.post(f"{url}/embed", json={"inputs": ["text"] * 10_000}, timeout=30)
    assert embed.status_code == 422 and "10000" in embed.json()["error"]
    for route, body in (("/tokenize", {"inputs": ["text"] * 10_000}), ("/decode", {"ids": [[101, 102]] * 10_000})):
        refused = httpx.post(f"{url}{route}", json=body, timeout=30)
        assert (refused.status_code, error_of(refused)) == (422, error_of(embed)), route
    assert len(httpx.post(f"{url}/tokenize", json={"inputs": ["text"] * 32}).json()) == 32
    assert len(httpx.post(f"{url}/decode", json={"ids": [[101, 102]] * 32}).json()) == 32
    assert httpx.post(f"{url}/tokenize", json={"inputs": []}).status_code == 400
    assert httpx.post(f"{url}/tokenize", json={"inputs": ""}).status_code == 200  # an empty text has tokens too


@pytest.mark.triton
def test_tokenize_and_decode_past_their_token_bound_are_413_before_the_work(gateway_on):
    """By default a /tokenize may hold a full batch of full-length texts (32 x MiniLM's 256 tokens):
    1.9 MB of prose is refused at once, naming the bound; /decode counts its ids the same way."""
    url = gateway_on()
    limit = 32 * 256
    body = orjson.dumps({"inputs": [prose(55_000, i) for i in range(32)]})
    started = time.perf_counter()
    refused = httpx.post(f"{url}/tokenize", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert refused.status_code == 413 and f"at most {limit} tokens" in refused.text, refused.text[:300]
    assert time.perf_counter() - started < 2
    just_past = httpx.post(f"{url}/tokenize", json={"inputs": ["word " * 260] * 32}, timeout=60)  # 32 x 262 tokens
    assert just_past.status_code == 413 and "more (" in just_past.text  # counted while tokenizing
    fits = httpx.post(f"{url}/tokenize", json={"inputs": ["word " * 250] * 32}, timeout=60)
    assert fits.status_code == 200 and sum(map(len, fits.json())) <= limit
    assert httpx.post(f"{url}/decode", json={"ids": [[101] * 300] * 28}, timeout=60).status_code == 413
    assert httpx.post(f"{url}/decode", json={"ids": [[101] * 250] * 32}, timeout=60).status_code == 200
    raised = gateway_on(max_tokenize_tokens=limit * 2)
    assert httpx.post(f"{raised}/tokenize", json={"inputs": ["word " * 260] * 32}, timeout=60).status_code == 200


@pytest.mark.triton
def test_a_large_tokenize_does_not_stall_other_routes(gateway_on):
    url = gateway_on(max_tokenize_tokens=1_000_000)  # a bound raised for 1.9 MB of prose
    body = orjson.dumps({"inputs": [prose(55_000, i) for i in range(32)]})
    assert 1_800_000 < len(body) < 2_000_000
    done: dict[str, object] = {}

    def tokenize() -> None:
        started = time.perf_counter()
        done["response"] = httpx.post(f"{url}/tokenize", content=body, headers={"content-type": "application/json"},
                                      timeout=120)
        done["seconds"] = time.perf_counter() - started

    worker = threading.Thread(target=tokenize)
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/health").status_code == 200
        worker.start()
        time.sleep(0.2)  # the body is sent and the tokenizer busy
        latencies = []
        while worker.is_alive():
            started = time.perf_counter()
            assert client.get("/health").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.05)
    worker.join()
    assert done["response"].status_code == 200 and len(done["response"].json()) == 32
    # A /health stuck behind the tokenize would take the rest of it: most of its time.
    assert latencies and max(latencies) < min(0.5, done["seconds"] / 4), (latencies, done["seconds"])
    assert len(latencies) >= 3, "the tokenize was too quick to prove anything"


QUERY = prose(1_620_000)  # 1.8 MB of UTF-8, under the 2 MB body limit
RERANK_CASES = [("msmarco", 4, "right"), ("msmarco", 4, "left"), ("msmarco", 32, "right"), ("reranker", 32, "right"),
                ("reranker", 4, "left")]


@pytest.mark.triton
@pytest.mark.parametrize(("model", "passages", "direction"), RERANK_CASES)
def test_a_long_rerank_query_costs_one_bounded_tokenization(gateway_on, need, tokenizer, model, passages, direction):
    """A 1.8 MB query under the 2 MB body limit adds little to the gateway, however many passages,
    and scores as the part of it the model reads."""
    need(model)
    url = gateway_on()
    query, texts = QUERY, [PASSAGES[i % 4] + f" ({i})" for i in range(passages)]
    window = httpx.get(f"{url}/info?model={model}").json()["max_input_length"]
    # A piece clearly past the window, short enough that the gateway tokenizes it as it is.
    piece = query[:4000] if direction == "right" else query[-4000:]
    assert len(tokenizer(model).encode(piece, add_special_tokens=False)) > 1.5 * window
    assert len(piece) <= window_chars(window + 1)

    def rerank(text: str) -> list[float]:
        body = orjson.dumps({"query": text, "texts": texts, "truncation_direction": direction, "raw_scores": True})
        response = httpx.post(f"{url}/rerank?model={model}", content=body,
                              headers={"content-type": "application/json"}, timeout=120)
        assert response.status_code == 200, response.text[:300]
        return [rank["score"] for rank in sorted(response.json(), key=lambda rank: rank["index"])]

    expected = rerank(piece)
    with peak_growth_mb() as grown:
        scores = rerank(query)
    np.testing.assert_allclose(scores, expected, atol=1e-6)
    assert grown() < 100, f"the gateway grew by {grown():.0f} MB"


@pytest.mark.triton
def test_a_long_query_refused_untruncated_names_its_length(gateway_on, need, tokenizer):
    """`truncate: false` counts a long query once, in pieces: the error names its true length."""
    need("msmarco")
    url = gateway_on()
    body = orjson.dumps({"query": QUERY, "texts": PASSAGES * 8, "truncate": False})
    with peak_growth_mb() as grown:
        refused = httpx.post(f"{url}/rerank?model=msmarco", content=body, headers={"content-type": "application/json"},
                             timeout=120)
    assert grown() < 100, f"the gateway grew by {grown():.0f} MB"
    tok = tokenizer("msmarco")
    given = (len(tok.encode(QUERY, add_special_tokens=False)) + len(tok.encode(PASSAGES[0], add_special_tokens=False))
             + tok.num_special_tokens_to_add(True))
    assert refused.status_code == 422 and refused.json()["error"].endswith(f"Given: {given}")


@pytest.mark.triton
def test_long_passages_score_as_their_start(gateway_on, need, direct):
    """Long passages beside a short query go to Triton as texts, cut first: the scores are Triton's
    own for the start of each passage."""
    need("msmarco")
    url = gateway_on()
    passages = [prose(55_000, i) + f" {i}" for i in range(8)]
    body = orjson.dumps({"query": "What is the capital of Germany?", "texts": passages, "raw_scores": True})
    response = httpx.post(f"{url}/rerank?model=msmarco", content=body, headers={"content-type": "application/json"},
                          timeout=120)
    assert response.status_code == 200, response.text[:300]
    scores = [rank["score"] for rank in sorted(response.json(), key=lambda rank: rank["index"])]
    expected = direct("msmarco", ["What is the capital of Germany?"] * 8, [p[:4000] for p in passages])["logits"][:, 0]
    np.testing.assert_allclose(scores, expected, atol=1e-5)

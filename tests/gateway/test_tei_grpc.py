"""TEI's gRPC API (`--tei-grpc-port`), through a client built from the checked-in stubs, against the
session's real Triton: every service, unary and streaming, compared with direct Triton calls,
`tokenizers` and the HTTP routes; TEI's status codes and messages; reflection; the API key; the
flag off by default; two workers on one port."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import httpx
import numpy as np
import psutil
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from prensa.addresses import free_port
from prensa.gateway.core.dispatch import SPARE_CALLS
from prensa.gateway.errors import ErrorKind
from prensa.gateway.grpc import tei_pb2 as pb
from prensa.gateway.grpc import tei_pb2_grpc as stubs
from prensa.gateway.grpc.calls import STATUS
from prensa.gateway.settings import GatewaySettings
from prensa.triton.metrics import difference, scrape
from tests.gateway.conftest import running_gateway
from tests.gateway.test_cli import wait_healthy

pytestmark = pytest.mark.triton

TEXTS = ["What is the capital of Germany?", "ok", "Berlin is the capital and largest city of Germany.",
         "Émilie a mangé une pomme à Montréal; 東京は日本の首都です。"]
QUERY = "What is the capital of Germany?"
PASSAGES = ["Berlin is the capital and largest city of Germany.", "Paris is the capital of France.",
            "The quick brown fox jumps over the lazy dog."]
LONG = "Berlin is the capital and largest city of Germany. " * 40  # ~400 minilm tokens, over its 256
SERVICES = {"tei.v1.Info", "tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank", "tei.v1.Tokenize"}


@dataclass
class Tei:
    """A gateway serving TEI's gRPC API: its HTTP client and a channel to its gRPC port."""

    http: httpx.Client
    channel: grpc.Channel
    port: int

    @property
    def info(self) -> stubs.InfoStub:
        return stubs.InfoStub(self.channel)

    @property
    def embed(self) -> stubs.EmbedStub:
        return stubs.EmbedStub(self.channel)

    @property
    def predict(self) -> stubs.PredictStub:
        return stubs.PredictStub(self.channel)

    @property
    def rerank(self) -> stubs.RerankStub:
        return stubs.RerankStub(self.channel)

    @property
    def tokenize(self) -> stubs.TokenizeStub:
        return stubs.TokenizeStub(self.channel)


def model(name: str) -> tuple[tuple[str, str], ...]:
    return (("model", name),)


def serve_grpc(settings: GatewaySettings, **changes: object) -> Iterator[Tei]:
    port = free_port()
    with running_gateway(replace(settings, tei_grpc_port=port, **changes)) as url, \
            httpx.Client(base_url=url, timeout=60) as http, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield Tei(http, channel, port)


@pytest.fixture(scope="module")
def tei(settings) -> Iterator[Tei]:
    yield from serve_grpc(settings)


@pytest.fixture
def start_tei(settings) -> Iterator[Callable[..., Tei]]:
    """Extra gRPC gateways with some settings changed, stopped at the end of the test."""
    started: list[Iterator[Tei]] = []

    def start(**changes: object) -> Tei:
        started.append(serve_grpc(settings, **changes))
        return next(started[-1])

    yield start
    for gateway in started:
        next(gateway, None)


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_every_error_kind_has_a_status():
    assert set(STATUS) == set(ErrorKind)
    assert STATUS[ErrorKind.VALIDATION] == STATUS[ErrorKind.EMPTY] == grpc.StatusCode.INVALID_ARGUMENT
    assert STATUS[ErrorKind.OVERLOADED] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert STATUS[ErrorKind.BACKEND] == STATUS[ErrorKind.TOKENIZER] == grpc.StatusCode.FAILED_PRECONDITION
    assert STATUS[ErrorKind.UNHEALTHY] == grpc.StatusCode.UNAVAILABLE


def test_embed_unary_matches_triton_and_http(tei, direct):
    expected = direct("minilm", TEXTS)
    for row, text in enumerate(TEXTS):
        reply, call = tei.embed.Embed.with_call(pb.EmbedRequest(inputs=text, truncate=True))
        np.testing.assert_allclose(reply.embeddings, expected["dense"][row], atol=1e-6)
        assert reply.metadata.compute_tokens == expected["num_tokens"].reshape(-1)[row]
        assert reply.metadata.compute_chars == len(text)
        assert reply.metadata.total_time_ns >= reply.metadata.inference_time_ns > 0
        headers = dict(call.initial_metadata())
        assert headers["x-compute-tokens"] == str(reply.metadata.compute_tokens)
        assert len(headers["x-request-id"]) == 32
    http = tei.http.post("/embed", json={"inputs": TEXTS[0], "normalize": False, "dimensions": 128}).json()[0]
    raw = tei.embed.Embed(pb.EmbedRequest(inputs=TEXTS[0], normalize=False, dimensions=128))
    np.testing.assert_allclose(raw.embeddings, http, atol=1e-6)
    assert abs(np.linalg.norm(raw.embeddings) - 1) > 1e-3  # not normalised: it is the other answer
    m3 = tei.embed.Embed(pb.EmbedRequest(inputs=TEXTS[2]), metadata=model("bge-m3"))
    np.testing.assert_allclose(m3.embeddings, direct("bge-m3", [TEXTS[2]])["dense"][0], atol=1e-5)


def test_a_call_marked_bulk_is_answered_alike_and_a_wrong_mark_refused(tei, direct):
    bulk = tei.embed.Embed(pb.EmbedRequest(inputs=TEXTS[0]), metadata=(("x-prensa-priority", "bulk"),))
    np.testing.assert_allclose(bulk.embeddings, direct("minilm", TEXTS[:1])["dense"][0], atol=1e-6)
    wrong = refused(lambda: tei.embed.Embed(pb.EmbedRequest(inputs="ok"), metadata=(("x-prensa-priority", "now"),)))
    assert wrong.code() == grpc.StatusCode.INVALID_ARGUMENT and "x-prensa-priority" in wrong.details()


def embed_count(http: httpx.Client) -> float:
    found = re.search(r'^te_request_count\{method="embed"\} ([0-9.e+]+)', http.get("/metrics").text, re.M)
    return float(found[1]) if found else 0.0


def test_embed_stream_answers_in_order_each_message_a_request(tei, direct):
    texts = [f"{TEXTS[i % len(TEXTS)]} {i}" for i in range(45)]  # more than --max-client-batch-size in flight
    before = embed_count(tei.http)
    replies = list(tei.embed.EmbedStream(iter(pb.EmbedRequest(inputs=t, truncate=True) for t in texts)))
    expected = direct("minilm", texts)
    np.testing.assert_allclose([r.embeddings for r in replies], expected["dense"], atol=1e-5)
    assert [r.metadata.compute_tokens for r in replies] == expected["num_tokens"].reshape(-1).tolist()
    assert embed_count(tei.http) == before + 45  # counted as HTTP counts /embed


def test_truncation_is_the_messages_own(tei, direct, tokenizer):
    given = len(tokenizer("minilm").encode(LONG).ids)
    error = refused(lambda: tei.embed.Embed(pb.EmbedRequest(inputs=LONG)))  # proto3: truncate false when unset
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == f"Input validation error: `inputs` must have less than 256 tokens. Given: {given}"
    right = tei.embed.Embed(pb.EmbedRequest(inputs=LONG, truncate=True))
    np.testing.assert_allclose(right.embeddings, direct("minilm", [LONG])["dense"][0], atol=1e-6)
    left = tei.embed.Embed(pb.EmbedRequest(inputs=LONG, truncate=True,
                                           truncation_direction=pb.TRUNCATION_DIRECTION_LEFT))
    http = tei.http.post("/embed", json={"inputs": LONG, "truncation_direction": "left"}).json()[0]
    np.testing.assert_allclose(left.embeddings, http, atol=1e-6)
    assert not np.allclose(left.embeddings, right.embeddings, atol=1e-3)


def test_embed_sparse_unary_and_stream(tei, direct, need):
    need("splade")
    expected = direct("splade", TEXTS[:3])
    unary = [tei.embed.EmbedSparse(pb.EmbedSparseRequest(inputs=t, truncate=True), metadata=model("splade"))
             for t in TEXTS[:3]]
    streamed = list(tei.embed.EmbedSparseStream(iter(pb.EmbedSparseRequest(inputs=t, truncate=True) for t in TEXTS[:3]),
                                                metadata=model("splade")))
    for row, (one, other) in enumerate(zip(unary, streamed)):
        ids = expected["sparse_ids"][row]
        for reply in (one, other):
            assert [v.index for v in reply.sparse_embeddings] == ids[ids >= 0].tolist()
            np.testing.assert_allclose([v.value for v in reply.sparse_embeddings],
                                       expected["sparse_weights"][row][ids >= 0], atol=1e-5)
    m3 = tei.embed.EmbedSparse(pb.EmbedSparseRequest(inputs=TEXTS[0]), metadata=model("bge-m3"))
    m3_ids = direct("bge-m3", [TEXTS[0]])["sparse_ids"][0]
    assert [v.index for v in m3.sparse_embeddings] == m3_ids[m3_ids >= 0].tolist()
    dense_only = refused(lambda: tei.embed.EmbedSparse(pb.EmbedSparseRequest(inputs="ok"), metadata=model("minilm")))
    assert dense_only.code() == grpc.StatusCode.FAILED_PRECONDITION  # minilm has no sparse head


def test_embed_all_pools_to_the_dense_vector(tei, direct, tokenizer):
    """minilm mean-pools its token states and normalises: the tokens' vectors give its dense vector back."""
    replies = [tei.embed.EmbedAll(pb.EmbedAllRequest(inputs=TEXTS[0], truncate=True)),
               *tei.embed.EmbedAllStream(iter([pb.EmbedAllRequest(inputs=TEXTS[0]), pb.EmbedAllRequest(inputs="ok")]))]
    http = tei.http.post("/embed_all", json={"inputs": [TEXTS[0], "ok"]}).json()
    for reply, text, reference in zip(replies[1:], [TEXTS[0], "ok"], http):
        states = np.array([token.embeddings for token in reply.token_embeddings])
        assert states.shape == (len(tokenizer("minilm").encode(text).ids), 384)
        np.testing.assert_allclose(states, reference, atol=1e-5)
        pooled = states.mean(axis=0)
        np.testing.assert_allclose(pooled / np.linalg.norm(pooled), direct("minilm", [text])["dense"][0], atol=1e-5)
    np.testing.assert_allclose([t.embeddings for t in replies[0].token_embeddings],
                               [t.embeddings for t in replies[1].token_embeddings], atol=1e-6)


def test_predict_and_predict_pair(tei, direct, need):
    need("classifier")
    labels = ["negative", "neutral", "positive"]
    classifier = model("classifier")
    single = tei.predict.Predict(pb.PredictRequest(inputs="I love Berlin."), metadata=classifier)
    expected = direct("classifier", ["I love Berlin."])["scores"][0]
    assert [p.label for p in single.predictions] == [labels[i] for i in np.argsort(-expected, kind="stable")]
    np.testing.assert_allclose([p.score for p in single.predictions], np.sort(expected)[::-1], atol=1e-6)
    pair = tei.predict.PredictPair(pb.PredictPairRequest(inputs=["I love Berlin.", "Berlin loves me."], raw_scores=True),
                                   metadata=classifier)
    logits = direct("classifier", ["I love Berlin."], ["Berlin loves me."])["logits"][0]
    np.testing.assert_allclose([p.score for p in pair.predictions], np.sort(logits)[::-1], atol=1e-5)
    lone = tei.predict.PredictPair(pb.PredictPairRequest(inputs=["I love Berlin."]), metadata=classifier)
    assert [p.label for p in lone.predictions] == [p.label for p in single.predictions]
    np.testing.assert_allclose([p.score for p in lone.predictions], np.sort(expected)[::-1], atol=1e-6)
    three = refused(lambda: tei.predict.PredictPair(pb.PredictPairRequest(inputs=["a", "b", "c"]), metadata=classifier))
    assert (three.code(), three.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                               "`inputs` must have a single or two elements. Given: 3")
    texts = ["I love Berlin.", "I hate rain.", "It is Tuesday."]
    streamed = list(tei.predict.PredictStream(iter(pb.PredictRequest(inputs=t) for t in texts), metadata=classifier))
    scores = direct("classifier", texts)["scores"]
    np.testing.assert_allclose([max(p.score for p in r.predictions) for r in streamed], scores.max(axis=1), atol=1e-6)
    pairs = list(tei.predict.PredictPairStream(iter(pb.PredictPairRequest(inputs=[t, "Berlin loves me."]) for t in texts),
                                               metadata=classifier))
    pair_scores = direct("classifier", texts, ["Berlin loves me."] * 3)["scores"]
    np.testing.assert_allclose([sorted(p.score for p in r.predictions) for r in pairs], np.sort(pair_scores), atol=1e-6)


def test_rerank_unary_and_stream(tei, direct, need):
    need("reranker")
    reranker = model("reranker")
    expected = direct("reranker", [QUERY] * 3, PASSAGES)["scores"][:, 0]
    reply = tei.rerank.Rerank(pb.RerankRequest(query=QUERY, texts=PASSAGES, return_text=True), metadata=reranker)
    order = np.argsort(-expected, kind="stable").tolist()
    assert [r.index for r in reply.ranks] == order
    assert [r.text for r in reply.ranks] == [PASSAGES[i] for i in order]
    np.testing.assert_allclose([r.score for r in reply.ranks], expected[order], atol=1e-6)
    http = tei.http.post("/rerank?model=reranker", json={"query": QUERY, "texts": PASSAGES}).json()
    assert [(r["index"], pytest.approx(r["score"], abs=1e-6)) for r in http] == [(r.index, r.score) for r in reply.ranks]
    plain = tei.rerank.Rerank(pb.RerankRequest(query=QUERY, texts=PASSAGES), metadata=reranker)
    assert not any(r.HasField("text") for r in plain.ranks)
    # The stream: raw_scores and return_text are the first message's, whatever the others say.
    messages = [pb.RerankStreamRequest(query=QUERY, text=p, raw_scores=i == 0, return_text=i == 0)
                for i, p in enumerate(PASSAGES)]
    streamed = tei.rerank.RerankStream(iter(messages), metadata=reranker)
    logits = direct("reranker", [QUERY] * 3, PASSAGES)["logits"][:, 0]
    assert [r.index for r in streamed.ranks] == np.argsort(-logits, kind="stable").tolist()
    np.testing.assert_allclose([r.score for r in streamed.ranks], np.sort(logits)[::-1], atol=1e-5)
    assert [r.text for r in streamed.ranks] == [PASSAGES[r.index] for r in streamed.ranks]
    assert streamed.metadata.compute_chars == sum(len(QUERY) + len(p) for p in PASSAGES)


def test_rerank_refusals(tei, need):
    need("reranker")
    reranker = model("reranker")
    empty = refused(lambda: tei.rerank.Rerank(pb.RerankRequest(query=QUERY), metadata=reranker))
    assert (empty.code(), empty.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "`texts` cannot be empty")
    many = refused(lambda: tei.rerank.Rerank(pb.RerankRequest(query=QUERY, texts=["a"] * 33), metadata=reranker))
    assert (many.code(), many.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                             "batch size 33 > maximum allowed batch size 32")
    nothing = refused(lambda: tei.rerank.RerankStream(iter([]), metadata=reranker))
    assert nothing.code() == grpc.StatusCode.INVALID_ARGUMENT
    embedder = refused(lambda: tei.rerank.Rerank(pb.RerankRequest(query=QUERY, texts=PASSAGES), metadata=model("minilm")))
    assert embedder.code() == grpc.StatusCode.FAILED_PRECONDITION
    unknown = refused(lambda: tei.embed.Embed(pb.EmbedRequest(inputs="ok"), metadata=model("no-such-model")))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND


def test_empty_inputs_are_invalid_with_teis_messages(tei):
    for call in (lambda: tei.embed.Embed(pb.EmbedRequest(inputs="")),
                 lambda: tei.embed.EmbedAll(pb.EmbedAllRequest(inputs="")),
                 lambda: tei.tokenize.Tokenize(pb.EncodeRequest(inputs=""))):
        error = refused(call)
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                   "Input validation error: `inputs` cannot be empty")
    ids = refused(lambda: tei.tokenize.Decode(pb.DecodeRequest()))
    assert (ids.code(), ids.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                           "Input validation error: `input_ids` cannot be empty")


def test_a_failed_message_ends_the_stream_after_the_answers_before_it(tei, direct):
    messages = [pb.EmbedRequest(inputs="ok"), pb.EmbedRequest(inputs="dog"), pb.EmbedRequest(inputs="")]
    stream = tei.embed.EmbedStream(iter(messages))
    answers = []
    with pytest.raises(grpc.RpcError) as caught:
        answers.extend(stream)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    np.testing.assert_allclose([a.embeddings for a in answers], direct("minilm", ["ok", "dog"])["dense"], atol=1e-6)


@pytest.mark.parametrize("name", ["minilm", "bge-m3"])
def test_tokenize_and_decode_match_http_and_tokenizers(tei, tokenizer, name):
    tok = tokenizer(name)
    for add_special_tokens in (True, False):
        reply = tei.tokenize.Tokenize(pb.EncodeRequest(inputs=TEXTS[3], add_special_tokens=add_special_tokens),
                                      metadata=model(name))
        http = tei.http.post(f"/tokenize?model={name}",
                             json={"inputs": TEXTS[3], "add_special_tokens": add_special_tokens}).json()[0]
        tokens = [{"id": t.id, "text": t.text, "special": t.special,
                   "start": t.start if t.HasField("start") else None, "stop": t.stop if t.HasField("stop") else None}
                  for t in reply.tokens]
        assert tokens == http
        assert [t.id for t in reply.tokens] == tok.encode(TEXTS[3], add_special_tokens=add_special_tokens).ids
    streamed = list(tei.tokenize.TokenizeStream(iter(pb.EncodeRequest(inputs=t, add_special_tokens=True)
                                                     for t in TEXTS), metadata=model(name)))
    assert [[t.id for t in r.tokens] for r in streamed] == [tok.encode(t).ids for t in TEXTS]
    ids = tok.encode(TEXTS[3]).ids
    for skip in (True, False):
        decoded = tei.tokenize.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=skip), metadata=model(name))
        http = tei.http.post(f"/decode?model={name}", json={"ids": ids, "skip_special_tokens": skip}).json()[0]
        assert decoded.text == http == tok.decode(ids, skip_special_tokens=skip)
    batch = [tok.encode(t).ids for t in TEXTS]
    streamed_text = list(tei.tokenize.DecodeStream(iter(pb.DecodeRequest(ids=i, skip_special_tokens=True) for i in batch),
                                                   metadata=model(name)))
    assert [r.text for r in streamed_text] == tok.decode_batch(batch)
    outside = refused(lambda: tei.tokenize.Decode(pb.DecodeRequest(ids=[10**7]), metadata=model(name)))
    assert outside.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_info_describes_the_model(tei, need):
    info = tei.info.Info(pb.InfoRequest())
    http = tei.http.get("/info").json()
    assert info.model_id == http["model_id"] and info.model_dtype == http["model_dtype"]
    assert info.model_type == pb.MODEL_TYPE_EMBEDDING
    assert (info.max_input_length, info.max_batch_requests) == (256, http["max_batch_requests"])
    assert info.max_batch_tokens == (http["max_batch_tokens"] or 0)
    assert (info.max_concurrent_requests, info.max_client_batch_size) == (512, 32)
    assert info.version == http["version"]
    need("classifier")
    need("reranker")
    assert tei.info.Info(pb.InfoRequest(), metadata=model("classifier")).model_type == pb.MODEL_TYPE_CLASSIFIER
    assert tei.info.Info(pb.InfoRequest(), metadata=model("reranker")).model_type == pb.MODEL_TYPE_RERANKER
    assert tei.info.Info(pb.InfoRequest(), metadata=model("bge-m3")).max_input_length == \
        tei.http.get("/info?model=bge-m3").json()["max_input_length"]


def test_reflection_lists_the_services(tei):
    database = ProtoReflectionDescriptorDatabase(tei.channel)
    assert set(database.get_services()) >= SERVICES
    pool = DescriptorPool(database)
    assert {m.name for m in pool.FindServiceByName("tei.v1.Embed").methods} == {
        "Embed", "EmbedStream", "EmbedSparse", "EmbedSparseStream", "EmbedAll", "EmbedAllStream"}
    assert pool.FindMessageTypeByName("tei.v1.RerankStreamRequest").fields_by_name["return_text"].number == 5


def test_health_service_tells_what_health_tells(tei, start_tei, triton):
    """gRPC's standard health service: SERVING for the server and each TEI service while the
    gateway can answer, NOT_SERVING when its Triton is gone (HTTP /health: 503), NOT_FOUND for a
    service it does not serve; open without the API key."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def check(gateway: Tei, service: str = "", **kwargs: object) -> int:
        return health_pb2_grpc.HealthStub(gateway.channel).Check(
            health_pb2.HealthCheckRequest(service=service), **kwargs).status

    serving = health_pb2.HealthCheckResponse.SERVING
    assert [check(tei, name) for name in ("", *sorted(SERVICES))] == [serving] * (len(SERVICES) + 1)
    assert "grpc.health.v1.Health" in ProtoReflectionDescriptorDatabase(tei.channel).get_services()
    unknown = refused(lambda: check(tei, "tei.v1.Nope"))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    watched = health_pb2_grpc.HealthStub(tei.channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert next(watched).status == serving
    watched.cancel()
    keyed = start_tei(api_key="secret")
    assert check(keyed) == serving  # no key needed
    nowhere = start_tei(triton_url=f"127.0.0.1:{free_port()}")
    assert nowhere.http.get("/health").status_code == 503
    assert check(nowhere) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert check(nowhere, "tei.v1.Embed") == health_pb2.HealthCheckResponse.NOT_SERVING


def test_overload_is_resource_exhausted(start_tei, need):
    need("reranker")
    small = start_tei(max_concurrent_requests=1)
    error = refused(lambda: small.rerank.Rerank(pb.RerankRequest(query=QUERY, texts=PASSAGES[:2]), metadata=model("reranker")))
    assert (error.code(), error.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "Model is overloaded")
    assert len(small.embed.Embed(pb.EmbedRequest(inputs="ok")).embeddings) == 384  # one input fits


def test_refused_streams_reach_the_client_with_the_gateways_code(start_tei):
    """Many streams past the permits, each still writing when refused: every refusal reaches the
    client as RESOURCE_EXHAUSTED, the code the gateway chose, never INTERNAL."""
    small = start_tei(max_concurrent_requests=4)

    async def flood() -> Counter[str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{small.port}") as channel:
            stub = stubs.EmbedStub(channel)

            async def stream() -> str:
                try:
                    async for _ in stub.EmbedStream(iter([pb.EmbedRequest(inputs=LONG, truncate=True)] * 32),
                                                    timeout=120):
                        pass
                    return "OK"
                except grpc.aio.AioRpcError as error:
                    return f"{error.code().name}: {error.details()}"

            return Counter(await asyncio.gather(*[stream() for _ in range(120)]))

    codes = asyncio.run(flood())
    assert codes["RESOURCE_EXHAUSTED: Model is overloaded"] > 0, codes
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED: Model is overloaded"}, codes


# The calls of the flood's model that Triton may finish while a canary waits: the window's calls ahead
# of it (one per encoder instance, and the spare) and the one it leaves in, with room to spare for a
# call that finishes between the scrape and the canary's arrival. First come, first served, it waits
# behind the flood's queued rows: dozens of full calls.
CANARY_CALLS = 2 * (1 + SPARE_CALLS) + 2


def test_a_canary_is_answered_in_bounded_time_beside_a_stream_flood(start_tei, triton):
    """With the defaults (no --max-queue-time), 128 streams of long inputs admitted in thousands on one
    connection, and a small call from another client is answered in its turn, never left waiting
    behind the flood (the issue's canary saw gaps of 17 s). Its wait is counted in the encoder's
    executions that Triton finishes meanwhile, not in seconds: on a loaded 2-core machine a full
    call's time varies threefold, the queue's order does not."""
    flooded = start_tei(max_concurrent_requests=4096)
    stop = threading.Event()

    async def flood() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{flooded.port}") as channel:
            stub = stubs.EmbedStub(channel)

            async def stream() -> None:
                while True:
                    with suppress(grpc.aio.AioRpcError):
                        async for _ in stub.EmbedStream(iter([pb.EmbedRequest(inputs=LONG, truncate=True)] * 16),
                                                        timeout=60):
                            pass

            streams = [asyncio.ensure_future(stream()) for _ in range(128)]
            await asyncio.to_thread(stop.wait)
            for each in streams:  # hung up: what waits in the gateway leaves, as a client's going does
                each.cancel()
            await asyncio.gather(*streams, return_exceptions=True)

    flooding = threading.Thread(target=asyncio.run, args=(flood(),), daemon=True)
    flooding.start()
    time.sleep(3)  # the flood fills the permits and the queue
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own
    outcomes = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{flooded.port}", options=own) as channel:
            canary = stubs.EmbedStub(channel)
            for _ in range(3):  # each waits out about three full calls of long inputs: seconds here
                before = scrape(triton.metrics_url)
                try:
                    canary.Embed(pb.EmbedRequest(inputs="ok"), timeout=120)  # far past any bounded wait
                    code = "OK"
                except grpc.RpcError as error:
                    code = error.code().name
                calls = difference(scrape(triton.metrics_url), before)["minilm_encode"].executions
                outcomes.append((code, calls))
                time.sleep(0.2)
    finally:
        stop.set()
        flooding.join(90)
    assert {code for code, _ in outcomes} == {"OK"}, outcomes
    assert max(calls for _, calls in outcomes) <= CANARY_CALLS, outcomes


def test_connections_past_the_cap_are_refused(start_tei):
    """--max-grpc-connections bounds the port's connections: past it a new connection is closed
    before its first call, and the place frees when a client leaves."""
    capped = start_tei(max_grpc_connections=1)
    assert len(capped.embed.Embed(pb.EmbedRequest(inputs="ok")).embeddings) == 384  # its channel holds the one place
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own, not the first channel's
    with grpc.insecure_channel(f"127.0.0.1:{capped.port}", options=own) as second:
        error = refused(lambda: stubs.EmbedStub(second).Embed(pb.EmbedRequest(inputs="ok"), timeout=10))
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    capped.channel.close()
    with grpc.insecure_channel(f"127.0.0.1:{capped.port}", options=own) as third:
        reply = stubs.EmbedStub(third).Embed(pb.EmbedRequest(inputs="ok"), timeout=20, wait_for_ready=True)
        assert len(reply.embeddings) == 384


def test_api_key_is_required(start_tei, direct):
    keyed = start_tei(api_key="secret")
    for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", "secret"),)):
        error = refused(lambda m=metadata: keyed.embed.Embed(pb.EmbedRequest(inputs="ok"), metadata=m))
        assert (error.code(), error.details()) == (grpc.StatusCode.UNAUTHENTICATED, "No valid auth token")
    stream = refused(lambda: list(keyed.embed.EmbedStream(iter([pb.EmbedRequest(inputs="ok")]))))
    assert stream.code() == grpc.StatusCode.UNAUTHENTICATED
    good = keyed.embed.Embed(pb.EmbedRequest(inputs="ok"), metadata=(("authorization", "Bearer secret"),))
    np.testing.assert_allclose(good.embeddings, direct("minilm", ["ok"])["dense"][0], atol=1e-6)
    assert set(ProtoReflectionDescriptorDatabase(keyed.channel).get_services()) >= SERVICES  # open, as TEI's


def listening_ports(process: psutil.Process | None = None) -> set[int]:
    """The TCP ports `process` (this one by default) listens on."""
    found = (process or psutil.Process()).net_connections("tcp")
    return {c.laddr.port for c in found if c.status == psutil.CONN_LISTEN}


def test_the_flag_is_off_by_default(settings):
    assert GatewaySettings().tei_grpc_port is None
    before = listening_ports()
    with running_gateway(settings) as url:
        opened = listening_ports() - before
    assert opened == {int(url.rsplit(":", 1)[1])}  # its HTTP port alone
    port = free_port()
    with running_gateway(replace(settings, tei_grpc_port=port)) as url:
        opened = listening_ports() - before
    assert opened == {int(url.rsplit(":", 1)[1]), port}  # the same check sees a gRPC port when there is one


def test_a_taken_port_stops_the_start(settings):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(AssertionError, match="did not start"), \
                running_gateway(replace(settings, tei_grpc_port=taken.getsockname()[1])):
            pass


def test_two_workers_serve_grpc_on_one_port(triton, direct, tmp_path):
    """Each worker binds the gRPC port (SO_REUSEPORT): both listen on it, and new connections are answered."""
    port, grpc_port = free_port(), free_port()
    with (tmp_path / "gateway.log").open("wb") as stderr:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "prensa"), "gateway", "--triton-url", triton.grpc_url, "--repo",
             str(triton.options.repo), "--port", str(port), "--default-model", "minilm"],
            stdout=subprocess.DEVNULL, stderr=stderr,
            env={**os.environ, "PRENSA_WORKERS": "2", "PRENSA_TEI_GRPC_PORT": str(grpc_port)})
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}")  # one worker may still be starting: wait for both
        deadline = time.monotonic() + 60
        while len(listening := [w for w in psutil.Process(process.pid).children()
                                if grpc_port in listening_ports(w)]) < 2:
            assert time.monotonic() < deadline, f"workers listening on the gRPC port: {listening}"
            time.sleep(0.2)
        answers = []
        for _ in range(8):  # a channel each: new connections, spread by the kernel
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                answers.append(stubs.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="dog")).embeddings)
        np.testing.assert_allclose(answers, direct("minilm", ["dog"] * 8)["dense"], atol=1e-5)
    finally:
        process.terminate()
        process.wait(timeout=30)


def silent(port: int, count: int) -> list[socket.socket]:
    """`count` TCP connections to `port` that never send a byte (no HTTP/2 preface)."""
    return [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes `sock` within `within_s` (what it sends first, its SETTINGS, read)."""
    deadline = time.monotonic() + within_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if sock.recv(4096) == b"":
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return False


def test_a_connection_that_never_speaks_is_closed_at_the_handshake_deadline(start_tei):
    gateway = start_tei(grpc_handshake_timeout_s=1.0)
    [sock] = silent(gateway.port, 1)
    started = time.monotonic()
    try:
        assert closed_by_server(sock, 15.0), "the server kept a preface-less connection"
    finally:
        sock.close()
    assert time.monotonic() - started < 10.0


def test_a_fresh_client_is_served_while_silent_connections_fill_the_http_cap(start_tei):
    """Silent gRPC connections count against the port's own budget, not --max-connections: past
    HTTP's cap of 50, a fresh gRPC client and a fresh HTTP client are both served at once."""
    gateway = start_tei(max_connections=50)
    held = silent(gateway.port, 60)
    try:
        own = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(f"127.0.0.1:{gateway.port}", options=own) as fresh:
            reply = stubs.EmbedStub(fresh).Embed(pb.EmbedRequest(inputs="ok"), timeout=10)
        assert len(reply.embeddings) == 384
        assert gateway.http.post("/embed", json={"inputs": "ok"}).status_code == 200
    finally:
        for sock in held:
            sock.close()


def test_silent_connections_give_their_places_back_at_the_deadline(start_tei):
    """With the port's own cap full of connections that never speak, a fresh client is refused,
    then served once the handshake deadline has closed them."""
    gateway = start_tei(max_grpc_connections=5, grpc_handshake_timeout_s=2.0)
    held = silent(gateway.port, 5)
    try:
        own = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(f"127.0.0.1:{gateway.port}", options=own) as fresh:
            started = time.monotonic()
            reply = stubs.EmbedStub(fresh).Embed(pb.EmbedRequest(inputs="ok"), timeout=30, wait_for_ready=True)
            assert len(reply.embeddings) == 384 and time.monotonic() - started < 25
        assert all(closed_by_server(sock, 5.0) for sock in held)
    finally:
        for sock in held:
            sock.close()


def test_two_keys_are_no_key(start_tei):
    """Two authorization entries are ambiguous, whichever comes first: refused, as HTTP refuses two
    Authorization headers."""
    keyed = start_tei(api_key="secret")
    for pair in ((("authorization", "Bearer secret"), ("authorization", "Bearer wrong")),
                 (("authorization", "Bearer wrong"), ("authorization", "Bearer secret")),
                 (("authorization", "Bearer secret"), ("authorization", "Bearer secret"))):
        error = refused(lambda m=pair: keyed.embed.Embed(pb.EmbedRequest(inputs="ok"), metadata=m))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    twice = [(b"authorization", b"Bearer secret"), (b"authorization", b"Bearer secret")]
    answer = keyed.http.post("/embed", json={"inputs": "ok"}, headers=twice)
    assert answer.status_code == 401
    assert keyed.http.post("/embed", json={"inputs": "ok"}, headers={"authorization": "Bearer secret"}).status_code == 200


def raw_embed(channel: grpc.Channel, body: bytes, metadata=()) -> grpc.RpcError:
    """Embed called with `body` as the request message's bytes, whatever they hold."""
    call = channel.unary_unary("/tei.v1.Embed/Embed", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    return refused(lambda: call(body, metadata=metadata, timeout=10))


def test_a_message_that_does_not_parse_is_invalid_after_the_key(start_tei):
    keyed = start_tei(api_key="secret")
    bad_utf8 = b"\x0a\x02\xff\xfe"  # field 1 (inputs, a string): two bytes that are not UTF-8
    assert raw_embed(keyed.channel, bad_utf8).code() == grpc.StatusCode.UNAUTHENTICATED
    error = raw_embed(keyed.channel, bad_utf8, (("authorization", "Bearer secret"),))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "does not parse" in error.details()
    # a well-formed message still goes through
    good = pb.EmbedRequest(inputs="ok").SerializeToString()
    call = keyed.channel.unary_unary("/tei.v1.Embed/Embed", request_serializer=lambda b: b,
                                     response_deserializer=pb.EmbedResponse.FromString)
    assert len(call(good, metadata=(("authorization", "Bearer secret"),)).embeddings) == 384


def test_the_connection_bounds_are_printed_at_start(settings, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="prensa.gateway")
    for _ in serve_grpc(settings, grpc_handshake_timeout_s=7.0, grpc_idle_timeout_s=90.0):
        break
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("TEI gRPC connections"))
    assert "7 s to handshake" in line and "closed after 90 s idle" in line

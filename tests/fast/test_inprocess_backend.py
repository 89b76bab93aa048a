"""`InProcessBackend` as the gateway's `Backend`: states, configs, Triton's checks and errors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from prensa.gateway.backends.base import READY, Backend
from prensa.gateway.backends.local import InProcessBackend
from prensa.gateway.backends.replicas import ReplicaPool
from prensa.gateway.backends.triton import TritonClient
from prensa.gateway.errors import ErrorKind, GatewayError
from prensa.stages import contract
from prensa.tensors import texts_tensor
from tests.fast.conftest import FUSED, MODELS


@pytest.fixture(scope="module")
def backend(served):
    backend = InProcessBackend(served.repo)
    yield backend
    asyncio.run(backend.close())


def run(call):
    return asyncio.run(call)


def test_every_rendered_model_is_ready(backend):
    states = run(backend.model_states())
    assert {name for name in states if "_" not in name} == {*MODELS, *FUSED}
    assert all(state == (READY, "") for state in states.values()), states
    assert run(backend.unready(["embed", "embed_encode", "gone"])) == ["gone"]
    config = run(backend.config("embed"))
    assert config.platform == "ensemble" and [s.model_name for s in config.ensemble_scheduling.step] == [
        "embed_tokenize", "embed_encode", "embed_pool"]


def test_the_implementations_share_the_interface():
    for implementation in (TritonClient, ReplicaPool, InProcessBackend):
        for name in ("infer", "model_states", "config", "unready", "start_probing", "close", "url", "replica_count"):
            assert hasattr(implementation, name) or name == "url", (implementation, name)
    assert set(Backend.__dict__) >= {"infer", "model_states", "config", "unready", "start_probing", "close"}


def test_ensemble_fused_and_stage_calls_agree(backend, oracle):
    texts = ["the quick brown fox", "paris is the capital of france"]
    want = oracle("embed")(texts)
    outputs = [contract.DENSE, contract.NUM_TOKENS]
    for model in ("embed", "embed-fused"):
        got = run(backend.infer(model, {contract.TEXT: texts_tensor(texts)}, outputs))
        np.testing.assert_allclose(got[contract.DENSE], want[contract.DENSE], atol=1e-6)
        np.testing.assert_array_equal(got[contract.NUM_TOKENS], want[contract.NUM_TOKENS])
    tokens = oracle("embed").tokens(texts)
    encoded = run(backend.infer("embed_encode", tokens, [contract.LAST_HIDDEN_STATE]))
    pooled = run(backend.infer("embed_pool", {contract.INPUT_IDS: tokens[contract.INPUT_IDS],
                                              contract.ATTENTION_MASK: tokens[contract.ATTENTION_MASK], **encoded},
                               outputs))
    np.testing.assert_allclose(pooled[contract.DENSE], want[contract.DENSE], atol=1e-6)
    hidden = run(backend.infer("embed-fused", tokens, [contract.LAST_HIDDEN_STATE]))
    np.testing.assert_allclose(hidden[contract.LAST_HIDDEN_STATE], encoded[contract.LAST_HIDDEN_STATE], atol=1e-6)


@pytest.mark.parametrize("model, inputs, outputs, message", [
    ("nope", {contract.TEXT: texts_tensor(["x"])}, [contract.DENSE], "unknown model: 'nope'"),
    ("embed", {"texts": texts_tensor(["x"])}, [contract.DENSE], "unexpected inference input 'texts'"),
    ("embed", {contract.TEXT: texts_tensor(["x"])}, ["vectors"], "unexpected inference output 'vectors'"),
    ("embed", {contract.TEXT: texts_tensor(["x"] * 65)}, [contract.DENSE], "batch-size must be <= 64"),
    ("rerank", {contract.TEXT: texts_tensor(["q"])}, [contract.SCORES], "missing required input(s) ['text_pair']"),
    # the tokenize stage's own ValueError, through the ensemble, as Triton words it
    ("rerank", {contract.TEXT: texts_tensor(["q"]), contract.TEXT_PAIR: texts_tensor(["a", "b"])}, [contract.SCORES],
     "in ensemble 'rerank', invalid input: text_pair has 2 rows, text has 1"),
])
def test_refusals_are_backend_errors(backend, model, inputs, outputs, message):
    with pytest.raises(GatewayError) as caught:
        run(backend.infer(model, inputs, outputs))
    assert caught.value.kind is ErrorKind.BACKEND and message in caught.value.message, caught.value.message
    assert caught.value.message.startswith("Backend error: ")

"""A stage that raises fails only the request that makes it raise: the encoder retries a failing
sub-batch request by request, in memory and in a real Triton (where requests share an `execute`),
the pool stage pools request by request, and the gateway reports the failure as 424 with the
reason while its neighbours get their vectors."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from prensa.stages import load_stage
from tests.reliability.conftest import assert_no_leak

encode = load_stage("encode")
POISON = 10**6  # past every vocabulary here
pytestmark = pytest.mark.triton


class PoisonableSession:
    """onnxruntime's shape: fails like a Gather on an out-of-range id, else echoes ids as features."""

    def get_inputs(self):
        return [type("I", (), {"name": n})() for n in ("input_ids", "attention_mask")]

    def get_outputs(self):
        return [type("O", (), {"name": "last_hidden_state"})()]

    def run(self, names, feed, options=None):
        if (feed["input_ids"] >= POISON).any():
            raise RuntimeError("indices element out of data bounds")
        return [feed["input_ids"][..., None].astype(np.float32)]


def request(rows: list[list[int]]) -> dict[str, np.ndarray]:
    width = max(map(len, rows))
    ids, mask = np.zeros((len(rows), width), dtype=np.int64), np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def test_encoder_isolates_the_failing_request():
    encoder = encode.TokenBudgetEncoder(PoisonableSession(), pad_id=0, max_batch_tokens=4096, length_ratio=4.0,
                                        max_rows=64, per_token_outputs={"last_hidden_state"})
    good = [request([[5, 6, 7], [8, 9]]), request([[10, 11, 12, 13]])]
    bad = request([[14, POISON, 15], [16, 17]])  # its second row is fine, but the request fails as a whole
    results = encoder.encode_each([good[0], bad, good[1]])
    assert isinstance(results[1], RuntimeError) and "out of data bounds" in str(results[1])
    alone = encoder.encode_each(good)
    for got, want in zip((results[0], results[2]), alone):
        np.testing.assert_array_equal(got["last_hidden_state"], want["last_hidden_state"])
    with pytest.raises(RuntimeError, match="out of data bounds"):
        encoder.encode([good[0], bad])  # the all-or-nothing call keeps raising


class FakeBackendUtils:
    """The slice of `triton_python_backend_utils` the pool stage's `execute` uses."""

    class Tensor:
        def __init__(self, name: str, value: np.ndarray) -> None:
            self.name, self.value = name, value

        def as_numpy(self) -> np.ndarray:
            return self.value

    class TritonError:
        def __init__(self, message: str) -> None:
            self.message = message

    class InferenceResponse:
        def __init__(self, output_tensors: list | None = None, error: object = None) -> None:
            self.outputs = {t.name: t.value for t in output_tensors or []}
            self.error = error

    @staticmethod
    def get_input_tensor_by_name(request: dict[str, np.ndarray], name: str):
        return FakeBackendUtils.Tensor(name, request[name]) if name in request else None


def test_pool_stage_fails_only_the_request_that_raises(monkeypatch):
    pool = load_stage("pool")
    monkeypatch.setattr(pool, "pb_utils", FakeBackendUtils)
    model = pool.TritonPythonModel()
    model.initialize({"model_config": '{"parameters": {"pooling": {"string_value": "mean"}}}'})
    rng = np.random.default_rng(0)
    good = {"input_ids": np.ones((2, 4), dtype=np.int64), "attention_mask": np.ones((2, 4), dtype=np.int64),
            "last_hidden_state": rng.normal(size=(2, 4, 8)).astype(np.float32)}
    bad = {**good, "last_hidden_state": rng.normal(size=(2, 3, 8)).astype(np.float32)}  # 3 tokens, mask of 4
    responses = model.execute([good, bad, good])
    assert responses[1].error is not None and responses[1].error.message.startswith("pooling failed: ")
    expected = pool.pool_request(good, "mean", True, np.zeros(0, dtype=np.int64), "sigmoid")["dense"]
    for response in (responses[0], responses[2]):
        assert response.error is None
        np.testing.assert_allclose(response.outputs["dense"], expected)


def encoder_inputs(rows: list[list[int]]) -> list[grpcclient.InferInput]:
    tensors = []
    for name, array in request(rows).items():
        tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def encoder_counts(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model).model_stats[0]
    return stats.inference_count, stats.execution_count


def test_poisoned_request_shares_an_execute_and_fails_alone(triton):
    """Long requests keep every `minilm_encode` instance busy while a poisoned request and good ones
    queue; the dynamic batcher then hands them over in the same `execute`."""
    model = "minilm_encode"
    rng = np.random.default_rng(0)
    blocker = rng.integers(1000, 20000, size=(64, 256)).tolist()
    goods = [rng.integers(1000, 20000, size=n).tolist() for n in (7, 12, 30, 9)]
    sync = grpcclient.InferenceServerClient(triton.grpc_url)
    instances = sum(group.count for group in sync.get_model_config(model).config.instance_group)
    expected = [sync.infer(model, encoder_inputs([g])).as_numpy("last_hidden_state") for g in goods]
    before = encoder_counts(sync, model)

    async def mixed() -> list[np.ndarray | Exception]:
        client = grpcaio.InferenceServerClient(triton.grpc_url)
        try:
            busy = [asyncio.ensure_future(client.infer(model, encoder_inputs(blocker))) for _ in range(instances)]
            await asyncio.sleep(0.2)  # the blockers are executing; what follows queues behind them
            calls = [client.infer(model, encoder_inputs([rows])) for rows in (goods[0], [101, POISON, 102], *goods[1:])]
            results = await asyncio.gather(*calls, return_exceptions=True)
            await asyncio.gather(*busy)
        finally:
            await client.close()
        return [r if isinstance(r, Exception) else r.as_numpy("last_hidden_state") for r in results]

    results = asyncio.run(mixed())
    inferences, executions = (a - b for a, b in zip(encoder_counts(sync, model), before))
    assert executions < inferences - 1, "the queued requests did not share an execute"
    poisoned = results.pop(1)
    assert isinstance(poisoned, InferenceServerException) and "encoder failed" in poisoned.message()
    for got, want in zip(results, expected):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_gateway_answers_424_with_the_reason_and_neighbours_succeed(gateway_on, tmp_path, triton):
    """Without tokenizer files the gateway cannot check the vocabulary, so the id reaches the stage."""
    url = gateway_on(repo=tmp_path)
    texts = [f"neighbour sentence {i} about rivers" for i in range(6)]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            calls = [client.post("/embed", json={"inputs": [[101, POISON, 102]]})]
            calls += [client.post("/embed", json={"inputs": text}) for text in texts]
            return await asyncio.gather(*calls)

    poisoned, *neighbours = asyncio.run(burst())
    assert poisoned.status_code == 424, poisoned.text
    body = poisoned.json()
    assert body["error_type"] == "Backend" and "encoder failed" in body["error"] and "out of" in body["error"]
    assert_no_leak(poisoned.content, triton.options.repo)
    assert [r.status_code for r in neighbours] == [200] * len(texts)
    quiet = httpx.post(f"{url}/embed", json={"inputs": texts}, timeout=30).json()
    np.testing.assert_allclose([r.json()[0] for r in neighbours], quiet, atol=1e-5)

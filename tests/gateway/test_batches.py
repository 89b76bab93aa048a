"""OpenAI's Files and Batch APIs through the openai SDK against a gateway with a data directory:
every line answered as the same request sent online is, failed lines in the error file, invalid
input refused as OpenAI refuses it, cancelling, and a job that resumes in a new gateway."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import cohere
import numpy as np
import openai
import pytest

from prensa.gateway.jobs.store import JobStore
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.triton

TEXTS = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "  spaced  ", "東京は日本の首都です。"]
PASSAGES = ["Berlin is the capital and largest city of Germany.", "The quick brown fox jumps over the lazy dog."]


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def finished(client: openai.OpenAI, batch_id: str, timeout_s: float = 120) -> openai.types.Batch:
    deadline = time.monotonic() + timeout_s
    while (batch := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(0.2)
    return batch


def without_id(body: dict) -> dict:
    return {key: value for key, value in body.items() if key != "request_id"}


def lines_of(client: openai.OpenAI, file_id: str | None) -> dict[str, dict]:
    """The output or error file's lines by custom_id, each custom_id once."""
    assert file_id is not None
    rows = [json.loads(line) for line in client.files.content(file_id).text.splitlines()]
    by_id = {row["custom_id"]: row for row in rows}
    assert len(by_id) == len(rows), "a custom_id appears twice"
    return by_id


@pytest.fixture
def data_gateway(settings, tmp_path):
    with running_gateway(replace(settings, data_dir=tmp_path / "data")) as url:
        yield url


def test_a_batch_of_embeddings_answers_as_online_requests_do(data_gateway):
    client = openai.OpenAI(base_url=f"{data_gateway}/v1", api_key="unused")
    lines = [{"custom_id": f"text-{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "minilm", "input": text}} for i, text in enumerate(TEXTS)]
    lines.append({"custom_id": "empty", "method": "POST", "url": "/v1/embeddings", "body": {"model": "minilm", "input": ""}})
    uploaded = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    assert (uploaded.object, uploaded.purpose, uploaded.bytes) == ("file", "batch", len(jsonl(lines)))
    assert client.files.retrieve(uploaded.id).filename == "requests.jsonl"
    assert client.files.content(uploaded.id).content == jsonl(lines)
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h",
                                    metadata={"job": "nightly"})
    assert created.status == "validating" and created.metadata == {"job": "nightly"}
    batch = finished(client, created.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (5, 4, 1)
    assert batch.completed_at >= batch.in_progress_at >= batch.created_at
    output = lines_of(client, batch.output_file_id)
    assert set(output) == {f"text-{i}" for i in range(len(TEXTS))}
    for i, text in enumerate(TEXTS):
        online = client.embeddings.create(model="minilm", input=text).data[0].embedding
        response = output[f"text-{i}"]["response"]
        assert response["status_code"] == 200 and response["request_id"]
        np.testing.assert_allclose(response["body"]["data"][0]["embedding"], online, atol=1e-6)
    failed = lines_of(client, batch.error_file_id)["empty"]["response"]
    with pytest.raises(openai.APIStatusError) as refused:
        client.embeddings.create(model="minilm", input="")
    assert failed["status_code"] == refused.value.status_code
    assert without_id(failed["body"]) == without_id(refused.value.body)
    assert [one.id for one in client.batches.list()] == [batch.id]
    assert {one.id for one in client.files.list()} == {uploaded.id, batch.output_file_id, batch.error_file_id}
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError, match="No such File object"):
        client.files.retrieve(uploaded.id)


def test_rerank_lines_answer_as_the_cohere_client_online(data_gateway):
    client = openai.OpenAI(base_url=f"{data_gateway}/v1", api_key="unused")
    body = {"model": "reranker", "query": "What is the capital of Germany?", "documents": PASSAGES}
    uploaded = client.files.create(file=("rerank.jsonl", jsonl([{"custom_id": "q", "method": "POST",
                                                               "url": "/v1/rerank", "body": body}])), purpose="batch")
    batch = finished(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/rerank",
                                                   completion_window="24h").id)
    answer = lines_of(client, batch.output_file_id)["q"]["response"]["body"]
    online = cohere.ClientV2(api_key="unused", base_url=data_gateway).rerank(**body)
    assert [r["index"] for r in answer["results"]] == [r.index for r in online.results]
    assert [r["relevance_score"] for r in answer["results"]] == pytest.approx([r.relevance_score for r in online.results])



def test_litellms_batch_calls_run_against_a_custom_openai_base_url(data_gateway, monkeypatch):
    """LiteLLM's own file and batch functions, as its users call them for an OpenAI-compatible server."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its bundled price table, not a download
    import litellm

    where = {"custom_llm_provider": "openai", "api_base": f"{data_gateway}/v1", "api_key": "unused"}
    lines = [{"custom_id": f"t{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": "minilm", "input": text}}
             for i, text in enumerate(TEXTS[:2])]
    uploaded = litellm.create_file(file=("lines.jsonl", jsonl(lines)), purpose="batch", **where)
    created = litellm.create_batch(completion_window="24h", endpoint="/v1/embeddings", input_file_id=uploaded.id, **where)
    deadline = time.monotonic() + 120
    while (batch := litellm.retrieve_batch(created.id, **where)).status != "completed":
        assert batch.status in ("validating", "in_progress", "finalizing") and time.monotonic() < deadline, batch
        time.sleep(0.2)
    content = litellm.file_content(file_id=batch.output_file_id, **where)
    rows = {row["custom_id"]: row for row in map(json.loads, content.text.splitlines())}
    client = openai.OpenAI(base_url=f"{data_gateway}/v1", api_key="unused")
    for i, text in enumerate(TEXTS[:2]):
        online = client.embeddings.create(model="minilm", input=text).data[0].embedding
        np.testing.assert_allclose(rows[f"t{i}"]["response"]["body"]["data"][0]["embedding"], online, atol=1e-6)


def test_input_openai_would_refuse_fails_the_batch_naming_each_line(data_gateway):
    client = openai.OpenAI(base_url=f"{data_gateway}/v1", api_key="unused")
    good = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}
    lines = jsonl([good, {**good, "custom_id": "b", "url": "/embed"}, good]) + b"not json\n"
    uploaded = client.files.create(file=("bad.jsonl", lines), purpose="batch")
    batch = finished(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                                                   completion_window="24h").id)
    assert batch.status == "failed" and batch.output_file_id is None
    errors = {(error.line, error.code): error.message for error in batch.errors.data}
    assert "every line of this batch posts to '/v1/embeddings'" in errors[(2, "invalid_request")]
    assert "used by an earlier line" in errors[(3, "invalid_request")]
    assert "not JSON" in errors[(4, "invalid_request")]
    with pytest.raises(openai.BadRequestError, match="a batch posts to one of"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError, match="No such File object"):
        client.batches.create(input_file_id="file-none", endpoint="/v1/embeddings", completion_window="24h")


def test_a_job_resumes_in_the_next_gateway_with_every_line_once(settings, tmp_path):
    """The gateway stops mid-job (the lines in flight are lost with it); a gateway started on the same
    data directory takes the job up, and each custom_id is answered once."""
    data = tmp_path / "data"
    lines = [{"custom_id": f"n-{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "minilm", "input": f"text number {i} " * 20}} for i in range(600)]
    with running_gateway(replace(settings, data_dir=data)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        uploaded = client.files.create(file=("many.jsonl", jsonl(lines)), purpose="batch")
        batch_id = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id
        deadline = time.monotonic() + 60
        while client.batches.retrieve(batch_id).request_counts.completed < 50:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    stopped = JobStore(data).job(batch_id)
    assert stopped is not None and stopped.status == "in_progress" and stopped.completed < len(lines), stopped
    with running_gateway(replace(settings, data_dir=data)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        batch = finished(client, batch_id)
        assert batch.status == "completed" and batch.request_counts.completed == len(lines)
        output = lines_of(client, batch.output_file_id)
        assert set(output) == {line["custom_id"] for line in lines}
        online = client.embeddings.create(model="minilm", input=lines[-1]["body"]["input"]).data[0].embedding
        np.testing.assert_allclose(output["n-599"]["response"]["body"]["data"][0]["embedding"], online, atol=1e-6)


def test_a_cancelled_batch_keeps_what_was_answered(data_gateway):
    client = openai.OpenAI(base_url=f"{data_gateway}/v1", api_key="unused")
    lines = [{"custom_id": f"n-{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "minilm", "input": f"text {i} " * 30}} for i in range(2000)]
    uploaded = client.files.create(file=("many.jsonl", jsonl(lines)), purpose="batch")
    batch_id = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id
    while client.batches.retrieve(batch_id).request_counts.completed < 10:
        time.sleep(0.05)
    assert client.batches.cancel(batch_id).status == "cancelling"
    batch = finished(client, batch_id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    kept = lines_of(client, batch.output_file_id)
    assert 10 <= len(kept) == batch.request_counts.completed < len(lines)
    with pytest.raises(openai.BadRequestError, match="only an open batch can be cancelled"):
        client.batches.cancel(batch_id)


def test_without_a_data_directory_the_routes_say_how_to_get_one(gateway):
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused")
    with pytest.raises(openai.NotFoundError, match="--data-dir"):
        client.batches.list()


def test_uploads_have_their_own_limit_not_the_json_bodies(start_gateway, settings, tmp_path):
    """A file past --payload-limit (2 MB, JSON bodies) is taken up to --upload-limit; past that, 413."""
    url = start_gateway(data_dir=tmp_path / "data", upload_limit=4_000_000)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    line = {"custom_id": "", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x" * 100}}
    big = jsonl([{**line, "custom_id": f"n-{i}"} for i in range(20_000)])
    assert settings.payload_limit < len(big) < 4_000_000
    assert client.files.create(file=("big.jsonl", big), purpose="batch").bytes == len(big)
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("bigger.jsonl", big + big), purpose="batch")
    assert refused.value.status_code == 413 and "the limit is 4000000 bytes" in refused.value.message

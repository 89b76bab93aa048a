"""Models added to and removed from a running server (`--model-admin`, `prensa models`), through a
Triton and a gateway of their own while clients keep calling: the openai and cohere clients use the
new model as soon as it is added, its removal lets the requests it holds finish, and refused
changes leave what was served serving, with nothing left in the repository. Versions on trial:
a reranker's canary takes a share, an embedder's version only a shadow's copy."""

from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import cohere
import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from prensa.addresses import free_port
from prensa.cli import app
from prensa.export.pipeline import ExportOptions, export_model
from prensa.gateway.settings import GatewaySettings
from prensa.manifest import Manifest
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
from prensa.triton.versions import VERSIONS_RECORD
from tests import tiny_layouts
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.triton

TEXTS = ["Berlin is the capital of Germany.", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def server(tmp_path_factory, exports):
    """A Triton serving minilm alone, and a gateway that may change its models."""
    repo = tmp_path_factory.mktemp("admin") / "repo"
    build_repository([ModelSource("minilm", exports["minilm"], Manifest.read(exports["minilm"]))], repo,
                     ServingOptions())
    ports = TritonPorts(free_port(), free_port(), free_port())
    with TritonProcess(TritonOptions(repo, ports=ports), log_path=repo.parent / "tritonserver.log") as triton:
        settings = GatewaySettings(triton_url=triton.grpc_url, repo=repo, default_model="minilm", model_admin=True,
                                   data_dir=repo.parent / "jobs")
        with running_gateway(settings) as url:
            yield url, repo, settings


class Load:
    """Clients embedding with minilm in a loop until stopped; every failure kept."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        self.stop, self.failures, self.answered = threading.Event(), [], 0
        self.threads = [threading.Thread(target=self.run) for _ in range(clients)]

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.client.embeddings.create(model="minilm", input=TEXTS)
                self.answered += 1
            except openai.OpenAIError as exc:
                self.failures.append(exc)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def prensa(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    return result.output


def model_dirs(repo: Path, name: str) -> list[str]:
    return sorted(p.name for p in repo.iterdir() if p.name == name or p.name.startswith(f"{name}_"))


def test_a_model_added_and_removed_under_load_fails_no_request(server, exports):
    url, repo, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    expected = client.embeddings.create(model="minilm", input=TEXTS)
    with Load(url) as load:
        assert "serving second" in prensa("models", "add", "second", str(exports["minilm"]), "--url", url)
        # served at once, by every client, with the same export's vectors
        added = client.embeddings.create(model="second", input=TEXTS)
        for got, want in zip(added.data, expected.data):
            np.testing.assert_allclose(got.embedding, want.embedding, atol=1e-6)
        assert "second" in [model.id for model in client.models.list().data]
        embedded = cohere.ClientV2(api_key="unused", base_url=url).embed(
            model="second", texts=TEXTS, input_type="search_document", embedding_types=["float"])
        np.testing.assert_allclose(embedded.embeddings.float_[0], expected.data[0].embedding, atol=1e-6)
        assert model_dirs(repo, "second") == ["second", "second_encode", "second_pool", "second_tokenize"]
        # requests for the model being removed: each answered, or refused by name once it retires
        outcomes: list[object] = []

        def call_second() -> None:
            for _ in range(20):
                try:
                    outcomes.append(client.embeddings.create(model="second", input=TEXTS))
                except openai.OpenAIError as exc:
                    outcomes.append(exc)

        caller = threading.Thread(target=call_second)
        caller.start()
        assert "removed second" in prensa("models", "remove", "second", "--url", url)
        caller.join()
    assert not load.failures and load.answered > 0, load.failures[:3]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(outcomes) == 20 and all(isinstance(o, openai.NotFoundError) and "second" in str(o) for o in refused), refused
    with pytest.raises(openai.NotFoundError, match="second"):
        client.embeddings.create(model="second", input=TEXTS)
    assert model_dirs(repo, "second") == []


def test_refused_changes_leave_what_was_served_serving(server, exports, tmp_path):
    url, repo, _ = server
    admin = httpx.Client(base_url=url, timeout=300)
    other_kind = admin.post("/admin/models", json={"name": "minilm", "export_dir": str(exports["reranker"])})
    assert other_kind.status_code == 400 and "a new version of it must too" in other_kind.json()["error"]
    empty = admin.post("/admin/models", json={"name": "empty", "export_dir": str(tmp_path)})
    assert empty.status_code == 400 and "not a prensa export" in empty.json()["error"]
    odd = admin.post("/admin/models", json={"name": "a/b", "export_dir": str(exports["minilm"])})
    assert odd.status_code == 400 and "not a model name" in odd.json()["error"]
    broken = tmp_path / "broken"
    shutil.copytree(exports["minilm"], broken)
    (broken / "tokenizer.json").write_text("{not a tokenizer")
    failed = admin.post("/admin/models", json={"name": "broken", "export_dir": str(broken)})
    assert failed.status_code == 400 and "broken" in failed.json()["error"], failed.json()
    assert model_dirs(repo, "broken") == [], "a failed add leaves nothing in the repository"
    assert admin.delete("/admin/models/nothing").status_code == 404
    served = [model["id"] for model in admin.get("/v1/models").json()["data"]]
    assert served == ["minilm"]
    assert admin.post("/v1/embeddings", json={"model": "minilm", "input": "still here"}).status_code == 200
    result = CliRunner().invoke(app, ["models", "remove", "nothing", "--url", url], env={"COLUMNS": "1000"})
    assert result.exit_code == 1 and "not served" in result.output


def test_without_model_admin_the_routes_say_how_to_turn_it_on(http):
    refused = http.post("/admin/models", json={"name": "x", "export_dir": "/nowhere"})
    assert refused.status_code == 404 and "--model-admin" in refused.json()["error"]


@pytest.fixture(scope="module")
def other_embedder(tmp_path_factory) -> Path:
    """Another embedder's export (its own width), to tell two versions' answers apart."""
    source = tiny_layouts.dense_embedder(tmp_path_factory.mktemp("other") / "dense")
    export_model(ExportOptions(str(source), source.parent / "export"))
    return source.parent / "export"


class Versions:
    """Unpinned requests for `name` in a loop, each answer's version header and vector width kept."""

    def __init__(self, url: str, name: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=60)
        self.name, self.stop, self.seen, self.failures = name, threading.Event(), [], []
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        while not self.stop.is_set():
            answer = self.http.post("/v1/embeddings", json={"model": self.name, "input": TEXTS})
            if answer.status_code != 200:
                self.failures.append(answer.text)
                continue
            body = answer.json()
            self.seen.append((answer.headers["x-prensa-model-version"], body["model"], len(body["data"][0]["embedding"])))

    def __enter__(self) -> Versions:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def test_a_new_version_answers_pinned_until_promoted_and_rolls_back(server, exports, other_embedder):
    url, repo, settings = server
    http = httpx.Client(base_url=url, timeout=60)
    prensa("models", "add", "emb", str(exports["minilm"]), "--url", url)
    added = prensa("models", "add", "emb", str(other_embedder), "--url", url)
    assert "serving emb@2" in added and "answers pinned until" in added

    def ask(model: str) -> tuple[str, str, int]:
        answer = http.post("/v1/embeddings", json={"model": model, "input": TEXTS})
        assert answer.status_code == 200, answer.text
        return answer.headers["x-prensa-model-version"], answer.json()["model"], len(answer.json()["data"][0]["embedding"])

    first, second = ask("emb"), ask("emb@2")
    assert first == ("1", "emb", 384) and second[:2] == ("2", "emb@2") and second[2] != 384
    assert ask("emb@1") == first, "the first version pinned is the name's first"
    unloaded = http.post("/admin/models/emb/promote", json={"version": 9})
    assert unloaded.status_code == 404 and "emb@9" in unloaded.json()["error"]
    with running_gateway(replace(settings, model_admin=False)) as other:  # another gateway on the same repository
        assert httpx.post(f"{other}/v1/embeddings", json={"model": "emb", "input": TEXTS}).json()["model"] == "emb"
        with Versions(url, "emb") as load:
            assert "emb -> version 2" in prensa("models", "promote", "emb@2", "--url", url)
            assert ask("emb") == second, "the name reaches the promoted version from the answer on"
            # the other gateway reads the promotion within LINEAGES_CHECK_S
            deadline = time.monotonic() + 5
            while (answer := httpx.post(f"{other}/v1/embeddings", json={"model": "emb", "input": TEXTS}).json()["model"]) != "emb@2":
                assert answer == "emb" and time.monotonic() < deadline, answer
                time.sleep(0.1)
            assert "emb -> version 1" in prensa("models", "rollback", "emb", "--url", url)
            assert ask("emb") == first
    assert not load.failures, load.failures[:3]
    # every answer came whole from one version: its header, its name and its width agree
    assert set(load.seen) <= {first, second} and first in load.seen, set(load.seen)
    current = http.delete("/admin/models/emb")
    assert current.status_code == 409 and "promote another version first" in current.json()["error"]
    assert http.delete("/admin/models/emb@2").status_code == 200
    with pytest.raises(AssertionError):
        ask("emb@2")
    assert http.delete("/admin/models/emb@1").status_code == 200  # the first version, pinned
    assert model_dirs(repo, "emb") == [] and not list(repo.glob("emb@*"))
    assert "emb" not in (repo / VERSIONS_RECORD).read_text()


def shadow_series(url: str) -> dict[str, float]:
    """The gateway's `prensa_shadow_*` samples for model `sh`, by sample name and outcome."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("prensa_shadow") and sample.labels.get("model") == "sh":
                key = sample.name + (f":{sample.labels['outcome']}" if "outcome" in sample.labels else "")
                if "le" not in sample.labels:
                    found[key] = sample.value
    return found


def test_a_reranker_canary_answers_its_share_and_an_embedder_version_only_shadows(server, exports):
    """A relevance model's version on trial answers a share of the unpinned requests, each answer
    whole from the version its header names; an embedder's version takes no share (409, by name),
    only a copy of its requests, compared on the gateway's metrics and never answered with."""
    url, repo, _ = server
    http = httpx.Client(base_url=url, timeout=120)
    for name, export in (("rr", "reranker"), ("rr", "msmarco"), ("sh", "minilm"), ("sh", "minilm")):
        prensa("models", "add", name, str(exports[export]), "--url", url)
    query, documents = "capital of france", ["Paris is the capital of France.", "The dog sleeps.", "Berlin"]

    def rerank(model: str) -> tuple[str, list[float]]:
        answer = http.post("/rerank", json={"model": model, "query": query, "texts": documents})
        assert answer.status_code == 200, answer.text
        scores = [hit["score"] for hit in sorted(answer.json(), key=lambda hit: hit["index"])]
        return answer.headers["x-prensa-model-version"], scores

    by_version = dict([rerank("rr@1"), rerank("rr@2")])
    assert "version 2 answers 50%" in prensa("models", "canary", "rr@2", "--share", "0.5", "--url", url)
    seen = [rerank("rr") for _ in range(40)]
    assert {version for version, _ in seen} == {"1", "2"}, "both versions answer unpinned requests"
    for version, scores in seen:  # each answer is the version's own
        np.testing.assert_allclose(scores, by_version[version], atol=1e-5)
    counted = {sample.labels["version"]: sample.value
               for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
               for sample in family.samples
               if sample.name == "prensa_request_duration_count" and sample.labels.get("model") == "rr"}
    assert counted == {version: 1 + sum(v == version for v, _ in seen) for version in ("1", "2")}, counted
    assert {http.get("/v1/models/rr").json()["id"] for _ in range(12)} == {"rr"}, "what describes it: its current version"
    cohere_hits = cohere.ClientV2(api_key="unused", base_url=url).rerank(model="rr@2", query=query, documents=documents)
    assert abs(max(hit.relevance_score for hit in cohere_hits.results) - max(by_version["2"])) < 1e-5

    mixed = http.post("/admin/models/sh/canary", json={"version": 2, "share": 0.5})
    assert mixed.status_code == 409 and "do not mix" in mixed.json()["error"], mixed.json()
    assert http.post("/admin/models/rr/shadow", json={"version": 2}).status_code == 409
    assert "version 2 shadows it" in prensa("models", "shadow", "sh@2", "--url", url)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    for i in range(16):  # more inputs than the top-k, so that neighbours are compared
        answer = client.embeddings.with_raw_response.create(model="sh", input=[f"passage {i} about rivers", f"note {i}"])
        assert answer.headers["x-prensa-model-version"] == "1" and answer.parse().model == "sh"
    deadline = time.monotonic() + 60
    while shadow_series(url).get("prensa_shadow_inputs:compared", 0) < 32:
        assert time.monotonic() < deadline, shadow_series(url)
        time.sleep(0.2)
    series = shadow_series(url)
    # the same export as its shadow: the same vectors, and the same neighbours
    assert series["prensa_shadow_cosine_sum"] / series["prensa_shadow_cosine_count"] > 0.9999, series
    agreement = series["prensa_shadow_top_k_agreement_sum"] / series["prensa_shadow_top_k_agreement_count"]
    assert series["prensa_shadow_top_k_agreement_count"] > 0 and agreement == 1.0, series
    assert "no version on trial" in prensa("models", "end-trial", "sh", "--url", url)
    assert http.delete("/admin/models/sh/trial").status_code == 404
    assert http.post("/admin/models/sh/shadow", json={"version": 1}).status_code == 409  # the current one
    assert "shadow" not in (repo / VERSIONS_RECORD).read_text()
    prensa("models", "promote", "rr@2", "--url", url)
    assert "canary" not in (repo / VERSIONS_RECORD).read_text(), "a promotion ends the trial"
    for model in ("sh@2", "sh", "rr@1", "rr@2"):
        assert http.delete(f"/admin/models/{model}").status_code == 200, model


def test_a_batch_job_keeps_the_version_its_name_reached_when_it_began(server, exports, other_embedder):
    """A promotion while a batch job runs moves online requests, not the job: every line is answered
    by the version the name reached at the job's first line, and the batch object says which."""
    url, _, _ = server
    prensa("models", "add", "bj", str(exports["minilm"]), "--url", url)
    prensa("models", "add", "bj", str(other_embedder), "--url", url)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    lines = [{"custom_id": f"l{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "bj", "input": [f"passage {i}.{j} about the river" for j in range(16)]}}
             for i in range(150)]
    uploaded = client.files.create(file=("pinned.jsonl", "\n".join(map(json.dumps, lines)).encode()), purpose="batch")
    batch_id = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch_id).request_counts.completed < 8:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    prensa("models", "promote", "bj@2", "--url", url)
    at_promotion = client.batches.retrieve(batch_id)
    assert client.embeddings.create(model="bj", input="online").model == "bj@2"
    while (batch := client.batches.retrieve(batch_id)).status != "completed":
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    assert at_promotion.request_counts.completed < len(lines), "the promotion came while the job ran"
    answers = [json.loads(row) for row in client.files.content(batch.output_file_id).text.splitlines()]
    assert len(answers) == len(lines) and batch.model == "bj@1"
    assert {(a["response"]["body"]["model"], len(a["response"]["body"]["data"][0]["embedding"])) for a in answers} == {("bj", 384)}
    prensa("models", "rollback", "bj", "--url", url)
    for model in ("bj@2", "bj"):
        assert httpx.delete(f"{url}/admin/models/{model}", timeout=120).status_code == 200, model

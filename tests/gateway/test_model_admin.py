"""Models added to and removed from a running server (`--model-admin`, `prensa models`), through a
Triton and a gateway of their own while clients keep calling: the openai and cohere clients use the
new model as soon as it is added, its removal lets the requests it holds finish, and refused
changes leave what was served serving, with nothing left in the repository."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import cohere
import httpx
import numpy as np
import openai
import pytest
from typer.testing import CliRunner

from prensa.addresses import free_port
from prensa.cli import app
from prensa.gateway.settings import GatewaySettings
from prensa.manifest import Manifest
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
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
        settings = GatewaySettings(triton_url=triton.grpc_url, repo=repo, default_model="minilm", model_admin=True)
        with running_gateway(settings) as url:
            yield url, repo


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
    url, repo = server
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
    url, repo = server
    admin = httpx.Client(base_url=url, timeout=300)
    taken = admin.post("/admin/models", json={"name": "minilm", "export_dir": str(exports["minilm"])})
    assert taken.status_code == 409 and "served already" in taken.json()["error"]
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

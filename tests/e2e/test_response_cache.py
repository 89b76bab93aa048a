"""Triton's response cache on a real Triton (`prensa repo build --response-cache`, `prensa serve
--cache-size`): an exact repeat is answered without reaching the encoder, with the same bytes;
requests that differ in any input byte (another text, a prompt, another truncation, other rows in
the same call) are computed; hits and misses show on the metrics port and in `prensa stats`.

Each test sends texts of its own: the cache lives as long as the module's Triton."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from typer.testing import CliRunner

from prensa.addresses import free_port
from prensa.cli import app
from prensa.gateway.settings import GatewaySettings
from prensa.manifest import Manifest
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.metrics import scrape
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.triton
CACHE_BYTES = 64 << 20
MODELS = ("minilm", "minilm-prompts")
LONG = "the river runs under seven bridges before it reaches the old town and the sea " * 40  # > 256 tokens


@dataclass(frozen=True)
class Counts:
    successes: int
    executions: int
    hits: int
    misses: int


def counts(client: grpcclient.InferenceServerClient, model: str) -> Counts:
    stats = client.get_inference_statistics(model).model_stats[0]
    infer = stats.inference_stats
    return Counts(infer.success.count, stats.execution_count, infer.cache_hit.count, infer.cache_miss.count)


def settled(client: grpcclient.InferenceServerClient, model: str, successes: int, wait_s: float = 5.0) -> Counts:
    """`model`'s counts once it has counted `successes`: a model counts a request when it releases it,
    just after the client has its answer."""
    deadline = time.monotonic() + wait_s
    while (now := counts(client, model)).successes < successes and time.monotonic() < deadline:
        time.sleep(0.02)
    return now


@pytest.fixture(scope="module")
def cached_triton(tmp_path_factory, exports):
    repo = tmp_path_factory.mktemp("cached-repo")
    build_repository([ModelSource(n, exports[n], Manifest.read(exports[n])) for n in MODELS], repo,
                     ServingOptions(response_cache=True))
    ports = TritonPorts(free_port(), free_port(), free_port())
    with TritonProcess(TritonOptions(repo, ports=ports, cache_bytes=CACHE_BYTES),
                       log_path=repo.parent / "tritonserver.log") as server:
        yield server


@pytest.fixture(scope="module")
def client(cached_triton):
    return grpcclient.InferenceServerClient(cached_triton.grpc_url)


def infer(client: grpcclient.InferenceServerClient, texts: list[str], outputs: tuple[str, ...] = (),
          model: str = "minilm") -> grpcclient.InferResult:
    tensor = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    return client.infer(model, [tensor], outputs=[grpcclient.InferRequestedOutput(n) for n in outputs] or None)


def raw(result: grpcclient.InferResult) -> list[bytes]:
    return list(result.get_response().raw_output_contents)


class Watch:
    """The ensemble's and its encoder's counts since the last `step`."""

    def __init__(self, client: grpcclient.InferenceServerClient, model: str = "minilm") -> None:
        self.client, self.model, self.encoder = client, model, f"{model}_encode"
        self.ensemble, self.encoded = counts(client, model), counts(client, self.encoder)

    def step(self, requests: int = 1) -> tuple[Counts, Counts]:
        """(ensemble, encoder) differences once the ensemble has counted `requests` more."""
        ensemble = settled(self.client, self.model, self.ensemble.successes + requests)
        encoded = counts(self.client, self.encoder)
        delta = (Counts(*(a - b for a, b in zip(vars(ensemble).values(), vars(self.ensemble).values()))),
                 Counts(*(a - b for a, b in zip(vars(encoded).values(), vars(self.encoded).values()))))
        self.ensemble, self.encoded = ensemble, encoded
        return delta


def test_a_repeat_skips_the_encoder_and_answers_the_same_bytes(client):
    watch = Watch(client)
    first = infer(client, ["where does the cache keep its answers?"])
    ensemble, encoder = watch.step()
    assert (ensemble.hits, ensemble.misses, encoder.executions) == (0, 1, 1)
    second = infer(client, ["where does the cache keep its answers?"])
    ensemble, encoder = watch.step()
    assert (ensemble.hits, ensemble.misses) == (1, 0)
    assert (encoder.successes, encoder.executions) == (0, 0), "the cached request reached the encoder"
    assert ensemble.executions == 0
    assert raw(second) == raw(first) and len(raw(first)) == 2  # dense and num_tokens, byte for byte


def test_another_text_is_computed(client):
    watch = Watch(client)
    one = infer(client, ["a text the cache has not seen"])
    watch.step()
    other = infer(client, ["a text the cache has not seen either"])
    ensemble, encoder = watch.step()
    assert (ensemble.hits, ensemble.misses, encoder.executions) == (0, 1, 1)
    assert raw(other) != raw(one)


def test_a_call_of_several_texts_is_one_entry(client):
    """Triton looks a request up whole: its texts, in order, are the key. A call of two texts
    answers only that call again, not either text alone, nor the two the other way round."""
    a, b = "first of two rows", "second of two rows"
    watch = Watch(client)
    both = infer(client, [a, b])
    assert watch.step()[0].misses == 1
    alone = infer(client, [a])
    ensemble, encoder = watch.step()
    assert (ensemble.misses, encoder.executions) == (1, 1)
    np.testing.assert_array_equal(alone.as_numpy("dense")[0], both.as_numpy("dense")[0])
    assert raw(infer(client, [a, b])) == raw(both)
    ensemble, encoder = watch.step()
    assert (ensemble.hits, encoder.executions) == (1, 0)
    infer(client, [b, a])
    ensemble, encoder = watch.step()
    assert (ensemble.misses, encoder.executions) == (1, 1)


def test_concurrent_repeats_are_each_looked_up_and_batched(client, cached_triton):
    """The ensemble looks each request up as it arrives, before the dynamic batcher sees it:
    identical requests in flight together all miss (none is answered yet) and are computed, in as
    few encoder executions as the batcher makes; once answered, each later one hits."""
    clients = [grpcclient.InferenceServerClient(cached_triton.grpc_url) for _ in range(8)]
    text = ["eight clients ask this at the same moment"]
    watch = Watch(client)
    with ThreadPoolExecutor(len(clients)) as pool:
        cold = list(pool.map(lambda c: raw(infer(c, text)), clients))
    ensemble, encoder = watch.step(len(clients))
    assert ensemble.hits + ensemble.misses == len(clients) and ensemble.misses >= 1
    assert encoder.executions <= ensemble.misses
    with ThreadPoolExecutor(len(clients)) as pool:
        warm = list(pool.map(lambda c: raw(infer(c, text)), clients))
    ensemble, encoder = watch.step(len(clients))
    assert (ensemble.hits, encoder.executions) == (len(clients), 0)
    assert len({b"".join(answer) for answer in cold + warm}) == 1


def test_a_cached_answer_holds_only_the_outputs_its_request_asked_for(client):
    """Why `--response-cache` leaves out models asked for different outputs of the same texts
    (`cache_refusal`): Triton's key has no requested outputs, and a hit returns what was stored."""
    text = ["asked once for its token count only"]
    assert infer(client, text, ("num_tokens",)).as_numpy("dense") is None
    later = infer(client, text, ("dense",))
    assert later.as_numpy("dense") is None and later.as_numpy("num_tokens") is not None


@pytest.fixture(scope="module")
def gateway(cached_triton):
    settings = GatewaySettings(triton_url=cached_triton.grpc_url, repo=cached_triton.options.repo,
                               default_model="minilm")
    with running_gateway(settings) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield http


def embed(http: httpx.Client, **body: object) -> list[float]:
    response = http.post("/embed", json=body)
    assert response.status_code == 200, response.text
    return response.json()[0]


def test_gateway_truncation_settings_do_not_share_entries(gateway, client):
    """Right truncation cuts the text in the gateway (a shorter text is the key); left truncation
    sends token ids to the stages, which no cache stands in front of."""
    watch = Watch(client)
    right = embed(gateway, inputs=LONG, truncate=True)
    ensemble, encoder = watch.step()
    assert (ensemble.misses, encoder.executions) == (1, 1)
    assert embed(gateway, inputs=LONG, truncate=True) == right
    ensemble, encoder = watch.step()
    assert (ensemble.hits, encoder.executions) == (1, 0)
    left = embed(gateway, inputs=LONG, truncate=True, truncation_direction="left")  # not through the ensemble
    encoder_now = settled(client, "minilm_encode", watch.encoded.successes + 1)
    assert encoder_now.executions == watch.encoded.executions + 1, "left truncation was answered from the cache"
    assert left != right


def test_a_prompt_is_part_of_the_text_so_of_the_key(gateway, client):
    watch = Watch(client, "minilm-prompts")
    plain = embed(gateway, model="minilm-prompts", inputs="the capital of France")
    prompted = embed(gateway, model="minilm-prompts", inputs="the capital of France", prompt_name="query")
    ensemble, encoder = watch.step(2)
    assert (ensemble.hits, ensemble.misses, encoder.executions) == (0, 2, 2)
    assert prompted != plain
    assert embed(gateway, model="minilm-prompts", inputs="the capital of France", prompt_name="query") == prompted
    assert watch.step()[0].hits == 1


def test_concurrent_repeats_through_the_gateway_are_answered_from_the_cache(gateway, client):
    """The gateway merges concurrent requests into one Triton call, except for a cached model: a
    merged call's texts would make keys that almost never repeat."""
    texts = [f"which harbour does ferry {n} sail from?" for n in range(4)]
    before = counts(client, "minilm").successes
    for text in texts:  # computed once each
        embed(gateway, inputs=text)
    # counted once released, a moment after the answer: the last one's encoder run is no repeat's
    settled(client, "minilm", before + len(texts))
    watch = Watch(client)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda text: embed(gateway, inputs=text), texts * 8))
    ensemble, encoder = watch.step(len(answers))
    assert (ensemble.hits, encoder.executions) == (len(answers), 0)
    assert answers == [embed(gateway, inputs=text) for text in texts] * 8


def test_hits_and_misses_show_on_the_metrics_port_and_in_stats(client, cached_triton):
    before = scrape(cached_triton.metrics_url)["minilm"]
    for _ in range(3):
        infer(client, ["counted on the metrics port"])
    deadline = time.monotonic() + 5
    while (delta := scrape(cached_triton.metrics_url)["minilm"] - before).cache_lookups < 3:
        assert time.monotonic() < deadline, f"cache counters did not arrive: {delta}"
        time.sleep(0.05)
    assert (delta.cache_hits, delta.cache_misses) == (2, 1)
    assert scrape(cached_triton.metrics_url)["minilm_encode"].cache_hit_ratio is None  # stages are not cached
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["stats", "--metrics-url", cached_triton.metrics_url])
    assert result.exit_code == 0, result.output
    cells = [[cell.strip() for cell in line.strip().strip("│").split("│")] for line in result.output.splitlines()]
    rows = {row[0]: row[1:] for row in cells if len(row) > 1}
    m = scrape(cached_triton.metrics_url)["minilm"]
    assert rows["minilm"][-1] == f"{m.cache_hits:.0f}/{m.cache_lookups:.0f} ({m.cache_hit_ratio:.0%})"
    assert rows["minilm_encode"][-1] == "-"

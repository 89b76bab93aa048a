"""Late-interaction models through a real Triton and gateway, against PyLate on the same weights:
PyLate's own layout (a model PyLate built and saved) and colbert-ai's `HF_ColBERT` checkpoint,
read by PyLate's own loader for such checkpoints (colbert-ai itself does not install here: it pins
an old transformers and needs faiss). Queries and documents on `/embed_colbert`, documents on
`/embed_all`, vLLM's `/pooling` `token_embed` and TEI's gRPC `EmbedAll`, against `encode`; MaxSim
on `/rerank`, `/v1/rerank`, `/v2/rerank` and vLLM's `/score` against PyLate's `colbert_scores` of each pair. The PyLate models leave
their query expansion unattended, the checkpoint attends to it, so both framings are checked; a
document read as a query differs, so the comparisons can fail. A third model is PyLate's layout on
ModernBERT, whose byte-level tokenizer keeps whitespace as tokens: PyLate strips every text before
tokenizing, so texts with whitespace around them (and whitespace alone) show whether prensa reads
them as PyLate does. Exports prensa cannot serve as PyLate does are refused by name."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from prensa.addresses import free_port
from prensa.export.pipeline import ExportOptions, export_model
from prensa.export.source import SourceError
from prensa.gateway.grpc import tei_pb2 as pb
from prensa.gateway.grpc import tei_pb2_grpc as stubs
from prensa.gateway.settings import GatewaySettings
from prensa.manifest import Task
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.repo import ModelSource, Pipeline, ServingOptions, build_repository
from tests import tiny_layouts
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.triton
PYLATE = Path(__file__).resolve().parents[2] / ".venv-pylate" / "bin" / "python"
ORACLE = Path(__file__).resolve().parents[1] / "pylate_oracle.py"
QUERIES = ["what is the capital of germany?", "berlin", "the quick brown fox jumps over the lazy dog near the river",
           "  what is the capital of germany?  ", "\tberlin\n"]
DOCUMENTS = ["Berlin is the capital and largest city of Germany.",
             "Paris is the capital of France, and home of the Louvre museum!",
             "Dense retrieval encodes queries and passages into vectors; sparse retrieval weights terms.",
             "The quick brown fox jumps over the lazy dog near the river bank. " * 3,  # past 24 tokens
             "  \t ", "berlin " * 10, *tiny_layouts.WHITESPACE_TEXTS]  # its trailing space within 64 tokens
MODELS = {"pylate": Pipeline.ENSEMBLE, "hf-colbert": Pipeline.FUSED, "pylate-modernbert": Pipeline.ENSEMBLE}
# the checkpoint's weights forced into model.onnx.data, as a graph over 2 GB keeps them
EXPORT_OPTIONS = {"hf-colbert": {"external_data": True}}
ATOL = 1e-4


def oracle(job: dict, workdir: Path) -> dict:
    if not PYLATE.is_file():
        pytest.skip("PyLate's venv is missing: `make pylate` builds it (`make test` does)")
    request, answer = workdir / "job.json", workdir / "answer.json"
    request.write_text(json.dumps(job))
    # isolated: the script's folder (tests/, whose `packaging` tier shadows the package) stays off sys.path
    subprocess.run([str(PYLATE), "-I", str(ORACLE), str(request), str(answer)], check=True, timeout=600)
    return json.loads(answer.read_text())


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("late")
    base = tiny_layouts.bert_base(root / "base", 11)
    oracle({"build": {"base": str(base), "out": str(root / "pylate"), "dim": 16, "seed": 11,
                      "query_length": 12, "document_length": 24}}, root)
    modernbert = tiny_layouts.modernbert_base(root / "modernbert-base", 14)
    oracle({"build": {"base": str(modernbert), "out": str(root / "pylate-modernbert"), "dim": 16, "seed": 14,
                      "query_length": 32, "document_length": 64}}, root)
    return {"pylate": root / "pylate", "hf-colbert": tiny_layouts.stanford_colbert(root / "hf-colbert"),
            "pylate-modernbert": root / "pylate-modernbert"}


@pytest.fixture(scope="module")
def references(sources, tmp_path_factory) -> dict[str, dict]:
    workdir = tmp_path_factory.mktemp("pylate-answers")
    return {name: oracle({"model": str(path), "queries": QUERIES, "documents": DOCUMENTS}, workdir)
            for name, path in sources.items()}


@pytest.fixture(scope="module")
def served(tmp_path_factory, sources):
    """(HTTP url, gRPC port) of a gateway in front of a Triton serving both models."""
    root = tmp_path_factory.mktemp("late-exports")
    repo = root / "repo"
    for name, pipeline in MODELS.items():
        manifest, report = export_model(ExportOptions(str(sources[name]), root / name,
                                                      **EXPORT_OPTIONS.get(name, {})))
        assert report.ok and manifest.task is Task.LATE, (name, report.figures)
        assert (root / name / "model.onnx.data").is_file() == (name in EXPORT_OPTIONS)
        build_repository([ModelSource(name, root / name, manifest)], repo, ServingOptions(pipeline=pipeline))
    ports = TritonPorts(free_port(), free_port(), free_port())
    grpc_port = free_port()
    with TritonProcess(TritonOptions(repo, ports=ports), log_path=root / "tritonserver.log") as triton, \
            running_gateway(GatewaySettings(triton_url=triton.grpc_url, repo=repo, tei_grpc_port=grpc_port)) as url:
        yield url, grpc_port


def post(url: str, path: str, body: dict) -> object:
    response = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def assert_vectors(got: list, want: list) -> None:
    assert [len(g) for g in got] == [len(w) for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=ATOL)


@pytest.mark.parametrize("name", list(MODELS))
def test_queries_and_documents_equal_pylate_encode(served, references, name):
    url, _ = served
    want = references[name]
    queries = post(url, "/embed_colbert", {"inputs": QUERIES, "model": name, "is_query": True})
    documents = post(url, "/embed_colbert", {"inputs": DOCUMENTS, "model": name})
    assert_vectors(queries, want["queries"])
    assert_vectors(documents, want["documents"])
    query_length, document_length = (32, 64) if name == "pylate-modernbert" else (12, 24)
    assert {len(q) for q in queries} == {query_length}  # expanded to the query length
    info = httpx.get(f"{url}/info", params={"model": name}).json()
    assert info["task"] == "late" and info["model_type"] == {"embedding": {"pooling": "colbert"}}
    assert info["max_input_length"] == document_length
    # a document read as a query (its marker, no skiplist) is not PyLate's document
    as_queries = post(url, "/embed_colbert", {"inputs": DOCUMENTS[:1], "model": name, "is_query": True})
    assert len(as_queries[0]) != len(want["documents"][0]) or not np.allclose(
        as_queries[0], want["documents"][0], atol=ATOL)


@pytest.mark.parametrize("name", list(MODELS))
def test_token_routes_give_the_documents_vectors(served, references, name):
    url, grpc_port = served
    want = references[name]["documents"]
    assert_vectors(post(url, "/embed_all", {"inputs": DOCUMENTS, "model": name}), want)
    pooled = post(url, "/pooling", {"input": DOCUMENTS, "model": name, "task": "token_embed"})
    assert_vectors([row["data"] for row in pooled["data"]], want)
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        reply = stubs.EmbedStub(channel).EmbedAll(pb.EmbedAllRequest(inputs=DOCUMENTS[1]),
                                                  metadata=(("model", name),))
    assert_vectors([[token.embeddings for token in reply.token_embeddings]], want[1:2])


@pytest.mark.parametrize("name", list(MODELS))
def test_pylates_own_server_body_is_answered_as_it_answers(served, references, name):
    """PyLate's server takes OpenAI's body on /v1/embeddings with `is_query` (default true) and puts
    each input's token vectors in `embedding`."""
    url, _ = served
    want = references[name]
    for fields, texts, expected in (({}, QUERIES, "queries"), ({"is_query": True}, QUERIES, "queries"),
                                    ({"is_query": False}, DOCUMENTS, "documents"),
                                    ({"input_type": "document"}, DOCUMENTS, "documents")):
        answer = post(url, "/v1/embeddings", {"model": name, "input": texts, **fields})
        assert [row["object"] for row in answer["data"]] == ["embedding"] * len(texts)
        assert_vectors([row["embedding"] for row in answer["data"]], want[expected])


@pytest.mark.parametrize("name", list(MODELS))
def test_jinas_multi_vector_bodies_answer_pylates_vectors(served, references, name):
    url, _ = served
    want = references[name]
    for path, role, texts, expected in (
            ("/v1/embeddings", {"task": "retrieval.query"}, QUERIES, "queries"),
            ("/v1/embeddings", {"task": "retrieval.passage"}, DOCUMENTS, "documents"),
            ("/v1/multi-vector", {"input_type": "query"}, QUERIES, "queries"),
            ("/v1/multi-vector", {"input_type": "document"}, DOCUMENTS, "documents")):
        body = {"model": name, "input": texts, **role}
        if path == "/v1/embeddings":
            body["return_multivector"] = True
        answer = post(url, path, body)
        assert [row["object"] for row in answer["data"]] == ["embeddings"] * len(texts)
        assert_vectors([row["embeddings"] for row in answer["data"]], want[expected])
    refused = httpx.post(f"{url}/v1/embeddings", json={"model": name, "input": QUERIES, "return_multivector": True,
                                                       "dimensions": 8})
    assert refused.status_code == 422 and "dimensions" in refused.text, refused.text
    single = httpx.post(f"{url}/embed", json={"model": name, "inputs": QUERIES})
    assert single.status_code == 422 and "dense embeddings" in single.text, single.text


@pytest.mark.parametrize("name", list(MODELS))
def test_rerank_routes_score_by_maxsim_as_pylate_scores_each_pair(served, references, name):
    """Each document by its own MaxSim (`colbert_scores` of the pair), best first, ties in input order."""
    url, _ = served
    for query, scores in zip(QUERIES, references[name]["pair_scores"]):
        want = dict(enumerate(scores))
        ranked = [{"id": i} for i in np.argsort(-np.asarray(scores), kind="stable").tolist()]
        tei = post(url, "/rerank", {"query": query, "texts": DOCUMENTS, "model": name})
        assert [row["index"] for row in tei] == [row["id"] for row in ranked]
        for path in ("/v1/rerank", "/v2/rerank"):
            answer = post(url, path, {"query": query, "documents": DOCUMENTS, "model": name})
            results = answer["results"]
            assert [row["index"] for row in results] == [row["id"] for row in ranked], path
            np.testing.assert_allclose([row["relevance_score"] for row in results],
                                       [want[row["index"]] for row in results], rtol=1e-4)
        np.testing.assert_allclose([row["score"] for row in tei], [want[row["index"]] for row in tei], rtol=1e-4)
        scored = post(url, "/score", {"text_1": query, "text_2": DOCUMENTS, "model": name})  # vLLM's
        np.testing.assert_allclose([row["score"] for row in scored["data"]], [want[i] for i in range(len(DOCUMENTS))],
                                   rtol=1e-4)


def test_what_maxsim_has_no_use_for_is_refused(served, references):
    """bge-m3's `weights` are refused; `raw_scores` and `use_activation: false` are served, MaxSim having
    no activation to leave out."""
    url, _ = served
    answer = httpx.post(f"{url}/rerank", json={"query": "berlin", "texts": DOCUMENTS, "model": "pylate",
                                               "weights": [0.4, 0.2, 0.4]})
    assert answer.status_code == 422 and "late-interaction" in answer.json()["error"], answer.text
    want = references["pylate"]["pair_scores"][QUERIES.index("berlin")]
    raw = post(url, "/rerank", {"query": "berlin", "texts": DOCUMENTS, "model": "pylate", "raw_scores": True})
    np.testing.assert_allclose([row["score"] for row in sorted(raw, key=lambda row: row["index"])], want, rtol=1e-4)
    scored = post(url, "/score", {"text_1": "berlin", "text_2": DOCUMENTS, "model": "pylate", "use_activation": False})
    np.testing.assert_allclose([row["score"] for row in scored["data"]], want, rtol=1e-4)
    answer = httpx.post(f"{url}/embed_colbert", json={"inputs": [[2, 5, 3]], "model": "pylate", "is_query": True})
    assert answer.status_code == 422 and "texts" in answer.json()["error"], answer.text


def altered(source: Path, target: Path, relative: str, **changes: object) -> Path:
    shutil.copytree(source, target)
    path = target / relative
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return target


def test_exports_prensa_cannot_serve_as_pylate_are_refused(sources, tmp_path):
    pylate = sources["pylate"]
    refusals = {
        "residual": (altered(pylate, tmp_path / "residual", "1_Dense/config.json", use_residual=True), {},
                     "residual"),
        "no-marker": (altered(pylate, tmp_path / "marker", "config_sentence_transformers.json", query_prefix="[X] "),
                      {}, "lacks the prefix"),
        "int8": (pylate, {"quantize_int8": True}, "int8"),
        "plain-as-late": (tiny_layouts.plain_embedder(tmp_path / "plain", "mean"), {"task": Task.LATE},
                          "neither"),
    }
    for name, (source, options, said) in refusals.items():
        with pytest.raises(SourceError, match=said):
            export_model(ExportOptions(str(source), tmp_path / f"out-{name}", **options))


def test_texts_are_read_stripped_as_pylate_reads_them(served, references):
    """PyLate strips each text (sentence-transformers 5.3's tokenize): on ModernBERT's byte-level
    tokens a whitespace-only document is its marker and special tokens alone, a trailing space adds no
    token, and `/tokenize` shows those tokens with offsets into the text as sent."""
    url, _ = served
    want = references["pylate-modernbert"]["documents"]
    blank, repeated = DOCUMENTS.index("  \t "), DOCUMENTS.index("berlin " * 10)
    assert len(want[blank]) == 3  # [CLS] [D] [SEP]
    documents = post(url, "/embed_colbert", {"inputs": [DOCUMENTS[blank], DOCUMENTS[repeated]],
                                              "model": "pylate-modernbert"})
    assert_vectors(documents, [want[blank], want[repeated]])
    tokens = post(url, "/tokenize", {"inputs": ["  \t ", "  berlin\n"], "model": "pylate-modernbert"})
    assert [token["special"] for token in tokens[0]] == [True, True, True]
    content = [token for token in tokens[1] if not token["special"]]
    assert "".join(token["text"] for token in content) == "berlin"
    assert (content[0]["start"], content[-1]["stop"]) == (2, 8)

"""Rerankers, a classifier and SPLADE served from the same Triton as the embedders, compared with
onnxruntime, FlagEmbedding and transformers on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytestmark = pytest.mark.triton

QUERY = "What is the capital of Germany?"
PASSAGES = [
    "Berlin is the capital and largest city of Germany.",
    "Paris is the capital of France.",
    "The Rhine flows through Germany and the Netherlands.",
    "Bonn was the seat of government of West Germany until 1990.",
    "Bananas are rich in potassium.",
    "Germany is a federal republic with sixteen states; its capital is Berlin.",
    "The quick brown fox jumps over the lazy dog.",
    "Munich hosts the Oktoberfest every year.",
    "Capital gains are taxed differently from income.",
    "Berlin has more bridges than Venice.",
    "The Bundestag meets in the Reichstag building in Berlin.",
    "Hamburg is a major port city in northern Germany.",
    "Python is a programming language.",
    "The Berlin Wall fell in 1989.",
    "Vienna is the capital of Austria.",
    "German is spoken in Germany, Austria and Switzerland.",
    "A capital letter starts every sentence.",
    "Frankfurt is a financial centre.",
    "Deutschland's Hauptstadt ist Berlin.",
    "The weather in Berlin is mild in spring. " * 30,  # long
]


def infer(server, model: str, texts: list[str], pairs: list[str] | None = None, protocol: str = "grpc"):
    module, url = (httpclient, server.http_url) if protocol == "http" else (grpcclient, server.grpc_url)
    client = module.InferenceServerClient(url)
    inputs = []
    for name, column in (("text", texts), ("text_pair", pairs)):
        if column is not None:
            tensor = module.InferInput(name, [len(column), 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[t.encode()] for t in column], dtype=object))
            inputs.append(tensor)
    return client.infer(model, inputs)


@pytest.mark.parametrize("model", ["msmarco", "msmarco-fused"])
def test_msmarco_int8_matches_onnxruntime_on_the_same_file(triton, msmarco_dir, model):
    import onnxruntime as ort
    from transformers import AutoTokenizer

    result = infer(triton, model, [QUERY] * len(PASSAGES), PASSAGES)
    logits, scores = result.as_numpy("logits")[:, 0], result.as_numpy("scores")[:, 0]
    tokenizer = AutoTokenizer.from_pretrained(msmarco_dir)
    session = ort.InferenceSession(str(msmarco_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = []
    for passage in PASSAGES:  # one pair per run: int8 activation scales are per tensor, so batch-dependent
        encoded = tokenizer(QUERY, passage, truncation=True, max_length=512, return_tensors="np")
        expected.append(session.run(None, {k: v.astype(np.int64) for k, v in encoded.items()})[0][0, 0])
    expected = np.asarray(expected)
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    assert np.argsort(-logits).tolist() == np.argsort(-expected).tolist()
    assert np.all((scores > 0) & (scores < 1))
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-logits)), rtol=1e-5)
    assert PASSAGES[int(np.argmax(logits))].startswith(("Berlin is the capital", "Germany is a federal"))


def test_bge_reranker_layout_matches_flagreranker(triton, reranker_dir):
    from FlagEmbedding import FlagReranker

    reranker = FlagReranker(str(reranker_dir), use_fp16=False, devices="cpu")
    pairs = [[QUERY, p] for p in PASSAGES]
    raw = np.asarray(reranker.compute_score(pairs, max_length=512))
    normalized = np.asarray(reranker.compute_score(pairs, max_length=512, normalize=True))
    result = infer(triton, "reranker", [QUERY] * len(PASSAGES), PASSAGES, protocol="http")
    np.testing.assert_allclose(result.as_numpy("logits")[:, 0], raw, atol=1e-4)
    np.testing.assert_allclose(result.as_numpy("scores")[:, 0], normalized, atol=1e-4)


@pytest.mark.parametrize("with_pairs", [False, True])
def test_classifier_matches_transformers_softmax_with_named_labels(triton, classifier_dir, with_pairs):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    texts = PASSAGES[:6]
    pairs = PASSAGES[6:12] if with_pairs else None
    tokenizer = AutoTokenizer.from_pretrained(classifier_dir)
    model = AutoModelForSequenceClassification.from_pretrained(classifier_dir).eval()
    encoded = tokenizer(texts, pairs, padding=True, truncation=True, max_length=512, return_tensors="pt")
    with torch.no_grad():
        expected = torch.softmax(model(**encoded).logits, dim=-1).numpy()
    result = infer(triton, "classifier", texts, pairs)
    np.testing.assert_allclose(result.as_numpy("scores"), expected, atol=1e-5)
    config = grpcclient.InferenceServerClient(triton.grpc_url).get_model_config("classifier", as_json=True)["config"]
    labels = config["parameters"]["id2label"]["string_value"].split(",")
    assert labels == [model.config.id2label[i] for i in range(model.config.num_labels)]


def splade_reference(model_dir, texts: list[str]) -> np.ndarray:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
    with torch.no_grad():
        logits = model(**encoded).logits
    weights = torch.log1p(torch.relu(logits)) * encoded["attention_mask"].unsqueeze(-1)
    return weights.max(dim=1).values.numpy()


def test_splade_matches_the_formula_and_expands_queries(triton, splade_dir):
    from transformers import AutoTokenizer

    texts = ["berlin", QUERY, PASSAGES[0], PASSAGES[-1]]
    expected = splade_reference(splade_dir, texts)
    result = infer(triton, "splade", texts)
    ids, weights = result.as_numpy("sparse_ids"), result.as_numpy("sparse_weights")
    for row in range(len(texts)):
        real = ids[row] >= 0
        want = np.flatnonzero(expected[row] > 0)
        assert ids[row][real].tolist() == want.tolist()
        np.testing.assert_allclose(weights[row][real], expected[row][want], atol=1e-4)
    tokenizer = AutoTokenizer.from_pretrained(splade_dir)
    berlin = set(tokenizer.convert_ids_to_tokens(ids[0][ids[0] >= 0].tolist()))
    assert "berlin" in berlin and {"german", "germany"} & berlin, f"no expansion: {berlin}"


def test_one_triton_serves_every_task(triton):
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    tasks = {}
    for entry in client.get_model_repository_index(as_json=True)["models"]:
        config = client.get_model_config(entry["name"], as_json=True)["config"]
        if config.get("platform") == "ensemble":
            assert client.is_model_ready(entry["name"])
            tasks[entry["name"]] = config["parameters"]["task"]["string_value"]
    assert set(tasks.values()) == {"embed", "m3", "rerank", "classify", "splade"}

"""The client libraries RAG teams already use, unchanged, against a real gateway and Triton: every
answer compared with a direct Triton call (or sentence-transformers' quantisation)."""

from __future__ import annotations

import numpy as np
import pytest

from prensa.manifest import Manifest
from tests.tiny_models import PROMPTS

pytestmark = pytest.mark.triton

TEXTS = ["Berlin is the capital and largest city of Germany.", "How are module attributes looked up?"]
QUERY = "What is the capital of Germany?"
PASSAGES = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "A quick brown fox."]


def unit(vectors) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def test_huggingface_hub_inference_client(gateway, direct, exports):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=gateway)  # POST / : the default model (minilm), chosen by its task
    np.testing.assert_allclose(client.feature_extraction(TEXTS[0])[0], direct("minilm", TEXTS[:1])["dense"][0],
                               atol=1e-5)
    vectors = direct("minilm", [TEXTS[0], *PASSAGES])["dense"]
    np.testing.assert_allclose(client.sentence_similarity(TEXTS[0], PASSAGES), vectors[1:] @ vectors[0], atol=1e-5)
    prompted = InferenceClient(model=f"{gateway}?model=minilm-prompts").feature_extraction(TEXTS[1], prompt_name="query")
    np.testing.assert_allclose(prompted[0], direct("minilm-prompts", [PROMPTS["query"] + TEXTS[1]])["dense"][0],
                               atol=1e-5)
    classifier = InferenceClient(model=f"{gateway}?model=classifier")
    labels = classifier.text_classification(TEXTS[0])
    scores = direct("classifier", TEXTS[:1])["scores"][0]
    names = Manifest.read(exports["classifier"]).id2label
    assert [item.label for item in labels] == [names[i] for i in np.argsort(-scores, kind="stable").tolist()]
    np.testing.assert_allclose([item.score for item in labels], np.sort(scores)[::-1], atol=1e-5)
    assert len(classifier.text_classification(TEXTS[0], top_k=1)) == 1


def test_openai_sdk_models_and_base64_default(gateway, direct):
    from openai import OpenAI

    client = OpenAI(base_url=f"{gateway}/v1", api_key="unused")
    response = client.embeddings.create(model="bge-m3", input=TEXTS)  # the SDK asks for base64 and decodes it
    np.testing.assert_allclose([d.embedding for d in response.data], direct("bge-m3", TEXTS)["dense"], atol=1e-5)
    assert response.model == "bge-m3"
    ids = {model.id for model in client.models.list()}
    assert {"minilm", "bge-m3", "reranker", "splade"} <= ids
    assert client.models.retrieve("reranker").id == "reranker"


def test_cohere_v1_and_v2_clients(gateway, direct):
    import cohere
    from sentence_transformers.quantization import quantize_embeddings

    v1 = cohere.Client(base_url=gateway, api_key="unused")
    ranked = v1.rerank(model="reranker", query=QUERY, documents=PASSAGES, top_n=2)
    scores = direct("reranker", [QUERY] * 3, PASSAGES)["scores"][:, 0]
    assert [r.index for r in ranked.results] == np.argsort(-scores, kind="stable").tolist()[:2]
    np.testing.assert_allclose([r.relevance_score for r in ranked.results], np.sort(scores)[::-1][:2], atol=1e-5)
    assert all(r.document is None for r in ranked.results)  # Cohere's default
    embedded = v1.embed(texts=TEXTS, model="minilm", input_type="search_query")
    np.testing.assert_allclose(embedded.embeddings, direct("minilm", TEXTS)["dense"], atol=1e-5)

    v2 = cohere.ClientV2(base_url=gateway, api_key="unused")
    ranked = v2.rerank(model="msmarco", query=QUERY, documents=PASSAGES)
    scores = direct("msmarco", [QUERY] * 3, PASSAGES)["scores"][:, 0]
    np.testing.assert_allclose([r.relevance_score for r in ranked.results], np.sort(scores)[::-1], atol=1e-5)
    typed = v2.embed(model="minilm-prompts", texts=TEXTS, input_type="search_query",
                     embedding_types=["float", "ubinary"])
    expected = direct("minilm-prompts", [PROMPTS["query"] + t for t in TEXTS])["dense"]
    np.testing.assert_allclose(typed.embeddings.float_, expected, atol=1e-5)
    np.testing.assert_array_equal(typed.embeddings.ubinary, quantize_embeddings(expected, "ubinary"))


def test_langchain_openai_embeddings(gateway, direct):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=True would fetch tiktoken's files from the internet first.
    embeddings = OpenAIEmbeddings(base_url=f"{gateway}/v1", model="minilm", api_key="unused",
                                  check_embedding_ctx_length=False)
    np.testing.assert_allclose(embeddings.embed_documents(TEXTS), direct("minilm", TEXTS)["dense"], atol=1e-5)
    np.testing.assert_allclose(embeddings.embed_query(TEXTS[1]), direct("minilm", TEXTS[1:])["dense"][0], atol=1e-5)


def test_langchain_nvidia_endpoints(gateway, direct):
    from langchain_core.documents import Document
    from langchain_nvidia_ai_endpoints import NVIDIAEmbeddings, NVIDIARerank

    embeddings = NVIDIAEmbeddings(base_url=f"{gateway}/v1", model="minilm-prompts", truncate="END")
    query = embeddings.embed_query(TEXTS[1])  # input_type query: the model's query prompt
    np.testing.assert_allclose(query, direct("minilm-prompts", [PROMPTS["query"] + TEXTS[1]])["dense"][0], atol=1e-5)
    documents = embeddings.embed_documents(TEXTS)  # input_type passage
    np.testing.assert_allclose(documents, direct("minilm-prompts", [PROMPTS["passage"] + t for t in TEXTS])["dense"],
                               atol=1e-5)
    reranker = NVIDIARerank(base_url=f"{gateway}/v1", model="msmarco", top_n=3)
    ranked = reranker.compress_documents([Document(page_content=p) for p in PASSAGES], QUERY)
    logits = direct("msmarco", [QUERY] * 3, PASSAGES)["logits"][:, 0]
    assert [d.page_content for d in ranked] == [PASSAGES[i] for i in np.argsort(-logits, kind="stable")]
    np.testing.assert_allclose([d.metadata["relevance_score"] for d in ranked], np.sort(logits)[::-1], atol=1e-5)


def test_haystack_tei_integrations(gateway, direct):
    from haystack import Document
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
        HuggingFaceAPITextEmbedder,
    )
    from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker

    params = {"url": gateway}  # POST / with normalize false: the default model's raw pooled vectors
    text = HuggingFaceAPITextEmbedder(api_type="text_embeddings_inference", api_params=params).run(text=TEXTS[0])
    vector = np.asarray(text["embedding"])
    np.testing.assert_allclose(unit(vector), direct("minilm", TEXTS[:1])["dense"][0], atol=1e-5)
    assert abs(np.linalg.norm(vector) - 1) > 1e-3  # not normalised, as asked
    docs = HuggingFaceAPIDocumentEmbedder(api_type="text_embeddings_inference", api_params=params).run(
        documents=[Document(content=t) for t in TEXTS])["documents"]
    np.testing.assert_allclose(unit([d.embedding for d in docs]), direct("minilm", TEXTS)["dense"], atol=1e-5)
    ranker = HuggingFaceTEIRanker(url=gateway, top_k=3)  # /rerank: the first served reranker by name, msmarco
    ranked = ranker.run(query=QUERY, documents=[Document(content=p) for p in PASSAGES])["documents"]
    scores = direct("msmarco", [QUERY] * 3, PASSAGES)["scores"][:, 0]
    assert [d.content for d in ranked] == [PASSAGES[i] for i in np.argsort(-scores, kind="stable")]


def test_litellm_openai_embeddings_and_cohere_rerank(gateway, direct, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its bundled price table, not a download at import
    import litellm

    embedded = litellm.embedding(model="openai/minilm", input=TEXTS, api_base=f"{gateway}/v1", api_key="unused")
    np.testing.assert_allclose([d["embedding"] for d in embedded.data], direct("minilm", TEXTS)["dense"], atol=1e-5)
    assert embedded.usage.prompt_tokens == int(direct("minilm", TEXTS)["num_tokens"].sum())
    ranked = litellm.rerank(model="cohere/reranker", query=QUERY, documents=PASSAGES, top_n=2, api_base=gateway,
                            api_key="unused")
    scores = direct("reranker", [QUERY] * 3, PASSAGES)["scores"][:, 0]
    assert [r["index"] for r in ranked.results] == np.argsort(-scores, kind="stable").tolist()[:2]
    np.testing.assert_allclose([r["relevance_score"] for r in ranked.results], np.sort(scores)[::-1][:2], atol=1e-5)


def test_litellm_vllm_and_infinity_rerank(gateway, start_gateway, direct, monkeypatch):
    """LiteLLM's `hosted_vllm/` and `infinity/` providers send one body to `/rerank` and read its
    documents two ways (an object, a string): `hosted_vllm/` reads vLLM's objects, which `/rerank`
    answers; `infinity/` reads strings, which a gateway run with `--rerank-document-strings` answers."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    scores = direct("reranker", [QUERY] * 3, PASSAGES)["scores"][:, 0]
    order = np.argsort(-scores, kind="stable").tolist()
    strings = start_gateway(rerank_document_strings=True)
    for model, api_base in (("infinity/reranker", strings), ("hosted_vllm/reranker", gateway)):
        ranked = litellm.rerank(model=model, query=QUERY, documents=PASSAGES, api_base=api_base, api_key="unused")
        assert [r["index"] for r in ranked.results] == order, model
        assert [r["document"]["text"] for r in ranked.results] == [PASSAGES[i] for i in order], model
        np.testing.assert_allclose([r["relevance_score"] for r in ranked.results], scores[order], atol=1e-5)


def test_llama_index_tei_embeddings(gateway, direct):
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embeddings = TextEmbeddingsInference(model_name="minilm", base_url=gateway, query_instruction="query: ")
    np.testing.assert_allclose(embeddings.get_text_embedding_batch(TEXTS), direct("minilm", TEXTS)["dense"],
                               atol=1e-5)
    np.testing.assert_allclose(embeddings.get_query_embedding(QUERY), direct("minilm", ["query: " + QUERY])["dense"][0],
                               atol=1e-5)

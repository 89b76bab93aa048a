"""The layouts teams deploy now, served through a real Triton and the gateway and compared with
their own libraries on the same weights: sentence-transformers' `encode` for embedders (5.x and
legacy configs, Dense layers, every pooling, decoder embedders with prompts and left padding,
EmbeddingGemma, ModernBERT), `SparseEncoder.encode` for SPLADE saved by sentence-transformers 5,
and Qwen3-Reranker's model-card formula on transformers for the LLM reranker, on every rerank route;
cross-encoders against CrossEncoder and FlagReranker on pairs too long for them. Every layout also
reads `tiny_layouts.WHITESPACE_TEXTS` (ModernBERT, Qwen3 and the cross-encoder and SPLADE on
ModernBERT keep whitespace as tokens) as its library reads them: none of these strips a text.
Mutated references (a Dense layer dropped, the wrong padding side) must disagree: the comparisons
can fail."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from prensa.addresses import free_port
from prensa.export.llm_reranker import QWEN3_RERANKER
from prensa.export.pipeline import ExportOptions, export_model
from prensa.gateway.settings import GatewaySettings
from prensa.manifest import PairTruncation
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.repo import ModelSource, Pipeline, ServingOptions, build_repository
from tests import tiny_layouts
from tests.gateway.conftest import running_gateway
from tests.tiny_models import tiny_reranker

pytestmark = pytest.mark.triton
# Mixed lengths in one batch: padding shows up wherever a layout gets it wrong.
TEXTS = ["What is the capital of Germany?", "ok",
         "Berlin is the capital and largest city of Germany, and the Spree runs through it. " * 4,
         "Émilie a mangé une pomme à Montréal; 東京は日本の首都です。", *tiny_layouts.WHITESPACE_TEXTS]
QUERY = "What is the capital of Germany?"
DOCUMENTS = ["Berlin is the capital and largest city of Germany.", "Bananas are rich in potassium.",
             "The Bundestag meets in the Reichstag building in Berlin. " * 3, "Paris is the capital of France."]
MAX_DIFF, MIN_COSINE = 1e-4, 0.99999
EMBEDDERS = {  # served name -> (builder, pipeline)
    "st5-dense": (tiny_layouts.dense_embedder, Pipeline.ENSEMBLE),
    "legacy-dense": (lambda d: tiny_layouts.as_legacy(tiny_layouts.dense_embedder(d)), Pipeline.FUSED),
    "cls-max": (lambda d: tiny_layouts.dense_embedder(d, ["cls", "max"]), Pipeline.FUSED),
    "weightedmean": (lambda d: tiny_layouts.plain_embedder(d, "weightedmean"), Pipeline.FUSED),
    "qwen3-embedding": (lambda d: tiny_layouts.decoder_embedder(d, "qwen3"), Pipeline.ENSEMBLE),
    "gte-qwen2": (lambda d: tiny_layouts.decoder_embedder(d, "qwen2"), Pipeline.FUSED),
    "e5-mistral": (lambda d: tiny_layouts.decoder_embedder(d, "mistral"), Pipeline.FUSED),
    "llama-embedding": (lambda d: tiny_layouts.decoder_embedder(d, "llama"), Pipeline.FUSED),
    "embeddinggemma": (tiny_layouts.embedding_gemma, Pipeline.ENSEMBLE),
    "gte-modernbert": (lambda d: tiny_layouts.modernbert(d, "cls"), Pipeline.FUSED),
    "modernbert-embed": (lambda d: tiny_layouts.modernbert(d, "mean"), Pipeline.FUSED),
    "lowercasing": (tiny_layouts.lowercasing, Pipeline.ENSEMBLE),  # `do_lower_case` on a cased tokenizer
    # include_prompt: false, pooled by the pool stage (mean, cls) and by the graph (Dense layers)
    "instructor-mean": (lambda d: tiny_layouts.plain_embedder(d, "mean", include_prompt=False), Pipeline.ENSEMBLE),
    "instructor-cls": (lambda d: tiny_layouts.plain_embedder(d, "cls", include_prompt=False), Pipeline.FUSED),
    "instructor-dense": (lambda d: tiny_layouts.dense_embedder(d, include_prompt=False), Pipeline.ENSEMBLE),
}
LEAVING_PROMPTS_OUT = [name for name in EMBEDDERS if name.startswith("instructor-")]
# sentence-transformers' StaticEmbedding at the root (5.x), and under 0_StaticEmbedding/ with Normalize and a
# tokenizer file that cuts at 8 tokens; model2vec's StaticModel with weights and a quantized vocabulary
STATIC = {"static": (tiny_layouts.static_embedder, Pipeline.ENSEMBLE),
          "static-legacy": (lambda d: tiny_layouts.static_embedder(d, normalize=True, cut=8, legacy=True),
                            Pipeline.FUSED),
          "potion": (tiny_layouts.model2vec_embedder, Pipeline.ENSEMBLE)}
OTHERS = {"splade-st5": (tiny_layouts.sparse_encoder, Pipeline.ENSEMBLE),
          "splade-modernbert": (lambda d: tiny_layouts.sparse_encoder(d, modernbert=True), Pipeline.FUSED),
          "modernbert-cross-encoder": (tiny_layouts.modernbert_cross_encoder, Pipeline.ENSEMBLE),
          "qwen3-reranker": (tiny_layouts.qwen3_reranker, Pipeline.ENSEMBLE),
          "cross-encoder": (lambda d: tiny_reranker(d, spread=SPREAD), Pipeline.FUSED),
          "bert-cross-encoder": (tiny_layouts.bert_cross_encoder, Pipeline.FUSED),
          "flag-reranker": (lambda d: tiny_reranker(d, spread=SPREAD), Pipeline.FUSED)}
SPREAD = 1000.0  # the cross-encoders' scores sharpened: a document cut or kept shows in them
EXPORT_OPTIONS = {"flag-reranker": {"pair_truncation": PairTruncation.CAPPED_QUERY}}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("layouts")
    return {name: build(root / name) for name, (build, _) in {**EMBEDDERS, **STATIC, **OTHERS}.items()}


@pytest.fixture(scope="module")
def served(tmp_path_factory, sources):
    root = tmp_path_factory.mktemp("layout-exports")
    repo = root / "repo"
    for name, (_, pipeline) in {**EMBEDDERS, **STATIC, **OTHERS}.items():
        manifest, report = export_model(ExportOptions(str(sources[name]), root / name,
                                                      **EXPORT_OPTIONS.get(name, {})))
        assert report.ok, (name, report.figures)
        build_repository([ModelSource(name, root / name, manifest)], repo, ServingOptions(pipeline=pipeline))
    ports = TritonPorts(free_port(), free_port(), free_port())
    with TritonProcess(TritonOptions(repo, ports=ports), log_path=root / "tritonserver.log") as triton, \
            running_gateway(GatewaySettings(triton_url=triton.grpc_url, repo=repo)) as url:
        yield url


def post(url: str, path: str, body: dict) -> object:
    response = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def agree(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    cosine = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    return float(np.abs(got - want).max()), float(cosine.min())


def assert_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    diff, cosine = agree(got, want)
    assert diff <= MAX_DIFF and cosine >= MIN_COSINE, (diff, cosine)


def sentence_transformer(path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


@pytest.mark.parametrize("name", list(EMBEDDERS))
def test_embed_equals_sentence_transformers_encode(served, sources, name):
    """`normalize` as the model's pipeline has it (TEI's /embed normalises unless told not to)."""
    model = sentence_transformer(sources[name])
    normalizes = any(type(module).__name__ == "Normalize" for module in model)
    got = np.asarray(post(served, "/embed", {"inputs": TEXTS, "model": name, "normalize": normalizes}))
    assert_equal(got, model.encode(TEXTS, batch_size=len(TEXTS)))


def static_library(path) -> tuple[np.ndarray, bool, list[int] | None]:
    """What a static model's own library answers for TEXTS, whether it normalises, and the tokens it
    reads per text (model2vec leaves its unknown tokens out, so prensa's count is not its own: None)."""
    if (path / "config.json").exists():  # model2vec's
        from model2vec import StaticModel

        model = StaticModel.from_pretrained(str(path))
        return model.encode(TEXTS), model.normalize, None
    model = sentence_transformer(path)
    normalizes = any(type(module).__name__ == "Normalize" for module in model)
    return model.encode(TEXTS, batch_size=len(TEXTS)), normalizes, [len(model.tokenize([t])["input_ids"]) for t in TEXTS]


@pytest.mark.parametrize("name", list(STATIC))
def test_static_embeddings_equal_their_librarys(served, sources, name):
    """Every dense route reads a static model's texts as its library does (no special tokens; `[UNK]`
    kept by sentence-transformers, left out by model2vec; cut only where the tokenizer file says) and
    answers the mean of its rows (a text of no token, whitespace alone, a zero vector as the library's);
    a text past the file's cut is refused unless the client asks for the cut."""
    want, normalizes, tokens = static_library(sources[name])
    assert not want[TEXTS.index(" \t\n ")].any()
    got = post(served, "/embed", {"inputs": TEXTS, "model": name, "normalize": normalizes, "truncate": True})
    np.testing.assert_allclose(np.asarray(got), want, atol=MAX_DIFF)
    answer = post(served, "/v1/embeddings", {"input": TEXTS, "model": name})  # normalised, as TEI's
    unit = want / np.maximum(np.linalg.norm(want, axis=-1, keepdims=True), 1e-12)
    np.testing.assert_allclose(np.asarray([row["embedding"] for row in answer["data"]]), unit, atol=MAX_DIFF)
    if tokens is not None:
        assert answer["usage"]["prompt_tokens"] == sum(tokens)
    if name == "static-legacy":
        refused = httpx.post(f"{served}/embed", json={"inputs": TEXTS[2], "model": name, "truncate": False}, timeout=60)
        assert refused.status_code == 422 and "must have less than 8 tokens" in refused.text, refused.text


@pytest.mark.parametrize(("name", "prompt"), [("qwen3-embedding", "query"), ("embeddinggemma", "document"),
                                              ("embeddinggemma", "query")])
def test_named_prompts_are_applied_as_sentence_transformers_applies_them(served, sources, name, prompt):
    got = np.asarray(post(served, "/embed", {"inputs": TEXTS, "model": name, "prompt_name": prompt}))
    model = sentence_transformer(sources[name])
    assert_equal(got, model.encode(TEXTS, prompt_name=prompt, batch_size=len(TEXTS)))
    assert agree(got, model.encode(TEXTS, batch_size=len(TEXTS)))[1] < MIN_COSINE  # the prompt changes the vectors


def test_nim_input_type_picks_the_query_instruction(served, sources):
    """NIM's `input_type: query` on /v1/embeddings is Qwen3-Embedding's query prompt; passages take none."""
    model = sentence_transformer(sources["qwen3-embedding"])
    for input_type, prompt in (("query", "query"), ("passage", "document")):
        answer = post(served, "/v1/embeddings", {"input": TEXTS, "model": "qwen3-embedding", "input_type": input_type})
        got = np.asarray([row["embedding"] for row in answer["data"]])
        assert_equal(got, model.encode(TEXTS, prompt_name=prompt, batch_size=len(TEXTS)))


@pytest.mark.parametrize("name", LEAVING_PROMPTS_OUT)
def test_a_prompt_left_out_of_the_pooling_is_left_out_on_every_path(served, sources, name):
    """`include_prompt: false`: the prompt is read by the model but not pooled, on /embed (normalised
    by Triton or not) and /v1/embeddings with NIM's input_type, as sentence-transformers does; a
    reference that pools the prompt disagrees."""
    model = sentence_transformer(sources[name])
    want = model.encode(TEXTS, prompt_name="query", batch_size=len(TEXTS))
    for normalize in (True, False):
        got = np.asarray(post(served, "/embed", {"inputs": TEXTS, "model": name, "prompt_name": "query",
                                                 "normalize": normalize}))
        assert_equal(got / np.linalg.norm(got, axis=1, keepdims=True),
                     want / np.linalg.norm(want, axis=1, keepdims=True))
        if not normalize and not any(type(m).__name__ == "Normalize" for m in model):
            assert_equal(got, want)
    answer = post(served, "/v1/embeddings", {"input": TEXTS, "model": name, "input_type": "query"})
    got = np.asarray([row["embedding"] for row in answer["data"]])
    assert_equal(got, want / np.linalg.norm(want, axis=1, keepdims=True))
    model[1].include_prompt = True
    pooled_prompt = model.encode(TEXTS, prompt_name="query", batch_size=len(TEXTS))
    assert agree(got, pooled_prompt / np.linalg.norm(pooled_prompt, axis=1, keepdims=True))[1] < MIN_COSINE


def test_chunking_a_prompt_left_out_of_the_pooling_is_refused(served):
    response = httpx.post(f"{served}/embed", json={"inputs": ["word " * 1000], "model": "instructor-mean",
                                                   "prompt_name": "query", "chunking": {"enabled": True}}, timeout=60)
    assert response.status_code == 422 and "include_prompt: false" in response.text


def test_unnormalised_vectors_come_from_the_graph_before_normalize(served, sources):
    """EmbeddingGemma's Dense layers run in the graph: `normalize: false` is its output before Normalize."""
    from sentence_transformers import SentenceTransformer

    model = sentence_transformer(sources["embeddinggemma"])
    before_normalize = SentenceTransformer(modules=list(model)[:-1], device="cpu")
    got = np.asarray(post(served, "/embed", {"inputs": TEXTS, "model": "embeddinggemma", "normalize": False}))
    assert_equal(got, before_normalize.encode(TEXTS, batch_size=len(TEXTS)))
    assert np.abs(np.linalg.norm(got, axis=1) - 1).max() > 1e-3


def test_a_reference_without_the_dense_layers_disagrees(served, sources):
    """So the equality above would catch a server that skipped them."""
    from sentence_transformers import SentenceTransformer

    model = sentence_transformer(sources["embeddinggemma"])
    without_dense = SentenceTransformer(modules=[model[0], model[1], model[-1]], device="cpu")
    got = np.asarray(post(served, "/embed", {"inputs": TEXTS, "model": "embeddinggemma"}))
    assert agree(got, without_dense.encode(TEXTS, batch_size=len(TEXTS)))[1] < 0.99


def test_a_reference_reading_the_wrong_padding_side_disagrees(served, sources):
    """The last token of right-padded rows read where left padding would put it (index -1) is not
    what prensa serves: the equality above, on this mixed-length batch, would catch such a bug."""
    model = sentence_transformer(sources["qwen3-embedding"])
    model.tokenizer.padding_side = "right"
    features = model.tokenize(TEXTS)
    with torch.no_grad():
        hidden = model[0].auto_model(input_ids=features["input_ids"],
                                     attention_mask=features["attention_mask"]).last_hidden_state
    wrong = torch.nn.functional.normalize(hidden[:, -1], dim=-1).numpy()
    got = np.asarray(post(served, "/embed", {"inputs": TEXTS, "model": "qwen3-embedding"}))
    assert agree(got, wrong)[1] < 0.99


@pytest.mark.parametrize("name", ["splade-st5", "splade-modernbert"])
def test_splade_saved_by_sparse_encoder_equals_its_encode(served, sources, name):
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(sources[name]), device="cpu")
    want = model.encode(TEXTS, convert_to_sparse_tensor=False).numpy()
    answer = post(served, "/embed_sparse", {"inputs": TEXTS, "model": name})
    got = np.zeros_like(want)
    for row, terms in enumerate(answer):
        for term in terms:
            got[row, term["index"]] = term["value"]
    assert (got > 0).sum() > 0 and np.array_equal(got > 0, want > 0)
    assert np.abs(got - want).max() <= MAX_DIFF


# Qwen3-Reranker's model card, written out here rather than taken from prensa.
CARD_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
               'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
CARD_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
CARD_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def card_scores(path, query: str, documents: list[str], instruction: str | None = None) -> np.ndarray:
    """Qwen3-Reranker's model card on transformers: left padding, prefix + instruction + suffix, the
    softmax over the "no" and "yes" logits at the last position, "yes" taken."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prefix = tokenizer.encode(CARD_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(CARD_SUFFIX, add_special_tokens=False)
    texts = [f"<Instruct>: {instruction or CARD_INSTRUCTION}\n<Query>: {query}\n<Document>: {d}"
             for d in documents]
    inputs = tokenizer(texts, padding=False, truncation="longest_first", return_attention_mask=False,
                       max_length=8192 - len(prefix) - len(suffix))
    inputs["input_ids"] = [prefix + ids + suffix for ids in inputs["input_ids"]]
    inputs = tokenizer.pad(inputs, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[:, -1, :]
    pair = torch.stack([logits[:, tokenizer.convert_tokens_to_ids("no")],
                        logits[:, tokenizer.convert_tokens_to_ids("yes")]], dim=1)
    return torch.nn.functional.log_softmax(pair, dim=1)[:, 1].exp().numpy()


def by_index(rows: list[dict], key: str) -> np.ndarray:
    return np.asarray([row[key] for row in sorted(rows, key=lambda row: row["index"])])


def test_qwen3_reranker_equals_the_model_card_on_every_rerank_route(served, sources):
    assert (QWEN3_RERANKER["prefix"], QWEN3_RERANKER["suffix"]) == (CARD_PREFIX, CARD_SUFFIX)
    assert QWEN3_RERANKER["instruction"] == CARD_INSTRUCTION
    want = card_scores(sources["qwen3-reranker"], QUERY, DOCUMENTS)
    assert want.max() - want.min() > 1e-3, "random weights must still order the documents"
    body = {"query": QUERY, "model": "qwen3-reranker"}
    tei = by_index(post(served, "/rerank", {**body, "texts": DOCUMENTS}), "score")
    raw = by_index(post(served, "/rerank", {**body, "texts": DOCUMENTS, "raw_scores": True}), "score")
    cohere = by_index(post(served, "/v1/rerank", {**body, "documents": DOCUMENTS})["results"], "relevance_score")
    v2 = by_index(post(served, "/v2/rerank", {**body, "documents": DOCUMENTS})["results"], "relevance_score")
    nim = post(served, "/v1/ranking", {"model": "qwen3-reranker", "query": {"text": QUERY},
                                       "passages": [{"text": d} for d in DOCUMENTS]})
    nim_logits = by_index(nim["rankings"], "logit")
    for got in (tei, cohere, v2):
        np.testing.assert_allclose(got, want, atol=1e-4)
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), want, atol=1e-4)  # raw: logit(yes) - logit(no)
    np.testing.assert_allclose(nim_logits, raw, atol=1e-4)


def test_a_request_instruction_replaces_the_default(served, sources):
    instruction = "Given a question, find the passage that names a city"
    want = card_scores(sources["qwen3-reranker"], QUERY, DOCUMENTS, instruction)
    for path, key, field in (("/rerank", "score", "texts"), ("/v1/rerank", "relevance_score", "documents")):
        answer = post(served, path, {"query": QUERY, field: DOCUMENTS, "model": "qwen3-reranker",
                                     "instruction": instruction})
        got = by_index(answer["results"] if isinstance(answer, dict) else answer, key)
        np.testing.assert_allclose(got, want, atol=1e-4)
    assert np.abs(want - card_scores(sources["qwen3-reranker"], QUERY, DOCUMENTS)).max() > 1e-4


def test_an_instruction_for_a_cross_encoder_is_refused(served):
    response = httpx.post(f"{served}/rerank", json={"query": QUERY, "texts": DOCUMENTS, "model": "cross-encoder",
                                                     "instruction": "anything"}, timeout=60)
    assert response.status_code == 422 and "instruction" in response.text


def test_an_llm_reranker_refuses_lone_texts(served):
    response = httpx.post(f"{served}/predict", json={"inputs": "just one text", "model": "qwen3-reranker"}, timeout=60)
    assert response.status_code == 422 and "pairs" in response.text


# Pairs past the cross-encoders' 512 tokens: the query, the documents, or both.
LONG_QUERY = "What is the capital of France? " * 100
SHORT_DOCUMENTS = ["Paris is the capital of France.", "Bananas are yellow and rich in potassium."]
LONG_DOCUMENTS = [d * 60 for d in SHORT_DOCUMENTS]
LONG_PAIRS = {"long query": (LONG_QUERY, SHORT_DOCUMENTS), "long documents": (QUERY, LONG_DOCUMENTS),
              "both long": (LONG_QUERY, LONG_DOCUMENTS)}


def rerank_routes(url: str, model: str, query: str, documents: list[str]) -> dict[str, np.ndarray]:
    """One relevance score per document from TEI's, Cohere's and vLLM's routes, in document order."""
    tei = post(url, "/rerank", {"model": model, "query": query, "texts": documents})
    cohere = post(url, "/v1/rerank", {"model": model, "query": query, "documents": documents})
    vllm = post(url, "/score", {"model": model, "text_1": query, "text_2": documents})
    return {"/rerank": by_index(tei, "score"), "/v1/rerank": by_index(cohere["results"], "relevance_score"),
            "/score": by_index(vllm["data"], "score")}


@pytest.mark.parametrize("case", list(LONG_PAIRS))
@pytest.mark.parametrize("name", ["cross-encoder", "bert-cross-encoder"])
def test_long_pairs_score_as_crossencoder_scores_them(served, sources, name, case):
    """Longest-first, as CrossEncoder (and TEI) cut a pair: a long query no longer pushes the document out."""
    from sentence_transformers import CrossEncoder

    query, documents = LONG_PAIRS[case]
    want = CrossEncoder(str(sources[name]), max_length=512).predict([(query, d) for d in documents])
    assert abs(want[0] - want[1]) > 4e-4, "random weights must still tell the documents apart"
    for route, got in rerank_routes(served, name, query, documents).items():
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=route)


@pytest.mark.parametrize("case", list(LONG_PAIRS))
def test_a_capped_query_export_scores_as_flagreranker_scores(served, sources, case):
    from FlagEmbedding import FlagReranker

    query, documents = LONG_PAIRS[case]
    reranker = FlagReranker(str(sources["flag-reranker"]), use_fp16=False, devices="cpu")
    want = np.asarray(reranker.compute_score([[query, d] for d in documents], max_length=512, normalize=True))
    for route, got in rerank_routes(served, "flag-reranker", query, documents).items():
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=route)
    if case != "long documents":  # where the query passes FlagReranker's cap, the two rules differ
        longest_first = rerank_routes(served, "cross-encoder", query, documents)["/rerank"]
        assert np.abs(longest_first - want).max() > 1e-4


def test_an_llm_reranker_refuses_a_query_that_leaves_no_room_for_the_document(served):
    """The model card cuts the filled-in prompt from its end, so such a query scores every document
    alike; prensa refuses it instead, naming why."""
    response = httpx.post(f"{served}/rerank", json={"query": "capital " * 9000, "texts": DOCUMENTS,
                                                     "model": "qwen3-reranker"}, timeout=60)
    assert response.status_code == 422 and "leaving none for the document" in response.text


# A query and documents with whitespace around and inside them, read as each library reads them.
SPACED_QUERY = "  What is the capital of Germany?\n"
SPACED_DOCUMENTS = [*tiny_layouts.WHITESPACE_TEXTS, "Berlin is the capital of Germany."]


@pytest.mark.parametrize("name", ["cross-encoder", "bert-cross-encoder", "modernbert-cross-encoder"])
def test_whitespace_in_pairs_scores_as_crossencoder_scores_it(served, sources, name):
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(sources[name]), max_length=512)
    want = model.predict([(SPACED_QUERY, d) for d in SPACED_DOCUMENTS])
    for route, got in rerank_routes(served, name, SPACED_QUERY, SPACED_DOCUMENTS).items():
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=route)
    if name == "modernbert-cross-encoder":  # its tokens keep the whitespace: stripped texts score otherwise
        stripped = model.predict([(SPACED_QUERY.strip(), d.strip()) for d in SPACED_DOCUMENTS])
        assert np.abs(stripped - want).max() > 1e-3


def test_whitespace_in_pairs_scores_as_the_qwen3_reranker_card_scores_it(served, sources):
    want = card_scores(sources["qwen3-reranker"], SPACED_QUERY, SPACED_DOCUMENTS)
    got = by_index(post(served, "/rerank", {"query": SPACED_QUERY, "texts": SPACED_DOCUMENTS,
                                            "model": "qwen3-reranker"}), "score")
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("name", ["gte-modernbert", "qwen3-embedding"])
def test_whitespace_is_read_not_stripped_where_the_library_keeps_it(served, sources, name):
    """sentence-transformers 5.4 and later hand texts to the tokenizer as given: a stripped reading
    answers otherwise on a byte-level tokenizer, so the equality above would catch a server that strips."""
    model = sentence_transformer(sources[name])
    spaced = tiny_layouts.WHITESPACE_TEXTS[:2]
    got = np.asarray(post(served, "/embed", {"inputs": spaced, "model": name}))
    assert agree(got, model.encode([t.strip() for t in spaced]))[1] < MIN_COSINE


def test_a_model_that_lowercases_reads_texts_lowercased(served, sources, tmp_path):
    """`do_lower_case` with a cased tokenizer file: served as sentence-transformers reads it (the
    equality above); the same weights read as cased, a reference that skipped it, answer otherwise."""
    import shutil

    cased = tiny_layouts.lowercasing(tmp_path / "cased", lowercase=False)
    shutil.copy2(sources["lowercasing"] / "model.safetensors", cased / "model.safetensors")
    got = np.asarray(post(served, "/embed", {"inputs": TEXTS, "model": "lowercasing"}))
    assert agree(got, sentence_transformer(cased).encode(TEXTS, batch_size=len(TEXTS)))[1] < MIN_COSINE

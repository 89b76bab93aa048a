"""bge-m3 (tiny, same architecture) and all-MiniLM-L6-v2 (real) through a real Triton, compared
with FlagEmbedding and sentence-transformers on the same weights; bge-m3's texts include whitespace
around and inside them, which FlagEmbedding reads as given (its Metaspace tokens keep spaces)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from prensa.triton.metrics import scrape
from tests import tiny_layouts
from tests.conftest import counted_since

pytestmark = pytest.mark.triton

TEXTS = [
    "What is the capital of Germany?",
    "Berlin is the capital and largest city of Germany. " * 6,
    "ok",
    "Émilie a mangé une pomme à Montréal; 東京は日本の首都です。",
    "Late interaction keeps one vector per token and scores with max similarity over the passage tokens.",
]
M3_TEXTS = [*TEXTS, *tiny_layouts.WHITESPACE_TEXTS]


def infer(protocol: str, server, model: str, texts: list[str]) -> dict[str, np.ndarray]:
    module, url = (httpclient, server.http_url) if protocol == "http" else (grpcclient, server.grpc_url)
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    result = client.infer(model, [tensor])
    names = [o["name"] if isinstance(o, dict) else o.name for o in
             (result.get_response()["outputs"] if protocol == "http" else result.get_response().outputs)]
    return {name: result.as_numpy(name) for name in names}


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def sparse_cosine(got: dict[int, float], want: dict[int, float]) -> float:
    """Cosine of two sparse weight sets over the union of their ids; two empty sets agree."""
    ids = sorted(got.keys() | want.keys())
    if not ids:
        return 1.0
    return float(cosine(np.asarray([got.get(i, 0.0) for i in ids]), np.asarray([want.get(i, 0.0) for i in ids])))


@pytest.fixture(scope="module")
def flag_m3(m3_dir):
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(str(m3_dir), use_fp16=False, devices="cpu")
    return model.encode(M3_TEXTS, batch_size=8, max_length=512, return_dense=True, return_sparse=True,
                        return_colbert_vecs=True)


@pytest.mark.parametrize("model", ["bge-m3", "bge-m3-fused"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bge_m3_matches_flagembedding(triton, flag_m3, protocol, model):
    out = infer(protocol, triton, model, M3_TEXTS)
    assert cosine(out["dense"], flag_m3["dense_vecs"]).min() >= 0.9999
    for row, expected in enumerate(flag_m3["lexical_weights"]):
        ids, weights = out["sparse_ids"][row], out["sparse_weights"][row]
        real = ids >= 0
        # the fixture's positive sparse bias gives every text with a word some lexical weights
        assert expected or M3_TEXTS[row].isspace()
        assert sorted(int(i) for i in ids[real]) == sorted(int(k) for k in expected)
        got = dict(zip(ids[real].tolist(), weights[real].tolist()))
        np.testing.assert_allclose([got[int(k)] for k in expected], [float(v) for v in expected.values()], atol=1e-4)
        assert np.all(weights[~real] == 0) and list(ids[real]) == sorted(ids[real])
    for row, expected in enumerate(flag_m3["colbert_vecs"]):
        n = int(out["num_tokens"][row, 0]) - 1
        assert n == expected.shape[0]
        np.testing.assert_allclose(out["colbert"][row, :n], expected, atol=1e-4)
        assert not out["colbert"][row, n:].any()


@pytest.mark.parametrize(("model", "encoder"), [("minilm", "minilm_encode"), ("minilm-fused", "minilm-fused")])
def test_minilm_matches_sentence_transformers_under_concurrency(triton, minilm_dir, model, encoder):
    from sentence_transformers import SentenceTransformer

    texts = [("word " * n).strip() + f" number {n}" for n in (1, 3, 120, 7, 60, 2, 200, 15, 33, 90, 5, 150)] * 2
    before = scrape(triton.metrics_url)
    with ThreadPoolExecutor(len(texts)) as pool:
        rows = list(pool.map(lambda t: infer("http", triton, model, [t])["dense"][0], texts))
    counted = counted_since(triton.metrics_url, before, (encoder,), len(texts))[encoder]
    requests, executions = counted.success, counted.executions
    expected = SentenceTransformer(str(minilm_dir), device="cpu").encode(texts)
    assert cosine(np.stack(rows), expected).min() >= 0.9999
    assert requests == len(texts)
    assert executions < requests, f"{requests} requests ran in {executions} encoder executions: no batching"


def test_num_tokens_counts_special_tokens(triton, minilm_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    out = infer("grpc", triton, "minilm", TEXTS)
    expected = [len(tokenizer(t, truncation=True, max_length=256)["input_ids"]) for t in TEXTS]
    assert out["num_tokens"].ravel().tolist() == expected


def test_text_longer_than_max_length_is_truncated(triton, minilm_dir):
    from sentence_transformers import SentenceTransformer

    long = "Berlin is the capital and largest city of Germany. " * 60
    out = infer("grpc", triton, "minilm", [long, "short"])
    assert out["num_tokens"].ravel().tolist()[0] == 256
    expected = SentenceTransformer(str(minilm_dir), device="cpu").encode([long])  # truncates at 256 too
    assert cosine(out["dense"][:1], expected).min() >= 0.9999

"""bge-m3 and bge-reranker-v2-m3 at their real size (XLM-R large, 2.27 GB in fp32), and Qwen3-Embedding-0.6B's
(2.4 GB), random weights: exported (fp32 fused, int8), rendered, served by a real Triton behind the
gateway, and answering as FlagEmbedding, FlagReranker and sentence-transformers do on the same weights. Prints each step's time and peak memory and
each Triton stub's memory, the figures docs/performance.md records.

Not part of `make test`: it takes about 20 minutes and 16 GB on a 2-core machine. Run it by hand:
`PRENSA_REAL_SIZE=/some/work/dir .venv/bin/python -m pytest -s tests/real_size` (the synthetic
models and exports stay in that folder between runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from prensa.addresses import free_port
from prensa.gateway.settings import GatewaySettings
from prensa.manifest import Manifest
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
from tests.e2e.test_embeddings_triton import cosine, sparse_cosine
from tests.gateway.conftest import running_gateway

WORK = os.environ.get("PRENSA_REAL_SIZE")
pytestmark = [pytest.mark.triton,
              pytest.mark.skipif(not WORK, reason="real-size run: set PRENSA_REAL_SIZE to a work folder (by hand only)"),
              pytest.mark.timeout(7200)]
PRENSA = str(Path(sys.executable).with_name("prensa"))
LONG = "Berlin is the capital and largest city of Germany, and its sixteen states share one parliament. " * 40
TEXTS = ["What is the capital of Germany?", "ok", "Émilie a mangé une pomme à Montréal; 東京は日本の首都です。", LONG]
QUERY = "What is the capital of Germany?"
PASSAGES = ["Berlin is the capital and largest city of Germany.", "Bananas are rich in potassium.",
            "The Bundestag meets in the Reichstag building in Berlin.", LONG]
EXPORTS = {"bge-m3": ("m3", []), "bge-m3-int8": ("m3", ["--quantize", "int8"]), "reranker": ("reranker", []),
           "qwen3-embedding": ("qwen3", [])}


def peak_rss(process: psutil.Process, stop: threading.Event, peaks: list[int]) -> None:
    """Sample the RSS of `process` and its children until `stop`; the largest sum lands in `peaks`."""
    while not stop.is_set():
        try:
            family = [process, *process.children(recursive=True)]
            peaks[0] = max(peaks[0], sum(p.memory_info().rss for p in family if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.1)


def timed(command: list[str], label: str) -> None:
    """Run `command`, printing its wall time and the peak memory of its process tree."""
    started, stop, peaks = time.monotonic(), threading.Event(), [0]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "COLUMNS": "200"})
    sampler = threading.Thread(target=peak_rss, args=(psutil.Process(process.pid), stop, peaks), daemon=True)
    sampler.start()
    output, _ = process.communicate()
    stop.set()
    sampler.join()
    print(f"\n{label}: {time.monotonic() - started:.1f} s, peak {peaks[0] / 2**30:.2f} GiB\n{output[-3000:]}")
    assert process.returncode == 0, output


@pytest.fixture(scope="module")
def work() -> Path:
    return Path(WORK or ".")


@pytest.fixture(scope="module")
def sources(work) -> dict[str, Path]:
    from prensa.export import synthetic

    built = {"m3": work / "bge-m3-full", "reranker": work / "bge-reranker-full", "qwen3": work / "qwen3-embedding-full"}
    if not (built["m3"] / "colbert_linear.pt").exists():
        synthetic.bge_m3(built["m3"], "full")
    if not (built["reranker"] / "model.safetensors").exists():
        synthetic.bge_reranker(built["reranker"], "full")
    if not (built["qwen3"] / "modules.json").exists():
        synthetic.qwen3_embedding(built["qwen3"], "full")
    return built


@pytest.fixture(scope="module")
def exports(work, sources) -> dict[str, Path]:
    out = {}
    for name, (source, flags) in EXPORTS.items():
        out[name] = work / "exports" / name
        if not (out[name] / "prensa.json").exists():
            timed([PRENSA, "export", str(sources[source]), "--out", str(out[name]), *flags], f"export {name}")
    return out


@pytest.fixture(scope="module")
def served(work, exports):
    repo = work / "repo"
    started = time.monotonic()
    build_repository([ModelSource(n, p, Manifest.read(p)) for n, p in exports.items()], repo, ServingOptions())
    print(f"\nrepo build: {time.monotonic() - started:.1f} s")
    ports = TritonPorts(free_port(), free_port(), free_port())
    started = time.monotonic()
    with TritonProcess(TritonOptions(repo, ports=ports), log_path=work / "tritonserver.log") as triton:
        print(f"Triton ready: {time.monotonic() - started:.1f} s")
        stubs = [p for p in psutil.process_iter(["name", "cmdline"]) if "stub" in (p.info["name"] or "")]
        for stub in sorted(stubs, key=lambda p: p.memory_info().rss, reverse=True):
            model = next((Path(a).parent.parent.name for a in stub.info["cmdline"] if a.endswith("model.py")), "?")
            print(f"  stub {model}: {stub.memory_info().rss / 2**30:.2f} GiB")
        # A text of 900 tokens through XLM-R large takes tens of seconds on 2 busy cores.
        settings = GatewaySettings(triton_url=triton.grpc_url, repo=repo, default_model="bge-m3", triton_timeout_s=600)
        with running_gateway(settings) as url:
            yield url


@pytest.fixture(scope="module")
def flag_m3(sources):
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(str(sources["m3"]), use_fp16=False, devices="cpu")
    return model.encode(TEXTS, batch_size=4, max_length=8192, return_dense=True, return_sparse=True,
                        return_colbert_vecs=True)


@pytest.mark.parametrize(("model", "least"), [("bge-m3", 0.9999), ("bge-m3-int8", 0.95)])
def test_embed_m3_equals_flagembedding(served, flag_m3, model, least):
    response = httpx.post(f"{served}/embed_m3", json={"inputs": TEXTS, "model": model}, timeout=600)
    assert response.status_code == 200, response.text
    answer = response.json()
    dense = np.asarray([row["dense"] for row in answer])
    colbert = [cosine(np.asarray(row["colbert"]), expected).min()
               for row, expected in zip(answer, flag_m3["colbert_vecs"])]
    sparse = [sparse_cosine({int(w["index"]): w["value"] for w in row["sparse"]},
                            {int(k): float(v) for k, v in expected.items()})
              for row, expected in zip(answer, flag_m3["lexical_weights"])]
    print(f"\n{model}: least cosine to FlagEmbedding: dense {cosine(dense, flag_m3['dense_vecs']).min():.6f}, "
          f"ColBERT {min(colbert):.6f}, sparse weights {min(sparse):.6f}; tokens {[row['num_tokens'] for row in answer]}")
    assert answer[-1]["num_tokens"] > 512
    assert cosine(dense, flag_m3["dense_vecs"]).min() >= least
    assert min(colbert) >= least and min(sparse) >= least
    if least > 0.999:  # fp32: the same terms, the same weights
        for row, expected in zip(answer, flag_m3["lexical_weights"]):
            got = {int(w["index"]): w["value"] for w in row["sparse"]}
            assert got.keys() == {int(k) for k in expected}
            np.testing.assert_allclose([got[int(k)] for k in expected], [float(v) for v in expected.values()], atol=1e-4)


def test_rerank_equals_flagreranker(served, sources):
    from FlagEmbedding import FlagReranker

    reranker = FlagReranker(str(sources["reranker"]), use_fp16=False, devices="cpu")
    expected = np.asarray(reranker.compute_score([[QUERY, p] for p in PASSAGES], max_length=512))
    answer = httpx.post(f"{served}/rerank", json={"query": QUERY, "texts": PASSAGES, "raw_scores": True,
                                                 "model": "reranker"}, timeout=600).json()
    scores = np.asarray([row["score"] for row in sorted(answer, key=lambda row: row["index"])])
    print(f"\nreranker: max |score - FlagReranker| {np.abs(scores - expected).max():.2e}")
    np.testing.assert_allclose(scores, expected, atol=1e-4)


def test_qwen3_embedding_equals_sentence_transformers(served, sources):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(sources["qwen3"]), device="cpu")
    for prompt in (None, "query"):
        body = {"inputs": TEXTS, "model": "qwen3-embedding", **({"prompt_name": prompt} if prompt else {})}
        response = httpx.post(f"{served}/embed", json=body, timeout=600)
        assert response.status_code == 200, response.text
        got, want = np.asarray(response.json()), model.encode(TEXTS, prompt_name=prompt, batch_size=len(TEXTS))
        print(f"\nqwen3-embedding (prompt {prompt}): max |diff| {np.abs(got - want).max():.2e}, "
              f"least cosine {cosine(got, want).min():.6f}")
        assert np.abs(got - want).max() <= 1e-4 and cosine(got, want).min() >= 0.99999

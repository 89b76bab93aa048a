"""PyLate's own answers, the oracle of the late-interaction tests: run by PyLate's interpreter
(`make pylate`: its venv, since PyLate pins another sentence-transformers than prensa's), never
imported by the tests. Reads one JSON job from the file named first, writes its answer as JSON to
the file named second.

Jobs: `{"build": {...}}` saves a PyLate model (a transformer and a Dense projection, seeded) as
PyLate saves one; `{"model": dir, "queries": [...], "documents": [...]}` answers
`encode(is_query=True/False)` of each, `rank.rerank` of the documents for each query, and
`scores.colbert_scores` of each (query, document) pair on its own, which prensa serves: `rank.rerank`
pads a list's documents with zero vectors, and a zero vector's similarity 0 beats a short document's
negative ones.
"""

from __future__ import annotations

import json
import sys

import torch
from pylate import models, rank, scores
from sentence_transformers.models import Transformer


def build(job: dict) -> dict:
    torch.manual_seed(job["seed"])
    transformer = Transformer(job["base"])
    projection = models.Dense(transformer.get_word_embedding_dimension(), job["dim"], bias=False)
    model = models.ColBERT(modules=[transformer, projection], device="cpu",
                           query_length=job["query_length"], document_length=job["document_length"],
                           attend_to_expansion_tokens=job.get("attend_to_expansion_tokens", False))
    model.save(job["out"])
    return {"saved": job["out"]}


def answer(job: dict) -> dict:
    model = models.ColBERT(job["model"], device="cpu")
    queries = model.encode(job["queries"], is_query=True, batch_size=len(job["queries"]))
    documents = model.encode(job["documents"], is_query=False, batch_size=len(job["documents"]))
    ranked = rank.rerank(documents_ids=[list(range(len(job["documents"])))] * len(queries),
                         queries_embeddings=queries,
                         documents_embeddings=[documents] * len(queries))
    pairs = [[float(scores.colbert_scores(torch.as_tensor(q)[None], torch.as_tensor(d)[None])[0, 0])
              for d in documents] for q in queries]
    return {"queries": [q.tolist() for q in queries], "documents": [d.tolist() for d in documents],
            "rerank": [[{"id": int(r["id"]), "score": float(r["score"])} for r in row] for row in ranked],
            "pair_scores": pairs}


if __name__ == "__main__":
    with open(sys.argv[1]) as job:
        request = json.load(job)
    result = build(request["build"]) if "build" in request else answer(request)
    with open(sys.argv[2], "w") as out:
        json.dump(result, out)

"""The baseline prensa is measured against: a plain FastAPI app that runs sentence-transformers
on each request as it arrives (no cross-request batching). Run by `prensa bench` as
`python -m prensa.bench.plain_server MODEL_DIR pairs|texts PORT`: a CrossEncoder scoring pairs, or
a SentenceTransformer embedding texts."""

from __future__ import annotations

import sys
from typing import Any

import uvicorn
from fastapi import FastAPI

from prensa.addresses import LOOPBACK

PAIRS, TEXTS = "pairs", "texts"  # what the model reads: its command-line word


def create_app(model_dir: str, reads: str) -> FastAPI:
    from sentence_transformers import CrossEncoder, SentenceTransformer

    app = FastAPI()
    if reads == PAIRS:
        model = CrossEncoder(model_dir, device="cpu")

        @app.post("/rerank")
        def rerank(body: dict[str, Any]) -> list[float]:
            scores: list[float] = model.predict(
                [(body["query"], text) for text in body["texts"]]
            ).tolist()
            return scores
    else:
        model = SentenceTransformer(model_dir, device="cpu")

        @app.post("/embed")
        def embed(body: dict[str, Any]) -> list[list[float]]:
            vectors: list[list[float]] = model.encode(body["inputs"]).tolist()
            return vectors

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {}

    return app


if __name__ == "__main__":
    model_dir, reads, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    uvicorn.run(create_app(model_dir, reads), host=LOOPBACK, port=port, log_level="warning")

"""Locust scenarios against the prensa gateway: OpenAI embeddings, TEI /embed, /embed_sparse and
/rerank. `prensa loadtest` runs them headless with the step load below; plain `locust -f` works
too. Texts come from prensa's benchmark workload (real prose, short queries and passages).

Environment: PRENSA_EMBED_MODEL, PRENSA_SPARSE_MODEL, PRENSA_RERANK_MODEL (served model names),
PRENSA_STEP_USERS / PRENSA_STEP_SECONDS / PRENSA_STEPS (the step load shape).
"""

from __future__ import annotations

import os
import random

from locust import HttpUser, LoadTestShape, between, task

from prensa.workload import embedding_texts, rerank_cases

TEXTS = embedding_texts(2000, seed=11)
CASES = rerank_cases(200, 10, seed=11)


def _model_query(variable: str) -> str:
    name = os.environ.get(variable)
    return f"?model={name}" if name else ""


class OpenAIEmbeddingsUser(HttpUser):
    """One text per request to /v1/embeddings, as OpenAI clients send online queries."""

    wait_time = between(0, 0.05)

    @task
    def embeddings(self) -> None:
        body = {"input": random.choice(TEXTS), "model": os.environ.get("PRENSA_EMBED_MODEL", "")}
        self.client.post("/v1/embeddings", json=body, name="/v1/embeddings")


class TEIEmbedUser(HttpUser):
    wait_time = between(0, 0.05)

    @task
    def embed(self) -> None:
        self.client.post(
            "/embed" + _model_query("PRENSA_EMBED_MODEL"),
            json={"inputs": random.choice(TEXTS)},
            name="/embed",
        )


class TEISparseUser(HttpUser):
    wait_time = between(0, 0.05)

    @task
    def embed_sparse(self) -> None:
        self.client.post(
            "/embed_sparse" + _model_query("PRENSA_SPARSE_MODEL"),
            json={"inputs": random.choice(TEXTS)},
            name="/embed_sparse",
        )


class TEIRerankUser(HttpUser):
    wait_time = between(0, 0.05)

    @task
    def rerank(self) -> None:
        case = random.choice(CASES)
        self.client.post(
            "/rerank" + _model_query("PRENSA_RERANK_MODEL"),
            json={"query": case.query, "texts": case.passages},
            name="/rerank",
        )


class StepLoad(LoadTestShape):
    """Add PRENSA_STEP_USERS users every PRENSA_STEP_SECONDS, PRENSA_STEPS times, then stop."""

    step_users = int(os.environ.get("PRENSA_STEP_USERS", "8"))
    step_seconds = float(os.environ.get("PRENSA_STEP_SECONDS", "20"))
    steps = int(os.environ.get("PRENSA_STEPS", "4"))

    def tick(self) -> tuple[int, int] | None:
        elapsed: float = self.get_run_time()  # type: ignore[no-untyped-call]  # locust leaves it unannotated
        if elapsed >= self.step_seconds * self.steps:
            return None
        users = self.step_users * (int(elapsed // self.step_seconds) + 1)
        return users, users

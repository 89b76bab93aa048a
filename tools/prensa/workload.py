"""A deterministic workload of real English prose, available offline everywhere: the bench's
requests, and the texts export calibrates and checks quantisation on (so it sits below both).

CPython ships its language reference as prose (`pydoc_data.topics`); its paragraphs give
passages of 60-250 words, and their opening clauses give short, query-like texts. The mix
(30% queries, 70% passages) mirrors RAG traffic: queries online, passages at indexing time.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

QUERY_SHARE = 0.3


class Workloads(str, Enum):
    """What `prensa bench` sends an embedder: the RAG mix, or short queries only (the online,
    latency-critical half, where a request's fixed costs weigh most)."""

    MIXED = "mixed"
    QUERIES = "queries"


@dataclass(frozen=True)
class RerankCase:
    query: str
    passages: list[str]


@lru_cache(maxsize=1)
def _paragraphs() -> tuple[str, ...]:
    from pydoc_data.topics import topics

    found = []
    for name in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[name]):
            text = " ".join(block.split())
            words = len(text.split())
            if 60 <= words <= 250 and not text.startswith((">>>", "...")) and "::" not in text:
                found.append(text)
    return tuple(found)


def _query_from(paragraph: str, rng: random.Random) -> str:
    words = re.sub(r"[\"“”()]", "", paragraph).split()
    start = rng.randrange(0, max(1, len(words) - 12))
    return " ".join(words[start : start + rng.randint(4, 12)]).rstrip(".,;:") + "?"


def passages() -> list[str]:
    return list(_paragraphs())


def embedding_texts(count: int, seed: int = 0) -> list[str]:
    """`count` texts in a fixed order: short queries and 60-250 word passages, mixed."""
    rng = random.Random(seed)
    pool = _paragraphs()
    texts = []
    for _ in range(count):
        paragraph = pool[rng.randrange(len(pool))]
        texts.append(_query_from(paragraph, rng) if rng.random() < QUERY_SHARE else paragraph)
    return texts


def query_texts(count: int, seed: int = 0) -> list[str]:
    """`count` short query-like texts (4-12 words from a passage, as a question)."""
    rng = random.Random(seed)
    pool = _paragraphs()
    return [_query_from(pool[rng.randrange(len(pool))], rng) for _ in range(count)]


def rerank_cases(queries: int, passages_per_query: int, seed: int = 0) -> list[RerankCase]:
    """Each query is drawn from one of its candidate passages, so the right answer exists."""
    rng = random.Random(seed)
    pool = _paragraphs()
    cases = []
    for _ in range(queries):
        candidates = rng.sample(pool, passages_per_query)
        cases.append(RerankCase(_query_from(candidates[0], rng), candidates))
    return cases

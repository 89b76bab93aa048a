"""A deterministic workload of real English prose, available offline everywhere: the bench's
requests, and the texts export calibrates and checks quantisation on (so it sits below both).

CPython ships its language reference as prose (`pydoc_data.topics`); its paragraphs give
passages of 60-250 words, and their opening clauses give short, query-like texts. The mix
(30% queries, 70% passages) mirrors RAG traffic: queries online, passages at indexing time.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

import numpy as np

QUERY_SHARE = 0.3


class Workloads(str, Enum):
    """What `prensa bench` sends an embedder: the RAG mix, or short queries only (the online,
    latency-critical half, where a request's fixed costs weigh most)."""

    MIXED = "mixed"
    QUERIES = "queries"
    # short queries repeated as search traffic repeats them: where a response cache pays
    ZIPF = "zipf"


# A Zipf stream (rank k asked with weight k^-s) over this many distinct queries, as search logs look.
ZIPF_DISTINCT, ZIPF_S = 10_000, 1.1


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


# Query vocabulary for the Zipf stream: every combination is a distinct, plausible search query.
ASKING = [
    "how do",
    "why do",
    "when do",
    "where do",
    "what makes",
    "who repairs",
    "best way to clean",
    "cheap ways to insure",
    "history of",
    "rules for",
    "safety of",
    "cost of",
    "how long do",
    "can children visit",
    "photos of",
    "opening hours for",
    "tickets for",
    "reviews of",
    "map of",
    "news about",
    "weather near",
    "events at",
    "jobs at",
    "parking near",
    "tours of",
]
SUBJECTS = [
    "old bridges",
    "river ferries",
    "city museums",
    "mountain huts",
    "night trains",
    "public libraries",
    "harbour cranes",
    "tram lines",
    "castle ruins",
    "botanical gardens",
    "ice rinks",
    "wind farms",
    "village bakeries",
    "lighthouses",
    "street markets",
    "football stadiums",
    "ski lifts",
    "concert halls",
    "canal locks",
    "zoos",
]
PLACES = [
    "in lisbon",
    "in oslo",
    "in kyoto",
    "in quebec",
    "in porto",
    "in bergen",
    "in vienna",
    "in cusco",
    "in hobart",
    "in tallinn",
    "in seville",
    "in dublin",
    "in krakow",
    "in lyon",
    "in ghent",
    "in turin",
    "in galway",
    "in bilbao",
    "in utrecht",
    "in gdansk",
]


def distinct_queries(count: int, rng: np.random.Generator) -> list[str]:
    """`count` distinct short queries in a random rank order (rank 0 the most asked)."""
    every = [" ".join(words) for words in itertools.product(ASKING, SUBJECTS, PLACES)]
    if count > len(every):
        raise ValueError(f"at most {len(every)} distinct queries")
    order = rng.permutation(len(every))[:count]
    return [every[i] for i in order]


def zipf_ranks(count: int, distinct: int, s: float, rng: np.random.Generator) -> list[int]:
    """`count` ranks out of `distinct`, rank k (from 1) drawn with probability proportional to k^-s."""
    weights = np.arange(1, distinct + 1, dtype=np.float64) ** -s
    ranks: list[int] = rng.choice(distinct, size=count, p=weights / weights.sum()).tolist()
    return ranks


def zipf_queries(
    count: int, seed: int = 0, distinct: int = ZIPF_DISTINCT, s: float = ZIPF_S
) -> list[str]:
    """`count` queries drawn from `distinct` by a Zipf law of exponent `s`: a few asked again and again."""
    rng = np.random.default_rng(seed)
    texts = distinct_queries(distinct, rng)
    return [texts[rank] for rank in zipf_ranks(count, distinct, s, rng)]


def rerank_cases(queries: int, passages_per_query: int, seed: int = 0) -> list[RerankCase]:
    """Each query is drawn from one of its candidate passages, so the right answer exists."""
    rng = random.Random(seed)
    pool = _paragraphs()
    cases = []
    for _ in range(queries):
        candidates = rng.sample(pool, passages_per_query)
        cases.append(RerankCase(_query_from(candidates[0], rng), candidates))
    return cases

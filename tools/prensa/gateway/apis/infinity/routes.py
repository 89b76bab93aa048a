"""Infinity's operations on the paths it shares (`/rerank`, `/classify`; `apis.shared` routes them):
Infinity's body into an ask, the answer in Infinity's shape. Infinity cuts every input to the
model's length; its errors are TEI's shape, as prensa answered Infinity's clients before."""

from __future__ import annotations

from typing import Any

from prensa.gateway.apis.answers import opening, ranked_labels, ranking, text_list, usage
from prensa.gateway.apis.infinity.protocol import InfinityClassifyRequest, InfinityRerankRequest
from prensa.gateway.apis.operation import Operation
from prensa.gateway.core.asks import RelevanceAsk, ScoresAsk
from prensa.gateway.core.registry import ServedModel
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.reranking import document_scores
from prensa.gateway.state import Gateway
from prensa.layouts import Capability


async def _rerank(
    request: InfinityRerankRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    """Each document as a string with `return_documents`, else none."""
    documents = request.documents
    ask = RelevanceAsk(
        model=served,
        query=request.query,
        texts=list(documents),
        truncation=gw.service.truncation(None, "right"),
        raw_scores=request.raw_scores,
        weights=request.weights,
        instruction=request.instruction,
    )
    scores, used = await document_scores(
        gw.service, ask, context, max_tokens=request.max_tokens_per_doc
    )
    return {
        **opening("rerank", served),
        "object": "rerank",
        "usage": usage(used),
        "results": [
            {
                "relevance_score": float(scores[i]),
                "index": i,
                "document": documents[i] if request.return_documents else None,
            }
            for i in ranking(scores, request.top_n)
        ],
    }


async def _classify(
    request: InfinityClassifyRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    """Every label of each input by score, best first."""
    texts = text_list(request.input)
    scored = await gw.service.run(
        ScoresAsk(
            model=served,
            items=list(texts),
            truncation=gw.service.truncation(None, "right"),
            raw_scores=request.raw_scores,
        ),
        context,
    )
    return {
        **opening("classify", served),
        "object": "classify",
        "data": ranked_labels(scored.values, served.id2label),
        "usage": usage(int(scored.num_tokens.sum())),
    }


RERANK = Operation("rerank", InfinityRerankRequest, Capability.RERANK, _rerank)
CLASSIFY = Operation("classify", InfinityClassifyRequest, Capability.PREDICT, _classify)

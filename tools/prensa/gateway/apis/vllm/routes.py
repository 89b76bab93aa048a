"""vLLM's pooling routes: `/pooling`, its own path, and its operations on the paths it shares with
other dialects (`/classify`, `/rerank`, `/score`, `/tokenize`; `apis.shared` routes them). Each
reads vLLM's body into an ask and answers in vLLM's shape; its errors are vLLM's (`VLLM_ERRORS`)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from fastapi import APIRouter, Response
from tokenizers import Tokenizer

from prensa.gateway.apis.answers import opening, ranking, text_list, usage
from prensa.gateway.apis.common import activated, cut_side
from prensa.gateway.apis.dialects import VLLM_FIRST_TEXTS, VLLM_SECOND_TEXTS
from prensa.gateway.apis.errors import VLLM_ERRORS
from prensa.gateway.apis.operation import Operation
from prensa.gateway.apis.vllm.protocol import (
    PoolingRequest,
    VllmClassifyRequest,
    VllmPoolings,
    VllmRerankRequest,
    VllmScoreRequest,
    VllmTokenizeRequest,
)
from prensa.gateway.core import hybrid
from prensa.gateway.core.asks import ColbertAsk, DenseAsk, HiddenAsk, RelevanceAsk, ScoresAsk
from prensa.gateway.core.encodings import base64_vector
from prensa.gateway.core.engine import gather
from prensa.gateway.core.prompts import prompted
from prensa.gateway.core.registry import ServedModel
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.reranking import document_scores
from prensa.gateway.core.tokenization import Item, Truncation
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.gateway.http.routing import CountedRoute, GatewayRequest, ModelParam, json_response
from prensa.gateway.state import Gateway
from prensa.layouts import Capability, Scoring
from prensa.stages import contract

router = APIRouter(route_class=CountedRoute, responses=VLLM_ERRORS, tags=["vLLM"])


def window(
    request: VllmRerankRequest | VllmScoreRequest | VllmClassifyRequest | PoolingRequest,
    gw: Gateway,
    served: ServedModel,
    truncate: bool | None = None,
    pairs: bool = False,
) -> Truncation:
    """vLLM's `truncate_prompt_tokens` and `truncation_side`, or the server's truncation."""
    return gw.service.windowed(
        served,
        truncate=truncate,
        direction=cut_side(request),
        window=request.truncate_prompt_tokens,
        pairs=pairs,
    )


async def _classify(
    request: VllmClassifyRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    texts = text_list(request.input)
    scored = await gw.service.run(
        ScoresAsk(
            model=served,
            items=list(texts),
            truncation=window(request, gw, served),
            raw_scores=not activated(None, request),
        ),
        context,
    )
    labels = served.id2label
    rows = [
        {"index": i, "label": labels[int(np.argmax(row))], "probs": row, "num_classes": len(row)}
        for i, row in enumerate(scored.values.tolist())
    ]
    return {
        **opening("classify", served),
        "object": "list",
        "data": rows,
        "usage": usage(int(scored.num_tokens.sum()), completion=True),
    }


async def _pooling(
    request: PoolingRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    """`task: embed` as `/embed` with normalize, `token_embed` as `/embed_all`."""
    # texts only: vLLM's pooling takes no token ids here
    items: list[Item] = [*text_list(request.input)]
    truncation = window(request, gw, served)
    if request.task == "token_embed":
        if request.encoding_format != "float":
            raise validation("`encoding_format` base64 is served for `task: embed` only")
        tokens = await gw.service.run(
            HiddenAsk(model=served, items=items, truncation=truncation), context
        )
        data: list[Any] = list(tokens.rows)
        counted = int(tokens.num_tokens.sum())
    else:
        pooled = await gw.service.run(
            DenseAsk(model=served, items=items, truncation=truncation), context
        )
        data = (
            [base64_vector(row, request.embed_dtype, request.endianness) for row in pooled.rows]
            if request.encoding_format == "base64"
            else list(pooled.rows)
        )
        counted = int(pooled.num_tokens.sum())
    return {
        **opening("pool", served),
        "object": "list",
        "data": [{"index": i, "object": "pooling", "data": value} for i, value in enumerate(data)],
        "usage": usage(counted, completion=True),
    }


async def _rerank(
    request: VllmRerankRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    """Each document as `{"text": ...}` (vLLM's, Cohere's and Jina's); a string with the gateway's
    --rerank-document-strings and `return_documents`, for Infinity's clients that send vLLM's body."""
    documents = request.documents
    ask = RelevanceAsk(
        model=served,
        query=request.query,
        texts=list(documents),
        truncation=window(request, gw, served, request.truncate, pairs=served.scores_pairs),
        raw_scores=not activated(None, request),
        weights=request.weights,
        instruction=request.instruction,
    )
    scores, used = await document_scores(
        gw.service, ask, context, max_tokens=request.max_tokens_per_doc
    )
    strings = bool(request.return_documents) and gw.settings.rerank_document_strings
    return {
        **opening("rerank", served),
        "object": "rerank",
        "usage": usage(used),
        "results": [
            {
                "relevance_score": float(scores[i]),
                "index": i,
                "document": documents[i] if strings else {"text": documents[i]},
            }
            for i in ranking(scores, request.top_n)
        ],
    }


def one_of(request: VllmScoreRequest, names: tuple[str, ...]) -> str | list[str] | None:
    """The one field of `names` the body gives; two are refused."""
    given = [name for name in names if getattr(request, name) is not None]
    if len(given) > 1:
        raise validation(
            f"{' and '.join(f'`{name}`' for name in given)} are names for the same field: give one"
        )
    return cast("str | list[str] | None", getattr(request, given[0])) if given else None


def score_pairs(request: VllmScoreRequest) -> tuple[list[str], list[str]]:
    """vLLM's pairs: one first text for every second one, or one each."""
    first, second = one_of(request, VLLM_FIRST_TEXTS), one_of(request, VLLM_SECOND_TEXTS)
    if first is None or second is None:
        raise validation(
            "`text_1` and `text_2` are both required (or `queries` with `documents` or `items`, "
            "or `data_1` and `data_2`)"
        )
    lefts, rights = text_list(first), text_list(second)
    if not lefts or not rights:
        raise GatewayError(ErrorKind.EMPTY, "`text_1` and `text_2` cannot be empty")
    if len(lefts) == 1:
        lefts = lefts * len(rights)
    if len(lefts) != len(rights):
        raise validation(
            f"`text_1` has {len(lefts)} texts and `text_2` {len(rights)}: give one, or as many"
        )
    return lefts, rights


async def _score(
    request: VllmScoreRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    """A reranker's sigmoid scores of the pairs, a late-interaction model's MaxSim of each first
    text as a query against its second, or an embedder's cosine similarity; the last two have no
    activation, so `use_activation: false` leaves them as they are (as vLLM serves it)."""
    lefts, rights = score_pairs(request)
    truncation = window(request, gw, served, request.truncate, pairs=served.scores_pairs)
    if served.scores_pairs:
        scored = await gw.service.run(
            ScoresAsk(
                model=served,
                items=list(lefts),
                pairs=rights,
                truncation=truncation,
                raw_scores=not activated(None, request),
            ),
            context,
        )
        scores, used = scored.values[:, 0], int(scored.num_tokens.sum())
    elif served.layout.scoring is Scoring.MAXSIM:
        queries, documents = list(dict.fromkeys(lefts)), list(dict.fromkeys(rights))
        asked, found = await gather(
            [
                gw.service.run(
                    ColbertAsk(
                        model=served, items=list(queries), truncation=truncation, query=True
                    ),
                    context,
                ),
                gw.service.run(
                    ColbertAsk(model=served, items=list(documents), truncation=truncation), context
                ),
            ]
        )
        query_vectors = dict(zip(queries, asked.rows))
        document_vectors = dict(zip(documents, found.rows))
        scores = np.asarray(
            [
                hybrid.late_score(query_vectors[a], document_vectors[b])
                for a, b in zip(lefts, rights)
            ]
        )
        used = int(asked.num_tokens.sum() + found.num_tokens.sum())
    elif served.can(Capability.DENSE):
        unique = list(dict.fromkeys([*lefts, *rights]))
        result = await gw.service.run(
            DenseAsk(
                model=served, items=prompted(served, gw.settings, [*unique]), truncation=truncation
            ),
            context,
        )
        vectors = dict(zip(unique, result.rows))
        scores = np.asarray([float(vectors[a] @ vectors[b]) for a, b in zip(lefts, rights)])
        used = int(result.num_tokens.sum())
    else:
        raise validation(
            f"model `{served.name}` (task {served.task}) scores no pairs: vLLM's `/score` needs a "
            "reranker or an embedder"
        )
    return {
        **opening("score", served),
        "object": "list",
        "data": [{"index": i, "object": "score", "score": float(v)} for i, v in enumerate(scores)],
        "usage": usage(used, completion=True),
    }


def _tokens(
    tokenizer: Tokenizer, text: str, add_special_tokens: bool, strings: bool, max_length: int
) -> Response:
    """The answer, built in a thread: `text` as the model reads it."""
    encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return json_response(
        {
            "count": len(encoding.ids),
            "max_model_len": max_length,
            "tokens": encoding.ids,
            "token_strs": encoding.tokens if strings else None,
        }
    )


async def _tokenize(
    request: VllmTokenizeRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Response:
    (text,) = gw.service.tokenizable(
        served, prompted(served, gw.settings, [request.prompt], request.prompt_name)
    )
    return await gw.service.tokenizer_work(
        1,
        _tokens,
        served.require_tokenizer(),
        contract.read_text(text, served.strip_texts),
        request.add_special_tokens,
        request.return_token_strs,
        served.max_length,
    )


CLASSIFY = Operation("classify", VllmClassifyRequest, Capability.PREDICT, _classify)
POOLING = Operation(
    "pooling",
    PoolingRequest,
    Capability.DENSE,
    _pooling,
    lambda request: Capability.HIDDEN if request.task == "token_embed" else Capability.DENSE,
)
RERANK = Operation("rerank", VllmRerankRequest, Capability.RERANK, _rerank)
SCORE = Operation("score", VllmScoreRequest, None, _score)
TOKENIZE = Operation("tokenize", VllmTokenizeRequest, None, _tokenize)


@router.post(
    "/pooling", response_model=VllmPoolings, summary="vLLM's pooling: pooled or per-token vectors"
)
async def pooling(
    request: PoolingRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """`task: embed` gives each input's pooled, L2-normalised vector; `token_embed` every token's."""
    return await POOLING.respond(request, http, model)

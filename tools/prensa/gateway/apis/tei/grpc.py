"""TEI's five gRPC services (Info, Embed, Predict, Rerank, Tokenize) over the gateway's `Service`,
the one its HTTP routes call: the same model choice, prompts, truncation, checks, permits and merged
Triton calls, so a gRPC answer is the HTTP answer in TEI's messages.

`Handlers` holds each RPC's work on one message; the servicer classes only bind it to TEI's method
names (CamelCase, as the generated `add_*Servicer_to_server` looks them up: hence the noqa marks)
through `calls.Calls`, which adds the API key, metrics, access log and error statuses. A message's
fields mean what TEI's gRPC server makes of them: `truncate` is the message's own (proto3: false
when unset; --auto-truncate applies to HTTP's `truncate: null` only), `normalize` defaults to true.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from importlib.metadata import version
from typing import Any, cast

import grpc
import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from prensa.gateway.apis.common import asked_chunking
from prensa.gateway.core.asks import DenseAsk, HiddenAsk, RelevanceAsk, ScoresAsk, SparseAsk
from prensa.gateway.core.prompts import prompted
from prensa.gateway.core.registry import ServedModel
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.tokenization import (
    Item,
    Truncation,
    check_token_ids,
    simple_tokens,
    too_many_tokens,
)
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.gateway.grpc import tei_pb2 as pb
from prensa.gateway.grpc import tei_pb2_grpc
from prensa.gateway.grpc.calls import Calls, WrongModel, lenient
from prensa.gateway.state import Gateway
from prensa.layouts import Capability, ModelType

# read once: importlib.metadata scans site-packages on every call
PRENSA_VERSION = version("prensa")
SERVICES = ("Info", "Embed", "Predict", "Rerank", "Tokenize")
# "tei.v1.Embed", ...
SERVICE_NAMES = tuple(pb.DESCRIPTOR.services_by_name[name].full_name for name in SERVICES)
MODEL_TYPES = {
    ModelType.EMBEDDING: pb.MODEL_TYPE_EMBEDDING,
    ModelType.RERANKER: pb.MODEL_TYPE_RERANKER,
    ModelType.CLASSIFIER: pb.MODEL_TYPE_CLASSIFIER,
}
DIRECTIONS: dict[int, str] = {
    pb.TRUNCATION_DIRECTION_RIGHT: "right",
    pb.TRUNCATION_DIRECTION_LEFT: "left",
}
# TEI's messages (core/src/tokenization.rs, router/src/grpc/server.rs).
EMPTY_INPUTS = "Input validation error: `inputs` cannot be empty"
EMPTY_IDS = "Input validation error: `input_ids` cannot be empty"
EMPTY_TEXTS = "`texts` cannot be empty"


def rpc(service: str, method: str) -> str:
    return f"/{pb.DESCRIPTOR.package}.{service}/{method}"


def _ns(seconds: float | None) -> int:
    return int((seconds or 0.0) * 1e9)


def metadata(request_context: RequestContext) -> pb.Metadata:
    """TEI's `Metadata` of an answer, from the request's context."""
    return pb.Metadata(
        compute_chars=request_context.characters,
        compute_tokens=request_context.tokens,
        total_time_ns=_ns(time.perf_counter() - request_context.received),
        tokenization_time_ns=_ns(request_context.tokenization_s),
        queue_time_ns=_ns(request_context.queue_s),
        inference_time_ns=_ns(request_context.inference_s),
    )


def optional(message: Any, name: str) -> Any:
    """A proto3 `optional` field's value, None when unset."""
    return getattr(message, name) if message.HasField(name) else None


def ranks(scores: npt.NDArray[Any], texts: Sequence[str] | None) -> list[pb.Rank]:
    """Best first, ties in input order (as `/rerank`); each with its text when asked."""
    return [
        pb.Rank(index=i, score=float(scores[i]), text=texts[i] if texts is not None else None)
        for i in np.argsort(-scores, kind="stable").tolist()
    ]


def token_messages(
    tokenizer: Tokenizer, text: str, add_special_tokens: bool, limit: int, strip: bool
) -> list[pb.SimpleToken]:
    """`Tokenize`'s tokens, built in a thread (a long text takes a while); past `limit` tokens it stops with
    the limit's error, as `/tokenize` does."""
    tokens: list[pb.SimpleToken] = []
    for token in simple_tokens(tokenizer, text, add_special_tokens, strip):
        if len(tokens) == limit:
            raise too_many_tokens(limit, f"more ({limit + 1} at least)")
        tokens.append(pb.SimpleToken(**cast("dict[str, Any]", token)))
    return tokens


def decoded(tokenizer: Tokenizer, ids: list[int], id_limit: int, skip_special_tokens: bool) -> str:
    check_token_ids(ids, id_limit)
    text: str = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    return text


class Handlers:
    """Each RPC's work on one message: TEI's request in, TEI's answer out, through the gateway's `Service`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.settings = gateway.settings
        self.service = gateway.service

    async def pick(self, capability: Capability | None, model: str | None) -> ServedModel:
        """The model as HTTP picks it (named, else the default, else the first that can); one that
        cannot serve the RPC is FAILED_PRECONDITION, TEI's answer to a model of the wrong type."""
        try:
            return await self.gw.registry.pick(capability, model)
        except GatewayError as error:
            if capability is not None and error.kind is ErrorKind.VALIDATION:
                raise WrongModel(error.kind, error.message) from None
            raise

    def truncation(self, truncate: bool, direction: int) -> Truncation:
        if direction not in DIRECTIONS:
            raise validation(f"unknown `truncation_direction` {direction}")
        return self.service.truncation(truncate, DIRECTIONS[direction])

    def items(self, served: ServedModel, text: str, prompt_name: str | None) -> list[Item]:
        """One input with its prompt; an empty input is refused before a prompt could fill it (TEI's order)."""
        if not text:
            raise GatewayError(ErrorKind.EMPTY, EMPTY_INPUTS)
        return prompted(served, self.settings, [text], prompt_name)

    async def info(
        self, request: pb.InfoRequest, model: str | None, request_context: RequestContext
    ) -> pb.InfoResponse:
        served = await self.pick(None, model)
        request_context.served(served.name, 0)
        # tokenization runs in Triton's tokenize stage (HTTP /info: null)
        return pb.InfoResponse(
            version=PRENSA_VERSION,
            model_id=served.source,
            model_sha=served.revision or None,
            model_dtype=served.dtype,
            model_type=MODEL_TYPES[served.layout.model_type],
            max_concurrent_requests=self.settings.max_concurrent_requests,
            max_input_length=served.max_length,
            max_batch_tokens=served.max_batch_tokens or 0,
            max_batch_requests=served.max_batch_size,
            max_client_batch_size=self.settings.max_client_batch_size,
            tokenization_workers=0,
        )

    async def embed(
        self, request: pb.EmbedRequest, model: str | None, request_context: RequestContext
    ) -> pb.EmbedResponse:
        served = await self.pick(Capability.DENSE, model)
        normalize = optional(request, "normalize")
        result = await self.service.run(
            DenseAsk(
                model=served,
                items=self.items(served, request.inputs, optional(request, "prompt_name")),
                truncation=self.truncation(request.truncate, request.truncation_direction),
                normalize=True if normalize is None else normalize,
                dimensions=optional(request, "dimensions"),
                chunking=self.service.chunking(*asked_chunking(None)),
            ),
            request_context,
        )
        return pb.EmbedResponse(
            embeddings=result.rows[0].tolist(), metadata=metadata(request_context)
        )

    async def embed_sparse(
        self, request: pb.EmbedSparseRequest, model: str | None, request_context: RequestContext
    ) -> pb.EmbedSparseResponse:
        served = await self.pick(Capability.SPARSE, model)
        result = await self.service.run(
            SparseAsk(
                model=served,
                items=self.items(served, request.inputs, optional(request, "prompt_name")),
                truncation=self.truncation(request.truncate, request.truncation_direction),
            ),
            request_context,
        )
        values = [
            pb.SparseValue(index=i, value=v)
            for i, v in zip(result.ids[0].tolist(), result.weights[0].tolist())
        ]
        return pb.EmbedSparseResponse(sparse_embeddings=values, metadata=metadata(request_context))

    async def embed_all(
        self, request: pb.EmbedAllRequest, model: str | None, request_context: RequestContext
    ) -> pb.EmbedAllResponse:
        served = await self.pick(Capability.HIDDEN, model)
        result = await self.service.run(
            HiddenAsk(
                model=served,
                items=self.items(served, request.inputs, optional(request, "prompt_name")),
                truncation=self.truncation(request.truncate, request.truncation_direction),
            ),
            request_context,
        )
        tokens = [pb.TokenEmbedding(embeddings=row) for row in result.rows[0].tolist()]
        return pb.EmbedAllResponse(token_embeddings=tokens, metadata=metadata(request_context))

    async def _predict(
        self,
        text: str,
        pair: str | None,
        *,
        truncate: bool,
        direction: int,
        raw_scores: bool,
        model: str | None,
        request_context: RequestContext,
    ) -> pb.PredictResponse:
        """Every label of the model by score, best first (ties in label order), as `/predict` ranks them."""
        served = await self.pick(Capability.PREDICT, model)
        scored = await self.service.run(
            ScoresAsk(
                model=served,
                items=[text],
                pairs=[pair],
                truncation=self.truncation(truncate, direction),
                raw_scores=raw_scores,
            ),
            request_context,
        )
        row = scored.values[0]
        predictions = [
            pb.Prediction(score=float(row[j]), label=served.id2label[j])
            for j in np.argsort(-row, kind="stable").tolist()
        ]
        return pb.PredictResponse(predictions=predictions, metadata=metadata(request_context))

    async def predict(
        self, request: pb.PredictRequest, model: str | None, request_context: RequestContext
    ) -> pb.PredictResponse:
        return await self._predict(
            request.inputs,
            None,
            truncate=request.truncate,
            direction=request.truncation_direction,
            raw_scores=request.raw_scores,
            model=model,
            request_context=request_context,
        )

    async def predict_pair(
        self, request: pb.PredictPairRequest, model: str | None, request_context: RequestContext
    ) -> pb.PredictResponse:
        if len(request.inputs) not in (1, 2):  # TEI's check and message
            raise GatewayError(
                ErrorKind.VALIDATION,
                f"`inputs` must have a single or two elements. Given: {len(request.inputs)}",
            )
        pair = request.inputs[1] if len(request.inputs) == 2 else None
        return await self._predict(
            request.inputs[0],
            pair,
            truncate=request.truncate,
            direction=request.truncation_direction,
            raw_scores=request.raw_scores,
            model=model,
            request_context=request_context,
        )

    async def rerank(
        self, request: pb.RerankRequest, model: str | None, request_context: RequestContext
    ) -> pb.RerankResponse:
        if not request.texts:
            raise GatewayError(ErrorKind.VALIDATION, EMPTY_TEXTS)
        served = await self.pick(Capability.RERANK, model)
        texts = list(request.texts)
        scored = await self.service.relevance(
            RelevanceAsk(
                model=served,
                query=request.query,
                texts=texts,
                truncation=self.truncation(request.truncate, request.truncation_direction),
                raw_scores=request.raw_scores,
            ),
            request_context,
        )
        return pb.RerankResponse(
            ranks=ranks(scored.values, texts if request.return_text else None),
            metadata=metadata(request_context),
        )

    async def rerank_one(
        self,
        request: pb.RerankStreamRequest,
        raw_scores: bool,
        model: str | None,
        request_context: RequestContext,
    ) -> float:
        """One pair of a `RerankStream`: its score (`raw_scores` is the stream's first message's, as TEI)."""
        served = await self.pick(Capability.RERANK, model)
        scored = await self.service.relevance(
            RelevanceAsk(
                model=served,
                query=request.query,
                texts=[request.text],
                truncation=self.truncation(request.truncate, request.truncation_direction),
                raw_scores=raw_scores,
            ),
            request_context,
        )
        return float(scored.values[0])

    async def tokenize(
        self, request: pb.EncodeRequest, model: str | None, request_context: RequestContext
    ) -> pb.EncodeResponse:
        if not request.inputs:
            raise GatewayError(ErrorKind.EMPTY, EMPTY_INPUTS)
        served = await self.pick(None, model)
        request_context.served(served.name, 1)
        text = cast(
            str,
            prompted(served, self.settings, [request.inputs], optional(request, "prompt_name"))[0],
        )
        limit = self.service.tokenize_limit(served)
        # more tokens than the limit for sure: refused before tokenizing
        if len(text) > limit * served.longest_token:
            raise too_many_tokens(
                limit,
                f"{len(text)} characters, and no token of the model is longer than "
                f"{served.longest_token}",
            )
        tokens = await self.service.tokenizer_work(
            1,
            token_messages,
            served.require_tokenizer(),
            text,
            request.add_special_tokens,
            limit,
            served.strip_texts,
        )
        return pb.EncodeResponse(tokens=tokens)

    async def decode(
        self, request: pb.DecodeRequest, model: str | None, request_context: RequestContext
    ) -> pb.DecodeResponse:
        if not request.ids:
            raise GatewayError(ErrorKind.EMPTY, EMPTY_IDS)
        served = await self.pick(None, model)
        request_context.served(served.name, 1)
        limit = self.service.tokenize_limit(served)
        if len(request.ids) > limit:
            raise too_many_tokens(limit, f"{len(request.ids)} ids")
        text = await self.service.tokenizer_work(
            1,
            decoded,
            served.require_tokenizer(),
            list(request.ids),
            served.token_id_limit,
            request.skip_special_tokens,
        )
        return pb.DecodeResponse(text=text)


class Servicer:
    """Binds TEI's method names of one service to `Handlers`' work, through `Calls`."""

    def __init__(self, calls: Calls, work: Handlers) -> None:
        self.calls = calls
        self.work = work


class InfoServicer(Servicer):
    async def Info(self, request: pb.InfoRequest, context: Any) -> pb.InfoResponse:
        return await self.calls.unary(request, context, rpc("Info", "Info"), "info", self.work.info)


class EmbedServicer(Servicer):
    async def Embed(self, request: pb.EmbedRequest, context: Any) -> pb.EmbedResponse:
        return await self.calls.unary(
            request, context, rpc("Embed", "Embed"), "embed", self.work.embed
        )

    async def EmbedStream(
        self,
        requests: AsyncIterator[pb.EmbedRequest],
        context: Any,
    ) -> AsyncIterator[pb.EmbedResponse]:
        async for reply in self.calls.stream(
            requests, context, rpc("Embed", "EmbedStream"), "embed", self.work.embed
        ):
            yield reply

    async def EmbedSparse(
        self, request: pb.EmbedSparseRequest, context: Any
    ) -> pb.EmbedSparseResponse:
        return await self.calls.unary(
            request, context, rpc("Embed", "EmbedSparse"), "embed_sparse", self.work.embed_sparse
        )

    async def EmbedSparseStream(
        self,
        requests: AsyncIterator[pb.EmbedSparseRequest],
        context: Any,
    ) -> AsyncIterator[pb.EmbedSparseResponse]:
        async for reply in self.calls.stream(
            requests,
            context,
            rpc("Embed", "EmbedSparseStream"),
            "embed_sparse",
            self.work.embed_sparse,
        ):
            yield reply

    async def EmbedAll(self, request: pb.EmbedAllRequest, context: Any) -> pb.EmbedAllResponse:
        return await self.calls.unary(
            request, context, rpc("Embed", "EmbedAll"), "embed_all", self.work.embed_all
        )

    async def EmbedAllStream(
        self,
        requests: AsyncIterator[pb.EmbedAllRequest],
        context: Any,
    ) -> AsyncIterator[pb.EmbedAllResponse]:
        async for reply in self.calls.stream(
            requests, context, rpc("Embed", "EmbedAllStream"), "embed_all", self.work.embed_all
        ):
            yield reply


class PredictServicer(Servicer):
    async def Predict(self, request: pb.PredictRequest, context: Any) -> pb.PredictResponse:
        return await self.calls.unary(
            request, context, rpc("Predict", "Predict"), "predict", self.work.predict
        )

    async def PredictPair(self, request: pb.PredictPairRequest, context: Any) -> pb.PredictResponse:
        return await self.calls.unary(
            request, context, rpc("Predict", "PredictPair"), "predict", self.work.predict_pair
        )

    async def PredictStream(
        self,
        requests: AsyncIterator[pb.PredictRequest],
        context: Any,
    ) -> AsyncIterator[pb.PredictResponse]:
        async for reply in self.calls.stream(
            requests, context, rpc("Predict", "PredictStream"), "predict", self.work.predict
        ):
            yield reply

    async def PredictPairStream(
        self,
        requests: AsyncIterator[pb.PredictPairRequest],
        context: Any,
    ) -> AsyncIterator[pb.PredictResponse]:
        async for reply in self.calls.stream(
            requests,
            context,
            rpc("Predict", "PredictPairStream"),
            "predict",
            self.work.predict_pair,
        ):
            yield reply


class RerankServicer(Servicer):
    async def Rerank(self, request: pb.RerankRequest, context: Any) -> pb.RerankResponse:
        return await self.calls.unary(
            request, context, rpc("Rerank", "Rerank"), "rerank", self.work.rerank
        )

    async def RerankStream(
        self,
        requests: AsyncIterator[pb.RerankStreamRequest],
        context: Any,
    ) -> pb.RerankResponse:
        """One (query, text) pair per message, scored as they arrive; one answer, ranked, when the stream
        ends. `raw_scores` and `return_text` are the first message's (TEI's rule)."""
        first: list[pb.RerankStreamRequest] = []
        texts: list[str] = []

        async def remembered() -> AsyncIterator[pb.RerankStreamRequest]:
            async for request in requests:
                if not first:
                    first.append(request)
                texts.append(request.text)
                yield request

        async def score(
            request: pb.RerankStreamRequest, model: str | None, request_context: RequestContext
        ) -> float:
            return await self.work.rerank_one(request, first[0].raw_scores, model, request_context)

        def ranked(scores: list[float], total: RequestContext) -> pb.RerankResponse:
            if not scores:
                raise GatewayError(ErrorKind.VALIDATION, EMPTY_TEXTS)
            shown = texts if first[0].return_text else None
            return pb.RerankResponse(
                ranks=ranks(np.asarray(scores, dtype=np.float32), shown), metadata=metadata(total)
            )

        reply: pb.RerankResponse = await self.calls.gathered(
            remembered(), context, rpc("Rerank", "RerankStream"), "rerank", score, ranked
        )
        return reply


class TokenizeServicer(Servicer):
    async def Tokenize(self, request: pb.EncodeRequest, context: Any) -> pb.EncodeResponse:
        return await self.calls.unary(
            request, context, rpc("Tokenize", "Tokenize"), "tokenize", self.work.tokenize
        )

    async def TokenizeStream(
        self,
        requests: AsyncIterator[pb.EncodeRequest],
        context: Any,
    ) -> AsyncIterator[pb.EncodeResponse]:
        async for reply in self.calls.stream(
            requests, context, rpc("Tokenize", "TokenizeStream"), "tokenize", self.work.tokenize
        ):
            yield reply

    async def Decode(self, request: pb.DecodeRequest, context: Any) -> pb.DecodeResponse:
        return await self.calls.unary(
            request, context, rpc("Tokenize", "Decode"), "decode", self.work.decode
        )

    async def DecodeStream(
        self,
        requests: AsyncIterator[pb.DecodeRequest],
        context: Any,
    ) -> AsyncIterator[pb.DecodeResponse]:
        async for reply in self.calls.stream(
            requests, context, rpc("Tokenize", "DecodeStream"), "decode", self.work.decode
        ):
            yield reply


class LenientServer:
    """A grpc.aio server as the generated `add_*Servicer_to_server` functions see it, each method's
    request parsed leniently (`calls.lenient`): a message protobuf cannot parse reaches its call, which
    refuses it INVALID_ARGUMENT once the API key is checked, as HTTP checks the key before the body.
    gRPC's own answer to such a message is UNKNOWN, before any check."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """The generated code registers each service twice; the methods below do both."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        parsed = {
            name: handler._replace(request_deserializer=lenient(handler.request_deserializer))
            for name, handler in handlers.items()
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, parsed),)
        )
        self.server.add_registered_method_handlers(service, parsed)


def add_servicers(server: Any, gateway: Gateway) -> None:
    """TEI's five services on `server` (a grpc.aio server), answering from `gateway`."""
    calls, work = Calls(gateway), Handlers(gateway)
    server = LenientServer(server)
    tei_pb2_grpc.add_InfoServicer_to_server(InfoServicer(calls, work), server)
    tei_pb2_grpc.add_EmbedServicer_to_server(EmbedServicer(calls, work), server)
    tei_pb2_grpc.add_PredictServicer_to_server(PredictServicer(calls, work), server)
    tei_pb2_grpc.add_RerankServicer_to_server(RerankServicer(calls, work), server)
    tei_pb2_grpc.add_TokenizeServicer_to_server(TokenizeServicer(calls, work), server)

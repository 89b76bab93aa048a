"""The served models, read once from Triton's repository index and model configs.

A served model is a Triton ensemble whose `parameters` carry a prensa `task`; its stage models
(`<name>_tokenize`, `<name>_encode`, `<name>_pool`) say how to call the encoder directly and
where the tokenizer file is. A fused model (`pipeline: fused`) is all of that in one model: it
takes token ids and returns encoder outputs itself. The registry is rebuilt by `refresh()`: at
startup, and lazily while it is empty (the gateway started before Triton) or when a request names
a model it does not know (Triton loaded it later), at most once a second; unchanged tokenizer
files are kept. A refresh never drops a model that is only down for a while (a stage reloading,
Triton restarting): a model goes only when Triton no longer lists it, or says it was unloaded
while all of its stages are ready.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy.typing as npt
from tokenizers import Tokenizer
from tritonclient.grpc import model_config_pb2

from prensa.gateway.backends.base import READY, Backend
from prensa.gateway.core.tokenization import QueryFraming, longest_token, token_id_limit
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.layouts import Capability, Layout, resolve
from prensa.layouts.m3 import M3
from prensa.manifest import Task, read_dense_ranges
from prensa.stages import PIPELINE_STAGES, contract, load_stage, stage_model_name
from prensa.triton.config import config_parameters
from prensa.triton.repo import Pipeline, served_pipeline
from prensa.triton.versions import (
    VERSIONS_RECORD,
    Lineage,
    pin,
    pinned,
    read_versions,
    version_name,
    version_of,
    versions_stamp,
)

log = logging.getLogger("prensa.gateway")
# an LLM reranker's prompt is built as the tokenize stage builds it
TOKENIZE_STAGE = load_stage("tokenize")
# an empty registry, or an unknown model name, re-reads Triton at most this often
REFRESH_INTERVAL_S = 1.0
LINEAGES_CHECK_S = 0.5  # how stale another process's promotion may be here
TASKS = frozenset(task.value for task in Task)
# (state, reason) in Triton's index of a model unloaded on purpose
UNLOADED = (
    "UNAVAILABLE",
    "unloaded",
)


@dataclass(frozen=True)
class PromptedPairs:
    """An LLM reranker's slice of a served model: the prompt each (query, document) pair is
    written into (the tokenize stage's `PairTemplate`) and the token ids of its prefix and suffix,
    which frame the filled-in pair the gateway tokenizes itself."""

    template: Any  # the tokenize stage's `PairTemplate` (a stage module, loaded from its file)
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()

    def text(self, query: str, document: str, instruction: str | None) -> str:
        """The prompt of one pair, as the tokenize stage writes it."""
        return str(self.template.text(query, document, instruction))


@dataclass(frozen=True)
class ServedModel:
    name: str
    task: Task
    source: str
    revision: str
    dtype: str
    pooling: str
    normalize: bool
    max_length: int
    id2label: tuple[str, ...]  # one per logit; LABEL_i when the export names none
    max_batch_size: int  # rows per Triton call
    encode_instances: (
        int  # encoder instances (per Triton replica), each computing one batch at a time
    )
    max_batch_tokens: int | None
    dense_dim: int | None
    outputs: frozenset[str]  # what the ensemble returns
    # what `<name>_encode` reads (native encoders may skip token_type_ids)
    encode_inputs: tuple[str, ...]
    encode_outputs: tuple[str, ...]  # what `<name>_encode` returns
    pool_inputs: tuple[str, ...]  # what `<name>_pool` reads
    pad_id: int
    takes_pairs: bool  # the ensemble has a `text_pair` input
    tokenizer: Tokenizer | None
    tokenizer_path: Path
    token_id_limit: int  # one past the largest valid token id (see `tokenization.token_id_limit`)
    # characters of the vocabulary's longest token: a text of N tokens has at most N x this
    longest_token: int = 16
    fused: bool = False  # one model: token ids in, encoder or pooled outputs out, in one call
    prompts: dict[str, str] = field(default_factory=dict)  # sentence-transformers prompts, by name
    # false: a prompt's tokens are left out of the pooling (see `prompt_length`)
    include_prompt: bool = True
    # The sizes `dimensions` may cut its vectors to: () any, None where the model declares no Matryoshka training.
    matryoshka: tuple[int, ...] | None = None
    # [2, dim] min and max over a calibration corpus (int8/uint8 output)
    dense_ranges: npt.NDArray[Any] | None = None
    cached: bool = False  # Triton's response cache is on for the model clients call (`repo build --response-cache`)
    # an LLM reranker's prompt; `max_length` is then what the filled-in pair may take within it
    prompted: PromptedPairs | None = None
    # how a pair too long for `max_length` is cut (`contract.PAIR_TRUNCATIONS`), as the tokenize stage does
    pair_truncation: str = contract.LONGEST_FIRST
    # a late-interaction model's queries (its documents go as any model's texts)
    queries: QueryFraming | None = None
    # each text stripped before tokenizing, as the tokenize stage reads it (`contract.STRIP_TEXTS`)
    strip_texts: bool = False

    @property
    def encode_model(self) -> str:
        return self.name if self.fused else stage_model_name(self.name, "encode")

    @property
    def pool_model(self) -> str:
        return stage_model_name(self.name, "pool")

    @property
    def triton_models(self) -> tuple[str, ...]:
        """Every Triton model a request to this one may reach."""
        if self.fused:
            return (self.name,)
        return (
            self.name,
            stage_model_name(self.name, "tokenize"),
            self.encode_model,
            self.pool_model,
        )

    @cached_property
    def layout(self) -> Layout:
        """What kind of model it is, resolved once (an LLM reranker's ensemble carries its prompt)."""
        return resolve(self.task, prompted_pairs=self.prompted is not None)

    @property
    def needs_pairs(self) -> bool:
        """The ensemble takes (query, passage) pairs only: a lone text goes the token path. An LLM
        reranker takes a pair already written into its prompt too."""
        return self.layout.scores_pairs and not self.layout.prompted_pairs

    @property
    def is_m3(self) -> bool:
        """bge-m3 with its heads: the hybrid scores need all three outputs."""
        return self.layout is M3 and self.ranks

    @property
    def ranks(self) -> bool:
        """Whether it scores a query against texts: its layout does, and it has what that reads."""
        return self.layout.scoring is not None and self.layout.scoring_outputs <= self.outputs

    @property
    def scores_pairs(self) -> bool:
        return self.layout.scores_pairs

    @cached_property
    def capabilities(self) -> frozenset[Capability]:
        """What routes may ask of it, from its layout and outputs: read once, not per request."""
        offered = {
            Capability.DENSE: contract.DENSE in self.outputs,
            Capability.SPARSE: contract.SPARSE_IDS in self.outputs,
            Capability.COLBERT: contract.COLBERT in self.outputs,
            Capability.HIDDEN: contract.LAST_HIDDEN_STATE in self.encode_outputs
            or self.layout.token_vectors,
            Capability.RERANK: self.ranks,
            Capability.M3: self.is_m3,
            Capability.PREDICT: contract.LOGITS in self.outputs,
        }
        return frozenset(capability for capability, can in offered.items() if can)

    def can(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def prompt_length(self, prompt: str) -> int:
        """Tokens of `prompt` that pooling leaves out, as sentence-transformers counts them; 0 when the
        model pools prompt tokens like any other."""
        return (
            0
            if self.include_prompt or not prompt
            else _prompt_length(
                self.require_tokenizer(), contract.read_text(prompt, self.strip_texts)
            )
        )

    def require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise GatewayError(
                ErrorKind.TOKENIZER,
                f"no tokenizer for model `{self.name}`: the gateway's --repo is "
                "not Triton's model repository (its log names the missing file)",
            )
        return self.tokenizer


# (file, mtime_ns): a refresh reloads changed files only
TokenizerCache = dict[tuple[Path, int], Tokenizer]


def load_tokenizer(path: Path, cache: TokenizerCache) -> Tokenizer | None:
    """The stage's tokenizer file with truncation and padding off: the gateway decides both."""
    if not path.is_file():
        log.warning(
            "no tokenizer at %s: /tokenize, /decode, truncate=false, left truncation and texts with token-id "
            "inputs will be refused for this model",
            path,
        )
        return None
    key = (path, path.stat().st_mtime_ns)
    if key not in cache:
        tokenizer = Tokenizer.from_file(str(path))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        cache[key] = tokenizer
    return cache[key]


def load_query_framing(
    directory: Path, params: dict[str, str], cache: TokenizerCache
) -> QueryFraming | None:
    """A late-interaction model's query framing (its ensemble's `late_interaction` parameter and the
    query tokenizer beside the tokenize stage's), with the cut and padding the export wrote into it;
    None for other models, or where the file is missing (queries are then refused)."""
    if "late_interaction" not in params:
        return None
    late = json.loads(params["late_interaction"])
    path = directory / str(late["query_tokenizer_file"])
    if not path.is_file():
        log.warning("no query tokenizer at %s: queries will be refused for this model", path)
        return None
    key = (path, path.stat().st_mtime_ns)
    if key not in cache:
        cache[key] = Tokenizer.from_file(str(path))
    return QueryFraming(cache[key], bool(late["attend_to_expansion"]))


def known_task(config: model_config_pb2.ModelConfig) -> bool:
    """Whether this gateway knows the task a prensa model carries (a newer prensa's are left out)."""
    return config_parameters(config).get("task") in TASKS


async def read_model(
    client: Backend, repo: Path, ensemble: model_config_pb2.ModelConfig, tokenizers: TokenizerCache
) -> ServedModel:
    name = ensemble.name
    fused = served_pipeline(ensemble) is Pipeline.FUSED
    if fused:  # one config holds every stage's parameters
        tokenize = encode = ensemble
        pool_inputs: tuple[str, ...] = ()
        encode_outputs = tuple(o.name for o in ensemble.output if o.name in contract.ENCODER_ONLY)
    else:
        stages = (client.config(stage_model_name(name, stage)) for stage in PIPELINE_STAGES)
        tokenize, encode, pool = await asyncio.gather(*stages)
        pool_inputs = tuple(i.name for i in pool.input)
        encode_outputs = tuple(o.name for o in encode.output)
    params, tokenize_params = config_parameters(ensemble), config_parameters(tokenize)
    dense = [o for o in ensemble.output if o.name == contract.DENSE]
    pair = [i for i in ensemble.input if i.name == contract.TEXT_PAIR]
    logits = [o for o in ensemble.output if o.name == contract.LOGITS]
    labels = tuple(label for label in params.get("id2label", "").split(",") if label)
    if logits and len(labels) != logits[0].dims[-1]:
        labels = tuple(f"LABEL_{i}" for i in range(logits[0].dims[-1]))
    tokenizer_path = (
        repo / tokenize.name / "1" / tokenize_params.get("tokenizer_file", "tokenizer.json")
    )
    max_batch_tokens = config_parameters(encode).get("max_batch_tokens")
    tokenizer = await asyncio.to_thread(load_tokenizer, tokenizer_path, tokenizers)
    queries = await asyncio.to_thread(load_query_framing, tokenizer_path.parent, params, tokenizers)
    dense_ranges = (
        await asyncio.to_thread(read_dense_ranges, tokenizer_path.parent) if dense else None
    )
    template = TOKENIZE_STAGE.PairTemplate.from_parameters(tokenize_params)
    prefix, suffix = (
        template.edges(tokenizer) if template is not None and tokenizer is not None else ([], [])
    )
    prompted = None if template is None else PromptedPairs(template, tuple(prefix), tuple(suffix))
    return ServedModel(
        name=name,
        task=Task(params["task"]),
        source=params.get("source", ""),
        revision=params.get("revision", ""),
        dtype=params.get("dtype", ""),
        pooling=params.get("pooling", ""),
        normalize=params.get("normalize", "true") == "true",
        max_length=int(params["max_length"]) - len(prefix) - len(suffix),
        id2label=labels,
        max_batch_size=ensemble.max_batch_size or 1,
        encode_instances=sum(group.count for group in encode.instance_group) or 1,
        max_batch_tokens=int(max_batch_tokens) if max_batch_tokens else None,
        dense_dim=int(dense[0].dims[-1]) if dense else None,
        outputs=frozenset(o.name for o in ensemble.output),
        encode_inputs=tuple(
            i.name for i in encode.input if i.data_type == model_config_pb2.TYPE_INT64
        ),
        encode_outputs=encode_outputs,
        pool_inputs=pool_inputs,
        pad_id=int(tokenize_params.get("pad_id", "0")),
        takes_pairs=bool(pair),
        pair_truncation=tokenize_params.get("pair_truncation", contract.LONGEST_FIRST),
        tokenizer=tokenizer,
        tokenizer_path=tokenizer_path,
        token_id_limit=token_id_limit(tokenizer),
        longest_token=longest_token(tokenizer),
        fused=fused,
        prompts=json.loads(params["prompts"]) if params.get("prompts") else {},
        include_prompt=params.get("include_prompt", "true") == "true",
        matryoshka=tuple(contract.int_list(params["matryoshka_dimensions"]))
        if "matryoshka_dimensions" in params
        else None,
        dense_ranges=dense_ranges,
        cached=ensemble.response_cache.enable,
        prompted=prompted,
        queries=queries,
        strip_texts=contract.strips_texts(tokenize_params),
    )


@lru_cache(maxsize=256)
def _prompt_length(tokenizer: Tokenizer, prompt: str) -> int:
    return int(TOKENIZE_STAGE.prompt_length(tokenizer, prompt))


def named_model(query: str | None, body: str | None) -> str | None:
    """The model a request names, by `?model=` or its body's `model` field ("" counts as unnamed);
    two different names are a client error, never a guess."""
    if query and body and query != body:
        raise validation(f"`?model={query}` and the body's `model` ({body}) name different models")
    return query or body or None


def coming_back(model: ServedModel, states: dict[str, tuple[str, str]]) -> bool:
    """Whether a served model that Triton cannot serve now is down for a while, not gone: it was not
    unloaded itself, or it was only because one of its stages went down."""
    if model.name not in states:
        return False
    stages = [states.get(name, ("",))[0] for name in model.triton_models if name != model.name]
    return states[model.name] != UNLOADED or any(state != READY for state in stages)


class ModelUses:
    """The requests each served model is computing, so that a model being removed is drained: once
    it is retiring, no new request may use it, and its removal waits for the ones that do."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.retiring: set[str] = set()
        # removed while a request that chose it before was on its way (tokenizing): it is
        # refused by name, not sent to a model Triton no longer has
        self.gone: set[str] = set()
        self._idle: dict[str, asyncio.Event] = {}

    @contextmanager
    def hold(self, name: str) -> Iterator[None]:
        if name in self.retiring or name in self.gone:
            raise being_removed(name)
        count = self.counts.get(name, 0)
        if not count:  # the first request since it was idle: a drain waits from here
            idle = self._idle.get(name)
            if idle is None:
                idle = self._idle[name] = asyncio.Event()
            idle.clear()
        self.counts[name] = count + 1
        try:
            yield
        finally:
            self.counts[name] -= 1
            if not self.counts[name]:
                self._idle[name].set()

    async def drained(self, name: str, timeout_s: float) -> bool:
        """Whether the requests using `name` all ended within `timeout_s`."""
        if not self.counts.get(name):
            return True
        try:
            await asyncio.wait_for(self._idle[name].wait(), timeout_s)
        except TimeoutError:
            return False
        return True


def being_removed(name: str) -> GatewayError:
    return GatewayError(ErrorKind.NOT_FOUND, f"The model `{name}` is being removed")


class Registry:
    def __init__(self, client: Backend, repo: Path, default_model: str | None) -> None:
        self.client = client
        self.repo = repo
        self.default_model = default_model
        self.models: dict[str, ServedModel] = {}  # by Triton model: each version of a name its own
        self.uses = ModelUses()
        self.lineages: dict[str, Lineage] = {}  # the version each name reaches (`triton.versions`)
        self.on_trial = False  # whether any lineage has a canary or a shadow
        self._lineages_stamp: tuple[int, int] | None = None
        self._lineages_checked = float("-inf")
        self._lineages_lock = asyncio.Lock()
        self.down: set[str] = set()  # kept at the last refresh though Triton could not serve them
        self._tokenizers: TokenizerCache = {}
        self._lock = asyncio.Lock()
        self._last_attempt = 0.0
        self._logged_once = False  # the first refresh logs the whole list, later ones what changed

    async def refresh(self) -> None:
        """Re-read every ready ensemble (or fused model) that carries a prensa task; keep the known
        ones that are down for now."""
        async with self._lock:
            self._last_attempt = time.monotonic()
            states = await self.client.model_states()
            await self._read_lineages(force=True)
            names = [name for name, (state, _) in states.items() if state == READY]
            configs = await asyncio.gather(*(self.client.config(n) for n in names))
            ensembles = [c for c in configs if served_pipeline(c) is not None and known_task(c)]
            models = await asyncio.gather(
                *(read_model(self.client, self.repo, c, self._tokenizers) for c in ensembles)
            )
            fresh = {m.name: m for m in models}
            down = {
                name: m
                for name, m in self.models.items()
                if name not in fresh and coming_back(m, states)
            }
            before, before_down = self.models, self.down
            self.models = {
                m.name: m for m in sorted([*fresh.values(), *down.values()], key=lambda m: m.name)
            }
            self.down = set(down)
        self._log_changes(before, before_down)

    def _log_changes(self, before: dict[str, ServedModel], before_down: set[str]) -> None:
        """A line when the model list changes, and one per model going down or coming back; a refresh
        that changes nothing logs nothing, the first one always says what is served."""
        added, removed = (
            sorted(set(self.models) - set(before)),
            sorted(set(before) - set(self.models)),
        )
        gone, back = (
            sorted(self.down - before_down),
            sorted((before_down - self.down) & set(self.models)),
        )
        if not self._logged_once:
            self._logged_once = True
            log.info(
                "serving %s",
                ", ".join(f"{m.name} ({m.task})" for m in self.models.values()) or "no model",
                extra={"fields": {"models": list(self.models)}},
            )
        elif added or removed:
            log.info(
                "model list changed: added %s; removed %s",
                ", ".join(added) or "none",
                ", ".join(removed) or "none",
                extra={"fields": {"added": added, "removed": removed}},
            )
        if gone:
            log.warning(
                "%s not ready in Triton for now; kept",
                ", ".join(gone),
                extra={"fields": {"down": gone}},
            )
        if back:
            log.info("%s ready again", ", ".join(back), extra={"fields": {"back": back}})

    async def _read_lineages(self, force: bool = False) -> None:
        """The versions record read again when it changed (a promotion by another gateway
        process or replica), looked at most every LINEAGES_CHECK_S; a record that does not parse
        leaves the versions as they were, said once per change."""
        self._lineages_checked = time.monotonic()
        # one read at a time: a look begun before a promotion must not finish after the
        # promotion's own read and put the old versions back
        async with self._lineages_lock:
            stamp = await asyncio.to_thread(versions_stamp, self.repo)
            if stamp == self._lineages_stamp and not force:
                return
            self._lineages_stamp = stamp
            try:
                self.lineages = await asyncio.to_thread(read_versions, self.repo)
                self.on_trial = any(
                    one.canary is not None or one.shadow is not None
                    for one in self.lineages.values()
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning(
                    "%s does not parse (%s); model versions stay as they were", VERSIONS_RECORD, exc
                )

    def resolve(self, name: str) -> str:
        """The served model a request's name reaches: a pinned version (`name@N`) itself, the name
        alone its current version."""
        base, version = pinned(name)
        if version is None:
            lineage = self.lineages.get(name)
            version = lineage.current if lineage else 1
        return version_name(base, version)

    def route(self, name: str) -> str:
        """The served model a request for `name` goes to: `resolve`'s, but a name alone goes to its
        canary (a relevance model's version on trial) with the canary's share of chance."""
        if self.on_trial:
            lineage = self.lineages.get(name)
            if lineage is not None and lineage.canary is not None:
                canary = version_name(name, lineage.canary)
                if (
                    random.random() < lineage.share
                    and canary in self.models
                    and canary not in self.uses.retiring
                    and canary not in self.down  # a canary that is down leaves its share
                ):
                    return canary
        return self.resolve(name)

    def shadow_of(self, model: str) -> ServedModel | None:
        """The version that sees a copy of what `model` answers: its name's shadow, while `model`
        is the version the name reaches."""
        if not self.on_trial:
            return None
        base, version = pinned(model)
        lineage = self.lineages.get(base)
        if lineage is None or lineage.shadow is None or lineage.current != (version or 1):
            return None
        shadow = version_name(base, lineage.shadow)
        return None if shadow in self.uses.retiring else self.models.get(shadow)

    async def current(self, name: str) -> str | None:
        """The version an unpinned `name` reaches now, pinned (`name@N`); None for a name pinned
        already, or one that is not a served model's own (an alias some routes read)."""
        await self.ensure()
        if pinned(name)[1] is not None:
            return None
        model = self.resolve(name)
        return pin(name, version_of(model)) if model in self.models else None

    def is_current(self, model: str) -> bool:
        """Whether `model` is the version its name alone reaches (the others answer pinned only)."""
        base, version = pinned(model)
        return self.resolve(base) == version_name(base, version or 1)

    def triton_models(self) -> dict[str, str]:
        """Every Triton model the served ones reach, each mapped to the served model it belongs to."""
        return {
            stage: model.name for model in self.models.values() for stage in model.triton_models
        }

    async def readiness(self) -> dict[str, bool]:
        """Per served model, whether Triton can serve every one of its stages now (none can while
        the backend itself is unreachable)."""
        stages = self.triton_models()
        unready = await self.client.unready(sorted(stages))
        if unready is None:
            return dict.fromkeys(self.models, False)
        down = {stages[stage] for stage in unready}
        return {name: name not in down for name in self.models}

    async def unready(self) -> str | None:
        """What keeps a served model from answering now (its stages are named), or None."""
        stages = self.triton_models()
        down = await self.client.unready(sorted(stages))
        if not down:
            return None
        return (
            f"{', '.join(sorted({stages[s] for s in down}))} cannot answer now "
            f"(not ready in Triton: {', '.join(down)})"
        )

    def _may_refresh(self) -> bool:
        return time.monotonic() - self._last_attempt >= REFRESH_INTERVAL_S

    async def ensure(self) -> None:
        """The versions record looked at (`_read_lineages`); then retry an empty registry (Triton
        was down or still loading) or one holding models that were down, at most once a second."""
        if time.monotonic() - self._lineages_checked >= LINEAGES_CHECK_S:
            await self._read_lineages()
        if (not self.models or self.down) and self._may_refresh():
            try:
                await self.refresh()
            except GatewayError:
                if not self.models:
                    raise
        if not self.models:
            raise GatewayError(
                ErrorKind.UNHEALTHY, f"Triton at {self.client.url} serves no prensa model yet"
            )

    async def pick(self, capability: Capability | None, name: str | None) -> ServedModel:
        """`name` if it exists and can; else the default model if it can; else the first one that can.
        No capability: any model will do (`/info`)."""
        await self.ensure()
        # a canary answers requests that run the model; what describes it names its current version
        reach = self.resolve if capability is None else self.route
        if name:  # "" (an empty `model` field or `?model=`) means the default, as absent
            wanted = reach(name)
            if wanted in self.uses.retiring:
                raise being_removed(name)
            # loaded into Triton after we started?
            if wanted not in self.models and self._may_refresh():
                await self.refresh()
                wanted = reach(name)
            model = self.models.get(wanted)
            if model is None:
                raise GatewayError(
                    ErrorKind.NOT_FOUND,
                    f"The model `{name}` does not exist; served: {', '.join(self.models)}",
                )
            if capability is not None and not model.can(capability):
                raise validation(
                    f"model `{name}` (task {model.task}) does not provide {capability.value}"
                )
            return model
        # never answer with another model
        if self.default_model and self.resolve(self.default_model) in self.uses.retiring:
            raise being_removed(self.default_model)
        if self.default_model and self.resolve(self.default_model) not in self.models:
            raise GatewayError(
                ErrorKind.UNHEALTHY, f"the default model `{self.default_model}` is not served now"
            )
        candidates = [
            m
            for m in self.models.values()
            if (capability is None or m.can(capability))
            and m.name not in self.uses.retiring
            and self.is_current(m.name)
        ]
        if capability is Capability.RERANK and any(m.scores_pairs for m in candidates):
            # a model that scores by its vectors (bge-m3, late interaction) reranks when named, or alone
            candidates = [m for m in candidates if m.scores_pairs]
        default = self.models.get(self.resolve(self.default_model or ""))
        if default is not None and default in candidates:
            return self.models.get(reach(self.default_model or ""), default)
        if not candidates:
            raise validation(
                f"no served model provides {capability.value if capability else 'anything'}"
            )
        return candidates[0]

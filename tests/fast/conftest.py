"""The fast tier: the real gateway app over `InProcessBackend`, no Triton, no torch, no network.

Its models are built in the test session from scratch: a WordLevel tokenizer (`tokenizers`) and
ONNX graphs written with `onnx.helper` (embedding-table Gathers shaped like each task's encoder
outputs), laid out as `prensa export` lays an export out, then rendered by `build_repository` as
`prensa serve` renders them for Triton. Answers are checked against `oracle`: the stages' own
tokenizer, pooling code and onnxruntime called directly.

Run alone: `pytest tests/fast` (or `-m fast`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from prensa.gateway.app import create_app
from prensa.gateway.backends.local import InProcessBackend
from prensa.gateway.core.limits import SharedPermits
from prensa.gateway.settings import GatewaySettings
from prensa.manifest import GraphOutput, Manifest, Pooling, Task
from prensa.stages import contract, load_stage
from prensa.triton.repo import (
    ModelSource,
    Pipeline,
    ServingOptions,
    build_repository,
    pool_parameters,
)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "of", "and", "is", "in", "to", "city", "capital", "germany", "france", "berlin", "paris", "river", "dog", "fox", "quick", "brown", "lazy", "jumps", "over", "dense", "sparse", "vectors", "retrieval", "query", "passage", "score", "rerank", "model", "triton", "batch", "token", "text", "good", "bad", "fine", "weather", "today", "happy", "sad", ".", ",", "?", "!"]
VOCAB = {token: i for i, token in enumerate([*SPECIALS, *WORDS])}
HIDDEN = 8
MAX_LENGTH = 24
OPSET = 17


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.fspath).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.fast)


def tokenizer() -> Tokenizer:
    """BERT-shaped: lower-cased words, [CLS] A [SEP] (B [SEP] as segment 1), [UNK] for the rest."""
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.add_special_tokens(SPECIALS)
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])])
    return tok


# --- ONNX encoders: one Gather of a table on input_ids, masked, shaped as each task's graph -------------------------


class Graph:
    def __init__(self, seed: int, inputs: tuple[str, ...] = (contract.INPUT_IDS, contract.ATTENTION_MASK)) -> None:
        self.rng = np.random.default_rng(seed)
        self.inputs = inputs
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.constant("axis_last", np.asarray([-1], dtype=np.int64))
        self.node("Cast", [contract.ATTENTION_MASK], "mask_f", to=TensorProto.FLOAT)
        self.node("Unsqueeze", ["mask_f", "axis_last"], "mask3")

    def constant(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def table(self, name: str, rows: int, width: int) -> str:
        return self.constant(name, self.rng.normal(size=(rows, width)).astype(np.float32))

    def node(self, op: str, inputs: list[str], output: str, **attributes) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], **attributes))
        return output

    def masked_lookup(self, table: str, ids: str, name: str) -> str:
        """[B, T, width]: the table's rows of `ids`, zero under padding."""
        return self.node("Mul", [self.node("Gather", [table, ids], f"{name}_raw"), "mask3"], name)

    def output(self, name: str, dims: list[int | str]) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", *dims]))

    def save(self, path: Path) -> None:
        inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"]) for n in self.inputs]
        graph = helper.make_graph(self.nodes, "prensa-fast", inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)
        onnx.checker.check_model(model)
        onnx.save(model, str(path))


def embed_graph(g: Graph) -> list[GraphOutput]:
    g.masked_lookup(g.table("embeddings", len(VOCAB), HIDDEN), contract.INPUT_IDS, contract.LAST_HIDDEN_STATE)
    g.output(contract.LAST_HIDDEN_STATE, ["tokens", HIDDEN])
    return [GraphOutput(contract.LAST_HIDDEN_STATE, [-1, HIDDEN], True)]


def m3_graph(g: Graph) -> list[GraphOutput]:
    """bge-m3's three heads: hidden states, relu token weights, ColBERT projections (CLS row included)."""
    outputs = embed_graph(g)
    weights = g.masked_lookup(g.table("sparse_linear", len(VOCAB), 1), contract.INPUT_IDS, "token_weights_3")
    g.node("Relu", [g.node("Squeeze", [weights, "axis_last"], "token_weights_raw")], contract.TOKEN_WEIGHTS)
    g.node("MatMul", [contract.LAST_HIDDEN_STATE, g.table("colbert_linear", HIDDEN, HIDDEN)], contract.COLBERT_VECS)
    g.output(contract.TOKEN_WEIGHTS, ["tokens"])
    g.output(contract.COLBERT_VECS, ["tokens", HIDDEN])
    return [*outputs, GraphOutput(contract.TOKEN_WEIGHTS, [-1], True),
            GraphOutput(contract.COLBERT_VECS, [-1, HIDDEN], True)]


def logits_graph(labels: int) -> Callable[[Graph], list[GraphOutput]]:
    """A cross-encoder: per label, a sum over tokens of a word score plus a segment score, so
    (query, passage) differs from (passage, query)."""

    def build(g: Graph) -> list[GraphOutput]:
        words = g.masked_lookup(g.table("word_scores", len(VOCAB), labels), contract.INPUT_IDS, "word_scores_t")
        types = g.masked_lookup(g.table("type_scores", 2, labels), contract.TOKEN_TYPE_IDS, "type_scores_t")
        tokens_axis = g.constant("axis_tokens", np.asarray([1], dtype=np.int64))
        g.node("ReduceSum", [g.node("Add", [words, types], "scores_t"), tokens_axis], contract.LOGITS, keepdims=0)
        g.output(contract.LOGITS, [labels])
        return [GraphOutput(contract.LOGITS, [labels], False)]

    return build


def splade_graph(g: Graph) -> list[GraphOutput]:
    """max over tokens of relu(MLM logits): one weight per vocabulary id."""
    logits = g.masked_lookup(g.table("mlm", len(VOCAB), len(VOCAB)), contract.INPUT_IDS, "mlm_t")
    g.node("ReduceMax", [g.node("Relu", [logits], "mlm_relu")], contract.SPLADE_WEIGHTS, axes=[1], keepdims=0)
    g.output(contract.SPLADE_WEIGHTS, [len(VOCAB)])
    return [GraphOutput(contract.SPLADE_WEIGHTS, [len(VOCAB)], False)]


PAIR_INPUTS = (contract.INPUT_IDS, contract.ATTENTION_MASK, contract.TOKEN_TYPE_IDS)
# name -> (task, graph builder, graph inputs, pooling, id2label)
MODELS = {
    "embed": (Task.EMBED, embed_graph, PAIR_INPUTS[:2], Pooling.MEAN, {}),
    "m3": (Task.M3, m3_graph, PAIR_INPUTS[:2], Pooling.CLS, {}),
    "rerank": (Task.RERANK, logits_graph(1), PAIR_INPUTS, None, {0: "LABEL_0"}),
    "classify": (Task.CLASSIFY, logits_graph(3), PAIR_INPUTS, None, {0: "negative", 1: "neutral", 2: "positive"}),
    "splade": (Task.SPLADE, splade_graph, PAIR_INPUTS[:2], None, {}),
}
FUSED = {"embed-fused": "embed"}  # served a second time as one fused model
MATRYOSHKA = {"embed": [4]}  # the sizes `dimensions` may cut a model's vectors to; the others declare none


def write_export(directory: Path, name: str, seed: int) -> Path:
    """An export directory as `prensa export` writes one: model.onnx, tokenizer.json, prensa.json."""
    task, build, inputs, pooling, id2label = MODELS[name]
    directory.mkdir(parents=True)
    graph = Graph(seed, inputs)
    outputs = build(graph)
    graph.save(directory / "model.onnx")
    tokenizer().save(str(directory / "tokenizer.json"))
    Manifest(task=task, source=f"prensa-fast/{name}", revision=f"rev-{seed}", max_length=MAX_LENGTH,
             onnx_file="model.onnx", dtype="fp32", inputs=list(inputs), outputs=outputs,
             pad_id=VOCAB["[PAD]"], special_ids=[VOCAB[t] for t in SPECIALS], pooling=pooling, normalize=True,
             dim=HIDDEN if task in (Task.EMBED, Task.M3) else None, id2label=id2label,
             matryoshka_dimensions=MATRYOSHKA.get(name)).write(directory)
    return directory


@dataclass(frozen=True)
class Fixture:
    repo: Path
    exports: dict[str, Path]


@pytest.fixture(scope="session")
def served(tmp_path_factory) -> Fixture:
    root = tmp_path_factory.mktemp("fast")
    exports = {name: write_export(root / "exports" / name, name, seed) for seed, name in enumerate(MODELS)}
    repo = root / "model_repo"
    sources = {name: ModelSource(name, path, Manifest.read(path)) for name, path in exports.items()}
    build_repository(list(sources.values()), repo, ServingOptions())
    build_repository([replace(sources[base], name=name) for name, base in FUSED.items()], repo,
                     ServingOptions(pipeline=Pipeline.FUSED))
    return Fixture(repo, exports)


# --- the oracle: the stages' own code, called directly ------------------------------------------------------------

TOKENIZE, POOL = load_stage("tokenize"), load_stage("pool")


class Oracle:
    """What a model's pipeline computes for some texts: tokenize stage -> onnxruntime -> pool stage."""

    def __init__(self, export: Path) -> None:
        self.manifest = Manifest.read(export)
        self.encoder = TOKENIZE.TextEncoder(export / "tokenizer.json", self.manifest.max_length, "right",
                                             self.manifest.pair_truncation)
        self.session = ort.InferenceSession(str(export / "model.onnx"), providers=["CPUExecutionProvider"])
        self.pool = POOL.Pooler.from_parameters(pool_parameters(self.manifest, ServingOptions()))

    def tokens(self, texts: list[str], pairs: list[str] | None = None) -> dict[str, np.ndarray]:
        items = list(zip(texts, pairs)) if pairs is not None else texts
        return TOKENIZE.pad_encodings(self.encoder.encode_requests([items])[0], self.manifest.pad_id)

    def encoded(self, tokens: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        feed = {i.name: tokens[i.name] for i in self.session.get_inputs()}
        return dict(zip(names, self.session.run(names, feed)))

    def __call__(self, texts: list[str], pairs: list[str] | None = None) -> dict[str, np.ndarray]:
        tokens = self.tokens(texts, pairs)
        return {**self.pool({**tokens, **self.encoded(tokens)}), "tokens": tokens[contract.INPUT_IDS]}


@pytest.fixture(scope="session")
def oracle(served) -> Callable[[str], Oracle]:
    cache: dict[str, Oracle] = {}

    def get(name: str) -> Oracle:
        if name not in cache:
            cache[name] = Oracle(served.exports[FUSED.get(name, name)])
        return cache[name]

    return get


# --- the gateway ----------------------------------------------------------------------------------------------------


@contextmanager
def gateway_client(settings: GatewaySettings, backend_repo: Path | None = None, direct_routes: bool = True,
                   shared_permits: SharedPermits | None = None) -> Iterator[TestClient]:
    """The real app (middleware, routes, lifespan) over an in-process backend of `backend_repo`
    (default: `settings.repo`), called through Starlette's TestClient."""
    factory = InProcessBackend.from_settings if backend_repo is None else (
        lambda s: InProcessBackend(backend_repo, s.triton_timeout_s))
    app = create_app(settings, environ={}, backend=factory, direct_routes=direct_routes, shared_permits=shared_permits)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="session")
def settings(served) -> GatewaySettings:
    return GatewaySettings(repo=served.repo, default_model="embed", access_log=False)


@pytest.fixture(scope="session")
def http(settings) -> Iterator[TestClient]:
    with gateway_client(settings) as client:
        yield client


@pytest.fixture(scope="session")
def through_fastapi(settings) -> Iterator[TestClient]:
    """The same gateway with every route run by FastAPI: the reference for the direct routes."""
    with gateway_client(settings, direct_routes=False) as client:
        yield client


@pytest.fixture
def start_gateway(settings) -> Iterator[Callable[..., TestClient]]:
    """Another gateway with some settings changed; stopped at the end of the test."""
    with ExitStack() as stack:
        yield lambda backend_repo=None, **changes: stack.enter_context(
            gateway_client(replace(settings, **changes), backend_repo))

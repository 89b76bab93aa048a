"""Each kind of model is one `Layout`, resolved once per served model: what the routes may ask of it
follows from its layout and its outputs, with no switch on its task."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prensa.export.source import SourceError
from prensa.gateway.apis.tei.routes import DEFAULT_OPERATIONS, default_operation, model_info
from prensa.gateway.core.registry import PromptedPairs
from prensa.layouts import LAYOUTS, Capability, ModelFiles, ModelType, Scoring, detect, resolve
from prensa.layouts.cross_encoder import CROSS_ENCODER
from prensa.layouts.llm_reranker import LLM_RERANKER
from prensa.manifest import Task
from prensa.stages import contract

# What the fast tier's models serve, written from what each kind of model is (bge-m3 with its heads
# ranks by its vectors; a cross-encoder ranks and predicts; SPLADE answers sparse weights only).
CAPABILITIES = {
    "embed": {Capability.DENSE},
    "m3": {Capability.DENSE, Capability.SPARSE, Capability.COLBERT, Capability.RERANK, Capability.M3},
    "rerank": {Capability.RERANK, Capability.PREDICT},
    "classify": {Capability.PREDICT},
    "splade": {Capability.SPARSE},
}
MODEL_TYPES = {"embed": "embedding", "m3": "embedding", "rerank": "reranker", "classify": "classifier",
               "splade": "embedding"}


def test_every_task_has_a_layout_and_every_layout_a_default_operation():
    assert {layout.task for layout in LAYOUTS} == set(Task)
    for task in Task:
        assert resolve(task).task is task
    assert {layout.default_operation for layout in LAYOUTS} <= set(DEFAULT_OPERATIONS)
    assert len({layout.name for layout in LAYOUTS}) == len(LAYOUTS)


@pytest.mark.parametrize("name", sorted(CAPABILITIES))
def test_what_a_model_serves_follows_from_its_layout(http, name):
    model = http.app.state.gateway.registry.models[name]
    served = {capability for capability in Capability if model.can(capability)} - {Capability.HIDDEN}
    assert served == CAPABILITIES[name]
    assert model.can(default_operation(model).capability)  # `POST /` runs what the model serves
    assert model_info(model)["model_type"].keys() == {MODEL_TYPES[name]}


def test_a_reranker_with_a_prompt_is_an_llm_reranker_that_needs_no_pair_input(http):
    cross_encoder = http.app.state.gateway.registry.models["rerank"]
    llm = replace(cross_encoder, prompted=PromptedPairs(object()))
    assert (cross_encoder.layout, llm.layout) == (CROSS_ENCODER, LLM_RERANKER)
    assert cross_encoder.needs_pairs and not llm.needs_pairs
    assert llm.layout.scoring is Scoring.PAIRS and llm.layout.model_type is ModelType.RERANKER


def test_bge_m3_without_its_heads_ranks_nothing(http):
    m3 = http.app.state.gateway.registry.models["m3"]
    dense_only = replace(m3, outputs=m3.outputs - {contract.SPARSE_IDS})
    assert m3.is_m3 and not dense_only.is_m3
    assert not dense_only.can(Capability.RERANK) and dense_only.can(Capability.DENSE)


def files(architectures: tuple[str, ...], labels: int = 1, present: tuple[str, ...] = (), name: str = "model",
          sentence: str | None = None) -> ModelFiles:
    """What detection reads of a model directory: `sentence` is None (no modules.json), "dense" or "splade"."""
    return ModelFiles(name=name, architectures=architectures, labels=labels, has=lambda path: path in present,
                      sentence_modules=sentence is not None, sentence_splade=sentence == "splade")


# What each kind of model's files look like, and the layout they are (bge-m3 named or with a head file;
# a sequence classifier by its labels; a causal LM a reranker only by its architecture and only bare).
DETECTED = [
    (files(("XLMRobertaModel",), present=("colbert_linear.pt",)), "m3"),
    (files(("XLMRobertaModel",), name="bge-m3-int8"), "m3"),
    (files(("XLMRobertaForSequenceClassification",)), "cross-encoder"),
    (files(("BertForSequenceClassification",), labels=3), "classifier"),
    (files(("Qwen3ForCausalLM",)), "llm-reranker"),
    (files(("Qwen3ForCausalLM",), sentence="dense"), "embedder"),
    (files(("BertForMaskedLM",)), "splade"),
    (files(("BertForMaskedLM",), sentence="dense"), "embedder"),
    (files(("BertModel",), sentence="splade"), "splade"),
    (files(("BertModel",)), "embedder"),
    (files(("ModernBertModel",), sentence="dense"), "embedder"),
]


@pytest.mark.parametrize(("model", "layout"), DETECTED, ids=[f"{m.architectures[0]}-{n}" for m, n in DETECTED])
def test_a_model_is_the_layout_that_claims_its_files(model, layout):
    assert detect(model).name == layout


def test_a_bare_causal_lm_that_is_no_known_reranker_is_refused_by_name():
    with pytest.raises(SourceError, match=r"LlamaForCausalLM.*without a sentence-transformers config"):
        detect(files(("LlamaForCausalLM",)))


ENCODER_OUTPUTS = {contract.LAST_HIDDEN_STATE, contract.TOKEN_WEIGHTS, contract.COLBERT_VECS, contract.LOGITS,
                   contract.SPLADE_WEIGHTS}


def test_every_layout_names_the_graph_outputs_its_pool_stage_reads():
    for layout in LAYOUTS:
        assert layout.graph_outputs, layout.name
        assert layout.graph_outputs <= ENCODER_OUTPUTS, layout.name

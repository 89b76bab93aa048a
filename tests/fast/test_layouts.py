"""Each kind of model is one `Layout`, resolved once per served model: what the routes may ask of it
follows from its layout and its outputs, with no switch on its task."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prensa.gateway.apis.tei.routes import DEFAULT_OPERATIONS, default_operation, model_info
from prensa.layouts import LAYOUTS, Capability, ModelType, Scoring, resolve
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
    llm = replace(cross_encoder, pair_template=object())
    assert (cross_encoder.layout, llm.layout) == (CROSS_ENCODER, LLM_RERANKER)
    assert cross_encoder.needs_pairs and not llm.needs_pairs
    assert llm.layout.scoring is Scoring.PAIRS and llm.layout.model_type is ModelType.RERANKER


def test_bge_m3_without_its_heads_ranks_nothing(http):
    m3 = http.app.state.gateway.registry.models["m3"]
    dense_only = replace(m3, outputs=m3.outputs - {contract.SPARSE_IDS})
    assert m3.is_m3 and not dense_only.is_m3
    assert not dense_only.can(Capability.RERANK) and dense_only.can(Capability.DENSE)

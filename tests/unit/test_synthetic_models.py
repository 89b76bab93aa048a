"""The random-weight bge-m3 / bge-reranker-v2-m3 generator: the tiny size builds, loads, runs and
exports; the full size has XLM-R large's shapes, checked on its config without allocating weights."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, XLMRobertaForSequenceClassification, XLMRobertaModel

from prensa.export import synthetic
from prensa.export.pipeline import ExportOptions, export_model
from prensa.manifest import Manifest, Task


@pytest.fixture(scope="module")
def tiny_m3(tmp_path_factory):
    return synthetic.bge_m3(tmp_path_factory.mktemp("synthetic") / "bge-m3", "tiny")


@pytest.fixture(scope="module")
def tiny_reranker(tmp_path_factory):
    return synthetic.bge_reranker(tmp_path_factory.mktemp("synthetic") / "reranker", "tiny")


def test_tiny_bge_m3_has_the_real_layout_and_runs(tiny_m3):
    assert {"config.json", "model.safetensors", "sparse_linear.pt", "colbert_linear.pt", "tokenizer.json"} <= {
        p.name for p in tiny_m3.iterdir()}
    tokenizer = AutoTokenizer.from_pretrained(tiny_m3)
    assert (tokenizer.cls_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    batch = tokenizer(["dense retrieval", "a longer passage about the capital city of Germany"], padding=True,
                      return_tensors="pt")
    assert batch["input_ids"][0, 0] == 0 and batch["input_ids"][0, -1] == 1  # <s> first, <pad> after the short one
    model = XLMRobertaModel.from_pretrained(tiny_m3).eval()
    hidden_size = model.config.hidden_size
    sparse, colbert = torch.nn.Linear(hidden_size, 1), torch.nn.Linear(hidden_size, hidden_size)
    sparse.load_state_dict(torch.load(tiny_m3 / "sparse_linear.pt"))
    colbert.load_state_dict(torch.load(tiny_m3 / "colbert_linear.pt"))
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
        weights = torch.relu(sparse(hidden)).squeeze(-1)
    assert hidden.shape == (2, batch["input_ids"].shape[1], hidden_size) and torch.isfinite(hidden).all()
    assert (weights[batch["attention_mask"].bool()] > 0).any()  # the positive bias leaves sparse terms
    assert colbert(hidden).shape == hidden.shape


def test_tiny_bge_m3_exports_as_an_m3_model(tmp_path, tiny_m3):
    manifest, report = export_model(ExportOptions(str(tiny_m3), tmp_path / "export"))
    assert report.ok, report.heading
    assert manifest.task is Task.M3 and Manifest.read(tmp_path / "export").pad_id == 1
    assert {o.name for o in manifest.outputs} == {"last_hidden_state", "token_weights", "colbert_vecs"}


def test_tiny_reranker_scores_pairs_with_one_logit(tiny_reranker):
    config = json.loads((tiny_reranker / "config.json").read_text())
    assert config["architectures"] == ["XLMRobertaForSequenceClassification"] and config["id2label"] == {"0": "LABEL_0"}
    tokenizer = AutoTokenizer.from_pretrained(tiny_reranker)
    pairs = tokenizer(["capital of Germany"] * 2, ["Berlin is the capital.", "The fox jumps."], padding=True,
                      return_tensors="pt")
    with torch.no_grad():
        logits = XLMRobertaForSequenceClassification.from_pretrained(tiny_reranker).eval()(**pairs).logits
    assert logits.shape == (2, 1) and logits[0, 0] != logits[1, 0]


def xlmr_large_parameters(vocab: int, positions: int, hidden: int, layers: int, ffn: int) -> int:
    """XLM-R large's weights counted by hand: embeddings (+ LayerNorm), per layer attention (four
    projections), FFN, two LayerNorms."""
    embeddings = vocab * hidden + positions * hidden + hidden + 2 * hidden
    layer = 4 * (hidden * hidden + hidden) + (hidden * ffn + ffn) + (ffn * hidden + hidden) + 2 * 2 * hidden
    return embeddings + layers * layer


def test_full_size_has_xlmr_large_shapes_and_bge_m3s_parameter_count():
    config = synthetic.bge_m3_config("full")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.intermediate_size) == (
        24, 1024, 16, 4096)
    assert (config.vocab_size, config.max_position_embeddings, config.type_vocab_size, config.pad_token_id) == (
        250002, 8194, 1, 1)
    assert config.layer_norm_eps == 1e-5
    encoder = xlmr_large_parameters(250002, 8194, 1024, 24, 4096)
    heads = (1024 + 1) + (1024 * 1024 + 1024)  # sparse_linear, colbert_linear
    assert synthetic.parameter_count(config, "bge-m3") == encoder + heads
    assert 566e6 < encoder + heads < 569e6  # bge-m3's model card: 568M
    reranker = synthetic.reranker_config("full")
    assert reranker.num_labels == 1 and reranker.hidden_size == 1024
    classifier = (1024 * 1024 + 1024) + (1024 + 1)  # dense + out_proj
    assert synthetic.parameter_count(reranker, "reranker") == encoder + classifier


def test_full_size_costs_what_the_issue_budgets_per_token():
    config = synthetic.bge_m3_config("full")
    assert synthetic.flops_per_token(config, 128) == pytest.approx(0.62e9, rel=0.01)
    assert synthetic.flops_per_token(config, 512) == pytest.approx(0.65e9, rel=0.01)


def test_tiny_size_takes_its_vocabulary_from_the_tokenizer_and_unknown_sizes_are_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        synthetic.xlmr_config("tiny")
    assert synthetic.xlmr_config("tiny", 400).vocab_size == 400
    with pytest.raises(ValueError, match="unknown size"):
        synthetic.shape("huge")  # type: ignore[arg-type]


def test_a_synthetic_static_model_is_a_table_of_the_tokenizers_vocabulary(tmp_path):
    from prensa.export.source import SourceModel
    from prensa.layouts import static
    from tests import tiny_layouts

    tokenizer = tiny_layouts.wordpiece_tokenizer(tmp_path / "tokenizer").backend_tokenizer
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    directory = synthetic.static_embedding(tmp_path / "static", tmp_path / "tokenizer.json", "tiny")
    layout = static.read_static(SourceModel(directory, "static", "local"))
    assert layout is not None and layout.library == static.SENTENCE_TRANSFORMERS
    assert static.table(layout).shape == (tokenizer.get_vocab_size(), synthetic.STATIC_DIMS["tiny"])

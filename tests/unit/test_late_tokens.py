"""A late-interaction model's tokens without a server: the export's framing of queries and
documents, the gateway's query rows and the pool stage's choice of vectors, each against what
PyLate does written out by hand (the served comparison with PyLate itself is
tests/e2e/test_late_interaction_triton.py)."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from prensa.export import synthetic
from prensa.export.pipeline import ExportOptions, export_model
from prensa.gateway.core.tokenization import QueryFraming, query_rows
from prensa.manifest import Task
from prensa.stages import contract, load_stage

POOL = load_stage("pool")
TEXT = "How are module attributes looked up, and why?"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("late-tokens")
    manifest, report = export_model(ExportOptions(str(synthetic.colbert(root / "source")), root / "out"))
    assert report.ok and manifest.task is Task.LATE
    return manifest, root / "out"


def test_documents_and_queries_are_framed_as_pylate_frames_them(export):
    manifest, out = export
    late = manifest.late_interaction
    documents = Tokenizer.from_file(str(out / manifest.tokenizer_file))
    queries = Tokenizer.from_file(str(out / late.query_tokenizer_file))
    plain = documents.encode(TEXT, add_special_tokens=False).ids
    cls, sep = documents.token_to_id("[CLS]"), documents.token_to_id("[SEP]")
    assert documents.encode(TEXT).ids == [cls, late.document_marker_id, *plain, sep]
    query = queries.encode(TEXT)
    expansion = late.query_length - len(plain) - 3
    assert query.ids == [cls, late.query_marker_id, *plain, sep, *[late.mask_id] * expansion]
    assert query.attention_mask == [1] * (len(plain) + 3) + [0] * expansion
    long = queries.encode(TEXT * 10)
    assert len(long.ids) == late.query_length and long.ids[-1] == sep  # cut, the [SEP] kept


@pytest.mark.parametrize("attend", [False, True])
def test_query_rows_mark_the_expansion_the_encoder_reads(export, attend):
    manifest, out = export
    framing = QueryFraming(Tokenizer.from_file(str(out / manifest.late_interaction.query_tokenizer_file)), attend)
    rows = query_rows(framing, [TEXT, "ok"])
    ids, mask, _ = rows.padded(manifest.pad_id)
    assert ids.shape == (2, manifest.late_interaction.query_length)
    expanded = ids == manifest.late_interaction.mask_id
    assert expanded.any() and (mask[expanded] == (1 if attend else contract.UNATTENDED_TOKEN)).all()
    assert (mask[~expanded] == 1).all()
    # every token counts as the row's: the encode stage copies expansion tokens into its passes
    assert contract.token_counts(mask).tolist() == [ids.shape[1]] * 2


def test_the_pool_stage_keeps_what_pylate_keeps():
    marker, skip = 7, np.array([5, 6])
    ids = np.array([[2, marker, 10, 5, 11, 3, 4, 4],     # a query: its punctuation and expansion kept
                    [2, 8, 10, 5, 11, 6, 3, 0]])         # a document: punctuation and padding dropped
    mask = np.array([[1, 1, 1, 1, 1, 1, contract.UNATTENDED_TOKEN, contract.UNATTENDED_TOKEN],
                     [1, 1, 1, 1, 1, 1, 1, 0]])
    kept = contract.late_kept(ids, mask, marker, skip)
    assert kept.tolist() == [[True] * 8, [True, True, True, False, True, False, True, False]]
    vecs = np.random.default_rng(0).normal(size=(2, 8, 4)).astype(np.float32)
    out = POOL.late_vectors(vecs, ids, mask, POOL.LateTokens(marker, skip))
    want = vecs[1, [0, 1, 2, 4, 6]]
    np.testing.assert_allclose(out[1, :5], want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-6)
    assert not out[1, 5:].any() and np.allclose(np.linalg.norm(out[0], axis=1), 1)

"""Pool-stage maths against torch / hand-computed values."""

from __future__ import annotations

import numpy as np
import torch

from prensa.stages import load_stage

pool = load_stage("pool")


def test_mean_pooling_ignores_padding():
    hidden = np.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]], dtype=np.float32)
    mask = np.array([[1, 1, 0]])
    np.testing.assert_allclose(pool.pool_tokens(hidden, mask, "mean"), [[2.0, 3.0]])
    np.testing.assert_allclose(pool.pool_tokens(hidden, mask, "cls"), [[1.0, 2.0]])
    np.testing.assert_allclose(pool.pool_tokens(hidden, mask, "last"), [[3.0, 4.0]])


def test_l2_normalize_matches_torch_and_keeps_zero_vectors():
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    x[2] = 0
    expected = torch.nn.functional.normalize(torch.from_numpy(x), dim=-1).numpy()
    np.testing.assert_allclose(pool.l2_normalize(x), expected, rtol=1e-6)


def test_sparse_terms_keep_max_per_id_and_drop_specials():
    ids = np.array([0, 7, 9, 7, 3, 2, 1])
    weights = np.array([5.0, 0.2, 0.0, 0.6, 0.1, 9.0, 9.0], dtype=np.float32)
    got_ids, got_weights = pool.sparse_terms(ids, weights, drop_ids=np.array([0, 1, 2, 3]))
    assert got_ids.tolist() == [7]
    np.testing.assert_allclose(got_weights, [0.6])


def test_pad_terms_marks_padding():
    ids, weights = pool.pad_terms([(np.array([4, 8]), np.array([0.5, 0.25])), (np.array([], dtype=np.int64), np.array([]))])
    assert ids.tolist() == [[4, 8], [-1, -1]]
    assert weights.tolist() == [[0.5, 0.25], [0.0, 0.0]]


def test_colbert_drops_cls_and_padding():
    vecs = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3) + 1
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
    out = pool.colbert_vectors(vecs, mask)
    assert out.shape == (2, 3, 3)
    np.testing.assert_allclose(np.linalg.norm(out[0], axis=-1), 1.0, rtol=1e-6)
    assert not out[1, 1:].any()
    np.testing.assert_allclose(out[1, 0], vecs[1, 1] / np.linalg.norm(vecs[1, 1]), rtol=1e-6)


def test_activations():
    logits = np.array([[0.0], [2.0]], dtype=np.float32)
    np.testing.assert_allclose(pool.activate(logits, "sigmoid"), torch.sigmoid(torch.from_numpy(logits)).numpy(), rtol=1e-6)
    many = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    np.testing.assert_allclose(pool.activate(many, "softmax"), torch.softmax(torch.from_numpy(many), -1).numpy(), rtol=1e-6)

"""Token-budget planning: every row served once, budgets and length ratios respected, no loops."""

from __future__ import annotations

import numpy as np
import pytest

from prensa.stages import load_stage

encode = load_stage("encode")


@pytest.mark.parametrize("seed", range(20))
def test_plan_covers_every_row_once_within_budget(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, size=rng.integers(1, 80))
    budget, ratio, max_rows = 2048, 1.25, 32
    batches = encode.plan_sub_batches(lengths, budget, ratio, max_rows)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for batch in batches:
        sizes = lengths[batch]
        assert list(sizes) == sorted(sizes)
        assert len(batch) <= max_rows
        assert len(batch) == 1 or len(batch) * sizes.max() <= budget
        assert sizes.max() <= ratio * sizes.min() or len(batch) == 1


def test_row_longer_than_budget_runs_alone():
    batches = encode.plan_sub_batches(np.array([10, 5000, 12]), max_batch_tokens=1000, length_ratio=2.0, max_rows=8)
    assert [b.tolist() for b in batches] == [[0, 2], [1]]


class FakeSession:
    """Echoes ids as a float 'hidden state' and counts calls, to check scatter/gather exactly."""

    def __init__(self):
        self.calls = []

    def get_inputs(self):
        return [type("I", (), {"name": n})() for n in ("input_ids", "attention_mask")]

    def get_outputs(self):
        return [type("O", (), {"name": "last_hidden_state"})()]

    def run(self, names, feed, options=None):
        self.calls.append(feed["input_ids"].shape)
        return [np.repeat(feed["input_ids"][..., None].astype(np.float32), 2, axis=-1)]


def test_encoder_returns_each_request_its_own_rows():
    session = FakeSession()
    encoder = encode.TokenBudgetEncoder(session, pad_id=0, max_batch_tokens=64, length_ratio=1.25, max_rows=8,
                                        per_token_outputs={"last_hidden_state"})
    rng = np.random.default_rng(1)
    requests = []
    for n_rows, width in [(1, 3), (3, 9), (2, 30)]:
        lengths = rng.integers(1, width + 1, size=n_rows)
        lengths[0] = width
        ids = np.zeros((n_rows, width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, length in enumerate(lengths):
            ids[row, :length] = rng.integers(5, 100, size=length)
            mask[row, :length] = 1
        requests.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    results = encoder.encode(requests)
    for request, result in zip(requests, results):
        hidden = result["last_hidden_state"]
        assert hidden.shape == (*request["input_ids"].shape, 2)
        np.testing.assert_array_equal(hidden[..., 0], request["input_ids"] * request["attention_mask"])
    assert len(session.calls) > 1  # 30-token rows cannot share a pass with 3-token ones
    assert encoder.padded_tokens >= encoder.real_tokens == sum(int(r["attention_mask"].sum()) for r in requests)

"""A version on trial, without Triton: the shadow's comparison of two versions' vectors, and the
record of a trial, which a promotion, a rollback or the trial version's removal ends. Served by a
real Triton and gateway in tests/gateway/test_model_admin.py."""

from __future__ import annotations

import numpy as np
import pytest

from prensa.gateway.core.shadow import Comparison
from prensa.triton.models import (
    ModelChangeError,
    VersionConflict,
    end_trial,
    promote,
    remove_model,
    rollback,
    set_trial,
)
from prensa.triton.versions import read_versions


def batches(rows: np.ndarray, size: int = 8) -> list[np.ndarray]:
    return [rows[start:start + size] for start in range(0, len(rows), size)]


def compared(current: np.ndarray, candidate: np.ndarray) -> tuple[list[float], list[float]]:
    comparison, cosines, agreements = Comparison(), [], []
    for one, other in zip(batches(current), batches(candidate)):
        got = comparison.add(one, other)
        cosines += got[0]
        agreements += got[1]
    return cosines, agreements


def test_a_copy_agrees_a_rotated_space_keeps_its_neighbours_another_space_does_not():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(80, 32)).astype(np.float32)
    cosines, agreements = compared(vectors, vectors * 3.0)  # the same directions
    assert np.allclose(cosines, 1.0, atol=1e-6) and agreements == [1.0] * len(agreements)
    assert len(agreements) == 80 - 16, "counted once more than the top-k inputs were seen"
    rotation, _ = np.linalg.qr(rng.normal(size=(32, 32)))
    cosines, agreements = compared(vectors, (vectors @ rotation).astype(np.float32))
    assert np.mean(cosines) < 0.5, "another space's coordinates"
    assert np.mean(agreements) > 0.999, "the same neighbours, which is what retrieval reads"
    cosines, agreements = compared(vectors, rng.normal(size=(80, 16)).astype(np.float32))
    assert cosines == [] and np.mean(agreements) < 0.5, "widths differ: no cosine; neighbours by chance"
    ring = Comparison(recent=24)  # fewer than the inputs: the oldest are overwritten in turn
    agreements = [a for one in batches(vectors) for a in ring.add(one, one * 2.0)[1]]
    assert ring.seen == 80 and len(agreements) == 64 and set(agreements) == {1.0}


@pytest.fixture
def repo(tmp_path):
    """A repository holding versions 1 to 3 of `m`, as directories."""
    for model in ("m", "m@2", "m@3"):
        (tmp_path / model).mkdir()
    return tmp_path


def test_a_trial_is_recorded_and_ended_by_a_promotion_a_rollback_or_its_removal(repo):
    set_trial(repo, "m", 2, share=0.25)
    lineage = read_versions(repo)["m"]
    assert (lineage.current, lineage.canary, lineage.share, lineage.shadow) == (1, 2, 0.25, None)
    set_trial(repo, "m", 3, shadow=True)  # one trial at a time: the canary ends
    lineage = read_versions(repo)["m"]
    assert (lineage.canary, lineage.shadow) == (None, 3)
    promote(repo, "m", 2)
    assert read_versions(repo)["m"].shadow is None, "the trial compared with the version before"
    set_trial(repo, "m", 3, share=0.5)
    rollback(repo, "m")
    assert read_versions(repo)["m"].canary is None and read_versions(repo)["m"].current == 1
    set_trial(repo, "m", 2, shadow=True)
    set_trial(repo, "m", 2)  # neither a share nor a shadow: the trial ends
    assert read_versions(repo)["m"].shadow is None
    set_trial(repo, "m", 3, shadow=True)
    remove_model(repo, [], ["m@3"])  # no Triton to unload it from here
    assert read_versions(repo)["m"].shadow is None and not (repo / "m@3").exists()
    with pytest.raises(ModelChangeError, match="no version on trial"):
        end_trial(repo, "m")
    set_trial(repo, "m", 2, share=0.5)
    assert end_trial(repo, "m").canary is None and read_versions(repo)["m"].canary is None
    with pytest.raises(VersionConflict, match="reaches already"):
        set_trial(repo, "m", 1, share=0.5)
    with pytest.raises(ModelChangeError, match="not in the repository"):
        set_trial(repo, "m", 7, shadow=True)

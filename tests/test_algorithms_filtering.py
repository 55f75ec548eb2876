"""DAPO online filtering: which groups survive."""

import numpy as np
import pytest

from easyrl.algorithms.filtering import select_groups


def test_groups_outside_the_band_are_dropped():
    # a: mean 1 (too high), b: mean 0 (too low), c and d: mean 0.5 (kept)
    scores = np.array([1, 1, 0, 0, 1, 0, 0.5, 0.5])
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "d"], dtype=object)
    keep, metrics = select_groups(scores, uids, filter_low=0.01, filter_high=0.99)
    assert keep.tolist() == [4, 5, 6, 7]
    assert metrics == {
        "filter/kept_groups": 2.0,
        "filter/dropped_groups": 2.0,
        "filter/dropped_low": 1.0,
        "filter/dropped_high": 1.0,
    }


def test_band_edges_are_inclusive():
    keep, _ = select_groups(np.array([0.0, 1.0]), np.array(["lo", "hi"], dtype=object), 0.0, 1.0)
    assert keep.tolist() == [0, 1]


def test_interleaved_groups_keep_their_samples():
    keep, _ = select_groups(np.array([1, 0, 0, 0]), np.array(["x", "y", "x", "y"], dtype=object), 0.1, 0.9)
    assert keep.tolist() == [0, 2]


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="3 scores for 2 samples"):
        select_groups(np.zeros(3), np.array(["a", "b"], dtype=object), 0.0, 1.0)

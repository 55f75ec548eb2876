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
        "filter/kept_uniform_groups": 1.0,  # d: both samples scored 0.5
        "filter/dropped_groups": 2.0,
        "filter/dropped_low": 1.0,
        "filter/dropped_high": 1.0,
    }


def test_band_edges_are_exclusive_as_in_easyr1():
    # EasyR1 keeps low < mean < high: a mean exactly on an edge is dropped (DAPO's all-0 / all-1 groups with 0 / 1)
    scores = np.array([0.0, 1.0, 0.5, 0.25])
    uids = np.array(["lo", "hi", "mid", "edge"], dtype=object)
    keep, metrics = select_groups(scores, uids, 0.0, 1.0)
    assert keep.tolist() == [2, 3]
    assert metrics["filter/dropped_low"] == 1.0 and metrics["filter/dropped_high"] == 1.0
    keep, _ = select_groups(scores, uids, 0.25, 1.0)
    assert keep.tolist() == [2]


def test_interleaved_groups_keep_their_samples():
    keep, _ = select_groups(np.array([1, 0, 0, 0]), np.array(["x", "y", "x", "y"], dtype=object), 0.1, 0.9)
    assert keep.tolist() == [0, 2]


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="3 scores for 2 samples"):
        select_groups(np.zeros(3), np.array(["a", "b"], dtype=object), 0.0, 1.0)


def test_collector_gathers_kept_groups_across_rounds_until_full():
    import torch

    from easyrl.algorithms.filtering import GroupCollector
    from easyrl.protocol import DataProto

    def round_of(uids, scores):
        return DataProto.from_dict(
            tensors={"responses": torch.arange(len(uids)).unsqueeze(-1)},
            non_tensors={"uid": np.array(uids, dtype=object), "accuracy": np.array(scores, dtype=object)},
        )

    collector = GroupCollector(target_groups=2, group_size=2)
    # round 1: a is all-correct (dropped), b is mixed (kept)
    collector.add(round_of(["a", "a", "b", "b"], [1, 1, 0, 1]), filter_key="accuracy", low=0.01, high=0.99)
    assert collector.num_groups == 1 and not collector.full
    # round 2: c and d are mixed; only c is needed
    collector.add(round_of(["c", "c", "d", "d"], [1, 0, 0, 1]), filter_key="accuracy", low=0.01, high=0.99)
    assert collector.full
    batch = collector.take()
    assert batch.non_tensor_batch["uid"].tolist() == ["b", "b", "c", "c"]
    # kept: the groups trained; d passed the filter too and is counted apart, as generated and dropped
    metrics = collector.metrics()
    assert metrics["filter/kept_groups"] == 2.0 and metrics["filter/surplus_groups"] == 1.0
    assert metrics["filter/dropped_high"] == 1.0 and metrics["filter/dropped_groups"] == 1.0
    seen = sum(metrics[f"filter/{key}"] for key in ("kept_groups", "surplus_groups", "dropped_groups"))
    assert seen == 4.0  # every group generated, counted once


def test_rounds_that_overshoot_the_batch_without_a_filter_count_the_groups_left_untrained():
    import torch

    from easyrl.algorithms.filtering import GroupCollector
    from easyrl.protocol import DataProto

    def round_of(uids):
        return DataProto.from_dict(
            tensors={"responses": torch.zeros(len(uids), 1)}, non_tensors={"uid": np.array(uids, dtype=object)}
        )

    collector = GroupCollector(target_groups=4, group_size=1)  # rollout_batch_size 4 in calls of 3 prompts
    collector.add(round_of(["a", "b", "c"]))
    collector.add(round_of(["d", "e", "f"]))
    assert collector.metrics() == {"filter/kept_groups": 4.0, "filter/surplus_groups": 2.0}
    exact = GroupCollector(target_groups=4, group_size=1)
    exact.add(round_of(["a", "b"]))
    exact.add(round_of(["c", "d"]))
    assert exact.metrics() == {}  # nothing left untrained: nothing to say


def test_groups_of_alike_scores_are_counted_among_the_trained_groups_only():
    import torch

    from easyrl.algorithms.filtering import GroupCollector
    from easyrl.protocol import DataProto

    collector = GroupCollector(target_groups=1, group_size=2)
    # a right answer scores 0.9: both groups pass EasyR1's bounds; only the first is trained
    data = DataProto.from_dict(
        tensors={"responses": torch.zeros(4, 1)},
        non_tensors={"uid": np.array(["m", "m", "u", "u"], dtype=object), "overall": np.array([0.9, 0.0, 0.9, 0.9])},
    )
    collector.add(data, filter_key="overall", low=0.01, high=0.99)
    metrics = collector.metrics()
    assert metrics["filter/kept_groups"] == 1.0 and metrics["filter/surplus_groups"] == 1.0
    assert metrics["filter/kept_uniform_groups"] == 0.0  # u, all alike, was not trained
    other = GroupCollector(target_groups=2, group_size=2)
    other.add(data, filter_key="overall", low=0.01, high=0.99)
    assert other.metrics()["filter/kept_uniform_groups"] == 1.0


def test_a_filter_key_the_reward_does_not_give_names_the_scores_and_the_nearest():
    import torch

    from easyrl.algorithms.filtering import FilterKeyError, filter_groups
    from easyrl.protocol import DataProto

    data = DataProto.from_dict(
        tensors={"responses": torch.zeros(4, 1)},
        non_tensors={
            "uid": np.array(["a", "a", "b", "b"], dtype=object),
            "accuracy": np.array([1.0, 0.0, 1.0, 1.0]),
            "overall": np.array([1.0, 0.0, 1.0, 1.0]),
            "ground_truth": np.array([3, 3, 4, 4], dtype=object),
            "data_source": np.array(["x"] * 4, dtype=object),
        },
    )
    with pytest.raises(FilterKeyError) as error:
        filter_groups(data, "acuracy", 0.01, 0.99)
    assert str(error.value) == (
        "`algorithm.filter_key` is `acuracy`, but the reward gives no such score: did you mean `accuracy`? The scores "
        "of each sample: accuracy, overall."
    )


def test_groups_kept_although_their_samples_all_scored_alike_are_counted_and_said_once(caplog):
    import logging
    from types import SimpleNamespace

    from easyrl.config import AlgorithmConfig
    from easyrl.trainer.ray_trainer import PPOTrainer

    # a right answer scores 0.9 (a reward that tops at 1): EasyR1's bounds keep the all-right group
    scores = np.array([0.9, 0.9, 0.9, 0.0, 0.9, 0.0, 0.0, 0.0, 0.5])
    uids = np.array(["right", "right", "right", "mixed", "mixed", "mixed", "wrong", "wrong", "one"], dtype=object)
    keep, metrics = select_groups(scores, uids, filter_low=0.01, filter_high=0.99)
    assert keep.tolist() == [0, 1, 2, 3, 4, 5, 8]  # a group of one sample is never counted as alike
    assert metrics["filter/kept_groups"] == 3.0 and metrics["filter/kept_uniform_groups"] == 1.0
    trainer = SimpleNamespace(config=SimpleNamespace(algorithm=AlgorithmConfig(online_filtering=True)))
    trainer._said_uniform_groups = False
    with caplog.at_level(logging.WARNING, logger="easyrl.trainer.ray_trainer"):
        PPOTrainer._say_uniform_groups(trainer, 0.0)
        assert not caplog.records
        PPOTrainer._say_uniform_groups(trainer, metrics["filter/kept_uniform_groups"])
        PPOTrainer._say_uniform_groups(trainer, 2.0)
    (record,) = caplog.records
    assert record.getMessage().startswith("Online filtering kept 1 groups whose samples all have the same `overall`")
    assert "algorithm.filter_key=accuracy" in record.getMessage()

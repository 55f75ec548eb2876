"""Scoring through the pool of Ray reward actors: a batch function sees the whole batch in one call, sequential
calls spread over actors, and functions that raise, hang or misbehave score 0 and are counted (NaN scores, hangs
bounded per batch and dying actors: test_reward_faults.py)."""

import logging
import time
from pathlib import Path

import pytest

from easyrl.config import RewardConfig
from easyrl.workers.reward.loader import RewardFunctionError
from easyrl.workers.reward.scorer import RewardScorer, reduce_reward_metrics


RAISES_ON_BOOM = """
REWARD_TYPE = "sequential"

def compute_score(item):
    if item["ground_truth"] == "boom":
        raise ZeroDivisionError("user code failed")
    return {"overall": 1.0, "accuracy": 0.5}
"""

HANGS_ON_HANG = """
import time

REWARD_TYPE = "sequential"

def compute_score(item):
    if item["ground_truth"] == "hang":
        time.sleep(3600)
    return {"overall": float(item["response_length"])}
"""

BATCH_HANGS_ON_HANG = """
import time

def compute_score(reward_inputs):
    if any(item["ground_truth"] == "hang" for item in reward_inputs):
        time.sleep(3600)
    return [{"overall": float(item["response_length"])} for item in reward_inputs]
"""

BATCH_NORMALISED = str(Path(__file__).resolve().parent / "data" / "easyr1_batch_reward.py")

WRONG_LENGTH = """
def compute_score(reward_inputs):
    return [{"overall": 1.0}]
"""


def kinds(failures):
    """Why each sample scored 0 (None where it was scored)."""
    return [failure and failure.kind for failure in failures]


def inputs(*truths):
    return [{"response": "r", "response_length": i + 1, "ground_truth": t} for i, t in enumerate(truths)]


@pytest.mark.timeout(120)
def test_a_raising_function_scores_zero_for_its_samples_and_training_continues(ray_cluster, reward_file, caplog):
    config = RewardConfig(reward_function=reward_file(RAISES_ON_BOOM), num_cpus=2, timeout_s=30)
    scorer = RewardScorer(config, tokenizer=None)
    try:
        assert (scorer.pool.num_actors, scorer.pool.actor_num_cpus) == (2, 1)  # sequential calls spread over actors
        with caplog.at_level(logging.WARNING, logger="easyrl.workers.reward.scorer"):
            scores, failures = scorer.score_inputs(inputs("a", "boom", "b", "boom"))
            scorer.score_inputs(inputs("boom"))  # a second failure is not logged again
        assert [s["overall"] for s in scores] == [1.0, 0.0, 1.0, 0.0]
        assert kinds(failures) == [None, "raised", None, "raised"]
        logged = [r.getMessage() for r in caplog.records if "raised" in r.getMessage()]
        assert len(logged) == 1 and "ZeroDivisionError: user code failed" in logged[0]
        assert "raised on sample 1 (ground truth 'boom');" in logged[0] and "2 of 4 samples" in logged[0]
    finally:
        scorer.shutdown()


@pytest.mark.timeout(180)
def test_a_batch_function_sees_the_whole_batch_in_the_pool_as_in_process(ray_cluster):
    # 8 responses, 3 right: overall = accuracy - 3/8 only when one call sees all 8 (chunks would see other means)
    batch = [
        {"response": rf"\boxed{{{answer}}}", "response_length": 4, "ground_truth": truth}
        for answer, truth in [(4, "4"), (5, "4"), ("0.5", "1/2"), (7, "8"), (9, "9"), (1, "2"), (3, "5"), (6, "7")]
    ]
    expected = [0.625, -0.375, 0.625, -0.375, 0.625, -0.375, -0.375, -0.375]
    results = {}
    for num_cpus in (None, 0, 2):  # None: in this process
        config = RewardConfig(reward_function=BATCH_NORMALISED, num_cpus=num_cpus or 0, timeout_s=60)
        scorer = RewardScorer(config, tokenizer=None, in_process=num_cpus is None)
        try:
            if num_cpus is not None:  # one actor holding all the CPUs (EasyR1's meaning of num_cpus; 0 reserves none)
                assert (scorer.pool.num_actors, scorer.pool.actor_num_cpus) == (1, num_cpus)
            results[num_cpus] = scorer.score_inputs(batch)
        finally:
            scorer.shutdown()
    assert results[2] == results[0] == results[None]
    scores, failures = results[2]
    assert [s["overall"] for s in scores] == expected
    assert {s["batch_size"] for s in scores} == {8.0} and failures == [None] * 8


@pytest.mark.timeout(120)
def test_a_hanging_batch_call_scores_the_whole_batch_zero(ray_cluster, reward_file):
    config = RewardConfig(reward_function=reward_file(BATCH_HANGS_ON_HANG), num_cpus=2, timeout_s=2)
    scorer = RewardScorer(config, tokenizer=None)
    try:
        scores, failures = scorer.score_inputs(inputs("a", "hang", "b"))
        assert scores == [{"overall": 0.0}] * 3 and kinds(failures) == ["timed out"] * 3
        assert scorer.pool.num_replaced == 1
        scores, failures = scorer.score_inputs(inputs("c", "d"))  # the replacement actor serves the next batch
        assert [s["overall"] for s in scores] == [1.0, 2.0] and failures == [None, None]
    finally:
        scorer.shutdown()


@pytest.mark.timeout(120)
def test_with_one_actor_the_chunks_behind_a_hung_call_score_zero_at_the_deadline(ray_cluster, reward_file):
    config = RewardConfig(reward_function=reward_file(HANGS_ON_HANG), num_cpus=1, timeout_s=3)
    scorer = RewardScorer(config, tokenizer=None, chunks_per_actor=4)  # 4 inputs -> 4 chunks of one, one actor
    try:
        start = time.monotonic()
        scores, failures = scorer.score_inputs(inputs("a", "hang", "b", "c"))
        # one deadline for the batch: the chunks queued behind the hung call are not scored (more actors would)
        assert 3 <= time.monotonic() - start < 6
        assert [s["overall"] for s in scores] == [1.0, 0.0, 0.0, 0.0]
        assert kinds(failures) == [None, "timed out", "timed out", "timed out"]
        assert scorer.pool.num_replaced == 1
        # the replacement actor serves the next batch
        scores, failures = scorer.score_inputs(inputs("d"))
        assert scores == [{"overall": 1.0}] and failures == [None]
    finally:
        scorer.shutdown()


@pytest.mark.timeout(120)
def test_a_wrong_return_shape_stops_with_the_function_and_file_named(ray_cluster, reward_file):
    config = RewardConfig(reward_function=reward_file(WRONG_LENGTH), num_cpus=1, timeout_s=30)
    scorer = RewardScorer(config, tokenizer=None)
    try:
        with pytest.raises(RewardFunctionError, match=r"`compute_score` in .*reward.py.*list of 3 dicts"):
            scorer.score_inputs(inputs("a", "b", "c"))
    finally:
        scorer.shutdown()


def test_reduced_metrics_average_scores_and_count_errors():
    reduced = reduce_reward_metrics(
        {"reward/overall": [1.0, 0.0, 0.5], "reward/errors": [0.0, 1.0, 1.0], "reward/timeouts": [0.0, 0.0, 1.0]}
    )
    assert reduced == {"reward/overall": 0.5, "reward/errors": 2.0, "reward/timeouts": 1.0}

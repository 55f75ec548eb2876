"""Scoring that overlaps the rest of the step (`RewardScorer.score_async`, `worker.reward.overlap`): the scores are
what `score` gives, the deadline runs from the start of each batch's scoring, and a pending scoring can be given up
(a worker died) or stopped by a shutdown without leaving reward actors behind.

The trainer's side (a 2-step run with and without overlap, a slow reward, online filtering) is in
test_trainer_reward_overlap.py."""

import time
from pathlib import Path

import pytest
import torch

from easyrl.config import RewardConfig
from easyrl.workers.reward.scorer import RewardScorer, ScoringCancelled
from tests.test_reward_scorer import rollout_batch


SLEEPY_WORD_START = Path(__file__).resolve().parent / "data" / "sleepy_word_start_reward.py"

SLEEPS_ON_HANG = """
import time

REWARD_TYPE = "batch"

def compute_score(reward_inputs, sleep_s=0.0):
    time.sleep(3600 if any(item["ground_truth"] == "hang" for item in reward_inputs) else sleep_s)
    return [{"overall": float(item["response_length"]), "truth": float(item["ground_truth"])} for item in reward_inputs]
"""


def sleepy_scorer(tokenizer, sleep_s: float, timeout_s: float = 60.0, num_cpus: int = 0) -> RewardScorer:
    config = RewardConfig(
        reward_function=f"{SLEEPY_WORD_START}:compute_score",
        reward_function_kwargs={"sleep_s": sleep_s},
        num_cpus=num_cpus,
        timeout_s=timeout_s,
    )
    return RewardScorer(config, tokenizer)


@pytest.mark.timeout(120)
def test_async_scores_equal_sync_scores_and_the_caller_works_meanwhile(ray_cluster, tokenizer):
    # word_share = words / response tokens: "a b c" is 3 words in 4 tokens (with eos), "hello" 1 in 2
    data = rollout_batch(tokenizer, ["a b c", "hello"], ["x", "y"])
    scorer = sleepy_scorer(tokenizer, sleep_s=1.0)
    try:
        expected_scores, expected_metrics = scorer.score(data)
        assert expected_scores.sum(-1).tolist() == pytest.approx([0.75, 0.5])

        start = time.perf_counter()
        pending = scorer.score_async(data)
        handed_over_s = time.perf_counter() - start
        time.sleep(1.5)  # the caller's own work (the log-prob passes), longer than the scoring
        start = time.perf_counter()
        scores, metrics = pending.result()
        waited_s = time.perf_counter() - start
    finally:
        scorer.shutdown()
    assert torch.equal(scores, expected_scores) and metrics == expected_metrics
    assert handed_over_s < 0.5  # only the decoding: the 1 s call runs behind the caller's back
    assert waited_s < 0.3  # it finished while the caller worked
    assert 1.0 <= pending.seconds < 1.5  # the scoring's own wall time


@pytest.mark.timeout(120)
def test_the_deadline_runs_from_the_start_of_each_batchs_scoring(ray_cluster, tokenizer, reward_file):
    # three batches handed over at once to one actor, each 1 s of scoring under a 1.8 s deadline: the second and third
    # start after the first, so a deadline counted from the hand-over would time them out
    config = RewardConfig(reward_function=reward_file(SLEEPS_ON_HANG), reward_function_kwargs={"sleep_s": 1.0})
    config.num_cpus, config.timeout_s = 0, 1.8
    scorer = RewardScorer(config, tokenizer)
    batches = [rollout_batch(tokenizer, ["a"], [str(i)]) for i in range(3)]
    try:
        pendings = [scorer.score_async(batch) for batch in batches]
        results = [pending.result() for pending in pendings]
        # a batch that hangs still scores 0 at its own deadline, counted, and the next batch is served
        start = time.perf_counter()
        hung = scorer.score_async(rollout_batch(tokenizer, ["a", "b"], ["hang", "5"]))
        after = scorer.score_async(rollout_batch(tokenizer, ["a"], ["7"]))
        _, hung_metrics = hung.result()
        hung_s = time.perf_counter() - start
        _, after_metrics = after.result()
    finally:
        scorer.shutdown()
    assert [metrics["reward/truth"] for _, metrics in results] == [[0.0], [1.0], [2.0]]
    assert all(metrics["reward/timeouts"] == [0.0] for _, metrics in results)
    assert hung_metrics["reward/timeouts"] == hung_metrics["reward/errors"] == [1.0, 1.0]
    assert 1.8 <= hung_s < 4.0
    assert after_metrics["reward/truth"] == [7.0] and after_metrics["reward/errors"] == [0.0]


@pytest.mark.timeout(120)
def test_a_cancelled_scoring_stops_at_once_and_the_next_batch_is_scored(ray_cluster, tokenizer, reward_file):
    config = RewardConfig(reward_function=reward_file(SLEEPS_ON_HANG), num_cpus=0, timeout_s=600)
    scorer = RewardScorer(config, tokenizer)
    try:
        running = scorer.score_async(rollout_batch(tokenizer, ["a"], ["hang"]))
        queued = scorer.score_async(rollout_batch(tokenizer, ["a"], ["1"]))
        time.sleep(0.5)  # the first call is in the actor now
        start = time.perf_counter()
        scorer.cancel_pending()  # what the trainer does when a worker died during the step
        for pending in (running, queued):
            with pytest.raises(ScoringCancelled):
                pending.result()
        cancelled_s = time.perf_counter() - start
        _, metrics = scorer.score(rollout_batch(tokenizer, ["a b"], ["3"]))  # a new actor replaced the hung one
    finally:
        scorer.shutdown()
    assert cancelled_s < 2.0, "a cancelled scoring must not wait for worker.reward.timeout_s"
    assert scorer.pool is None
    assert metrics["reward/truth"] == [3.0] and metrics["reward/errors"] == [0.0]


@pytest.mark.timeout(120)
def test_a_shutdown_during_a_scoring_leaves_no_reward_actor(ray_cluster, tokenizer, reward_file):
    import ray

    total_cpus = ray.available_resources()["CPU"]  # before this test's actor
    config = RewardConfig(reward_function=reward_file(SLEEPS_ON_HANG), num_cpus=2, timeout_s=600)
    scorer = RewardScorer(config, tokenizer)  # one actor holding 2 CPUs
    pending = scorer.score_async(rollout_batch(tokenizer, ["a"], ["hang"]))
    time.sleep(0.5)
    start = time.perf_counter()
    scorer.shutdown()  # as on_shutdown does when a step fails while its rewards are being scored
    shutdown_s = time.perf_counter() - start
    with pytest.raises(ScoringCancelled):
        pending.result()
    assert shutdown_s < 5.0
    deadline = time.monotonic() + 30  # ray.kill returns before the actor's CPUs are given back
    while ray.available_resources().get("CPU", 0) < total_cpus and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == total_cpus, "a reward actor survived the shutdown"

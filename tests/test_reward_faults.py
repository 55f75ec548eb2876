"""Reward functions that misbehave (issue 18): NaN/inf scores are errors of their samples, `worker.reward.timeout_s`
bounds the scoring of a whole batch, and a reward that ends its process is contained. Real RewardScorer, real Ray
reward actors wherever training uses them."""

import logging
import time

import numpy as np
import pytest
import torch

from easyrl.config import RewardConfig
from easyrl.protocol import DataProto
from easyrl.workers.reward.loader import RewardFunctionError, load_reward_function
from easyrl.workers.reward.scorer import ALL_RAISED_STREAK, RewardScorer, reduce_reward_metrics
from tests.test_reward_pool import HANGS_ON_HANG  # the same sequential reward that sleeps on "hang"


SEQUENTIAL_NON_FINITE = """
REWARD_TYPE = "sequential"

def compute_score(item):
    truth = item["ground_truth"]
    if truth == "nan":
        return {"overall": float("nan")}
    if truth == "inf-in-accuracy":  # a named score counts as much as overall
        return {"overall": 1.0, "accuracy": float("-inf")}
    return {"overall": 1.0, "accuracy": 1.0}
"""

BATCH_NON_FINITE = """
import math

def compute_score(reward_inputs):
    return [
        {"overall": math.inf if item["ground_truth"] == "inf" else float(item["response_length"])}
        for item in reward_inputs
    ]
"""


EXITS_ON_EXIT = """
import os
import sys

REWARD_TYPE = "sequential"

def compute_score(item):
    if item["ground_truth"] == "exit":
        os._exit(3)
    if item["ground_truth"] == "sys.exit":
        sys.exit("reward gave up")
    return {"overall": float(item["response_length"])}
"""


def inputs(*truths):
    return [{"response": "r", "response_length": i + 1, "ground_truth": t} for i, t in enumerate(truths)]


def kinds(failures):
    return [failure and failure.kind for failure in failures]


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "easyrl.workers.reward.scorer"]


@pytest.mark.timeout(120)
def test_non_finite_scores_of_a_sequential_function_score_zero_are_counted_and_the_first_is_logged(
    ray_cluster, reward_file, caplog
):
    config = RewardConfig(reward_function=reward_file(SEQUENTIAL_NON_FINITE), num_cpus=1, timeout_s=30)
    scorer = RewardScorer(config, tokenizer=None)
    try:
        with caplog.at_level(logging.WARNING, logger="easyrl.workers.reward.scorer"):
            scores, failures = scorer.score_inputs(inputs("a", "inf-in-accuracy", "b", "nan"))
        assert scores == [{"overall": 1.0, "accuracy": 1.0}, {"overall": 0.0}, scores[0], {"overall": 0.0}]
        assert kinds(failures) == [None, "non-finite", None, "non-finite"]
        assert [failures[1].detail, failures[3].detail] == ["accuracy=-inf", "overall=nan"]
        (logged,) = warnings_of(caplog)
        assert (
            "non-finite score for sample 1 (ground truth 'inf-in-accuracy'): accuracy=-inf" in logged
            and "2 of 4 samples" in logged
        )
        assert "reward/errors" in logged
    finally:
        scorer.shutdown()


@pytest.mark.timeout(120)
def test_a_non_finite_score_of_a_batch_function_zeroes_only_its_sample(ray_cluster, reward_file, caplog):
    # num_cpus 0: one reward actor that reserves no CPU (EasyR1's meaning), not the driver process
    config = RewardConfig(reward_function=reward_file(BATCH_NON_FINITE), num_cpus=0, timeout_s=30)
    scorer = RewardScorer(config, tokenizer=None)
    try:
        assert (scorer.pool.num_actors, scorer.pool.actor_num_cpus) == (1, 0)
        with caplog.at_level(logging.WARNING, logger="easyrl.workers.reward.scorer"):
            scores, failures = scorer.score_inputs(inputs("a", "b", "inf"))
        assert [s["overall"] for s in scores] == [1.0, 2.0, 0.0]
        assert kinds(failures) == [None, None, "non-finite"]
        (logged,) = warnings_of(caplog)
        assert "non-finite score for sample 2 (ground truth 'inf'): overall=inf" in logged
    finally:
        scorer.shutdown()


def test_non_finite_rewards_never_reach_the_token_level_scores(tokenizer, reward_file):
    config = RewardConfig(reward_function=reward_file(SEQUENTIAL_NON_FINITE))
    scorer = RewardScorer(config, tokenizer, in_process=True)  # the same score_calls the reward actors run
    ids = tokenizer.encode("ok", add_special_tokens=False)[:1]
    data = DataProto.from_dict(
        tensors={
            "responses": torch.tensor([ids + ids, ids + [tokenizer.pad_token_id]]),  # (2, 2), right-padded
            "response_mask": torch.tensor([[1, 1], [1, 0]]),
        },
        non_tensors={"ground_truth": np.array(["nan", "a"], dtype=object)},
    )
    token_level_scores, metrics = scorer.score(data)
    assert token_level_scores.tolist() == [[0.0, 0.0], [1.0, 0.0]]  # overall on each last response token
    assert reduce_reward_metrics(metrics) == {
        "reward/overall": 0.5,
        "reward/accuracy": 0.5,
        "reward/errors": 1.0,
        "reward/timeouts": 0.0,
    }


@pytest.mark.timeout(120)
def test_a_hang_in_one_chunk_of_four_costs_one_timeout_and_the_healthy_chunks_keep_their_scores(
    ray_cluster, reward_file, caplog
):
    timeout_s = 3.0
    config = RewardConfig(reward_function=reward_file(HANGS_ON_HANG), num_cpus=4, timeout_s=timeout_s)
    scorer = RewardScorer(config, tokenizer=None, chunks_per_actor=1)  # 8 samples -> 4 chunks of 2, one per actor
    try:
        with caplog.at_level(logging.WARNING, logger="easyrl.workers.reward.scorer"):
            start = time.monotonic()
            scores, failures = scorer.score_inputs(inputs("a", "b", "c", "hang", "d", "e", "f", "g"))
            elapsed = time.monotonic() - start
        assert timeout_s <= elapsed < 2 * timeout_s
        # sample 2 was scored before the call on sample 3 hung: its score came back with it
        assert [s["overall"] for s in scores] == [1.0, 2.0, 3.0, 0.0, 5.0, 6.0, 7.0, 8.0]
        assert kinds(failures) == [None, None, None, "timed out", None, None, None, None]
        assert scorer.pool.num_replaced == 1
        (logged,) = warnings_of(caplog)
        assert (
            "worker.reward.timeout_s=3 s (first unscored sample: 3 (ground truth 'hang'))" in logged
            and "reward/timeouts" in logged
        )
        scores, failures = scorer.score_inputs(inputs("h", "i", "j", "k"))  # the replacement takes its share
        assert [s["overall"] for s in scores] == [1.0, 2.0, 3.0, 4.0] and failures == [None] * 4
    finally:
        scorer.shutdown()


@pytest.mark.timeout(300)
def test_every_chunk_hanging_costs_one_timeout_not_one_per_chunk(ray_cluster, reward_file):
    # before: the 4 chunks of one actor ran one after another, each with the full timeout (4 x timeout_s a step)
    timeout_s = 3.0
    config = RewardConfig(reward_function=reward_file(HANGS_ON_HANG), num_cpus=1, timeout_s=timeout_s)
    scorer = RewardScorer(config, tokenizer=None, chunks_per_actor=4)
    try:
        start = time.monotonic()
        scores, failures = scorer.score_inputs(inputs("hang", "hang", "hang", "hang"))
        assert timeout_s <= time.monotonic() - start < 2 * timeout_s
        assert scores == [{"overall": 0.0}] * 4 and kinds(failures) == ["timed out"] * 4
        # a batch that times out throughout may pass; ALL_RAISED_STREAK of them in a row trained on zeros for good
        for _ in range(ALL_RAISED_STREAK - 2):
            assert kinds(scorer.score_inputs(inputs("hang", "hang"))[1]) == ["timed out"] * 2
        with pytest.raises(RewardFunctionError) as stopped:
            scorer.score_inputs(inputs("hang", "hang"))
    finally:
        scorer.shutdown()
    message = str(stopped.value)
    assert "scored no sample (2 timed out) of the run so far (2 of 2 in the last batch), so the run stops" in message
    assert "worker.reward.timeout_s=3 s: raise it" in message


def test_a_function_giving_nan_for_every_sample_stops_the_run_at_once(reward_file, caplog):
    scorer = RewardScorer(
        RewardConfig(reward_function=reward_file(SEQUENTIAL_NON_FINITE)), tokenizer=None, in_process=True
    )
    assert kinds(scorer.score_inputs(inputs("a", "nan"))[1]) == [None, "non-finite"]  # one sample: scored
    for _ in range(ALL_RAISED_STREAK - 1):
        assert kinds(scorer.score_inputs(inputs("nan", "nan"))[1]) == ["non-finite"] * 2
    with pytest.raises(
        RewardFunctionError, match=rf"scored no sample \(2 non-finite\) of {ALL_RAISED_STREAK} batches in a row"
    ):
        scorer.score_inputs(inputs("nan", "nan"))
    fresh = RewardScorer(
        RewardConfig(reward_function=reward_file(SEQUENTIAL_NON_FINITE)), tokenizer=None, in_process=True
    )
    with pytest.raises(RewardFunctionError, match=r"scored no sample \(3 non-finite\) of the run so far"):
        fresh.score_inputs(inputs("nan", "nan", "nan"), places=["data.train_files t.jsonl row 7"] * 3)
    # the warning that names the first failure's row came before the stop (it was never said)
    assert "sample 0 (data.train_files t.jsonl row 7" in caplog.text


@pytest.mark.timeout(120)
def test_a_reward_that_calls_os_exit_is_contained_named_and_its_actor_replaced(ray_cluster, reward_file, caplog):
    config = RewardConfig(reward_function=reward_file(EXITS_ON_EXIT), num_cpus=1, timeout_s=60)
    scorer = RewardScorer(config, tokenizer=None, chunks_per_actor=4)  # 3 inputs -> 3 chunks of one
    try:
        with caplog.at_level(logging.WARNING, logger="easyrl.workers.reward.scorer"):
            scores, failures = scorer.score_inputs(inputs("a", "exit", "b"))
        # the chunk after the dead actor's waits for its replacement and is scored
        assert [s["overall"] for s in scores] == [1.0, 0.0, 3.0]
        assert kinds(failures) == [None, "died", None]
        assert scorer.pool.num_replaced == 1
        (logged,) = warnings_of(caplog)
        assert (
            "process died while scoring" in logged
            and "os._exit" in logged
            and "From sample 1 (ground truth 'exit') on" in logged
        )
    finally:
        scorer.shutdown()


def test_sys_exit_in_a_reward_is_a_raised_error_of_its_sample(reward_file):
    config = RewardConfig(reward_function=reward_file(EXITS_ON_EXIT))
    scorer = RewardScorer(config, tokenizer=None, in_process=True)
    scores, failures = scorer.score_inputs(inputs("a", "sys.exit"))
    assert scores == [{"overall": 1.0}, {"overall": 0.0}]
    assert kinds(failures) == [None, "raised"] and "SystemExit: reward gave up" in failures[1].detail


def test_a_score_named_like_easyrls_own_counts_is_refused(reward_file):
    fn = load_reward_function(reward_file("def compute_score(items):\n    return [{'overall': 1.0, 'errors': 0}]\n"))
    with pytest.raises(RewardFunctionError, match=r"score named `errors`.*reward/errors.*rename"):
        fn.score([{"response": "r", "response_length": 1, "ground_truth": "1"}])


STRIPS_THE_TRUTH = """
def compute_score(reward_inputs):
    return [{"overall": float(item["response"] == item["ground_truth"].strip())} for item in reward_inputs]
"""

STRIPS_EACH_TRUTH = """
REWARD_TYPE = "sequential"

def compute_score(item):
    return {"overall": float(item["response"] == item["ground_truth"].strip())}
"""


def test_a_function_raising_on_every_sample_of_the_first_batch_stops_the_run_naming_the_answer_type(reward_file):
    # a GSM8K-style parquet whose answer column holds ints, scored by a function that reads them as text
    scorer = RewardScorer(RewardConfig(reward_function=reward_file(STRIPS_THE_TRUTH)), tokenizer=None, in_process=True)
    batch = [{"response": "72", "response_length": 1, "ground_truth": 72} for _ in range(4)]
    with pytest.raises(RewardFunctionError) as error:
        scorer.score_inputs(batch)
    message = str(error.value)
    assert "raised on every sample of the run so far (4 of 4 in the last batch), so the run stops" in message
    assert "include values of type int, not str" in message and "AttributeError" in message
    assert "It is a batch function, scoring a batch in one call" in message


ONE_INPUT_WITHOUT_REWARD_TYPE = """
def compute_score(reward_input):
    return {"overall": float(reward_input["response"] == reward_input["ground_truth"])}
"""


def test_a_one_input_function_in_a_file_without_reward_type_is_told_to_set_sequential(reward_file):
    """Called with the whole batch (EasyR1's default), it fails on every sample (a list indexed by a text) or returns
    one dict; the error said it was a batch function, not why nor that REWARD_TYPE = "sequential" fixes it."""
    scorer = RewardScorer(
        RewardConfig(reward_function=reward_file(ONE_INPUT_WITHOUT_REWARD_TYPE)), tokenizer=None, in_process=True
    )
    batch = [{"response": "7", "response_length": 1, "ground_truth": "7"} for _ in range(3)]
    with pytest.raises(RewardFunctionError) as error:
        scorer.score_inputs(batch)
    assert "TypeError" in str(error.value) and 'needs `REWARD_TYPE = "sequential"` in the file' in str(error.value)
    one_dict = "def compute_score(reward_inputs):\n    return {'overall': 1.0}\n"
    with pytest.raises(RewardFunctionError, match=r"returned a dict of length 1\. The file sets no REWARD_TYPE"):
        load_reward_function(reward_file(one_dict)).score(batch)
    declared = load_reward_function(reward_file("REWARD_TYPE = 'batch'\n" + one_dict))
    with pytest.raises(RewardFunctionError, match=r"returned a dict of length 1\.$"):
        declared.score(batch)


RAISES_ON_ONE_ROW = """
def compute_score(reward_inputs):
    for item in reward_inputs:
        if item["ground_truth"] == 3:
            raise ValueError("bad row")
    return [{"overall": 1.0} for _ in reward_inputs]
"""


def test_a_batch_function_raising_on_one_row_says_so_without_blaming_the_answer_type(reward_file):
    scorer = RewardScorer(
        RewardConfig(reward_function=reward_file(RAISES_ON_ONE_ROW)), tokenizer=None, in_process=True
    )
    batch = [{"response": "r", "response_length": 1, "ground_truth": truth} for truth in (1, 2, 3)]
    with pytest.raises(RewardFunctionError) as error:
        scorer.score_inputs(batch)
    message = str(error.value)
    assert "an exception on one of its rows fails every sample of the batch" in message and "bad row" in message
    assert "include values of type int" not in message  # a ValueError of the function's own, not a number read as text


def test_after_a_batch_was_scored_only_a_streak_of_batches_raising_throughout_stops_the_run(reward_file):
    scorer = RewardScorer(
        RewardConfig(reward_function=reward_file(STRIPS_EACH_TRUTH)), tokenizer=None, in_process=True
    )
    text = [{"response": "72", "response_length": 1, "ground_truth": "72"}]
    numbers = [{"response": "72", "response_length": 1, "ground_truth": 72}] * 2
    assert scorer.score_inputs(text)[0] == [{"overall": 1.0}]
    for _ in range(ALL_RAISED_STREAK - 1):  # a passing fault: scored 0 and counted, the run goes on
        scores, failures = scorer.score_inputs(numbers)
        assert scores == [{"overall": 0.0}] * 2 and all(f.kind == "raised" for f in failures)
    scorer.score_inputs(text + numbers)  # one sample scored: the streak starts again
    for _ in range(ALL_RAISED_STREAK - 1):
        scorer.score_inputs(numbers)
    with pytest.raises(RewardFunctionError, match=rf"every sample of {ALL_RAISED_STREAK} batches in a row"):
        scorer.score_inputs(numbers)

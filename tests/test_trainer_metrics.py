"""Step metrics of a hand-built batch, against values worked out by hand."""

import time

import numpy as np
import pytest
import torch

from easyrl.protocol import DataProto
from easyrl.trainer.metrics import (
    append_metrics,
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    prompt_groups,
    reduce_metrics,
    timer,
)


@pytest.fixture
def batch() -> DataProto:
    """Two sequences, prompt width 4 (left-padded), response width 3 (right-padded).

    Row 0: prompt 3 tokens, response 3 tokens (hits the maximum); row 1: prompt 4 tokens (the maximum), response 1.
    """
    prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    response_mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    tensors = {
        "prompts": torch.ones(2, 4, dtype=torch.long),
        "responses": torch.ones(2, 3, dtype=torch.long),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
        "response_mask": response_mask,
        "token_level_scores": torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]]),
        "token_level_rewards": torch.tensor([[-0.1, -0.1, 0.9], [0.4, 0.0, 0.0]]),
        # entries under response_mask == 0 are junk that must not count
        "advantages": torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]]),
        "returns": torch.tensor([[1.0, 1.0, 1.0], [3.0, 9.0, 9.0]]),
        "values": torch.tensor([[1.0, 1.0, 1.0], [2.0, -9.0, -9.0]]),
    }
    return DataProto.from_dict(tensors=tensors)


def test_response_and_prompt_lengths_and_clip_ratios(batch):
    metrics = compute_data_metrics(batch)
    assert metrics["response_length/mean"] == 2.0
    assert metrics["response_length/max"] == 3.0
    assert metrics["response_length/min"] == 1.0
    assert metrics["response_length/clip_ratio"] == 0.5
    assert metrics["prompt_length/mean"] == 3.5
    assert metrics["prompt_length/max"] == 4.0
    assert metrics["prompt_length/min"] == 3.0
    assert metrics["prompt_length/clip_ratio"] == 0.5


def test_configured_maximum_lengths_set_the_clip_ratio(batch):
    metrics = compute_data_metrics(batch, max_prompt_length=8, max_response_length=2)
    assert metrics["response_length/clip_ratio"] == 0.5  # only row 0 (3 tokens) reaches 2
    assert metrics["prompt_length/clip_ratio"] == 0.0


def test_a_multi_turn_trajectory_cut_at_the_limit_counts_as_cut_though_tool_tokens_are_not_the_models():
    """The model's tokens (response_mask) of a trajectory that filled the limit with a tool result between them are
    fewer than the limit: response_length counts them, the clip ratio the whole span."""
    response_mask = torch.tensor([[1, 0, 0, 1], [1, 1, 0, 0]])  # row 0: model, tool result x2, model; row 1: ended
    span = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    tensors = {
        "prompts": torch.ones(2, 2, dtype=torch.long),
        "responses": torch.ones(2, 4, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(2, 2, dtype=torch.long), span], dim=-1),
        "response_mask": response_mask,
    }
    metrics = compute_data_metrics(DataProto.from_dict(tensors=tensors))
    assert metrics["response_length/mean"] == 2.0 and metrics["response_length/max"] == 2.0
    assert metrics["response_length/clip_ratio"] == 0.5  # row 0 filled the 4 tokens


def test_sequence_scores_and_rewards_are_sums_over_the_response(batch):
    metrics = compute_data_metrics(batch)
    assert metrics["critic/score/mean"] == pytest.approx(0.75)
    assert (metrics["critic/score/max"], metrics["critic/score/min"]) == (1.0, 0.5)
    assert metrics["critic/rewards/mean"] == pytest.approx(0.55)
    assert metrics["critic/rewards/max"] == pytest.approx(0.7)
    assert metrics["critic/rewards/min"] == pytest.approx(0.4)


def test_advantages_returns_and_values_count_only_response_tokens(batch):
    metrics = compute_data_metrics(batch)
    assert (metrics["critic/advantages/mean"], metrics["critic/advantages/max"]) == (2.5, 4.0)
    assert metrics["critic/advantages/min"] == 1.0
    assert metrics["critic/returns/mean"] == 1.5
    assert metrics["critic/values/mean"] == 1.25
    # returns - values over response tokens = [0, 0, 0, 1]: variance 0.25; returns [1, 1, 1, 3]: variance 1
    assert metrics["critic/vf_explained_var"] == pytest.approx(0.75, abs=1e-4)


def test_without_a_critic_there_are_no_value_metrics(batch):
    metrics = compute_data_metrics(batch, use_critic=False)
    assert not any(key.startswith(("critic/values", "critic/vf_")) for key in metrics)
    assert "critic/advantages/mean" in metrics


def test_timing_metrics_per_phase_and_per_token(batch):
    # 4 response tokens; 7 prompt + 4 response = 11 tokens in all
    metrics = compute_timing_metrics(batch, {"gen": 0.6, "update_actor": 0.88, "step": 2.2})
    assert metrics["timing/gen"] == 0.6 and metrics["timing/step"] == 2.2
    assert metrics["timing_per_token_ms/gen"] == pytest.approx(150.0)
    assert metrics["timing_per_token_ms/update_actor"] == pytest.approx(80.0)
    assert metrics["timing_per_token_ms/step"] == pytest.approx(200.0)


def test_timing_metrics_without_a_batch_are_seconds_only():
    assert compute_timing_metrics(None, {"gen": 1.5}) == {"timing/gen": 1.5}


def test_throughput_is_tokens_per_second_per_device(batch):
    metrics = compute_throughput_metrics(batch, {"step": 2.0}, n_devices=2)
    assert metrics == {"perf/total_num_tokens": 11, "perf/time_per_step": 2.0, "perf/throughput": 2.75}


def test_throughput_needs_the_step_time(batch):
    with pytest.raises(KeyError, match="timer\\('step'"):
        compute_throughput_metrics(batch, {"gen": 1.0}, n_devices=1)


def test_timer_adds_up_repeated_phases():
    timing: dict[str, float] = {}
    for _ in range(2):
        with timer("gen", timing):
            time.sleep(0.02)
    assert 0.04 <= timing["gen"] < 1.0


def test_reduce_metrics_takes_means_and_drops_empty_metrics():
    collected: dict[str, list] = {}
    append_metrics(collected, {"actor/pg_loss": 1.0, "actor/entropy": [2.0, 4.0]})
    append_metrics(collected, {"actor/pg_loss": torch.tensor(3.0), "actor/entropy": []})
    collected["actor/kl_loss"] = []
    assert reduce_metrics(collected) == {"actor/pg_loss": 2.0, "actor/entropy": 3.0}


def test_prompt_groups_are_the_samples_of_each_uid_with_their_lengths():
    # three samples, the first and third of one prompt (3 tokens), the second of another (2 tokens); left-padded
    # prompts of width 3, right-padded responses of width 3
    prompt_mask = torch.tensor([[1, 1, 1], [0, 1, 1], [1, 1, 1]])
    response_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    batch = DataProto.from_dict(
        tensors={
            "responses": torch.ones(3, 3, dtype=torch.long),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
            "response_mask": response_mask,
        },
        non_tensors={"uid": np.array(["a", "b", "a"], dtype=object)},
    )
    assert prompt_groups(batch) == [(3, [2, 1]), (2, [3])]

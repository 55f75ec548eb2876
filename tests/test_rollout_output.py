"""The rollout output contract, sampling settings and rollout metrics, checked on hand-made token lists."""

import numpy as np
import pytest
import torch

from easyrl.config import RolloutConfig
from easyrl.workers.rollout.base import (
    GenerationRequest,
    build_rollout_output,
    continue_position_ids,
    generation_metrics,
    repeat_greedy,
    resolve_sampling,
    rollout_logprob_mismatch,
)


PAD = 0


def _prompts(position_rows: int | None = None):
    """Two left-padded prompts of lengths 2 and 3 (prompt_len 3)."""
    from easyrl.protocol import DataProto

    input_ids = torch.tensor([[PAD, 11, 12], [21, 22, 23]])
    attention_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    if position_rows is not None:  # (batch, rows, prompt_len), rows offset so that they are told apart
        position_ids = torch.stack([position_ids + 10 * r for r in range(position_rows)], dim=1)
    raw = np.empty(2, dtype=object)
    raw[:] = [[11, 12], [21, 22, 23]]
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors={"raw_prompt_ids": raw, "uid": np.array(["a", "b"], dtype=object)},
    )


def _output(position_rows: int | None = None):
    # prompt 0: samples of length 1 and 4 (clipped at 4); prompt 1: lengths 2 and 3
    responses = [[5], [6, 7, 8, 9], [7, 2], [8, 8, 2]]
    log_probs = [[-0.5], [-0.1, -0.2, -0.3, -0.4], [-1.0, -2.0], [-0.7, -0.8, -0.9]]
    return build_rollout_output(
        _prompts(position_rows), responses, log_probs, n=2, response_length=4, pad_token_id=PAD
    )


def test_responses_are_right_padded_with_the_pad_id_and_masked():
    out = _output()
    assert out.batch["responses"].tolist() == [[5, 0, 0, 0], [6, 7, 8, 9], [7, 2, 0, 0], [8, 8, 2, 0]]
    assert out.batch["response_mask"].tolist() == [[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]


def test_prompts_repeat_n_times_next_to_each_other():
    out = _output()
    assert out.batch["prompts"].tolist() == [[PAD, 11, 12], [PAD, 11, 12], [21, 22, 23], [21, 22, 23]]
    assert out.non_tensor_batch["uid"].tolist() == ["a", "a", "b", "b"]
    assert out.non_tensor_batch["raw_prompt_ids"][1] == [11, 12]


def test_input_ids_and_attention_mask_are_prompt_then_response():
    out = _output()
    assert out.batch["input_ids"][0].tolist() == [PAD, 11, 12, 5, 0, 0, 0]
    assert out.batch["attention_mask"][0].tolist() == [0, 1, 1, 1, 0, 0, 0]
    assert out.batch["attention_mask"][3].tolist() == [1, 1, 1, 1, 1, 1, 0]


def test_position_ids_continue_the_prompt_positions():
    out = _output()
    assert out.batch["position_ids"][0].tolist() == [0, 0, 1, 2, 3, 4, 5]
    assert out.batch["position_ids"][2].tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_multimodal_rope_positions_continue_every_row():
    out = _output(position_rows=3)
    assert out.batch["position_ids"].shape == (4, 3, 7)
    assert out.batch["position_ids"][2, 1].tolist() == [10, 11, 12, 13, 14, 15, 16]
    assert continue_position_ids(torch.tensor([[[0, 5], [0, 9]]]), 2).tolist() == [[[6, 7], [10, 11]]]


def test_rollout_log_probs_are_zero_on_padding():
    out = _output()
    assert out.batch["rollout_log_probs"][0].tolist() == [-0.5, 0.0, 0.0, 0.0]
    assert out.batch["rollout_log_probs"][3].tolist() == pytest.approx([-0.7, -0.8, -0.9, 0.0])


def test_generation_metrics_count_tokens_lengths_and_clipped_responses():
    metrics = generation_metrics(_output().batch["response_mask"], seconds=2.0)
    assert metrics["rollout/gen_tokens_per_s"] == pytest.approx(10 / 2.0)
    assert metrics["rollout/response_length/mean"] == pytest.approx(2.5)
    assert metrics["rollout/response_length/max"] == 4
    assert metrics["rollout/response_length/clip_ratio"] == pytest.approx(0.25)


def test_a_trajectory_filled_by_tool_results_counts_as_cut_though_its_model_tokens_are_fewer():
    model = torch.tensor([[1, 0, 0, 1], [1, 1, 0, 0]])  # row 0: model, a 2-token tool result, model
    attended = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    metrics = generation_metrics(model, seconds=1.0, attended=attended)
    assert metrics["rollout/gen_tokens"] == 4 and metrics["rollout/response_length/max"] == 2  # the model's tokens
    assert metrics["rollout/response_length/clip_ratio"] == 0.5  # row 0 filled the limit
    assert generation_metrics(model, seconds=1.0)["rollout/response_length/clip_ratio"] == 0.0  # the mask alone


def test_the_generate_calls_of_a_step_report_their_totals_not_the_mean_of_their_rates():
    """Refill rounds (online filtering, mini_rollout_batch_size) and a ReMax baseline make several calls a step."""
    from easyrl.utils.engine_metrics import reduce_call_metrics

    fast = generation_metrics(torch.tensor([[1, 1, 0, 0]] * 4), seconds=1.0)  # 8 tokens, 4 responses of 2
    slow = generation_metrics(torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1]]), seconds=15.0)  # 8 tokens, 2 of 4 (cut)
    step = reduce_call_metrics([fast, slow])
    assert step["rollout/gen_tokens"] == 16 and step["rollout/gen_seconds"] == 16.0
    assert step["rollout/gen_tokens_per_s"] == pytest.approx(16 / 16.0)  # not (8 + 8 / 15) / 2
    assert step["rollout/response_length/mean"] == pytest.approx(16 / 6)  # per response, not per call
    assert step["rollout/response_length/max"] == 4
    assert step["rollout/response_length/clip_ratio"] == pytest.approx(2 / 6)
    syncs = [
        {"rollout/weight_sync_gb": 1.0, "rollout/weight_sync_s": 1.0, "rollout/weight_sync_gb_per_s": 1.0},
        {"rollout/weight_sync_gb": 1.0, "rollout/weight_sync_s": 3.0, "rollout/weight_sync_gb_per_s": 1 / 3},
    ]
    assert reduce_call_metrics(syncs)["rollout/weight_sync_gb_per_s"] == pytest.approx(2 / 4)


def test_logprob_mismatch_is_measured_on_response_tokens_only():
    old = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]])
    rollout = torch.tensor([[-1.5, -2.0, 0.0], [-0.5, -0.25, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    metrics = rollout_logprob_mismatch(old, rollout, mask)
    assert metrics["rollout/logprob_abs_diff/mean"] == pytest.approx((0.5 + 0 + 0 + 0.25) / 4)
    assert metrics["rollout/logprob_abs_diff/max"] == pytest.approx(0.5)


def _config(**overrides) -> RolloutConfig:
    config = RolloutConfig(n=4, temperature=0.9, top_p=0.95, response_length=16, prompt_length=8)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def test_sampling_settings_come_from_the_rollout_config():
    settings = resolve_sampling(_config())
    assert (settings.n, settings.temperature, settings.top_p, settings.max_tokens) == (4, 0.9, 0.95, 16)


def test_validation_applies_val_override_config():
    settings = resolve_sampling(
        _config(val_override_config={"temperature": 0.0, "n": 1}), GenerationRequest(validate=True)
    )
    assert (settings.n, settings.temperature, settings.greedy) == (1, 0.0, True)


def test_validation_may_set_vllms_penalties_and_both_engines_receive_what_they_take():
    """EasyR1 passes any of vLLM's sampling settings in val_override_config (repetition_penalty, min_p, ...); they
    were refused. Training takes none of them (the actor's log-probs assume plain temperature sampling)."""
    import types

    import numpy as np
    import torch.distributed  # noqa: F401  (hf_rollout reads the process group)

    from easyrl.config import validate as check
    from easyrl.workers.rollout import base
    from easyrl.workers.rollout.hf_rollout import _generate_kwargs
    from easyrl.workers.rollout.vllm_rollout import VLLMRollout

    assert check.VAL_ENGINE_KEYS == base.VAL_ENGINE_KEYS  # check's torch-free copy
    config = _config(val_override_config={"temperature": 0.5, "repetition_penalty": 1.1, "min_p": 0.05})
    settings = resolve_sampling(config, GenerationRequest(validate=True))
    assert settings.temperature == 0.5 and settings.engine == (("min_p", 0.05), ("repetition_penalty", 1.1))
    assert resolve_sampling(config).engine == ()  # training: none
    engine = types.SimpleNamespace(stop_token_ids=[2], dp_rank=0, _request_seeds=np.random.default_rng(0))
    params = VLLMRollout._sampling_params(engine, settings, 2, seed=[7])  # vLLM's own SamplingParams takes them
    assert [(p.repetition_penalty, p.min_p, p.temperature) for p in params] == [(1.1, 0.05, 0.5)] * 2
    hf = resolve_sampling(_config(val_override_config={"repetition_penalty": 1.2}), GenerationRequest(validate=True))
    assert _generate_kwargs(hf, 2, 0)["repetition_penalty"] == 1.2
    with pytest.raises(ValueError, match="unknown sampling key"):
        resolve_sampling(_config(), GenerationRequest(sampling_override={"min_p": 0.1}))  # not for training calls


def test_greedy_with_n_samples_asks_the_engine_once_and_copies():
    settings = resolve_sampling(_config(), GenerationRequest(sampling_override={"temperature": 0.0}))
    assert settings.engine_n == 1
    assert repeat_greedy([[1], [2]], settings) == [[1]] * 4 + [[2]] * 4


def test_unknown_override_key_names_the_config_key():
    with pytest.raises(ValueError, match="worker.rollout.val_override_config"):
        resolve_sampling(_config(val_override_config={"temprature": 0.0}), GenerationRequest(validate=True))


def test_unset_response_length_is_reported():
    with pytest.raises(ValueError, match="data.max_response_length"):
        resolve_sampling(_config(response_length=-1))

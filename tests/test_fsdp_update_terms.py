"""The actor update's loss terms and gradient accumulation, on a plain model in one process."""

import pytest
import torch

from easyrl.algorithms.masked import masked_mean
from easyrl.config import ActorConfig
from easyrl.workers.actor import Actor
from tests.fsdp_helpers import add_policy_targets, load_hf_causal_lm, make_batch


def _actor_config(**overrides) -> ActorConfig:
    config = ActorConfig(
        loss_type="ppo",
        loss_avg_mode="token-mean",
        padding_free=True,
        dynamic_batching=False,
        micro_batch_size_per_device_for_update=2,
        micro_batch_size_per_device_for_experience=6,
        max_grad_norm=1e6,
        use_torch_compile=False,
        response_length=16,  # data.max_response_length, which load_config copies here
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _update(model_path, config: ActorConfig, data, lr: float = 0.1):
    model = load_hf_causal_lm(model_path)
    actor = Actor(config, model, torch.optim.SGD(model.parameters(), lr=lr), mini_batch_size=len(data))
    metrics = actor.update_policy(data)
    return model, metrics


def _batch_with_targets(model_path, seed: int):
    data = make_batch(batch_size=6, seed=seed)
    log_probs, _ = Actor(_actor_config(), load_hf_causal_lm(model_path)).compute_log_probs(data)
    return add_policy_targets(data, log_probs, seed=seed)


@pytest.mark.parametrize(
    "loss_avg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_micro_batch_size_does_not_change_the_update(tiny_model_path, loss_avg_mode):
    data = _batch_with_targets(tiny_model_path, seed=12)
    one_pass, _ = _update(
        tiny_model_path, _actor_config(loss_avg_mode=loss_avg_mode, micro_batch_size_per_device_for_update=6), data
    )
    accumulated, _ = _update(
        tiny_model_path, _actor_config(loss_avg_mode=loss_avg_mode, micro_batch_size_per_device_for_update=1), data
    )
    for (name, a), b in zip(one_pass.named_parameters(), accumulated.parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0, msg=name)


def test_dr_grpo_norm_is_the_token_sum_divided_by_the_configured_response_length(tiny_model_path):
    """seq-mean-token-sum-norm: seq-mean-token-sum divided by the constant data.max_response_length, not by the
    padded width of a micro-batch: plain SGD with a learning rate T times larger takes the same step."""
    data = _batch_with_targets(tiny_model_path, seed=15)
    assert data.batch["responses"].shape[-1] != 16  # the batch's width is not T
    summed, _ = _update(tiny_model_path, _actor_config(loss_avg_mode="seq-mean-token-sum"), data, lr=0.01)
    normed, _ = _update(
        tiny_model_path, _actor_config(loss_avg_mode="seq-mean-token-sum-norm", response_length=16), data, lr=0.16
    )
    untouched = load_hf_causal_lm(tiny_model_path)
    for (name, a), b in zip(summed.named_parameters(), normed.parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(summed.parameters(), untouched.parameters()))


def test_kl_loss_is_zero_at_the_reference_and_reported(tiny_model_path):
    data = _batch_with_targets(tiny_model_path, seed=13)
    data.batch["ref_log_probs"] = data.batch["old_log_probs"].clone()
    config = _actor_config(use_kl_loss=True, kl_penalty="low_var_kl", kl_coef=0.1)
    _, metrics = _update(tiny_model_path, config, data, lr=0.0)
    assert metrics["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/kl_coef"] == pytest.approx(0.1)


def test_entropy_bonus_reports_the_mean_response_entropy(tiny_model_path):
    data = _batch_with_targets(tiny_model_path, seed=14)
    _, entropy = Actor(_actor_config(), load_hf_causal_lm(tiny_model_path)).compute_log_probs(
        data, calculate_entropy=True
    )
    _, metrics = _update(tiny_model_path, _actor_config(entropy_coef=0.01), data, lr=0.0)
    expected = masked_mean(entropy, data.batch["response_mask"]).item()
    assert metrics["actor/entropy"] == pytest.approx(expected, rel=1e-4)

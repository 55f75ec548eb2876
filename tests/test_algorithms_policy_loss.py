"""Policy losses on small hand-worked examples: values, gradients and clip metrics."""

import math

import pytest
import torch

from easyrl.algorithms.policy_loss import compute_policy_loss, get_policy_loss, list_policy_losses
from easyrl.config import ActorConfig


def actor_config(**overrides) -> ActorConfig:
    values = {
        "loss_type": "ppo",
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.3,
        "clip_ratio_dual": 3.0,
        "loss_avg_mode": "token-mean",
    }
    values.update(overrides)
    return ActorConfig(**values)


def log_of(*ratios):
    """log-probs whose ratio to an old log-prob of 0 is `ratios`; a leaf so gradients can be read."""
    return torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)


def test_every_issue_loss_is_registered():
    assert {"ppo", "gspo", "gspo_token", "cispo", "sapo"} <= set(list_policy_losses())


def test_ppo_clips_high_low_and_dual():
    # eps_low 0.2, eps_high 0.3, C = 3; old log-probs 0 so r = exp(log_probs)
    # t0: r 1.5, A +1: -min(1.5, 1.3) = -1.3     (upper clip: no gradient)
    # t1: r 0.5, A -1: -min(-0.5, -0.8) = 0.8    (lower clip: no gradient)
    # t2: r 1.1, A +1: -1.1                      (inside: d/dlogp = -A r = -1.1)
    # t3: r 5.0, A -1: max(5.0, 1.3) = 5.0 > C|A| = 3 -> 3.0  (dual clip: no gradient)
    # token-mean = (-1.3 + 0.8 - 1.1 + 3.0) / 4 = 0.35; grad = [0, 0, -1.1/4, 0]
    log_probs = log_of(1.5, 0.5, 1.1, 5.0)
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, metrics = compute_policy_loss(old, log_probs, adv, torch.ones(1, 4), actor_config(loss_type="ppo"))
    assert loss.item() == pytest.approx(0.35, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[0.0, 0.0, -0.275, 0.0]]))
    assert metrics["pg_clipfrac_higher"] == pytest.approx(0.25)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(0.25)
    assert metrics["pg_clipfrac_dual"] == pytest.approx(0.25)
    # ppo_kl = mean(old - new) = -(ln 1.5 + ln 0.5 + ln 1.1 + ln 5) / 4 = -0.35427
    assert metrics["ppo_kl"] == pytest.approx(-0.354267, abs=1e-5)


def test_ppo_ignores_padding_tokens():
    # the padded token (mask 0) has a wild ratio; the loss is that of the single valid token: -A r = -1.1
    log_probs = log_of(1.1, 50.0)
    loss, metrics = compute_policy_loss(
        torch.zeros(1, 2), log_probs, torch.ones(1, 2), torch.tensor([[1.0, 0.0]]), actor_config(loss_type="ppo")
    )
    assert loss.item() == pytest.approx(-1.1, abs=1e-6)
    assert metrics["pg_clipfrac_higher"] == 0.0


def test_gspo_uses_the_length_normalised_sequence_ratio():
    # row 1: log r = [ln 1.1, ln 1.5] -> s = sqrt(1.1 * 1.5) = 1.28452 < 1.3 (inside), A = 1 -> -1.28452 per token
    # row 2: log r = [ln 2, ln 2] -> s = 2 -> clipped to 1.3 -> -1.3 per token
    # token-mean = (2 * -1.28452 + 2 * -1.3) / 4 = -1.29226
    # row 1 adds 2 * (-A s) / 4 = -s / 2 to the loss and ds/dlogp_t = s / |y| = s / 2, so d/dlogp_t = -s / 4 = -0.32113
    # (the same gradient GSPO-token gives when A is shared by the sequence); row 2 is clipped: 0
    log_probs = torch.tensor([[math.log(1.1), math.log(1.5)], [math.log(2.0)] * 2], requires_grad=True)
    loss, metrics = compute_policy_loss(
        torch.zeros(2, 2), log_probs, torch.ones(2, 2), torch.ones(2, 2), actor_config(loss_type="gspo")
    )
    assert loss.item() == pytest.approx(-1.292262, abs=1e-5)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-0.321131, -0.321131], [0.0, 0.0]]), atol=1e-5, rtol=0)
    assert metrics["pg_clipfrac_higher"] == pytest.approx(0.5)


def test_gspo_token_has_the_sequence_value_but_per_token_gradients():
    # value as GSPO (s = 1.28452); gradient of -A sg(s) exp(logp - sg(logp)) w.r.t. logp_t is -A s = -1.28452,
    # divided by the 2 tokens of the token-mean: -0.64226 per token
    log_probs = log_of(1.1, 1.5)
    loss, _ = compute_policy_loss(
        torch.zeros(1, 2), log_probs, torch.ones(1, 2), torch.ones(1, 2), actor_config(loss_type="gspo_token")
    )
    assert loss.item() == pytest.approx(-1.284523, abs=1e-5)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-0.642262, -0.642262]]), atol=1e-5, rtol=0)


def test_cispo_clips_the_weight_but_keeps_every_token_gradient():
    # r = [1.5, 0.5, 1.0], A = [1, 1, -1]; w = clip(r, 0.8, 1.3) = [1.3, 0.8, 1.0] (no gradient through w)
    # L_t = -w A log pi: [-1.3 ln 1.5, -0.8 ln 0.5, 1.0 * ln 1] = [-0.527105, 0.554518, 0]; mean = 0.0091376
    # dL/dlogp_t = -w A / 3 = [-0.43333, -0.26667, 0.33333]: the clipped tokens still get a gradient
    log_probs = log_of(1.5, 0.5, 1.0)
    loss, metrics = compute_policy_loss(
        torch.zeros(1, 3),
        log_probs,
        torch.tensor([[1.0, 1.0, -1.0]]),
        torch.ones(1, 3),
        actor_config(loss_type="cispo"),
    )
    assert loss.item() == pytest.approx(0.0091376, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-1.3 / 3, -0.8 / 3, 1 / 3]]))
    assert metrics["pg_clipfrac_higher"] == pytest.approx(1 / 3)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 3)


def test_sapo_soft_gate_values_and_gradients():
    # tau_pos = 1, tau_neg = 2. t0: r = 1, A = +1: f = (4/1) sigmoid(0) = 2 -> L = -2
    # t1: r = 2, A = -1: f = (4/2) sigmoid(2) = 2 * 0.880797 = 1.761594 -> L = +1.761594
    # token-mean = (-2 + 1.761594) / 2 = -0.119203
    # dL/dlogp = -A 4 s (1 - s) r / 2 tokens: t0 = -1 * 1 * 1 / 2 = -0.5; t1 = 4 * 0.880797 * 0.119203 * 2 / 2 = 0.419974
    log_probs = log_of(1.0, 2.0)
    config = actor_config(loss_type="sapo", tau_positive=1.0, tau_negative=2.0)
    loss, metrics = compute_policy_loss(
        torch.zeros(1, 2), log_probs, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), config
    )
    assert loss.item() == pytest.approx(-0.119203, abs=1e-5)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-0.5, 0.419974]]), atol=1e-5, rtol=0)
    # mean gradient weight 4 s (1 - s): (1 + 0.419974) / 2
    assert metrics["sapo_gate"] == pytest.approx(0.709987, abs=1e-5)


def test_truncated_importance_sampling_caps_the_rollout_weight():
    # on-policy PPO (r = 1, A = 1) gives L_t = -1. TIS weights w = min(pi_old / pi_rollout, 2):
    # token 0: ratio 3 -> capped at 2; token 1: ratio 0.5 -> 0.5. token-mean = (-2 - 0.5) / 2 = -1.25
    old = torch.zeros(1, 2)
    rollout = torch.tensor([[-math.log(3.0), math.log(2.0)]])
    loss, metrics = compute_policy_loss(
        old, old.clone(), torch.ones(1, 2), torch.ones(1, 2), actor_config(loss_type="ppo", tis_cap=2.0), rollout
    )
    assert loss.item() == pytest.approx(-1.25, abs=1e-6)
    assert metrics["tis_clipfrac"] == pytest.approx(0.5)


def test_tis_without_rollout_log_probs_is_a_clear_error():
    with pytest.raises(ValueError, match="rollout_log_probs"):
        compute_policy_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), actor_config(tis_cap=2.0)
        )


def test_seq_mean_token_mean_weighs_sequences_equally():
    # on-policy, A = 1 -> L_t = -1 on every valid token; row lengths 1 and 3
    # seq-mean-token-mean: each row's mean is -1 -> -1; seq-mean-token-sum: (-1 + -3) / 2 = -2
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    args = (torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), mask)
    loss_seq, _ = get_policy_loss("ppo")(*args, actor_config(loss_avg_mode="seq-mean-token-mean"))
    loss_sum, _ = get_policy_loss("ppo")(*args, actor_config(loss_avg_mode="seq-mean-token-sum"))
    assert loss_seq.item() == pytest.approx(-1.0)
    assert loss_sum.item() == pytest.approx(-2.0)


def test_unknown_loss_type_names_the_config_key():
    with pytest.raises(ValueError, match="worker.actor.loss_type"):
        get_policy_loss("ppo2")

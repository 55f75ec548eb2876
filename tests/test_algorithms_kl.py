"""KL estimators against their formulas, and the two KL controllers."""

import math

import pytest
import torch

from easyrl.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    compute_kl_loss,
    get_kl_controller,
    kl_penalty,
    list_kl_penalties,
)
from easyrl.config import AlgorithmConfig


# pi_theta(y) = 0.5, pi_ref(y) = 0.25 for the sampled token: log pi - log pi_ref = ln 2
LOGP = torch.tensor([[math.log(0.5)]])
REF = torch.tensor([[math.log(0.25)]])
LN2 = math.log(2.0)


def test_every_issue_penalty_is_registered():
    assert {"kl", "abs", "mse", "low_var_kl", "full"} <= set(list_kl_penalties())


def test_k1_is_the_log_ratio():
    assert kl_penalty(LOGP, REF, "kl").item() == pytest.approx(LN2)
    assert kl_penalty(REF, LOGP, "kl").item() == pytest.approx(-LN2)


def test_abs_is_the_absolute_log_ratio():
    assert kl_penalty(REF, LOGP, "abs").item() == pytest.approx(LN2)


def test_mse_is_half_the_squared_log_ratio():
    # k2 = (ln 2)^2 / 2 = 0.240227
    assert kl_penalty(LOGP, REF, "mse").item() == pytest.approx(0.5 * LN2**2)


def test_low_var_kl_is_k3():
    # r = pi_ref / pi = 0.5: k3 = r - 1 - ln r = 0.5 - 1 + ln 2 = 0.193147
    assert kl_penalty(LOGP, REF, "low_var_kl").item() == pytest.approx(0.5 - 1 + LN2)


def test_low_var_kl_is_clamped_for_far_apart_policies():
    # ln r = -100 is clamped to -20: exp(-20) + 20 - 1 = 19.0 -> clamped to 10
    assert kl_penalty(torch.zeros(1, 1), torch.full((1, 1), -100.0), "low_var_kl").item() == pytest.approx(10.0)


def test_full_kl_sums_over_the_vocabulary():
    # p = [0.5, 0.5], q = [0.25, 0.75]: KL(p||q) = 0.5 ln 2 + 0.5 ln(2/3) = 0.143841
    p = torch.log(torch.tensor([[[0.5, 0.5]]]))
    q = torch.log(torch.tensor([[[0.25, 0.75]]]))
    out = kl_penalty(p, q, "full")
    assert out.shape == (1, 1)
    assert out.item() == pytest.approx(0.5 * LN2 + 0.5 * math.log(2 / 3), abs=1e-6)


def test_kl_loss_aggregates_masked_tokens():
    # k1 on two valid tokens [ln 2, -ln 2] and one padded token: token-mean = 0
    logp = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), -9.0]])
    loss, metrics = compute_kl_loss(logp, ref, torch.tensor([[1.0, 1.0, 0.0]]), "kl", "token-mean")
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    assert metrics["kl_loss"] == pytest.approx(0.0, abs=1e-7)


def test_adaptive_controller_follows_ziegler_update():
    # beta 0.1, target 0.1, horizon 100, n_steps 10 (K_beta = 0.1)
    # KL 0.2: e = clip(0.2/0.1 - 1, +-0.2) = 0.2 -> beta = 0.1 * (1 + 0.2 * 0.1) = 0.102
    # KL 0.05: e = clip(-0.5) = -0.2 -> beta = 0.102 * (1 - 0.02) = 0.09996
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.2, n_steps=10)
    assert ctrl.kl_coef == pytest.approx(0.102)
    ctrl.update(current_kl=0.05, n_steps=10)
    assert ctrl.kl_coef == pytest.approx(0.09996)


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=3.0, n_steps=100)
    assert ctrl.kl_coef == 0.05


def test_controller_is_chosen_by_kl_type():
    assert isinstance(get_kl_controller(AlgorithmConfig(kl_type="fixed")), FixedKLController)
    adaptive = get_kl_controller(AlgorithmConfig(kl_type="adaptive", kl_coef=0.2, kl_target=0.5, kl_horizon=50))
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.kl_coef == 0.2 and adaptive.target == 0.5


def test_full_kl_loss_refuses_per_token_log_probs():
    with pytest.raises(ValueError, match="vocab"):
        compute_kl_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), "full", "token-mean")


def test_kl_in_reward_subtracts_beta_times_k1_and_updates_the_controller():
    from easyrl.algorithms.kl import apply_kl_penalty
    from easyrl.protocol import DataProto

    # token KL k1 = [ln 0.5 - ln 0.25, 0] = [ln 2, 0]; beta 0.1 -> rewards = scores - [0.0693147, 0]
    # batch KL = mean over samples of the token-mean = (ln 2 + 0) / 2 = 0.346574
    data = DataProto.from_dict(
        tensors={
            "token_level_scores": torch.tensor([[0.0, 1.0]]),
            "old_log_probs": torch.tensor([[math.log(0.5), math.log(0.5)]]),
            "ref_log_probs": torch.tensor([[math.log(0.25), math.log(0.5)]]),
            "response_mask": torch.ones(1, 2, dtype=torch.long),
        }
    )
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=10)
    data, metrics = apply_kl_penalty(data, ctrl, "kl")
    torch.testing.assert_close(data.batch["token_level_rewards"], torch.tensor([[-0.1 * LN2, 1.0]]))
    assert metrics == {"reward/kl_penalty": pytest.approx(LN2 / 2), "reward/kl_coef": 0.1}
    # KL 0.3466 > target 0.1 -> e = 0.2, K = 1/10 -> beta = 0.1 * 1.02
    assert ctrl.kl_coef == pytest.approx(0.102)


def test_controller_value_round_trips_for_checkpoints():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    ctrl.value = 0.25
    assert ctrl.kl_coef == 0.25 and ctrl.value == 0.25

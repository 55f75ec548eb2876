"""Advantage estimators on small hand-worked examples (the arithmetic is in the comments)."""

import math

import numpy as np
import pytest
import torch

from easyrl.algorithms.advantage import compute_advantage, get_adv_estimator, list_adv_estimators


def outcome_rewards(scores, lengths, width=3):
    """Outcome score on the last valid token, as the reward scorer writes it: (batch, width) rewards and mask."""
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for i, (score, length) in enumerate(zip(scores, lengths)):
        mask[i, :length] = 1.0
        rewards[i, length - 1] = score
    return rewards, mask


def test_every_issue_estimator_is_registered():
    expected = {"gae", "grpo", "grpo_passk", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"}
    assert expected <= set(list_adv_estimators())


def test_grpo_normalises_each_group_by_its_mean_and_std():
    # group a: R = [1, 0, 0, 1]; mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = 0.57735 -> A = +-0.5 / 0.57735 = +-0.86603
    rewards, mask = outcome_rewards([1, 0, 0, 1], [3, 1, 2, 3])
    adv, returns = get_adv_estimator("grpo")(rewards, mask, np.array(["a"] * 4, dtype=object))
    expected = torch.tensor([0.86603, -0.86603, -0.86603, 0.86603]).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(returns, adv)


def test_grpo_without_std_is_dr_grpo_mean_centring():
    # R = [1, 0, 0, 1], mean 0.5 -> A = R - 0.5
    rewards, mask = outcome_rewards([1, 0, 0, 1], [3, 3, 3, 3])
    adv, _ = get_adv_estimator("grpo")(rewards, mask, np.array(["a"] * 4, dtype=object), norm_adv_by_std=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_grpo_group_of_equal_rewards_gets_zero_advantage():
    rewards, mask = outcome_rewards([0.5, 0.5, 1.0, 0.0], [2, 3, 3, 3])
    adv, _ = get_adv_estimator("grpo")(rewards, mask, np.array(["same", "same", "x", "x"], dtype=object))
    assert torch.all(adv[:2] == 0)
    assert torch.all(adv[2:, 0].abs() > 0.5)


def test_grpo_group_of_one_gets_zero_advantage():
    rewards, mask = outcome_rewards([1.0, 0.0], [3, 3])
    adv, _ = get_adv_estimator("grpo")(rewards, mask, np.array(["p", "q"], dtype=object))
    assert torch.all(adv == 0) and torch.isfinite(adv).all()


def test_grpo_passk_credits_only_the_best_sample():
    # R = [0.2, 0.9, 0.5]: best minus second best = 0.4; std = sqrt(((-1/3)^2 + (11/30)^2 + (-1/30)^2) / 2)
    # = sqrt(0.24667 / 2) = 0.35119 -> A_best = 0.4 / 0.35119 = 1.13899, others 0
    rewards, mask = outcome_rewards([0.2, 0.9, 0.5], [3, 3, 3])
    index = np.array(["g"] * 3, dtype=object)
    adv, _ = get_adv_estimator("grpo_passk")(rewards, mask, index)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.0, 1.13899, 0.0]), atol=1e-4, rtol=0)
    adv_plain, _ = get_adv_estimator("grpo_passk")(rewards, mask, index, norm_adv_by_std=False)
    torch.testing.assert_close(adv_plain[:, 0], torch.tensor([0.0, 0.4, 0.0]))


def test_grpo_passk_tie_at_the_top_gives_zero():
    rewards, mask = outcome_rewards([1.0, 1.0, 0.0], [3, 3, 3])
    adv, _ = get_adv_estimator("grpo_passk")(rewards, mask, np.array(["g"] * 3, dtype=object))
    assert torch.all(adv == 0)


def test_rloo_baseline_is_the_mean_of_the_other_samples():
    # R = [1, 0, 0]: A_1 = 1 - (0 + 0)/2 = 1; A_2 = 0 - (1 + 0)/2 = -0.5; A_3 = -0.5; a lone sample gets 0
    rewards, mask = outcome_rewards([1, 0, 0, 1], [3, 2, 1, 3])
    adv, _ = get_adv_estimator("rloo")(rewards, mask, np.array(["g", "g", "g", "alone"], dtype=object))
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -0.5, -0.5, 0.0]))
    assert adv[2, 1] == 0  # padding stays zero


def test_gae_matches_the_recursion_before_whitening():
    # sample 1: r = [0, 0, 1], V = [0.5, 0.6, 0.7], gamma = 0.9, lam = 0.5
    #   delta_2 = 1 - 0.7 = 0.3;  delta_1 = 0.9*0.7 - 0.6 = 0.03;  delta_0 = 0.9*0.6 - 0.5 = 0.04
    #   A_2 = 0.3;  A_1 = 0.03 + 0.45*0.3 = 0.165;  A_0 = 0.04 + 0.45*0.165 = 0.11425
    #   returns = A + V = [0.61425, 0.765, 1.0]
    # sample 2 (length 2, the padded value 9.0 must not leak): r = [0, 1], V = [0.5, 0.5]
    #   delta_1 = 1 - 0.5 = 0.5;  delta_0 = 0.9*0.5 - 0.5 = -0.05;  A = [-0.05 + 0.45*0.5, 0.5] = [0.175, 0.5]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, returns = get_adv_estimator("gae")(rewards, values, mask, gamma=0.9, lam=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.61425, 0.765, 1.0], [0.675, 1.0, 0.0]]))
    raw = torch.tensor([0.11425, 0.165, 0.3, 0.175, 0.5])
    whitened = (raw - raw.mean()) / raw.std()
    torch.testing.assert_close(adv[mask.bool()], whitened, atol=1e-5, rtol=0)
    assert adv[1, 2] == 0


def test_gae_with_gamma_lam_one_is_reward_to_go_minus_value():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7]: A_t = 1 - V_t = [0.5, 0.4, 0.3]; returns = 1 everywhere
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, returns = get_adv_estimator("gae")(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.ones(1, 3))
    raw = torch.tensor([0.5, 0.4, 0.3])
    torch.testing.assert_close(adv[0], (raw - raw.mean()) / raw.std(), atol=1e-5, rtol=0)


def test_reinforce_plus_plus_whitens_discounted_returns_over_the_batch():
    # gamma = 0.5. sample 1: r = [0, 0, 1] -> G = [0.25, 0.5, 1]; sample 2 (length 2): r = [0, 1] -> G = [0.5, 1]
    # tokens [0.25, 0.5, 1, 0.5, 1]: mean 0.65; unbiased var = 0.45 / 4 = 0.1125; std 0.33541
    # A = [-1.19257, -0.44721, 1.04350, -0.44721, 1.04350]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, returns = get_adv_estimator("reinforce_plus_plus")(rewards, mask, gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]]))
    expected = torch.tensor([-1.19257, -0.44721, 1.04350, -0.44721, 1.04350])
    torch.testing.assert_close(adv[mask.bool()], expected, atol=1e-4, rtol=0)


def test_a_tool_result_between_turns_passes_the_return_and_gae_on_to_the_turn_before():
    # one multi-turn trajectory: model, model, [tool, tool], model, model; outcome reward 1 on the last model token.
    # gamma = lam = 1, V = 0.5 on every token: the return is 1 on every model token (the tool tokens are not steps
    # of the episode), and GAE's raw advantage 1 - 0.5 = 0.5 on every model token. Cutting the episode at the tool
    # result gave the first turn 0 (a return) and -0.5 (an advantage): the outcome never reached it.
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    values = torch.full((1, 6), 0.5)
    _, returns = get_adv_estimator("reinforce_plus_plus")(rewards, mask, gamma=1.0)
    torch.testing.assert_close(returns, mask.clone())
    advantages, returns = get_adv_estimator("gae")(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, mask.clone())
    assert torch.equal(advantages * (1 - mask), torch.zeros_like(mask))  # no advantage on a tool token
    _, returns = get_adv_estimator("remax")(rewards, mask, reward_baselines=torch.tensor([0.0]))
    torch.testing.assert_close(returns, mask.clone())


@pytest.mark.parametrize("estimator", ["gae", "reinforce_plus_plus", "remax"])
def test_tool_results_inside_a_response_change_nothing_on_the_models_tokens(estimator):
    """Random rewards, values and discounts over responses with holes (tool results) and right padding equal, on the
    model's tokens, the same responses with the holes cut out: the masked tokens are not steps of the episode."""
    generator = torch.Generator().manual_seed(0)
    batch, width = 6, 12
    mask = (torch.rand(batch, width, generator=generator) > 0.35).float()
    mask[:, 0] = 1.0
    for row, length in enumerate([12, 11, 9, 7, 12, 5]):
        mask[row, length:] = 0.0  # right padding
    rewards = torch.randn(batch, width, generator=generator) * mask
    values = torch.randn(batch, width, generator=generator)
    compact_mask, compact_rewards, compact_values = (torch.zeros(batch, width) for _ in range(3))
    for row in range(batch):
        keep = mask[row].bool()
        count = int(keep.sum())
        compact_mask[row, :count] = 1.0
        compact_rewards[row, :count] = rewards[row, keep]
        compact_values[row, :count] = values[row, keep]
    kwargs = {
        "gae": lambda r, m, v: {"values": v, "gamma": 0.9, "lam": 0.8},
        "reinforce_plus_plus": lambda r, m, v: {"gamma": 0.9},
        "remax": lambda r, m, v: {"reward_baselines": torch.zeros(batch)},
    }[estimator]
    function = get_adv_estimator(estimator)
    holey = function(token_level_rewards=rewards, response_mask=mask, **kwargs(rewards, mask, values))
    compact = function(
        token_level_rewards=compact_rewards,
        response_mask=compact_mask,
        **kwargs(compact_rewards, compact_mask, compact_values),
    )
    for got, want in zip(holey, compact):  # advantages, returns
        torch.testing.assert_close(got[mask.bool()], want[compact_mask.bool()], atol=1e-5, rtol=1e-5)
        assert torch.equal(got[~mask.bool()], torch.zeros_like(got[~mask.bool()]))


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_whitens():
    # group R = [1, 0] -> centred [0.5, -0.5]; lengths 2 and 1 -> tokens [0.5, 0.5, -0.5]
    # mean 1/6; unbiased var = (2 * (1/3)^2 + (2/3)^2) / 2 = 1/3; std 0.57735 -> A = [0.57735, 0.57735, -1.15470]
    rewards, mask = outcome_rewards([1, 0], [2, 1])
    adv, _ = get_adv_estimator("reinforce_plus_plus_baseline")(rewards, mask, np.array(["g", "g"], dtype=object))
    torch.testing.assert_close(adv[mask.bool()], torch.tensor([0.57735, 0.57735, -1.15470]), atol=1e-4, rtol=0)


def test_remax_subtracts_the_greedy_reward():
    # R = [1, 0], greedy baseline 0.5 for both -> A = [0.5, -0.5]; returns = reward-to-go = [1, 1] and [0, 0]
    rewards, mask = outcome_rewards([1, 0], [2, 2], width=2)
    adv, returns = get_adv_estimator("remax")(rewards, mask, reward_baselines=torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5], [-0.5, -0.5]]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))


def test_remax_without_a_baseline_gives_that_prompts_samples_no_advantage():
    """A greedy response the reward failed on scored 0 and became the baseline: every sample of its prompt was pushed
    up by its whole reward, silently. Its baseline is NaN now, and its samples teach nothing this step."""
    from easyrl.trainer.ray_trainer import remax_baseline_metrics

    rewards, mask = outcome_rewards([1, 0, 1, 0.25], [2, 2, 2, 2], width=2)
    baselines = torch.tensor([0.5, 0.5, float("nan"), float("nan")])
    adv, returns = get_adv_estimator("remax")(rewards, mask, reward_baselines=baselines)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5], [-0.5, -0.5], [0.0, 0.0], [0.0, 0.0]]))
    torch.testing.assert_close(returns[2:], torch.tensor([[1.0, 1.0], [0.25, 0.25]]))  # the rewards stand
    assert remax_baseline_metrics(baselines, n=2) == {
        "reward/remax_baseline/mean": 0.5,
        "reward/remax_baseline/errors": 1.0,
    }


def test_unknown_estimator_names_the_config_key():
    with pytest.raises(ValueError, match="algorithm.adv_estimator.*grpo"):
        get_adv_estimator("gpro")


def test_advantages_carry_no_autograd_graph():
    rewards, mask = outcome_rewards([1.0, 0.0], [3, 3])
    rewards.requires_grad_(True)
    adv, _ = get_adv_estimator("grpo")(rewards, mask, np.array(["g", "g"], dtype=object))
    assert not adv.requires_grad
    # R = [1, 0]: mean 0.5, unbiased std sqrt(0.5) -> A_1 = 0.5 / sqrt(0.5) = 0.70711
    assert math.isclose(adv[0, 2].item(), 0.5 / math.sqrt(0.5), rel_tol=1e-4)


def test_compute_advantage_reads_the_batch_and_adds_advantages_and_returns():
    from easyrl.config import AlgorithmConfig
    from easyrl.protocol import DataProto

    rewards, mask = outcome_rewards([1, 0], [3, 2])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask.long()},
        non_tensors={"uid": np.array(["g", "g"], dtype=object)},
    )
    data = compute_advantage(data, AlgorithmConfig(adv_estimator="grpo", norm_adv_by_std_in_grpo=False))
    # Dr. GRPO: R = [1, 0] -> A = [0.5, -0.5] on the valid tokens
    torch.testing.assert_close(data.batch["advantages"], torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]]))
    torch.testing.assert_close(data.batch["returns"], data.batch["advantages"])


def test_compute_advantage_says_what_gae_is_missing():
    from easyrl.config import AlgorithmConfig
    from easyrl.protocol import DataProto

    rewards, mask = outcome_rewards([1], [3])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask})
    with pytest.raises(ValueError, match=r"adv_estimator=gae.*critic values"):
        compute_advantage(data, AlgorithmConfig(adv_estimator="gae"))


@pytest.mark.parametrize("estimator", ["grpo", "grpo_passk", "rloo"])
def test_sixteen_equal_float32_rewards_give_exactly_zero_advantage(estimator):
    # In float32 the mean of 16 rewards 0.9 is one ulp off and the std ~3e-8, so GRPO used to give |A| up to 0.11.
    rewards, mask = outcome_rewards([0.9] * 16, [3] * 16)
    adv, _ = get_adv_estimator(estimator)(rewards, mask, np.array(["g"] * 16, dtype=object))
    assert adv.dtype == torch.float32
    assert torch.count_nonzero(adv) == 0


def test_dr_grpo_and_reinforce_plus_plus_baseline_zero_for_equal_rewards():
    rewards, mask = outcome_rewards([0.9] * 16, [3] * 16)
    index = np.array(["g"] * 16, dtype=object)
    adv, _ = get_adv_estimator("grpo")(rewards, mask, index, norm_adv_by_std=False)
    assert torch.count_nonzero(adv) == 0
    # the group centring leaves exact zeros, so the batch whitening has nothing to scale up
    adv, _ = get_adv_estimator("reinforce_plus_plus_baseline")(rewards, mask, index)
    assert torch.count_nonzero(adv) == 0


def _float64_group_reference(scores: np.ndarray, groups: np.ndarray, estimator: str) -> np.ndarray:
    """Per-sample advantage written group by group in float64 with numpy (the formulas of the docstrings)."""
    out = np.zeros_like(scores)
    for group in np.unique(groups):
        members = np.flatnonzero(groups == group)
        r = scores[members]
        if estimator == "grpo":
            out[members] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        elif estimator == "rloo":
            out[members] = r - (r.sum() - r) / (len(r) - 1)
        elif estimator == "grpo_passk":
            order = np.argsort(-r, kind="stable")
            out[members[order[0]]] = (r[order[0]] - r[order[1]]) / (r.std(ddof=1) + 1e-6)
    return out


@pytest.mark.parametrize("estimator", ["grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline"])
def test_random_rewards_match_a_float64_reference(estimator):
    generator = torch.Generator().manual_seed(7)
    num_groups, n, width = 8, 16, 5
    scores32 = torch.rand(num_groups * n, generator=generator)
    lengths = torch.randint(1, width + 1, (num_groups * n,), generator=generator).tolist()
    rewards, mask = outcome_rewards(scores32.tolist(), lengths, width=width)
    groups = np.repeat(np.arange(num_groups), n)
    adv, _ = get_adv_estimator(estimator)(rewards, mask, groups.astype(str).astype(object))

    scores = rewards.double().sum(-1).numpy()  # one reward per row: the float32 score, exactly
    if estimator == "reinforce_plus_plus_baseline":
        centred = np.concatenate([np.full(length, s) for s, length in zip(scores, lengths)])
        for group in range(num_groups):
            rows = groups == group
            centred_rows = np.repeat(rows, lengths)
            centred[centred_rows] -= scores[rows].mean()
        expected_tokens = (centred - centred.mean()) / np.sqrt(centred.var(ddof=1) + 1e-8)
    else:
        per_sample = _float64_group_reference(scores, groups, estimator)
        expected_tokens = np.repeat(per_sample, lengths)
    expected = torch.from_numpy(expected_tokens).float()
    # bit-equal to the float64 result rounded once to float32 (float32 statistics were up to 3 ulps off here)
    torch.testing.assert_close(adv[mask.bool()], expected, rtol=0, atol=0)

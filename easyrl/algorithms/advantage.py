"""Advantage estimators, registered by name (`algorithm.adv_estimator`).

Every estimator is a pure torch function of keyword arguments taken from this list (each asks only for what it
uses) and returns `(advantages, returns)`, both (batch, response_len) and zero outside `response_mask`:

    token_level_rewards (batch, response_len)  the reward r_t of each token (outcome score on the last token,
                                               minus the KL penalty when KL is applied in the reward)
    response_mask       (batch, response_len)  1 on generated tokens
    index               np.ndarray (batch,)    group id (`uid`) shared by the n samples of one prompt
    values              (batch, response_len)  critic values V(s_t)
    reward_baselines    (batch,)               score of the greedy response (ReMax)
    gamma, lam          float                  discount and GAE lambda
    norm_adv_by_std     bool                   divide group-centred scores by the group std (GRPO) or not (Dr. GRPO)

Outcome-reward estimators read one score per sample: R_i = sum_t r_t over the response.
Scores and every group or batch statistic (mean, std, whitening) are computed in float64 and the result is cast back
to at least float32: in float32 the mean of 16 equal rewards 0.9 is off by one ulp, the std a few 1e-8 instead of 0, and
(R_i - mean) / (std + eps) reaches |A| = 0.11 for a group that has nothing to prefer. In float64 a group of equal
float32 rewards gives exactly A = 0 (n * R is exact for any group smaller than 2^29).
Adding an estimator: write the function here and decorate it with `@register_adv_estimator("name")`.
"""

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from .masked import masked_whiten


if TYPE_CHECKING:
    from ..config import AlgorithmConfig
    from ..protocol import DataProto


_ADV_ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}

EPS = 1e-6


def register_adv_estimator(name: str):
    """Register `fn` under `name`; it runs without autograd (advantages are constants for the policy loss)."""

    def decorator(fn):
        if name in _ADV_ESTIMATORS:
            raise ValueError(f"Advantage estimator `{name}` is registered twice.")
        _ADV_ESTIMATORS[name] = torch.no_grad()(fn)
        return fn

    return decorator


def get_adv_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    if name not in _ADV_ESTIMATORS:
        raise ValueError(
            f"`algorithm.adv_estimator` is `{name}`, which is not one of: {', '.join(list_adv_estimators())}."
        )
    return _ADV_ESTIMATORS[name]


def list_adv_estimators() -> list[str]:
    return sorted(_ADV_ESTIMATORS)


# ----------------------------------------------------------------------------------------------------------------------
# group statistics (the n samples of one prompt share a uid)
# ----------------------------------------------------------------------------------------------------------------------
def _group_ids(index: np.ndarray, device: torch.device) -> tuple[torch.Tensor, int]:
    """uids (any hashable) -> dense group ids 0..G-1, shape (batch,)."""
    _, inverse = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
    ids = torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device)
    return ids, int(ids.max().item()) + 1 if ids.numel() else 0


def _group_sum(x: torch.Tensor, ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    """sum over each group, broadcast back to the samples: (batch,) -> (batch,)."""
    return torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, ids, x)[ids]


def group_mean_std(scores: torch.Tensor, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased group std (0 for a group of one) and group size, each (batch,), in float64."""
    scores = scores.double()
    ids, num_groups = _group_ids(index, scores.device)
    count = _group_sum(torch.ones_like(scores), ids, num_groups)
    mean = _group_sum(scores, ids, num_groups) / count
    sq_dev = _group_sum((scores - mean) ** 2, ids, num_groups)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    return mean, std, count


def _outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """R_i = sum_t r_{i,t} in float64: (batch, response_len) -> (batch,)."""
    return (token_level_rewards.double() * response_mask.double()).sum(dim=-1)


def _result_dtype(token_level_rewards: torch.Tensor) -> torch.dtype:
    """Advantages leave in the rewards' dtype, never below float32 (float64 rewards stay float64)."""
    return torch.promote_types(token_level_rewards.dtype, torch.float32)


def _broadcast(per_sample: torch.Tensor, response_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(batch,) float64 -> (batch, response_len) in `dtype`, zero on padding."""
    return (per_sample.unsqueeze(-1) * response_mask.double()).to(dtype)


def _whiten(values: torch.Tensor, response_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Batch whitening over the response tokens, computed in float64, returned in `dtype`."""
    return masked_whiten(values.double(), response_mask.double()).to(dtype)


# ----------------------------------------------------------------------------------------------------------------------
# estimators
# ----------------------------------------------------------------------------------------------------------------------
@register_adv_estimator("gae")
def compute_gae_advantage(
    token_level_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation, Schulman et al. 2015 (arXiv 1506.02438).

    delta_t = r_t + gamma V(s_{t+1}) - V(s_t)       (V after the last response token is 0: the episode ends)
    A_t     = sum_{l>=0} (gamma lam)^l delta_{t+l}  = delta_t + gamma lam A_{t+1}
    returns = A_t + V(s_t)                          (the critic's regression target)
    The advantages are then whitened over the batch (as in PPO practice).
    """
    mask = response_mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        advantage_t = delta + gamma * lam * next_advantage
        advantages[:, t] = advantage_t * m
        # A masked token is not an action: the right padding (past the last response token nothing flows back,
        # V = 0, A = 0) or a tool result between two turns of a multi-turn rollout, which the next turn's value and
        # advantage pass over unchanged, undiscounted, to the turn before (verl does the same).
        next_value = values[:, t] * m + (1 - m) * next_value
        next_advantage = advantage_t * m + (1 - m) * next_advantage
    returns = (advantages + values) * mask
    return _whiten(advantages, mask, advantages.dtype), returns


@register_adv_estimator("grpo")
def compute_grpo_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, norm_adv_by_std: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Relative Policy Optimization, Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300), outcome supervision.

    A_i = (R_i - mean(R_group)) / (std(R_group) + eps)   for every token of sample i
    Dr. GRPO (Liu et al. 2025, arXiv 2503.20783) drops the std division (`norm_adv_by_std=False`):
    A_i = R_i - mean(R_group).
    A group whose rewards are all equal (including a group of one) gets A = 0: there is nothing to prefer.
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    mean, std, _ = group_mean_std(scores, index)
    advantages = scores - mean
    if norm_adv_by_std:
        advantages = advantages / (std + EPS)
    advantages = _broadcast(advantages, response_mask, _result_dtype(token_level_rewards))
    return advantages, advantages


@register_adv_estimator("grpo_passk")
def compute_grpo_passk_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, norm_adv_by_std: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k (k = n) leave-one-out advantage, Tang et al. 2025 (arXiv 2503.19595).

    The objective is max_j R_j of the group. Sample i's leave-one-out credit is max_j R_j - max_{j!=i} R_j, which is
    nonzero only for the best sample: A_best = (R_max - R_second_max) / (std(R_group) + eps), A_other = 0.
    Ties at the top give 0 to everyone.
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    ids, num_groups = _group_ids(index, scores.device)
    _, std, _ = group_mean_std(scores, index)
    advantages = torch.zeros_like(scores)
    for group in range(num_groups):
        members = torch.nonzero(ids == group).flatten()
        if members.numel() < 2:
            continue
        top = torch.topk(scores[members], k=2)
        advantages[members[top.indices[0]]] = top.values[0] - top.values[1]
    if norm_adv_by_std:
        advantages = advantages / (std + EPS)
    advantages = _broadcast(advantages, response_mask, _result_dtype(token_level_rewards))
    return advantages, advantages


@register_adv_estimator("rloo")
def compute_rloo_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE Leave-One-Out, Ahmadian et al. 2024 (arXiv 2402.14740).

    A_i = R_i - 1/(n-1) sum_{j != i} R_j  (each sample's baseline is the mean of the other n-1 samples).
    A group of one has no other sample: A = 0.
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    mean, _, count = group_mean_std(scores, index)
    group_sum = mean * count
    leave_one_out = (group_sum - scores) / (count - 1).clamp(min=1)
    advantages = torch.where(count > 1, scores - leave_one_out, torch.zeros_like(scores))
    advantages = _broadcast(advantages, response_mask, _result_dtype(token_level_rewards))
    return advantages, advantages


def _discounted_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_{k>=0} gamma^k r_{t+k} over the response's own tokens: (batch, response_len), 0 where masked.

    A masked token (a tool result between two turns of a multi-turn rollout) is not a step of the episode: the
    return passes it unchanged and undiscounted, so an outcome reward on the last turn reaches every earlier turn."""
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        m = mask[:, t]
        running = (token_level_rewards[:, t] + gamma * running) * m + (1 - m) * running
        returns[:, t] = running * m
    return returns


@register_adv_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++, Hu 2025 (arXiv 2501.03262).

    G_t = sum_{k>=t} gamma^{k-t} r_k   (token rewards include the per-token KL penalty)
    A_t = (G_t - mean(G)) / std(G)     normalised over every response token of the global batch
    """
    dtype = _result_dtype(token_level_rewards)
    returns = _discounted_returns(token_level_rewards.double(), response_mask.double(), gamma)
    return _whiten(returns, response_mask, dtype), returns.to(dtype)


@register_adv_estimator("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline, Hu 2025 (arXiv 2501.03262): group mean as baseline, global batch normalisation.

    A'_i = R_i - mean(R_group)                   (the group mean removes the prompt's difficulty)
    A_i  = (A'_i - mean(A')) / std(A')           over every response token of the global batch
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    mean, _, _ = group_mean_std(scores, index)
    centred = _broadcast(scores - mean, response_mask, torch.float64)
    advantages = _whiten(centred, response_mask, _result_dtype(token_level_rewards))
    return advantages, advantages


@register_adv_estimator("remax")
def compute_remax_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, reward_baselines: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax, Li et al. 2023 (arXiv 2310.10505): the greedy response's reward is the baseline.

    A_i     = R(x, y_i) - R(x, y_greedy)          for every token of sample i
    returns = sum_{k>=t} r_k                      (undiscounted reward-to-go)

    A NaN baseline (the reward failed on the greedy response) gives its samples advantage 0: a baseline of 0 would
    push every one of them up by its whole reward.
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    centred = torch.nan_to_num(scores - reward_baselines.double(), nan=0.0)
    advantages = _broadcast(centred, response_mask, _result_dtype(token_level_rewards))
    returns = _discounted_returns(token_level_rewards, response_mask, gamma=1.0)
    return advantages, returns


# ----------------------------------------------------------------------------------------------------------------------
# the trainer's entry point
# ----------------------------------------------------------------------------------------------------------------------
_INPUT_HELP = {
    "values": "critic values (`values`): use the gae estimator with a critic",
    "reward_baselines": "greedy-response rewards (`reward_baselines`): the trainer scores a greedy rollout for remax",
    "index": "group ids (non-tensor `uid`): the trainer sets one per prompt before repeating it n times",
}


def _estimator_inputs(data: "DataProto", config: "AlgorithmConfig") -> dict:
    batch = data.batch
    inputs = {
        "token_level_rewards": batch["token_level_rewards"],
        "response_mask": batch["response_mask"].to(batch["token_level_rewards"].dtype),
        "gamma": config.gamma,
        "lam": config.lam,
        "norm_adv_by_std": config.norm_adv_by_std_in_grpo,
    }
    for key in ("values", "reward_baselines"):
        if key in batch.keys():
            inputs[key] = batch[key]
    if "uid" in data.non_tensor_batch:
        inputs["index"] = data.non_tensor_batch["uid"]
    return inputs


def compute_advantage(data: "DataProto", config: "AlgorithmConfig") -> "DataProto":
    """Add `advantages` and `returns` (batch, response_len) to `data` with `config.adv_estimator`.

    Reads `token_level_rewards` and `response_mask` (plus `values`, `reward_baselines` or non-tensor `uid` when the
    estimator needs them). Returns the same DataProto, updated in place.
    """
    estimator = get_adv_estimator(config.adv_estimator)
    available = _estimator_inputs(data, config)
    wanted = inspect.signature(estimator).parameters
    kwargs = {}
    for name, param in wanted.items():
        if name in available:
            kwargs[name] = available[name]
        elif param.default is inspect.Parameter.empty:
            help_text = _INPUT_HELP.get(name, f"`{name}`")
            raise ValueError(
                f"`algorithm.adv_estimator={config.adv_estimator}` needs {help_text}; the batch has none."
            )
    advantages, returns = get_adv_estimator(config.adv_estimator)(**kwargs)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data

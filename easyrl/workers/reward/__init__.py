"""Rewards from user `.py` files: loading (loader), safe calls (actor), the actor pool (pool), batch scoring
(scorer), and answer grading helpers (grading)."""

from .loader import RewardFunction, RewardFunctionError, load_reward_function
from .scorer import RewardScorer, reduce_reward_metrics, scores_to_non_tensor


__all__ = [
    "RewardFunction",
    "RewardFunctionError",
    "RewardScorer",
    "load_reward_function",
    "reduce_reward_metrics",
    "scores_to_non_tensor",
]

"""Rewards from user `.py` files: loading (loader), safe calls (actor), the actor pool (pool), batch scoring
(scorer), and answer grading helpers (grading).

Only the loader is imported here: it is light (no torch, no Ray), so the config check can resolve a reward file
through `resolve_reward_function` without starting the heavy parts; import the scorer from `.scorer`.
"""

from .loader import RewardFunction, RewardFunctionError, load_reward_function, resolve_reward_function


__all__ = ["RewardFunction", "RewardFunctionError", "load_reward_function", "resolve_reward_function"]

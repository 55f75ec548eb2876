"""Reward of a multi-turn rollout with an environment (`worker.rollout.multi_turn.env`): the sum of the rewards its
`step` calls returned over the trajectory (a stepped environment), or what its `get_reward()` returned at the end (a
tool environment, TRL's environment_factory), which the rollout hands to the reward function as `env_reward`.

    overall = env_reward

Use it as `worker.reward.reward_function: reward_function/env_reward.py:compute_score` when the environment alone
decides the reward; a reward file of your own can read `env_reward` beside `response`, `ground_truth` and `messages`
and mix them. `SCORES_ENV_REWARD` tells the scorer that `overall` already holds a tool environment's reward (it
otherwise adds it, as TRL does).
"""

REWARD_TYPE = "batch"
SCORES_ENV_REWARD = True


def compute_score(reward_inputs: list[dict]) -> list[dict]:
    scores = []
    for item in reward_inputs:
        if "env_reward" not in item:
            raise KeyError(
                "reward_function/env_reward.py scores with the environment's rewards, and this batch has none: set "
                "worker.rollout.multi_turn.env, or choose another reward function."
            )
        scores.append({"overall": float(item["env_reward"])})
    return scores

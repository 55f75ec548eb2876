"""Reward for math answers: reasoning in <think>...</think>, the final answer in \\boxed{...} (EasyR1's math.py).

format   = 1 if the response is `<think>...</think> ... \\boxed{...}`, else 0
accuracy = 1 if the last \\boxed{...} equals the ground truth (math-verify, falling back to mathruler)
overall  = (1 - format_weight) * accuracy + format_weight * format
"""

import re

from easyrl.workers.reward.grading import extract_boxed, math_equal


REWARD_TYPE = "batch"

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(response: str) -> float:
    return 1.0 if _FORMAT.fullmatch(response.strip()) else 0.0


def accuracy_reward(response: str, ground_truth: str) -> float:
    answer = extract_boxed(response)
    return 1.0 if answer is not None and math_equal(answer, ground_truth) else 0.0


def compute_score(reward_inputs: list[dict], format_weight: float = 0.1) -> list[dict]:
    scores = []
    for item in reward_inputs:
        # some tokenizers leave spaces around the tags (e.g. "< think >"); EasyR1 normalises them the same way
        response = re.sub(r"\s*(<|>|/)\s*", r"\1", item["response"])
        format_score = format_reward(response)
        accuracy = accuracy_reward(response, item["ground_truth"])
        scores.append(
            {
                "overall": (1.0 - format_weight) * accuracy + format_weight * format_score,
                "format": format_score,
                "accuracy": accuracy,
            }
        )
    return scores

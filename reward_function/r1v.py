"""Reward for visual question answering: reasoning in <think>...</think>, the answer in <answer>...</answer>.

The answer is compared by kind: a multiple-choice letter (A-J) by letter, a number numerically, anything else as a
math expression (math-verify) or, failing that, as case-insensitive text.

    format   = 1 if the response is `<think>...</think> <answer>...</answer>`, else 0
    accuracy = 1 if the <answer> content matches the ground truth, else 0
    overall  = (1 - format_weight) * accuracy + format_weight * format
"""

import re

from easyrl.workers.reward.grading import extract_tag, math_equal, parse_number


REWARD_TYPE = "sequential"

_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_CHOICE = re.compile(r"^\(?([A-J])\)?(?:[.:)]|\s|$)")


def format_reward(response: str) -> float:
    return 1.0 if _FORMAT.fullmatch(response.strip()) else 0.0


def _choice(text: str) -> str | None:
    """`B`, `(B)`, `B.`, `B) cat` -> `B`."""
    match = _CHOICE.match(text.strip())
    return match.group(1) if match else None


def accuracy_reward(response: str, ground_truth: str) -> float:
    answer = extract_tag(response, "answer")
    if answer is None:
        return 0.0
    truth = str(ground_truth).strip()
    truth_choice = _choice(truth) if len(truth) <= 3 else None
    if truth_choice is not None:
        return 1.0 if _choice(answer) == truth_choice else 0.0
    truth_number, answer_number = parse_number(truth), parse_number(answer)
    if truth_number is not None:
        if answer_number is None:
            return 0.0
        return 1.0 if abs(answer_number - truth_number) <= 1e-6 * max(1.0, abs(truth_number)) else 0.0
    if answer.lower().rstrip(".") == truth.lower().rstrip("."):
        return 1.0
    return 1.0 if math_equal(answer, truth) else 0.0


def compute_score(reward_input: dict, format_weight: float = 0.5) -> dict:
    response = re.sub(r"\s*(<|>|/)\s*", r"\1", reward_input["response"])
    format_score = format_reward(response)
    accuracy = accuracy_reward(response, reward_input["ground_truth"])
    return {
        "overall": (1.0 - format_weight) * accuracy + format_weight * format_score,
        "format": format_score,
        "accuracy": accuracy,
    }

"""Visual question answering reward with EasyR1's contract (its examples/reward_function/r1v.py): same inputs,
same scores, same keys. One call per response (REWARD_TYPE "sequential").

    format   = 1 if the response, exactly as decoded (no trimming, no tag clean-up), is
               `<think>...</think>`, optional whitespace, `<answer>...</answer>` and nothing else; else 0
    answer   = the first `<answer>...</answer>` on one line, trimmed; without one, the whole response trimmed
    accuracy = 1 if mathruler's grade_answer accepts the answer against the trimmed ground truth, else 0
               (a grader error, or a ground truth that is not text, scores 0)
    overall  = (1 - format_weight) * accuracy + format_weight * format          (format_weight = 0.5)

A multiple-choice answer is graded by mathruler like any other text: `<answer>B</answer>` matches "B",
`<answer>(B) circle</answer>` does not.
"""

import re

from mathruler.grader import grade_answer


REWARD_NAME = "r1v"
REWARD_TYPE = "sequential"

_THINK_THEN_ANSWER = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_ANSWER_ON_ONE_LINE = re.compile(r"<answer>(.*?)</answer>")  # `.` stops at a newline: a multi-line answer is no tag


def format_reward(response: str) -> float:
    return 1.0 if _THINK_THEN_ANSWER.fullmatch(response) else 0.0


def accuracy_reward(response: str, ground_truth: str | int | float) -> float:
    try:
        tagged = _ANSWER_ON_ONE_LINE.search(response)
        answer = (tagged.group(1) if tagged else response).strip()
        # str(): EasyR1's r1v.py failed here on a number in the answer column and scored every answer as wrong
        return 1.0 if grade_answer(answer, str(ground_truth).strip()) else 0.0
    except Exception:  # noqa: BLE001 - EasyR1 scores any failure to grade as a wrong answer
        return 0.0


def compute_score(reward_input: dict, format_weight: float = 0.5) -> dict[str, float]:
    response = reward_input["response"]
    format_score = format_reward(response)
    accuracy = accuracy_reward(response, reward_input["ground_truth"])
    return {
        "overall": (1 - format_weight) * accuracy + format_weight * format_score,
        "format": format_score,
        "accuracy": accuracy,
    }

"""Math reward with EasyR1's contract (its examples/reward_function/math.py): same inputs, same scores, same keys.

    response' = the response with the whitespace around every `<`, `>` and `/` removed (some models, e.g.
                Qwen2.5-VL-32B, write `< think >`); both scores read response'
    format    = 1 if response' is, in full, `<think>...</think>...\\boxed{...}...`, else 0
    accuracy  = 1 if mathruler's grade_answer accepts the last \\boxed{...} of response' against the ground truth
                (no box: the answer is the text "None"), else 0
    overall   = (1 - format_weight) * accuracy + format_weight * format          (format_weight = 0.1)

The answer is graded with mathruler (normalise, then sympy), exactly the grader EasyR1 uses, so a run scores what
it would score under EasyR1. (easyrl.workers.reward.grading.math_equal, with math-verify first, accepts more
equivalent forms; it is there for your own reward files.)
"""

import re

from mathruler.grader import extract_boxed_content, grade_answer


REWARD_NAME = "math"
REWARD_TYPE = "batch"

_SPACED_TAG_CHARS = re.compile(r"\s*([<>/])\s*")
_THINK_THEN_BOXED = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(response: str) -> float:
    return 1.0 if _THINK_THEN_BOXED.fullmatch(response) else 0.0


def accuracy_reward(response: str, ground_truth: str | int | float) -> float:
    # str(): a number in the answer column (e.g. a parquet column of ints) grades as its text (EasyR1's raised)
    return 1.0 if grade_answer(extract_boxed_content(response), str(ground_truth)) else 0.0


def compute_score(reward_inputs: list[dict], format_weight: float = 0.1) -> list[dict[str, float]]:
    scores = []
    for item in reward_inputs:
        response = _SPACED_TAG_CHARS.sub(r"\1", item["response"])
        format_score = format_reward(response)
        accuracy = accuracy_reward(response, item["ground_truth"])
        scores.append(
            {
                "overall": (1 - format_weight) * accuracy + format_weight * format_score,
                "format": format_score,
                "accuracy": accuracy,
            }
        )
    return scores

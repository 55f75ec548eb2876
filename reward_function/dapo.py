"""DAPO reward (Yu et al. 2025, arXiv 2503.14476): +1 / -1 for a right / wrong final answer, plus the soft
overlong penalty of section 3.4.

The answer is read from the last `Answer: ...` line (the DAPO-Math prompt asks for it), else the last \\boxed{}.
With L_max = max_response_length and L_cache = overlong_buffer_length, the length penalty of a response of |y|
tokens is

    R_length(y) = 0                                  if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                = -1                                 if |y| > L_max

    overall = (1 if correct else -1) + overlong_penalty_factor * R_length(y)

Set the keyword arguments with worker.reward.reward_function_kwargs, e.g.
{max_response_length: 20480, overlong_buffer_length: 4096, overlong_penalty_factor: 1.0}.
"""

import re

from easyrl.workers.reward.grading import extract_boxed, math_equal


REWARD_TYPE = "batch"

_ANSWER_LINE = re.compile(r"Answer\s*:\s*(.+)", re.IGNORECASE)


def extract_answer(response: str) -> str | None:
    matches = _ANSWER_LINE.findall(response)
    if matches:
        return matches[-1].strip().strip("$").strip()
    return extract_boxed(response)


def overlong_penalty(response_length: int, max_response_length: int, overlong_buffer_length: int) -> float:
    """R_length in [-1, 0] (see the module docstring)."""
    if overlong_buffer_length <= 0:
        return 0.0
    expected_length = max_response_length - overlong_buffer_length
    return max(min(0.0, (expected_length - response_length) / overlong_buffer_length), -1.0)


def compute_score(
    reward_inputs: list[dict],
    max_response_length: int = 20480,
    overlong_buffer_length: int = 4096,
    overlong_penalty_factor: float = 1.0,
) -> list[dict]:
    scores = []
    for item in reward_inputs:
        answer = extract_answer(item["response"])
        correct = answer is not None and math_equal(answer, item["ground_truth"])
        penalty = overlong_penalty_factor * overlong_penalty(
            item["response_length"], max_response_length, overlong_buffer_length
        )
        scores.append(
            {
                "overall": (1.0 if correct else -1.0) + penalty,
                "accuracy": 1.0 if correct else 0.0,
                "overlong": penalty,
            }
        )
    return scores

"""Reward for integer arithmetic answers written as \\boxed{N} (the embedded default task).

    format   = 1 if the last \\boxed{...} holds an integer (right or wrong), else 0
    accuracy = 1 if the last \\boxed{...} holds the ground-truth integer, else 0
    overall  = format_weight * format + (1 - format_weight) * accuracy      (format_weight = 0.1)

The format credit is deliberate: a small model (SmolLM2-135M) rarely writes \\boxed{} at first, so an all-zero
group would give GRPO nothing to learn from. Rewarding the format first gives it a signal to climb, and the
accuracy term (9x larger) then dominates once the format is learnt. Format credit needs an integer inside the box,
so a literal `\\boxed{N}` or an empty box earns nothing.
"""

from easyrl.workers.reward.grading import extract_boxed, parse_number


REWARD_TYPE = "batch"


def boxed_integer(response: str) -> int | None:
    """The integer in the last \\boxed{...} (`12`, `-3`, `1,024`, `12.0`), or None."""
    answer = extract_boxed(response)
    value = parse_number(answer) if answer else None
    return int(value) if value is not None and value == int(value) else None


def accuracy_reward(response: str, ground_truth: str) -> float:
    predicted = boxed_integer(response)
    expected = parse_number(str(ground_truth))
    return 1.0 if predicted is not None and expected is not None and predicted == expected else 0.0


def compute_score(reward_inputs: list[dict], format_weight: float = 0.1) -> list[dict]:
    scores = []
    for item in reward_inputs:
        format_score = 1.0 if boxed_integer(item["response"]) is not None else 0.0
        accuracy = accuracy_reward(item["response"], item["ground_truth"])
        scores.append(
            {
                "overall": format_weight * format_score + (1.0 - format_weight) * accuracy,
                "format": format_score,
                "accuracy": accuracy,
            }
        )
    return scores

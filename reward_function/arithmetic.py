"""Reward for integer arithmetic answers (the embedded default task).

    answer   = the integer in the last \\boxed{...} when the response has one, else the last integer it writes
    accuracy = 1 if answer == ground truth, else 0
    format   = 1 if the last \\boxed{...} holds an integer (right or wrong), else 0
    overall  = format_weight * format + (1 - format_weight) * accuracy      (format_weight = 0.1)

Why the unboxed fallback: a small model (SmolLM2-135M) almost never writes \\boxed{} at first but does end some
answers with the right number (~8% of samples), so accuracy alone already gives GRPO groups with different scores
from the first step. The small format credit then pulls the answers into the box, where the answer is unambiguous.
A box without an integer (`\\boxed{N}`, `\\boxed{}`) earns nothing and hides no fallback number.

With tools (a multi-turn rollout, whose response holds every turn and the tool results between them), the model's
last turn is scored, without its `<tool_call>...</tool_call>` blocks: the last integer of the whole trajectory is
often the calculator's result, which would score a final turn that answers nothing (or a trajectory cut right after
a tool result) as correct.
"""

import re

from easyrl.workers.reward.grading import extract_boxed, parse_number


REWARD_TYPE = "batch"


def boxed_integer(response: str) -> int | None:
    """The integer in the last \\boxed{...} (`12`, `-3`, `1,024`, `12.0`), or None."""
    answer = extract_boxed(response)
    value = parse_number(answer) if answer else None
    return int(value) if value is not None and value == int(value) else None


def final_integer(response: str) -> int | None:
    """The boxed integer when there is a box, else the last integer in the text (`= 82.` -> 82), or None."""
    if extract_boxed(response) is not None:
        return boxed_integer(response)
    matches = re.findall(r"-?\d+(?:,\d{3})*(?:\.\d+)?", response)
    if not matches:
        return None
    value = parse_number(matches[-1])
    return int(value) if value is not None and value == int(value) else None


def accuracy_reward(response: str, ground_truth: str) -> float:
    predicted = final_integer(response)
    expected = parse_number(str(ground_truth))
    return 1.0 if predicted is not None and expected is not None and predicted == expected else 0.0


_TOOL_CALL = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)


def answer_text(item: dict) -> str:
    """The text the answer is read from: the response, or with tools the model's last turn less its tool calls."""
    turns = [message for message in item.get("messages") or [] if message.get("role") == "assistant"]
    return _TOOL_CALL.sub(" ", str(turns[-1]["content"])) if turns else item["response"]


def compute_score(reward_inputs: list[dict], format_weight: float = 0.1) -> list[dict]:
    scores = []
    for item in reward_inputs:
        text = answer_text(item)
        format_score = 1.0 if boxed_integer(text) is not None else 0.0
        accuracy = accuracy_reward(text, item["ground_truth"])
        scores.append(
            {
                "overall": format_weight * format_score + (1.0 - format_weight) * accuracy,
                "format": format_score,
                "accuracy": accuracy,
            }
        )
    return scores

"""Number-game reward of EasyR1's Android GUI agent example, with its contract (its
examples/reward_function/android_gui.py): same inputs, same scores, same keys. One call per batch.

The game's screen shows a traffic light and three numbered cards; the model names a card by its position
(0 left, 1 middle, 2 right), as format_prompt/android_gui.jinja asks.

    choice   = the response trimmed, when it is exactly "0", "1" or "2"; else the first of those digits anywhere in
               it ("I pick 2" -> "2", "12" -> "1"); none: no choice
    accuracy = 1 if the choice is the ground truth, else 0
    overall  = accuracy

Two differences, both where EasyR1's scores are wrong: a ground truth that is a number (a parquet column of ints, or
1.0 from a float column) is compared as its text, "1", trimmed (EasyR1 compares the value as it is and scores every
such answer 0); and no choice is never right (EasyR1 scores a response without a digit 1 on a row whose answer is
empty).
"""

import re
from typing import Any


REWARD_NAME = "number_game"
REWARD_TYPE = "batch"

_POSITIONS = ("0", "1", "2")
_FIRST_POSITION = re.compile(r"[012]")


def extract_choice(response: str) -> str:
    """The card position the response names, or "" when it names none."""
    response = response.strip()
    if response in _POSITIONS:
        return response
    found = _FIRST_POSITION.search(response)
    return found.group(0) if found else ""


def _as_text(ground_truth: Any) -> str:
    if isinstance(ground_truth, float) and ground_truth.is_integer():
        ground_truth = int(ground_truth)
    return str(ground_truth).strip()


def compute_score(reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
    scores = []
    for item in reward_inputs:
        choice = extract_choice(item.get("response", ""))
        right = choice != "" and choice == _as_text(item.get("ground_truth", ""))
        scores.append({"overall": float(right), "accuracy": float(right)})
    return scores

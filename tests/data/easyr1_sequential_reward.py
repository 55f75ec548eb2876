"""A reward file in EasyR1's format (sequential) whose function is `main`, the name EasyR1 calls when
worker.reward.reward_function names no function.

    accuracy = 1 if mathruler accepts the text after the last "=" against the ground truth, else 0
    overall  = accuracy + length_bonus * response_length
"""

from mathruler.grader import grade_answer


REWARD_NAME = "sequential_main"
REWARD_TYPE = "sequential"


def main(reward_input: dict, length_bonus: float = 0.0) -> dict[str, float]:
    answer = reward_input["response"].rsplit("=", 1)[-1].strip()
    accuracy = 1.0 if grade_answer(answer, reward_input["ground_truth"]) else 0.0
    return {"overall": accuracy + length_bonus * reward_input["response_length"], "accuracy": accuracy}

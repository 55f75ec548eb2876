"""A reward file in EasyR1's format (batch): graded with mathruler, normalised over the batch it is called with.

accuracy   = 1 if mathruler accepts the last \\boxed{} against the ground truth, else 0
overall    = scale * (accuracy - mean accuracy of the batch)
batch_size = the number of responses in the call (a batch function must see the whole batch, as in EasyR1)
"""

from mathruler.grader import extract_boxed_content, grade_answer


REWARD_NAME = "batch_normalised"
REWARD_TYPE = "batch"


def compute_score(reward_inputs: list[dict], scale: float = 1.0) -> list[dict[str, float]]:
    accuracies = [
        1.0 if grade_answer(extract_boxed_content(item["response"]), item["ground_truth"]) else 0.0
        for item in reward_inputs
    ]
    mean = sum(accuracies) / len(accuracies)
    return [
        {"overall": scale * (accuracy - mean), "accuracy": accuracy, "batch_size": float(len(reward_inputs))}
        for accuracy in accuracies
    ]

"""Reward of the trainer tests: the share of response tokens that start a new word, read off the decoded text.

    word_share = min(1, whitespace-separated words / response tokens)
    overall    = word_share

A sub-word piece or a whitespace-only token adds no word, so a policy earns more by choosing word-initial tokens
(those with a leading space). A random model's choice is a coin flip weighted by the vocabulary, which gives
GRPO groups with different scores from the first step: a signal that a tiny model can learn from quickly.
"""

REWARD_TYPE = "batch"


def compute_score(reward_inputs: list[dict]) -> list[dict]:
    scores = []
    for item in reward_inputs:
        words = len(item["response"].split())
        share = min(1.0, words / max(int(item["response_length"]), 1))
        scores.append({"overall": share, "word_share": share})
    return scores

"""The r1v reward (reward_function/r1v.py: half format, half a correct answer) for multi-turn rollouts with tools:
scored on the model's LAST turn, so that calling a tool before answering costs nothing.

A multi-turn response holds every turn and the tool messages between them (the reward function reads it whole), which
r1v's format rule (`<think>...</think><answer>...</answer>` and nothing else) would never accept once a tool was
called. Here the final assistant message of `messages` is scored instead; a single-turn response (no `messages`) is
scored as r1v scores it.
"""

import importlib.util
from pathlib import Path


REWARD_NAME = "r1v_tools"
REWARD_TYPE = "sequential"

_spec = importlib.util.spec_from_file_location("easyrl_reward_r1v_base", Path(__file__).with_name("r1v.py"))
_r1v = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_r1v)


def final_answer_text(reward_input: dict) -> str:
    """The last assistant message of a multi-turn trajectory, else the whole response."""
    turns = [m for m in reward_input.get("messages") or [] if m.get("role") == "assistant"]
    return turns[-1]["content"] if turns else reward_input["response"]


def compute_score(reward_input: dict, format_weight: float = 0.5) -> dict[str, float]:
    return _r1v.compute_score({**reward_input, "response": final_answer_text(reward_input)}, format_weight)

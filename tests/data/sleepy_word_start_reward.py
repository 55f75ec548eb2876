"""The trainer tests' word-share reward (word_start_reward.py), made slow: each call first sleeps `sleep_s` seconds
(worker.reward.reward_function_kwargs), as a slow verifier would. The scores are word_start_reward's, so a run with
it samples and trains exactly as a run with word_start_reward does."""

import importlib.util
import time
from pathlib import Path


_spec = importlib.util.spec_from_file_location("word_start_reward", Path(__file__).with_name("word_start_reward.py"))
_word_start = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_word_start)

REWARD_TYPE = "batch"


def compute_score(reward_inputs: list[dict], sleep_s: float = 0.0) -> list[dict]:
    time.sleep(sleep_s)
    return _word_start.compute_score(reward_inputs)

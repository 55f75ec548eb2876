"""Where user reward code runs: `score_chunk` calls the function and turns its failures into data, and
`RewardActor` is the Ray actor that holds one loaded function.

A failure of the function (an exception) scores the affected samples 0 and is reported back with its traceback,
so training goes on. A malformed return value is a bug in the reward file: it is reported as `fatal` and the
driver raises it.
"""

import traceback
from dataclasses import dataclass

import ray

from .loader import RewardFunction, RewardFunctionError, load_reward_function


@dataclass
class ChunkResult:
    scores: list  # one dict[str, float] per input, None where the function failed
    num_errors: int = 0
    traceback: str | None = None  # of the first failure
    fatal: str | None = None  # a RewardFunctionError message: stop training
    timed_out: bool = False


def score_chunk(reward_fn: RewardFunction, inputs: list[dict]) -> ChunkResult:
    """Score `inputs`; batch functions fail as a whole, sequential ones per sample."""
    calls = [inputs] if reward_fn.reward_type == "batch" else [[item] for item in inputs]
    result = ChunkResult(scores=[])
    for call in calls:
        try:
            result.scores.extend(reward_fn.score(call))
        except RewardFunctionError as err:
            return ChunkResult(scores=[None] * len(inputs), num_errors=len(inputs), fatal=str(err))
        except Exception:  # noqa: BLE001 - any exception of user code scores 0 and is reported
            result.scores.extend([None] * len(call))
            result.num_errors += len(call)
            if result.traceback is None:
                result.traceback = traceback.format_exc()
    return result


@ray.remote
class RewardActor:
    """Holds one reward function; `score` runs in the actor's main thread (so signal-based timeouts work)."""

    def __init__(self, spec: str, kwargs: dict):
        self.reward_fn = load_reward_function(spec, kwargs)

    def ready(self) -> bool:
        return True

    def score(self, inputs: list[dict]) -> ChunkResult:
        return score_chunk(self.reward_fn, inputs)

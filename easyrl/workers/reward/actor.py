"""Where user reward code runs: `score_calls` calls the function and turns its failures into data, and
`RewardActor` is the Ray actor that holds one loaded function and streams the outcome of each call back.

A sample scores 0 and carries a `SampleFailure` when the function raised on it (any exception, `sys.exit`
included), returned a NaN or infinite score (in `overall` or any named score), was not scored before the batch's
deadline, or was being scored when the actor's process died (`os._exit`, a crash, the OOM killer); the last two are
decided by the pool. A malformed return value is a bug in the reward file: it is reported as `fatal` and the driver
raises it.
"""

import math
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field

import ray

from .loader import CombinedReward, RewardFunction, RewardFunctionError, load_reward_function


# why a sample scores 0
RAISED = "raised"
NON_FINITE = "non-finite"
TIMED_OUT = "timed out"
DIED = "died"
NO_SCORE = "no score"  # every function returned None for it (TRL's "does not apply"): the sample has no reward


@dataclass(frozen=True)
class SampleFailure:
    kind: str  # RAISED, NON_FINITE, TIMED_OUT, DIED or NO_SCORE
    detail: str  # the traceback, the offending scores, or what happened to the actor


@dataclass
class Scored:
    """The outcome of scoring some samples: one call of the function, a chunk, or a whole batch."""

    scores: list[dict[str, float] | None] = field(default_factory=list)  # None where the sample scores 0
    failures: list[SampleFailure | None] = field(default_factory=list)  # why, where it scores 0
    fatal: str | None = None  # a RewardFunctionError message: stop training
    fatal_index: int | None = None  # the sample the fatal message is about, where it is about one

    def __len__(self) -> int:
        return len(self.scores)


def failed(size: int, failure: SampleFailure) -> Scored:
    return Scored(scores=[None] * size, failures=[failure] * size)


def merge(parts: list[Scored]) -> Scored:
    """The parts one after another; the first fatal message wins."""
    merged = Scored()
    for part in parts:
        if merged.fatal is None and part.fatal is not None:
            merged.fatal = part.fatal
            merged.fatal_index = None if part.fatal_index is None else len(merged.scores) + part.fatal_index
        merged.scores.extend(part.scores)
        merged.failures.extend(part.failures)
    return merged


def _non_finite(score: dict[str, float]) -> SampleFailure | None:
    # a NaN reward makes every later update non-finite (and skipped): it is an error of its sample, not a score
    bad = [f"{name}={value}" for name, value in score.items() if not math.isfinite(value)]
    return SampleFailure(NON_FINITE, ", ".join(bad)) if bad else None


def _score_call(reward_fn: RewardFunction | CombinedReward, call: list[dict]) -> Scored:
    try:
        scores, applies = reward_fn.scored(call)
    except RewardFunctionError as err:
        about = getattr(err, "item", None)
        index = next((i for i, item in enumerate(call) if item is about), None) if about is not None else None
        return Scored(scores=[None] * len(call), failures=[None] * len(call), fatal=str(err), fatal_index=index)
    except (Exception, SystemExit):  # noqa: BLE001 - any failure of user code (sys.exit too) scores 0, reported
        return failed(len(call), SampleFailure(RAISED, traceback.format_exc()))
    unscored = SampleFailure(NO_SCORE, "returned None (TRL's convention: the function does not apply to it)")
    failures = [_non_finite(score) if applied else unscored for score, applied in zip(scores, applies)]
    return Scored(scores=[None if f else s for s, f in zip(scores, failures)], failures=failures)


def score_calls(reward_fn: RewardFunction | CombinedReward, inputs: list[dict]) -> Iterator[Scored]:
    """Score `inputs`, yielding the outcome of each call: one for a batch function (it fails as a whole), one per
    sample for a sequential one. Stops after a fatal outcome."""
    calls = [inputs] if reward_fn.whole_batch else [[item] for item in inputs]
    for call in calls:
        outcome = _score_call(reward_fn, call)
        yield outcome
        if outcome.fatal:
            return


@ray.remote
class RewardActor:
    """Holds one reward function. `score` runs in the actor's main thread (so signal-based timeouts, e.g.
    math-verify's, work) and is a streaming generator: the driver receives each call's outcome as soon as it
    exists, so the samples scored before a call hangs keep their scores."""

    def __init__(self, spec: str, kwargs: dict, weights: list[float] | None = None, reward_type: str | None = None):
        self.reward_fn = load_reward_function(spec, kwargs, weights, reward_type)

    def ready(self) -> bool:
        return True

    def score(self, inputs: list[dict]) -> Iterator[Scored]:
        yield from score_calls(self.reward_fn, inputs)

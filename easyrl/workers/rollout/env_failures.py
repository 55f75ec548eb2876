"""Stopping a run whose environment (``worker.rollout.multi_turn.env``) fails on every trajectory.

    watch = EnvFailureWatch(config.worker.rollout.multi_turn.env)
    watch.check(batch.non_tensor_batch.pop(ENV_ERROR_KEY), batch.non_tensor_batch[MULTI_TURN_COUNTS])

A failed ``__init__``, ``reset``, ``step`` or ``get_reward`` ends its trajectory with environment reward 0 and the
step goes on (a passing fault of one trajectory must not end a run). An environment that failed on every trajectory
of the run so far, or on every trajectory of ENV_FAILED_STREAK batches in a row, is broken (an ``__init__`` that needs
an argument, a ``step`` that always raises): nothing is learnt from its zeros, so the run stops with its first error,
as it does for a reward function that raises on every sample (scorer.py). Timeouts alone may pass (a slow service), so
they stop it only in a row.
"""

from collections.abc import Sequence
from typing import Any, Optional

from ..reward.loader import FAILED_BATCH_STREAK
from ..tool_files import ENV_KEY


ENV_ERROR_KEY = "env_error"  # per-trajectory non-tensor: its environment's first error (None where none failed)
ENV_FAILED_STREAK = FAILED_BATCH_STREAK  # batches in a row failing on every trajectory that stop a run which worked


class EnvironmentFailedError(RuntimeError):
    """The environment failed on every trajectory: the run stops (exit 2) with its first error."""


class EnvFailureWatch:
    def __init__(self, env: Any) -> None:
        self.env = env  # as the config names it, for the message
        self.worked_once = False  # some trajectory of some batch ran without an environment error
        self.streak = 0  # batches in a row where every trajectory's environment failed

    def check(self, errors: Sequence[Optional[str]], counts: Sequence[dict] | None = None) -> None:
        """``errors``: each trajectory's first environment error (None where it had none); ``counts``: each one's
        multi-turn counts (``env_errors``, ``env_timeouts``), which say whether all its failures were timeouts."""
        if not len(errors) or any(error is None for error in errors):
            self.worked_once = self.worked_once or bool(len(errors))
            self.streak = 0
            return
        self.streak += 1
        only_timeouts = counts is not None and all(c["env_timeouts"] >= c["env_errors"] for c in counts)
        if self.streak < ENV_FAILED_STREAK and (self.worked_once or only_timeouts):
            return
        when = "of the run so far" if self.streak < ENV_FAILED_STREAK else f"of {ENV_FAILED_STREAK} batches in a row"
        raise EnvironmentFailedError(
            f"The environment `{ENV_KEY}` ({self.env}) failed on every trajectory {when} ({len(errors)} in the last "
            f"batch), so every trajectory's environment reward is 0 and nothing can be learnt. The first error: "
            f"{errors[0]}. Fix the environment (README 'Environments': built with no arguments, reset(row), "
            "step(text) returning (observation, reward, done))."
        )

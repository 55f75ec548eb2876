"""A sequence-classification reward model as the judge (`worker.reward.judge.kind=classifier`), seen from the driver.

The model itself lives in the training workers (``easyrl/workers/reward_model.py``: a frozen FSDP2 module beside
the reference, on the same devices). This side sends each batch's texts there and turns the raw scores into judge
scores, with the same submit/collect interface as the other judges, so that the reward model scores while the rule
reward is scored:

    judge = ClassifierJudge(config.worker.reward.judge, reward_model_group)
    pending = judge.submit(prompts, reward_inputs)   # queued on the workers at once, before the log-prob passes
    verdicts = judge.collect(pending)                # list[JudgeResult]; combine_scores joins them with the rule's

The raw score r of a reward model is unbounded (Skywork-Reward-style models score roughly -30..30); the judge score
is `score_transform` of it: sigmoid(score_scale x (r - score_offset)) (default, in (0, 1) like the text judges'
scores) or score_scale x (r - score_offset). A non-finite raw score (a broken checkpoint, an fp16 overflow) scores 0
and counts in reward/judge_errors, logged once.
"""

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...protocol import DataProto, as_object_array
from .judge import JudgeFailure, JudgeResult, sample_label


if TYPE_CHECKING:
    from ...config.schema import JudgeConfig

logger = logging.getLogger(__name__)

NON_FINITE = "non-finite score"
SCORE_TRANSFORMS = ("sigmoid", "linear")


def reward_model_score(raw: float, transform: str, scale: float, offset: float) -> float:
    """The judge score of a raw reward-model score (see the module docstring)."""
    z = scale * (raw - offset)
    if transform == "linear":
        return z
    if transform != "sigmoid":
        raise ValueError(f"Unknown worker.reward.judge.score_transform `{transform}`; use one of {SCORE_TRANSFORMS}.")
    # written per sign so that exp never overflows
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


class ClassifierJudge:
    """Scores batches with the reward model in the worker group that ``reward_model_group()`` returns (a callable:
    after a restart of the workers it returns the new group)."""

    def __init__(self, config: "JudgeConfig", reward_model_group: Callable[[], Any]):
        self.config = config
        self.reward_model_group = reward_model_group
        self._logged = False
        self._described = False  # the first batch's raw scores are logged once, to help choose scale and offset

    def submit(self, prompts: Sequence, inputs: Sequence[dict]) -> Any:
        """Queue one batch on the workers (`prompts[i]` with the reward input `inputs[i]`); returns their pending
        answer. The workers run calls in the order the driver makes them: this one before the log-prob passes the
        trainer starts next."""
        if len(prompts) != len(inputs):
            raise ValueError(f"{len(prompts)} prompts for {len(inputs)} responses.")
        texts = DataProto.from_dict(
            non_tensors={
                "rm_prompts": as_object_array(list(prompts)),  # text, or a prompt's messages
                "rm_responses": np.array([item["response"] for item in inputs], dtype=object),
            }
        )
        return self.reward_model_group().compute_rm_scores(texts)

    def collect(self, pending: Any, places: Any = None) -> list[JudgeResult]:
        """The verdicts of a submitted batch, in order; raises what the workers raised."""
        raw_scores = pending.get().batch["rm_scores"].tolist()
        config = self.config
        verdicts = []
        for raw in raw_scores:
            if not math.isfinite(raw):
                verdicts.append(JudgeResult(0.0, JudgeFailure(NON_FINITE, f"the reward model scored {raw}")))
                continue
            score = reward_model_score(raw, config.score_transform, config.score_scale, config.score_offset)
            verdicts.append(JudgeResult(score, None, None))
        finite = [raw for raw in raw_scores if math.isfinite(raw)]
        if finite and not self._described:
            self._described = True
            logger.info(
                "Reward model %s: raw scores of the first batch: min %.4g, mean %.4g, max %.4g; judge scores (%s, "
                "score_scale %g, score_offset %g): mean %.4g.",
                config.model_path,
                min(finite),
                sum(finite) / len(finite),
                max(finite),
                config.score_transform,
                config.score_scale,
                config.score_offset,
                sum(verdict.score for verdict in verdicts) / len(verdicts),
            )
        failed = [i for i, verdict in enumerate(verdicts) if verdict.failure is not None]
        if failed and not self._logged:
            self._logged = True
            logger.warning(
                "Reward model %s: %s got a non-finite raw score; %d of %d samples of this batch get judge "
                "score 0 (counted in reward/judge_errors; logged once).",
                config.model_path,
                sample_label(failed[0], places),
                len(failed),
                len(verdicts),
            )
        return verdicts

    def score(self, prompts: Sequence[str], inputs: Sequence[dict]) -> list[JudgeResult]:
        return self.collect(self.submit(prompts, inputs))

    def close(self) -> None:
        """Nothing to close: the reward model goes with the worker group."""

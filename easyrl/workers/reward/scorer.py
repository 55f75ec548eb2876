"""Scoring a batch of rollouts with the user's reward function (`worker.reward`).

    scorer = RewardScorer(config.worker.reward, tokenizer)
    token_level_scores, reward_metrics = scorer.score(batch)   # (batch, response_len), {"reward/<name>": [...]}
    batch.batch["token_level_scores"] = token_level_scores
    batch.non_tensor_batch.update(scores_to_non_tensor(reward_metrics))   # `overall`, `accuracy`... per sample
    metrics.update(reduce_reward_metrics(reward_metrics))       # reward/overall, reward/accuracy, ..., reward/errors

Responses are decoded here and scored with EasyR1's calling convention: a `batch` function is called ONCE with
the whole batch (so a function that normalises over the batch sees what it sees in EasyR1), a `sequential`
function once per response. With `worker.reward.num_cpus` >= 1 the calls run in Ray actors under a timeout
(`worker.reward.timeout_s` per call): a batch function in one actor holding `num_cpus` CPUs (EasyR1's meaning of
the key), a sequential function's responses spread in chunks over `num_cpus` one-CPU actors. With 0 they run in
this process, without the timeout. Each sample's `overall` score is placed on its last response token (EasyR1's
place). A sample whose scoring raised or timed out scores 0 and is counted in `reward/errors` (a batch call that
fails fails for the whole batch); the first traceback (and the first timeout) is logged once.
"""

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from .actor import ChunkResult, score_chunk
from .loader import RewardFunctionError, load_reward_function


if TYPE_CHECKING:
    from ...config import RewardConfig
    from ...protocol import DataProto

logger = logging.getLogger(__name__)

PREFIX = "reward/"
ERRORS_KEY = "reward/errors"  # per-sample 1.0 where scoring failed (raised or timed out)


def reduce_reward_metrics(reward_metrics: dict[str, list[float]]) -> dict[str, float]:
    """Mean of every named score; `reward/errors` is the number of failed samples (a mean would be their share)."""
    reduced = {key: float(np.mean(values)) for key, values in reward_metrics.items() if values}
    reduced[ERRORS_KEY] = float(np.sum(reward_metrics.get(ERRORS_KEY, [0.0])))
    return reduced


def scores_to_non_tensor(reward_metrics: dict[str, list[float]]) -> dict[str, np.ndarray]:
    """Per-sample named scores as non-tensor arrays keyed by the bare name (`overall`, `accuracy`...), e.g. for
    online filtering by `algorithm.filter_key`."""
    return {
        key[len(PREFIX) :]: np.asarray(values, dtype=np.float64)
        for key, values in reward_metrics.items()
        if key.startswith(PREFIX) and key != ERRORS_KEY
    }


class RewardScorer:
    def __init__(
        self,
        config: "RewardConfig",
        tokenizer,
        actor_num_cpus: float = 1.0,
        chunks_per_actor: int = 4,
    ):
        if not config.reward_function:
            raise RewardFunctionError("`worker.reward.reward_function` is not set; give path/to/file.py:function.")
        self.config = config
        self.tokenizer = tokenizer
        self.chunks_per_actor = chunks_per_actor
        # loading here first reports a broken file at once, with the driver's traceback
        self.reward_fn = load_reward_function(config.reward_function, config.reward_function_kwargs)
        logger.info(self.reward_fn.describe())
        self.pool = None
        if config.num_cpus > 0:
            from .pool import RewardActorPool

            # a batch function runs as one call: one actor with all the CPUs; sequential calls spread over actors
            whole_batch = self.reward_fn.reward_type == "batch"
            self.pool = RewardActorPool(
                config.reward_function,
                config.reward_function_kwargs,
                num_actors=1 if whole_batch else config.num_cpus,
                timeout_s=config.timeout_s,
                actor_num_cpus=actor_num_cpus * config.num_cpus if whole_batch else actor_num_cpus,
            )
            self.pool.wait_ready()
        self._logged_exception = False
        self._logged_timeout = False

    def build_inputs(self, data: "DataProto") -> list[dict]:
        """The reward function's inputs: decoded `response`, its `response_length` in tokens, the `ground_truth`."""
        if "ground_truth" not in data.non_tensor_batch:
            raise KeyError(
                "The batch has no non-tensor `ground_truth`; the dataset's answer column (`data.answer_key`) feeds it."
            )
        responses = data.batch["responses"]  # (batch, response_len), right-padded
        lengths = data.batch["response_mask"].sum(-1).long().tolist()
        ids = [row[:length].tolist() for row, length in zip(responses, lengths)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=self.config.skip_special_tokens)
        truths = data.non_tensor_batch["ground_truth"]
        return [
            {"response": text, "response_length": length, "ground_truth": truth}
            for text, length, truth in zip(texts, lengths, truths)
        ]

    def score_inputs(self, inputs: list[dict]) -> tuple[list[dict[str, float]], list[float]]:
        """Per-sample score dicts (failed samples: {"overall": 0.0}) and per-sample error flags."""
        if self.pool is None:
            results = [score_chunk(self.reward_fn, inputs)]
        elif self.reward_fn.reward_type == "batch":
            results = self.pool.run([inputs])
        else:
            num_chunks = max(1, min(len(inputs), self.config.num_cpus * self.chunks_per_actor))
            splits = np.array_split(np.arange(len(inputs)), num_chunks)
            results = self.pool.run([[inputs[i] for i in split] for split in splits if len(split)])
        scores: list[dict[str, float]] = []
        errors: list[float] = []
        for result in results:
            self._report(result)
            scores.extend(score if score is not None else {"overall": 0.0} for score in result.scores)
            errors.extend(0.0 if score is not None else 1.0 for score in result.scores)
        return scores, errors

    def _report(self, result: ChunkResult) -> None:
        if result.fatal:
            raise RewardFunctionError(result.fatal)
        if result.timed_out and not self._logged_timeout:
            self._logged_timeout = True
            logger.warning(
                "Reward function %s %s; its %d samples score 0 and the reward actor was replaced "
                "(counted in reward/errors; logged once).",
                self.reward_fn.where,
                result.traceback,
                result.num_errors,
            )
        elif result.num_errors and not result.timed_out and not self._logged_exception:
            self._logged_exception = True
            logger.warning(
                "Reward function %s raised; the affected samples score 0 (counted in reward/errors; logged once):\n%s",
                self.reward_fn.where,
                result.traceback,
            )

    def score(self, data: "DataProto") -> tuple[torch.Tensor, dict[str, list[float]]]:
        """(token_level_scores (batch, response_len) with `overall` on each last response token, per-sample
        metrics {"reward/<score name>": [value per sample], "reward/errors": [1.0 where scoring failed]})."""
        inputs = self.build_inputs(data)
        scores, errors = self.score_inputs(inputs)
        responses = data.batch["responses"]
        token_level_scores = torch.zeros(responses.shape, dtype=torch.float32)
        last = (data.batch["response_mask"].sum(-1).long() - 1).clamp(min=0).cpu()
        overall = torch.tensor([score["overall"] for score in scores], dtype=torch.float32)
        token_level_scores[torch.arange(len(scores)), last] = overall
        names = list(dict.fromkeys(name for score in scores for name in score))
        reward_metrics = {PREFIX + name: [score.get(name, 0.0) for score in scores] for name in names}
        reward_metrics[ERRORS_KEY] = errors
        return token_level_scores.to(responses.device), reward_metrics

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

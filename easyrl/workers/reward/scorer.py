"""Scoring a batch of rollouts with the user's reward function (`worker.reward`).

    scorer = RewardScorer(config.worker.reward, tokenizer)
    token_level_scores, reward_metrics = scorer.score(batch)   # (batch, response_len), {"reward/<name>": [...]}
    batch.batch["token_level_scores"] = token_level_scores
    batch.non_tensor_batch.update(scores_to_non_tensor(reward_metrics))   # `overall`, `accuracy`... per sample
    metrics.update(reduce_reward_metrics(reward_metrics))       # reward/overall, reward/accuracy, ..., reward/errors

    pending = scorer.score_async(batch)   # decodes, then scores in the scorer's thread while the caller goes on
    token_level_scores, reward_metrics = pending.result()       # what score returns; pending.seconds: its wall time

Responses are decoded here and scored with EasyR1's calling convention: a `batch` function is called ONCE with
the whole batch (so a function that normalises over the batch sees what it sees in EasyR1), a `sequential`
function once per response. The calls run in Ray actors (as in EasyR1, where the reward manager is an actor holding
`worker.reward.num_cpus` CPUs): a batch function in one actor holding `num_cpus` CPUs, a sequential function's
responses spread in chunks over `num_cpus` one-CPU actors; 0 is one actor that reserves no CPU. The whole batch is
scored within `worker.reward.timeout_s` (see pool.py). Each sample's `overall` score is placed on its last response
token (EasyR1's place). A sample scores 0 and is counted in `reward/errors` when the function raised on it (a batch
call that fails fails for the whole batch), returned a NaN or infinite score, was not scored by the deadline (also
counted in `reward/timeouts`), or its actor's process died; the first failure of each kind is logged once, with
the sample's index in its batch. A function that raised (or gave NaN) on every sample it was given so far, or that
scored no sample of ALL_RAISED_STREAK batches in a row (whatever failed, the deadline included), stops the run
(RewardFunctionError): nothing can be learnt from zeros, and such a failure is a bug, a data mismatch (e.g. a number
where the function expects a string) or a timeout too short for the batches, not a passing fault.

Scoring runs in one thread of the driver, one batch after another in the order they were handed over, so that the
trainer can score a batch while the workers compute log-probs (`worker.reward.overlap`); `score` is `score_async`
waited for at once. The deadline runs from the start of a batch's scoring, not from when it was handed over.
"""

import logging
import math
import threading
import time
from collections import Counter
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...data.dataset import ROW_PLACE_KEY, row_prompt
from ...data.template import RESET_CONTENT, is_chat_messages, with_reset_content
from .actor import DIED, NO_SCORE, NON_FINITE, RAISED, TIMED_OUT, SampleFailure, merge, score_calls
from .classifier import ClassifierJudge
from .judge import HttpJudge, combine_scores, decode_prompts, judge_prompts
from .loader import (
    FAILED_BATCH_STREAK,
    RESERVED_SCORE_NAMES,
    TRL_REWARD_TYPE,
    VERL_REWARD_TYPE,
    CombinedReward,
    RewardFunction,
    RewardFunctionError,
    load_reward_function,
    short_repr,
)
from .pool import RewardActorPool


if TYPE_CHECKING:
    from ...config import RewardConfig
    from ...protocol import DataProto

logger = logging.getLogger(__name__)

PREFIX = "reward/"
ROW_FIELDS = ("ground_truth", "data_source", "extra_info", "conversational", "row_columns")
"""The non-tensor fields of a batch's rows that `build_inputs` reads (the last three for verl's and TRL's calls)."""
ALL_RAISED_STREAK = FAILED_BATCH_STREAK  # batches in a row raising on every sample that stop a run which scored before
ENV_REWARD_SCORE = "env_reward"  # a tool environment's get_reward(), added to overall: reward/env_reward
ERRORS_KEY = PREFIX + "errors"  # per-sample 1.0 where scoring failed (raised, non-finite, timed out, actor died)
# a batch's meta_info key naming the metric its failures are counted in, when not reward/errors (ReMax's baselines)
COUNTED_IN_KEY = "reward_failures_counted_in"
TIMEOUTS_KEY = PREFIX + "timeouts"  # per-sample 1.0 where the batch's deadline passed before it was scored
JUDGE_ERRORS_KEY = PREFIX + "judge_errors"  # per-sample 1.0 where the judge gave no score (only with a judge)
# reduced to a count of samples, not a mean
COUNT_KEYS = tuple(PREFIX + name for name in RESERVED_SCORE_NAMES) + (JUDGE_ERRORS_KEY,)


def reduce_reward_metrics(reward_metrics: dict[str, list[float]]) -> dict[str, float]:
    """Mean of every named score over the samples that have it (NaN where a sample was scored without it: EasyR1 and
    TRL average a score over the samples that return it); `reward/errors` and `reward/timeouts` are numbers of samples
    (a mean would be their share)."""
    reduced = {key: float(np.nanmean(values)) for key, values in reward_metrics.items() if not np.isnan(values).all()}
    for key in COUNT_KEYS:
        if key != JUDGE_ERRORS_KEY or key in reward_metrics:  # no judge, no judge count
            reduced[key] = float(np.sum(reward_metrics.get(key, [0.0])))
    return reduced


def failed_samples(reward_metrics: dict[str, list[float]], size: int) -> list[bool]:
    """Per sample: the reward failed on it (`reward/errors`) or its judge gave no grade (`reward/judge_errors`), so
    its score is no answer's score."""
    none = [0.0] * size
    return [
        bool(a or b) for a, b in zip(reward_metrics.get(ERRORS_KEY, none), reward_metrics.get(JUDGE_ERRORS_KEY, none))
    ]


def named_scores(reward_metrics: dict[str, list[float]]) -> dict[str, np.ndarray]:
    """Per-sample named scores keyed by the bare name (`overall`, `accuracy`...), NaN for a sample scored without
    that score (a TRL function's None, a part of a combined reward the sample did not get)."""
    return {
        key[len(PREFIX) :]: np.asarray(values, dtype=np.float64)
        for key, values in reward_metrics.items()
        if key.startswith(PREFIX) and key not in COUNT_KEYS
    }


def scores_to_non_tensor(reward_metrics: dict[str, list[float]]) -> dict[str, np.ndarray]:
    """``named_scores`` as non-tensor arrays, e.g. for online filtering by `algorithm.filter_key`; a sample scored
    without that score has 0 (what it added to `overall`)."""
    return {name: np.nan_to_num(values, nan=0.0) for name, values in named_scores(reward_metrics).items()}


def _failed_environments_hint(inputs: list[dict]) -> str:
    """What to tell a function that raised on a batch in which some tool environments' reset failed: their samples'
    `environments` entry is None (the instance was dropped), which a function reading `env.<attribute>` trips on."""
    failed = sum("environments" in item and item["environments"] is None for item in inputs)
    if not failed:
        return ""
    return (
        f" {failed} sample(s) of the batch have None in `environments`: their tool environment's reset failed (counted "
        "in rollout/multi_turn/env_errors) and the instance was dropped; a function that reads env.<attribute> must "
        "skip them (`if env is None`)."
    )


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


class ScoringCancelled(RuntimeError):
    """Raised by `PendingScores.result` after `cancel`."""


class PendingScores:
    """A batch being scored (`RewardScorer.score_async`). `result()` waits for what `RewardScorer.score` returns (and
    raises what it raises); `seconds` is then the scoring's wall time: decoding plus scoring, without the time it
    waited behind earlier batches."""

    def __init__(self, future: Future, decode_s: float, cancel_event: threading.Event):
        self._future = future  # of (what score returns, seconds the scoring took)
        self._decode_s = decode_s
        self._cancel_event = cancel_event
        self._scoring_s = 0.0

    @property
    def seconds(self) -> float:
        return self._decode_s + self._scoring_s

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> tuple[torch.Tensor, dict[str, list[float]]]:
        try:
            scored, self._scoring_s = self._future.result()
        except CancelledError:  # cancelled before its turn came
            raise ScoringCancelled("The scoring of this batch was cancelled; its scores are not known.") from None
        return scored

    def cancel(self) -> None:
        """Give the scores up: a batch still waiting is never scored; one being scored stops within
        `pool.CANCEL_POLL_S`, its busy reward actors replaced. `result()` then raises `ScoringCancelled`."""
        self._cancel_event.set()
        self._future.cancel()


class RewardScorer:
    def __init__(
        self,
        config: "RewardConfig",
        tokenizer,
        *,  # keyword-only: a positional `True` once meant `actor_num_cpus`, starting Ray where in-process was meant
        actor_num_cpus: float = 1.0,
        chunks_per_actor: int = 4,
        in_process: bool = False,
        run_dir: str | None = None,
        reward_model_group=None,
        answer_key: str | None = None,
        prompt_key: str | None = None,
        reward_fn: RewardFunction | CombinedReward | None = None,
    ):
        """`in_process=True` calls the function in this process, with no deadline and no protection from a
        function that hangs or exits the process: for tests and tools that run without Ray, never for training.
        `reward_model_group`: a callable returning the worker group that hosts the reward model (judge kind
        `classifier`; the current group, also after a restart of the workers).
        `run_dir`: the run's folder; logs/judge_engine_0.log in it gets the output of a `vllm` judge's engine
        (None: it stays on the console). `answer_key`: data.answer_key, the column name a function written for TRL
        gets the answers under; `prompt_key`: data.prompt_key, whose chat messages such a function gets as `prompts` (as
        TRL passes conversational prompts). `reward_fn`: the function of `config`, when the driver has loaded it already
        (None: it is loaded here)."""
        if not config.reward_function:
            raise RewardFunctionError("`worker.reward.reward_function` is not set; give path/to/file.py:function.")
        self.config = config
        self.tokenizer = tokenizer
        self.answer_key = answer_key
        self.prompt_key = prompt_key
        self.chunks_per_actor = chunks_per_actor
        # loading on the driver first reports a broken file at once, with the driver's traceback
        self.reward_fn = reward_fn or load_reward_function(
            config.reward_function, config.reward_function_kwargs, config.reward_weights, config.reward_type
        )
        logger.info(self.reward_fn.describe())
        # worker.reward.judge (see judge.py): asked from here, while the rule reward is scored
        self.judge = None
        if config.judge.kind == "http":
            self.judge = HttpJudge(config.judge)
        elif config.judge.kind == "vllm":
            # imported here: the engine's module loads vLLM's and peft's helpers, seconds the driver of a run
            # without a vllm judge need not spend
            from .judge_engine import VllmJudge

            self.judge = VllmJudge(config.judge, run_dir=run_dir)
        if config.judge.kind == "classifier":  # the reward model runs in the training workers (reward_model.py)
            if reward_model_group is None:
                raise ValueError("judge kind `classifier` needs the worker group that hosts the reward model.")
            self.judge = ClassifierJudge(config.judge, reward_model_group)
        self.pool = None
        if not in_process:
            # a batch function runs as one call: one actor with all the CPUs; sequential calls spread over actors.
            # num_cpus 0 (EasyR1: an actor that reserves no CPU) is one actor reserving none, under the same deadline.
            whole_batch = self.reward_fn.whole_batch
            self.pool = RewardActorPool(
                config.reward_function,
                config.reward_function_kwargs,
                weights=config.reward_weights,
                reward_type=config.reward_type,
                num_actors=1 if whole_batch else max(1, config.num_cpus),
                timeout_s=config.timeout_s,
                actor_num_cpus=actor_num_cpus * (config.num_cpus if whole_batch else min(1, config.num_cpus)),
            )
            self.pool.wait_ready()
        # one thread: the pool scores one batch at a time, and a reward function sees batches in the order given
        self._executor = None if in_process else ThreadPoolExecutor(1, thread_name_prefix="reward-scoring")
        self._pending: list[PendingScores] = []
        self._logged: set[str] = set()  # the failure kinds already logged (each is logged once)
        self._scored_once = False  # some sample of some batch was scored
        self._all_raised_streak = 0  # batches in a row where the function raised on every sample

    def build_inputs(self, data: "DataProto") -> list[dict]:
        """The reward function's inputs: decoded `response`, its `response_length` in tokens, the `ground_truth`."""
        if "ground_truth" not in data.non_tensor_batch:
            raise KeyError(
                "The batch has no non-tensor `ground_truth`; the dataset's answer column (`data.answer_key`) feeds it."
            )
        responses = data.batch["responses"]  # (batch, response_len), right-padded
        # every response token, the tool results of a multi-turn rollout included (response_mask marks only the
        # model's tokens; for a single turn both are the same)
        attended = (
            data.batch["attention_mask"][:, -responses.shape[-1] :]
            if "attention_mask" in data.batch.keys()
            else data.batch["response_mask"]  # a batch of responses alone (tests, scoring outside a rollout)
        )
        lengths = attended.sum(-1).long().tolist()
        ids = [row[:length].tolist() for row, length in zip(responses, lengths)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=self.config.skip_special_tokens)
        truths = data.non_tensor_batch["ground_truth"]
        inputs = [
            {"response": text, "response_length": length, "ground_truth": truth}
            for text, length, truth in zip(texts, lengths, truths)
        ]
        if self.reward_fn.uses(TRL_REWARD_TYPE):  # what TRL hands a reward function besides completions
            prompts = decode_prompts(data, self.tokenizer, self.config.skip_special_tokens)
            flags = data.non_tensor_batch.get("conversational", [None] * len(inputs))
            rows = data.non_tensor_batch.get("row_columns", [None] * len(inputs))
            resets = data.non_tensor_batch.get(RESET_CONTENT, [None] * len(inputs))
            for item, prompt, completion_ids, flag, row, reset in zip(inputs, prompts, ids, flags, rows, resets):
                written = row_prompt(row, self.prompt_key) if row and self.prompt_key else None
                if flag and is_chat_messages(written):  # TRL passes a conversational prompt as its messages
                    prompt = with_reset_content(list(written), reset)
                elif not flag and isinstance(written, str) and (reset is None or isinstance(reset, str)):
                    # and a text prompt as the row holds it (no chat template, no format_prompt), a reset's text
                    # added at its end as the policy's prompt got it (one form for the rows of a batch whether their
                    # reset wrote text or not)
                    prompt = written + (reset or "")
                item.update(prompt=prompt, completion_ids=completion_ids, conversational=bool(flag), row_columns=row)
                item["trainer_state"] = data.meta_info.get("trainer_state")
                if self.answer_key and "." not in self.answer_key and self.answer_key != "ground_truth":
                    item[self.answer_key] = item["ground_truth"]
        if self.reward_fn.uses(VERL_REWARD_TYPE) or self.reward_fn.uses(TRL_REWARD_TYPE):  # their further arguments
            sources = data.non_tensor_batch.get("data_source", [None] * len(inputs))
            extras = data.non_tensor_batch.get("extra_info", [None] * len(inputs))
            for item, source, extra in zip(inputs, sources, extras):
                item["data_source"], item["extra_info"] = source, extra
        if "messages" in data.non_tensor_batch:  # a multi-turn rollout's turns after the prompt
            for item, messages in zip(inputs, data.non_tensor_batch["messages"]):
                item["messages"] = list(messages)
        # the summed rewards of a stepped environment's steps, or a tool environment's get_reward()
        for key in ("env_reward", "env_get_reward"):
            for item, reward in zip(inputs, data.non_tensor_batch.get(key, ())):
                item["env_reward"] = float(reward)
        if "environments" in data.non_tensor_batch:  # TRL's `environments`: each tool environment's attributes
            for item, state in zip(inputs, data.non_tensor_batch["environments"]):
                item["environments"] = state
        return inputs

    def score_inputs(
        self,
        inputs: list[dict],
        cancel: threading.Event | None = None,
        places: Any = None,
        counted_in: str = ERRORS_KEY,
    ) -> tuple[list[dict[str, float]], list[SampleFailure | None]]:
        """Per-sample score dicts (a failed sample: {"overall": 0.0}) and per-sample failures (None where scored);
        ``places``: where each sample's row is in the data, for the warnings; ``counted_in``: the metric the
        warnings say the failures are counted in."""
        if self.pool is None:
            outcome = merge(list(score_calls(self.reward_fn, inputs)))
        elif self.reward_fn.whole_batch:
            outcome = merge(self.pool.run([inputs], cancel))
        else:
            num_chunks = max(1, min(len(inputs), self.pool.num_actors * self.chunks_per_actor))
            splits = np.array_split(np.arange(len(inputs)), num_chunks)
            outcome = merge(self.pool.run([[inputs[i] for i in split] for split in splits if len(split)], cancel))
        if cancel is not None and cancel.is_set():
            raise ScoringCancelled("The scoring of this batch was cancelled; its scores are not known.")
        if outcome.fatal:
            index = outcome.fatal_index
            place = f" The sample is {places[index]}." if places is not None and index is not None else ""
            raise RewardFunctionError(outcome.fatal + place)
        # the warnings first: they name the first failure's data row and ground truth, which the stop does not
        self._report(outcome.failures, inputs, places, counted_in)
        self._stop_if_it_never_works(outcome.failures, inputs)
        scores = [score if score is not None else {"overall": 0.0} for score in outcome.scores]
        return scores, outcome.failures

    def _stop_if_it_never_works(self, failures: list[SampleFailure | None], inputs: list[dict]) -> None:
        """Stop the run when no sample of the batches so far, or of ALL_RAISED_STREAK batches in a row, got a score
        (whatever failed: a raise, a NaN, the deadline, a dead actor). A function that raises or returns NaN on every
        sample of the first batch stops it at once; timeouts and deaths may pass, so they stop it only in a row."""
        if not failures or any(failure is None for failure in failures):
            self._scored_once = self._scored_once or bool(failures)
            self._all_raised_streak = 0
            return
        self._all_raised_streak += 1
        kinds = Counter(failure.kind for failure in failures)
        at_once = set(kinds) <= {RAISED, NON_FINITE, NO_SCORE}
        if self._all_raised_streak < ALL_RAISED_STREAK and (self._scored_once or not at_once):
            return
        when = "the run so far" if not self._scored_once else f"{ALL_RAISED_STREAK} batches in a row"
        # numbers where text was expected: the usual cause (a code reward's dict of tests is no hint)
        types = sorted({type(item["ground_truth"]).__name__ for item in inputs} & {"int", "float", "bool"})
        # a number read as text fails with one of these; any other exception has another cause
        type_error = any(name in failures[0].detail for name in ("AttributeError", "TypeError"))
        hint = (
            f" The ground truths (data.answer_key's column) include values of type {', '.join(types)}, not str: a "
            "function that reads them as text fails on them; convert the column, or the value in the function."
            if types and type_error and kinds[RAISED]
            else ""
        )
        if self.reward_fn.whole_batch and kinds[RAISED]:
            hint = (
                " It is a batch function, scoring a batch in one call: an exception on one of its rows fails every "
                "sample of the batch." + hint
            )
        if type_error and kinds[RAISED] and getattr(self.reward_fn, "type_by_default", False):
            hint += (
                " The file sets no REWARD_TYPE, so it is called as EasyR1's default 'batch' convention calls it, "
                "with the list of every input: a function that takes one input dict needs `REWARD_TYPE = "
                '"sequential"` in the file.'
            )
        if kinds[TIMED_OUT]:
            hint += (
                f" A batch is scored within worker.reward.timeout_s={self.config.timeout_s:g} s: raise it (or give "
                "the function more CPUs, worker.reward.num_cpus) if scoring a batch takes longer."
            )
        hint += _failed_environments_hint(inputs)
        if set(kinds) == {RAISED}:
            what = "raised on every sample"
        else:
            what = "scored no sample (" + ", ".join(f"{count} {kind}" for kind, count in kinds.items()) + ")"
        raise RewardFunctionError(
            f"Reward function {self.reward_fn.where} {what} of {when} ({len(failures)} of {len(failures)} in the last "
            f"batch), so the run stops: nothing can be learnt from scores of 0.{hint} The first failure:\n"
            f"{failures[0].detail}"
        )

    def _report(
        self,
        failures: list[SampleFailure | None],
        inputs: list[dict],
        places: Any = None,
        counted_in: str = ERRORS_KEY,
    ) -> None:
        """Log the first failure of each kind once per run, naming the sample's index in its batch, its row in the
        data (where the batch came from a dataset) and its ground truth."""
        for kind in (RAISED, NON_FINITE, NO_SCORE, TIMED_OUT, DIED):
            indices = [i for i, failure in enumerate(failures) if failure is not None and failure.kind == kind]
            if not indices or kind in self._logged:
                continue
            self._logged.add(kind)
            index, count, size = indices[0], len(indices), len(failures)
            place = f"{places[index]}, " if places is not None else ""
            first = f"{index} ({place}ground truth {short_repr(inputs[index].get('ground_truth'))})"
            detail = failures[index].detail
            where = self.reward_fn.where
            counted = f"{count} of {size} samples of this batch score 0 (counted in {counted_in}"
            if kind == RAISED:
                message = (
                    f"Reward function {where} raised on sample {first}; {counted}; logged once)."
                    f"{_failed_environments_hint(inputs)}\n{detail}"
                )
            elif kind == NON_FINITE:
                message = (
                    f"Reward function {where} returned a non-finite score for sample {first}: {detail}. A NaN or "
                    f"infinite reward would make every update non-finite, so {counted}; logged once)."
                )
            elif kind == NO_SCORE:
                message = (
                    f"Reward function {where} returned None for sample {first}, as TRL's functions do where they do "
                    f"not apply, and no function scored it; {counted}; logged once). Return a number for every "
                    "sample, or combine the function with one that scores the others (path.py:f,g)."
                )
            elif kind == TIMED_OUT:
                message = (
                    f"Reward function {where}: scoring the batch took longer than worker.reward.timeout_s="
                    f"{self.config.timeout_s:g} s (first unscored sample: {first}); {counted} and {TIMEOUTS_KEY}; "
                    "logged once); the reward actors still busy were replaced. Raise worker.reward.timeout_s if the "
                    "function is slow rather than stuck."
                )
            else:
                message = (
                    f"Reward function {where}: {detail}. From sample {first} on, {counted}; logged once); the "
                    "actor was replaced."
                )
            logger.warning(message)

    def score(self, data: "DataProto") -> tuple[torch.Tensor, dict[str, list[float]]]:
        """(token_level_scores (batch, response_len) with `overall` on each last response token, per-sample
        metrics {"reward/<score name>": [value per sample], "reward/errors": [1.0 where scoring failed],
        "reward/timeouts": [1.0 where the batch's deadline passed first]}). With a judge (worker.reward.judge),
        `overall` is the weighted sum of the function's `overall` (also kept as reward/rule) and the judge's score
        (reward/judge), and reward/judge_errors marks the samples the judge gave no score."""
        return self.score_async(data).result()

    def score_async(self, data: "DataProto") -> PendingScores:
        """Start scoring `data` and return without waiting for the scores: see `PendingScores`. The responses are
        decoded here, before it returns, so the caller may change `data` (union other keys into it) meanwhile."""
        start = time.perf_counter()
        inputs = self.build_inputs(data)
        judging = None
        if self.judge is not None:  # its requests run while the rule reward is scored
            judging = self.judge.submit(judge_prompts(data, self.tokenizer, self.config.skip_special_tokens), inputs)
        added = data.non_tensor_batch.get("env_get_reward")
        if added is not None and self.reward_fn.scores_env_reward:
            added = None  # the function's overall already holds it
        places = data.non_tensor_batch.get(ROW_PLACE_KEY)
        counted_in = data.meta_info.get(COUNTED_IN_KEY, ERRORS_KEY)
        args = (data.batch["responses"], data.batch["response_mask"], inputs, judging, added, places, counted_in)
        decode_s = time.perf_counter() - start
        cancel_event = threading.Event()
        if self._executor is None:  # in-process: scored here (a signal-based timeout needs the main thread)
            future: Future = Future()
            try:
                future.set_result(_timed(self._score_decoded, *args))
            except Exception as error:  # noqa: BLE001 - raised again by result(), as score raised it
                future.set_exception(error)
            return PendingScores(future, decode_s, cancel_event)
        pending = PendingScores(
            self._executor.submit(_timed, self._score_decoded, *args, cancel_event), decode_s, cancel_event
        )
        self._pending = [*(earlier for earlier in self._pending if not earlier.done()), pending]
        return pending

    def cancel_pending(self) -> None:
        """Cancel every scoring not finished (their step is lost, e.g. to a worker that died)."""
        for pending in self._pending:
            pending.cancel()
        self._pending = []

    def restart_judge(self) -> None:
        """A new judge engine in place of one that died (`JudgeEngineDied`; only a `vllm` judge has an engine)."""
        if self.judge is not None and hasattr(self.judge, "restart"):
            self.judge.restart()

    def _score_decoded(
        self,
        responses: torch.Tensor,
        response_mask: torch.Tensor,
        inputs: list[dict],
        judging,
        env_rewards: Any = None,
        places: Any = None,
        counted_in: str = ERRORS_KEY,
        cancel: threading.Event | None = None,
    ) -> tuple[torch.Tensor, dict[str, list[float]]]:
        scores, failures = self.score_inputs(inputs, cancel, places, counted_in)
        judge_errors = None
        if judging is not None:
            verdicts = self.judge.collect(judging, places)
            scores, judge_errors = combine_scores(scores, verdicts, self.config.rule_weight, self.config.judge.weight)
        if env_rewards is not None:  # a tool environment's get_reward(), one more term of weight 1 (TRL's contract)
            scores = [
                {**score, "overall": score["overall"] + float(env), ENV_REWARD_SCORE: float(env)}
                for score, env in zip(scores, env_rewards)
            ]
        token_level_scores = torch.zeros(responses.shape, dtype=torch.float32)
        # the reward sits on the model's last token (after any tool results of a multi-turn rollout)
        positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
        last = torch.where(response_mask.bool(), positions, -1).max(-1).values.clamp(min=0).cpu()
        overall = torch.tensor([score["overall"] for score in scores], dtype=torch.float32)
        token_level_scores[torch.arange(len(scores)), last] = overall
        names = list(dict.fromkeys(name for score in scores for name in score))
        # a failed sample counts 0 in every score's mean; a scored one without a score is left out of its mean
        absent = [0.0 if failure is not None else math.nan for failure in failures]
        reward_metrics = {
            PREFIX + name: [score.get(name, gap) for score, gap in zip(scores, absent)] for name in names
        }
        reward_metrics[ERRORS_KEY] = [float(failure is not None) for failure in failures]
        reward_metrics[TIMEOUTS_KEY] = [
            float(failure is not None and failure.kind == TIMED_OUT) for failure in failures
        ]
        if judge_errors is not None:
            reward_metrics[JUDGE_ERRORS_KEY] = judge_errors
        return token_level_scores.to(responses.device), reward_metrics

    def shutdown(self) -> None:
        """Stop a scoring still running (within pool.CANCEL_POLL_S) before the reward actors go, so that none is
        started again behind the shutdown."""
        if self._executor is not None:
            self.cancel_pending()
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        if self.judge is not None:
            self.judge.close()
            self.judge = None
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

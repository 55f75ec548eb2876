"""The PPO loop: a single controller that orchestrates the worker groups, one step at a time.

One step reads top to bottom in ``train_step``: generate -> reward -> [online filter] -> old log-probs ->
reference log-probs -> values -> advantages -> critic update -> actor update -> weight sync into the rollout engine.
The reward is scored on the driver's side while the log-prob passes run on the workers, and awaited at the
advantages (``worker.reward.overlap``), unless online filtering needs the scores before those passes.
Everything numeric happens in the workers or in ``easyrl.algorithms``; this file only decides the order of events,
and the run plan (``easyrl.config.plan``) has already decided which of them happen.

``fit`` wraps the steps in what keeps a run's work safe: a checkpoint every ``save_freq`` steps or
``save_every_minutes`` minutes, one on a stop signal (``easyrl.trainer.faults``), and, when a worker process dies,
a restart of every worker from the last complete checkpoint (``max_restarts``). Each step's metrics row is written
into its checkpoint too, so ``metrics.jsonl`` can be made to agree with the checkpoint a run resumes from.
"""

import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..algorithms.advantage import compute_advantage
from ..algorithms.filtering import FilterKeyError, GroupCollector
from ..algorithms.kl import apply_kl_penalty, get_kl_controller
from ..algorithms.masked import masked_mean
from ..algorithms.zero_advantage import nonzero_advantage, skips_zero_advantage
from ..config import RunPlan
from ..config.validate import uses_critic
from ..controller.worker_group import WorkerDiedError
from ..data.dataset import ROW_PLACE_KEY
from ..data.loader import batches_drawn, restore_position
from ..data.template import RESET_CONTENT
from ..protocol import DataProto
from ..utils.engine_metrics import reduce_call_metrics
from ..utils.torch_functional import to_dtype
from ..workers.reward.judge import JudgeEngineDied, JudgeEngineError
from ..workers.reward.loader import RewardFunctionError
from ..workers.reward.scorer import (
    COUNTED_IN_KEY,
    ROW_FIELDS,
    PendingScores,
    failed_samples,
    reduce_reward_metrics,
    scores_to_non_tensor,
)
from ..workers.rollout.base import GenerationRequest, format_turns, generation_metrics
from ..workers.rollout.env_failures import ENV_ERROR_KEY, EnvFailureWatch, EnvironmentFailedError
from ..workers.tool_files import MULTI_TURN_COUNTS
from .balance import balance_permutation, groups_by_uid, inverse_permutation, per_step_balance
from .checkpoint import (
    CheckpointManager,
    CheckpointSaveError,
    changed_input_files,
    input_file_digests,
    load_dataloader_state,
    load_trainer_state,
    model_only_error,
    own_step_row,
    resolve_resume_path,
    saves_after,
    validates_first,
    warn_of_config_changes,
)
from .faults import RunStopped, StopRequest, restart_after, resume_hint
from .flops import FlopsCounter, compute_mfu, peak_flops_per_device
from .loggers.base import to_scalar
from .metrics import compute_data_metrics, compute_throughput_metrics, compute_timing_metrics, prompt_groups, timer


logger = logging.getLogger(__name__)

# Keys the rollout engine needs from a prompt batch; the rest of the batch waits on the driver.
GENERATION_KEYS = ("input_ids", "attention_mask", "position_ids")
GENERATION_NON_TENSOR_KEYS = ("raw_prompt_ids", "multi_modal_data")


def generation_non_tensor_keys(prompts: DataProto, multi_turn: Any) -> list[str]:
    """What the rollout gets of the prompts' non-tensor fields: with `worker.rollout.multi_turn` the whole row (an
    environment's `reset(row)` and tools that take `row` read ground_truth, the pictures and the rest)."""
    if multi_turn.enabled:
        return list(prompts.non_tensor_batch)
    return [k for k in GENERATION_NON_TENSOR_KEYS if k in prompts.non_tensor_batch]


def join_rollout_output(repeated_prompts: DataProto, generated: DataProto) -> DataProto:
    """The prompts (repeated once per sample) with the rollout's output. The rollout's multi_modal_data and
    raw_prompt_ids replace the prompts': a multi-turn rollout appends the pictures that tools returned to each
    sample's, and a tool environment's reset adds text to its prompt."""
    media = [key for key in ("multi_modal_data", "raw_prompt_ids") if key in generated.non_tensor_batch]
    media = [key for key in media if key in repeated_prompts.non_tensor_batch]
    repeated_prompts.pop(batch_keys=list(GENERATION_KEYS), non_tensor_batch_keys=media)
    return repeated_prompts.union(generated)


def remax_baseline_metrics(baselines: torch.Tensor, n: int) -> dict[str, float]:
    """ReMax's baselines (one per sample, its prompt's greedy score; NaN where that could not be scored): their mean,
    and the prompts without one, whose samples got advantage 0."""
    scored = baselines[~torch.isnan(baselines)]
    return {
        "reward/remax_baseline/mean": float(scored.mean()) if len(scored) else 0.0,
        "reward/remax_baseline/errors": float(torch.isnan(baselines).sum()) / max(n, 1),
    }


# the multi-turn rollout's metrics (rollout/multi_turn/tool_errors, .../env_errors, .../turns, ...)
MULTI_TURN_METRICS = "rollout/multi_turn/"


# the draw of the validation samples that are logged (trainer.val_generations_to_log), fixed across validations
VAL_SAMPLES_SEED = 42


class OnlineFilteringError(RuntimeError):
    """Online filtering found too few groups with mixed scores within trainer.max_try_make_batch rounds."""


@dataclass
class WorkerGroups:
    """The worker groups a run drives; ref and critic are None when the algorithm needs none."""

    actor_rollout: Any
    ref: Any = None
    critic: Any = None


def _timing_metrics(seconds_by_phase: dict[str, float]) -> dict[str, float]:
    return {f"timing/{name}": seconds for name, seconds in seconds_by_phase.items()}


class PPOTrainer:
    def __init__(
        self,
        plan: RunPlan,
        tokenizer: Any,
        train_loader: Any,
        val_loader: Any,
        workers: WorkerGroups,
        reward_scorer: Any,
        val_reward_scorer: Any,
        tracker: Any,
        stop: StopRequest | None = None,
        restart_workers: Callable[[], WorkerGroups] | None = None,
    ) -> None:
        """``stop``: set by a stop signal, read between steps. ``restart_workers``: kills the worker groups and
        starts new ones (for ``trainer.max_restarts``); None: a dead worker always ends the run."""
        if plan.training_steps is None:
            raise ValueError("The run plan has no step count yet: build it with plan.with_training_steps(...).")
        self.plan = plan
        self.config = config = plan.config
        self.tokenizer = tokenizer
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.workers = workers
        self.reward_scorer = reward_scorer
        self.val_reward_scorer = val_reward_scorer
        # an environment that fails on every trajectory stops the run, as a reward function that always raises does
        self.env_failures = EnvFailureWatch(config.worker.rollout.multi_turn.env)
        self.tracker = tracker
        self.stop = stop or StopRequest()
        self.stop.resume_hint = self._resume_hint
        self.restart_workers = restart_workers
        self.restarts = 0  # worker restarts so far in this process (trainer.max_restarts)
        self.checkpoints = CheckpointManager(
            config.trainer.save_checkpoint_path, config.trainer.save_limit, config.trainer.load_checkpoint_path
        )
        self.kl_controller = get_kl_controller(config.algorithm)
        self.use_reference = plan.use_reference
        self.use_critic = plan.use_critic
        self.global_step = 0
        self.training_steps = plan.training_steps
        self._actor_flops: FlopsCounter | None = None  # built on first use from the actor's HF config
        self._actor_peak_flops: float | None = None
        self._rollout_metrics: list[dict[str, float]] = []  # the engine's own, per generate call, until logged
        self.last_checkpoint: str | None = None  # the newest complete checkpoint of this run (resumed or saved)
        self._saved_step = 0  # the step last_checkpoint holds (0: none)
        self._last_save_time = time.monotonic()
        # what a restart before the first checkpoint starts again from
        self._initial_loader_state = train_loader.state_dict()
        self._initial_kl_coef = self.kl_controller.value
        self._input_files = input_file_digests(self.config)  # saved with each checkpoint, compared on resume
        self._said_uniform_groups = False  # the online filter kept groups whose samples all scored alike (said once)
        self.epoch = 0  # passes over the training data completed
        self._epoch_batches = 0  # loader batches drawn in the pass under way

    # ------------------------------------------------------------------------------------------------------------------
    # the loop
    # ------------------------------------------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Train until total_epochs or max_steps; return the last step's metrics.

        A worker process (or a `vllm` judge's engine) that dies ends the run with a message naming it (``WorkerDied``)
        or, while ``trainer.max_restarts`` allows, has every worker (and the engine) started again and the run resumed
        from the last complete checkpoint. A stop signal ends the run after the current step, with a checkpoint
        (``RunStopped``).
        """
        died: Exception | None = None  # what ended the last try: restart what it took down
        while True:
            try:
                if isinstance(died, JudgeEngineDied):  # first: a worker that dies restarting must not skip it
                    self.reward_scorer.restart_judge()
                if died is not None:
                    self.workers = self.restart_workers()
                return self._train()
            except JudgeEngineDied as error:  # before its base class's clause: a dead process, as a worker's
                died = error
            except (RewardFunctionError, JudgeEngineError, EnvironmentFailedError, CheckpointSaveError) as error:
                # a reward, judge or environment that cannot score, or a checkpoint that cannot be written, ends the
                # run (printed as one line): say where it can go on from
                error.add_note(self._resume_hint())
                raise
            except WorkerDiedError as error:
                died = error
            # a worker or the judge engine died: every worker starts again (and the engine) while max_restarts allows
            self.reward_scorer.cancel_pending()  # the step that was scoring is lost with the worker
            self.restarts = restart_after(died, self)

    def _train(self) -> dict[str, float]:
        """From the last complete checkpoint (or the beginning) to the last step."""
        trainer_config = self.config.trainer
        if self._resume():
            self.workers.actor_rollout.sync_rollout_weights()  # the engine started from the model path
        last_metrics: dict[str, float] = {}
        if self.stop.requested:  # a stop while the workers started: no validation before it is honoured
            self._stop_now(last_metrics)
        if self.val_loader is not None and validates_first(trainer_config, self.global_step):
            seconds: dict[str, float] = {}
            with timer("validation", seconds):  # as a step's validation is timed
                last_metrics = self.validate()
            last_metrics.update(_timing_metrics(seconds))
            self.tracker.log(last_metrics, step=self.global_step)
        if trainer_config.val_only:
            return last_metrics

        batches = self._train_batches()
        filtering = self.config.algorithm.online_filtering
        self._last_save_time = time.monotonic()
        while self.global_step < self.training_steps:
            if self.stop.requested:
                self._stop_now(last_metrics)
            self.global_step += 1
            # where the data stood before the step: a step that online filtering cannot fill ends the run, and the
            # steps before it are saved with this position (a rerun with a wider filter draws that step's prompts)
            before = (self.train_loader.state_dict(), self.epoch, self._epoch_batches) if filtering else None
            try:
                metrics = self.train_step(batches)
            except OnlineFilteringError as error:
                raise self._save_before_unfilled_step(error, before, last_metrics) from None
            metrics["trainer/restarts"] = self.restarts
            is_last = self.global_step == self.training_steps
            after_step: dict[str, float] = {}  # outside timing/step: the phases that do not run every step
            if self._validates_after(self.global_step, is_last):
                with timer("validation", after_step):
                    metrics.update(self.validate())
            if self._saves_after(self.global_step, is_last):
                with timer("save_checkpoint", after_step):
                    # the row goes into the checkpoint before it is logged (all of it but this save's duration)
                    self.save_checkpoint({**metrics, **_timing_metrics(after_step)})
            metrics.update(_timing_metrics(after_step))
            self.tracker.log(metrics, step=self.global_step)
            last_metrics = metrics
        return last_metrics

    def _save_before_unfilled_step(
        self, error: OnlineFilteringError, before: tuple | None, last_metrics: dict[str, float]
    ) -> OnlineFilteringError:
        """Checkpoint the steps done before the one online filtering could not fill (unless the last one has a
        checkpoint), with the data position the step started from; the error then says where they are."""
        done = self.global_step - 1
        if before is None or done <= self._saved_step or self.config.trainer.save_model_only:
            return error
        loader_state, self.epoch, self._epoch_batches = before
        self.global_step = done
        self.save_checkpoint(last_metrics, loader_state)
        return OnlineFilteringError(
            f"{error} The {done} steps before it are saved in {self.last_checkpoint}; a rerun resumes from there."
        )

    def _saves_after(self, step: int, is_last: bool) -> bool:
        """After the last step, every save_freq steps, once save_every_minutes have passed since the last save, and
        when a stop signal came during the step."""
        return saves_after(self.config.trainer, step, is_last, self._last_save_time, self.stop.requested)

    def _stop_now(self, last_metrics: dict[str, float]) -> None:
        """End the run for a stop signal: checkpoint the last trained step unless it has one, then raise."""
        if self.global_step > self._saved_step:  # the signal came after the step's save decision
            self.save_checkpoint(last_metrics)
        hint = self._resume_hint()
        raise RunStopped(self.stop.signal_name, self.stop.signum, self.global_step, self.last_checkpoint, hint)

    def _resume_hint(self) -> str:
        return resume_hint(self.last_checkpoint, self.config.trainer)

    def _validates_after(self, step: int, is_last: bool) -> bool:
        """Every val_freq steps, and after the last step whatever val_freq says (EasyR1 validates at the end)."""
        if self.val_loader is None:
            return False
        every = self.config.trainer.val_freq
        return (is_last and self.plan.validate_at_end) or (every > 0 and step % every == 0)

    def train_step(self, batches: Iterator[DataProto]) -> dict[str, float]:
        """One PPO step; returns its metrics."""
        algo = self.config.algorithm
        timing: dict[str, float] = {}
        metrics: dict[str, Any] = {}
        with timer("step", timing):
            # 1. generate n responses per prompt and score them (refilled until enough groups survive filtering);
            #    without online filtering the scores are awaited in 3, with `worker.reward.overlap`
            with timer("gen_and_reward", timing):
                batch, scoring, batch_metrics = self._make_batch(batches, timing)
            metrics.update(batch_metrics)
            metrics.update(self._reduce_rollout_metrics())
            # every data-parallel rank gets about the same number of tokens from here on (trainer.balance_batch)
            order = self._balance_batch(batch, metrics)

            # 2. log-probs of the sampled tokens under the current (old) policy, the reference, and the critic;
            #    on-policy the update's own detached log-probs are the old ones (the plan says when that holds)
            if not self.plan.on_policy:
                with timer("old_log_probs", timing):
                    # the policy's entropy is logged, not optimised
                    old_log_probs = self.workers.actor_rollout.compute_log_probs(batch, calculate_entropy=True)
                    entropy = old_log_probs.pop(batch_keys=["entropy"]).batch["entropy"]  # (batch, response_len)
                    metrics["actor/entropy"] = masked_mean(entropy, batch.batch["response_mask"]).item()
                    batch = batch.union(old_log_probs)
            if self.use_reference:
                with timer("ref_log_probs", timing):
                    batch = batch.union(self.workers.ref.compute_ref_log_probs(batch))
            if self.use_critic:
                with timer("values", timing):
                    batch = batch.union(self.workers.critic.compute_values(batch))

            # 3. rewards (minus the KL penalty when KL lives in the reward) and advantages, on the driver
            with timer("adv", timing):
                if scoring:  # the first use of the scores: wait for the scoring that ran during 2
                    if order is not None:  # the scores come in generation order
                        batch.reorder(inverse_permutation(order))
                    batch, reward_metrics = self._await_scores(batch, scoring, timing)
                    if order is not None:
                        batch.reorder(order)
                    metrics.update(reduce_reward_metrics(reward_metrics))
                if self.plan.kl_in_reward:
                    batch, kl_metrics = apply_kl_penalty(batch, self.kl_controller, algo.kl_penalty)
                    metrics.update(kl_metrics)
                else:
                    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
                batch = compute_advantage(batch, algo)
                self._say_if_nothing_is_learnt(batch)
            if "reward_baselines" in batch.batch.keys():  # ReMax: the greedy responses' scores, per sample
                metrics.update(remax_baseline_metrics(batch.batch["reward_baselines"], self.config.worker.rollout.n))

            # 4. updates: the critic first (it warms up alone for critic_warmup steps), then the actor, whose new
            #    weights then stream into the rollout engine for the next generation
            if self.use_critic:
                with timer("update_critic", timing):
                    critic_out = self.workers.critic.update_critic(batch)
                metrics.update(critic_out.meta_info["metrics"])
            if self.global_step > self.config.trainer.critic_warmup:
                self._balance_computed_samples(batch, metrics)
                with timer("update_actor", timing):
                    actor_out = self.workers.actor_rollout.update_actor(batch, on_policy=self.plan.on_policy)
                metrics.update(actor_out.meta_info["metrics"])
                with timer("sync_weights", timing):
                    self.workers.actor_rollout.sync_rollout_weights()
                if "actor/rollout_logprob_abs_diff" in metrics:  # measured inside the on-policy update
                    metrics["rollout/logprob_abs_diff/mean"] = metrics.pop("actor/rollout_logprob_abs_diff")
                elif "rollout_log_probs" in batch.batch.keys() and "old_log_probs" in batch.batch.keys():
                    metrics.update(self._rollout_mismatch(batch))

        # every logger gets the step itself (metrics.jsonl keeps it as an integer); as a metric it came back a float
        metrics["epoch"] = self.epoch
        metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing, n_devices=self.config.world_size))
        if "update_actor" in timing:
            metrics.update(self._actor_mfu(batch, timing["update_actor"]))
        return metrics

    def _rank_chunks(self, batch: DataProto) -> tuple[int, list[list[int]] | None]:
        """(data-parallel ranks, the row groups that must stay on one rank): with shared prefixes a prompt's samples
        move together, so that on one rank they compute the prompt once."""
        actor, critic = self.config.worker.actor, self.config.worker.critic
        uids = batch.non_tensor_batch.get("uid")
        shared = actor.shared_prefix or (critic.shared_prefix and uses_critic(self.config))
        groups = groups_by_uid(uids) if shared and uids is not None else None
        return self.config.world_size // max(actor.ulysses_size, 1), groups

    def _balance_batch(self, batch: DataProto, metrics: dict[str, Any]) -> torch.Tensor | None:
        """Reorder ``batch`` in place for token-balanced data-parallel chunks; returns the order applied (None when
        off or when the rows do not split evenly). The imbalance metrics are logged either way."""
        dp_size, groups = self._rank_chunks(batch)
        order, balance_metrics = balance_permutation(batch.batch["attention_mask"], dp_size, groups)
        if not self.config.trainer.balance_batch:
            balance_metrics["perf/dp_token_imbalance"] = balance_metrics["perf/dp_token_imbalance_before"]
            order = None
        metrics.update(balance_metrics)
        if order is not None:
            batch.reorder(order)
        return order

    def _balance_computed_samples(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        """Reorder ``batch`` in place so that the ranks hold about the same number of tokens the actor update computes,
        where it skips zero-advantage samples (worker.actor.skip_zero_advantage): the balance made after generation
        counted every sample, and each rank computes as many samples as the busiest one. Only rows of the same
        optimizer step trade ranks (``per_step_balance``), so each step holds the samples it would hold without the
        skip and the update stays the one the key promises."""
        actor = self.config.worker.actor
        if not (self.config.trainer.balance_batch and skips_zero_advantage(actor)):
            return
        dp_size, groups = self._rank_chunks(batch)
        if dp_size == 1:
            return
        computed = nonzero_advantage(batch).to(batch.batch["attention_mask"].dtype)
        tokens = (batch.batch["attention_mask"].sum(-1) * computed).tolist()
        order, after = per_step_balance(tokens, dp_size, actor.global_batch_size_per_device, groups)
        if order is not None:
            metrics["perf/dp_token_imbalance_update"] = after
            batch.reorder(order)

    # ------------------------------------------------------------------------------------------------------------------
    # generation + reward, with DAPO online filtering
    # ------------------------------------------------------------------------------------------------------------------
    def _make_batch(
        self, batches: Iterator[DataProto], timing: dict[str, float]
    ) -> tuple[DataProto, list[tuple[np.ndarray, PendingScores]], dict[str, Any]]:
        """Generate and score loader batches (``data.mini_rollout_batch_size`` prompts, else rollout_batch_size)
        until ``data.rollout_batch_size`` prompt groups are collected, as EasyR1 does; with online filtering only the
        groups that survive the filter count, for at most ``trainer.max_try_make_batch`` rounds.

        Returns the batch, the scorings still running for it (each round's ``uid`` column and scoring, in order;
        empty when the scores are on the batch already) and the step's reward and filter metrics known so far."""
        algo, data_cfg, trainer_cfg = self.config.algorithm, self.config.data, self.config.trainer
        collector = GroupCollector(target_groups=data_cfg.rollout_batch_size, group_size=self.config.worker.rollout.n)
        # the filter keeps groups by their scores: with it they are needed now, without it first by the advantages
        overlap = self.config.worker.reward.overlap and not algo.online_filtering
        scoring: list[tuple[np.ndarray, PendingScores]] = []
        all_reward_metrics: dict[str, list[float]] = {}
        rounds = 0
        while not collector.full:
            rounds += 1
            if algo.online_filtering and 0 < trainer_cfg.max_try_make_batch < rounds:
                counts = collector.metrics()
                low, high = int(counts.get("filter/dropped_low", 0)), int(counts.get("filter/dropped_high", 0))
                seen = int(counts.get("filter/kept_groups", 0)) + low + high
                raise OnlineFilteringError(
                    f"online filtering kept {collector.num_groups} of the {data_cfg.rollout_batch_size} groups a step "
                    f"needs after {trainer_cfg.max_try_make_batch} generation rounds (`trainer.max_try_make_batch`): "
                    f"of {seen} groups, {low} had a mean `{algo.filter_key}` at or below {algo.filter_low} and {high} "
                    f"at or above {algo.filter_high} (`algorithm.filter_low` / `filter_high`). Widen the filter, "
                    "raise trainer.max_try_make_batch, or use data nearer the model's level."
                )
            batch, pending = self._generate_and_score(next(batches), timing, round_index=rounds)
            round_scoring = [(batch.non_tensor_batch["uid"], pending)]
            if overlap:
                scoring += round_scoring
            else:
                batch, reward_metrics = self._await_scores(batch, round_scoring, timing)
                for key, values in reward_metrics.items():
                    all_reward_metrics.setdefault(key, []).extend(values)
            if algo.online_filtering:
                try:
                    collector.add(batch, filter_key=algo.filter_key, low=algo.filter_low, high=algo.filter_high)
                except FilterKeyError as error:  # one line and exit 2, as other run-stopping config problems
                    raise OnlineFilteringError(str(error)) from None
            else:
                collector.add(batch)
        out = reduce_reward_metrics(all_reward_metrics) if not overlap else {}
        if algo.online_filtering or rounds > 1:
            out.update({"filter/rounds": rounds, **collector.metrics()})
        self._say_uniform_groups(out.get("filter/kept_uniform_groups", 0))
        return collector.take(), scoring, out

    def _say_uniform_groups(self, count: float) -> None:
        """Once per run: the filter's bounds kept groups whose samples all scored alike (EasyR1's bounds compare the
        group's mean; DAPO, arXiv 2503.14476, drops every group whose answers were all right or all wrong)."""
        if not count or self._said_uniform_groups:
            return
        self._said_uniform_groups = True
        algo = self.config.algorithm
        logger.warning(
            "Online filtering kept %d groups whose samples all have the same `%s` (their mean is inside "
            "algorithm.filter_low=%g / filter_high=%g, which drop only means at or beyond them): a group-relative "
            "advantage gives each of their samples 0, so they teach nothing and take the place of groups that would. "
            "Filter on a score that is 0 or 1 per sample (algorithm.filter_key=accuracy with the shipped rewards), "
            "or lower algorithm.filter_high below a right answer's score. Counted in filter/kept_uniform_groups; "
            "said once.",
            int(count),
            algo.filter_key,
            algo.filter_low,
            algo.filter_high,
        )

    def _await_scores(
        self, batch: DataProto, scoring: list[tuple[np.ndarray, PendingScores]], timing: dict[str, float]
    ) -> tuple[DataProto, dict[str, list[float]]]:
        """Wait for the scorings of ``batch``'s rounds and put their scores on it (token_level_scores and each named
        score per sample); returns it with the per-sample reward metrics of every round.

        ``batch`` holds the first rows of the rounds, in order: without a filter the collector keeps the first
        rollout_batch_size groups, each whole (a group's samples are adjacent). The ``uid`` columns must agree."""
        parts, all_reward_metrics = [], {}
        for uids, pending in scoring:
            with timer("reward_wait", timing):
                scores, reward_metrics = pending.result()
            timing["reward"] = timing.get("reward", 0.0) + pending.seconds
            for key, values in reward_metrics.items():
                all_reward_metrics.setdefault(key, []).extend(values)
            parts.append(
                DataProto.from_dict(
                    {"token_level_scores": scores}, {"uid": uids, **scores_to_non_tensor(reward_metrics)}
                )
            )
        scores = DataProto.concat(parts) if len(parts) > 1 else parts[0]
        return batch.union(scores[: len(batch)] if len(scores) > len(batch) else scores), all_reward_metrics

    def _trainer_state(self, steps_done: int) -> dict[str, float]:
        """The training progress a reward function written for TRL reads as `trainer_state` (TRL's names; `epoch`:
        the passes over the training data so far, as a fraction, whatever the loader's batch or the filter drew)."""
        epoch = self.epoch + self._epoch_batches / max(len(self.train_loader), 1)
        return {"global_step": steps_done, "max_steps": self.training_steps, "epoch": epoch}

    def _sampling_seed(self, kind: int, index: int) -> list[int]:
        """The rollout seed of one generation call, a function of (rollout.seed, kind, step, index) only: a resumed
        run samples exactly what the uninterrupted run sampled. kind 0 = training rounds (validation batches use
        (rollout.seed, 1, batch) at every step, ``validate``)."""
        return [self.config.worker.rollout.seed, kind, self.global_step, index]

    def _generate_and_score(
        self, prompts: DataProto, timing: dict[str, float], round_index: int
    ) -> tuple[DataProto, PendingScores]:
        """One round: the generated batch, and its scoring, started (decoded here, scored in the scorer's thread)."""
        rollout = self.workers.actor_rollout
        prompts.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
        gen_input = prompts.select(
            batch_keys=list(GENERATION_KEYS),
            non_tensor_batch_keys=self._generation_non_tensor_keys(prompts),
        )
        seed = self._sampling_seed(0, round_index)
        with timer("gen", timing):
            generated = rollout.generate_sequences(gen_input, GenerationRequest(seed=seed))
        engine_metrics = generated.meta_info.pop("metrics", None) or {}
        if "rollout/gen_seconds" in engine_metrics:
            # the lengths of the responses trained on: with several data-parallel ranks, a rank's share of padding
            # rows (a batch that does not split evenly) is in the ranks' own counts
            mask = generated.batch["response_mask"]
            attended = generated.batch["attention_mask"][:, -mask.shape[-1] :]
            engine_metrics.update(generation_metrics(mask, engine_metrics["rollout/gen_seconds"], attended))
        self._rollout_metrics.append(engine_metrics)
        if self.config.algorithm.adv_estimator == "remax":  # a baseline of its own, not a role: the plan has no say
            # ReMax (arXiv 2310.10505): the reward of each prompt's greedy response is its baseline.
            with timer("gen_baseline", timing):
                greedy_request = GenerationRequest(sampling_override={"temperature": 0.0, "n": 1}, seed=seed)
                greedy = rollout.generate_sequences(gen_input, greedy_request)
                # what the scorer reads of the rows: the answer, for verl / TRL more, and the row's place (warnings)
                for key in (*ROW_FIELDS, ROW_PLACE_KEY):
                    if key in prompts.non_tensor_batch:
                        greedy.non_tensor_batch[key] = prompts.non_tensor_batch[key]
                greedy.meta_info["trainer_state"] = self._trainer_state(self.global_step - 1)
                greedy.meta_info[COUNTED_IN_KEY] = "reward/remax_baseline/errors"
                baseline_scores, baseline_metrics = self.reward_scorer.score(greedy)
            baselines = baseline_scores.sum(-1).double()
            # a greedy response the reward (or its judge) could not score has no baseline, not a baseline of 0: NaN,
            # which compute_remax_advantage turns into advantage 0 for that prompt's samples
            baselines[torch.tensor(failed_samples(baseline_metrics, len(baselines)), dtype=torch.bool)] = float("nan")
            prompts.non_tensor_batch["reward_baselines"] = np.array(baselines.tolist(), dtype=object)

        batch = join_rollout_output(prompts.repeat(self.config.worker.rollout.n, interleave=True), generated)
        if ENV_ERROR_KEY in batch.non_tensor_batch:  # before the scoring: a broken environment's zeros are not scored
            self.env_failures.check(
                batch.non_tensor_batch.pop(ENV_ERROR_KEY), batch.non_tensor_batch[MULTI_TURN_COUNTS]
            )
        if "reward_baselines" in batch.non_tensor_batch:
            batch.batch["reward_baselines"] = torch.tensor(
                batch.non_tensor_batch.pop("reward_baselines").astype(float)
            )
        batch.meta_info["trainer_state"] = self._trainer_state(self.global_step - 1)  # the steps done before this one
        with timer("reward_wait", timing):  # the step waits for the decoding
            pending = self.reward_scorer.score_async(batch)
        # a tool environment's states and reset contents are for the reward function only (which has them now): the
        # workers do not need them shipped with every call
        for key in ("environments", RESET_CONTENT):
            batch.non_tensor_batch.pop(key, None)
        return batch, pending

    # ------------------------------------------------------------------------------------------------------------------
    # validation
    # ------------------------------------------------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Greedy-ish generation (rollout.val_override_config) over the whole validation set."""
        rollout = self.workers.actor_rollout
        scores_by_source: dict[str, list[float]] = {}
        named: dict[str, list[float]] = {}
        samples: list[dict[str, Any]] = []
        lengths: list[float] = []
        multi_turn: list[dict[str, float]] = []
        logged: set[int] | None = None  # the positions of the samples logged, drawn at the first batch
        position = 0  # of the batch's first sample among the validation's samples
        for batch_index, prompts in enumerate(self.val_loader):
            prompts = prompts if isinstance(prompts, DataProto) else DataProto.from_single_dict(prompts)
            gen_input = prompts.select(
                batch_keys=list(GENERATION_KEYS),
                non_tensor_batch_keys=self._generation_non_tensor_keys(prompts),
            )
            # the same seeds at every validation (not the step's): what changes between two sampled validations is
            # the model, not the sampling noise; a resumed run samples as the uninterrupted one
            request = GenerationRequest(validate=True, seed=[self.config.worker.rollout.seed, 1, batch_index])
            generated = rollout.generate_sequences(gen_input, request)
            # a weight sync that ran before a validation batch is reported with the next training step; the
            # multi-turn counts (tool and environment errors, turns) are validation's own
            engine_metrics = generated.meta_info.pop("metrics", None) or {}
            self._rollout_metrics.append({k: v for k, v in engine_metrics.items() if "weight_sync" in k})
            multi_turn.append({k: v for k, v in engine_metrics.items() if k.startswith(MULTI_TURN_METRICS)})
            repeat = len(generated) // len(prompts)
            batch = join_rollout_output(prompts.repeat(repeat, interleave=True), generated)
            batch.meta_info["trainer_state"] = self._trainer_state(self.global_step)
            scores, reward_metrics = self.val_reward_scorer.score(batch)
            # the scores as the function gave them (float64), so that val/<source>/reward and val/reward/overall of
            # one source are the same number; the token-level tensor holds them in float32
            overall = reward_metrics.get("reward/overall") or scores.sum(-1).tolist()
            sources = batch.non_tensor_batch.get("data_source", np.array(["val"] * len(batch), dtype=object))
            for source, score in zip(sources, overall):
                scores_by_source.setdefault(str(source), []).append(score)
            for key, values in reward_metrics.items():
                named.setdefault(key, []).extend(values)
            lengths.extend(batch.batch["response_mask"].sum(-1).tolist())
            if logged is None:
                logged = self._logged_val_positions(len(self.val_loader.dataset) * repeat)
            chosen = [i for i in range(len(batch)) if position + i in logged]
            if chosen:
                samples.extend(self._decode_samples(batch[chosen], [overall[i] for i in chosen]))
            position += len(batch)
        if samples:
            self.tracker.log_generations(samples, step=self.global_step)
        metrics = {f"val/{key}": value for key, value in reduce_reward_metrics(named).items()}  # errors: counts
        for source, values in scores_by_source.items():
            metrics[f"val/{source}/reward"] = float(np.mean(values))
        metrics["val/response_length/mean"] = float(np.mean(lengths)) if lengths else 0.0
        for key, value in reduce_call_metrics(multi_turn).items():
            metrics[f"val/{key.removeprefix('rollout/')}"] = value
        return metrics

    def _logged_val_positions(self, total: int) -> set[int]:
        """Which of a validation's ``total`` samples (in data order) are logged: trainer.val_generations_to_log of
        them drawn over the whole set with a fixed seed, the same at every validation so that an answer can be
        followed from step to step (EasyR1 shuffles with a fixed seed too; the first rows alone would show one data
        source)."""
        count = min(self.config.trainer.val_generations_to_log, total)
        return set(random.Random(VAL_SAMPLES_SEED).sample(range(total), count)) if count > 0 else set()

    def _generation_non_tensor_keys(self, prompts: DataProto) -> list[str]:
        return generation_non_tensor_keys(prompts, self.config.worker.rollout.multi_turn)

    def _decode_samples(self, batch: DataProto, scores: list[float]) -> list[dict[str, Any]]:
        out = []
        for i in range(len(batch)):
            # the prompt as the engine read it (raw_prompt_ids): one vision pad per picture, as `easyrl generate`
            # writes it, not the hundreds the actor's copy expands it to; else the attended prompt (the pad token is
            # often the model's end-of-turn token, which the chat template writes after every turn)
            if "raw_prompt_ids" in batch.non_tensor_batch:
                prompt = list(batch.non_tensor_batch["raw_prompt_ids"][i])
            else:
                prompt = batch.batch["prompts"][i]
                prompt = prompt[batch.batch["attention_mask"][i, : prompt.shape[-1]].bool()]
            # the attended response: a multi-turn rollout's tool results are in it (response_mask has only the model's)
            responses = batch.batch["responses"][i]
            response = responses[batch.batch["attention_mask"][i, -responses.shape[-1] :].bool()]
            sample = {
                "step": self.global_step,
                "prompt": self.tokenizer.decode(prompt),
                "response": self.tokenizer.decode(response, skip_special_tokens=True),
                "ground_truth": str(batch.non_tensor_batch["ground_truth"][i]),
                "score": scores[i],
            }
            if "messages" in batch.non_tensor_batch:  # which text of a multi-turn response is the model's, a tool's
                sample["turns"] = format_turns(batch.non_tensor_batch["messages"][i])
            out.append(sample)
        return out

    # ------------------------------------------------------------------------------------------------------------------
    # helpers
    # ------------------------------------------------------------------------------------------------------------------
    def _train_batches(self) -> Iterator[DataProto]:
        """Batches across epochs; the loader's state (position and epoch) is what checkpoints save."""
        self.epoch = self._start_epoch
        while True:
            for batch_dict in self.train_loader:
                self._epoch_batches += 1
                yield batch_dict if isinstance(batch_dict, DataProto) else DataProto.from_single_dict(batch_dict)
            self.epoch += 1
            self._epoch_batches = 0

    def _reduce_rollout_metrics(self) -> dict[str, float]:
        """The engine metrics of this step's generate calls, each already over its data-parallel ranks: seconds and
        bytes add up over calls (refill rounds, a ReMax baseline, a sync before validation), rates are total over
        total, lengths average over responses (`utils.engine_metrics`)."""
        calls, self._rollout_metrics = self._rollout_metrics, []
        return reduce_call_metrics(calls)

    def _actor_mfu(self, batch: DataProto, seconds: float) -> dict[str, float]:
        """Model FLOPs utilisation of the actor update: forward + backward over every sequence it computed (with
        worker.actor.skip_zero_advantage, those with an advantage; the samples that only even out the ranks' passes
        are not counted), ppo_epochs times."""
        if self._actor_flops is None:
            from transformers import AutoConfig

            actor = self.config.worker.actor
            hf_config = AutoConfig.from_pretrained(
                actor.model.model_path, trust_remote_code=actor.model.trust_remote_code
            )
            self._actor_flops = FlopsCounter(hf_config)
            self._actor_peak_flops = peak_flops_per_device(to_dtype(actor.fsdp.mp_param_dtype))
        if not self._actor_peak_flops or seconds <= 0:
            return {}  # a device missing from the peak table: set EASYRL_PEAK_TFLOPS to get MFU
        frozen = self.config.worker.actor.model.lora.rank > 0  # LoRA: no weight gradients for the base
        if skips_zero_advantage(self.config.worker.actor):
            computed = torch.nonzero(nonzero_advantage(batch)).flatten().tolist()
            batch = batch[computed or [0]]  # an update without advantages still computes one sample
        if self.config.worker.actor.shared_prefix and "uid" in batch.non_tensor_batch:
            flops = self._actor_flops.shared_prefix_flops(prompt_groups(batch), frozen_weights=frozen)
        else:
            seq_lens = batch.batch["attention_mask"].sum(-1).tolist()  # prompt + response tokens, padding excluded
            flops = self._actor_flops.flops(seq_lens, frozen_weights=frozen)
        flops *= self.config.worker.actor.ppo_epochs
        return {"perf/mfu/actor": compute_mfu(flops, seconds, self.config.world_size, self._actor_peak_flops)}

    def _say_if_nothing_is_learnt(self, batch: DataProto) -> None:
        """A step whose every advantage is 0 (each group's samples scored alike; a reward that gives every answer the
        same score) teaches the policy nothing from its rewards: only grad_norm 0 would show it otherwise."""
        if self.global_step <= self.config.trainer.critic_warmup or bool(nonzero_advantage(batch).any()):
            return
        logger.warning(
            "Step %d: every sample's advantage is 0 (algorithm.adv_estimator=%s; the samples of each group scored "
            "alike), so the update learns nothing from the rewards this step. If every step says so, check that the "
            "reward function tells answers apart (reward/* in the metrics).",
            self.global_step,
            self.config.algorithm.adv_estimator,
        )

    def _rollout_mismatch(self, batch: DataProto) -> dict[str, float]:
        from ..workers.rollout.base import rollout_logprob_mismatch

        return rollout_logprob_mismatch(
            batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], batch.batch["response_mask"]
        )

    # ------------------------------------------------------------------------------------------------------------------
    # checkpoints
    # ------------------------------------------------------------------------------------------------------------------
    _start_epoch = 0
    epoch = 0

    def save_checkpoint(self, metrics: dict[str, Any] | None = None, loader_state: dict | None = None) -> None:
        """Checkpoint the current step; ``metrics``, the step's row, is kept in it so that a crash between the save
        and the row's logging cannot lose the row (``_resume`` restores it). ``loader_state``: the data position to
        save, when it is not the loader's present one."""
        save_model_only = self.config.trainer.save_model_only
        row = {name: to_scalar(name, value) for name, value in (metrics or {}).items()}
        # a write that fails (a full disk) removes the partial save and stops the run in one line (CheckpointSaveError)
        with self.checkpoints.saving(self.global_step) as tmp_dir:
            self.workers.actor_rollout.save_checkpoint(f"{tmp_dir}/actor", save_model_only)
            if self.use_critic:
                self.workers.critic.save_checkpoint(f"{tmp_dir}/critic", save_model_only)
            self.last_checkpoint = self.checkpoints.commit(
                self.global_step,
                trainer_state={
                    "epoch": self.epoch,
                    "kl_coef": self.kl_controller.value,
                    "metrics": row,
                    "train_rows": len(self.train_loader.dataset),
                    "input_files": self._input_files,
                },
                dataloader_state=None if save_model_only else loader_state or self.train_loader.state_dict(),
                required=("actor", "critic") if self.use_critic else ("actor",),
            )
        self._saved_step = self.global_step
        self._last_save_time = time.monotonic()

    def _say_if_the_files_changed(self, saved: dict[str, str] | None, path: str) -> None:
        """A reward file (or template, tools file) edited since the checkpoint: the curves before and after the
        resume measure different things, which the config alone does not show (its keys name the same path)."""
        changed = changed_input_files(saved, self._input_files)
        if changed:
            logger.warning(
                "The file of %s changed since %s was saved: the scores (or prompts) of the steps before and after "
                "this resume are not comparable.",
                ", ".join(changed),
                path,
            )

    def _resume(self) -> bool:
        """Restore the newest checkpoint of this run (after a worker restart) or, at the start, the one the config
        asks for; with none, the state the run started from. True when a checkpoint was loaded."""
        self._rollout_metrics = []
        path = self.last_checkpoint or resolve_resume_path(self.config.trainer)
        if path is None:
            self.train_loader.load_state_dict(self._initial_loader_state)
            self.kl_controller.value = self._initial_kl_coef
            self._start_epoch = self.global_step = self._saved_step = self._epoch_batches = 0
            self.tracker.rewind_to(-1)  # rows of an earlier attempt at this run are trained again
            return False
        logger.warning("Resuming from %s", path)
        state = load_trainer_state(path)
        loader_state = load_dataloader_state(path)
        if loader_state is None:  # checked before Ray starts (check_resume_point); here for a restart's checkpoint
            raise model_only_error(path)
        step = int(state["global_step"])
        warn_of_config_changes(self.workers.actor_rollout.load_checkpoint(f"{path}/actor"), "worker.actor.optim", step)
        if self.use_critic:
            critic_changes = self.workers.critic.load_checkpoint(f"{path}/critic")
            warn_of_config_changes(critic_changes, "worker.critic.optim", step)
        loader_state = restore_position(self.train_loader, loader_state, state.get("train_rows"), path)
        self._epoch_batches = batches_drawn(loader_state)
        self._say_if_the_files_changed(state.get("input_files"), path)
        self._start_epoch = state["epoch"]
        self.kl_controller.value = state["kl_coef"]
        self.global_step = self._saved_step = int(state["global_step"])
        self.last_checkpoint = path
        self.tracker.rewind_to(self.global_step, own_step_row(path, self.config.trainer, state))
        return True

"""The run plan: what a config means, decided once before Ray starts and read by every other part.

``make_run_plan`` turns a validated PPOConfig into a frozen ``RunPlan``: which roles exist, whether the update is
on-policy (and so may skip the old-log-prob pass), the per-device batch sizes, the generation batches of one step, the
device adjustments, and the notes a user must read. ``easyrl check`` prints it; ``easyrl train``, the trainer and the
workers take their decisions from it and decide nothing again. The training-step count needs the size of the
training data, so ``with_training_steps`` completes the plan once the data is read (still before Ray starts).
"""

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from ..algorithms import zero_advantage
from ..paths import PROJECT_ROOT
from ..utils.platform import nvidia_gpus_visible
from .compat import LOSS_AVG_MODE_ALIASES, LOSS_TYPE_ALIASES
from .load import read_config
from .schema import JudgeConfig, PPOConfig
from .validate import (
    CRITIC_ESTIMATORS,
    ESTIMATOR_SETTINGS,
    LOSS_SETTINGS,
    check_critic_warmup,
    config_value,
    env_owns_data,
    env_owns_reward,
    uses_critic,
    validate_config,
)


# The reward of a tool environment with get_reward when no reward function is given (TRL's contract).
ENV_REWARD_FILE = str(PROJECT_ROOT / "reward_function" / "env_reward.py")


@dataclass(frozen=True)
class RunPlan:
    """The fully decided description of one run (``config`` holds every resolved key)."""

    config: PPOConfig
    """The resolved config: defaults <- file <- overrides, derived values filled, validated."""
    use_reference: bool
    """A frozen reference policy runs (KL is on, as a loss or in the reward)."""
    use_critic: bool
    """A value model is trained (the advantage estimator learns one)."""
    kl_in_reward: bool
    """The KL to the reference is a per-token reward penalty (computed from the OLD log-probs, before advantages)."""
    kl_loss: bool
    """The KL to the reference is a term of the actor's loss."""
    on_policy: bool
    """Each batch makes exactly one optimizer step and nothing before the update needs the old log-probs: the update
    uses its own detached log-probs as the old ones and the separate old-log-prob pass is skipped."""
    old_log_prob_reason: str
    """Why the old-log-prob pass runs (or why it is skipped), for the printed plan."""
    actor_optimizer_steps_per_batch: int
    """Optimizer steps of the actor per training step: ppo_epochs x rollout_batch_size / global_batch_size."""
    generation_batch_size: int
    """Prompts per generate call: data.mini_rollout_batch_size, or data.rollout_batch_size."""
    generation_rounds_per_step: int
    """Generate calls a step needs to collect rollout_batch_size prompts when no group is filtered out."""
    rollout_enforce_eager: bool
    """What the engine runs with: worker.rollout.enforce_eager, or true where CUDA graphs do not exist."""
    validate_at_end: bool
    """Validation runs after the last step (every run with validation data, as EasyR1 does)."""
    training_steps: Optional[int] = None
    """Training steps of the run; known once the training data is read (trainer.max_steps sets it outright)."""
    validation_prompts: Optional[int] = None
    """Prompts of the validation data that each validation generates for; known once the data is read."""
    notes: tuple[str, ...] = ()
    """What the user should know about this run: settings adjusted to the device, and settings that do nothing beside
    the others (the keys whose meaning differs from EasyR1's are listed, with the reason, in docs/config.md)."""

    @property
    def world_size(self) -> int:
        """Workers (devices) of the run: trainer.nnodes x trainer.n_gpus_per_node."""
        return self.config.world_size

    @property
    def use_reward_model(self) -> bool:
        """A sequence-classification reward model scores the responses (worker.reward.judge.kind=classifier)."""
        return self.config.worker.reward.judge.kind == "classifier"

    @property
    def ref_from_actor(self) -> bool:
        """The reference policy is the actor with its LoRA adapters switched off (worker.actor.model.lora.rank > 0):
        no reference model is built, the actor's module scores the reference log-probs."""
        return self.use_reference and self.config.worker.actor.model.lora.rank > 0

    @property
    def worker_role(self) -> str:
        """The role set of the hybrid-engine worker group (the reference and the reward model share the actor's
        processes)."""
        role = "actor_rollout_ref" if self.use_reference and not self.ref_from_actor else "actor_rollout"
        return role + "_rm" if self.use_reward_model else role

    @property
    def generation_worker_role(self) -> str:
        """The role set of `easyrl generate` / `easyrl eval`: the rollout engine alone (vLLM loads the weights from
        the model path), plus the actor only for the hf engine, which generates with the actor's module; never an
        optimizer step, so no reference or critic."""
        role = "rollout" if self.config.worker.rollout.name == "vllm" else "actor_rollout"
        return role + "_rm" if self.use_reward_model else role

    def with_training_steps(self, generation_batches_per_epoch: int) -> "RunPlan":
        """The plan completed with the step count, from the training loader's length (batches of
        ``generation_batch_size`` prompts). EasyR1's rule: max_steps when set, else whole rollout batches per epoch
        times total_epochs."""
        config = self.config
        if config.trainer.max_steps is not None:
            steps, counted_by = config.trainer.max_steps, "trainer.max_steps"
        elif not config.algorithm.online_filtering:
            # a step draws generation_rounds_per_step whole batches: with a generation batch that does not divide
            # the rollout batch, prompts // rollout_batch_size would count steps the epoch has no batches for, and
            # total_epochs=1 would run into a second pass
            per_epoch = generation_batches_per_epoch // self.generation_rounds_per_step
            steps = per_epoch * config.trainer.total_epochs
            counted_by = f"{per_epoch} steps per epoch x trainer.total_epochs={config.trainer.total_epochs}"
        else:  # rounds vary with what the filter keeps: EasyR1's count, by prompts
            prompts_per_epoch = generation_batches_per_epoch * self.generation_batch_size
            steps = prompts_per_epoch // config.data.rollout_batch_size * config.trainer.total_epochs
            counted_by = f"{prompts_per_epoch} prompts per epoch x trainer.total_epochs={config.trainer.total_epochs}"
        if steps <= 0:
            raise ValueError(
                f"The training data gives {generation_batches_per_epoch} batches of {self.generation_batch_size} "
                f"prompts per epoch: not one step of `data.rollout_batch_size`={config.data.rollout_batch_size} "
                "prompts. Use more data, a smaller rollout_batch_size, or set trainer.max_steps."
            )
        check_critic_warmup(config, steps, counted_by)
        # the actor's schedule spans the steps that update it: during trainer.critic_warmup its scheduler does not
        # advance (EasyR1 and verl size it over every step, so a cosine schedule never reaches its floor)
        config.worker.actor.optim.training_steps = steps - config.trainer.critic_warmup
        config.worker.critic.optim.training_steps = steps
        return dataclasses.replace(self, training_steps=steps)

    def describe(self, start_step: int = 0) -> str:
        """The plan as the lines `easyrl check` prints; ``start_step``: the step the run resumes at (0: afresh)."""
        config, actor, critic = self.config, self.config.worker.actor, self.config.worker.critic
        roles = (
            ["actor", "rollout"]
            + (
                ["ref (the actor with its LoRA adapters off)" if self.ref_from_actor else "ref"]
                if self.use_reference
                else []
            )
            + (["reward model"] if self.use_reward_model else [])
            + (["critic"] if self.use_critic else [])
        )
        algorithm = config.algorithm
        if self.kl_in_reward:  # the controller steers the in-reward penalty only
            kl = f"{algorithm.kl_penalty} in the reward (coefficient {algorithm.kl_coef:g}, {algorithm.kl_type})"
        elif self.kl_loss:
            kl = f"{algorithm.kl_penalty} as an actor loss (coefficient {actor.kl_coef:g})"
        else:
            kl = "off"
        aggregation = LOSS_AVG_MODE_ALIASES.get(actor.loss_avg_mode, actor.loss_avg_mode)
        steps = steps_described(self.training_steps, config.trainer, "rollout batches")
        if config.trainer.max_steps is None and config.algorithm.online_filtering:
            steps += (
                " (a filtered step draws more prompts than a batch: the data is cycled more often than the epochs)"
            )
        lines = [
            f"workers: {self.world_size} ({config.trainer.nnodes} node(s) x {config.trainer.n_gpus_per_node}), "
            f"roles: {', '.join(roles)}",
            f"advantage estimator: {algorithm.adv_estimator}, policy loss: {actor.loss_type} ({aggregation}), "
            f"KL: {kl}",
            f"per step: {config.data.rollout_batch_size} prompts x {config.worker.rollout.n} samples, generated in "
            f"{self.generation_rounds_per_step} call(s) of {self.generation_batch_size} prompts"
            + (" (online filtering may add rounds)" if config.algorithm.online_filtering else "")
            + (
                ", each followed by one greedy answer per prompt (ReMax's baseline, arXiv 2310.10505)"
                if config.algorithm.adv_estimator == "remax"
                else ""
            ),
            f"actor: {_update_batches(config, actor, self.actor_optimizer_steps_per_batch)}",
            *([f"LoRA: {_lora_summary(config)}"] * (actor.model.lora.rank > 0)),
            *(
                [f"critic: {_update_batches(config, critic, _optimizer_steps(config, critic), 'values')}"]
                * self.use_critic
            ),
            f"reward: {_reward_summary(config.worker.reward)}",
            f"old log-probs: {self.old_log_prob_reason}",
            f"zero-advantage samples: {zero_advantage.decision(actor)[1]}",
            f"training steps: {steps}",
            *(
                [
                    f"critic warmup: steps 1-{config.trainer.critic_warmup} train the critic only; the actor's first "
                    f"update, and its learning-rate schedule, begin at step {config.trainer.critic_warmup + 1} "
                    f"(trainer.critic_warmup); the schedule spans the actor's "
                    f"{actor.optim.training_steps if actor.optim.training_steps > 0 else 'remaining'} steps"
                ]
                * (self.use_critic and config.trainer.critic_warmup > 0)
            ),
            f"validation: {_validation_schedule(config, self.validate_at_end, start_step, self.validation_prompts)}",
            f"checkpoints: {checkpoint_schedule(config.trainer)}",
        ]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def _lora_summary(config: PPOConfig) -> str:
    """The adapters a LoRA run trains and how the engine gets them: the base weights and a VLM's vision tower stay
    frozen unless said (EasyR1's LoRA recipe leaves freeze_vision_tower false, which LoRA does not read)."""
    lora, rollout = config.worker.actor.model.lora, config.worker.rollout
    targets = lora.target_modules if isinstance(lora.target_modules, str) else ",".join(map(str, lora.target_modules))
    parts = [
        f"rank {lora.rank}, alpha {lora.alpha}, on {targets}"
        + (f" (not {lora.exclude_modules})" if lora.exclude_modules else "")
        + (f", dropout {lora.dropout:g}" if lora.dropout else ""),
        f"learning rate {lora.lr if lora.lr is not None else config.worker.actor.optim.lr:g}"
        + (" (optim.lr)" if lora.lr is None else ""),
        "a vision-language model's vision tower "
        + (
            "gets adapters too (lora.vision_tower)" if lora.vision_tower else "stays frozen (lora.vision_tower: false)"
        ),
    ]
    if rollout.name == "vllm":
        route = {
            "adapter": "the adapters alone",
            "merged": "the merged weights (a full-model sync)",
            "auto": "the adapters alone where vLLM's LoRA serves every adapted module, else the merged weights "
            + ("(the vision tower's adapters: merged)" if lora.vision_tower else "(said when the engine starts)"),
        }.get(rollout.lora_sync, rollout.lora_sync)
        parts.append(f"after each update the engine gets {route} (worker.rollout.lora_sync={rollout.lora_sync})")
    return "; ".join(parts)


def _optimizer_steps(config: PPOConfig, role: Any) -> int:
    """Optimizer steps a role (the actor, the critic) makes per training step: its epochs x its mini-batches."""
    return role.ppo_epochs * (config.data.rollout_batch_size // role.global_batch_size)


def _update_batches(config: PPOConfig, role: Any, steps: int, forward: str = "log-probs") -> str:
    """A role's update as the plan says it: optimizer steps, samples per device per step, micro-batches (a token
    budget with dynamic batching: the sizes times the padded length, models/dynamic_batching.py)."""
    if role.dynamic_batching:
        padded = config.data.max_prompt_length + config.data.max_response_length
        micro_batches = (
            f"micro-batches of up to {role.micro_batch_size_per_device_for_update * padded} (update) / "
            f"{role.micro_batch_size_per_device_for_experience * padded} ({forward}) real tokens (dynamic "
            f"batching: micro_batch_size_per_device_for_* x the padded length {padded}, prompt + response)"
        )
    else:
        micro_batches = (
            f"micro-batches of {role.micro_batch_size_per_device_for_update} (update) / "
            f"{role.micro_batch_size_per_device_for_experience} ({forward}) samples"
        )
    return (
        f"{steps} optimizer step(s) per training step, {role.global_batch_size_per_device} samples per device per "
        f"optimizer step, {micro_batches}"
    )


def steps_described(training_steps: Optional[int], trainer: Any, batches: str) -> str:
    """A plan's training-step count: known, set by trainer.max_steps, or counted when the data is read (``batches``
    per epoch x trainer.total_epochs)."""
    if training_steps is not None:
        return str(training_steps)
    if trainer.max_steps is not None:
        return f"{trainer.max_steps} (trainer.max_steps)"
    return f"set when the training data is read ({batches} per epoch x {trainer.total_epochs} epochs)"


def checkpoint_schedule(trainer: Any) -> str:
    """When a run (RL or SFT) checkpoints (`trainer.checkpoint.saves_after`), where, and how many it keeps. Said in
    full because verl's trainer.save_freq=-1 saves nothing, and easyrl's saves the last step (model and optimizer)."""
    if trainer.val_only:
        return "none (trainer.val_only: no training)"
    when = []
    if trainer.save_freq > 0:
        when.append(f"every {trainer.save_freq} steps")
    if trainer.save_every_minutes > 0:
        when.append(f"every {trainer.save_every_minutes:g} minutes")
    only = f" (trainer.save_freq {trainer.save_freq}: that one only)" if trainer.save_freq <= 0 else ""
    when.append("after the last step" + only)
    when.append("at a stop signal")
    what = "the model alone (trainer.save_model_only)" if trainer.save_model_only else "model and optimizer"
    kept = (
        f"the newest {trainer.save_limit} kept"
        if trainer.save_limit > 0
        else f"all kept (trainer.save_limit {trainer.save_limit})"
    )
    return f"{', '.join(when)}; {what}, in {trainer.save_checkpoint_path}, {kept}"


def _reward_summary(reward: Any) -> str:
    """What a sample's `overall` is made of: the reward function, and the judge's share when one is on."""
    rule = reward.reward_function or "none"
    if reward.reward_weights:
        rule += f" (weights {reward.reward_weights})"
    judge = reward.judge
    if judge.kind == "none":
        return rule
    source = f"{judge.model or 'the served model'} at {judge.base_url}" if judge.kind == "http" else judge.model_path
    return f"{reward.rule_weight} x {rule} + {judge.weight} x judge ({judge.kind}: {source})"


def _validation_schedule(config: PPOConfig, at_end: bool, start_step: int, prompts: Optional[int]) -> str:
    """When validation runs (``start_step``: where the run resumes, 0 afresh), and of how many prompts when the data
    was read: a large validation set runs in full every time."""
    trainer = config.trainer
    if not config.data.val_files:
        return "none (data.val_files is empty)"
    size = "" if prompts is None else f" ({prompts} prompts each time)"
    if trainer.val_only:
        return (
            f"once, of the model the run starts from (a checkpoint's when it resumes one; val_only: no training){size}"
        )
    parts = []
    if trainer.val_before_train:
        # validates_first: a resumed run validated its start when it began (EasyR1 validates again on every resume)
        parts.append(
            "before training" if start_step == 0 else f"not before training (it resumes after step {start_step})"
        )
    if trainer.val_freq > 0:
        parts.append(f"every {trainer.val_freq} steps")
    if at_end:
        parts.append("at the end")
    return ", ".join(parts) + size


def _old_log_prob_decision(config: PPOConfig, kl_in_reward: bool) -> tuple[bool, str]:
    """(on_policy, reason). The separate forward pass is needed unless the update sees each sample exactly once in
    one optimizer step (the ratio pi/pi_old is then 1 at that step) AND nothing before the update reads the old
    log-probs: the in-reward KL penalty does, since it is part of the rewards the advantages are computed from."""
    actor = config.worker.actor
    if actor.ppo_epochs != 1:
        return False, f"computed (worker.actor.ppo_epochs={actor.ppo_epochs}: later epochs need the old policy)"
    if actor.global_batch_size < config.data.rollout_batch_size:
        return False, (
            f"computed ({config.data.rollout_batch_size // actor.global_batch_size} mini-batches per step: later "
            "ones are off-policy)"
        )
    if config.algorithm.recompute_old_log_probs:
        return False, "computed (algorithm.recompute_old_log_probs=true)"
    if kl_in_reward:
        return False, "computed (the in-reward KL penalty reads them before the update)"
    # the update's forward runs in train mode, where dropout is on: its log-probs are not the policy's, so neither
    # the old log-probs nor the engine-vs-trainer check may come from it
    if actor.model.lora.rank > 0 and actor.model.lora.dropout > 0:
        return False, (
            f"computed (worker.actor.model.lora.dropout={actor.model.lora.dropout}: the update's forward drops "
            "adapter inputs, so its log-probs are not the policy's)"
        )
    overrides = (actor.model.override_config or {}).items()
    dropout = next(
        ((k, v) for k, v in overrides if "dropout" in str(k) and isinstance(v, (int, float)) and v > 0), None
    )
    if dropout:
        key, value = dropout
        return False, (
            f"computed (worker.actor.model.override_config.{key}={value}: the update's forward drops activations, "
            "so its log-probs are not the policy's)"
        )
    return True, "skipped (one optimizer step per batch: the update's own detached log-probs are the old ones)"


def _computes_in_fp32(fsdp, default_dtype: str) -> bool:
    """A role's forward runs in fp32: its weights are held (``torch_dtype``, else the role's default) and cast
    (``mp_param_dtype``) to fp32."""
    return all(dtype in ("fp32", "float32") for dtype in (fsdp.torch_dtype or default_dtype, fsdp.mp_param_dtype))


def _precision_note(config: PPOConfig, role: str) -> Optional[str]:
    """The reference loads in bf16 unless told (EasyR1's default), and the critic computes in bf16 (its default
    mp_param_dtype): beside an actor that computes in fp32 (a CPU run) the first makes the KL rounding noise before any
    update, the second rounds the values to bf16 (0.44140625), said here."""
    actor, other = config.worker.actor.fsdp, getattr(config.worker, role).fsdp
    default = "bf16" if role == "ref" else "fp32"  # the weights' dtype when torch_dtype is unset
    if not _computes_in_fp32(actor, "fp32") or _computes_in_fp32(other, default):
        return None
    weights = other.torch_dtype or default
    lower = other.mp_param_dtype if weights in ("fp32", "float32") else weights
    effect = (
        "the KL is not 0 at the first step, from rounding alone"
        if role == "ref"
        else f"its values and their gradients are rounded to {lower}"
    )
    name = "reference" if role == "ref" else role
    return (
        f"the actor computes in fp32 and the {name} in {lower} (worker.{role}.fsdp: torch_dtype={other.torch_dtype}, "
        f"mp_param_dtype={other.mp_param_dtype}): {effect}; set worker.{role}.fsdp.torch_dtype=fp32 "
        f"worker.{role}.fsdp.mp_param_dtype=fp32 to match."
    )


def _settings_the_algorithm_does_not_read(config: PPOConfig) -> list[str]:
    """A setting changed from its default that the chosen estimator or policy loss does not read (algorithm.gamma
    with grpo, tau_* with ppo): the run ignores it, so the user hears so rather than comparing runs that differ in
    nothing."""
    defaults, actor = PPOConfig(), config.worker.actor
    loss = LOSS_TYPE_ALIASES.get(actor.loss_type, actor.loss_type)
    notes = []
    for settings, kind, chosen in (
        (ESTIMATOR_SETTINGS, "algorithm.adv_estimator", config.algorithm.adv_estimator),
        (LOSS_SETTINGS, "worker.actor.loss_type", loss),
    ):
        for key, readers in settings.items():
            value, default = config_value(config, key), config_value(defaults, key)
            if value != default and chosen not in readers:
                notes.append(
                    f"{key}={value} does nothing with {kind}={chosen}: it is read by {', '.join(sorted(readers))} "
                    f"only (the run goes on as with {default})."
                )
    return notes


def _set_away_from_defaults(config: PPOConfig, prefixes: tuple[str, ...]) -> list[tuple[str, Any]]:
    """(key, value) of each settable leaf key under ``prefixes`` whose value differs from what the defaults resolve
    to (derived keys, which follow others, are left out). A prefix is a key or a section, matched whole:
    `worker.reward.judge.model` is not under `worker.reward.judge.model_path`."""
    from .load import DERIVED_KEYS, FIELDS, derive

    defaults = PPOConfig()
    derive(defaults)
    return [
        (key, config_value(config, key))
        for key, spec in FIELDS.items()
        if any(f"{key}.".startswith(prefix.rstrip(".") + ".") for prefix in prefixes)
        and key not in DERIVED_KEYS
        and not dataclasses.is_dataclass(spec.type)
        if config_value(config, key) != config_value(defaults, key)
    ]


# values EasyR1's config.yaml writes beside lora.rank 0: every config made from it holds them, not a choice of LoRA
EASYR1_LORA_TEMPLATE = {"worker.actor.model.lora.exclude_modules": ".*visual.*"}


def _lora_settings_without_lora(config: PPOConfig) -> list[str]:
    """`worker.actor.model.lora.*` and `worker.rollout.lora_sync` set away from their defaults in a run without LoRA
    (lora.rank 0), as `key=value`."""
    if config.worker.actor.model.lora.rank > 0:
        return []
    changed = _set_away_from_defaults(config, ("worker.actor.model.lora.", "worker.rollout.lora_sync"))
    return [f"{key}={value}" for key, value in changed if value != EASYR1_LORA_TEMPLATE.get(key)]


def _critic_settings_without_critic(config: PPOConfig) -> list[str]:
    """`worker.critic.*` keys set away from their defaults in a run without a critic, as `key=value`. A value the
    critic takes from the actor when unset (its model path) is not the user's setting, so it is not listed."""
    if uses_critic(config):
        return []

    def from_actor(key: str, value: Any) -> bool:
        try:
            return value == config_value(config, key.replace("worker.critic.", "worker.actor.", 1))
        except AttributeError:  # a key only the critic has (cliprange_value)
            return False

    changed = _set_away_from_defaults(config, ("worker.critic.",))
    return [f"{key}={value}" for key, value in changed if not from_actor(key, value)]


# the worker.reward.judge keys each kind reads (kind and weight aside); a key set for a kind that does not read it is
# noted in the run plan (a vllm judge's timeout_s sets no deadline, a classifier's prompt_template is never opened)
_JUDGE_TEXT_KEYS = ("prompt_template", "score_pattern", "score_range", "temperature", "max_tokens")
JUDGE_KEYS_READ = {
    "http": ("base_url", "model", "api_key_env", "concurrency", "max_retries", "retry_backoff_s", "timeout_s")
    + _JUDGE_TEXT_KEYS,
    "vllm": ("model_path", "dtype", "num_gpus", "gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len")
    + _JUDGE_TEXT_KEYS,
    "classifier": ("model_path", "max_length", "score_transform", "score_scale", "score_offset"),
    "none": (),
}
JUDGE_KIND_READS = {
    "http": "asks a server for each grade and loads no model",
    "vllm": "runs its own engine of model_path, with no server and no request deadline",
    "classifier": "scores with a reward model, with no judge prompt and no reply to read",
    "none": "turns the judge off",
}


def _judge_keys_unread(config: PPOConfig) -> tuple[bool, tuple[str, ...], str, str]:
    kind = config.worker.reward.judge.kind
    read = {"kind", "weight", *JUDGE_KEYS_READ.get(kind, ())} if kind != "none" else {"kind"}
    unread = tuple(f"worker.reward.judge.{f.name}" for f in dataclasses.fields(JudgeConfig) if f.name not in read)
    why = f"worker.reward.judge.kind={kind} {JUDGE_KIND_READS.get(kind, 'reads other keys')}"
    return kind in JUDGE_KEYS_READ, unread, why, "docs/config.md says which judge kind reads each key."


# keys a switch turns off, each with what turns them off: (switch is off, the keys, why, how to turn it on)
def _switched_off(config: PPOConfig) -> list[tuple[bool, tuple[str, ...], str, str]]:
    algorithm = config.algorithm
    return [
        (
            algorithm.disable_kl,
            (
                "algorithm.kl_coef",
                "algorithm.kl_penalty",
                "algorithm.kl_type",
                "algorithm.kl_horizon",
                "algorithm.kl_target",
            ),
            "algorithm.disable_kl=true turns every KL term off",
            "Set algorithm.disable_kl=false for a KL penalty or loss.",
        ),
        (
            not algorithm.online_filtering,
            ("algorithm.filter_key", "algorithm.filter_low", "algorithm.filter_high", "trainer.max_try_make_batch"),
            "algorithm.online_filtering=false keeps every group",
            "Set algorithm.online_filtering=true to drop the groups whose mean score is out of range.",
        ),
        (
            not config.data.val_files,
            (
                "trainer.val_freq",
                "trainer.val_generations_to_log",
                "data.val_batch_size",
                "worker.rollout.val_override_config",
            ),
            "data.val_files is empty (no validation)",
            "Set data.val_files to validate.",
        ),
        _judge_keys_unread(config),
    ]


def _settings_switched_off(config: PPOConfig) -> list[str]:
    """A note per switch that is off while keys only it reads are set away from their defaults (kl_coef with
    disable_kl=true): two runs that differ in them are the same run. A value that agrees with the switch being off (0,
    false, empty: kl_coef=0 beside disable_kl=true) is not noted."""
    notes = []
    for off, keys, why, how in _switched_off(config):
        changed = [f"{key}={value}" for key, value in _set_away_from_defaults(config, keys) if value] if off else []
        if changed:
            notes.append(
                f"{', '.join(changed)}: {why}, so {'this setting does' if len(changed) == 1 else 'these settings do'} "
                f"nothing. {how}"
            )
    return notes


def _settings_without_effect(config: PPOConfig) -> list[str]:
    """Notes on settings a run accepts that do nothing, or nothing of what they ask, beside the others."""
    algorithm, trainer, notes = config.algorithm, config.trainer, _settings_switched_off(config)
    if algorithm.disable_kl and algorithm.use_kl_loss:
        notes.append(
            "algorithm.use_kl_loss=true asks for a KL loss, but algorithm.disable_kl=true turns every KL term off: "
            "there is no KL loss and no reference model. Set algorithm.disable_kl=false for the KL loss."
        )
    if not algorithm.disable_kl and algorithm.kl_coef == 0:
        use = "loss term" if algorithm.use_kl_loss else "reward penalty"
        in_reward_adaptive = algorithm.kl_type == "adaptive" and not algorithm.use_kl_loss
        adaptive = " (the adaptive controller scales it, so it stays 0)" if in_reward_adaptive else ""
        notes.append(
            f"algorithm.kl_coef=0 with the KL on (algorithm.disable_kl=false): a reference model runs every step for "
            f"a {use} of 0 x KL{adaptive}, so the KL is only logged. Set algorithm.disable_kl=true to skip it."
        )
    if not algorithm.disable_kl and algorithm.use_kl_loss and algorithm.kl_type == "adaptive":
        notes.append(
            "algorithm.kl_type=adaptive steers the KL penalty in the reward; with algorithm.use_kl_loss=true the KL "
            f"loss keeps algorithm.kl_coef={algorithm.kl_coef} fixed, so algorithm.kl_target and kl_horizon do "
            "nothing (as in EasyR1). Set algorithm.use_kl_loss=false for an adaptive penalty in the reward."
        )
    if not algorithm.disable_kl and algorithm.use_kl_loss and algorithm.kl_penalty == "kl" and algorithm.kl_coef:
        notes.append(
            "algorithm.use_kl_loss=true with algorithm.kl_penalty=kl: as a loss, the k1 estimate log pi - log pi_ref "
            "has a gradient (grad log pi) whose mean over the policy's own samples is 0, so it adds noise rather "
            "than pulling towards the reference. EasyR1's examples set algorithm.kl_penalty=low_var_kl (k3)."
        )
    actor = config.worker.actor
    if actor.loss_type == "cispo" and actor.clip_ratio_low < 1:
        # EasyR1's CISPO example sets clip_ratio_low=0, which raises every weight below 1 to 1
        notes.append(
            f"worker.actor.loss_type=cispo with clip_ratio_low={actor.clip_ratio_low}: the importance weight is "
            f"floored at 1 - clip_ratio_low = {1 - actor.clip_ratio_low:g}, so a token whose probability fell since "
            "the rollout is weighted as if it had fallen less; the CISPO paper (arXiv 2506.13585) sets no lower "
            "bound: worker.actor.clip_ratio_low=1 or more. It matters only off-policy (ppo_epochs > 1 or "
            "mini-batches), where the ratio is not 1."
        )
    rollout, val = config.worker.rollout, config.worker.rollout.val_override_config or {}
    val_n = val.get("n", rollout.n)
    if val.get("temperature", rollout.temperature) == 0 and val_n > 1:
        notes.append(
            f"worker.rollout.val_override_config samples greedily (temperature 0) with n={val_n}: the {val_n} answers "
            f"to a prompt are the same answer, generated and scored {val_n} times. Set val_override_config.n=1, or a "
            "temperature above 0 for several different answers."
        )
    if algorithm.online_filtering and rollout.n == 1:
        notes.append(
            "algorithm.online_filtering with worker.rollout.n=1: each group is one sample, so its mean "
            f"{algorithm.filter_key} is that sample's own score, and a sample scored {algorithm.filter_low:g} or "
            f"below, or {algorithm.filter_high:g} or above, is dropped (with a 0/1 reward, every one). Online "
            "filtering is for groups of several samples (worker.rollout.n > 1)."
        )
    if config.worker.actor.shared_prefix and rollout.n == 1:
        notes.append(
            "worker.actor.shared_prefix with worker.rollout.n=1: each prompt has one sample, so no prompt is shared "
            "and every pass computes as without it. It saves compute for groups of several samples (n > 1)."
        )
    if not trainer.logger:
        notes.append(
            "trainer.logger=[]: the run logs no metrics (no line per step, no metrics.jsonl, no curves); its "
            "checkpoints are written as usual. Add console and file (the defaults) to see it learn."
        )
    notes += _settings_the_algorithm_does_not_read(config)
    lora = _lora_settings_without_lora(config)
    if lora:
        notes.append(
            f"{', '.join(lora)}: worker.actor.model.lora.rank=0 trains full weights, so "
            f"{'this LoRA setting does' if len(lora) == 1 else 'these LoRA settings do'} nothing. Set "
            "worker.actor.model.lora.rank (e.g. 64) to train LoRA adapters."
        )
    unread = _critic_settings_without_critic(config)
    if unread:
        notes.append(
            f"{', '.join(unread)}: algorithm.adv_estimator={algorithm.adv_estimator} learns no value model, so the run "
            f"has no critic and {'this setting does' if len(unread) == 1 else 'these settings do'} nothing. Set "
            f"algorithm.adv_estimator={' or '.join(sorted(CRITIC_ESTIMATORS))} to train a critic."
        )
    if not nvidia_gpus_visible():
        # host-memory offload has nothing to move where the workers compute on the CPU (fsdp_utils, fsdp_worker)
        roles = {name: getattr(config.worker, name) for name in ("actor", "ref", "critic")}
        offloads = [
            f"worker.{name}.{key}"
            for name, role in roles.items()
            if {"critic": uses_critic(config), "ref": not config.algorithm.disable_kl}.get(name, True)
            for key, on in (
                ("fsdp.enable_cpu_offload", role.fsdp.enable_cpu_offload),
                ("offload.offload_params", role.offload.offload_params),
                ("offload.offload_optimizer", role.offload.offload_optimizer),
            )
            if on
        ]
        if offloads:
            notes.append(
                f"{', '.join(offloads)}: offloading to host memory is for GPUs; on a machine without CUDA the "
                "parameters and optimizer states are in host memory already, so nothing moves."
            )
    context, rollout = config.worker.rollout.max_model_len, config.worker.rollout
    if (
        rollout.name == "vllm"
        and context is not None
        and context < config.data.max_prompt_length + (config.data.max_response_length)
    ):
        notes.append(
            f"worker.rollout.max_model_len={context} is below data.max_prompt_length + data.max_response_length "
            f"({config.data.max_prompt_length} + {config.data.max_response_length}): a response stops where its "
            f"prompt and it fill the {context}-token context, before data.max_response_length for prompts longer "
            f"than {context - config.data.max_response_length} tokens."
        )
    if trainer.critic_warmup > 0 and not uses_critic(config) and not trainer.val_only:
        # a note, not a refusal: EasyR1 runs the same loop, and its configs load and run unchanged
        notes.append(
            f"trainer.critic_warmup={trainer.critic_warmup} but the run has no critic (algorithm.adv_estimator="
            f"{algorithm.adv_estimator} learns no value model): the first {trainer.critic_warmup} steps generate "
            "and score without updating the actor, as in EasyR1. Set trainer.critic_warmup=0 to train the policy "
            "from the first step."
        )
    return notes


def make_run_plan(config: PPOConfig, needs_reward: bool = True) -> RunPlan:
    """Validate ``config`` and decide everything about the run that does not need the data or the workers
    (``needs_reward=False``: `easyrl generate`, which scores only when a reward function is given)."""
    notes = []
    multi_turn = config.worker.rollout.multi_turn
    if not config.worker.reward.reward_function and env_owns_reward(multi_turn.env):
        # TRL's contract: an environment with get_reward is a reward source of its own, no reward function needed
        config.worker.reward.reward_function = f"{ENV_REWARD_FILE}:compute_score"
        notes.append(
            "worker.reward.reward_function is empty and the environment has get_reward: the reward is what it returns "
            f"({ENV_REWARD_FILE})."
        )
    validate_config(config, needs_reward)
    algorithm, data, actor, rollout = config.algorithm, config.data, config.worker.actor, config.worker.rollout
    use_reference = not algorithm.disable_kl
    kl_in_reward = use_reference and not algorithm.use_kl_loss
    on_policy, reason = _old_log_prob_decision(config, kl_in_reward)
    for role, used in (("ref", use_reference), ("critic", uses_critic(config))):
        if used and (precision := _precision_note(config, role)):
            notes.append(precision)
    notes += _settings_without_effect(config)
    reward_length = (config.worker.reward.reward_function_kwargs or {}).get("max_response_length")
    if reward_length is not None and reward_length != data.max_response_length:
        # DAPO's overlong penalty (reward_function/dapo.py) measures responses against its own copy of the limit
        notes.append(
            f"worker.reward.reward_function_kwargs.max_response_length is {reward_length} and "
            f"data.max_response_length {data.max_response_length}: a penalty the reward counts from its own limit "
            "(dapo.py's overlong buffer) applies to other lengths than the responses have; make them equal."
        )
    generation_batch_size = data.mini_rollout_batch_size or data.rollout_batch_size
    unused = -data.rollout_batch_size % generation_batch_size
    if unused and not config.algorithm.online_filtering and not config.trainer.val_only:
        # the last round of a step overshoots; EasyR1 drops the extra groups alike (a filter drops groups anyway)
        notes.append(
            f"data.mini_rollout_batch_size={generation_batch_size} does not divide data.rollout_batch_size="
            f"{data.rollout_batch_size}: each step generates {data.rollout_batch_size + unused} prompts' samples and "
            f"trains on the first {data.rollout_batch_size}; the other {unused} prompts are generated for nothing and "
            "skipped for this epoch (reward/* and rollout/* count them too, critic/score/* and response_length/* "
            "only the trained). Make it a divisor."
        )
    if env_owns_data(config):
        notes.append(
            f"data.train_files is empty: the environment owns the data; each training prompt is what its reset "
            f"returns, {config.trainer.max_steps} steps (trainer.max_steps)"
            + (", without data.format_prompt (it formats dataset rows)" if data.format_prompt else "")
            + "."
        )
    enforce_eager = rollout.enforce_eager
    if not enforce_eager and rollout.name == "vllm" and not nvidia_gpus_visible():
        enforce_eager = True
        notes.append(
            "worker.rollout.enforce_eager=false asks for CUDA graphs, which a machine without CUDA does not have: "
            "the engine runs eagerly."
        )
    rollout.enforce_eager = enforce_eager  # the resolved config says what the engine runs with
    return RunPlan(
        config=config,
        use_reference=use_reference,
        use_critic=uses_critic(config),
        kl_in_reward=kl_in_reward,
        kl_loss=use_reference and algorithm.use_kl_loss,
        on_policy=on_policy,
        old_log_prob_reason=reason,
        actor_optimizer_steps_per_batch=_optimizer_steps(config, actor),
        generation_batch_size=generation_batch_size,
        generation_rounds_per_step=math.ceil(data.rollout_batch_size / generation_batch_size),
        rollout_enforce_eager=enforce_eager,
        validate_at_end=bool(data.val_files),
        notes=tuple(notes),
    )


def load_run_plan(args: Optional[list[str]] = None) -> RunPlan:
    """`config=FILE` and `key=value` arguments -> the run plan (raises ConfigError naming the key)."""
    return make_run_plan(read_config(args))

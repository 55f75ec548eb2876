"""Validation: everything that can be checked before Ray starts, in well under two seconds (nothing heavy is
imported: no torch, no model, no data). A config that passes runs; the workers check nothing again."""

import difflib
import os
from pathlib import Path
from typing import Any, Optional

from ..demo import builtin_models
from ..paths import BUILTIN_PREFIX, looks_local, shipped_files_hint
from ..workers.reward.loader import RewardFunctionError, resolve_reward_function
from .schema import ConfigError, PPOConfig


# Names of the registered algorithms and loggers, listed here so that check needs no torch import; a test asserts
# they equal the registries (easyrl.algorithms.*, easyrl.trainer.loggers), so adding one fails loudly until listed.
ADV_ESTIMATORS = ("gae", "grpo", "grpo_passk", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo")
POLICY_LOSSES = ("cispo", "gspo", "gspo_token", "ppo", "sapo")
KL_PENALTIES = ("abs", "full", "kl", "low_var_kl", "mse")
LOGGER_NAMES = ("console", "file", "mlflow", "swanlab", "tensorboard", "wandb")
# estimators that learn a value model (a critic role exists), and those that compare the n samples of a prompt
CRITIC_ESTIMATORS = frozenset({"gae"})
GROUP_ESTIMATORS = frozenset({"grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline"})

CHOICES = {
    "algorithm.adv_estimator": ADV_ESTIMATORS,
    "worker.actor.loss_type": POLICY_LOSSES,
    "algorithm.kl_penalty": KL_PENALTIES,
    "trainer.logger": LOGGER_NAMES,
    "worker.actor.loss_avg_mode": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"),
    "worker.critic.loss_avg_mode": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"),
    "worker.rollout.name": ("vllm", "hf"),
    "worker.rollout.dtype": ("bf16", "fp16", "fp32", "bfloat16", "float16", "float32"),
    "worker.actor.optim.strategy": ("adamw", "adamw_bf16"),
    "worker.critic.optim.strategy": ("adamw", "adamw_bf16"),
    "worker.actor.optim.lr_scheduler_type": ("constant", "cosine"),
    "worker.critic.optim.lr_scheduler_type": ("constant", "cosine"),
    "algorithm.kl_type": ("fixed", "adaptive"),
    "worker.actor.strategy": ("fsdp",),
    "worker.critic.strategy": ("fsdp",),
    "worker.ref.strategy": ("fsdp",),
}
DTYPE_KEYS = (
    "mp_param_dtype",
    "mp_reduce_dtype",
    "mp_buffer_dtype",
)
DTYPES = ("bf16", "fp16", "fp32", "bfloat16", "float16", "float32")


def _get(config: PPOConfig, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        raise ConfigError(f"`{key}` is `{value}`, which is not one of: {', '.join(choices)}.{hint}")


def _check_model_path(key: str, path: Optional[str], required: bool) -> None:
    if path is None:
        if required:
            raise ConfigError(
                f"`{key}` is not set. Point it at a Hugging Face model folder or hub id, "
                f"or use {BUILTIN_PREFIX}SmolLM2-135M-Instruct for the embedded default model."
            )
        return
    if path.startswith(BUILTIN_PREFIX):
        if path[len(BUILTIN_PREFIX) :] not in builtin_models.BUILTIN_MODELS:
            names = ", ".join(BUILTIN_PREFIX + n for n in builtin_models.BUILTIN_MODELS)
            raise ConfigError(f"`{key}`: unknown built-in model `{path}`; built-in models: {names}.")
        return
    if looks_local(path) and not os.path.exists(os.path.expanduser(path)):
        raise ConfigError(f"`{key}`: local model path `{path}` does not exist.")


def _check_file(key: str, path: Optional[str], what: str, hint: str = "") -> None:
    if path and not Path(path).expanduser().is_file():
        raise ConfigError(f"`{key}`: {what} file `{path}` does not exist.{' ' + hint if hint else ''}")


def _check_positive(key: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"`{key}` must be a positive integer, got {value}.")


def uses_critic(config: PPOConfig) -> bool:
    """The one test of whether a run has a critic (a value model): its advantage estimator learns one."""
    return config.algorithm.adv_estimator in CRITIC_ESTIMATORS


def _check_unsupported(config: PPOConfig) -> None:
    """Settings easyrl accepts as EasyR1 keys but cannot run yet: refused here, naming the key, never at worker start."""
    worker = config.worker
    for role in ("actor", "critic") if uses_critic(config) else ("actor",):
        role_config = getattr(worker, role)
        if role_config.model.lora.rank > 0:
            raise ConfigError(
                f"`worker.{role}.model.lora.rank` is {role_config.model.lora.rank}: LoRA training is not supported "
                f"yet; set worker.{role}.model.lora.rank=0 to train all parameters."
            )
        if role_config.ulysses_size != 1:
            raise ConfigError(
                f"`worker.{role}.ulysses_size` is {role_config.ulysses_size}: Ulysses sequence parallelism is not "
                f"supported yet; set worker.{role}.ulysses_size=1 (long prompts: lower the micro-batch sizes instead)."
            )
    if not worker.hybrid_engine:
        raise ConfigError(
            "`worker.hybrid_engine` is false: easyrl always colocates actor, rollout and reference on the same "
            "devices (the hybrid engine); remove the key or set it to true."
        )


def validate_config(config: PPOConfig) -> None:
    """Raise ConfigError for the first problem found; nothing heavy is imported or started."""
    for key, allowed in CHOICES.items():
        value = _get(config, key)
        if isinstance(value, list):
            for item in value:
                _check_choice(key, item, allowed)
        else:
            _check_choice(key, value, allowed)
    for role in ("actor", "critic", "ref"):
        fsdp = _get(config, f"worker.{role}.fsdp")
        for name in DTYPE_KEYS:
            _check_choice(f"worker.{role}.fsdp.{name}", getattr(fsdp, name), DTYPES)
        if fsdp.torch_dtype is not None:
            _check_choice(f"worker.{role}.fsdp.torch_dtype", fsdp.torch_dtype, DTYPES)

    data, actor, rollout, critic = config.data, config.worker.actor, config.worker.rollout, config.worker.critic
    for key in (
        "data.max_prompt_length",
        "data.max_response_length",
        "data.rollout_batch_size",
        "worker.actor.global_batch_size",
        "worker.actor.micro_batch_size_per_device_for_update",
        "worker.actor.micro_batch_size_per_device_for_experience",
        "worker.rollout.n",
        "worker.rollout.tensor_parallel_size",
        "trainer.nnodes",
        "trainer.n_gpus_per_node",
    ):
        _check_positive(key, _get(config, key))
    if data.min_pixels is not None and data.max_pixels is not None and data.min_pixels > data.max_pixels:
        raise ConfigError(
            f"`data.min_pixels` ({data.min_pixels}) is above `data.max_pixels` ({data.max_pixels}): no picture size "
            "satisfies both; lower min_pixels or raise max_pixels."
        )
    if data.mini_rollout_batch_size is not None:
        _check_positive("data.mini_rollout_batch_size", data.mini_rollout_batch_size)
    if config.trainer.max_steps is not None:
        _check_positive("trainer.max_steps", config.trainer.max_steps)
    if not 0 <= data.filter_overlong_prompts_workers:
        raise ConfigError("`data.filter_overlong_prompts_workers` must be >= 0.")

    world = config.world_size
    if data.rollout_batch_size % actor.global_batch_size != 0:
        raise ConfigError(
            f"`data.rollout_batch_size` ({data.rollout_batch_size}) must be a multiple of "
            f"`worker.actor.global_batch_size` ({actor.global_batch_size}): each step makes "
            f"rollout_batch_size / global_batch_size optimizer steps. Make global_batch_size a divisor of it."
        )
    samples = actor.global_batch_size * rollout.n
    if samples % world != 0:
        raise ConfigError(
            f"`worker.actor.global_batch_size` x `worker.rollout.n` = {samples} samples per optimizer step cannot be "
            f"split evenly over {world} workers (`trainer.nnodes` x `trainer.n_gpus_per_node`). "
            f"Choose a global_batch_size so that the product is a multiple of {world}."
        )
    if actor.global_batch_size_per_device % actor.micro_batch_size_per_device_for_update != 0:
        raise ConfigError(
            f"Each worker gets {actor.global_batch_size_per_device} samples per optimizer step "
            f"(`worker.actor.global_batch_size` x `worker.rollout.n` / {world} workers), which is not a multiple of "
            f"`worker.actor.micro_batch_size_per_device_for_update` ({actor.micro_batch_size_per_device_for_update})."
        )
    if uses_critic(config):
        if data.rollout_batch_size % critic.global_batch_size != 0:
            raise ConfigError(
                f"`data.rollout_batch_size` ({data.rollout_batch_size}) must be a multiple of "
                f"`worker.critic.global_batch_size` ({critic.global_batch_size})."
            )
        if (critic.global_batch_size * rollout.n) % world != 0 or (
            critic.global_batch_size_per_device % critic.micro_batch_size_per_device_for_update != 0
        ):
            raise ConfigError(
                f"`worker.critic.global_batch_size` x `worker.rollout.n` must split into whole micro-batches of "
                f"`worker.critic.micro_batch_size_per_device_for_update` on each of the {world} workers."
            )
    if world % rollout.tensor_parallel_size != 0:
        raise ConfigError(
            f"`worker.rollout.tensor_parallel_size` ({rollout.tensor_parallel_size}) must divide the number of "
            f"workers ({world} = trainer.nnodes x trainer.n_gpus_per_node)."
        )
    if rollout.n == 1 and config.algorithm.adv_estimator in GROUP_ESTIMATORS:
        raise ConfigError(
            f"`algorithm.adv_estimator={config.algorithm.adv_estimator}` compares samples of the same prompt and "
            "needs `worker.rollout.n` > 1 (e.g. worker.rollout.n=8); with n=1 every advantage would be 0."
        )
    _check_unsupported(config)
    if config.algorithm.kl_penalty == "full" and not config.algorithm.disable_kl:
        raise ConfigError(
            "`algorithm.kl_penalty=full` needs the reference model's full next-token distributions, which the "
            "workers do not ship between roles (vocabulary-sized per token). Use low_var_kl, kl, abs or mse."
        )
    if config.algorithm.online_filtering and not config.algorithm.filter_low < config.algorithm.filter_high:
        raise ConfigError(
            "`algorithm.filter_low` must be below `algorithm.filter_high`: online filtering keeps the groups whose "
            "mean score lies strictly between them."
        )

    _check_model_path("worker.actor.model.model_path", actor.model.model_path, required=True)
    _check_model_path("worker.actor.model.tokenizer_path", actor.model.tokenizer_path, required=False)
    if uses_critic(config):
        _check_model_path("worker.critic.model.model_path", critic.model.model_path, required=True)
    if config.worker.reward.reward_function is None:
        raise ConfigError(
            "`worker.reward.reward_function` is not set. Give a reward module as path/to/file.py:function, "
            "e.g. reward_function/math.py:compute_score."
        )
    try:  # the loader's own rule (`main`, else `compute_score`), read from the file without running it
        resolve_reward_function(config.worker.reward.reward_function)
    except RewardFunctionError as err:
        raise ConfigError(str(err)) from None
    _check_file("data.format_prompt", data.format_prompt, "prompt template", shipped_files_hint("format_prompt"))
    _check_file("data.override_chat_template", data.override_chat_template, "chat template")
    if not data.train_files and not config.trainer.val_only:
        raise ConfigError("`data.train_files` is not set. Point it at a .jsonl/.json/.parquet file or name@split.")
    for key in ("data.train_files", "data.val_files"):
        value = _get(config, key)
        if value and not value.startswith(BUILTIN_PREFIX):
            path = value.split("@", 1)[0]
            if looks_local(path) and not os.path.exists(os.path.expanduser(path)):
                raise ConfigError(f"`{key}`: data file `{path}` does not exist.")

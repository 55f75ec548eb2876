"""The plan of an `easyrl sft` run: the config checked for what SFT reads, the per-device batch, the step count.

SFT runs on the RL workers' actor code (FSDP2 model, optimizer, scheduler, micro-batches, padding-free forward), so
it reads the `worker.actor.*` keys; `worker.actor.global_batch_size` counts conversations per optimizer step (there
is no rollout, so no rollout.n factor). With `data.val_files` the same loss is scored on those conversations, without
an update, every `trainer.val_freq` steps and at the end (`val/loss`). The RL-only keys (reward, rollout, algorithm,
ppo_epochs, loss_avg_mode) are not read, and not required.
"""

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional

from ..paths import BUILTIN_PREFIX
from .load import read_config
from .plan import checkpoint_schedule, steps_described
from .schema import ConfigError, PPOConfig
from .validate import (
    CHOICES,
    DTYPE_KEYS,
    DTYPES,
    _check_choice,
    _check_file,
    _check_model_path,
    _check_ranges,
    _check_unsupported,
    check_template_kwargs,
    check_where_the_driver_runs,
    config_value,
)


HF_FOLDER = "huggingface"
ADAPTER_FOLDER = "adapter"  # LoRA runs: the trained adapters alone, next to the merged model


@dataclass(frozen=True)
class SFTPlan:
    """The decided description of one SFT run (``config`` holds every resolved key)."""

    config: PPOConfig
    """The resolved config (defaults <- file <- overrides, derived values filled, checked for SFT)."""
    training_steps: Optional[int] = None
    """Optimizer steps of the run: trainer.max_steps, else whole batches per epoch x trainer.total_epochs (known
    once the data is read)."""

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def hf_output_dir(self) -> str:
        """Where the trained model is written as a Hugging Face folder at the end of the run."""
        return os.path.join(self.config.trainer.save_checkpoint_path, HF_FOLDER)

    @property
    def adapter_output_dir(self) -> Optional[str]:
        """With LoRA, where the trained adapters alone are written as a peft adapter folder; hf_output_dir then holds
        the base model with them merged in, so that an RL run (with or without LoRA of its own) starts from it."""
        if self.config.worker.actor.model.lora.rank == 0:
            return None
        return os.path.join(self.config.trainer.save_checkpoint_path, ADAPTER_FOLDER)

    def with_training_steps(self, batches_per_epoch: int) -> "SFTPlan":
        trainer = self.config.trainer
        steps = trainer.max_steps if trainer.max_steps is not None else batches_per_epoch * trainer.total_epochs
        if steps <= 0:
            raise ValueError(
                f"data.train_files gives {batches_per_epoch} batches of worker.actor.global_batch_size="
                f"{self.config.worker.actor.global_batch_size} conversations per epoch: not one step. Use more data "
                "or a smaller global_batch_size."
            )
        self.config.worker.actor.optim.training_steps = steps
        return dataclasses.replace(self, training_steps=steps)

    def describe(self) -> str:
        config, actor = self.config, self.config.worker.actor
        steps = steps_described(self.training_steps, config.trainer, "batches")
        return "\n".join(
            [
                f"workers: {self.world_size} ({config.trainer.nnodes} node(s) x {config.trainer.n_gpus_per_node}), "
                "role: actor (supervised fine-tuning)",
                f"per step: {actor.global_batch_size} conversations ({actor.global_batch_size_per_device} per device, "
                f"micro-batches of {actor.micro_batch_size_per_device_for_update}), token-mean cross-entropy on the "
                "assistant's tokens",
                f"training steps: {steps}",
                f"checkpoints: {checkpoint_schedule(config.trainer)}",
                "output: none (trainer.val_only: no training)"
                if config.trainer.val_only
                else f"output: the model in {self.hf_output_dir}"
                + (
                    f" (the base with the LoRA adapters merged in; the adapters alone in {self.adapter_output_dir})"
                    if self.adapter_output_dir
                    else ""
                ),
            ]
        )


def validate_sft_config(config: PPOConfig) -> None:
    """Raise ConfigError for the first problem an SFT run would meet; nothing heavy is imported or started."""
    actor, data, world = config.worker.actor, config.data, config.world_size
    missing = [
        key
        for key, value in (
            ("worker.actor.model.model_path", actor.model.model_path),
            ("data.train_files", data.train_files),
        )
        if not value
    ]
    if missing:
        raise ConfigError(f"an SFT run needs a model and data; set {', '.join(f'`{k}`' for k in missing)}.")
    for key, allowed in CHOICES.items():
        value = config_value(config, key)
        for item in value if isinstance(value, list) else [value]:
            _check_choice(key, item, allowed)
    for name in DTYPE_KEYS:
        _check_choice(f"worker.actor.fsdp.{name}", getattr(actor.fsdp, name), DTYPES)
    check_where_the_driver_runs(config.trainer)
    _check_ranges(config)
    _check_unsupported(config)
    if config.sft.max_length < 2:
        raise ConfigError(f"`sft.max_length` is {config.sft.max_length}; a conversation needs at least 2 tokens.")
    if actor.global_batch_size % world != 0:
        raise ConfigError(
            f"`worker.actor.global_batch_size` ({actor.global_batch_size} conversations per optimizer step) cannot be "
            f"split evenly over {world} workers (trainer.nnodes x trainer.n_gpus_per_node); make it a multiple of "
            f"{world}, or set trainer.n_gpus_per_node to the devices this run has"
            + (" (8 is the default; 1 on a CPU or one GPU)." if config.trainer.n_gpus_per_node == 8 else ".")
        )
    if actor.global_batch_size_per_device % actor.micro_batch_size_per_device_for_update != 0:
        raise ConfigError(
            f"Each worker gets {actor.global_batch_size_per_device} conversations per optimizer step "
            f"(worker.actor.global_batch_size / {world} workers), not a multiple of "
            f"`worker.actor.micro_batch_size_per_device_for_update` ({actor.micro_batch_size_per_device_for_update})."
        )
    fsdp_size = actor.fsdp.fsdp_size
    if 0 < fsdp_size < world and world % fsdp_size != 0:
        raise ConfigError(f"`worker.actor.fsdp.fsdp_size` ({fsdp_size}) must divide the number of workers ({world}).")
    _check_model_path("worker.actor.model.model_path", actor.model.model_path, required=True)
    _check_model_path("worker.actor.model.tokenizer_path", actor.model.tokenizer_path, required=False)
    _check_file("data.format_prompt", data.format_prompt, "prompt template")
    _check_file("data.override_chat_template", data.override_chat_template, "chat template")
    check_template_kwargs(data.apply_chat_template_kwargs)
    for key, files in (("data.train_files", data.train_files), ("data.val_files", data.val_files)):
        path = (files or "").split("@", 1)[0]
        if files and not files.startswith(BUILTIN_PREFIX) and os.path.splitext(path)[1] and not os.path.exists(path):
            raise ConfigError(f"`{key}`: data file `{path}` does not exist.")


def make_sft_plan(config: PPOConfig) -> SFTPlan:
    """Check ``config`` for SFT and fill what SFT derives: the conversations per device and optimizer step."""
    config.worker.actor.global_batch_size_per_device = config.worker.actor.global_batch_size // config.world_size
    # SFT samples nothing: the validation loss (data.val_files) reads the actor's log-probs, which the workers score
    # at the rollout temperature; at 1 they are the model's own, as in the training loss
    config.worker.rollout.temperature = 1.0
    validate_sft_config(config)
    return SFTPlan(config=config)


def load_sft_plan(args: Optional[list[str]] = None) -> SFTPlan:
    """`config=FILE` and `key=value` arguments -> the SFT plan (raises ConfigError naming the key)."""
    return make_sft_plan(read_config(args))

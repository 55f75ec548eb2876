"""The PPOConfig tree: every knob of a run, typed and documented in one place.

Each section is a dataclass; the string right under a field is its documentation (``docs/config.md`` is
generated from these strings by ``scripts/gen_config_docs.py``). Key names follow EasyR1, so an EasyR1
``config.yaml`` loads unchanged. Values are resolved as: defaults <- YAML file (``config=path.yaml``) <-
command-line dotted overrides (``worker.rollout.n=8``). Derived values are filled in ``PPOConfig.post_init``.
"""

import ast
import difflib
import os
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message names the key and the fix."""


# ----------------------------------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    train_files: str = ""
    """Training data: a .jsonl/.json/.parquet file, a folder saved by `datasets`, `name@split`, or `builtin://NAME@split`."""
    val_files: str = ""
    """Validation data, same forms as `train_files`; empty disables validation."""
    prompt_key: str = "prompt"
    """Column holding the prompt text."""
    answer_key: str = "answer"
    """Column holding the ground truth handed to the reward function."""
    image_key: str = "images"
    """Column holding a list of images (paths, {"bytes": ...} dicts or PIL images)."""
    video_key: str = "videos"
    """Column holding a list of videos (paths or lists of frames)."""
    image_dir: Optional[str] = None
    """Folder that relative image/video paths are resolved against."""
    video_fps: float = 2.0
    """Frames per second sampled from each video."""
    max_prompt_length: int = 512
    """Longest prompt in tokens (vision tokens included); longer prompts are filtered or rejected."""
    max_response_length: int = 512
    """Longest response the rollout may generate, in tokens."""
    rollout_batch_size: int = 512
    """Prompts per training step (each is sampled `worker.rollout.n` times)."""
    mini_rollout_batch_size: Optional[int] = None
    """Prompts per generation call when online filtering refills a batch; null means rollout_batch_size."""
    val_batch_size: int = -1
    """Prompts per validation generation call; -1 means the whole validation set at once."""
    format_prompt: Optional[str] = None
    """Jinja template file applied to each prompt (rendered with `content`) before the chat template."""
    override_chat_template: Optional[str] = None
    """Jinja chat-template file used instead of the tokenizer's own."""
    shuffle: bool = True
    """Shuffle the training data every epoch."""
    seed: int = 1
    """Seed of the training-data shuffle."""
    min_pixels: Optional[int] = 262144
    """Images smaller than this many pixels are upscaled."""
    max_pixels: Optional[int] = 4194304
    """Images larger than this many pixels are downscaled."""
    filter_overlong_prompts: bool = True
    """Drop prompts longer than max_prompt_length (counted and reported) instead of failing."""
    filter_overlong_prompts_workers: int = 16
    """Processes used to measure prompt lengths when filtering."""
    dataloader_num_workers: int = 0
    """Worker processes preparing batches (0: in the driver; raise it for image/video datasets on big machines)."""


# ----------------------------------------------------------------------------------------------------------------------
# algorithm
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    """Discount factor of GAE and REINFORCE++ returns."""
    lam: float = 1.0
    """GAE lambda."""
    adv_estimator: str = "grpo"
    """Advantage estimator: gae, grpo, grpo_passk, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax."""
    norm_adv_by_std_in_grpo: bool = True
    """grpo / grpo_passk: divide group-centred scores by the group std; false gives Dr. GRPO (arXiv 2503.20783)."""
    disable_kl: bool = False
    """Skip the reference model and every KL term."""
    use_kl_loss: bool = False
    """Apply KL to the reference as a loss term (true) or as a per-token reward penalty (false)."""
    kl_penalty: str = "kl"
    """KL estimator: kl, abs, mse, low_var_kl, full."""
    kl_coef: float = 1e-3
    """KL coefficient (the initial one for the adaptive controller)."""
    kl_type: str = "fixed"
    """KL controller for the in-reward penalty: fixed or adaptive."""
    kl_horizon: float = 10000.0
    """Horizon of the adaptive KL controller."""
    kl_target: float = 0.1
    """Target KL of the adaptive KL controller."""
    recompute_old_log_probs: bool = False
    """Always run the separate old-log-prob forward pass; by default it is skipped when a batch makes exactly one
    optimizer step (ppo_epochs=1, global_batch_size >= rollout_batch_size), where the update's own detached
    log-probs are the old ones."""
    online_filtering: bool = False
    """DAPO dynamic sampling: drop groups whose mean `filter_key` score is outside [filter_low, filter_high]."""
    filter_key: str = "overall"
    """Reward score that online filtering looks at."""
    filter_low: float = 0.01
    """Groups with a mean score below this are dropped by online filtering."""
    filter_high: float = 0.99
    """Groups with a mean score above this are dropped by online filtering."""


# ----------------------------------------------------------------------------------------------------------------------
# worker
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank; 0 trains all parameters."""
    alpha: int = 64
    """LoRA alpha (scaling = alpha / rank)."""
    target_modules: Any = "all-linear"
    """Modules that get adapters: `all-linear` or a list / comma-separated names."""
    exclude_modules: Optional[str] = None
    """Regex of module names that never get adapters (e.g. the vision tower)."""


@dataclass
class ModelConfig:
    model_path: Optional[str] = None
    """Hugging Face model folder or hub id; `builtin://SmolLM2-135M-Instruct` is the embedded default model."""
    tokenizer_path: Optional[str] = None
    """Tokenizer/processor folder or hub id; null means model_path."""
    override_config: dict = field(default_factory=dict)
    """Values that override the model's config.json (e.g. {attention_dropout: 0.0})."""
    enable_gradient_checkpointing: bool = True
    """Recompute activations in the backward pass to save memory."""
    trust_remote_code: bool = True
    """Allow model code shipped with the checkpoint."""
    freeze_vision_tower: bool = False
    """Keep the vision encoder of a VLM frozen."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters."""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """Peak learning rate."""
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    weight_decay: float = 1e-2
    """AdamW weight decay."""
    strategy: str = "adamw"
    """Optimizer: adamw, or adamw_bf16 (states kept in bf16)."""
    lr_warmup_ratio: float = 0.0
    """Share of the training steps used for linear warmup."""
    lr_warmup_steps: Optional[int] = None
    """Warmup steps; overrides lr_warmup_ratio when set."""
    min_lr_ratio: Optional[float] = None
    """Floor of the cosine schedule as a share of lr."""
    lr_scheduler_type: str = "constant"
    """Schedule after warmup: constant or cosine."""
    training_steps: int = -1
    """Total optimizer steps of the run (derived; leave at -1)."""


@dataclass
class FSDPConfig:
    enable_full_shard: bool = True
    """Shard parameters, gradients and optimizer states (false keeps parameters replicated)."""
    enable_cpu_offload: bool = False
    """Let FSDP keep parameters on the CPU between uses (GPU only)."""
    enable_rank0_init: bool = True
    """Load weights on rank 0 only and broadcast them, saving host memory."""
    use_orig_params: bool = False
    """Accepted for compatibility; FSDP2 always keeps the original parameters."""
    torch_dtype: Optional[str] = None
    """Dtype the weights are loaded in: fp32, bf16, fp16; null means fp32 for the actor/critic and bf16 for the ref."""
    fsdp_size: int = -1
    """Devices in one sharding group (hybrid sharding); -1 shards over all."""
    mp_param_dtype: str = "bf16"
    """Mixed precision: dtype of parameters in forward/backward."""
    mp_reduce_dtype: str = "fp32"
    """Mixed precision: dtype of gradient reduction."""
    mp_buffer_dtype: str = "fp32"
    """Mixed precision: dtype of buffers."""


@dataclass
class OffloadConfig:
    offload_params: bool = False
    """Move parameters to the CPU while the role is idle (GPU only)."""
    offload_optimizer: bool = False
    """Move optimizer states to the CPU while the role is idle (GPU only)."""


@dataclass
class ActorConfig:
    strategy: str = "fsdp"
    """Training backend; fsdp (FSDP2) is the one there is."""
    global_batch_size: int = 256
    """Prompts per optimizer step (mini-batch); multiplied by rollout.n into samples."""
    micro_batch_size_per_device_for_update: int = 4
    """Samples per forward/backward pass on one device when updating."""
    micro_batch_size_per_device_for_experience: int = 16
    """Samples per forward pass on one device when computing log-probs."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping; a non-finite norm skips the step."""
    clip_ratio_low: float = 0.2
    """PPO clip: lower bound of the ratio is 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.3
    """PPO clip: upper bound of the ratio is 1 + clip_ratio_high (clip-higher, DAPO)."""
    clip_ratio_dual: float = 3.0
    """Dual-clip PPO constant C: the loss of negative advantages is bounded by C * |A|."""
    loss_avg_mode: str = "token"
    """Loss aggregation: token (token-mean), seq (seq-mean-token-mean), seq-mean-token-sum."""
    loss_type: str = "default"
    """Policy loss: default (PPO clip), gspo, gspo_token, cispo, sapo."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    padding_free: bool = True
    """Pack sequences without padding in forward passes."""
    dynamic_batching: bool = True
    """Form micro-batches by a token budget instead of a fixed sample count."""
    ulysses_size: int = 1
    """Ulysses sequence-parallel size."""
    use_torch_compile: bool = True
    """Compile the log-prob kernels with torch.compile."""
    tau_positive: float = 1.0
    """SAPO temperature of the soft gate for positive advantages."""
    tau_negative: float = 1.05
    """SAPO temperature of the soft gate for negative advantages."""
    tis_cap: Optional[float] = None
    """Truncated importance sampling: weight each token by min(pi_old / pi_rollout, tis_cap); null disables it."""
    entropy_coef: float = 0.0
    """Entropy bonus: the policy loss gets -entropy_coef * mean token entropy; 0 disables it."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer and learning-rate schedule."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 sharding and mixed precision."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """CPU offload between phases."""
    global_batch_size_per_device: int = -1
    """Samples per optimizer step on one device (derived; leave at -1)."""
    disable_kl: bool = False
    """Copied from algorithm.disable_kl (derived)."""
    use_kl_loss: bool = False
    """Copied from algorithm.use_kl_loss (derived)."""
    kl_penalty: str = "kl"
    """Copied from algorithm.kl_penalty (derived)."""
    kl_coef: float = 0.0
    """Copied from algorithm.kl_coef (derived)."""


@dataclass
class CriticConfig:
    strategy: str = "fsdp"
    """Training backend; fsdp (FSDP2) is the one there is."""
    global_batch_size: int = 256
    """Prompts per critic optimizer step; multiplied by rollout.n into samples."""
    micro_batch_size_per_device_for_update: int = 4
    """Samples per forward/backward pass on one device when updating."""
    micro_batch_size_per_device_for_experience: int = 16
    """Samples per forward pass on one device when computing values."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping; a non-finite norm skips the step."""
    cliprange_value: float = 0.5
    """Value clipping range around the old values."""
    loss_avg_mode: str = "token"
    """Loss aggregation: token (token-mean), seq (seq-mean-token-mean), seq-mean-token-sum."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    padding_free: bool = False
    """Pack sequences without padding in forward passes."""
    dynamic_batching: bool = True
    """Form micro-batches by a token budget instead of a fixed sample count."""
    ulysses_size: int = 1
    """Ulysses sequence-parallel size."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The value model; null model_path means the actor's."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer and learning-rate schedule."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 sharding and mixed precision."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """CPU offload between phases."""
    global_batch_size_per_device: int = -1
    """Samples per optimizer step on one device (derived; leave at -1)."""


@dataclass
class RefConfig:
    strategy: str = "fsdp"
    """Backend of the reference model; fsdp (FSDP2)."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 sharding and mixed precision."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """CPU offload between phases."""
    micro_batch_size_per_device_for_experience: int = -1
    """Samples per forward pass on one device; -1 copies the actor's."""
    padding_free: bool = False
    """Copied from the actor (derived)."""
    dynamic_batching: bool = False
    """Copied from the actor (derived)."""
    ulysses_size: int = 1
    """Copied from the actor (derived)."""
    use_torch_compile: bool = True
    """Copied from the actor (derived)."""


@dataclass
class RolloutConfig:
    name: str = "vllm"
    """Rollout engine: vllm (SPMD, on the training devices) or hf (transformers generate)."""
    n: int = 1
    """Responses sampled per prompt (the group size of GRPO)."""
    temperature: float = 1.0
    """Sampling temperature; log-probs of the actor use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    top_k: int = -1
    """Top-k sampling; -1 disables it."""
    seed: int = 1
    """Sampling seed (offset per data-parallel group)."""
    limit_images: int = 0
    """Most images per prompt the engine accepts; 0 means no limit set."""
    dtype: str = "bf16"
    """Dtype of the rollout engine's weights."""
    gpu_memory_utilization: float = 0.6
    """Share of GPU memory vLLM may use (GPU only)."""
    kv_cache_memory_bytes: Optional[int] = None
    """KV-cache size in bytes; on CPU null means 1 GiB per worker (vLLM needs an explicit size there)."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token."""
    enforce_eager: bool = False
    """Disable CUDA graphs in vLLM."""
    enable_chunked_prefill: bool = False
    """Let vLLM split long prefills into chunks."""
    tensor_parallel_size: int = 2
    """Devices per vLLM engine; data parallel across the groups this carves out of the world."""
    max_model_len: Optional[int] = None
    """Context length of the engine; null means max_prompt_length + max_response_length."""
    max_num_batched_tokens: int = 8192
    """Token budget of one vLLM scheduler step."""
    disable_log_stats: bool = True
    """Silence vLLM's periodic statistics."""
    disable_tqdm: bool = False
    """Hide vLLM's progress bar."""
    val_override_config: dict = field(default_factory=dict)
    """Sampling values used for validation, e.g. {temperature: 0, n: 1}."""
    trust_remote_code: bool = False
    """Copied from the actor model (derived)."""
    prompt_length: int = -1
    """Copied from data.max_prompt_length (derived)."""
    response_length: int = -1
    """Copied from data.max_response_length (derived)."""


@dataclass
class RewardConfig:
    reward_function: Optional[str] = None
    """Reward function as `path/to/file.py:function` (function defaults to compute_score)."""
    reward_function_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments passed to the reward function."""
    skip_special_tokens: bool = True
    """Strip special tokens when decoding responses for the reward function."""
    num_cpus: int = 1
    """Reward actors scoring in parallel (one CPU each); 0 scores in the driver process, without the timeout."""
    timeout_s: float = 60.0
    """Seconds one scoring call may take before its samples score 0 and are reported."""


@dataclass
class WorkerConfig:
    hybrid_engine: bool = True
    """Actor, rollout and reference share the same devices and processes."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The policy being trained."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (used by the gae estimator)."""
    ref: RefConfig = field(default_factory=RefConfig)
    """The frozen reference policy for KL."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """The reward function."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The generation engine."""


# ----------------------------------------------------------------------------------------------------------------------
# trainer
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class TrainerConfig:
    total_epochs: int = 15
    """Passes over the training data."""
    max_steps: Optional[int] = None
    """Stop after this many steps; overrides total_epochs."""
    project_name: str = "easy_r1"
    """Project name for the loggers."""
    experiment_name: str = "demo"
    """Run name for the loggers and the default checkpoint folder."""
    logger: list = field(default_factory=lambda: ["console", "file"])
    """Loggers: console, file, tensorboard, wandb, swanlab, mlflow."""
    nnodes: int = 1
    """Nodes in the Ray cluster used for training."""
    n_gpus_per_node: int = 8
    """Workers per node: GPUs, or CPU slots on a machine without GPUs."""
    max_try_make_batch: int = 20
    """Generation rounds online filtering may use to fill one batch; -1 means no limit."""
    critic_warmup: int = 0
    """Steps that update only the critic before the actor starts learning."""
    val_freq: int = -1
    """Validate every this many steps; -1 disables."""
    val_before_train: bool = True
    """Validate once before the first step."""
    val_only: bool = False
    """Validate and exit without training."""
    val_generations_to_log: int = 0
    """Sample generations logged at each validation."""
    save_freq: int = -1
    """Save a checkpoint every this many steps; -1 saves only at the end."""
    save_limit: int = -1
    """Checkpoints kept; the oldest are deleted; -1 keeps all."""
    save_model_only: bool = False
    """Save only model weights (no optimizer or dataloader state)."""
    save_checkpoint_path: Optional[str] = None
    """Checkpoint folder; null means checkpoints/<project_name>/<experiment_name>."""
    load_checkpoint_path: Optional[str] = None
    """Resume from this checkpoint folder (global_step_N)."""
    ray_timeline: Optional[str] = None
    """Write a Ray timeline (chrome trace) to this file at the end."""
    find_last_checkpoint: bool = True
    """Resume from the newest complete checkpoint under save_checkpoint_path when there is one."""


@dataclass
class PPOConfig:
    data: DataConfig = field(default_factory=DataConfig)
    """Datasets, prompt formatting and lengths."""
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    """Actor, critic, reference, rollout and reward."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator, KL and online filtering."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The loop: steps, validation, logging, checkpoints, cluster size."""

    def post_init(self) -> None:
        """Fill every derived value; the one place where one section's values are copied into another's."""
        actor, rollout, ref, critic = self.worker.actor, self.worker.rollout, self.worker.ref, self.worker.critic
        rollout.prompt_length = self.data.max_prompt_length
        rollout.response_length = self.data.max_response_length
        rollout.trust_remote_code = actor.model.trust_remote_code
        if rollout.max_model_len is None:
            rollout.max_model_len = self.data.max_prompt_length + self.data.max_response_length

        actor.loss_avg_mode = LOSS_AVG_MODE_ALIASES.get(actor.loss_avg_mode, actor.loss_avg_mode)
        critic.loss_avg_mode = LOSS_AVG_MODE_ALIASES.get(critic.loss_avg_mode, critic.loss_avg_mode)
        actor.loss_type = LOSS_TYPE_ALIASES.get(actor.loss_type, actor.loss_type)
        actor.disable_kl = self.algorithm.disable_kl
        actor.use_kl_loss = self.algorithm.use_kl_loss
        actor.kl_penalty = self.algorithm.kl_penalty
        actor.kl_coef = self.algorithm.kl_coef

        for model in (actor.model, critic.model):
            model.model_path = _absolute_if_local(model.model_path)
            model.tokenizer_path = _absolute_if_local(model.tokenizer_path)
        if actor.model.tokenizer_path is None:
            actor.model.tokenizer_path = actor.model.model_path
        if critic.model.model_path is None:
            critic.model.model_path = actor.model.model_path
        if critic.model.tokenizer_path is None:
            critic.model.tokenizer_path = actor.model.tokenizer_path

        if ref.micro_batch_size_per_device_for_experience == -1:
            ref.micro_batch_size_per_device_for_experience = actor.micro_batch_size_per_device_for_experience
        ref.padding_free = actor.padding_free
        ref.dynamic_batching = actor.dynamic_batching
        ref.ulysses_size = actor.ulysses_size
        ref.use_torch_compile = actor.use_torch_compile

        world_size = self.trainer.nnodes * self.trainer.n_gpus_per_node
        actor.global_batch_size_per_device = actor.global_batch_size * rollout.n // max(world_size, 1)
        critic.global_batch_size_per_device = critic.global_batch_size * rollout.n // max(world_size, 1)

        if self.trainer.save_checkpoint_path is None:
            self.trainer.save_checkpoint_path = os.path.join(
                "checkpoints", self.trainer.project_name, self.trainer.experiment_name
            )
        self.trainer.save_checkpoint_path = os.path.abspath(self.trainer.save_checkpoint_path)
        reward = self.worker.reward
        reward.reward_function = resolve_shipped_file(reward.reward_function, "reward_function")
        self.data.format_prompt = resolve_shipped_file(self.data.format_prompt, "format_prompt")
        for key in ("format_prompt", "override_chat_template", "image_dir"):
            setattr(self.data, key, _absolute_if_local(getattr(self.data, key)))

    @property
    def world_size(self) -> int:
        return self.trainer.nnodes * self.trainer.n_gpus_per_node


# EasyR1 spells some choices and keys differently across versions; both spellings load.
LOSS_AVG_MODE_ALIASES = {"token": "token-mean", "seq": "seq-mean-token-mean"}
LOSS_TYPE_ALIASES = {"default": "ppo", "vanilla": "ppo"}
LEGACY_KEYS = {
    "worker.actor.ulysses_sequence_parallel_size": "worker.actor.ulysses_size",
    "worker.critic.ulysses_sequence_parallel_size": "worker.critic.ulysses_size",
    "worker.ref.ulysses_sequence_parallel_size": "worker.ref.ulysses_size",
    "worker.reward.score_function": "worker.reward.reward_function",
    "worker.reward.score_function_kwargs": "worker.reward.reward_function_kwargs",
    "trainer.total_episodes": "trainer.total_epochs",
}
# Keys older EasyR1 configs carry that no longer mean anything: accepted and ignored.
IGNORED_LEGACY_KEYS = {"worker.reward.reward_type", "worker.reward.compute_score"}

BUILTIN_PREFIX = "builtin://"


PROJECT_ROOT = Path(__file__).resolve().parent.parent


def resolve_shipped_file(path: Optional[str], folder: str) -> Optional[str]:
    """Map a missing EasyR1-style path (e.g. ./examples/reward_function/math.py) to the file easyrl ships.

    EasyR1 keeps its reward modules and templates under examples/; easyrl ships the same names at the top level
    (reward_function/, format_prompt/), so configs written for EasyR1 run unchanged.
    """
    if not path:
        return path
    file, sep, fn = path.partition(":")
    if Path(file).expanduser().exists():
        return path
    shipped = PROJECT_ROOT / folder / Path(file).name
    return str(shipped) + sep + fn if shipped.is_file() else path


def _absolute_if_local(path: Optional[str]) -> Optional[str]:
    if path and not path.startswith(BUILTIN_PREFIX) and os.path.exists(os.path.expanduser(path)):
        return os.path.abspath(os.path.expanduser(path))
    return path


# ----------------------------------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------------------------------
def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; leaves are non-dict values."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value and not _is_free_dict(full):
            flat.update(_flatten(value, full))
        else:
            flat[full] = value
    return flat


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return tree


def _field_types(cls: type = PPOConfig, prefix: str = "") -> dict[str, Any]:
    """Every valid dotted key of the tree -> its dataclass field (leaves and sections alike)."""
    out = {}
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        out[key] = f
        ftype = f.type if isinstance(f.type, type) else None
        if ftype is not None and is_dataclass(ftype):
            out.update(_field_types(ftype, key + "."))
    return out


_FIELDS = _field_types()
# Dict-valued fields whose contents are free-form (not checked against the tree).
_FREE_DICT_KEYS = {key for key, f in _FIELDS.items() if f.type is dict}


def _is_free_dict(key: str) -> bool:
    return key in _FREE_DICT_KEYS


def valid_keys() -> list[str]:
    return sorted(_FIELDS)


def _suggest(key: str) -> str:
    leaf = key.rsplit(".", 1)[-1]
    section = key.rsplit(".", 1)[0] if "." in key else ""
    same_section = [k for k in _FIELDS if k.rsplit(".", 1)[0] == section] if section else list(_FIELDS)
    close = difflib.get_close_matches(key, same_section, n=1, cutoff=0.6)
    if not close:
        # the right leaf name in another section, e.g. worker.ulysses_size -> worker.actor.ulysses_size
        close = [k for k in _FIELDS if k.endswith("." + leaf)][:1]
    if not close:
        close = difflib.get_close_matches(key, list(_FIELDS), n=1, cutoff=0.5)
    return f" Did you mean `{close[0]}`?" if close else ""


def _rename_legacy(flat: dict[str, Any], source: str) -> dict[str, Any]:
    out = {}
    for key, value in flat.items():
        if key in IGNORED_LEGACY_KEYS:
            continue
        out[LEGACY_KEYS.get(key, key)] = value
    return out


def _check_keys(flat: dict[str, Any], source: str) -> None:
    for key in flat:
        if key in _FIELDS:
            continue
        if any(key.startswith(free + ".") for free in _FREE_DICT_KEYS):
            continue
        raise ConfigError(f"Unknown config key `{key}` (from {source}).{_suggest(key)}")


def _parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`a.b=1` strings -> flat dict, values parsed as YAML (so `[console,file]`, `null`, `1e-6` work)."""
    import yaml

    flat = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"Command-line argument `{item}` is not of the form key=value (e.g. worker.rollout.n=8)."
            )
        key, raw = item.split("=", 1)
        key = key.strip().lstrip("+")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        flat[key] = _coerce_scientific(value)
    return flat


def _coerce_scientific(value: Any) -> Any:
    """YAML 1.1 reads `1e-6` (no dot) as a string; numbers written that way mean numbers."""
    if isinstance(value, str):
        try:
            if "e" in value.lower() and value.strip().lstrip("+-")[0].isdigit():
                return float(value)
        except (ValueError, IndexError):
            return value
    if isinstance(value, dict):
        return {k: _coerce_scientific(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_coerce_scientific(v) for v in value]
    return value


def _load_yaml(path: str) -> dict[str, Any]:
    import yaml

    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"Config file `{path}` (given as config=...) does not exist.")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"Config file `{path}` is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"Config file `{path}` must hold a mapping of sections (data, worker, ...).")
    return _coerce_scientific(data)


def load_config(args: Optional[list[str]] = None, validate: bool = True) -> PPOConfig:
    """Build a PPOConfig from `config=FILE` and `key=value` arguments (defaults <- file <- overrides)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    args = list(args or [])
    config_file = None
    overrides = []
    for arg in args:
        if arg.startswith("config="):
            config_file = arg.split("=", 1)[1]
        else:
            overrides.append(arg)

    layers = []
    if config_file:
        flat = _rename_legacy(_flatten(_load_yaml(config_file)), config_file)
        _check_keys(flat, f"config file {config_file}")
        layers.append(("config file " + config_file, _unflatten(flat)))
    if overrides:
        flat = _rename_legacy(_parse_overrides(overrides), "command line")
        _check_keys(flat, "the command line")
        layers.append(("the command line", _unflatten(flat)))

    merged = OmegaConf.structured(PPOConfig)
    for source, layer in layers:
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(layer))
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or "?"
            expected = _FIELDS.get(key)
            hint = f" Expected {_type_name(expected.type)}." if expected is not None else ""
            message = str(err.msg).splitlines()[0].rstrip(".")
            raise ConfigError(f"Bad value for `{key}` (from {source}): {message}.{hint}") from None
    config: PPOConfig = OmegaConf.to_object(merged)
    config.post_init()
    if validate:
        validate_config(config)
    return config


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def config_to_yaml(config: PPOConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(config))


def config_to_dict(config: PPOConfig) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(config))


# ----------------------------------------------------------------------------------------------------------------------
# validation: everything that can be checked before Ray starts
# ----------------------------------------------------------------------------------------------------------------------
CHOICES = {
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


def _registry_choices() -> dict[str, tuple[str, ...]]:
    """Choices that come from registries (so that registering an algorithm is all it takes to allow it)."""
    from .algorithms import advantage, kl, policy_loss
    from .trainer import loggers

    return {
        "algorithm.adv_estimator": tuple(advantage.list_adv_estimators()),
        "worker.actor.loss_type": tuple(policy_loss.list_policy_losses()),
        "algorithm.kl_penalty": tuple(kl.list_kl_penalties()),
        "trainer.logger": tuple(sorted(loggers.LOGGERS)),
    }


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


def _check_python_function(key: str, spec: str, default_name: str = "compute_score") -> None:
    """`path.py:fn` must name an existing file that defines `fn` (checked by parsing, nothing is executed)."""
    path, _, name = spec.partition(":")
    name = name or default_name
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"`{key}`: file `{path}` does not exist. Give a reward module as path/to/file.py:function.")
    try:
        tree = ast.parse(file.read_text(), filename=str(file))
    except SyntaxError as err:
        raise ConfigError(f"`{key}`: `{path}` has a syntax error at line {err.lineno}: {err.msg}.") from None
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    if name not in defined:
        functions = sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef))
        raise ConfigError(
            f"`{key}`: `{path}` defines no function `{name}`. Functions found: {', '.join(functions) or 'none'}."
        )


def _looks_local(path: str) -> bool:
    """A hub id is `org/name`; anything absolute, relative-dotted or deeper is a local path."""
    return path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or os.sep == "\\"


def _check_model_path(key: str, path: Optional[str], required: bool) -> None:
    if path is None:
        if required:
            raise ConfigError(
                f"`{key}` is not set. Point it at a Hugging Face model folder or hub id, "
                f"or use {BUILTIN_PREFIX}SmolLM2-135M-Instruct for the embedded default model."
            )
        return
    if path.startswith(BUILTIN_PREFIX):
        from .demo import builtin_models

        if path[len(BUILTIN_PREFIX) :] not in builtin_models.BUILTIN_MODELS:
            names = ", ".join(BUILTIN_PREFIX + n for n in builtin_models.BUILTIN_MODELS)
            raise ConfigError(f"`{key}`: unknown built-in model `{path}`; built-in models: {names}.")
        return
    if _looks_local(path) and not os.path.exists(os.path.expanduser(path)):
        raise ConfigError(f"`{key}`: local model path `{path}` does not exist.")


def _check_file(key: str, path: Optional[str], what: str) -> None:
    if path and not Path(path).expanduser().is_file():
        raise ConfigError(f"`{key}`: {what} file `{path}` does not exist.")


def _check_positive(key: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"`{key}` must be a positive integer, got {value}.")


def validate_config(config: PPOConfig) -> None:
    """Raise ConfigError for the first problem found; nothing heavy is imported or started."""
    choices = dict(CHOICES)
    choices.update(_registry_choices())
    for key, allowed in choices.items():
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
    if config.algorithm.adv_estimator == "gae":
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
    if rollout.n == 1 and config.algorithm.adv_estimator in ("grpo", "rloo", "grpo_passk"):
        raise ConfigError(
            f"`algorithm.adv_estimator={config.algorithm.adv_estimator}` compares samples of the same prompt and "
            "needs `worker.rollout.n` > 1 (e.g. worker.rollout.n=8)."
        )
    if config.algorithm.kl_penalty == "full" and not config.algorithm.disable_kl:
        raise ConfigError(
            "`algorithm.kl_penalty=full` needs the reference model's full next-token distributions, which the "
            "workers do not ship between roles (vocabulary-sized per token). Use low_var_kl, kl, abs or mse."
        )
    if config.algorithm.online_filtering and not 0.0 <= config.algorithm.filter_low <= config.algorithm.filter_high:
        raise ConfigError("`algorithm.filter_low` must be >= 0 and <= `algorithm.filter_high`.")

    _check_model_path("worker.actor.model.model_path", actor.model.model_path, required=True)
    _check_model_path("worker.actor.model.tokenizer_path", actor.model.tokenizer_path, required=False)
    if config.algorithm.adv_estimator == "gae":
        _check_model_path("worker.critic.model.model_path", critic.model.model_path, required=True)
    if config.worker.reward.reward_function is None:
        raise ConfigError(
            "`worker.reward.reward_function` is not set. Give a reward module as path/to/file.py:function, "
            "e.g. reward_function/math.py:compute_score."
        )
    _check_python_function("worker.reward.reward_function", config.worker.reward.reward_function)
    _check_file("data.format_prompt", data.format_prompt, "prompt template")
    _check_file("data.override_chat_template", data.override_chat_template, "chat template")
    if not data.train_files and not config.trainer.val_only:
        raise ConfigError("`data.train_files` is not set. Point it at a .jsonl/.json/.parquet file or name@split.")
    for key in ("data.train_files", "data.val_files"):
        value = _get(config, key)
        if value and not value.startswith(BUILTIN_PREFIX):
            path = value.split("@", 1)[0]
            if _looks_local(path) and not os.path.exists(os.path.expanduser(path)):
                raise ConfigError(f"`{key}`: data file `{path}` does not exist.")

"""The PPOConfig tree: every knob of a run, typed and documented in one place.

Each section is a dataclass; the string right under a field is its documentation (``docs/config.md`` is generated
from these strings by ``scripts/gen_config_docs.py``). Key names follow EasyR1, so an EasyR1 ``config.yaml`` loads
unchanged. Fields marked ``derived(...)`` are filled by ``load.derive`` from the keys it names and cannot be set by a
user (the error names those keys instead).
"""

from dataclasses import dataclass, field
from typing import Any, Optional


def derived(*sources: str) -> dict:
    """The metadata of a derived field: the keys it is computed from (``.name``: a key of the same section), which
    the error refusing it names."""
    return {"derived": True, "from": sources}


MAPPING = {"mapping": True}  # a field that may hold a mapping of free keys (given whole, or key by key: `field.name=`)


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message names the key and the fix."""


@dataclass
class DataConfig:
    """`data.*`: where the rows come from, how they become prompts, and the picture / length limits."""

    train_files: str = ""
    """Training data: a .jsonl/.json/.parquet/.csv file, a folder saved by `datasets`, a folder of data files of one
    kind (each read as a single file is, joined in file-name order), `name@split`, or `builtin://NAME@split`. A
    folder with several splits given without `@split` reads `train` (else its first split), with a warning naming the
    others. Every row is read and encoded when the run starts, before Ray: a file with no rows, a byte
    that is not UTF-8 (.jsonl/.json/.csv) or a .jsonl line that is not JSON is an error naming the file and line; CSV
    cells are read as text. Empty with a tool environment (worker.rollout.multi_turn.env) and trainer.max_steps: the
    environment owns the data, each prompt is what its reset returns (TRL without a train_dataset)."""
    val_files: str = ""
    """Validation data, same forms as `train_files` (`FILE@train[:N]`: a file's first N rows, `FOLDER@test[:N]`: a
    folder's split's; `[:N%]`: that share); empty disables
    validation. Also the prompts of `easyrl generate` and `easyrl eval`. Beside a tool environment whose reset gives the task, rows may hold only its reset
    arguments (e.g. a `seed` column): a row without a prompt column gets an empty user message that the reset fills
    (unless a column's name is close to data.prompt_key or data.answer_key: a misspelt key is an error)."""
    prompt_key: str = "prompt"
    """Column holding the prompt: a text, or a list of chat messages ``{"role", "content"}`` (verl's and TRL's
    conversational data; data.format_prompt then renders the last user message), also as JSON text of one (a CSV
    cell; other text stays text), read as sft.messages_key reads it; a single message is a list of one, a mapping
    that is no message a skipped row. ``column.field`` reads a field inside a column. A row without a value (null or
    absent) is skipped, counted and named in a warning (rows numbered from 0); a file where no row has one is an error
    naming this key."""
    answer_key: str = "answer"
    """Column holding the ground truth handed to the reward function (``column.field`` reads a field inside a
    column: ``reward_model.ground_truth`` for verl's data); rows without one are skipped like rows without a prompt
    (see prompt_key)."""
    image_key: str = "images"
    """Column holding a list of images (paths, file:// or http(s) URLs, data:image/...;base64 URIs, {"bytes": ...}
    dicts or PIL images). Chat-message prompts may name their pictures inside their content parts instead (Qwen's
    {"type": "image", "image": ...}, OpenAI's {"type": "image_url", "image_url": {"url": ...}}); a row may not do
    both."""
    video_key: str = "videos"
    """Column holding a list of videos (paths or lists of frames)."""
    image_dir: Optional[str] = None
    """Folder that relative image/video paths are resolved against first; a path not found there is tried against
    the data file's folder, then the working directory (the first place that has it wins)."""
    video_fps: float = 2.0
    """Frames per second sampled from each video file; a file recorded at a lower rate keeps every frame, at its own
    rate (as qwen-vl-utils' readers do). A video given as a list of frames is taken to be at this rate."""
    max_frames: Optional[int] = None
    """Frame budget per video (an even number: Qwen-VL models pack frames in pairs). A video that has more frames after
    the `video_fps` sampling keeps this many, spread evenly over the whole video with the first and last frame
    included (frame i of the budget is sampled frame round(i x (sampled - 1) / (max_frames - 1))), so its frames lie
    further apart than 1/video_fps and the rate handed to the model is lowered by the same ratio (timestamps still
    cover the whole video). The cut is made once when the row is loaded: the actor and the rollout engine see the
    same frames. null keeps every frame of a list of frames and at most 768 sampled frames of a video file, spread
    the same way (qwen-vl-utils' readers' cap, which easyrl's PyAV reader applies too). EasyR1 has no such key."""
    max_prompt_length: int = 512
    """Longest prompt in tokens (vision tokens included); longer prompts are filtered or rejected."""
    max_response_length: int = 512
    """Longest response the rollout may generate, in tokens."""
    rollout_batch_size: int = 512
    """Prompts per training step (each is sampled `worker.rollout.n` times)."""
    mini_rollout_batch_size: Optional[int] = None
    """Prompts per generation call; a step generates such mini-batches until rollout_batch_size prompts (that survive
    online filtering) are collected, and steps are counted per rollout batch (EasyR1); without a filter, a size that
    does not divide rollout_batch_size generates prompts the step does not train on (the plan says how many). null
    means rollout_batch_size."""
    val_batch_size: int = -1
    """Prompts per validation generation call; -1 means the whole validation set at once."""
    format_prompt: Optional[str] = None
    """Jinja template file applied to each prompt before the chat template: its text stripped of surrounding
    whitespace (as EasyR1 does), rendered with `content` = the row's prompt text (other variables render empty, with a
    warning). A prompt given as chat messages has the text of its last user message rendered, earlier turns kept as
    written; `easyrl sft` does the same to a conversation (sft.messages_key) and to a prompt column, so the model
    learns the prompt RL shows it for the conversation's last question. A missing
    `.../format_prompt/{math,r1v,dapo,android_gui}.jinja` (EasyR1's `./examples/format_prompt/...`) is replaced by
    easyrl's copy under `format_prompt/` (EasyR1's exact text), with a warning naming both paths."""
    system_prompt: Optional[str] = None
    """A system message put before each prompt's messages (EasyR1's first releases had this key; format_prompt is
    its later way to instruct the model). A prompt given as messages that already open with a system message keeps
    its own."""
    override_chat_template: Optional[str] = None
    """Jinja chat-template file used instead of the tokenizer's own."""
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    """Variables handed to the chat template wherever it renders: prompts, tool and environment turns, SFT
    conversations (verl's key of this name; TRL's chat_template_kwargs), e.g. `{enable_thinking: false}` turns Qwen3's
    thinking off (its template then opens each reply with an empty think block). A name the template does not
    read changes nothing, which the log says once."""
    shuffle: bool = True
    """Shuffle the training data every epoch."""
    seed: int = 1
    """Seed of the training-data shuffle."""
    min_pixels: Optional[int] = 262144
    """Pictures and video frames smaller than this many pixels are upscaled. With max_pixels, clamped into the model
    processor's own range; the dataset stores each picture and video frame at exactly the size the processor's resize
    keeps, so the dataset, the engine and the actor see the same pixels and pad tokens. Video frames are also held to
    qwen-vl-utils' per-frame cap (at most 768 tokens a frame, less for videos of many frames)."""
    max_pixels: Optional[int] = 4194304
    """Pictures and video frames larger than this many pixels are downscaled (see min_pixels)."""
    filter_overlong_prompts: bool = True
    """Drop prompts longer than max_prompt_length; false cuts them to their first max_prompt_length tokens as EasyR1
    does, except a cut through a picture, whose row is skipped, and a cut that leaves every prompt only the start
    they all share (a long system prompt, cut before each row's question), which is an error. Either way every prompt
    is measured when the run starts and the rows dropped or cut are counted and named then."""
    filter_overlong_prompts_workers: int = 16
    """Processes used to read and measure the prompts when the run starts."""
    dataloader_num_workers: int = 0
    """Worker processes preparing batches (0: in the driver; raise it for image/video datasets on big machines). The
    shuffled order of a data.seed differs with it, and a run resumes only with the value its checkpoint was saved
    with (the loader saves its position per process)."""


@dataclass
class AlgorithmConfig:
    """`algorithm.*`: advantage estimator, KL to the reference, and online filtering."""

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
    """KL estimator: kl, abs, mse, low_var_kl (the k3 estimator, algorithms/kl.py). full (the exact KL over the
    vocabulary) is refused: it needs the reference's full distributions, which no worker keeps."""
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
    optimizer step (ppo_epochs=1, global_batch_size = rollout_batch_size) and LoRA has no dropout, where the update's
    own detached log-probs are the old ones."""
    online_filtering: bool = False
    """DAPO dynamic sampling: drop groups whose mean `filter_key` score is outside [filter_low, filter_high]."""
    filter_key: str = "overall"
    """Reward score that online filtering looks at."""
    filter_low: float = 0.01
    """Online filtering keeps a group only when its mean score is strictly above this (EasyR1)."""
    filter_high: float = 0.99
    """Online filtering keeps a group only when its mean score is strictly below this (EasyR1)."""


@dataclass
class LoraConfig:
    """`worker.actor.model.lora.*`: low-rank adapters (LoRA, arXiv 2106.09685) on the actor, trained instead of its
    weights. The base weights stay frozen; the reference policy is the same model with the adapters switched off."""

    rank: int = 0
    """LoRA rank; 0 trains all parameters. The actor's only: a critic (`worker.critic.model.lora.rank` > 0) is
    refused."""
    alpha: int = 64
    """LoRA alpha (scaling = alpha / rank)."""
    target_modules: Any = "all-linear"
    """Modules that get adapters: `all-linear` (every linear layer of the language model except the LM head) or a
    list / comma-separated names (module names or their last component, e.g. `q_proj,v_proj`)."""
    exclude_modules: Optional[str] = None
    """Regex (matched against the whole module name) of modules that never get adapters. EasyR1's `.*visual.*` changes
    nothing unless vision_tower is true, which it would undo (refused); a resume compares the modules adapted, not
    the regex."""
    dropout: float = 0.0
    """Dropout on the adapters' input in training passes; above 0 the old log-probs get their own (dropout-free)
    forward pass, since the update's are not the policy's."""
    vision_tower: bool = False
    """VLMs: adapters on the vision encoder's linear layers too (false: the vision encoder stays frozen as it is)."""
    lr: Optional[float] = None
    """Learning rate of the adapters; null means `optim.lr`. LoRA usually wants a larger rate than full training."""


@dataclass
class ModelConfig:
    """`worker.<role>.model.*`: the checkpoint a role loads and how."""

    model_path: Optional[str] = None
    """Hugging Face model folder or hub id; `builtin://SmolLM2-135M-Instruct` names the embedded small model (there
    is no default: a run sets its model)."""
    tokenizer_path: Optional[str] = None
    """Tokenizer/processor folder or hub id; null means model_path."""
    override_config: dict = field(default_factory=dict)
    """Values that override the model's config.json (e.g. {attention_dropout: 0.0}); the actor's also reach the vLLM
    engine (its hf_overrides), which then runs the model the actor trains. A key the config class does not declare
    is set all the same, with a warning naming it."""
    enable_gradient_checkpointing: bool = True
    """Recompute activations in the backward pass to save memory."""
    trust_remote_code: bool = False
    """Run Python code shipped with the checkpoint (`auto_map` in its config.json / tokenizer_config.json) in the
    driver and every worker. Off by default (EasyR1: on): a model that needs it stops before Ray starts with an
    error naming this key; read its code, then set true."""
    freeze_vision_tower: bool = False
    """Keep the vision encoder of a VLM frozen."""
    vision_cache_mb: int = 2048
    """Host memory (MiB) for a frozen vision tower's outputs (freeze_vision_tower, or LoRA without lora.vision_tower;
    the reference's tower always): each picture/video is encoded once and its features reused by every log-prob pass
    (old, reference) and every update micro-batch and epoch, as Long-RL caches video embeddings. Keyed by the
    pixels' content, least recently used first out; exact (a frozen tower maps equal pixels to equal features).
    0 turns it off; a trained tower never caches."""
    use_fused_kernels: bool = False
    """Actor and reference (the reference loads worker.actor.model): compute token log-probs and entropies inside the
    LM head from hidden states, a chunk of rows x vocabulary at a time, so the (response tokens x vocabulary) logits
    never exist (4.9 GB in bf16 for 16k tokens and a 152k vocabulary, as much again for their gradient). Costs one
    more LM-head matmul in the backward pass (each chunk's logits are recomputed). Not for the critic (check refuses
    worker.critic.model.use_fused_kernels=true)."""
    use_liger: bool = False
    """GPU only: Liger's Triton kernels (SwiGLU MLP, RoPE; liger-kernel, in the `gpu` extra) replace the model's own
    layers, for less activation memory and fewer kernel launches, and the model's own RMSNorm layers run compiled by
    torch.compile (2.4% faster per update than Liger's RMSNorm on an H200). The Liger patch is process-wide: every
    model of that type a worker loads afterwards uses it (the reference too)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters."""


@dataclass
class OptimConfig:
    """`worker.<role>.optim.*`: optimizer and learning-rate schedule."""

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
    training_steps: int = field(default=-1, metadata=derived("trainer.max_steps", "trainer.total_epochs"))
    """Training steps of the run (the schedule's length): trainer.max_steps, else the steps of trainer.total_epochs
    over the training data (derived; -1 until the data is read). The actor's leaves out trainer.critic_warmup, the
    steps that do not update it."""


@dataclass
class FSDPConfig:
    """`worker.<role>.fsdp.*`: sharding and mixed precision."""

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
    """`worker.<role>.offload.*`: parameters / optimizer state in host memory between phases (GPU only)."""

    offload_params: bool = False
    """Move parameters to the CPU while the role is idle (GPU only)."""
    offload_optimizer: bool = False
    """Move optimizer states to the CPU while the role is idle (GPU only)."""


@dataclass
class TrainableRoleConfig:
    """The fields the actor and the critic share: one batch / update schedule, one model, optimizer, sharding."""

    strategy: str = "fsdp"
    """Training backend; fsdp (FSDP2) is the one there is."""
    global_batch_size: int = 256
    """Prompts per optimizer step (mini-batch); multiplied by rollout.n into samples."""
    micro_batch_size_per_device_for_update: int = 4
    """Samples per forward/backward pass on one device when updating."""
    micro_batch_size_per_device_for_experience: int = 16
    """Samples per forward pass on one device when computing log-probs (actor) or values (critic)."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping; a non-finite norm skips the step."""
    loss_avg_mode: str = "token"
    """Loss aggregation: token (token-mean), seq (seq-mean-token-mean), seq-mean-token-sum or
    seq-mean-token-sum-norm; the long names are accepted too, and `easyrl check` prints them. seq-mean-token-sum-norm
    is Dr. GRPO's (verl's mode of that name, TRL's dr_grpo): each response's token sum, divided by the batch's samples
    x data.max_response_length. seq-mean-token-sum leaves out that constant, so its gradient norm is
    max_response_length times larger and max_grad_norm clips it accordingly."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    padding_free: bool = True
    """Pack sequences without padding in forward passes."""
    dynamic_batching: bool = True
    """Form micro-batches by a token budget instead of a fixed sample count. The budget is
    micro_batch_size_per_device_for_* x (data.max_prompt_length + data.max_response_length) real tokens: that many
    samples of the longest length, more of shorter ones (verl's use_dynamic_bsz; its *_max_token_len_per_gpu is this
    product)."""
    ulysses_size: int = 1
    """Ulysses sequence-parallel size k: each packed micro-batch is split over k workers, which attend with all-to-all
    over the heads (the attention heads must be divisible by k, the key/value heads divisible by k or dividing it,
    checked before Ray starts; needs padding_free; k divides the workers)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model of this role."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer and learning-rate schedule."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 sharding and mixed precision."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """CPU offload between phases."""
    global_batch_size_per_device: int = field(default=-1, metadata=derived(".global_batch_size", "worker.rollout.n"))
    """Samples per optimizer step on one device: global_batch_size x rollout.n / devices (derived)."""
    response_length: int = field(default=-1, metadata=derived("data.max_response_length"))
    """Copied from data.max_response_length: the constant seq-mean-token-sum-norm divides by (derived)."""


@dataclass
class ActorConfig(TrainableRoleConfig):
    """`worker.actor.*`: the policy and its loss."""

    clip_ratio_low: float = 0.2
    """PPO clip: lower bound of the ratio is 1 - clip_ratio_low, so below 1 for the clipped losses (default, gspo,
    gspo_token); cispo takes 1 or more for an importance weight without a lower bound (the CISPO paper's setting)."""
    clip_ratio_high: float = 0.3
    """PPO clip: upper bound of the ratio is 1 + clip_ratio_high (clip-higher, DAPO)."""
    clip_ratio_dual: float = 3.0
    """Dual-clip PPO constant C: the loss of negative advantages is bounded by C * |A|."""
    loss_type: str = "default"
    """Policy loss: default (PPO clip; `ppo` names it too, as `easyrl check` prints it), gspo, gspo_token, cispo,
    sapo."""
    use_torch_compile: bool = True
    """Compile the log-prob and entropy kernels with torch.compile (dynamic shapes; the first call in each worker
    process compiles, 12-45 s on a CPU; falls back to eager with one warning where compiling fails). On a GPU the
    log-prob forward and gradient are easyrl's own Triton kernels instead (2x and 3.3x torch.compile's on an H200)."""
    tau_positive: float = 1.0
    """SAPO temperature of the soft gate for positive advantages."""
    tau_negative: float = 1.05
    """SAPO temperature of the soft gate for negative advantages."""
    tis_cap: Optional[float] = None
    """Truncated importance sampling: weight each token by min(pi_old / pi_rollout, tis_cap); null disables it."""
    entropy_coef: float = 0.0
    """Entropy bonus: the policy loss gets -entropy_coef x the token entropy, aggregated as the loss is
    (loss_avg_mode: a mean for token / seq, a sum per response for the seq-mean-token-sum modes); 0 disables it."""
    shared_prefix: bool = False
    """Shared-prefix forward passes (Prefix Grouper, arXiv 2506.05433): the samples of a micro-batch with identical
    prompt ids (and pictures) are packed as ONE prompt followed by their responses, each response attending to the
    prompt and itself, so log-prob and update passes (and a VLM's vision tower) compute each prompt once per group
    instead of rollout.n times; results equal the unshared path. Micro-batches and trainer.balance_batch's rank
    chunks keep groups whole (rank chunks split only the groups that equal chunks force apart). Needs
    padding_free; with ulysses_size > 1 the packed row is cut over the group as any padding-free row is. Also used
    by the reference; the critic has its own switch, worker.critic.shared_prefix."""
    skip_zero_advantage: bool = True
    """The update skips the forward and backward passes of samples whose advantage is zero at every token (a GRPO
    group whose samples all scored the same): with a built-in loss_type, entropy_coef 0 and no KL loss they add
    nothing to the loss or its gradient, so the update is the same (to float rounding) for less compute; the loss
    denominators still count them. Then the per-token metrics (entropy, ppo_kl, clip fractions) cover the computed
    samples (none where no sample of a mini-batch has an advantage: its one computed placeholder would stand for
    it), and actor/zero_advantage_skipped is the share skipped. With trainer.balance_batch the ranks get about equal
    shares of the computed tokens of each optimizer step (samples trade ranks within their step only, so every step
    holds the samples it would hold without the skip). Ignored where those conditions do not hold."""
    disable_kl: bool = field(default=False, metadata=derived("algorithm.disable_kl"))
    """Copied from algorithm.disable_kl (derived)."""
    use_kl_loss: bool = field(default=False, metadata=derived("algorithm.use_kl_loss"))
    """Copied from algorithm.use_kl_loss (derived)."""
    kl_penalty: str = field(default="kl", metadata=derived("algorithm.kl_penalty"))
    """Copied from algorithm.kl_penalty (derived)."""
    kl_coef: float = field(default=0.0, metadata=derived("algorithm.kl_coef"))
    """Copied from algorithm.kl_coef (derived)."""


@dataclass
class CriticConfig(TrainableRoleConfig):
    """`worker.critic.*`: the value model (GAE runs only)."""

    padding_free: bool = False
    """Pack sequences without padding in forward passes."""
    shared_prefix: bool = False
    """Shared-prefix forward passes for the values and the value update, as worker.actor.shared_prefix does for
    the policy: each prompt computed once per group of samples (a VLM's pictures too), values equal to the unshared
    path. Needs worker.critic.padding_free."""
    cliprange_value: float = 0.5
    """Value clipping range around the old values."""


@dataclass
class RefConfig:
    """`worker.ref.*`: the frozen reference policy the KL is measured against."""

    strategy: str = "fsdp"
    """Backend of the reference model; fsdp (FSDP2)."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 sharding and mixed precision."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """CPU offload between phases."""
    micro_batch_size_per_device_for_experience: int = -1
    """Samples per forward pass on one device; -1 copies the actor's (the range below applies to the value then)."""
    padding_free: bool = field(default=False, metadata=derived("worker.actor.padding_free"))
    """Copied from worker.actor.padding_free (derived)."""
    dynamic_batching: bool = field(default=False, metadata=derived("worker.actor.dynamic_batching"))
    """Copied from worker.actor.dynamic_batching (derived)."""
    ulysses_size: int = field(default=1, metadata=derived("worker.actor.ulysses_size"))
    """Copied from worker.actor.ulysses_size (derived)."""
    use_torch_compile: bool = field(default=True, metadata=derived("worker.actor.use_torch_compile"))
    """Copied from worker.actor.use_torch_compile (derived)."""
    use_fused_kernels: bool = field(default=False, metadata=derived("worker.actor.model.use_fused_kernels"))
    """Copied from worker.actor.model.use_fused_kernels: the reference loads the actor's model (derived)."""
    shared_prefix: bool = field(default=False, metadata=derived("worker.actor.shared_prefix"))
    """Copied from worker.actor.shared_prefix (derived)."""


@dataclass
class MultiTurnConfig:
    """`worker.rollout.multi_turn.*`: multi-turn rollouts with tools or an environment. On when `tools` or `env` is
    set: each trajectory then alternates model turns and tool results (or environment observations) until the model
    answers without a tool call (or the environment says done), `max_turns` model turns, or data.max_response_length
    tokens over the whole trajectory. Tool results and observations are in the sequence but trained on nowhere
    (response_mask is 1 only on the model's tokens). vllm rollout only."""

    tools: Optional[str] = None
    """A `.py` file whose module-level `TOOLS = [fn, ...]` lists the tool functions (plain or async); each is called
    with the JSON arguments of a call as keyword arguments (and, when it has a `row` parameter, its trajectory's dataset
    row, left out of the schema) and returns what the model sees: text, a PIL image, or a list of both (pictures need
    a vision-language model; other values are turned into text with str()). A function's JSON schema is its `schema`
    attribute (an OpenAI-style dict) when set, else it is read from its type hints and Google-style docstring
    (transformers' get_json_schema). See `tools/calculator.py`. The prompts list the schemas through the chat
    template's `tools`; a template that does not read it (SmolLM2's) shows none, and a warning says so unless
    data.format_prompt or the rows' prompts name each tool. A missing `tools/NAME.py` (here or in multi_turn.env) is
    served by easyrl's example of that name, with a warning naming both paths."""
    env: Any = field(default=None, metadata=MAPPING)
    """An environment, as `path/to/file.py:ClassName`, or several tool environments as a mapping name ->
    `path/to/file.py:ClassName` (TRL's dictionary environment_factory: each row names its own in an `environment`
    column, and its prompt advertises that environment's tools only); one instance per trajectory, built with no
    arguments. Two kinds. A class with `step` is stepped, a new instance each time: `reset(row)` is called before the
    first turn with the prompt's dataset row (a dict: the row's columns but its pictures and videos, ground_truth,
    data_source and `seed`) and sets
    up its state (the dataset prompt is the first
    observation: what reset returns is not shown to the model); `step(action_text)` gets each model turn's text and
    returns `(observation, reward, done)`: the observation (text, a PIL image, or a list of both) is given to the
    model as a `user` message unless done, the rewards are summed per trajectory and handed to the reward function as
    `env_reward` (reward_function/env_reward.py scores with it alone); not together with `tools`. A class without
    `step` is a tool environment (TRL's `environment_factory`): its public methods but `reset`, `get_reward` and `close` are
    the model's tools on that instance (with `tools`' too, when set), instances are reused across steps (TRL's
    "construct once, reset often"), `reset(**columns)` gets the row's columns and `seed` (one per prompt, shared by
    its samples; only the names it declares, without **kwargs) and the text (and, on a vision-language model,
    pictures) it returns is added to the end of the prompt's last user message;
    `get_reward()`, when defined, is called when the trajectory ends and added to the reward function's `overall`
    (reward/env_reward), unless the reward file sets `SCORES_ENV_REWARD = True` (env_reward.py does). A reset, step
    or get_reward that raises or takes longer than `tool_timeout` is counted in rollout/multi_turn/env_errors and
    ends its trajectory (a failed get_reward gives 0); the step goes on. `__init__` is not held to `tool_timeout`;
    an instance the rollout drops (a stepped one when its trajectory ends) has its `close()` called, when defined."""
    max_turns: int = 4
    """Most model turns per trajectory; a trajectory still calling tools (or not done) after its last turn ends
    there."""
    turn_max_tokens: Optional[int] = None
    """Most tokens of one model turn (a turn cut there is closed by the chat template and the tools still run); null:
    the rest of the data.max_response_length budget."""
    tool_timeout: float = 10.0
    """Seconds one tool call (or environment reset/step) may take; a tool call that takes longer (or raises) answers
    the model with an error message and counts in rollout/multi_turn/tool_errors (an environment's reset or step: in
    env_errors and env_timeouts, and its trajectory ends), and the step goes on."""
    parser: str = "hermes"
    """How tool calls are read from the model's text: `hermes` (`<tool_call>{"name": ..., "arguments": {...}}
    </tool_call>`, the format of Qwen2.5/Qwen3 and Hermes); more parsers register in
    easyrl/workers/rollout/multi_turn.py (TOOL_CALL_PARSERS)."""

    chat_template: Optional[str] = field(default=None, metadata=derived("data.override_chat_template"))
    """Copied from data.override_chat_template (derived): tool results, observations and a tool environment's reset
    text are rendered with the template the prompts were rendered with."""
    chat_template_kwargs: dict = field(default_factory=dict, metadata=derived("data.apply_chat_template_kwargs"))
    """Copied from data.apply_chat_template_kwargs (derived): the turns render with the variables the prompts did."""

    @property
    def enabled(self) -> bool:
        return bool(self.tools or self.env)


# vLLM's CPU backend needs an explicit KV-cache size; a rollout or judge engine without one gets this much
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30


@dataclass
class RolloutConfig:
    """`worker.rollout.*`: the generation engine and sampling."""

    name: str = "vllm"
    """Rollout engine: vllm (SPMD, on the training devices) or hf (transformers generate, from text prompts only:
    data with pictures or videos is refused when the run starts)."""
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
    """Most images per prompt the engine accepts; 0 means no limit set. Data rows with more are skipped and named when
    the run starts (the engine would refuse them)."""
    dtype: str = "bf16"
    """Dtype of the rollout engine's weights."""
    gpu_memory_utilization: float = 0.6
    """Share of GPU memory vLLM may use (GPU only)."""
    kv_cache_memory_bytes: Optional[int] = None
    """KV-cache size in bytes; on CPU null means 1 GiB per worker (vLLM needs an explicit size there)."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token."""
    enforce_eager: bool = False
    """Disable CUDA graphs in vLLM; on a machine without CUDA the engine always runs eagerly (announced once)."""
    enable_chunked_prefill: bool = False
    """Let vLLM split long prefills into chunks."""
    tensor_parallel_size: int = 2
    """Devices per vLLM engine; data parallel across the groups this carves out of the world."""
    max_model_len: Optional[int] = None
    """Context length of the engine; null means max_prompt_length + max_response_length. Below that sum a response
    stops where prompt and response fill the context (the plan says so); at or below data.max_prompt_length it is
    refused (a kept prompt could not be generated from)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one vLLM scheduler step."""
    disable_log_stats: bool = True
    """Silence vLLM's periodic statistics."""
    disable_tqdm: bool = True
    """Hide vLLM's progress bar of each generate call (the run shows its own progress bar)."""
    val_override_config: dict = field(default_factory=dict)
    """Sampling values used for validation, e.g. {temperature: 0, n: 1}. Sampled validation (temperature > 0) draws
    with the same seeds at every validation, so two validations differ by the model, not by new sampling noise; with
    n > 1 the val/* scores are means over the n samples (mean@n; `easyrl eval` reports pass@k). Keys: n,
    temperature, top_p, top_k, ignore_eos, and for vLLM repetition_penalty, presence_penalty, frequency_penalty and
    min_p (EasyR1 passes any of vLLM's sampling settings; training has none of these, as the actor's log-probs assume
    plain temperature sampling; the HF rollout takes repetition_penalty alone)."""
    lora_sync: str = "auto"
    """With LoRA (`worker.actor.model.lora.rank` > 0) and vllm, how the engine gets the actor after each update:
    `adapter` (the engine keeps the base weights and takes only the adapter, in memory), `merged` (merged weights,
    a full-model sync) or `auto` (adapter where vLLM's LoRA serves the model and every adapted module, else merged,
    with a warning naming why)."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn rollouts with tools or an environment (off unless `multi_turn.tools` or `multi_turn.env` is set)."""
    trust_remote_code: bool = field(default=False, metadata=derived("worker.actor.model.trust_remote_code"))
    """Copied from worker.actor.model.trust_remote_code (derived)."""
    prompt_length: int = field(default=-1, metadata=derived("data.max_prompt_length"))
    """Copied from data.max_prompt_length (derived)."""
    response_length: int = field(default=-1, metadata=derived("data.max_response_length"))
    """Copied from data.max_response_length (derived)."""
    max_pixels: Optional[int] = field(default=None, metadata=derived("data.max_pixels"))
    """Copied from data.max_pixels (derived): pictures from tools and environments are held to it as the dataset's
    are, but not raised to data.min_pixels (a tool chooses the size of what it shows; the zoom tool enlarges its
    crop)."""


@dataclass
class JudgeConfig:
    """`worker.reward.judge.*`: a model's grade added to the rule reward, `overall` = worker.reward.rule_weight x rule
    overall + weight x judge score. `http` asks an OpenAI-compatible chat-completions endpoint from the driver."""

    kind: str = "none"
    """`none` (no judge: the reward function alone, as in EasyR1), `http`: an OpenAI-compatible chat-completions
    endpoint (`vllm serve`, SGLang, OpenAI) asked once per sample, or `vllm`: a vLLM engine of `model_path` in its own
    Ray actor, started with the run, that generates the judge replies batch by batch (same template, parsing and
    counting as `http`), or `classifier`: a sequence-classification reward model of `model_path` (one output and a
    chat template, e.g. Skywork-Reward) that scores the prompt's messages (system prompt included, before the policy's chat template)
    and [assistant: response] in its own chat template, FSDP2-sharded in the
    training workers beside the reference (worker.ref's fsdp, offload and micro-batch settings serve it too; uses
    max_length and score_transform, no template). With a judge, each step logs reward/rule (the function's overall),
    reward/judge (its score in [0, 1]; a `linear` classifier score is unbounded) and reward/judge_errors (a count),
    and reward/overall is the weighted sum."""
    weight: float = 1.0
    """The judge score's weight in `overall` (the score itself is in [0, 1])."""
    base_url: Optional[str] = None
    """The server's OpenAI base URL, e.g. `http://127.0.0.1:8000/v1` (easyrl posts to `<base_url>/chat/completions`).
    When no sample of the first judged batch gets a score (a wrong base_url, model, key or score_pattern), or none of
    3 batches in a row later, the run stops naming the failures; other failures score 0 and count in
    reward/judge_errors."""
    model: Optional[str] = None
    """The model name sent with each request (one the server serves)."""
    api_key_env: Optional[str] = None
    """NAME of the environment variable holding the API key, sent as `Authorization: Bearer`; null sends no key. The
    key itself never goes into the config; check refuses a name that is not set in the environment."""
    prompt_template: Optional[str] = None
    """Jinja file rendered into the judge's user message with `prompt` (the question: the prompt's last user message,
    data.format_prompt applied, before the policy's chat template; with worker.rollout.multi_turn.env the policy's
    prompt decoded), `response` and `ground_truth`; it must use `response` and no other variables. null: the built-in
    template (easyrl/workers/reward/judge.py), which asks for a 0-10 grade on a last line `Score: N`."""
    score_pattern: str = r"(?i)score\W*?(-?[0-9]+(?:[.][0-9]+)?)"
    """Regex with exactly one group, read from the judge's reply: the group of its LAST match is the score. The
    default reads the number after the last `Score` (any case, any punctuation between: `Score: 7`, `**Score:** 7`,
    `Score: 3/10` reads 3, `Score: -2` is off the scale), which the built-in template asks for; `([0-9]+)` reads the
    last number of the reply instead. No match, or a number outside score_range, scores 0 as a judge error."""
    score_range: list = field(default_factory=lambda: [0, 10])
    """[min, max] of the judge's scale, mapped onto [0, 1]."""
    concurrency: int = 16
    """`http`: requests in flight at once at most (a `vllm` engine takes each batch whole)."""
    max_retries: int = 3
    """`http`: retries of a request that met a connection error, HTTP 429 or 5xx, each after a random wait of up to
    retry_backoff_s x 2^attempt (exponential backoff with full jitter; a longer Retry-After is honoured, 60 s at
    most). Other statuses and timeouts are not retried."""
    retry_backoff_s: float = 1.0
    """The bound of the first retry's random wait (doubled for each next retry)."""
    timeout_s: float = 60.0
    """`http`: seconds one request may take; a sample whose request takes longer scores 0 as a judge error (not
    retried). A `vllm` engine has no deadline: its batch ends when every reply reaches its end or max_tokens."""
    temperature: float = 0.0
    """Sampling temperature of the judge's reply. Above 0 the `vllm` judge samples each message with a seed made from
    its tokens, so a message is graded the same way in any batch and after a resume (and in any run)."""
    max_tokens: int = 512
    """Longest judge reply in tokens; a reply cut there (finish_reason `length`) scores 0 as a judge error."""
    model_path: Optional[str] = None
    """The judge model's folder, hub id or `builtin://NAME` (kinds `vllm`, `classifier`)."""
    dtype: str = "bf16"
    """Dtype of the `vllm` judge engine's weights (bf16, fp16, fp32); on a CPU without AMX bf16 is slower than fp32."""
    num_gpus: float = 0.0
    """GPUs the `vllm` judge engine's Ray actor reserves, apart from the training workers': 0 runs it on CPU (vLLM's
    CPU backend); on a GPU cluster give it 1 (a GPU of its own, so the cluster needs one more than the workers take)
    or a fraction of a free GPU shared with other Ray actors (then lower gpu_memory_utilization to that share)."""
    gpu_memory_utilization: float = 0.9
    """Share of its GPU's memory the `vllm` judge engine may use (GPU only)."""
    kv_cache_memory_bytes: Optional[int] = None
    """KV-cache size of the `vllm` judge engine in bytes; null: 1 GiB on CPU (vLLM needs an explicit size there),
    gpu_memory_utilization's share on GPU. It must hold one request of max_model_len tokens."""
    max_model_len: Optional[int] = None
    """`vllm`: the judge engine's context in tokens (the judge message and its reply); null: the judge model's own
    (32k-128k for many models, whose KV cache for one request that long may not fit kv_cache_memory_bytes). A
    longer message scores as a judge error, counted in reward/judge_errors."""
    max_length: int = 4096
    """`classifier`: longest reward-model input in tokens (the chat-templated prompt and response); a longer one is
    cut at its end (the start, with the prompt, is kept), scored as cut, and counted in a warning."""
    score_transform: str = "sigmoid"
    """`classifier`: how the reward model's raw score r (unbounded) becomes the judge score: `sigmoid`:
    sigmoid(score_scale x (r - score_offset)), in (0, 1) like the other kinds' scores; `linear`:
    score_scale x (r - score_offset), unbounded."""
    score_scale: float = 1.0
    """`classifier`: the factor of score_transform (a temperature's inverse for `sigmoid`)."""
    score_offset: float = 0.0
    """`classifier`: subtracted from the raw score before score_scale (the raw score that maps to 0.5 with
    `sigmoid`, to 0 with `linear`)."""


@dataclass
class RewardConfig:
    """`worker.reward.*`: the reward function and how it runs."""

    reward_function: Optional[str] = None
    """Reward function as `path/to/file.py:function`; without `:function` the file's `main` (EasyR1's default), else
    its `compute_score`; `path/to/file.py:f,g` combines several functions of the file (see reward_weights). The
    file's REWARD_TYPE is `batch` (default: called once with the whole batch, list[dict] ->
    list[dict]) or `sequential` (dict -> dict); inputs `response`, `response_length`, `ground_truth`; each output
    needs `overall` (placed on the last response token), other keys become `reward/<key>` metrics (the mean over the
    samples that return the key, as in EasyR1; a sample whose scoring failed counts 0) and per-sample columns for
    algorithm.filter_key (0 where absent). In a file without REWARD_TYPE, a function that takes `solution_str` is called as
    verl calls it (once per response: data_source, solution_str, ground_truth, extra_info), one that takes
    `solution_strs` as verl's batch manager does (once per batch, those four as lists), and one that takes
    `completions`, `completion_ids` or `environments` as TRL's GRPOTrainer calls it (once per batch: prompts,
    completions, completion_ids, a tool environment's `environments`, and every column of the row but pictures and
    videos). A missing `.../reward_function/{math,r1v,dapo,android_gui}.py` is
    replaced by easyrl's file of that name (EasyR1's scores and keys), with a warning naming both paths. Empty with
    a tool environment that defines get_reward: `reward_function/env_reward.py`, the environment's reward."""
    reward_type: Optional[str] = None
    """Older EasyR1 configs' key: how a function in a file without REWARD_TYPE is called, `batch` or `sequential`
    (null: batch, EasyR1's default). A file's REWARD_TYPE wins (with a warning where they differ), and a function
    written for verl (`solution_str`) or TRL (`completions`) is called their way."""
    reward_function_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments passed to the reward function (to each of combined functions, the ones it takes)."""
    reward_weights: Optional[list] = None
    """Weights of the functions `reward_function` names as `path.py:f,g` (TRL's reward_funcs and reward_weights): the
    reward is the weighted sum of their `overall` scores, each also logged as reward/<function name>. One number per
    function, in the same order; null weighs each 1."""
    skip_special_tokens: bool = True
    """Strip special tokens when decoding responses for the reward function."""
    num_cpus: int = 1
    """CPUs reserved for scoring (EasyR1): a `batch` function runs in one Ray actor holding them and sees the whole
    batch in one call; a `sequential` function's responses are split over that many one-CPU actors. 0 is one actor
    that reserves no CPU (EasyR1's meaning), under the same timeout."""
    timeout_s: float = 60.0
    """Seconds the scoring of one batch may take, all actors together. At the deadline the samples not scored yet
    score 0 and count in reward/errors and reward/timeouts, and the actors still busy are replaced; samples scored
    before keep their scores. An actor whose process dies (os._exit, a crash) is replaced the same way."""
    overlap: bool = True
    """Score a step's responses while the workers compute old, reference and value log-probs, and wait for the
    scores only where the advantages need them (EasyR1's async reward); timing/reward is the scoring's wall time,
    timing/reward_wait the time the step waited for it. Online filtering (algorithm.online_filtering) filters by the
    scores before those passes, so it always waits; false waits in every step."""
    rule_weight: float = 1.0
    """The reward function's weight in `overall` when a judge is on (worker.reward.judge.kind); with no judge it
    must stay 1 (the function's `overall` is the reward, as in EasyR1)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """A model's grade combined with the reward function's (off by default)."""


@dataclass
class WorkerConfig:
    """`worker.*`: the roles of the SPMD workers."""

    hybrid_engine: bool = True
    """Actor, rollout and reference share the same devices and processes; the only layout easyrl has (false is
    refused by check)."""
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


@dataclass
class TrainerConfig:
    """`trainer.*`: schedule, validation, checkpoints, logging, devices."""

    total_epochs: int = 15
    """Passes over the training data: the run trains (usable rows // data.rollout_batch_size) x total_epochs steps
    (EasyR1's rule; with a data.mini_rollout_batch_size that does not divide rollout_batch_size, the epoch's whole
    batches of mini_rollout_batch_size // the batches a step draws). With algorithm.online_filtering a step draws
    prompts until enough groups survive, so the data is cycled more often than this."""
    max_steps: Optional[int] = None
    """Train exactly this many steps, cycling the data as often as needed; overrides total_epochs (EasyR1)."""
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
    """Steps that update only the critic before the actor starts learning: the actor is first updated at step
    critic_warmup + 1, so it must be below the run's steps. Without a critic those steps only generate and score
    (as in EasyR1); the run plan says so. The actor's learning-rate schedule spans the steps after the warm-up (in
    EasyR1 and verl it spans every step, so a cosine schedule ends above its floor)."""
    balance_batch: bool = True
    """Reorder each training batch so that every data-parallel rank (world / worker.actor.ulysses_size of them) gets
    the same number of rows and about the same number of real tokens (longest-first greedy), from the log-prob passes
    on; logged as perf/dp_token_imbalance (most tokens on a rank / mean, 1.0 is perfect) next to
    perf/dp_token_imbalance_before (the batch as generated). Advantages group rows by uid, so they do not depend on
    the order; the order is a function of the token counts alone, so a resumed run repeats it. EasyR1 always
    balances (Karmarkar-Karp partitions) and has no key; this is verl's key name."""
    val_freq: int = -1
    """Validate every this many steps; <= 0 validates only before training (val_before_train) and at the end."""
    val_before_train: bool = True
    """Validate once before the first step of a run that starts afresh; a resumed run does not (its start was
    validated when it began; EasyR1 validates again at every resume)."""
    val_only: bool = False
    """Validate the model the run starts from (a checkpoint's when it resumes one, with trainer.val_before_train or
    not) and exit without training. The folder's history is kept: the validation's row is appended to metrics.jsonl
    (after that step's training row), and W&B, SwanLab and MLflow get it in new runs of their own (the training
    attempts' runs stay as they were, for a later resume to continue)."""
    val_generations_to_log: int = 0
    """Sample generations logged at each validation: drawn over the whole validation set with a fixed seed, the same
    samples at every validation, so that an answer can be followed from step to step."""
    save_freq: int = -1
    """Save a checkpoint every this many steps; -1 (or any value <= 0, as in EasyR1) saves only at the end."""
    save_limit: int = -1
    """Checkpoints kept: the newest saves (a run resumed from an earlier step keeps its own before the later steps of
    the run it branched from); older ones are deleted; -1 (or any value <= 0, as in EasyR1) keeps all. An old
    checkpoint is deleted once the new one is complete, so the disk holds save_limit + 1 of them while a checkpoint is
    written."""
    save_model_only: bool = False
    """Save only model weights (no optimizer or dataloader state): such a checkpoint cannot be resumed (a rerun in
    the same folder says so before Ray starts); `easyrl merge` turns it into a model."""
    save_every_minutes: float = 0.0
    """Also save a checkpoint after any step that ends this many minutes after the last save (or the start), so a
    job killed without warning loses at most about that much work; 0 turns it off. Counts toward save_limit."""
    max_restarts: int = 0
    """When a worker process dies (killed, out of memory, crashed), kill every worker, start new ones and resume
    from the last complete checkpoint, up to this many times per `easyrl train` or `easyrl sft` (logged as
    trainer/restarts); 0 ends the run with a message naming the worker. A `vllm` judge's engine that dies counts
    the same (a new engine starts with the workers)."""
    save_checkpoint_path: Optional[str] = None
    """Checkpoint folder; null means checkpoints/<project_name>/<experiment_name>."""
    load_checkpoint_path: Optional[str] = None
    """Resume from this checkpoint folder (global_step_N). One outside save_checkpoint_path (a warm start from another
    run), or an earlier one in it (a rollback), is where the run starts: once the run has saved checkpoints of its
    own, a rerun of the same command (a killed or requeued job) goes on from its newest (with find_last_checkpoint),
    and says so; to roll back again, rerun once with find_last_checkpoint=false."""
    ray_timeline: Optional[str] = None
    """Write Ray's task timeline (a chrome://tracing JSON file) to this path when the run ends."""
    worker_env: list = field(default_factory=list)
    """Names of variables of the driver's environment that every worker and reward actor gets too, e.g.
    [OPENAI_API_KEY] for a reward function that reads it. A cluster easyrl starts passes the whole environment
    anyway; on one started with `ray start` (RAY_ADDRESS, trainer.nnodes > 1) the workers have that command's
    environment, plus the driver's EASYRL_*, VLLM_*, HF_* and TORCHDYNAMO_* variables, its PYTHONPATH, and these."""
    find_last_checkpoint: bool = True
    """Resume from the complete checkpoint saved last under save_checkpoint_path when there is one; false starts afresh,
    which a folder holding an earlier run's checkpoints refuses (give the run a new save_checkpoint_path)."""


@dataclass
class GenerateConfig:
    """`generate.*`: `easyrl generate`, n samples per prompt of `data.val_files` written to a jsonl file."""

    output: Optional[str] = None
    """The jsonl file the rows go to (one per prompt: index, row, data_source, prompt, ground_truth, responses,
    scores, settings; with a tool environment whose reset adds text, sample_prompts); null:
    `<trainer.save_checkpoint_path>/samples.jsonl`. Rows are appended batch by batch; a run with an existing
    file generates only the prompts it lacks (a killed run continues, no row twice), and refuses a file made with
    another model, sampling, seed or reward."""
    val_sampling: bool = False
    """Sample with `worker.rollout.val_override_config` applied (the trainer's validation sampling); false: the
    rollout's own sampling (`worker.rollout.n`, temperature, top_p, top_k)."""


@dataclass
class EvalConfig:
    """`eval.*`: `easyrl eval`, k samples per prompt of `data.val_files`, scored, reported as mean@k and pass@k."""

    k: Optional[int] = None
    """Samples per prompt (replaces `worker.rollout.n`; the other sampling keys are the rollout's); null:
    worker.rollout.n. pass@j is reported for every power of two j up to k, and for k."""
    output: Optional[str] = None
    """The JSON file of the results (per data source: prompts, mean@k, pass@j); null: beside eval.generations when it
    is given (`rl.jsonl` -> `rl.eval.json`), else `<trainer.save_checkpoint_path>/eval.json`."""
    generations: Optional[str] = None
    """The jsonl file of the samples and their scores (as `easyrl generate` writes; a re-run with the same model,
    sampling and reward resumes it, another is refused); null: `<trainer.save_checkpoint_path>/eval_generations.jsonl`."""
    correct_key: Optional[str] = None
    """The reward score that decides whether a sample is correct (pass@k); null: `accuracy` when the reward function
    returns it, else its one score named like an accuracy (`accuracy_reward` of combined TRL-style functions), else
    `overall` (with a judge the weighted sum of `rule` and `judge`: eval says so when no sample can reach
    correct_threshold)."""
    correct_threshold: float = 1.0
    """A sample is correct when its `correct_key` score is at least this (the rule rewards give 0 or 1 accuracy)."""
    val_sampling: bool = False
    """Sample with `worker.rollout.val_override_config` applied, then k samples (k = 1 with an override of
    {temperature: 0} reproduces the trainer's greedy val/<source>/reward; the default override is empty, which
    leaves the rollout's sampling keys); false: the rollout's sampling keys."""


@dataclass
class SFTConfig:
    """`sft.*`: `easyrl sft`, supervised fine-tuning on the training workers (the actor's model, optimizer, FSDP2 and
    micro-batch keys; `worker.actor.global_batch_size` counts conversations per optimizer step, and the RL-only keys
    rollout.n, ppo_epochs and loss_avg_mode do not apply: one pass, token-mean cross-entropy over the assistant's
    tokens). Data comes from data.train_files; the Hugging Face model is written to
    <trainer.save_checkpoint_path>/huggingface, ready as worker.actor.model.model_path of an RL run."""

    messages_key: str = "messages"
    """Column holding a conversation: an OpenAI-style list of {role, content}; the loss falls on every assistant
    message (and its end-of-turn token) only, but one with `"weight": 0` (OpenAI's fine-tuning format), which is context.
    data.format_prompt renders the text of its last user message, as RL renders a chat-message prompt's. Rows without
    it use data.prompt_key and sft.response_key."""
    response_key: str = "response"
    """Column holding the assistant's reply to data.prompt_key (a one-exchange conversation; the prompt goes through
    data.format_prompt as in RL). Both columns may hold chat messages instead of text (TRL's conversational
    prompt-completion data)."""
    tools_key: str = "tools"
    """Column holding a row's tools (TRL's tool-calling data): a list of JSON schemas (OpenAI's {"type": "function",
    "function": {...}} or bare functions), or a JSON string of one. They go to the chat template as `tools=`, as the
    tools of worker.rollout.multi_turn do in RL, so the model learns its tool calls beside the tool list that RL shows
    it (Qwen2.5's and Qwen3's templates list them in the system message). Rows without it render without tools."""
    max_length: int = 2048
    """Longest conversation in tokens (pictures' tokens included); longer rows are skipped, counted and named."""


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
    sft: SFTConfig = field(default_factory=SFTConfig)
    """`easyrl sft`: the conversation columns and the length limit."""
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    """`easyrl generate`: where the samples go and how they are drawn."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """`easyrl eval`: samples per prompt, what counts as correct, where the results go."""

    @property
    def world_size(self) -> int:
        """Devices (workers) of the run: trainer.nnodes x trainer.n_gpus_per_node."""
        return self.trainer.nnodes * self.trainer.n_gpus_per_node

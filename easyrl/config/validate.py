"""Validation: everything that can be checked before Ray starts, in well under two seconds (nothing heavy is
imported: no torch, no model, no data). A config that passes runs; the workers check nothing again."""

import ast
import difflib
import json
import math
import os
import re
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..data.synthetic import parse_builtin
from ..data.tokenizer import CHAT_TEMPLATE_PLACES, folder_has_chat_template
from ..demo import builtin_models
from ..paths import BUILTIN_PREFIX, FUNCTION_SEPARATOR, looks_local, shipped_files_hint, unreadable_suffix_hint
from ..utils.platform import nvidia_gpus_visible
from ..utils.runtime_env import ray_job_runtime_env
from ..workers.reward.judge import CHAT_PATH, compile_score_pattern, load_template, template_source
from ..workers.reward.loader import (
    RewardFunctionError,
    check_reward_kwargs,
    parse_user_file,
    resolve_reward_function,
)
from .compat import FOREIGN_CHOICE_VALUES
from .load import data_parallel_size
from .schema import DEFAULT_CPU_KV_CACHE_BYTES, ActorConfig, ConfigError, JudgeConfig, PPOConfig


# Names of the registered algorithms and loggers, listed here so that check needs no torch import; a test asserts
# they equal the registries (easyrl.algorithms.*, easyrl.trainer.loggers), so adding one fails loudly until listed.
ADV_ESTIMATORS = ("gae", "grpo", "grpo_passk", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo")
POLICY_LOSSES = ("cispo", "gspo", "gspo_token", "ppo", "sapo")
KL_PENALTIES = ("abs", "full", "kl", "low_var_kl", "mse")
LOGGER_NAMES = ("console", "file", "mlflow", "swanlab", "tensorboard", "wandb")
TOOL_CALL_PARSERS = ("hermes",)  # easyrl.workers.rollout.multi_turn.TOOL_CALL_PARSERS
# estimators that learn a value model (a critic role exists), and those that compare the n samples of a prompt
CRITIC_ESTIMATORS = frozenset({"gae"})
GROUP_ESTIMATORS = frozenset({"grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline"})
# the algorithm settings only some estimators / policy losses read (a test compares them with the functions'
# parameters): a changed value beside another one does nothing, which the plan notes (plan._settings_without_effect)
ESTIMATOR_SETTINGS = {
    "algorithm.gamma": frozenset({"gae", "reinforce_plus_plus"}),
    "algorithm.lam": frozenset({"gae"}),
    "algorithm.norm_adv_by_std_in_grpo": frozenset({"grpo", "grpo_passk"}),
}
LOSS_SETTINGS = {
    "worker.actor.tau_positive": frozenset({"sapo"}),
    "worker.actor.tau_negative": frozenset({"sapo"}),
}
# policy losses that clip the ratio r to [1 - clip_ratio_low, 1 + clip_ratio_high] (cispo clips a weight instead, and
# its paper sets clip_ratio_low >= 1 on purpose: no lower bound)
CLIPPED_LOSSES = frozenset({"ppo", "gspo", "gspo_token"})

# the docs' short names (EasyR1's, mapped by compat.LOSS_AVG_MODE_ALIASES) and verl's long ones
LOSS_AVG_MODES = ("token", "seq", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
CHOICES = {
    "algorithm.adv_estimator": ADV_ESTIMATORS,
    "worker.actor.loss_type": POLICY_LOSSES,
    "algorithm.kl_penalty": KL_PENALTIES,
    "trainer.logger": LOGGER_NAMES,
    "worker.actor.loss_avg_mode": LOSS_AVG_MODES,
    "worker.critic.loss_avg_mode": LOSS_AVG_MODES,
    "worker.rollout.name": ("vllm", "hf"),
    "worker.rollout.dtype": ("bf16", "fp16", "fp32", "bfloat16", "float16", "float32"),
    "worker.rollout.lora_sync": ("auto", "adapter", "merged"),
    "worker.actor.optim.strategy": ("adamw", "adamw_bf16"),
    "worker.critic.optim.strategy": ("adamw", "adamw_bf16"),
    "worker.actor.optim.lr_scheduler_type": ("constant", "cosine"),
    "worker.critic.optim.lr_scheduler_type": ("constant", "cosine"),
    "algorithm.kl_type": ("fixed", "adaptive"),
    "worker.actor.strategy": ("fsdp",),
    "worker.critic.strategy": ("fsdp",),
    "worker.ref.strategy": ("fsdp",),
    "worker.reward.judge.kind": ("none", "http", "vllm", "classifier"),
    "worker.reward.judge.score_transform": ("sigmoid", "linear"),
    "worker.reward.judge.dtype": ("bf16", "fp16", "fp32", "bfloat16", "float16", "float32"),
}
DTYPE_KEYS = (
    "mp_param_dtype",
    "mp_reduce_dtype",
    "mp_buffer_dtype",
)
DTYPES = ("bf16", "fp16", "fp32", "bfloat16", "float16", "float32")
# The sampling keys worker.rollout.val_override_config may set: the fields of SamplingSettings
# (easyrl.workers.rollout.base) but max_tokens, listed here so that check needs no torch import; a test asserts they
# are equal.
SAMPLING_OVERRIDE_KEYS = ("ignore_eos", "n", "temperature", "top_k", "top_p")
# vLLM's settings validation may add (rollout.base.VAL_ENGINE_KEYS; HF generate takes the first alone), listed here so
# that check imports no torch; a test asserts they agree
VAL_ENGINE_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p")
VAL_HF_ENGINE_KEYS = ("repetition_penalty",)
# the data files data/sources.py reads (its FILE_BUILDERS; a test asserts they agree), for a check without datasets
DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".tsv", ".arrow", ".feather")
# A connection to the model hub that takes longer than this counts as no hub (transformers would retry for a minute).
HUB_PROBE_TIMEOUT_S = 0.8


@dataclass(frozen=True)
class Interval:
    """The values a numeric key accepts: between ``low`` and ``high`` (either side open or closed, None: unbounded),
    or one of ``special`` (e.g. -1 for "all"). NaN and infinities are never accepted."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    special: tuple = ()
    why: str = ""
    """Said after the range in the error, when the range alone does not explain itself."""

    def admits(self, value: Any) -> bool:
        if value in self.special:
            return True
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            text = f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = f"{'<' if self.high_open else '<='} {self.high:g}"
        return text + "".join(f", or {value:g}" for value in self.special)


POSITIVE = Interval(0, low_open=True)
AT_LEAST_ONE = Interval(1)
NON_NEGATIVE = Interval(0)
SHARE = Interval(0, 1)
PROBABILITY = Interval(0, 1, low_open=True)


def _trainable_role_ranges(role: str) -> dict[str, Interval]:
    prefix = f"worker.{role}"
    return {
        f"{prefix}.global_batch_size": AT_LEAST_ONE,
        f"{prefix}.micro_batch_size_per_device_for_update": AT_LEAST_ONE,
        f"{prefix}.micro_batch_size_per_device_for_experience": AT_LEAST_ONE,
        f"{prefix}.ppo_epochs": AT_LEAST_ONE,
        f"{prefix}.ulysses_size": AT_LEAST_ONE,
        f"{prefix}.model.lora.rank": NON_NEGATIVE,
        f"{prefix}.model.lora.alpha": POSITIVE,
        f"{prefix}.model.lora.dropout": Interval(0, 1, high_open=True),
        f"{prefix}.model.lora.lr": POSITIVE,
        f"{prefix}.model.vision_cache_mb": NON_NEGATIVE,
        f"{prefix}.optim.lr": Interval(0, low_open=True, why="the optimizer would stand still or climb the loss"),
        f"{prefix}.optim.weight_decay": NON_NEGATIVE,
        f"{prefix}.optim.lr_warmup_ratio": SHARE,
        f"{prefix}.optim.lr_warmup_steps": NON_NEGATIVE,
        f"{prefix}.optim.min_lr_ratio": SHARE,
    }


# Every numeric key with a domain, checked by `easyrl check` (None passes for keys that may be null). docs/config.md
# shows each range next to its key.
RANGES: dict[str, Interval] = {
    "data.video_fps": POSITIVE,
    "data.max_frames": Interval(2),
    "data.max_prompt_length": AT_LEAST_ONE,
    "data.max_response_length": AT_LEAST_ONE,
    "data.rollout_batch_size": AT_LEAST_ONE,
    "data.mini_rollout_batch_size": AT_LEAST_ONE,
    "data.val_batch_size": Interval(1, special=(-1,)),
    "data.min_pixels": AT_LEAST_ONE,
    "data.max_pixels": AT_LEAST_ONE,
    "data.filter_overlong_prompts_workers": NON_NEGATIVE,
    "data.dataloader_num_workers": NON_NEGATIVE,
    "algorithm.gamma": SHARE,
    "algorithm.lam": SHARE,
    "algorithm.kl_coef": NON_NEGATIVE,
    "algorithm.kl_horizon": POSITIVE,
    "algorithm.kl_target": POSITIVE,
    **_trainable_role_ranges("actor"),
    # 0 leaves the ratio no room on that side (EasyR1's CISPO recipe sets clip_ratio_low=0)
    "worker.actor.clip_ratio_low": NON_NEGATIVE,
    "worker.actor.clip_ratio_high": NON_NEGATIVE,
    "worker.actor.clip_ratio_dual": Interval(
        1, low_open=True, why="dual-clip PPO bounds the loss by C |A| with C > 1"
    ),
    "worker.actor.tau_positive": POSITIVE,
    "worker.actor.tau_negative": POSITIVE,
    "worker.actor.tis_cap": POSITIVE,
    **_trainable_role_ranges("critic"),
    "worker.critic.cliprange_value": POSITIVE,
    "worker.ref.micro_batch_size_per_device_for_experience": AT_LEAST_ONE,
    "worker.rollout.n": AT_LEAST_ONE,
    "worker.rollout.temperature": Interval(
        0,
        low_open=True,
        why="training samples at this temperature and scores log-probs at it (logits / temperature); for greedy "
        "validation set worker.rollout.val_override_config.temperature=0, and for greedy `easyrl generate` or "
        "`easyrl eval` add generate.val_sampling=true or eval.val_sampling=true to it",
    ),
    "worker.rollout.top_p": PROBABILITY,
    "worker.rollout.limit_images": NON_NEGATIVE,
    "worker.rollout.gpu_memory_utilization": PROBABILITY,
    "worker.rollout.kv_cache_memory_bytes": AT_LEAST_ONE,
    "worker.rollout.tensor_parallel_size": AT_LEAST_ONE,
    "worker.rollout.max_model_len": AT_LEAST_ONE,
    "worker.rollout.max_num_batched_tokens": AT_LEAST_ONE,
    "worker.rollout.multi_turn.max_turns": AT_LEAST_ONE,
    "worker.rollout.multi_turn.turn_max_tokens": AT_LEAST_ONE,
    "worker.rollout.multi_turn.tool_timeout": POSITIVE,
    "worker.reward.num_cpus": NON_NEGATIVE,
    "worker.reward.timeout_s": POSITIVE,
    "worker.reward.rule_weight": NON_NEGATIVE,
    "worker.reward.judge.weight": NON_NEGATIVE,
    "worker.reward.judge.concurrency": AT_LEAST_ONE,
    "worker.reward.judge.max_retries": NON_NEGATIVE,
    "worker.reward.judge.retry_backoff_s": NON_NEGATIVE,
    "worker.reward.judge.timeout_s": POSITIVE,
    "worker.reward.judge.temperature": NON_NEGATIVE,
    "worker.reward.judge.max_tokens": AT_LEAST_ONE,
    "worker.reward.judge.max_length": AT_LEAST_ONE,
    "worker.reward.judge.num_gpus": NON_NEGATIVE,
    "worker.reward.judge.gpu_memory_utilization": PROBABILITY,
    "worker.reward.judge.kv_cache_memory_bytes": AT_LEAST_ONE,
    "worker.reward.judge.max_model_len": AT_LEAST_ONE,
    "trainer.total_epochs": AT_LEAST_ONE,
    "trainer.max_steps": AT_LEAST_ONE,
    "trainer.nnodes": AT_LEAST_ONE,
    "trainer.n_gpus_per_node": AT_LEAST_ONE,
    "trainer.critic_warmup": NON_NEGATIVE,
    # the trainer's limit test is 0 < max_try_make_batch < rounds: 0 would mean no limit too, unannounced
    "trainer.max_try_make_batch": Interval(1, special=(-1,), why="-1 means no limit"),
    "trainer.val_generations_to_log": NON_NEGATIVE,
    "trainer.save_every_minutes": NON_NEGATIVE,
    "trainer.max_restarts": NON_NEGATIVE,
}
# worker.rollout.val_override_config values, checked like the rollout's own (temperature 0 is greedy there)
SAMPLING_OVERRIDE_RANGES = {
    "n": AT_LEAST_ONE,
    "temperature": NON_NEGATIVE,
    "top_p": PROBABILITY,
    "min_p": Interval(0, 1),
    "repetition_penalty": Interval(0, None, low_open=True),
    "presence_penalty": Interval(-2, 2),
    "frequency_penalty": Interval(-2, 2),
}


def config_value(config: PPOConfig, key: str) -> Any:
    """The value of dotted ``key`` (``worker.rollout.n``) in ``config``."""
    node: Any = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        foreign = FOREIGN_CHOICE_VALUES.get(key, {}).get(value)
        if foreign is not None:  # a near spelling of another algorithm would mislead
            hint = f" {foreign}."
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
    local = Path(path).expanduser()
    if local.is_file():
        raise ConfigError(f"`{key}`: `{path}` is a file; give the model's folder (the one holding config.json).")
    if looks_local(path) and not local.exists():
        made_by_a_run = local.name == "huggingface"  # the folder `easyrl sft` writes at its end, `easyrl merge` too
        raise ConfigError(
            f"`{key}`: local model path `{path}` does not exist."
            + (
                " A run's huggingface/ folder is written when `easyrl sft` ends (or by `easyrl merge` of a checkpoint):"
                " run that first, with the trainer.save_checkpoint_path this path is under."
                if made_by_a_run
                else ""
            )
        )
    merged = local.parent / "huggingface"
    if key.endswith("model_path") and _is_adapter_folder(local) and (merged / "config.json").is_file():
        if not _is_adapter_folder(merged):  # `easyrl merge` in place moved a LoRA checkpoint's adapters here
            raise ConfigError(
                f"`{key}`: `{path}` holds the LoRA adapters that `easyrl merge` set aside (adapter_config.json, no "
                f"model weights); the merged model it wrote is `{merged}`: give that folder."
            )
    if key.endswith("model_path") and (role := _unmerged_checkpoint_role(local)) is not None:
        if _is_adapter_folder(role / "huggingface"):  # a LoRA run's checkpoint: its huggingface/ holds the adapters
            raise ConfigError(
                f"`{key}`: `{path}` is part of a LoRA training checkpoint, whose `{role / 'huggingface'}` holds the "
                f"LoRA adapters (no model weights), which transformers and vLLM cannot load as a model. `easyrl merge "
                f"--local_dir {role}` merges them into the base model there (the adapters move to its lora_adapter/); "
                f"then give `{role / 'huggingface'}`."
            )
        raise ConfigError(
            f"`{key}`: `{path}` is part of a training checkpoint (sharded model and optimizer state, no Hugging "
            f"Face weights), which transformers and vLLM cannot load. Write it as a Hugging Face model with `easyrl "
            f"merge --local_dir {role}` and give `{role / 'huggingface'}`."
        )
    # an adapter folder first: one written by `easyrl merge --adapter_only` holds no config.json either
    if key.endswith("model_path") and _is_adapter_folder(local):
        raise ConfigError(
            f"`{key}`: `{path}` is a peft adapter folder (adapter_config.json, no model weights), which transformers "
            "and vLLM cannot load as a model. Merge the adapters into their base model and give that folder (peft: "
            "PeftModel.from_pretrained(base, folder).merge_and_unload().save_pretrained(out)); after `easyrl sft` "
            "with LoRA that is its `huggingface/` folder, and `easyrl merge` without --adapter_only writes one."
        )
    if key.endswith("model_path") and local.is_dir() and not (local / "config.json").is_file():
        steps = sorted(local.glob("global_step_*/actor/huggingface/config.json"), key=lambda p: _step_of(p.parents[1]))
        hint = (
            f" It holds checkpoints: write the newest as a model with `easyrl merge --local_dir {steps[-1].parents[1]}`."
            if steps
            else ""
        )
        raise ConfigError(f"`{key}`: `{path}` holds no config.json, so it is not a Hugging Face model folder.{hint}")
    if not local.exists():
        # a hub id; check reads no network: only a declared offline mode (the driver probes the hub before Ray)
        check_hub_model(key, path, probe=False)


def _step_of(checkpoint: Path) -> int:
    suffix = checkpoint.name.rsplit("_", 1)[-1]
    return int(suffix) if suffix.isdigit() else -1


def _unmerged_checkpoint_role(folder: Path) -> Optional[Path]:
    """The role folder of an easyrl checkpoint (``global_step_N/actor``: DCP shards and a ``huggingface/`` config
    folder) that ``folder`` names without a merged model in it: the role folder itself, its checkpoint
    (``global_step_N``) or its ``huggingface/`` folder before `easyrl merge` wrote weights there. None otherwise."""
    if not folder.is_dir():
        return None
    for role in (folder, folder / "actor", folder.parent):
        if (role / ".metadata").is_file() and (role / "huggingface" / "config.json").is_file():
            hf = role / "huggingface"
            # a LoRA checkpoint's huggingface/ holds the adapters (adapter_model.safetensors): not a merged model
            weights = [*hf.glob("*.safetensors"), *hf.glob("*.bin")]
            merged = any(not file.name.startswith("adapter_model") for file in weights)
            return None if merged and folder == hf else role
    return None


def _is_adapter_folder(folder: Path) -> bool:
    """A peft adapter folder with no model weights beside the adapters' (a folder that also holds model weights is a
    model). The file names are models/lora.py's ADAPTER_*_FILE, spelled out: that module imports torch and peft, and
    `easyrl check` must not."""
    if not (folder / "adapter_config.json").is_file():
        return False
    weights = [*folder.glob("*.safetensors"), *folder.glob("*.bin"), *folder.glob("*.safetensors.index.json")]
    return all(file.name.startswith("adapter_model") for file in weights)


def _offline_declared() -> Optional[str]:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{name}={os.environ[name]}"
    return None


def _hub_cache() -> Path:
    """The hub client's cache folder, read from the environment now (the client reads it once, at import)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _in_hub_cache(repo_id: str) -> bool:
    """A snapshot of the hub model ``repo_id`` with files in it is in the local cache (loading it needs no hub)."""
    snapshots = _hub_cache() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(folder.is_dir() and any(folder.iterdir()) for folder in snapshots.iterdir())


def _hub_unreachable_reason(probe: bool) -> Optional[str]:
    """Why the model hub cannot be reached (offline mode declared, or, with ``probe``, no TCP connection to the hub
    or its proxy within HUB_PROBE_TIMEOUT_S); None when it can, or when unknown without a probe."""
    offline = _offline_declared()
    if offline or not probe:
        return offline
    endpoint = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    names = ("HTTPS_PROXY", "https_proxy") if endpoint.scheme == "https" else ("HTTP_PROXY", "http_proxy")
    proxy = next((os.environ[name] for name in (*names, "ALL_PROXY", "all_proxy") if os.environ.get(name)), None)
    target = urllib.parse.urlsplit(proxy if "://" in (proxy or "") else f"http://{proxy}") if proxy else endpoint
    host, port = target.hostname or "", target.port or (443 if target.scheme == "https" else 80)
    connected = threading.Event()

    def connect() -> None:  # in a thread: name resolution has no timeout of its own
        try:
            socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S).close()
            connected.set()
        except OSError:
            pass

    threading.Thread(target=connect, daemon=True).start()
    if connected.wait(HUB_PROBE_TIMEOUT_S):
        return None
    return f"no connection to {host}:{port}{' (the proxy)' if proxy else ''} within {HUB_PROBE_TIMEOUT_S:g} s"


def check_hub_model(key: str, path: str, probe: bool = True) -> None:
    """A hub id must be in the local cache or its hub reachable: raise ConfigError at once instead of the minute of
    retries transformers spends before an error that does not name the key."""
    if path.startswith(BUILTIN_PREFIX) or os.path.exists(os.path.expanduser(path)) or _in_hub_cache(path):
        return
    reason = _hub_unreachable_reason(probe)
    if reason:
        raise ConfigError(
            f"`{key}={path}`: not a local folder, and the model hub is unreachable ({reason}); give a local path (a "
            f"folder holding config.json), or download the model where the hub is reachable "
            f"(e.g. `hf download {path}`)."
        )


def check_model_sources(config: PPOConfig) -> None:
    """Every model and tokenizer the run reads can be read from here (the driver calls this before loading them)."""
    keys = ["worker.actor.model.model_path", "worker.actor.model.tokenizer_path"]
    if uses_critic(config):
        keys.append("worker.critic.model.model_path")
    for key in keys:
        path = config_value(config, key)
        if path:
            check_hub_model(key, path)


def _check_file(key: str, path: Optional[str], what: str, hint: str = "") -> None:
    if path and not Path(path).expanduser().is_file():
        raise ConfigError(f"`{key}`: {what} file `{path}` does not exist.{' ' + hint if hint else ''}")


def _check_range(key: str, value: Any, interval: Interval) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not interval.admits(value):
        why = f" ({interval.why})" if interval.why else ""
        two_sided = interval.low is not None and interval.high is not None
        raise ConfigError(f"`{key}` is {value!r}; it must be {'in ' if two_sided else ''}{interval}{why}.")


def _check_ranges(config: PPOConfig) -> None:
    for key, interval in RANGES.items():
        _check_range(key, config_value(config, key), interval)
    for role in ("actor", "critic"):
        betas = config_value(config, f"worker.{role}.optim.betas")
        if len(betas) != 2:
            raise ConfigError(f"`worker.{role}.optim.betas` is {betas}; give two numbers, e.g. [0.9, 0.999].")
        for index, beta in enumerate(betas):
            _check_range(f"worker.{role}.optim.betas[{index}]", beta, Interval(0, 1, high_open=True))
    overrides = config.worker.rollout.val_override_config
    engine_keys = VAL_HF_ENGINE_KEYS if config.worker.rollout.name == "hf" else VAL_ENGINE_KEYS
    unknown = sorted(set(overrides) - set(SAMPLING_OVERRIDE_KEYS) - set(engine_keys))
    if unknown:
        raise ConfigError(
            f"`worker.rollout.val_override_config` has unknown sampling key(s) {unknown}; allowed keys are "
            f"{[*SAMPLING_OVERRIDE_KEYS, *engine_keys]} with worker.rollout.name={config.worker.rollout.name} (the "
            "response length is `data.max_response_length`)."
        )
    for name, interval in SAMPLING_OVERRIDE_RANGES.items():
        if name in overrides:
            _check_range(f"worker.rollout.val_override_config.{name}", overrides[name], interval)


def uses_critic(config: PPOConfig) -> bool:
    """The one test of whether a run has a critic (a value model): its advantage estimator learns one."""
    return config.algorithm.adv_estimator in CRITIC_ESTIMATORS


def _check_liger(config: PPOConfig) -> None:
    """`use_liger` needs liger-kernel where the driver runs (the workers share its environment)."""
    import importlib.util

    for role in ("actor", "critic"):
        if getattr(config.worker, role).model.use_liger and importlib.util.find_spec("liger_kernel") is None:
            raise ConfigError(
                f"`worker.{role}.model.use_liger` is true but liger-kernel is not installed: pip install "
                f"'easyrl[gpu]' (or liger-kernel) on a GPU machine, or set worker.{role}.model.use_liger=false."
            )


def _check_ulysses(config: PPOConfig, role: str, role_config) -> None:
    """Ulysses (models/ulysses.py) needs whole sequence-parallel groups and a packed row to split. The head counts are
    in the model's config: read before Ray starts (trainer.preflight.check_head_splits), not here."""
    size, world = role_config.ulysses_size, config.world_size
    if size == 1:
        return
    if world % size != 0:
        raise ConfigError(
            f"`worker.{role}.ulysses_size` ({size}) must divide the number of workers ({world} = trainer.nnodes x "
            f"trainer.n_gpus_per_node): each sequence-parallel group is {size} workers. Choose a divisor of {world}."
        )
    if not role_config.padding_free:
        raise ConfigError(
            f"`worker.{role}.ulysses_size` is {size}, which splits the padding-free packed row of each micro-batch "
            f"over {size} workers; set worker.{role}.padding_free=true (or worker.{role}.ulysses_size=1)."
        )


def _check_shared_prefix(config: PPOConfig) -> None:
    """`worker.{actor,critic}.shared_prefix` (models/prefix_group.py) packs each prompt once in a padding-free row."""
    for role in ("actor", "critic") if uses_critic(config) else ("actor",):
        section = getattr(config.worker, role)
        if section.shared_prefix and not section.padding_free:
            raise ConfigError(
                f"`worker.{role}.shared_prefix` is true: it packs each prompt once in a padding-free row; set "
                f"worker.{role}.padding_free=true (or worker.{role}.shared_prefix=false to compute each sample's "
                "prompt on its own)."
            )


def _check_lora(config: PPOConfig) -> None:
    """What can be told of the adapters before the model is read: the names' types and the exclusion regex (which
    modules the names match is known only at worker start, where a name matching none stops the run)."""
    lora = config.worker.actor.model.lora
    if lora.rank == 0:
        return
    if lora.vision_tower and config.worker.actor.model.freeze_vision_tower:
        raise ConfigError(
            "`worker.actor.model.lora.vision_tower=true` trains adapters on the vision encoder that "
            "`worker.actor.model.freeze_vision_tower=true` asks to keep frozen: set one of them (LoRA without "
            "lora.vision_tower leaves the vision encoder frozen)."
        )
    names = lora.target_modules
    if not (isinstance(names, str) or (isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names))):
        raise ConfigError(
            f"`worker.actor.model.lora.target_modules` is {names!r}: give `all-linear`, a comma-separated string "
            "(q_proj,v_proj) or a list of module names."
        )
    if lora.exclude_modules is not None:
        try:
            re.compile(str(lora.exclude_modules))
        except re.error as error:
            raise ConfigError(
                f"`worker.actor.model.lora.exclude_modules` is not a valid regex ({error}): {lora.exclude_modules!r}."
            ) from error
        # the vision encoder's linear layers as Qwen-VL models name them (`visual` before transformers 4.52)
        tower_layers = ("model.visual.blocks.0.attn.qkv", "visual.blocks.0.attn.qkv", "model.visual.merger.mlp.0")
        if lora.vision_tower and any(re.fullmatch(str(lora.exclude_modules), name) for name in tower_layers):
            raise ConfigError(
                f"`worker.actor.model.lora.vision_tower=true` asks for adapters on the vision encoder, and "
                f"`worker.actor.model.lora.exclude_modules` ({lora.exclude_modules}) excludes it, so none would be "
                "trained: remove exclude_modules (EasyR1's `.*visual.*` is not needed: the encoder gets adapters only "
                "with vision_tower=true), or set lora.vision_tower=false."
            )


def _check_clip_ratio_low(actor: ActorConfig) -> None:
    """The clipped losses' lower bound 1 - clip_ratio_low must be above 0: a ratio is always positive, so a bound at
    or below 0 could never act (pg_clipfrac_lower stays 0) and the setting would do nothing."""
    low = actor.clip_ratio_low
    if actor.loss_type in CLIPPED_LOSSES and low >= 1:
        raise ConfigError(
            f"`worker.actor.clip_ratio_low` is {low:g}: the {actor.loss_type} loss clips the ratio below at 1 - "
            f"{low:g} = {1 - low:g}, which a ratio (always > 0) never reaches, so that clip could never act. Give a "
            "value in [0, 1), e.g. the default 0.2 (loss_type=cispo takes 1 or more for no lower bound)."
        )


def check_critic_warmup(config: PPOConfig, steps: int, counted_by: str) -> None:
    """The trainer first updates the actor at step critic_warmup + 1 (EasyR1's rule): refuse a warmup that lasts the
    whole run, where the policy would never train (``counted_by``: where the step count comes from)."""
    warmup = config.trainer.critic_warmup
    if warmup >= steps and not config.trainer.val_only:
        raise ConfigError(
            f"`trainer.critic_warmup` is {warmup} and the run has {steps} training steps ({counted_by}): the actor "
            f"is first updated at step {warmup + 1}, so the policy would never train. Set trainer.critic_warmup below "
            f"{steps} (0 updates the actor from the first step)."
        )


def _check_unsupported(config: PPOConfig) -> None:
    """Settings easyrl accepts as EasyR1 keys but cannot run yet: refused here, naming the key, never at worker start."""
    worker = config.worker
    if uses_critic(config) and worker.critic.model.lora.rank > 0:
        raise ConfigError(
            f"`worker.critic.model.lora.rank` is {worker.critic.model.lora.rank}: LoRA trains the actor only (the "
            "critic's value head is new and needs all its weights trained); set worker.critic.model.lora.rank=0."
        )
    _check_shared_prefix(config)
    if worker.critic.model.use_fused_kernels:
        raise ConfigError(
            "`worker.critic.model.use_fused_kernels` is true: the fused kernels compute token log-probs in a language "
            "model's head, and the critic has a value head instead; set it false (the actor and the reference use "
            "worker.actor.model.use_fused_kernels)."
        )
    if not worker.hybrid_engine:
        raise ConfigError(
            "`worker.hybrid_engine` is false: easyrl always colocates actor, rollout and reference on the same "
            "devices (the hybrid engine); remove the key or set it to true."
        )


def _run_went_on_from_it(trainer: Any) -> bool:
    """Whether the run's own folder holds checkpoints saved since it started from trainer.load_checkpoint_path, which
    a rerun goes on from: the checkpoint it names may be gone (trainer.save_limit deleted it)."""
    from ..trainer.checkpoint import load_checkpoint_passed  # torch: only for a load_checkpoint_path that is gone

    return load_checkpoint_passed(trainer) is not None


def _check_tools_file(config: PPOConfig) -> None:
    """`worker.rollout.multi_turn.tools`: the file exists, parses, and its `TOOLS` list names functions it defines or
    imports (read without importing it; the rollout imports it in the workers)."""
    key, multi_turn = "worker.rollout.multi_turn.tools", config.worker.rollout.multi_turn
    if not multi_turn.enabled:
        return
    if multi_turn.env:
        key = "worker.rollout.multi_turn.env"
    if config.worker.rollout.name != "vllm":
        raise ConfigError(
            f"`{key}` is set but `worker.rollout.name` is {config.worker.rollout.name}: multi-turn rollouts run on the "
            "vllm engine only; set worker.rollout.name=vllm."
        )
    if multi_turn.env:
        _check_env_file(multi_turn.env, multi_turn.tools, key)
        return
    file, sep, name = str(multi_turn.tools).rpartition(":")
    if sep and file.endswith(".py") and name.isidentifier():  # the form of reward_function and env, not of tools
        raise ConfigError(
            f"`{key}` is {multi_turn.tools!r}: tools are a file whose module-level `TOOLS` lists them, given without "
            f"`:name`; write {key}={file} with `TOOLS = [{name}, ...]` in it."
        )
    try:
        path, names, _ = parse_user_file(multi_turn.tools, key)
    except RewardFunctionError as err:
        raise ConfigError(str(err)) from None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    listed = None
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "TOOLS" for t in targets):
            listed = node.value
    if listed is None:
        raise ConfigError(
            f"`{key}`: `{multi_turn.tools}` defines no module-level `TOOLS`; add `TOOLS = [my_tool, ...]` listing the "
            "tool functions (see tools/calculator.py)."
        )
    if isinstance(listed, (ast.List, ast.Tuple)):
        unknown = [e.id for e in listed.elts if isinstance(e, ast.Name) and e.id not in names]
        if unknown:
            raise ConfigError(
                f"`{key}`: `TOOLS` in `{multi_turn.tools}` names {', '.join(unknown)}, which the file does not define."
            )
        if not listed.elts:
            raise ConfigError(f"`{key}`: `TOOLS` in `{multi_turn.tools}` is empty; list at least one tool function.")
    _check_tool_call_parser(multi_turn.parser, multi_turn.tools, tree)


def _registered_parsers(tree: ast.Module) -> list[str]:
    """Names a tools file registers with `@register_tool_call_parser("name")` (read, not run)."""
    names = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "register_tool_call_parser"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.append(node.args[0].value)
    return names


def _check_tool_call_parser(parser: str, tools: str, tree: ast.Module) -> None:
    """`worker.rollout.multi_turn.parser`: a built-in parser or one the tools file registers (the rollout imports the
    file before it looks the parser up)."""
    known = [*TOOL_CALL_PARSERS, *_registered_parsers(tree)]
    if parser not in known:
        raise ConfigError(
            f"`worker.rollout.multi_turn.parser` is {parser!r}; choose one of: {', '.join(known)} (or register your "
            f"own in `{tools}` with `@register_tool_call_parser({parser!r})` from easyrl.workers.rollout.multi_turn)."
        )


def _check_reward_weights(weights: Any, functions: list[str]) -> None:
    """`worker.reward.reward_weights`: null, or one finite number per function of worker.reward.reward_function."""
    if weights is None:
        return
    key = "worker.reward.reward_weights"
    if not isinstance(weights, (list, tuple)) or not all(
        isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in weights
    ):
        raise ConfigError(f"`{key}` is {weights!r}; give a list of numbers, one per reward function.")
    if len(weights) != len(functions):
        raise ConfigError(
            f"`{key}` has {len(weights)} weight(s) for {len(functions)} reward function(s) ({', '.join(functions)}); "
            "give one per function of worker.reward.reward_function, in the same order."
        )


# what the renderers pass themselves; a template variable of the same name would collide with it
TEMPLATE_CALL_ARGUMENTS = (
    "conversation",
    "messages",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
)


def check_template_kwargs(kwargs: Any) -> None:
    """`data.apply_chat_template_kwargs`: a mapping of template variable names (identifiers) to values, none of them
    an argument easyrl sets itself when it renders."""
    key = "data.apply_chat_template_kwargs"
    if not isinstance(kwargs, dict):
        raise ConfigError(
            f"`{key}` is {kwargs!r}; give a mapping of template variables, e.g. {{enable_thinking: false}}."
        )
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"`{key}` has the name {name!r}; template variables are names like enable_thinking.")
        if name in TEMPLATE_CALL_ARGUMENTS:
            hint = {
                "tools": "worker.rollout.multi_turn.tools",
                "chat_template": "data.override_chat_template",
            }.get(name, "easyrl sets it for each rendering")
            raise ConfigError(
                f"`{key}.{name}`: `{name}` is an argument of the rendering itself, not a template "
                f"variable ({hint}); remove it."
            )


def _check_env_file(env: Any, tools: Any, key: str) -> None:
    """`worker.rollout.multi_turn.env`: `path.py:ClassName` (or a mapping of names to them: TRL's dictionary of
    tool environments), the file exists and parses and defines (or imports) the class; tools beside it only when it
    is a tool environment (no `step`: TRL's environment_factory classes), and only those in a mapping."""
    if isinstance(env, dict):
        if not env or not all(isinstance(name, str) and isinstance(spec, str) for name, spec in env.items()):
            raise ConfigError(f"`{key}` is {env!r}; give a mapping of names to path/to/file.py:ClassName.")
        for name, spec in env.items():
            if _class_has_step(spec, f"{key}.{name}"):
                raise ConfigError(
                    f"`{key}.{name}`: `{spec}` has `step`; several environments are tool environments (TRL's "
                    "environment_factory classes: reset and tool methods), a stepped one is given alone."
                )
        return
    if not isinstance(env, str):
        raise ConfigError(f"`{key}` is {env!r}; give path/to/file.py:ClassName.")
    if _class_has_step(env, key) and tools:
        raise ConfigError(
            f"`{key}` and `worker.rollout.multi_turn.tools` are both set, and `{env.rpartition(':')[2]}` has `step`; "
            "give one of them (a stepped environment reads tool calls in its step if it wants them; an environment "
            "without `step`, whose methods are tools, may come with more tools)."
        )


def _class_has_step(spec: str, key: str) -> bool:
    """`path.py:ClassName` names a class the file defines or imports (read, not run); True when the file's own class
    body defines `step` (a class it imports is judged when the rollout loads it)."""
    return "step" in class_method_names(spec, key)


def class_method_names(spec: str, key: str) -> set[str]:
    """The methods the class body of `path.py:ClassName` defines, read from the file without running it (none for a
    class the file imports); a ConfigError naming ``key`` when the file or the class is missing."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not name.isidentifier():
        raise ConfigError(f"`{key}` is {spec!r}; give it as path/to/file.py:ClassName.")
    try:
        path, names, _ = parse_user_file(path_text, key)
    except RewardFunctionError as err:
        raise ConfigError(str(err)) from None
    if name not in names:
        raise ConfigError(
            f"`{key}`: `{path_text}` defines no `{name}`; name the environment class as {path_text}:<ClassName>."
        )
    tree = ast.parse(path.read_text(encoding="utf-8"))
    body = next((n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), [])
    return {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def env_owns_data(config: PPOConfig) -> bool:
    """No `data.train_files` and one tool environment (TRL's environment_factory without a train_dataset): each
    training prompt is the text its `reset` returns."""
    env = config.worker.rollout.multi_turn.env
    if config.data.train_files or config.trainer.val_only or not isinstance(env, str) or not env:
        return False
    return "step" not in class_method_names(env, "worker.rollout.multi_turn.env")


def env_owns_reward(env: Any) -> bool:
    """Every class of `worker.rollout.multi_turn.env` is a tool environment whose own body defines `get_reward` (TRL:
    the environment then is a reward source, and no reward function is needed)."""
    specs = list(env.values()) if isinstance(env, dict) else [env] if isinstance(env, str) and env else []
    key = "worker.rollout.multi_turn.env"
    return bool(specs) and all(
        {"get_reward"} <= (methods := class_method_names(spec, key)) and "step" not in methods for spec in specs
    )


def check_where_the_driver_runs(trainer: Any) -> None:
    """The trainer keys that depend on the driver's machine and environment (an RL run's and an SFT run's alike):
    trackers that can start, the variables trainer.worker_env names, and a checkpoint folder that outlives a Ray job."""
    _check_loggers_can_start(trainer.logger)
    _check_worker_env(trainer.worker_env)
    _check_checkpoints_outlive_the_job(trainer.save_checkpoint_path)


def _check_worker_env(names: Any) -> None:
    """`trainer.worker_env` names variables that are set here, where the driver reads them."""
    if not isinstance(names, list) or not all(isinstance(name, str) and name for name in names):
        raise ConfigError(f"`trainer.worker_env` is {names!r}; give a list of variable names, e.g. [OPENAI_API_KEY].")
    unset = [name for name in names if name not in os.environ]
    if unset:
        how = (
            f"set it in the job's runtime env (env_vars) or before its entrypoint (`{unset[0]}=... easyrl train ...`)"
            if ray_job_runtime_env() is not None  # a variable exported where `ray job submit` runs never gets here
            else f"export {unset[0]}=... before the run"
        )
        raise ConfigError(
            f"`trainer.worker_env` names {', '.join(unset)}, not set in this environment (the workers get the driver's "
            f"value): {how}, or remove it from trainer.worker_env."
        )


def _check_checkpoints_outlive_the_job(save_path: str) -> None:
    """Inside a Ray job with a working_dir, the driver runs in Ray's copy of that folder, which is deleted with the
    session and replaced by another copy whenever a file changes: checkpoints there would be lost, and a resubmission
    would start afresh without a word."""
    job = ray_job_runtime_env()
    if not job or not job.get("working_dir") or not save_path:
        return
    here, path = os.path.realpath(os.getcwd()), os.path.realpath(save_path)
    if path == here or path.startswith(here + os.sep):
        raise ConfigError(
            f"`trainer.save_checkpoint_path` is {path}, inside this Ray job's copy of its working_dir, which Ray "
            "deletes with its session and copies anew whenever a file changes: the checkpoints would be lost, and a "
            "resubmitted job would start afresh. Give an absolute path on storage that outlives the job (one every "
            "node sees, for several nodes), e.g. trainer.save_checkpoint_path=/shared/checkpoints/<experiment>."
        )


def _check_loggers_can_start(names: Any) -> None:
    """A tracker that cannot start (a remote service without a login) would stop the run after the workers loaded
    the model; its backend knows without being imported (the loggers package imports no backend library)."""
    from ..trainer.loggers import get_logger_class

    listed = names if isinstance(names, list) else [names]
    twice = sorted({name for name in listed if listed.count(name) > 1})
    if twice:  # the Tracker refuses it too, once Ray has started
        raise ConfigError(
            f"`trainer.logger` lists {', '.join(repr(name) for name in twice)} more than once ({listed}); "
            "name each logger once."
        )
    problems = [(name, problem) for name in listed if (problem := get_logger_class(name).start_problem())]
    if problems:  # every tracker that cannot start, so that one fix is not followed by another refusal
        raise ConfigError(
            "\n".join(
                f"`trainer.logger` includes '{name}': {problem} Or remove '{name}' from trainer.logger."
                for name, problem in problems
            )
        )


def _check_http_judge(judge: JudgeConfig, prefix: str) -> None:
    """`worker.reward.judge.kind=http`: the endpoint and the key's variable."""
    for key in ("base_url", "model"):
        if not getattr(judge, key):
            example = "http://127.0.0.1:8000/v1" if key == "base_url" else "Qwen/Qwen2.5-7B-Instruct"
            raise ConfigError(f"`{prefix}.{key}` is not set; {prefix}.kind={judge.kind} needs it (e.g. {example}).")
    url = urllib.parse.urlsplit(judge.base_url)
    if url.scheme not in ("http", "https") or not url.hostname or url.query or url.fragment:
        raise ConfigError(
            f"`{prefix}.base_url` is `{judge.base_url}`; give an http:// or https:// URL with a host and no query, "
            "e.g. http://127.0.0.1:8000/v1 (the server's OpenAI base URL)."
        )
    try:
        url.port  # noqa: B018 (reading it validates it)
    except ValueError as err:
        raise ConfigError(f"`{prefix}.base_url` is `{judge.base_url}`: {err}.") from None
    if url.path.rstrip("/").endswith(CHAT_PATH):
        raise ConfigError(
            f"`{prefix}.base_url` is `{judge.base_url}`; give the base URL without `{CHAT_PATH}` (easyrl appends it)."
        )
    if judge.api_key_env:
        name = judge.api_key_env
        # a long mixed-case/digit value is a key pasted in by mistake: refused without repeating it
        looks_like_key = len(name) >= 24 and any(c.islower() for c in name) and any(c.isdigit() for c in name)
        if looks_like_key or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise ConfigError(
                f"`{prefix}.api_key_env` is not a variable name; it holds the NAME of the environment variable with "
                "the key (e.g. OPENAI_API_KEY), never the key itself."
            )
        if not os.environ.get(name):
            raise ConfigError(
                f"`{prefix}.api_key_env` is {name}, but {name} is not set in this environment (the driver, which "
                f"sends the requests, runs here); export {name}=<key>, or set {prefix}.api_key_env=null for a server "
                "that needs no key."
            )


# the heads of config.json `architectures`: a text generator (a kind vllm / http judge) or a scorer (kind classifier)
GENERATIVE_HEADS = ("ForCausalLM", "ForConditionalGeneration")
CLASSIFIER_HEAD = "ForSequenceClassification"


def _architectures_all(hf_config: dict, heads: "str | tuple[str, ...]") -> Optional[str]:
    """The first of config.json's `architectures` when every one of them ends in one of ``heads`` (else None)."""
    architectures = hf_config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        return None
    if all(isinstance(name, str) and name.endswith(heads) for name in architectures):
        return architectures[0]
    return None


def _check_classifier_judge(judge, prefix: str) -> None:
    """`worker.reward.judge.kind=classifier`: a reward model with one output and a chat template, and a usable score
    mapping (a local folder's files are read; a hub id's are left to the workers)."""
    _check_model_path(f"{prefix}.model_path", judge.model_path, required=True)
    config_file = Path(judge.model_path).expanduser() / "config.json"
    if config_file.is_file():  # a local folder: its head must give one number per text
        try:
            hf_config = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"`{prefix}.model_path`: {config_file} cannot be read ({err}).") from None
        generator = _architectures_all(hf_config, GENERATIVE_HEADS)
        if generator:
            raise ConfigError(
                f"`{prefix}.model_path` ({judge.model_path}) is a {generator} (a generative model), not a "
                f"sequence-classification reward model (a *{CLASSIFIER_HEAD} with one output, as Skywork-Reward's). "
                f"For a judge that writes its grade, set {prefix}.kind=vllm (an engine of this model) or http (a "
                "server of it); for kind classifier, give a reward model's folder."
            )
        labels = hf_config.get("num_labels", len(hf_config.get("id2label") or {}) or 2)
        if labels != 1:
            raise ConfigError(
                f"`{prefix}.model_path` ({judge.model_path}) has {labels} labels; a classifier reward model has one "
                "output (num_labels: 1 in its config.json, as Skywork-Reward-style models do)."
            )
        if folder_has_chat_template(judge.model_path) is False:  # the workers would refuse it after Ray started
            raise ConfigError(
                f"`{prefix}.model_path` ({judge.model_path}): its tokenizer has no chat template, and easyrl writes "
                "each sample as [user: prompt, assistant: response] in the reward model's own template. Give the "
                f"folder {CHAT_TEMPLATE_PLACES} (the template of the model it was trained from)."
            )
    if not (math.isfinite(judge.score_scale) and judge.score_scale != 0):
        raise ConfigError(
            f"`{prefix}.score_scale` is {judge.score_scale!r}; give a finite, non-zero factor (1: the raw score)."
        )
    if not math.isfinite(judge.score_offset):
        raise ConfigError(f"`{prefix}.score_offset` is {judge.score_offset!r}; give a finite number.")


def _check_judge_engine_device(judge: JudgeConfig, prefix: str, nnodes: int) -> None:
    """`worker.reward.judge.kind=vllm`: the engine's device must exist (a GPU build of vLLM has no CPU backend, and
    Ray would wait forever for a GPU that no node has)."""
    gpus = nvidia_gpus_visible()
    if judge.num_gpus == 0 and gpus:
        raise ConfigError(
            f"`{prefix}.num_gpus` is 0 on a machine with NVIDIA GPUs: the judge engine would run on the CPU, which a "
            f"GPU build of vLLM cannot do. Give it 1 (a GPU besides the training workers') or the share of a GPU "
            f"other actors leave free (with {prefix}.gpu_memory_utilization at most that share)."
        )
    if judge.num_gpus > 0 and not gpus and nnodes == 1:
        raise ConfigError(
            f"`{prefix}.num_gpus` is {judge.num_gpus:g}, but this machine has no NVIDIA GPU; set it to 0 to run the "
            "judge engine on the CPU (vLLM's CPU backend)."
        )


def _local_hf_config(path: Optional[str]) -> Optional[dict]:
    """The config.json of a local model folder, or None (a hub id, a built-in model, a file that cannot be read: the
    checks that use it leave those to the loaders, which name them)."""
    config_file = Path(path).expanduser() / "config.json" if path else None
    if config_file is None or not config_file.is_file():
        return None
    try:
        return json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# what must agree between an actor's and its critic's vision configs: the critic reads the actor's pictures, cut into
# the actor's patches and merged into as many vision tokens
VISION_CUT_KEYS = ("patch_size", "spatial_merge_size", "temporal_patch_size")


def _check_critic_sees_the_actors_pictures(config: PPOConfig) -> None:
    """A vision-language actor's critic gets the actor's sequences: its vision pads, 3-D rope positions and pictures
    cut by the actor's processor. A text-only critic, or one cutting pictures otherwise (Qwen3-VL's 16-pixel patches
    under a Qwen2.5-VL actor's 14), failed in its first forward after Ray, the engine and a rollout (local folders
    only; built-in and hub models are left to the workers)."""
    actor_path, critic_path = config.worker.actor.model.model_path, config.worker.critic.model.model_path
    actor, critic = _local_hf_config(actor_path), _local_hf_config(critic_path)
    if actor is None or critic is None or not isinstance(actor.get("vision_config"), dict):
        return
    vision = critic.get("vision_config")
    if not isinstance(vision, dict):
        differs = f"it is a text-only model ({critic.get('model_type')})"
    else:
        cuts = [
            f"{key} {vision.get(key)} where the actor's is {actor['vision_config'].get(key)}"
            for key in VISION_CUT_KEYS
            if vision.get(key) != actor["vision_config"].get(key)
        ]
        if not cuts:
            return
        differs = f"its vision model cuts pictures otherwise ({', '.join(cuts)})"
    raise ConfigError(
        f"`worker.critic.model.model_path` ({critic_path}): {differs}, and the actor ({actor_path}, "
        f"{actor.get('model_type')}) is a vision-language model whose sequences, pictures and 3-D rope positions the "
        "critic reads. Give the critic a vision-language model of the actor's family (a smaller one works), e.g. the "
        "actor's own model."
    )


def _check_judge_kv_cache(judge: JudgeConfig, prefix: str) -> None:
    """A judge engine on the CPU gets a KV cache of kv_cache_memory_bytes (1 GiB when unset), which vLLM refuses to
    start with unless one request of the whole context fits: say so before Ray starts, from the model's config.json
    (a local folder; plain multi-head or grouped-query attention only: other layouts are left to the engine)."""
    hf_config = None if judge.num_gpus > 0 else _local_hf_config(judge.model_path)
    if hf_config is None:
        return  # the engine's own start names an unreadable config
    text = {**hf_config, **(hf_config.get("text_config") or {})}
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    context = judge.max_model_len or text.get("max_position_embeddings")
    if not (layers and heads and context) or "kv_lora_rank" in text or text.get("use_sliding_window"):
        return
    head_dim = text.get("head_dim") or text.get("hidden_size", 0) // heads
    kv_heads = text.get("num_key_value_heads") or heads
    per_token = 2 * layers * kv_heads * head_dim * (4 if judge.dtype in ("fp32", "float32") else 2)
    available = judge.kv_cache_memory_bytes or DEFAULT_CPU_KV_CACHE_BYTES
    if context * per_token > available:
        raise ConfigError(
            f"the judge engine's KV cache (`{prefix}.kv_cache_memory_bytes`: {available / 2**30:.2f} GiB) cannot hold "
            f"one request of its context ({context} tokens of {judge.model_path} x {per_token} bytes in "
            f"{judge.dtype} = {context * per_token / 2**30:.2f} GiB), and the engine would refuse to start. Set "
            f"{prefix}.max_model_len to what a judge message and its reply need (at most "
            f"{available // per_token} tokens fit), or give {prefix}.kv_cache_memory_bytes at least "
            f"{context * per_token}."
        )


def _check_judge_generates(judge: JudgeConfig, prefix: str) -> None:
    """`worker.reward.judge.kind=vllm` writes the judge's reply with the model: a sequence-classification reward model
    (a local folder's config.json says so) gives a score and no text, and vLLM would refuse the first batch."""
    classifier = _architectures_all(_local_hf_config(judge.model_path) or {}, CLASSIFIER_HEAD)
    if classifier:
        raise ConfigError(
            f"`{prefix}.model_path` ({judge.model_path}) is a {classifier}, a reward model that scores a text and "
            f"writes none, and a kind vllm judge generates its grade as text. Set {prefix}.kind=classifier to score "
            "with it, or give a generative judge model (a *ForCausalLM)."
        )


def _check_judge(config: PPOConfig) -> None:
    """`worker.reward.judge`: everything a judge needs that can be known without asking it (no request is sent)."""
    reward, prefix = config.worker.reward, "worker.reward.judge"
    judge = reward.judge
    if judge.kind == "none":
        if reward.rule_weight != 1:
            raise ConfigError(
                f"`worker.reward.rule_weight` is {reward.rule_weight:g} but no judge is set ({prefix}.kind=none): "
                "the weight balances the reward function against a judge, and alone it would only rescale the reward. "
                f"Set {prefix}.kind or remove rule_weight."
            )
        return
    if judge.weight == 0:
        raise ConfigError(
            f"`{prefix}.weight` is 0: the judge would be asked for every sample and its score never used; give it a "
            f"weight, or set {prefix}.kind=none."
        )
    if judge.kind == "http":
        _check_http_judge(judge, prefix)
    elif judge.kind == "vllm":
        _check_model_path(f"{prefix}.model_path", judge.model_path, required=True)
        _check_judge_generates(judge, prefix)
        _check_judge_engine_device(judge, prefix, config.trainer.nnodes)
        _check_judge_kv_cache(judge, prefix)
    elif judge.kind == "classifier":
        _check_classifier_judge(judge, prefix)
        return  # it reads no template and parses no text
    _check_file(f"{prefix}.prompt_template", judge.prompt_template, "judge prompt template")
    try:
        load_template(judge.prompt_template)
    except ValueError as err:
        raise ConfigError(f"`{prefix}.prompt_template` (`{judge.prompt_template}`): {err}.") from None
    try:
        compile_score_pattern(judge.score_pattern)
    except ValueError as err:
        raise ConfigError(f"`{prefix}.score_pattern` ({judge.score_pattern!r}): {err}.") from None
    default_pattern = JudgeConfig.score_pattern
    if judge.prompt_template and judge.score_pattern == default_pattern:
        if "score" not in template_source(judge.prompt_template).lower():
            raise ConfigError(
                f"`{prefix}.prompt_template` (`{judge.prompt_template}`) never says `score`, and the default "
                f"`{prefix}.score_pattern` reads the number after `Score` in the judge's reply: ask for a last line "
                f"`Score: N` in the template, or set {prefix}.score_pattern to what the replies hold (e.g. "
                "'([0-9]+)' reads the last number)."
            )
    low_high = judge.score_range
    if (
        not isinstance(low_high, (list, tuple))
        or len(low_high) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in low_high)
        or not low_high[0] < low_high[1]
    ):
        raise ConfigError(
            f"`{prefix}.score_range` is {low_high!r}; give [min, max] of the judge's scale with min < max, e.g. "
            "[0, 10]."
        )


def _check_required(config: PPOConfig, needs_reward: bool = True) -> None:
    """The three things every run needs, all named at once (the bare defaults have none of them); `easyrl generate`
    (``needs_reward=False``) samples without scoring when no reward is given."""
    env_data = env_owns_data(config)  # reads the environment's file: once
    needed = {
        "worker.actor.model.model_path": config.worker.actor.model.model_path,
        "data.train_files": config.data.train_files or config.trainer.val_only or env_data,
        "worker.reward.reward_function": config.worker.reward.reward_function or not needs_reward,
    }
    if config.trainer.val_only and not config.data.val_files:
        raise ConfigError(
            "trainer.val_only validates the model and trains nothing: it needs `data.val_files`, the prompts it "
            "validates on."
        )
    missing = [key for key, value in needed.items() if not value]
    if missing:
        raise ConfigError(
            f"a run needs a model, data and a reward; set {', '.join(f'`{key}`' for key in missing)} (in a "
            "config=FILE.yaml or as key=value). `easyrl train config=examples/smollm2_arithmetic_grpo.yaml` runs the "
            "embedded default: a small model, built-in data and its reward."
            + (
                " A tool environment (worker.rollout.multi_turn.env) that defines get_reward needs no reward function."
                if "worker.reward.reward_function" in missing and config.worker.rollout.multi_turn.env
                else ""
            )
        )
    if env_data and config.trainer.max_steps is None:
        raise ConfigError(
            "`data.train_files` is empty, so the tool environment of worker.rollout.multi_turn.env owns the data (each "
            "prompt is what its reset returns) and there are no epochs to count: set `trainer.max_steps` to the "
            "number of training steps, or give data.train_files."
        )


def check_generation_data(config: PPOConfig) -> None:
    """`easyrl generate` and `easyrl eval` sample the prompts of `data.val_files`: refuse a config without them."""
    if config.data.val_files:
        return
    message = "`data.val_files` is empty: set the prompts to generate for, e.g. data.val_files=FILE.jsonl."
    if config.worker.rollout.multi_turn.env:
        # rows without a prompt column beside a tool environment get an empty user message (RLHFDataset env_prompts)
        message += (
            " With a tool environment whose reset gives the task, the rows may hold only its reset arguments, e.g. "
            'one {"seed": N} per line: a row without a prompt column gets an empty user message that the reset fills.'
        )
    raise ConfigError(message)


def _divisors(number: int) -> str:
    return ", ".join(str(d) for d in range(1, number + 1) if number % d == 0)


def _check_role_batches(config: PPOConfig, role: str) -> None:
    """One role's batch arithmetic (the actor's, the critic's): optimizer steps per rollout batch, samples per worker,
    micro-batches per worker; each refusal gives the numbers and the values that work."""
    data, rollout, world = config.data, config.worker.rollout, config.world_size
    section = getattr(config.worker, role)
    key = f"worker.{role}"
    own = " (the critic has its own, 256 by default as in EasyR1)" if role == "critic" else ""
    if data.rollout_batch_size % section.global_batch_size != 0:
        raise ConfigError(
            f"`data.rollout_batch_size` ({data.rollout_batch_size}) must be a multiple of `{key}.global_batch_size` "
            f"({section.global_batch_size}){own}: each step makes rollout_batch_size / global_batch_size optimizer "
            f"steps. Make global_batch_size a divisor of it: {_divisors(data.rollout_batch_size)}."
        )
    samples = section.global_batch_size * rollout.n
    # the samples split over the data-parallel groups: the workers, or groups of ulysses_size that share theirs
    groups = data_parallel_size(section, world)
    split = (
        f"over {groups} data-parallel group{'s' * (groups > 1)} of `{key}.ulysses_size` workers"
        if groups != world
        else f"over {world} worker{'s' * (world > 1)}"
    )
    if samples % groups != 0:
        size = data.rollout_batch_size
        working = [d for d in range(1, size + 1) if size % d == 0 and d * rollout.n % groups == 0]
        fix = (
            f"Choose a global_batch_size among {', '.join(map(str, working))}."
            if working
            else f"No divisor of data.rollout_batch_size ({data.rollout_batch_size}) does with worker.rollout.n="
            f"{rollout.n}: change worker.rollout.n or data.rollout_batch_size so that their product is a multiple "
            f"of {groups}."
        )
        raise ConfigError(
            f"`{key}.global_batch_size` x `worker.rollout.n` = {samples} samples per optimizer step cannot be "
            f"split evenly {split}{' (`trainer.nnodes` x `trainer.n_gpus_per_node`)' * (groups == world)}. {fix}"
        )
    per_device, micro = section.global_batch_size_per_device, section.micro_batch_size_per_device_for_update
    # with dynamic batching the micro-batch size only sets the token budget, and the loss is divided by the whole
    # mini-batch's tokens whatever the split: any number of samples per device works (EasyR1 asks divisibility anyway)
    if per_device % micro != 0 and not section.dynamic_batching:
        raise ConfigError(
            f"Each worker gets {per_device} samples per optimizer step (`{key}.global_batch_size` x "
            f"`worker.rollout.n` = {samples}, {split}), which is not a multiple of "
            f"`{key}.micro_batch_size_per_device_for_update` ({micro}), as fixed micro-batches "
            f"(`{key}.dynamic_batching=false`) need. Use one that divides {per_device}: {_divisors(per_device)}, or "
            f"set {key}.dynamic_batching=true."
        )


def _check_update_batches(config: PPOConfig) -> None:
    """The batch arithmetic of the updates: optimizer steps per rollout batch, micro-batches per worker."""
    rollout = config.worker.rollout
    _check_role_batches(config, "actor")
    if uses_critic(config):
        _check_role_batches(config, "critic")
    if rollout.n == 1 and config.algorithm.adv_estimator in GROUP_ESTIMATORS:
        raise ConfigError(
            f"`algorithm.adv_estimator={config.algorithm.adv_estimator}` compares samples of the same prompt and "
            "needs `worker.rollout.n` > 1 (e.g. worker.rollout.n=8); with n=1 every advantage would be 0."
        )


def validate_config(config: PPOConfig, needs_reward: bool = True) -> None:
    """Raise ConfigError for the first problem found; nothing heavy is imported or started. ``needs_reward``: false
    for a run that only samples (`easyrl generate`), where a reward function is optional."""
    _check_required(config, needs_reward)
    for key, allowed in CHOICES.items():
        value = config_value(config, key)
        if isinstance(value, list):
            for item in value:
                _check_choice(key, item, allowed)
        else:
            _check_choice(key, value, allowed)
    if config.worker.reward.reward_type is not None:  # older EasyR1 configs'
        _check_choice("worker.reward.reward_type", config.worker.reward.reward_type, ("batch", "sequential"))
    for role in ("actor", "critic", "ref"):
        fsdp = config_value(config, f"worker.{role}.fsdp")
        for name in DTYPE_KEYS:
            _check_choice(f"worker.{role}.fsdp.{name}", getattr(fsdp, name), DTYPES)
        if fsdp.torch_dtype is not None:
            _check_choice(f"worker.{role}.fsdp.torch_dtype", fsdp.torch_dtype, DTYPES)
    check_where_the_driver_runs(config.trainer)

    data, actor, rollout, critic = config.data, config.worker.actor, config.worker.rollout, config.worker.critic
    _check_ranges(config)
    if data.min_pixels is not None and data.max_pixels is not None and data.min_pixels > data.max_pixels:
        raise ConfigError(
            f"`data.min_pixels` ({data.min_pixels}) is above `data.max_pixels` ({data.max_pixels}): no picture size "
            "satisfies both; lower min_pixels or raise max_pixels."
        )
    if data.max_frames is not None and data.max_frames % 2:
        raise ConfigError(
            f"`data.max_frames` ({data.max_frames}) must be even: Qwen-VL models pack video frames in pairs, so an odd "
            f"budget would get its last frame repeated; use {data.max_frames - 1} or {data.max_frames + 1}."
        )

    world = config.world_size
    for role in ("actor", "critic") if uses_critic(config) else ("actor",):
        # whole sequence-parallel groups first: the batch arithmetic below divides by their number
        _check_ulysses(config, role, getattr(config.worker, role))
    if not config.trainer.val_only:  # `easyrl generate` / `eval` and trainer.val_only make no update
        _check_update_batches(config)
    for role in ("actor", "critic", "ref") if uses_critic(config) else ("actor", "ref"):
        fsdp_size = config_value(config, f"worker.{role}.fsdp.fsdp_size")
        if 0 < fsdp_size < world and world % fsdp_size != 0:
            raise ConfigError(
                f"`worker.{role}.fsdp.fsdp_size` ({fsdp_size}) must divide the number of workers ({world} = "
                "trainer.nnodes x trainer.n_gpus_per_node); -1 shards over all of them."
            )
    if (
        rollout.name == "vllm"
        and rollout.max_model_len is not None
        and rollout.max_model_len <= data.max_prompt_length
    ):
        # the data keeps prompts up to data.max_prompt_length tokens; the engine refuses one longer than its context
        # at the first generate, after Ray and the models have started
        raise ConfigError(
            f"`worker.rollout.max_model_len` ({rollout.max_model_len}) leaves no room for a response after a prompt of "
            f"`data.max_prompt_length` ({data.max_prompt_length}) tokens, which the data may hold: the engine would "
            f"refuse such a prompt at the first step. Raise it to data.max_prompt_length + data.max_response_length "
            f"({data.max_prompt_length + data.max_response_length}, its default when unset), or lower "
            "data.max_prompt_length."
        )
    if (
        rollout.name == "vllm"
        and not rollout.enable_chunked_prefill
        and rollout.max_num_batched_tokens < (rollout.max_model_len or 0)
    ):
        raise ConfigError(
            f"`worker.rollout.max_num_batched_tokens` ({rollout.max_num_batched_tokens}) is smaller than the context "
            f"length ({rollout.max_model_len}, `worker.rollout.max_model_len`, by default data.max_prompt_length + "
            "data.max_response_length): a prompt could never be scheduled. Raise it or set "
            "`worker.rollout.enable_chunked_prefill=true`."
        )
    if world % rollout.tensor_parallel_size != 0:
        raise ConfigError(
            f"`worker.rollout.tensor_parallel_size` ({rollout.tensor_parallel_size}) must divide the number of "
            f"workers ({world} = trainer.nnodes x trainer.n_gpus_per_node)."
        )
    _check_unsupported(config)
    _check_clip_ratio_low(actor)
    if config.trainer.max_steps is not None:
        check_critic_warmup(config, config.trainer.max_steps, "trainer.max_steps")
    _check_lora(config)
    _check_liger(config)
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
        _check_critic_sees_the_actors_pictures(config)
    try:  # the loader's own rule (`main`, else `compute_score`), read from the file without running it
        if config.worker.reward.reward_function or needs_reward:
            _, chosen = resolve_reward_function(config.worker.reward.reward_function)
            _check_reward_weights(config.worker.reward.reward_weights, chosen.split(FUNCTION_SEPARATOR))
            check_reward_kwargs(config.worker.reward.reward_function, config.worker.reward.reward_function_kwargs)
    except RewardFunctionError as err:
        raise ConfigError(str(err)) from None
    _check_judge(config)
    load = config.trainer.load_checkpoint_path
    if load and not os.path.isdir(os.path.expanduser(load)) and not _run_went_on_from_it(config.trainer):
        raise ConfigError(
            f"`trainer.load_checkpoint_path`: `{load}` does not exist; give a global_step_N folder of a run, or unset "
            "it to resume from the newest checkpoint under trainer.save_checkpoint_path."
        )
    _check_tools_file(config)
    if data.image_dir and not os.path.isdir(os.path.expanduser(data.image_dir)):
        raise ConfigError(
            f"`data.image_dir`: `{data.image_dir}` is not a folder; relative picture and video paths are looked up in "
            "it, then in the data file's folder and the working directory. Fix it, or unset it."
        )
    _check_file("data.format_prompt", data.format_prompt, "prompt template", shipped_files_hint("format_prompt"))
    _check_file("data.override_chat_template", data.override_chat_template, "chat template")
    check_template_kwargs(data.apply_chat_template_kwargs)
    for key in ("data.train_files", "data.val_files"):
        value = config_value(config, key)
        if value and value.startswith(BUILTIN_PREFIX):
            try:
                parse_builtin(value)
            except ValueError as error:
                raise ConfigError(f"`{key}`: {error}") from None
        elif value and not os.path.exists(os.path.expanduser(value)):
            path = value.split("@", 1)[0]
            is_file_name = Path(path).suffix.lower() in DATA_FILE_SUFFIXES
            if (looks_local(path) or is_file_name) and not os.path.exists(os.path.expanduser(path)):
                raise ConfigError(f"`{key}`: data file `{path}` does not exist.")
        if value and os.path.isfile(os.path.expanduser(value.split("@", 1)[0])):
            name = Path(value.split("@", 1)[0]).name
            if not name.lower().endswith(DATA_FILE_SUFFIXES):
                raise ConfigError(
                    f"`{key}`: cannot read `{name}`: give a {', '.join(DATA_FILE_SUFFIXES)} file or a dataset folder."
                    + unreadable_suffix_hint(name)
                )

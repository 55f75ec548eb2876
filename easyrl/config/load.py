"""Loading a PPOConfig: defaults <- YAML file (``config=path.yaml``) <- command-line dotted overrides
(``worker.rollout.n=8``), unknown and derived keys refused with a suggestion, then every derived value filled in one
place (``derive``)."""

import difflib
import os
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

from ..paths import absolute_if_local, resolve_shipped_file
from .compat import LOSS_AVG_MODE_ALIASES, LOSS_TYPE_ALIASES, rename_legacy
from .schema import ConfigError, PPOConfig


# ----------------------------------------------------------------------------------------------------------------------
# the key tree
# ----------------------------------------------------------------------------------------------------------------------
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


FIELDS = _field_types()
# Dict-valued fields whose contents are free-form (not checked against the tree).
FREE_DICT_KEYS = {key for key, f in FIELDS.items() if f.type is dict or f.metadata.get("mapping")}
DERIVED_KEYS = {key for key, f in FIELDS.items() if f.metadata.get("derived")}


def valid_keys() -> list[str]:
    return sorted(key for key in FIELDS if key not in DERIVED_KEYS)


def _suggest(key: str) -> str:
    leaf = key.rsplit(".", 1)[-1]
    section = key.rsplit(".", 1)[0] if "." in key else ""
    candidates = valid_keys()
    same_section = [k for k in candidates if k.rsplit(".", 1)[0] == section] if section else candidates
    close = difflib.get_close_matches(key, same_section, n=1, cutoff=0.6)
    if not close:
        # the right leaf name in another section, e.g. worker.ulysses_size -> worker.actor.ulysses_size
        close = [k for k in candidates if k.endswith("." + leaf)][:1]
    if not close:
        close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
    return f" Did you mean `{close[0]}`?" if close else ""


def _check_keys(flat: dict[str, Any], source: str) -> None:
    for key in flat:
        if key in DERIVED_KEYS:
            raise ConfigError(
                f"`{key}` (from {source}) is derived by easyrl from other keys and cannot be set; remove it "
                "(`easyrl check` prints the value it gets)."
            )
        if key in FIELDS or any(key.startswith(free + ".") for free in FREE_DICT_KEYS):
            continue
        raise ConfigError(f"Unknown config key `{key}` (from {source}).{_suggest(key)}")


# ----------------------------------------------------------------------------------------------------------------------
# reading YAML and overrides
# ----------------------------------------------------------------------------------------------------------------------
def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; leaves are non-dict values (free-form dicts stay whole)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value and full not in FREE_DICT_KEYS:
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


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def read_config(args: Optional[list[str]] = None) -> PPOConfig:
    """The merged config (derived values filled, not validated)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    config_file, overrides = None, []
    for arg in args or []:
        if arg.startswith("config="):
            config_file = arg.split("=", 1)[1]
        else:
            overrides.append(arg)

    layers = []
    if config_file:
        flat = rename_legacy(_flatten(_load_yaml(config_file)))
        _check_keys(flat, f"config file {config_file}")
        layers.append(("config file " + config_file, _unflatten(flat)))
    if overrides:
        flat = rename_legacy(_parse_overrides(overrides))
        _check_keys(flat, "the command line")
        layers.append(("the command line", _unflatten(flat)))

    merged = OmegaConf.structured(PPOConfig)
    for source, layer in layers:
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(layer))
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or "?"
            expected = FIELDS.get(key)
            hint = f" Expected {_type_name(expected.type)}." if expected is not None else ""
            message = str(err.msg).splitlines()[0].rstrip(".")
            raise ConfigError(f"Bad value for `{key}` (from {source}): {message}.{hint}") from None
    config: PPOConfig = OmegaConf.to_object(merged)
    derive(config)
    return config


def load_config(args: Optional[list[str]] = None, validate: bool = True) -> PPOConfig:
    """Build a PPOConfig from `config=FILE` and `key=value` arguments (defaults <- file <- overrides)."""
    config = read_config(args)
    if validate:
        from .validate import validate_config

        validate_config(config)
    return config


# ----------------------------------------------------------------------------------------------------------------------
# derived values
# ----------------------------------------------------------------------------------------------------------------------
def derive(config: PPOConfig) -> None:
    """Fill every derived value; the one place where one section's values are copied into another's."""
    worker = config.worker
    actor, rollout, ref, critic = worker.actor, worker.rollout, worker.ref, worker.critic
    rollout.prompt_length = config.data.max_prompt_length
    rollout.response_length = config.data.max_response_length
    rollout.trust_remote_code = actor.model.trust_remote_code
    if rollout.max_model_len is None:
        rollout.max_model_len = config.data.max_prompt_length + config.data.max_response_length

    actor.loss_avg_mode = LOSS_AVG_MODE_ALIASES.get(actor.loss_avg_mode, actor.loss_avg_mode)
    critic.loss_avg_mode = LOSS_AVG_MODE_ALIASES.get(critic.loss_avg_mode, critic.loss_avg_mode)
    actor.loss_type = LOSS_TYPE_ALIASES.get(actor.loss_type, actor.loss_type)
    actor.disable_kl = config.algorithm.disable_kl
    actor.use_kl_loss = config.algorithm.use_kl_loss
    actor.kl_penalty = config.algorithm.kl_penalty
    actor.kl_coef = config.algorithm.kl_coef

    for model in (actor.model, critic.model):
        model.model_path = absolute_if_local(model.model_path)
        model.tokenizer_path = absolute_if_local(model.tokenizer_path)
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
    ref.use_fused_kernels = actor.model.use_fused_kernels
    ref.shared_prefix = actor.shared_prefix

    world_size = max(config.world_size, 1)
    # the ranks of one Ulysses group share their samples (each holds a slice of every sequence), so a step's samples
    # split over the data-parallel groups, as in EasyR1: global x n / (world / ulysses_size) per rank
    actor.global_batch_size_per_device = actor.global_batch_size * rollout.n // data_parallel_size(actor, world_size)
    critic.global_batch_size_per_device = (
        critic.global_batch_size * rollout.n // data_parallel_size(critic, world_size)
    )

    trainer = config.trainer
    if trainer.save_checkpoint_path is None:
        trainer.save_checkpoint_path = os.path.join("checkpoints", trainer.project_name, trainer.experiment_name)
    trainer.save_checkpoint_path = os.path.abspath(trainer.save_checkpoint_path)
    reward = worker.reward
    reward.reward_function = resolve_shipped_file(reward.reward_function, "reward_function")
    config.data.format_prompt = resolve_shipped_file(config.data.format_prompt, "format_prompt")
    multi_turn = rollout.multi_turn
    multi_turn.tools = resolve_shipped_file(multi_turn.tools, "tools")
    env_key = "worker.rollout.multi_turn.env"
    if isinstance(multi_turn.env, str):
        multi_turn.env = resolve_shipped_file(multi_turn.env, "tools", env_key)
    elif multi_turn.env:  # TRL's dictionary of environments: name -> path.py:ClassName
        multi_turn.env = {
            name: resolve_shipped_file(spec, "tools", f"{env_key}.{name}") for name, spec in multi_turn.env.items()
        }
    for key in ("format_prompt", "override_chat_template", "image_dir"):
        setattr(config.data, key, absolute_if_local(getattr(config.data, key)))
    rollout.multi_turn.chat_template = config.data.override_chat_template
    rollout.multi_turn.chat_template_kwargs = dict(config.data.apply_chat_template_kwargs)


# ----------------------------------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------------------------------
def config_to_yaml(config: PPOConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(config))


def config_to_dict(config: PPOConfig) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(config))


def data_parallel_size(role_config, world_size: int) -> int:
    """How many data-parallel groups a role's samples split over: the workers, over ``ulysses_size`` (a size that
    does not divide the workers counts as 1 here; validation refuses it, naming the key)."""
    size = max(role_config.ulysses_size, 1)
    return world_size // size if world_size % size == 0 else world_size

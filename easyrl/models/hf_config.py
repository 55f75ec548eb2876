"""A role's Hugging Face model config as the workers read it, and the checks made of it before the workers start.

Torch-free (transformers' config classes only): the driver and `easyrl check` read model configs through this module
without importing the FSDP and LoRA code (torch, peft), which cost every `easyrl train` seconds at start.
"""

import functools
import logging

from ..config import ModelConfig
from ..utils.remote_code import naming_the_remote_code_key


logger = logging.getLogger(__name__)


def config_role(kind: str) -> str:
    """The config section of a model kind, for errors that name its keys."""
    return "critic" if kind == "value" else "actor"


def load_hf_config(model_config: ModelConfig, kind: str):
    from transformers import AutoConfig

    from ..demo.builtin_models import resolve_model_path

    overrides = dict(model_config.override_config)
    if kind == "value":
        # no dropout before the value head: transformers' token-classification head otherwise drops 10% of its input
        # in training mode, so the update's values would not be the ones the rollout step computed
        overrides.update(num_labels=1, classifier_dropout=0.0)
    path = resolve_model_path(model_config.model_path)
    with naming_the_remote_code_key(path, config_role(kind)):
        config, unknown = AutoConfig.from_pretrained(
            path, trust_remote_code=model_config.trust_remote_code, return_unused_kwargs=True, **overrides
        )
    # transformers applies only the keys its config class declares and hands the others back unused: a key such
    # as classifier_dropout, which the model class reads with getattr, would be dropped without a word
    for key, value in unknown.items():
        setattr(config, key, value)
    undeclared = tuple(sorted(set(unknown) & set(model_config.override_config)))
    if undeclared:
        _warn_undeclared_overrides(config_role(kind), undeclared, type(config).__name__)
    return config


@functools.cache
def _warn_undeclared_overrides(role: str, keys: tuple[str, ...], config_class: str) -> None:
    """Once per process: a role's config is read several times (the model, the dtype its folders are written in)."""
    logger.warning(
        "worker.%s.model.override_config: %s %s not among %s's declared fields; set on the config all the same, "
        "it changes the model only where the model's code reads it.",
        role,
        ", ".join(keys),
        "is" if len(keys) == 1 else "are",
        config_class,
    )


def check_heads(
    hf_config,
    ulysses_size: int,
    key: str,
    world_size: int | None = None,
    splitter: str = "Ulysses splits the attention heads over the sequence-parallel ranks",
) -> None:
    """Each rank attends with 1/k of the query heads and 1/k of the key/value heads (GQA groups stay whole); with
    fewer key/value heads than ranks (k a multiple of them) each key/value head is repeated until every rank has one.
    ``world_size``: the run's workers, which a size must divide too (the sizes suggested are those that do);
    ``splitter``: what splits the heads (vLLM's tensor parallelism has the same rule)."""
    heads = getattr(hf_config, "num_attention_heads", None)
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads is None:
        raise ValueError(f"`{key}` is {ulysses_size} but the model config names no num_attention_heads.")
    if heads % ulysses_size or (kv_heads % ulysses_size and ulysses_size % kv_heads):
        sizes = [k for k in range(1, heads + 1) if heads % k == 0 and (kv_heads % k == 0 or k % kv_heads == 0)]
        choice = f"Choose one of {', '.join(map(str, sizes))}."
        if world_size is not None and any(world_size % k for k in sizes):
            fitting = [k for k in sizes if world_size % k == 0]
            choice = (
                f"Of the sizes the heads allow ({', '.join(map(str, sizes))}), {', '.join(map(str, fitting))} also "
                f"divide{'s' if len(fitting) == 1 else ''} the {world_size} workers."
            )
        raise ValueError(
            f"`{key}` is {ulysses_size}, but {splitter} and this model has {heads} attention heads and {kv_heads} "
            f"key/value heads: the attention heads must be divisible by {key}, and the key/value heads divisible by it "
            f"or a divisor of it. {choice}"
        )

"""LoRA adapters (Hu et al., arXiv 2106.09685) on the actor: W x + (alpha / r) B A x with W frozen, A (r, in) and
B (out, r) trained.

The Hugging Face model is wrapped in a peft ``PeftModel`` BEFORE FSDP2 shards it, so the adapters are sharded like
every other parameter; only ``lora_A`` / ``lora_B`` require gradients. The reference policy is the same module with
the adapters switched off (``adapter_disabled``): no second copy of the weights.

Adapter names are peft's (``base_model.model.<module>.lora_A.weight``): what ``get_peft_model_state_dict`` gives,
``PeftModel.from_pretrained`` reads from ``adapter_model.safetensors`` and vLLM's LoRA loader takes.
"""

import enum
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model, get_peft_model_state_dict
from peft.tuners.tuners_utils import BaseTunerLayer
from torch.distributed.tensor import DTensor

from ..config.schema import LoraConfig
from ..utils.files import open_like_new_files
from .vision import vision_tower


ADAPTER_NAME = "default"
TARGET_KEY = "worker.actor.model.lora.target_modules"
ALL_LINEAR = "all-linear"
ADAPTER_INIT_SEED = 0
# the files of a peft adapter folder (PeftModel.from_pretrained, vLLM's LoRARequest)
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


def _module_name(model: torch.nn.Module, module: torch.nn.Module | None) -> str | None:
    if module is None:
        return None
    return next((name for name, m in model.named_modules() if m is module), None)


def _requested_names(target_modules: Any) -> list[str] | None:
    """The names the user asked for; None for `all-linear`."""
    if isinstance(target_modules, str):
        if target_modules.strip().lower() == ALL_LINEAR:
            return None
        return [name.strip() for name in target_modules.split(",") if name.strip()]
    return [str(name) for name in target_modules]


def _matches(name: str, target: str) -> bool:
    """peft's rule for a list entry: the whole module name or its trailing dotted part."""
    return name == target or name.endswith("." + target)


def _resolve_targets(model: torch.nn.Module, lora_config: LoraConfig, excluded: re.Pattern) -> list[str]:
    """The ``target_modules`` list handed to peft: last name components where they only name linear layers that get
    adapters (readable, and what vLLM's LoRA expects), full module names elsewhere (a vision merger's ``mlp.0``)."""
    linear = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and name}
    candidates = {name for name in linear if not excluded.fullmatch(name)}
    if linear and not candidates and lora_config.exclude_modules:
        raise ValueError(
            f"`worker.actor.model.lora.exclude_modules` ({lora_config.exclude_modules}) excludes every linear layer of "
            f"{type(model).__name__} that may get adapters, so none would be trained: narrow it (it is matched "
            "against whole module names, e.g. `.*layers\\.0\\..*`)."
        )
    requested = _requested_names(lora_config.target_modules)
    if requested is None:
        chosen = candidates
    else:
        chosen = set()
        for target in requested:
            hits = {name for name in candidates if _matches(name, target)}
            if not hits:
                leaves = sorted({name.rsplit(".", 1)[-1] for name in candidates})
                raise ValueError(
                    f"`{TARGET_KEY}` names `{target}`, which matches no linear layer of {type(model).__name__} "
                    f"that may get adapters (the LM head and, unless worker.actor.model.lora.vision_tower=true, the "
                    f"vision encoder never do). Its linear layers end in: {', '.join(leaves[:20])}. Use those names "
                    f"or `{ALL_LINEAR}`."
                )
            chosen |= hits
    if not chosen:
        raise ValueError(f"`{TARGET_KEY}` selects no linear layer of {type(model).__name__}.")
    # excluded modules are safe from any target name: peft checks the exclusion first
    others = {
        name for name, _ in model.named_modules() if name and name not in chosen and not excluded.fullmatch(name)
    }
    targets = set()
    for name in chosen:
        leaf = name.rsplit(".", 1)[-1]
        # a leaf name that also ends a module that must stay adapter-free would wrap that module too; a number
        # (`mlp.0` of a Sequential) names nothing by itself
        safe = leaf.isidentifier() and not any(_matches(other, leaf) for other in others)
        targets.add(leaf if safe else name)
    return sorted(targets)


def _exclusion_pattern(model: torch.nn.Module, lora_config: LoraConfig, is_vision_language: bool) -> str:
    """One regex (peft full-matches it against module names) of everything that never gets adapters."""
    parts = []
    head = _module_name(model, model.get_output_embeddings())
    if head is not None:
        parts.append(re.escape(head))
    if is_vision_language and not lora_config.vision_tower:
        tower = _module_name(model, vision_tower(model))
        if tower is None:
            raise ValueError(f"{type(model).__name__} is a vision-language model without a vision encoder to exclude.")
        parts.append(re.escape(tower) + r"(\..*)?")
    if lora_config.exclude_modules:
        parts.append(lora_config.exclude_modules)
    return "|".join(f"(?:{part})" for part in parts)


def apply_lora(model: torch.nn.Module, lora_config: LoraConfig, *, is_vision_language: bool) -> PeftModel:
    """Wrap a Hugging Face model (not yet sharded) with trainable adapters; every base weight gets
    ``requires_grad=False``. The LM head never gets adapters, nor the vision encoder unless ``lora.vision_tower``."""
    exclude = _exclusion_pattern(model, lora_config, is_vision_language)
    targets = _resolve_targets(model, lora_config, re.compile(exclude))
    peft_config = PeftLoraConfig(
        r=lora_config.rank,
        lora_alpha=lora_config.alpha,
        lora_dropout=lora_config.dropout,
        target_modules=targets,
        exclude_modules=exclude or None,
        bias="none",
    )
    model.requires_grad_(False)
    # every rank draws the same A (B starts at zero): FSDP2 keeps each rank's own slice of what it was given
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ADAPTER_INIT_SEED)
        peft_model = get_peft_model(model, peft_config, adapter_name=ADAPTER_NAME)
    for name, param in peft_model.named_parameters():
        param.requires_grad_(is_adapter_key(name))
    return peft_model


def has_lora(model: torch.nn.Module) -> bool:
    """True for a module wrapped by ``apply_lora`` (sharded or not)."""
    return isinstance(model, PeftModel)


@contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Forward passes inside run the base weights alone (the reference policy).

    Only each adapter layer's switch is flipped. peft's ``disable_adapter`` also sets requires_grad=False on the
    adapters while it is on, and FSDP2 decides a parameter group's gradient reduce dtype from the parameters that
    require grad at its first forward: a run whose first forward was the reference's (KL on, on-policy) reduced no
    gradient to fp32 and failed in its first backward under bf16 mixed precision."""
    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    before = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, disabled in zip(layers, before, strict=True):
            layer._disable_adapters = disabled


def adapter_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trainable adapter parameters (sharded under FSDP2)."""
    return [param for name, param in model.named_parameters() if is_adapter_key(name)]


@torch.no_grad()
def lora_state_dict(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full (unsharded) adapter tensors under peft's names, e.g.
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``. A collective under FSDP2: every rank calls
    it and gets the same tensors (on the device the parameters live on)."""
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER_NAME)
    full = {}
    for name, tensor in state.items():
        tensor = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()
        full[name] = tensor.to(dtype) if dtype is not None else tensor
    return full


def _json_able(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    if isinstance(value, dict):
        return {str(k): _json_able(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_able(v) for v in value]
    if isinstance(value, enum.Enum):  # peft_type, task_type
        return value.value
    return value


def lora_peft_config(model: torch.nn.Module) -> dict:
    """What ``adapter_config.json`` holds for this model's adapter (JSON-able)."""
    config = _json_able(model.peft_config[ADAPTER_NAME].to_dict())
    json.dumps(config)  # fails here, naming the value, rather than in a writer later
    return config


def is_adapter_key(name: str) -> bool:
    """A parameter (or state dict key) of an adapter, e.g. ``...q_proj.lora_A.default.weight``."""
    return ".lora_A." in name or ".lora_B." in name


def peft_name(module_key: str) -> str:
    """A module's state-dict key of an adapter tensor -> its name in an adapter folder (the adapter name dropped):
    ``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``."""
    return re.sub(rf"\.(lora_[AB])\.{ADAPTER_NAME}\.", r".\1.", module_key)


def write_adapter_folder(path: str, tensors: dict[str, torch.Tensor], peft_config: dict) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors``: a folder ``PeftModel.from_pretrained(base, path)``
    and vLLM load."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, ADAPTER_CONFIG_FILE), "w", encoding="utf-8") as file:
        json.dump(peft_config, file, indent=2)
    save_file(
        {name: t.detach().cpu().contiguous() for name, t in tensors.items()}, os.path.join(path, ADAPTER_WEIGHTS_FILE)
    )
    open_like_new_files(path)

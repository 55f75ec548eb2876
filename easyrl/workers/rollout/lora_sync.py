"""The actor's LoRA adapters (arXiv 2106.09685) in the vLLM engine: the base weights once, then only the adapter.

Two routes, decided once when the engine starts (``worker.rollout.lora_sync``):

- adapter (the default where it works): the engine is built with ``enable_lora`` and loads the base weights from
  the model path, as without LoRA. Each sync gathers the full adapter tensors (``lora_state_dict``, peft's names) and
  hands them to every engine IN MEMORY: the worker extension builds vLLM's ``LoRAModel`` from the tensors
  (``LoRAModel.from_lora_tensors``, the step vLLM's own loader runs after reading ``adapter_model.safetensors``) and
  registers it under one fixed adapter id, replacing the previous one. Generation then asks for that id; vLLM finds
  it registered and never looks at the (placeholder) path. Nothing touches the disk, and a sync moves the adapter's
  bytes (a few MB at rank 8 on a 135M model) instead of the model's.
- merged (the fallback): the engine serves merged weights, streamed through the ordinary per-layer buckets
  (``merged_weight_buckets``: W + scaling * B @ A, with peft's ``base_model.model.`` and ``.base_layer`` taken out of
  the names so that they are the checkpoint's). Costs a full-model sync per step, as full training does.

Detection rule of ``auto`` (a warning names the reason whenever it falls back):
1. before the engine starts: vLLM's class for the architecture implements LoRA (``SupportsLoRA``), the rank is one
   vLLM serves (<= 512), and the adapter uses no peft feature vLLM refuses (DoRA, adapter biases, ...);
2. after it starts: every module that has an adapter in the actor is a module the engine serves with LoRA (after
   vLLM's checkpoint-name mapping; q/k/v and gate/up count through their fused modules). vLLM's LoRA leaves the
   vision tower of most VLMs out, so ``worker.actor.model.lora.vision_tower=true`` usually ends here on the merged
   route. An engine that failed this check keeps its LoRA wrapping (a little slower) but gets no adapter requests.
``adapter`` skips the fallback and raises where ``auto`` would fall back; ``merged`` always streams merged weights.

vLLM's ``LoRALayerWeights.optimize`` scales ``lora_B`` by alpha / r IN PLACE when it packs the adapter: on one rank,
the gathered tensors can be the actor's own parameters (a one-rank FSDP2 shard is the whole tensor), so the engine
works on copies.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from peft.tuners.lora import LoraLayer

from ...models.lora import ADAPTER_NAME as PEFT_ADAPTER
from ...models.lora import has_lora, lora_peft_config, lora_state_dict
from ..fsdp_utils import iter_full_params_per_layer
from .weight_sync import WeightSyncExtension, checkpoint_name


LORA_SYNC_KEY = "worker.rollout.lora_sync"
LORA_SYNC_MODES = ("auto", "adapter", "merged")
# the one adapter the engine holds; vLLM needs an id > 0 and a non-empty path, which it never reads for an adapter
# that is already registered under the id
ADAPTER_ID = 1
ADAPTER_NAME = "easyrl_actor"
IN_MEMORY_PATH = "in-memory://easyrl_actor"
# ranks vLLM's LoRA config accepts (vllm.config.lora.MaxLoRARanks)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# peft's wrapping: the model under ``base_model.model.``, the wrapped layer under ``.base_layer``
PEFT_PREFIX = "base_model.model."
_LORA_PARAM_MARKERS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.", ".lora_magnitude_vector.")


@dataclass(frozen=True)
class ActorLora:
    """What the engine must know about the actor's adapters before it starts."""

    rank: int
    peft_config: dict
    """``adapter_config.json``'s content (peft's LoraConfig as a dict)."""
    module_names: tuple[str, ...]
    """The Hugging Face names of the modules that carry an adapter (peft's prefix and wrapping taken out)."""


def actor_lora(module: torch.nn.Module | None) -> ActorLora | None:
    """The actor's adapters, or None when the actor is not LoRA-wrapped (or absent: generate/eval workers)."""
    if module is None or not has_lora(module):
        return None
    peft_config = lora_peft_config(module)
    names = sorted(
        {
            _hf_name(name.rsplit(".lora_A.", 1)[0])
            for name, _ in module.named_parameters()
            if ".lora_A." in name  # ``<module>.lora_A.<adapter>.weight``
        }
    )
    return ActorLora(rank=int(peft_config["r"]), peft_config=peft_config, module_names=tuple(names))


def _hf_name(name: str) -> str:
    name = checkpoint_name(name)
    return name[len(PEFT_PREFIX) :] if name.startswith(PEFT_PREFIX) else name


def engine_max_lora_rank(rank: int) -> int | None:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``; None above vLLM's largest."""
    return next((allowed for allowed in VLLM_LORA_RANKS if allowed >= rank), None)


def check_lora_sync_mode(mode: str) -> None:
    if mode not in LORA_SYNC_MODES:
        raise ValueError(f"`{LORA_SYNC_KEY}` is `{mode}`; choose one of: {', '.join(LORA_SYNC_MODES)}.")


def adapter_refusal_before_start(lora: ActorLora, hf_config: Any) -> str | None:
    """Why the engine cannot serve this adapter, as far as the config tells (rule 1 of the module docstring); None
    when it can. Import vLLM's modules inside the engine environment (see vllm_rollout)."""
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_lora

    if engine_max_lora_rank(lora.rank) is None:
        return f"LoRA rank {lora.rank} is above the largest vLLM serves ({VLLM_LORA_RANKS[-1]})"
    problems = PEFTHelper.from_dict(lora.peft_config)._validate_features()
    if problems:
        return "vLLM cannot serve this adapter: " + " ".join(problems)
    architectures = list(getattr(hf_config, "architectures", None) or [])
    # the registry maps an architecture name to vLLM's class, as the engine does when it starts
    classes = [ModelRegistry._try_load_model_cls(arch) for arch in architectures]
    model_cls = next((cls for cls in classes if cls is not None), None)
    if model_cls is None:
        return f"vLLM has no class of its own for {architectures or 'this model'}"
    if not supports_lora(model_cls):
        return f"vLLM's {model_cls.__name__} does not implement LoRA"
    return None


# ----------------------------------------------------------------------------------------------------------------------
# inside the engine's worker (reached through collective_rpc; ``worker`` is vLLM's worker with our extension)
# ----------------------------------------------------------------------------------------------------------------------
def _engine_lora_manager(worker: Any) -> Any:
    manager = getattr(worker.model_runner, "lora_manager", None)
    if manager is None:
        raise RuntimeError("The vLLM engine was started without LoRA (`enable_lora`); it cannot take an adapter.")
    return manager


def _checkpoint_name_mapper(model: Any) -> Any:
    """vLLM's checkpoint -> module renames (e.g. Qwen2.5-VL's ``model.language_model.`` -> ``language_model.model.``),
    as its adapter loader applies them (renames only: stacking is the LoRA manager's business)."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    return mapper.get_rename_mapper() if mapper is not None else None


def unserved_adapter_modules(worker: Any, module_names: list[str]) -> list[str]:
    """The actor's adapter modules (Hugging Face names) the engine has no LoRA layer for (rule 2)."""
    from vllm.lora.utils import parse_fine_tuned_lora_name

    adapter_manager = _engine_lora_manager(worker)._adapter_manager
    mapper = _checkpoint_name_mapper(adapter_manager.model)
    served = set(adapter_manager.modules)
    for packed in adapter_manager.packed_modules.values():  # fused qkv_proj serves q_proj, k_proj, v_proj
        served.update(packed)
    unserved = []
    for name in module_names:
        engine_name, _ = parse_fine_tuned_lora_name(f"{PEFT_PREFIX}{name}.lora_A.weight", mapper)
        if engine_name not in served:
            unserved.append(name)
    return unserved


def load_adapter_in_engine(worker: Any, peft_config: dict, tensors: dict[str, torch.Tensor]) -> float:
    """Register ``tensors`` (peft's names) as the engine's adapter ``ADAPTER_ID``, replacing the previous one; the
    next batch that asks for the id runs with it. Returns the bytes handed over."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = _engine_lora_manager(worker)
    helper = PEFTHelper.from_dict({**peft_config, "vllm_max_position_embeddings": manager.max_position_embeddings})
    helper.validate_legal(manager.lora_config)
    model = manager._adapter_manager.model
    num_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    adapter = LoRAModel.from_lora_tensors(
        lora_model_id=ADAPTER_ID,
        # copies: packing scales lora_B in place (module docstring)
        tensors={name: tensor.detach().to("cpu", copy=True) for name, tensor in tensors.items()},
        peft_helper=helper,
        device="cpu",
        dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size,
        weights_mapper=_checkpoint_name_mapper(model),
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )
    manager.remove_adapter(ADAPTER_ID)  # frees its slot, so that activating the new one overwrites it
    manager._adapter_manager.add_adapter(adapter)  # packs q/k/v and gate/up, folds the scaling into lora_B
    manager._adapter_manager.activate_adapter(ADAPTER_ID)  # copies it into the LoRA layers' slot
    return float(num_bytes)


# ----------------------------------------------------------------------------------------------------------------------
# the merged route: the actor's weights with the adapters folded in, in the bucket stream
# ----------------------------------------------------------------------------------------------------------------------
def _adapter_scalings(model: torch.nn.Module) -> dict[str, float]:
    """peft's scaling (alpha / r, or alpha / sqrt(r) with rsLoRA, per module with rank/alpha patterns) by module
    name, as the module itself applies it."""
    scalings = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and PEFT_ADAPTER in module.scaling:
            if getattr(module, "fan_in_fan_out", False):
                raise NotImplementedError(f"`{name}`: merging a fan_in_fan_out (Conv1D) adapter is not supported.")
            scalings[name] = float(module.scaling[PEFT_ADAPTER])
    return scalings


def merged_weight_buckets(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The LoRA-wrapped actor's weights as the merged model's checkpoint holds them, one FSDP bucket at a time (a
    collective, like ``iter_full_params_per_layer``): ``W + scaling * B @ A`` computed in the master dtype, then cast
    to ``dtype``; adapter tensors dropped; names without peft's prefix and ``.base_layer``."""
    scalings = _adapter_scalings(model)
    for bucket in iter_full_params_per_layer(model):
        tensors = dict(bucket)
        merged = []
        for name, tensor in bucket:
            if any(marker in name for marker in _LORA_PARAM_MARKERS):
                continue
            if ".base_layer." in name:
                module, leaf = name.rsplit(".base_layer.", 1)
                if leaf == "weight" and module in scalings:
                    lora_a = tensors.get(f"{module}.lora_A.{PEFT_ADAPTER}.weight")
                    lora_b = tensors.get(f"{module}.lora_B.{PEFT_ADAPTER}.weight")
                    if lora_a is None or lora_b is None:
                        raise RuntimeError(f"`{module}`: its LoRA A/B tensors are not in the same FSDP unit.")
                    # (out, in) + (out, r) @ (r, in)
                    tensor = tensor + scalings[module] * (lora_b.to(tensor.dtype) @ lora_a.to(tensor.dtype))
                name = f"{module}.{leaf}"
            merged.append((_hf_name(name), tensor.to(dtype) if dtype is not None else tensor))
        yield merged


def sync_actor_weights(module: torch.nn.Module, engine: Any, dtype: torch.dtype | None) -> None:
    """Bring the engine to the actor's current weights (a collective: every rank calls it), cast to ``dtype``: the
    adapter alone on the "adapter" route, else the per-layer stream of the full (with LoRA: merged) weights. An engine
    that generates with the actor module itself (hf) never pulls the stream, so nothing is gathered for it."""
    if getattr(engine, "lora_route", None) == "adapter":
        engine.update_adapter(lambda: lora_state_dict(module, dtype))
    elif has_lora(module):
        engine.update_weights(merged_weight_buckets(module, dtype))
    else:
        engine.update_weights(iter_full_params_per_layer(module, dtype))


class LoraSyncExtension(WeightSyncExtension):
    """The engine worker's extension (``LLM(worker_extension_cls=...)``): the weight stream, plus the adapter."""

    def easyrl_unserved_lora_modules(self, module_names: list[str]) -> list[str]:
        return unserved_adapter_modules(self, module_names)

    def easyrl_load_lora(self, peft_config: dict, tensors: dict[str, torch.Tensor]) -> float:
        return load_adapter_in_engine(self, peft_config, tensors)

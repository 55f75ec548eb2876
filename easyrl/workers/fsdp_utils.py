"""Building FSDP2 models from Hugging Face checkpoints, moving them between devices, and reading full weights.

Sharding follows TorchTitan: ``fully_shard`` on every decoder layer (the model's ``_no_split_modules``, which for VLMs
also lists the vision blocks), then on a VLM's vision tower (its patch embedding and merger), then on the root, over a
1-D device mesh (or a 2-D replicate x shard mesh for hybrid sharding, ``fsdp.fsdp_size``).
"""

import copy
import importlib.util
import inspect
import logging
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ..config import FSDPConfig, ModelConfig
from ..models import attention, lora, vision, vision_encoder
from ..models.checkpoint_layout import released_dtype, save_pretrained_in_released_layout
from ..models.hf_config import config_role, load_hf_config
from ..utils import device
from ..utils.remote_code import naming_the_remote_code_key
from ..utils.torch_functional import to_dtype


logger = logging.getLogger(__name__)


def attention_implementation(model_cls: type | None = None) -> str:
    """flash_attention_2 where it is installed (GPU); else easyrl's own (models/attention.py): PyTorch's varlen kernel
    on a GPU, one sdpa call per packed sequence on the CPU. Neither attends across the packed sequences, and neither
    builds transformers' (tokens x tokens) mask for a packed row, which plain sdpa keeps for every layer's backward.

    A ``model_cls`` whose layers do not look their attention up in transformers' registry (a checkpoint's own
    modeling code, trust_remote_code, often picks from a fixed table of eager / sdpa / flash_attention_2 classes) gets
    plain sdpa: easyrl's name would not be in its table."""
    if device.is_cuda_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    if model_cls is not None and not _takes_registered_attention(model_cls):
        logger.warning(
            "%s runs its own attention classes, not transformers' registry of attention functions: it gets sdpa, "
            "whose padding-free rows carry a (tokens x tokens) mask (more memory and time than easyrl's attention).",
            model_cls.__name__,
        )
        return "sdpa"
    return attention.register()


def _takes_registered_attention(model_cls: type) -> bool:
    # transformers' own test of this (it reads the class's module source), private, hence the guard
    check = getattr(model_cls, "_can_set_attn_implementation", None)
    if not callable(check):
        return True
    if "_can_set_attn_implementation_cached_value" not in vars(model_cls):
        # transformers caches the answer on the class it asked, and a subclass (shipped code deriving from
        # Qwen2ForCausalLM) would read its parent's answer: have this class's own module read
        model_cls._can_set_attn_implementation_cached_value = None
    return bool(check())


# ----------------------------------------------------------------------------------------------------------------------
# which Hugging Face class a checkpoint loads into
# ----------------------------------------------------------------------------------------------------------------------
# resolver(hf_config, kind) -> model class or None; kind is "causal_lm" (actor/ref), "value" (critic) or "reward"
# (a sequence-classification reward model, worker.reward.judge.kind=classifier).
ModelClassResolver = Callable[[object, str], type | None]
_MODEL_CLASS_RESOLVERS: list[ModelClassResolver] = []


def register_model_class_resolver(resolver: ModelClassResolver) -> ModelClassResolver:
    """Let a model family (e.g. image-text-to-text VLMs) choose its class; earlier registrations win."""
    _MODEL_CLASS_RESOLVERS.append(resolver)
    return resolver


def resolve_model_class(hf_config: object, kind: str) -> type:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoModelForTokenClassification

    for resolver in _MODEL_CLASS_RESOLVERS:
        model_cls = resolver(hf_config, kind)
        if model_cls is not None:
            return model_cls
    if kind == "reward":
        return AutoModelForSequenceClassification
    return AutoModelForTokenClassification if kind == "value" else AutoModelForCausalLM


def concrete_model_class(model_cls: type, hf_config, trust_remote_code: bool) -> type:
    """The class an Auto class (``AutoModelForCausalLM``, ...) loads for ``hf_config``: the checkpoint's own (its
    ``auto_map``, with trust_remote_code) or transformers'. ``model_cls`` itself when it is a concrete class, or when
    the lookup fails: ``from_pretrained`` then reports the problem in its own words."""
    mapping = getattr(model_cls, "_model_mapping", None)
    if mapping is None:
        return model_cls
    reference = (getattr(hf_config, "auto_map", None) or {}).get(model_cls.__name__)
    try:
        if reference is not None and trust_remote_code:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            return get_class_from_dynamic_module(reference, hf_config._name_or_path)
        return mapping[type(hf_config)]
    except (KeyError, ValueError, OSError, ImportError):
        return model_cls


register_model_class_resolver(vision.resolve_vision_language_class)


def model_path_dtype(model_config: ModelConfig, kind: str) -> torch.dtype | None:
    """The dtype the weights at ``model_config.model_path`` are stored in: the Hugging Face folders written from
    this model (checkpoint configs, `easyrl merge`, the SFT output) use it."""
    return released_dtype(load_hf_config(model_config, kind))


def load_tokenizer_and_processor(model_config: ModelConfig, chat_template: str | None = None):
    """The tokenizer, and the multimodal processor when the checkpoint has one (else None): the driver's rule
    (``easyrl.data.tokenizer``), so workers and driver pad and process alike. ``chat_template``: the run's
    data.override_chat_template file, which they then hold (and save into every Hugging Face folder)."""
    from ..data.tokenizer import load_tokenizer_and_processor as load
    from ..demo.builtin_models import resolve_model_path

    path = resolve_model_path(model_config.tokenizer_path or model_config.model_path)
    return load(path, model_config.trust_remote_code, chat_template)


# With use_liger, RMSNorm is the model's own layer compiled by torch.compile rather than Liger's kernel: on an H100
# Liger's RMSNorm backward ran at about a quarter of the memory bandwidth, and the compiled norm made the whole actor
# update 2.2-2.4% faster there and 2.4% on an H200 (README, Performance). benchmarks/actor_update_gpu.py sets this
# true to compare the two.
LIGER_RMS_NORM = False


def apply_liger_kernels(hf_config, key: str) -> None:
    """Patch Liger's kernels (SwiGLU, RoPE; RMSNorm when `LIGER_RMS_NORM`) into this model type's transformers
    classes, before loading; `compile_rms_norms` then compiles the model's own RMSNorm layers.

    Liger's fused linear cross-entropy stays off: easyrl needs per-token log-probs and entropies, not a loss
    (``use_fused_kernels`` covers the LM head).
    """
    if not device.is_cuda_available():
        raise RuntimeError(
            f"`{key}` is true but this worker has no GPU (Liger's kernels are GPU kernels); set it false."
        )
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as error:
        raise RuntimeError(
            f"`{key}` is true but liger-kernel is not installed in the workers' environment: "
            f"pip install 'easyrl[gpu]' (or liger-kernel), or set {key}=false."
        ) from error
    model_type = getattr(hf_config, "model_type", None)
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        raise RuntimeError(
            f"`{key}` is true but liger-kernel has no kernels for model type {model_type!r} (it has: "
            f"{', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); set {key}=false."
        )
    accepted = inspect.signature(apply).parameters
    wanted = {
        "rope": True,
        "rms_norm": LIGER_RMS_NORM,
        "swiglu": True,
        "cross_entropy": False,
        "fused_linear_cross_entropy": False,
    }
    apply(**{name: value for name, value in wanted.items() if name in accepted})
    logger.info("%s: Liger kernels applied to %s models in this process", key, model_type)


def compile_rms_norms(model: torch.nn.Module) -> int:
    """Run every RMSNorm layer of ``model`` (a class named ``*RMSNorm``, Liger's own excepted) through its class's
    forward compiled with torch.compile: one compiled function per class, shared by its layers (dynamic shapes; the
    layer is an argument, so its weight is an input, not a constant), compiled at the first call and eager with one
    warning where compiling fails. Per instance, so the model's other users in the process are untouched. Returns
    the number of layers."""
    from functools import partial

    from ..utils.torch_functional import LazilyCompiled

    compiled: dict[type, LazilyCompiled] = {}
    layers = 0
    for module in model.modules():
        cls = type(module)
        if not cls.__name__.endswith("RMSNorm") or cls.__name__.startswith("Liger"):
            continue
        if cls not in compiled:
            compiled[cls] = LazilyCompiled(cls.forward)
        module.forward = partial(compiled[cls], module)
        layers += 1
    return layers


# ----------------------------------------------------------------------------------------------------------------------
# device mesh and sharding
# ----------------------------------------------------------------------------------------------------------------------
def build_device_mesh(world_size: int, fsdp_size: int) -> DeviceMesh:
    """1-D mesh sharding over all ranks, or (replicate, shard) for hybrid sharding with ``fsdp_size`` > 0."""
    if fsdp_size <= 0 or fsdp_size >= world_size:
        return init_device_mesh(device.get_device_name(), (world_size,), mesh_dim_names=("fsdp",))
    if world_size % fsdp_size != 0:
        raise ValueError(f"`fsdp.fsdp_size` ({fsdp_size}) must divide the number of workers ({world_size}).")
    return init_device_mesh(
        device.get_device_name(), (world_size // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "fsdp")
    )


def apply_fsdp2(model: torch.nn.Module, mesh: DeviceMesh, fsdp_config: FSDPConfig) -> None:
    """``fully_shard`` every decoder layer, then the root (embeddings, final norm, head)."""
    kwargs = {
        "mesh": mesh,
        "reshard_after_forward": fsdp_config.enable_full_shard,
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=to_dtype(fsdp_config.mp_param_dtype),
            reduce_dtype=to_dtype(fsdp_config.mp_reduce_dtype),
            cast_forward_inputs=True,
        ),
        # FSDP's CPU offload keeps parameters in host memory between uses; meaningless (and slower) on CPU
        "offload_policy": CPUOffloadPolicy()
        if fsdp_config.enable_cpu_offload and device.is_cuda_available()
        else OffloadPolicy(),
    }
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} lists no decoder-layer classes in `_no_split_modules`; cannot shard it per layer."
        )
    for layer in layers:
        fully_shard(layer, **kwargs)
    tower = vision.vision_tower(model)
    if tower is not None:  # its own unit: the tower's remaining weights gather only while pictures are encoded
        fully_shard(tower, **kwargs)
    fully_shard(model, **kwargs)


def _broadcast_buffers(model: torch.nn.Module) -> None:
    """Buffers are not sharded and non-persistent ones (rotary inv_freq) are absent from state dicts."""
    on_accelerator = dist.get_backend() == "nccl"
    for buffer in model.buffers():
        # nccl only moves device tensors; buffers can sit on the CPU under FSDP's CPU offload
        staged = buffer.to(device.get_torch_device()) if on_accelerator else buffer
        dist.broadcast(staged, src=0)
        if staged is not buffer:
            buffer.copy_(staged)


NEW_WEIGHTS_SEED = 0  # the seed of the weights a loaded model's checkpoint does not hold (see build_fsdp_model)


def build_fsdp_model(
    model_config: ModelConfig,
    fsdp_config: FSDPConfig,
    mesh: DeviceMesh,
    *,
    kind: str,
    trainable: bool,
    default_dtype: torch.dtype,
) -> torch.nn.Module:
    """Load a checkpoint into an FSDP2-sharded model on this rank's device.

    With ``enable_rank0_init`` only rank 0 reads the weights; the other ranks build the model on the meta device
    and receive their shards by broadcast, so host memory holds one full copy per node instead of one per rank.
    """
    from ..demo.builtin_models import resolve_model_path

    hf_config = load_hf_config(model_config, kind)
    model_cls = resolve_model_class(hf_config, kind)
    if model_config.use_liger:
        apply_liger_kernels(hf_config, f"worker.{config_role(kind)}.model.use_liger")
    dtype = to_dtype(fsdp_config.torch_dtype, default_dtype)
    common = {
        "dtype": dtype,
        "attn_implementation": attention_implementation(
            concrete_model_class(model_cls, hf_config, model_config.trust_remote_code)
        ),
        "trust_remote_code": model_config.trust_remote_code,
    }
    rank = dist.get_rank() if dist.is_initialized() else 0
    broadcast = fsdp_config.enable_rank0_init and mesh.size() > 1
    path = resolve_model_path(model_config.model_path)
    with naming_the_remote_code_key(path, config_role(kind)):
        if broadcast and rank != 0:
            with torch.device("meta"):
                model = model_cls.from_config(hf_config, **common)
        else:
            # weights the checkpoint lacks (a critic's value head on a causal LM) are drawn from a fixed seed, not
            # the process's unseeded generator: two runs of one config, and a run and its resume, start equal
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(NEW_WEIGHTS_SEED)
                model = model_cls.from_pretrained(path, config=hf_config, **common)
    if kind == "value" and vision.is_vision_language_config(hf_config):
        vision.use_value_head(model)
    if model_config.use_liger and not LIGER_RMS_NORM:
        compile_rms_norms(model)
    model.config.use_cache = False
    model.requires_grad_(trainable)
    if trainable and model_config.freeze_vision_tower:
        vision.freeze_vision_tower(model, f"worker.{config_role(kind)}.model.freeze_vision_tower")
    if trainable and model_config.enable_gradient_checkpointing:
        # non-reentrant checkpointing also carries gradients to adapters whose layer inputs need none (LoRA)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if trainable and model_config.lora.rank > 0:  # before sharding: the adapters are sharded like the rest
        model = lora.apply_lora(
            model, model_config.lora, is_vision_language=vision.is_vision_language_config(hf_config)
        )
    full_state = model.state_dict() if broadcast and rank == 0 else {}
    buffer_dtype = to_dtype(fsdp_config.mp_buffer_dtype)
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point() and buffer.dtype != buffer_dtype:
                module._buffers[name] = buffer.to(buffer_dtype)

    # with LoRA the Hugging Face model inside the peft wrapper is the FSDP root: its generate (the hf rollout) reaches
    # the root's forward, which gathers the root's own weights (the wrapper's forward reaches it too)
    apply_fsdp2(model.get_base_model() if lora.has_lora(model) else model, mesh, fsdp_config)
    if broadcast:
        uses_cpu_offload = fsdp_config.enable_cpu_offload and device.is_cuda_available()
        if rank != 0:
            model.to_empty(device="cpu" if uses_cpu_offload else device.get_torch_device())
        set_model_state_dict(
            model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        )
        _broadcast_buffers(model)
        del full_state
    elif device.is_cuda_available() and not fsdp_config.enable_cpu_offload:
        model.to(device.get_torch_device())
    # a frozen tower's outputs are kept per picture (worker.actor.model.vision_cache_mb, models/vision_encoder.py)
    vision_encoder.install(model, cache_bytes=model_config.vision_cache_mb * 2**20)
    return model


# ----------------------------------------------------------------------------------------------------------------------
# moving between devices (GPU only: on CPU there is nowhere else to go)
# ----------------------------------------------------------------------------------------------------------------------
def offload_model(model: torch.nn.Module) -> None:
    if device.is_cuda_available():
        model.to("cpu")
        device.empty_cache()


def load_model(model: torch.nn.Module) -> None:
    if device.is_cuda_available():
        model.to(device.get_torch_device())


def _move_optimizer_states(optimizer: torch.optim.Optimizer, target: torch.device | str) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(target, non_blocking=True)


def offload_optimizer(optimizer: torch.optim.Optimizer) -> None:
    if device.is_cuda_available():
        _move_optimizer_states(optimizer, "cpu")
        device.empty_cache()


def load_optimizer(optimizer: torch.optim.Optimizer) -> None:
    if device.is_cuda_available():
        _move_optimizer_states(optimizer, device.get_torch_device())


# ----------------------------------------------------------------------------------------------------------------------
# full (unsharded) weights
# ----------------------------------------------------------------------------------------------------------------------
def _full_tensor(param: torch.Tensor) -> torch.Tensor:
    return param.full_tensor() if isinstance(param, DTensor) else param.detach()


@torch.no_grad()
def iter_full_params_per_layer(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Full parameters in buckets, one per FSDP-sharded decoder layer (and vision block / tower), then one for the
    rest (embeddings, norm, head). A collective: every rank must consume the whole iterator in step. Names are the
    Hugging Face names; a tied head appears once, under the embedding's name."""
    layer_prefixes = [name + "." for name, m in model.named_modules() if isinstance(m, FSDPModule) and m is not model]
    buckets: dict[str, list[tuple[str, torch.nn.Parameter]]] = {prefix: [] for prefix in layer_prefixes}
    rest: list[tuple[str, torch.nn.Parameter]] = []
    for name, param in model.named_parameters():
        # the innermost sharded module owns the parameter (a vision block, not the tower around it)
        prefix = max((p for p in layer_prefixes if name.startswith(p)), key=len, default=None)
        (buckets[prefix] if prefix is not None else rest).append((name, param))
    for bucket in [*buckets.values(), rest]:
        full = []
        for name, param in bucket:
            tensor = _full_tensor(param)
            full.append((name, tensor.to(dtype) if dtype is not None else tensor))
        yield full


def get_full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict on CPU, on rank 0 only (empty elsewhere). A collective."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def unwrapped_class(model: torch.nn.Module) -> type:
    """FSDP2 swaps the class for a dynamic ``FSDP<Name>`` subclass; return the Hugging Face class under it."""
    if lora.has_lora(model):  # a peft wrapper around the Hugging Face model
        model = model.get_base_model()
    cls = type(model)
    if isinstance(model, FSDPModule):
        cls = next(base for base in cls.__bases__ if base is not FSDPModule)
    return cls


def loaded_generation_config(model: torch.nn.Module):
    """The generation settings the model was loaded with: its folder's ``generation_config.json`` (end-of-sequence
    ids, sampling defaults), or None for a model that does not generate (the critic). A folder written from it
    must carry these, not the defaults a model built from its config gets: vLLM and transformers read their stop
    ids and default sampling from that file."""
    if lora.has_lora(model):
        model = model.get_base_model()
    return getattr(model, "generation_config", None)


def save_hf_pretrained(
    model: torch.nn.Module, path: str, tokenizer=None, processor=None, dtype: torch.dtype | None = None
) -> None:
    """Write a standard Hugging Face folder (config, safetensors, tokenizer, the generation config the model was
    loaded with) from the sharded model, its weights in ``dtype`` (None: the training dtype). A collective."""
    state = get_full_state_dict(model)
    if not dist.is_initialized() or dist.get_rank() == 0:
        with torch.device("meta"):
            plain = unwrapped_class(model)._from_config(model.config)
        plain.load_state_dict(state, assign=True)
        plain.tie_weights()
        plain.config.use_cache = True
        if (generation_config := loaded_generation_config(model)) is not None:
            plain.generation_config = copy.deepcopy(generation_config)
        save_pretrained_in_released_layout(plain, path, dtype=dtype)
        for extra in (tokenizer, processor):
            if extra is not None:
                extra.save_pretrained(path)
    if dist.is_initialized():
        dist.barrier()

"""Per-role training state on disk with torch Distributed Checkpoint (DCP).

A role folder holds the sharded model and optimizer (every rank writes its own shards; any world size can load
them back), ``extra_state.json`` (lr scheduler, written by rank 0; JSON, never a pickle: see
``easyrl.utils.state_file``), and ``huggingface/`` (config and tokenizer, so
that the folder can be merged into a Hugging Face model offline; the worker's tokenizer and processor hold the run's
data.override_chat_template, when it sets one, and the merge copies them). On several nodes the folder must be on a
filesystem every node sees.

DCP's own ``.metadata`` file is a pickle, which torch loads with plain ``pickle.load``: easyrl reads it with
``SafeFileSystemReader``, which rebuilds only the types checkpoint metadata is made of, so a checkpoint from someone
else cannot run code when loaded.
"""

import copy
import logging
import math
import os
import pickle
import shutil
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..models import lora
from ..models.checkpoint_layout import released_dtype, save_pretrained_in_released_layout, set_config_dtype
from ..paths import looks_local
from ..utils.state_file import load_state, save_state
from .fsdp_utils import loaded_generation_config, unwrapped_class


logger = logging.getLogger(__name__)


EXTRA_STATE_FILE = "extra_state.json"
# What easyrl wrote before its state files were pickle-free; never loaded (a pickle can run code).
LEGACY_EXTRA_STATE_FILE = "extra_state.pt"
HF_FOLDER = "huggingface"
# Where `easyrl merge` moves a LoRA checkpoint's adapter files before writing the merged model into its huggingface/
# folder (EasyR1 keeps a LoRA run's adapters there from the start).
ADAPTER_FOLDER = "lora_adapter"
GENERATION_CONFIG_FILE = "generation_config.json"


# What DCP metadata is made of, besides the classes of torch.distributed.checkpoint.metadata and torch dtypes.
_METADATA_TYPES = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # looks a layout up by name
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _METADATA_TYPES:
            return super().find_class(module, name)
        if module == _METADATA_MODULE:
            found = super().find_class(module, name)
            if isinstance(found, type) and found.__module__ == _METADATA_MODULE:
                return found
        raise pickle.UnpicklingError(
            f"a DCP .metadata file names `{module}.{name}`, which checkpoint metadata never holds: refused (a pickle "
            "naming a function can run code). Load only checkpoints written by easyrl."
        )


class SafeFileSystemReader(dcp.FileSystemReader):
    """``dcp.FileSystemReader`` whose ``.metadata`` unpickling rebuilds checkpoint metadata types only."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as metadata_file:
            metadata = _MetadataUnpickler(metadata_file).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _is_rank_zero() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def save_role_checkpoint(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    model_only: bool = False,
    tokenizer=None,
    processor=None,
    released_dtype: torch.dtype | None = None,
) -> None:
    """Save one role's state under ``path`` (a collective: every rank calls it).

    With LoRA only the adapters and their optimizer state are saved (the base weights are the model path's, never
    changed), and ``huggingface/`` is also a peft adapter folder of the current adapters. ``released_dtype``: the
    dtype of the model path's weights, which ``huggingface/config.json`` says and `easyrl merge` writes."""
    state = {"model": _model_state(model)}
    if optimizer is not None and not model_only:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    dcp.save(state, checkpoint_id=path)
    if _is_rank_zero() and lr_scheduler is not None and not model_only:
        save_state(os.path.join(path, EXTRA_STATE_FILE), {"lr_scheduler": lr_scheduler.state_dict()})
    save_config_folder(os.path.join(path, HF_FOLDER), model, tokenizer, processor, dtype=released_dtype)


def save_config_folder(
    path: str, model: torch.nn.Module, tokenizer=None, processor=None, dtype: torch.dtype | None = None
) -> None:
    """The model's config (its class in ``architectures``; ``dtype`` as its dtype, when given), the generation
    config it was loaded with and tokenizer/processor in folder ``path``; with LoRA also the adapters as a peft
    adapter folder. A collective (the adapters are gathered); rank 0 writes."""
    adapters = lora.lora_state_dict(model) if lora.has_lora(model) else None
    if _is_rank_zero():
        config = copy.deepcopy(model.config)
        config.architectures = [unwrapped_class(model).__name__]  # e.g. the critic's TokenClassification head
        set_config_dtype(config, dtype)
        config.save_pretrained(path)
        if (generation_config := loaded_generation_config(model)) is not None:
            generation_config.save_pretrained(path)
        for extra in (tokenizer, processor):
            if extra is not None:
                extra.save_pretrained(path)
        if adapters is not None:
            lora.write_adapter_folder(path, adapters, lora.lora_peft_config(model))
    if dist.is_initialized():
        dist.barrier()


def _model_state(model: torch.nn.Module) -> dict[str, Any]:
    """The model's training state: every weight, or with LoRA the adapters alone (the frozen base stays out)."""
    state = get_model_state_dict(model)
    if lora.has_lora(model):
        state = {key: value for key, value in state.items() if lora.is_adapter_key(key)}
    return state


def _check_same_kind(path: str, model: torch.nn.Module) -> None:
    """A LoRA run resumes from LoRA checkpoints only, a full-weight run from full ones: say so before DCP would fail
    on the first missing tensor."""
    keys = SafeFileSystemReader(path).read_metadata().state_dict_metadata
    saved_adapters = any(key.startswith("model.") and lora.is_adapter_key(key) for key in keys)
    if saved_adapters != lora.has_lora(model):
        saved, wanted = ("LoRA adapters", "full weights") if saved_adapters else ("full weights", "LoRA adapters")
        raise ValueError(
            f"The checkpoint `{path}` holds {saved} but this run trains {wanted}: set "
            "worker.actor.model.lora.rank as in the run that wrote it, or start afresh in a new "
            "trainer.save_checkpoint_path (where trainer.load_checkpoint_path names this checkpoint, point it "
            "elsewhere)."
        )


# the optimizer settings of a param group that come from the config; a checkpoint's values give way to them
CONFIGURED_GROUP_KEYS = ("weight_decay", "betas", "eps")
# how this process runs the step (PyTorch's fused or multi-tensor kernels, `optim._adamw`): where the parameters live
# decides, not the run that saved the checkpoint (a GPU run's fused=True resumed on a CPU, or the reverse)
KERNEL_GROUP_KEYS = ("fused", "foreach")


def _configured_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each param group's peak lr and CONFIGURED_GROUP_KEYS as the optimizer was built from the config."""
    return [
        {
            "lr": group.get("initial_lr", group["lr"]),
            **{key: group[key] for key in CONFIGURED_GROUP_KEYS + KERNEL_GROUP_KEYS if key in group},
        }
        for group in optimizer.param_groups
    ]


SCHEDULED_LR = "lr of the next step"  # a configured-settings change: the schedule itself changed (not its peak)


def _restore_configured_settings(
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    configured: list[dict[str, Any]],
) -> list[tuple[str, Any, Any]]:
    """Put back the config's settings over the checkpoint's; ``(name, checkpoint's, config's)`` for each that differed.

    A resumed optimizer and scheduler carry the peak lr, weight decay and betas of the run that saved them, so a run
    resumed with a new worker.*.optim.lr would train on at the old one without a word (as EasyR1 and verl do). The
    config says what the run trains with: the new peak lr applies from the resumed step on, at the schedule's place
    (lr = peak x the scheduler's multiplier at its step)."""
    changes: dict[str, tuple[str, Any, Any]] = {}
    for index, (group, wanted) in enumerate(zip(optimizer.param_groups, configured)):
        saved_peak = lr_scheduler.base_lrs[index] if lr_scheduler is not None else group.get("initial_lr", group["lr"])
        if saved_peak != wanted["lr"]:
            changes.setdefault("lr", ("lr", saved_peak, wanted["lr"]))
            group["initial_lr"] = wanted["lr"]
            if lr_scheduler is not None:
                lr_scheduler.base_lrs[index] = wanted["lr"]
                group["lr"] = wanted["lr"] * lr_scheduler.lr_lambdas[index](lr_scheduler.last_epoch)
            else:
                group["lr"] = wanted["lr"]
        for key in CONFIGURED_GROUP_KEYS:
            if key in wanted and _as_tuple(group.get(key)) != _as_tuple(wanted[key]):
                changes.setdefault(key, (key, _as_tuple(group.get(key)), _as_tuple(wanted[key])))
                group[key] = wanted[key]
        group.update({key: wanted[key] for key in KERNEL_GROUP_KEYS if key in wanted})  # not a change to report
    if lr_scheduler is not None:
        # the next step's lr is the config's schedule at the saved place: a resume that changed the schedule's length
        # (trainer.max_steps, total_epochs), warmup or kind trained its first step at the old schedule's lr (0 at the
        # end of a cosine) and went on with the new one
        for index, group in enumerate(optimizer.param_groups):
            scheduled = lr_scheduler.base_lrs[index] * lr_scheduler.lr_lambdas[index](lr_scheduler.last_epoch)
            if not math.isclose(group["lr"], scheduled, rel_tol=1e-9, abs_tol=1e-15):
                changes.setdefault(SCHEDULED_LR, (SCHEDULED_LR, group["lr"], scheduled))
                group["lr"] = scheduled
        lr_scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]  # what get_last_lr() reports
    return list(changes.values())


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


def load_role_checkpoint(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    model_only: bool = False,
) -> list[tuple[str, Any, Any]]:
    """Load one role's state saved by ``save_role_checkpoint`` (a collective). Returns the optimizer settings whose
    checkpoint value this run's config replaced, ``(name, checkpoint's, config's)`` (see
    ``_restore_configured_settings``)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"No checkpoint of this role at `{path}` (check trainer.load_checkpoint_path).")
    _check_same_kind(path, model)
    state = {"model": _model_state(model)}
    with_optimizer = optimizer is not None and not model_only
    if with_optimizer:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    dcp.load(state, storage_reader=SafeFileSystemReader(path))
    # with LoRA the base weights are absent from the checkpoint: they stay as loaded from the model path
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=not lora.has_lora(model)))
    if not with_optimizer:
        return []
    configured = _configured_settings(optimizer)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    extra_file = os.path.join(path, EXTRA_STATE_FILE)
    if lr_scheduler is not None and os.path.isfile(extra_file):
        lr_scheduler.load_state_dict(load_state(extra_file)["lr_scheduler"])
    elif lr_scheduler is not None and os.path.isfile(os.path.join(path, LEGACY_EXTRA_STATE_FILE)):
        raise FileNotFoundError(
            f"`{path}` holds its lr scheduler state as a pickle ({LEGACY_EXTRA_STATE_FILE}, written by an older "
            "easyrl), which this version does not load (a pickle can run code). Start the run afresh, or continue "
            "it with the easyrl version that wrote it."
        )
    return _restore_configured_settings(optimizer, lr_scheduler, configured)


def _checkpoint_model_weights(role_path: str, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The ``model`` entries of a DCP role folder, loaded onto the CPU in this process (no process group); the
    floating ones in ``dtype`` when given (DCP rounds into it while reading: no full-precision copy is held)."""
    metadata = SafeFileSystemReader(role_path).read_metadata()
    weights = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and hasattr(meta, "size"):
            saved = meta.properties.dtype
            wanted = dtype if dtype is not None and saved.is_floating_point else saved
            weights[key[len("model.") :]] = torch.empty(meta.size, dtype=wanted)
    dcp.load({"model": weights}, storage_reader=SafeFileSystemReader(role_path), no_dist=True)
    return weights


def is_role_folder(path: str) -> bool:
    """``path`` is a role folder of a checkpoint (``global_step_N/actor``): it has ``huggingface/config.json``."""
    return os.path.isfile(os.path.join(path, HF_FOLDER, "config.json"))


def adapter_config_file(role_path: str) -> str | None:
    """A LoRA checkpoint's adapter config: in ``huggingface/`` as saved, in ``lora_adapter/`` once merged in place."""
    for folder in (HF_FOLDER, ADAPTER_FOLDER):
        path = os.path.join(role_path, folder, lora.ADAPTER_CONFIG_FILE)
        if os.path.isfile(path):
            return path
    return None


def is_lora_checkpoint(role_path: str) -> bool:
    """The role folder was written by a LoRA run (its adapter config is in ``huggingface/`` or ``lora_adapter/``)."""
    return adapter_config_file(role_path) is not None


def _is_weight_file(name: str) -> bool:
    """A model's weights (safetensors, pickled torch, their shard indexes), not a tokenizer or config file."""
    return name.endswith((".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json"))


def _copy_extras(hf_path: str, output_path: str, skip: set[str]) -> None:
    """Tokenizer, processor and generation files kept next to the checkpoint's config."""
    for name in os.listdir(hf_path):
        if name not in skip and not os.path.exists(os.path.join(output_path, name)):
            shutil.copy(os.path.join(hf_path, name), output_path)


def merge_checkpoint_to_hf(
    role_path: str,
    output_path: str,
    adapter_only: bool = False,
    base_model: str | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Turn one role folder of a DCP checkpoint into a Hugging Face folder, in one process, offline.

    Reads the tensor shapes from the checkpoint metadata, loads the ``model`` entries onto the CPU, and saves them
    with the config and tokenizer kept in ``huggingface/``, in ``dtype`` or else the dtype that config says (the
    model path's). A LoRA checkpoint gives the base model (``base_model``, else the one the adapter config names)
    with the adapters merged into its weights, as EasyR1's merger does; with ``adapter_only`` the peft adapter
    folder (``adapter_config.json`` + ``adapter_model.safetensors``).
    """
    import transformers

    hf_path = os.path.join(role_path, HF_FOLDER)
    if not is_role_folder(role_path):
        raise FileNotFoundError(f"`{role_path}` is not a role checkpoint folder (no {HF_FOLDER}/config.json).")
    if is_lora_checkpoint(role_path):
        _merge_lora_checkpoint(role_path, output_path, adapter_only, base_model, dtype)
        return
    if adapter_only:
        raise ValueError(f"`{role_path}` holds full weights, not LoRA adapters: drop --adapter_only.")

    config = transformers.AutoConfig.from_pretrained(hf_path)
    _refuse_vision_language_critic(role_path, config)
    dtype = dtype or released_dtype(config)
    weights = _checkpoint_model_weights(role_path, dtype)  # a bf16 model is read as bf16: half the memory of fp32
    model_cls = getattr(transformers, (config.architectures or ["AutoModelForCausalLM"])[0])
    with torch.device("meta"):
        model = model_cls._from_config(config)
    model.load_state_dict(weights, assign=True)
    model.tie_weights()
    if os.path.isfile(os.path.join(hf_path, GENERATION_CONFIG_FILE)):
        model.generation_config = transformers.GenerationConfig.from_pretrained(hf_path)
    elif model.can_generate():
        logger.warning(
            "%s holds no %s (an older easyrl wrote this checkpoint): the merged folder's generation "
            "config is derived from config.json, without the stop ids and sampling defaults of the model you "
            "trained from; copy that model's %s into %s.",
            hf_path,
            GENERATION_CONFIG_FILE,
            GENERATION_CONFIG_FILE,
            output_path,
        )
    save_pretrained_in_released_layout(model, output_path, dtype=dtype)
    _copy_extras(hf_path, output_path, skip={"config.json", GENERATION_CONFIG_FILE})


def _refuse_vision_language_critic(role_path: str, config) -> None:
    """A vision-language critic (an image-text-to-text model with a one-output head, models/vision.use_value_head)
    has no transformers class to be saved as: say so rather than fail on the head's shape."""
    from ..models.vision import has_value_head

    head = SafeFileSystemReader(role_path).read_metadata().state_dict_metadata.get("model.lm_head.weight")
    if head is not None and hasattr(head, "size") and has_value_head(config, head.size[0]):
        raise ValueError(
            f"`{role_path}` is the critic of a vision-language model: transformers has no class for a VLM with a "
            "value head, so it has no Hugging Face folder. The trained model is the checkpoint's actor folder; the "
            "critic resumes from the checkpoint itself (trainer.load_checkpoint_path)."
        )


def _merge_lora_checkpoint(
    role_path: str, output_path: str, adapter_only: bool, base_model: str | None, dtype: torch.dtype | None
) -> None:
    import json

    hf_path = os.path.join(role_path, HF_FOLDER)
    config_file = adapter_config_file(role_path)
    with open(config_file, encoding="utf-8") as file:
        peft_config = json.load(file)
    adapters = {lora.peft_name(name): tensor for name, tensor in _checkpoint_model_weights(role_path).items()}
    adapter_files = (lora.ADAPTER_CONFIG_FILE, lora.ADAPTER_WEIGHTS_FILE)
    in_place = os.path.realpath(output_path) == os.path.realpath(hf_path)
    if adapter_only and in_place and os.path.dirname(config_file) != hf_path:  # moved out by an earlier merge
        raise ValueError(
            f"{hf_path} holds the merged model, and the adapter folder is {os.path.dirname(config_file)}: use that "
            "one, or give --output_dir for a new copy."
        )
    if adapter_only:
        lora.write_adapter_folder(output_path, adapters, peft_config)
        # after an in-place merge huggingface/ holds the merged model's weights too: an adapter folder has none
        weights = {name for name in os.listdir(hf_path) if _is_weight_file(name)}
        _copy_extras(hf_path, output_path, skip={"config.json", *adapter_files, *weights})
        return
    base_path = _base_model_path(base_model or peft_config.get("base_model_name_or_path"), config_file)
    if in_place:
        _move_adapter_files(role_path, adapter_files)
    with tempfile.TemporaryDirectory() as adapter_dir:
        lora.write_adapter_folder(adapter_dir, adapters, peft_config)
        try:
            merge_adapter_folder(adapter_dir, base_path, output_path, config_path=hf_path, dtype=dtype)
        except FileNotFoundError as err:
            raise FileNotFoundError(
                f"{err}: it is the base model the adapters were trained on; pass --base_model PATH (its folder), or "
                "--adapter_only to write the adapter folder."
            ) from err


def _move_adapter_files(role_path: str, names: tuple[str, ...]) -> None:
    """Move the adapter files out of ``huggingface/`` into ``lora_adapter/`` before the merged model is written
    there: a folder holding both would load in transformers as the base plus the adapters, not as the model."""
    hf_path, kept = os.path.join(role_path, HF_FOLDER), os.path.join(role_path, ADAPTER_FOLDER)
    moving = [name for name in names if os.path.isfile(os.path.join(hf_path, name))]
    if not moving:  # moved by an earlier merge
        return
    os.makedirs(kept, exist_ok=True)
    for name in moving:
        os.replace(os.path.join(hf_path, name), os.path.join(kept, name))
    logger.warning("The LoRA adapters of %s are moved to %s; the merged model goes to %s.", role_path, kept, hf_path)


def _base_model_path(base_path: str | None, config_file: str) -> str:
    """The base model to merge into: a local folder, or a hub id that transformers resolves (its cache first)."""
    if not base_path:
        raise FileNotFoundError(
            f"{config_file} names no base model (base_model_name_or_path): pass --base_model PATH, or --adapter_only "
            "to write the adapter folder."
        )
    if os.path.isdir(os.path.expanduser(base_path)):
        return os.path.expanduser(base_path)
    if looks_local(base_path):
        raise FileNotFoundError(
            f"The base model the adapters were trained on, `{base_path}` (base_model_name_or_path in {config_file}), "
            "is not a folder here: pass --base_model PATH, or --adapter_only to write the adapter folder."
        )
    return base_path


def merge_adapter_folder(
    adapter_path: str,
    base_path: str,
    output_path: str,
    config_path: str | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Write the base model at ``base_path`` with the peft adapters of ``adapter_path`` merged into its weights as a
    Hugging Face folder at ``output_path``, with the tokenizer and processor files kept in ``config_path`` (default:
    the adapter folder). In one process, on the CPU: the sum W + (alpha / r) B A is taken in fp32 and stored in
    ``dtype``, by default the base's own.

    The base is held in its own dtype (half the memory of fp32 for a bf16 base), which rounds the sum once all the
    same: peft keeps the adapters in fp32 and the in-place add into a bf16 weight computes in fp32. Only an output
    dtype other than the base's takes an fp32 copy of the base."""
    import transformers
    from peft import PeftModel

    config_path = config_path or adapter_path
    config = transformers.AutoConfig.from_pretrained(config_path)
    model_cls = getattr(transformers, (config.architectures or ["AutoModelForCausalLM"])[0])
    try:
        base_dtype = released_dtype(transformers.AutoConfig.from_pretrained(base_path)) or torch.float32
        dtype = dtype or base_dtype
        base = model_cls.from_pretrained(base_path, dtype=base_dtype if dtype == base_dtype else torch.float32)
    except OSError as err:  # a hub id neither in the local cache nor reachable, a folder without the model
        raise FileNotFoundError(f"The base model `{base_path}` could not be loaded ({err})") from err
    merged = PeftModel.from_pretrained(base, adapter_path).merge_and_unload()
    save_pretrained_in_released_layout(merged, output_path, dtype=dtype)
    _copy_extras(config_path, output_path, skip={"config.json", lora.ADAPTER_CONFIG_FILE, lora.ADAPTER_WEIGHTS_FILE})

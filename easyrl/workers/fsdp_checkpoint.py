"""Per-role training state on disk with torch Distributed Checkpoint (DCP).

A role folder holds the sharded model and optimizer (every rank writes its own shards; any world size can load
them back), ``extra_state.json`` (lr scheduler, written by rank 0; JSON, never a pickle: see
``easyrl.utils.state_file``), and ``huggingface/`` (config and tokenizer, so
that the folder can be merged into a Hugging Face model offline). On several nodes the folder must be on a
filesystem every node sees.

DCP's own ``.metadata`` file is a pickle, which torch loads with plain ``pickle.load``: easyrl reads it with
``SafeFileSystemReader``, which rebuilds only the types checkpoint metadata is made of, so a checkpoint from someone
else cannot run code when loaded.
"""

import copy
import os
import pickle
import shutil
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..models.checkpoint_layout import save_pretrained_in_released_layout
from ..utils.state_file import load_state, save_state
from .fsdp_utils import unwrapped_class


EXTRA_STATE_FILE = "extra_state.json"
# What easyrl wrote before its state files were pickle-free; never loaded (a pickle can run code).
LEGACY_EXTRA_STATE_FILE = "extra_state.pt"
HF_FOLDER = "huggingface"


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
) -> None:
    """Save one role's state under ``path`` (a collective: every rank calls it)."""
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None and not model_only:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    dcp.save(state, checkpoint_id=path)
    if _is_rank_zero():
        if lr_scheduler is not None and not model_only:
            save_state(os.path.join(path, EXTRA_STATE_FILE), {"lr_scheduler": lr_scheduler.state_dict()})
        hf_path = os.path.join(path, HF_FOLDER)
        config = copy.deepcopy(model.config)
        config.architectures = [unwrapped_class(model).__name__]  # e.g. the critic's TokenClassification head
        config.save_pretrained(hf_path)
        for extra in (tokenizer, processor):
            if extra is not None:
                extra.save_pretrained(hf_path)
    if dist.is_initialized():
        dist.barrier()


def load_role_checkpoint(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    model_only: bool = False,
) -> None:
    """Load one role's state saved by ``save_role_checkpoint`` (a collective)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"No checkpoint of this role at `{path}` (check trainer.load_checkpoint_path).")
    state = {"model": get_model_state_dict(model)}
    with_optimizer = optimizer is not None and not model_only
    if with_optimizer:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    dcp.load(state, storage_reader=SafeFileSystemReader(path))
    set_model_state_dict(model, state["model"])
    if with_optimizer:
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


def merge_checkpoint_to_hf(role_path: str, output_path: str) -> None:
    """Turn one role folder of a DCP checkpoint into a Hugging Face model folder, in one process, offline.

    Reads the tensor shapes from the checkpoint metadata, loads the ``model`` entries onto the CPU, and saves them
    with the config and tokenizer kept in ``huggingface/``.
    """
    import transformers

    hf_path = os.path.join(role_path, HF_FOLDER)
    if not os.path.isfile(os.path.join(hf_path, "config.json")):
        raise FileNotFoundError(f"`{role_path}` is not a role checkpoint folder (no {HF_FOLDER}/config.json).")
    metadata = SafeFileSystemReader(role_path).read_metadata()
    weights = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and hasattr(meta, "size"):
            weights[key[len("model.") :]] = torch.empty(meta.size, dtype=meta.properties.dtype)
    dcp.load({"model": weights}, storage_reader=SafeFileSystemReader(role_path), no_dist=True)

    config = transformers.AutoConfig.from_pretrained(hf_path)
    model_cls = getattr(transformers, (config.architectures or ["AutoModelForCausalLM"])[0])
    with torch.device("meta"):
        model = model_cls._from_config(config)
    model.load_state_dict(weights, assign=True)
    model.tie_weights()
    save_pretrained_in_released_layout(model, output_path)
    for name in os.listdir(hf_path):
        if name != "config.json" and not os.path.exists(os.path.join(output_path, name)):
            shutil.copy(os.path.join(hf_path, name), output_path)

"""Per-role training state on disk with torch Distributed Checkpoint (DCP).

A role folder holds the sharded model and optimizer (every rank writes its own shards; any world size can load
them back), ``extra_state.pt`` (lr scheduler, written by rank 0), and ``huggingface/`` (config and tokenizer, so
that the folder can be merged into a Hugging Face model offline). On several nodes the folder must be on a
filesystem every node sees.
"""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


EXTRA_STATE_FILE = "extra_state.pt"
HF_FOLDER = "huggingface"


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
            torch.save({"lr_scheduler": lr_scheduler.state_dict()}, os.path.join(path, EXTRA_STATE_FILE))
        hf_path = os.path.join(path, HF_FOLDER)
        model.config.save_pretrained(hf_path)
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
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    if with_optimizer:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
        extra_file = os.path.join(path, EXTRA_STATE_FILE)
        if lr_scheduler is not None and os.path.isfile(extra_file):
            lr_scheduler.load_state_dict(torch.load(extra_file, weights_only=False)["lr_scheduler"])

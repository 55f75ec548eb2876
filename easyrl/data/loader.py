"""Train and validation loaders. The train loader's position (epoch, sampler state, samples already served) is part
of every checkpoint: ``state_dict()`` / ``load_state_dict()`` resume exactly mid-epoch (torchdata StatefulDataLoader)."""

import dataclasses
from typing import Any

import datasets
import torch
from torch.utils.data import SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from ..config import DataConfig
from .collate import collate_fn
from .dataset import ENV_EMPTY_PROMPT, ENV_PROMPTS, RLHFDataset


def create_dataloaders(
    config: DataConfig, tokenizer: Any, processor: Any = None, **options: Any
) -> tuple[StatefulDataLoader, StatefulDataLoader | None]:
    """(train_loader, val_loader); val_loader is None when ``data.val_files`` is empty. Batches are DataProtos.
    ``options``: the datasets' keyword arguments (see ``RLHFDataset``): ``model_config``, ``tools`` (JSON schemas the
    chat template advertises, for multi-turn rollouts with tools), ``carry_columns`` (every item carries the row's
    other columns, which a reward function written for TRL gets)."""
    batch_size = config.mini_rollout_batch_size or config.rollout_batch_size
    if config.train_files:
        train = RLHFDataset(config.train_files, tokenizer, processor, config, config_key="data.train_files", **options)
    else:  # validation allows no training data only where the environment owns it
        train = env_prompt_dataset(config, tokenizer, processor, batch_size, **options)
    if len(train) < batch_size:
        raise ValueError(
            f"data.train_files has {len(train)} usable prompts, fewer than one batch "
            f"(data.rollout_batch_size / mini_rollout_batch_size = {batch_size}); lower the batch size or add data."
        )
    if config.shuffle:
        generator = torch.Generator()
        generator.manual_seed(config.seed)
        # torchdata's RandomSampler draws torch's permutations and also saves the generator's state at the start of
        # the epoch (torch's only counts samples: a resume after the first epoch drew another permutation)
        sampler = RandomSampler(train, generator=generator)
    else:
        sampler = SequentialSampler(train)
    train_loader = StatefulDataLoader(
        train,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=config.dataloader_num_workers,
        collate_fn=collate_fn,
        drop_last=True,  # every step sees a full batch
    )
    if not config.val_files:
        return train_loader, None
    return train_loader, create_val_loader(config, tokenizer, processor, **options)


def env_prompt_dataset(config: DataConfig, tokenizer: Any, processor: Any, size: int, **options: Any) -> RLHFDataset:
    """The training prompts of a tool environment that owns the data (empty ``data.train_files``, as TRL's GRPOTrainer
    without a train_dataset): ``size`` rows of one empty user message, to which each trajectory's reset adds its task.
    The rows are easyrl's, so the data.* keys that name columns, and data.format_prompt, do not apply to them."""
    # named as data.* names its columns where they are plain names: the reward scorer reads a row's chat prompt there
    prompt_key = config.prompt_key if "." not in config.prompt_key else "prompt"
    answer_key = config.answer_key if "." not in config.answer_key and config.answer_key != prompt_key else "answer"
    rows = datasets.Dataset.from_list([{prompt_key: ENV_EMPTY_PROMPT, answer_key: ""}] * size)
    own = dataclasses.replace(config, prompt_key=prompt_key, answer_key=answer_key, format_prompt=None)
    return RLHFDataset(ENV_PROMPTS, tokenizer, processor, own, config_key="data.train_files", rows=rows, **options)


def create_val_loader(config: DataConfig, tokenizer: Any, processor: Any = None, **options: Any) -> StatefulDataLoader:
    """The loader of ``data.val_files``: every prompt once, in file order (also what `easyrl generate` reads);
    ``options`` as for ``create_dataloaders``."""
    val = RLHFDataset(config.val_files, tokenizer, processor, config, config_key="data.val_files", **options)
    return StatefulDataLoader(
        val,
        batch_size=len(val) if config.val_batch_size == -1 else config.val_batch_size,
        shuffle=False,
        num_workers=config.dataloader_num_workers,
        collate_fn=collate_fn,
        drop_last=False,  # validation covers every prompt
    )

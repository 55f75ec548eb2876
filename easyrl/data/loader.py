"""Train and validation loaders. The train loader's position (epoch, sampler state, samples already served) is part
of every checkpoint: ``state_dict()`` / ``load_state_dict()`` resume exactly mid-epoch (torchdata StatefulDataLoader)."""

import copy
import dataclasses
import logging
from typing import Any, Optional

import datasets
import torch
from torch.utils.data import SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from ..config import DataConfig
from .collate import collate_fn
from .dataset import ENV_EMPTY_PROMPT, ENV_PROMPTS, RLHFDataset


logger = logging.getLogger(__name__)


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
    train_loader = stateful_train_loader(train, batch_size, config, collate_fn)
    if not config.val_files:
        return train_loader, None
    return train_loader, create_val_loader(config, tokenizer, processor, **options)


def stateful_train_loader(dataset: Any, batch_size: int, config: DataConfig, collate: Any) -> StatefulDataLoader:
    """Whole batches of ``dataset`` (an RL or SFT run's training rows), shuffled with data.seed when data.shuffle; its
    position is part of every checkpoint (``restore_position``)."""
    if config.shuffle:
        generator = torch.Generator()
        generator.manual_seed(config.seed)
        # torchdata's RandomSampler draws torch's permutations and also saves the generator's state at the start of
        # the epoch (torch's only counts samples: a resume after the first epoch drew another permutation)
        sampler = RandomSampler(dataset, generator=generator)
    else:
        sampler = SequentialSampler(dataset)
    return StatefulDataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=config.dataloader_num_workers,
        collate_fn=collate,
        drop_last=True,  # every step sees a full batch
    )


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


def _main_state(state: dict) -> dict:
    """The part of a saved loader state that holds the position: the state itself, or with worker processes the main
    process's snapshot."""
    snapshot = state.get("_snapshot")
    return snapshot.get("_main_snapshot") or {} if isinstance(snapshot, dict) else state


def batches_drawn(state: dict) -> int:
    """The batches a saved train loader had drawn in its epoch."""
    main = _main_state(state)
    workers = isinstance(state.get("_snapshot"), dict)  # a loader with worker processes counts in its snapshot
    return int(main.get("_sampler_iter_yielded" if workers else "_num_yielded") or 0)


def restore_position(loader: StatefulDataLoader, state: dict, saved_rows: Optional[int], path: str) -> dict:
    """Load a checkpoint's train-loader position (``state``) into ``loader``, whose dataset may hold other rows than
    the ``saved_rows`` it was saved with (the data file changed under the same name; None: not recorded). Other rows
    are said; a position past the end of fewer rows ends the epoch under way there (torchdata would stop the resume
    with a bare StopIteration while skipping to it). Returns the state loaded."""
    rows, batch = len(loader.dataset), loader.batch_size
    if saved_rows is not None and saved_rows != rows:
        logger.warning(
            "data.train_files has %d usable rows and had %d when %s was saved: the data changed. The epoch under way "
            "goes on at the checkpoint's position in an order of the new rows, so some of its rows are drawn twice "
            "and others not at all; the epochs after it are whole.",
            rows,
            saved_rows,
            path,
        )
    main = _main_state(state)
    sampler = main.get("_sampler_iter_state") or {}
    drawn = int(sampler.get("samples_yielded") or 0)
    if drawn > rows:
        logger.warning(
            "%s was saved %d rows into its epoch, past the end of the %d usable rows data.train_files has now: that "
            "epoch ends here and the next one starts.",
            path,
            drawn,
            rows,
        )
        state = copy.deepcopy(state)  # the caller's is left as it was
        full = rows // batch
        main = _main_state(state)
        sampler = dict(sampler, samples_yielded=full * batch)
        if isinstance(sampler.get("sampler_iter_state"), dict):  # a shuffling sampler's own count
            sampler["sampler_iter_state"] = dict(sampler["sampler_iter_state"], yielded=full * batch)
        main["_sampler_iter_state"], main["_sampler_iter_yielded"] = sampler, full
        if "_num_yielded" in main:
            main["_num_yielded"] = full
        if isinstance(state.get("_snapshot"), dict):
            state["_snapshot"]["_snapshot_step"] = full
    loader.load_state_dict(state)
    return state


def say_rows_left_over(rows: int, batch: int, key: str, shuffle: bool) -> None:
    """The train loader draws whole batches of ``batch`` rows (``key``, the setting): the rows that do not fill the
    last one are not drawn in that epoch. Shuffled, they are other rows each epoch; in file order always the last
    ones, which are then never trained."""
    left = rows % batch
    if not left or rows < batch:
        return
    if shuffle:
        logger.info(
            "data.train_files: %d usable rows make %d batches of %s=%d per epoch; %d %s, other ones each epoch "
            "(data.shuffle=true), %s not drawn in it.",
            rows,
            rows // batch,
            key,
            batch,
            left,
            "row" if left == 1 else "rows",
            "is" if left == 1 else "are",
        )
        return
    logger.warning(
        "data.train_files: %d usable rows make %d batches of %s=%d per epoch, and with data.shuffle=false the last "
        "%d rows are never drawn. Make %s divide the rows, or set data.shuffle=true.",
        rows,
        rows // batch,
        key,
        batch,
        left,
        key,
    )

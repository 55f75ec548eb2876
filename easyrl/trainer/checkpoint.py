"""Checkpoint folders that are atomic, rotated and easy to find again.

Layout under ``trainer.save_checkpoint_path``::

    global_step_<N>/
        actor/ critic/ ...        model + optimizer state (torch.distributed.checkpoint), written by the workers
        dataloader_state.json     the driver's dataloader position
        trainer_state.json        {"global_step": N, "epoch", "kl_coef", "metrics": the step's metrics row,
                                   "input_files": digests of the reward/template/tools files}
        COMPLETE                  written last, just before the folder gets its final name
    latest_checkpointed_iteration.txt   N of the newest complete checkpoint (for other tools; easyrl reads COMPLETE)
    .tmp_global_step_<N>/         a save in progress, or one a crash interrupted: never loaded

A save goes into ``.tmp_global_step_<N>`` and is renamed to ``global_step_<N>`` only once every part is
there, so a crash at any moment leaves either the previous checkpoints or the new complete one. Workers on
every node write their shards into the same folder: ``save_checkpoint_path`` must be on a filesystem all
nodes see at the same path (NFS, Lustre, a mounted bucket...). One run saves into a folder at a time.

Nothing the driver writes or reads here is a pickle (``easyrl.utils.state_file``): loading a checkpoint someone else
made runs no code. Checkpoints of easyrl versions that wrote ``driver_state.pt`` are refused with that explanation.
"""

import dataclasses
import errno
import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from easyrl.paths import looks_local
from easyrl.utils import device
from easyrl.utils.files import replace_file
from easyrl.utils.state_file import load_state, save_state

from .run_config import CONFIG_FILE, checkpoint_config


logger = logging.getLogger(__name__)


STEP_DIR_PREFIX = "global_step_"
TMP_DIR_PREFIX = ".tmp_" + STEP_DIR_PREFIX
# A checkpoint being replaced (same step saved again) or deleted, while the removal is underway.
OLD_DIR_PREFIX = ".old_"
COMPLETE_MARKER = "COMPLETE"
TRAINER_STATE_FILE = "trainer_state.json"
DATALOADER_FILE = "dataloader_state.json"
# What easyrl wrote before its state files were pickle-free; never loaded (a pickle can run code).
LEGACY_DRIVER_FILE = "driver_state.pt"
LATEST_POINTER_FILE = "latest_checkpointed_iteration.txt"
# in trainer_state.json: the trainer.load_checkpoint_path the saving run started from (absolute), when it had one
STARTED_FROM_KEY = "started_from"
_STEP_DIR_PATTERN = re.compile(rf"^{STEP_DIR_PREFIX}(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or resumed; the message says which folder and what to do."""


class CheckpointSaveError(CheckpointError):
    """A save failed on a write (a full disk, a folder gone): its partial folder is removed, and the run stops with
    this one line; the trainer adds where a rerun resumes from."""


# ----------------------------------------------------------------------------------------------------------------------
# finding checkpoints
# ----------------------------------------------------------------------------------------------------------------------
def checkpoint_dir(root: str, step: int) -> str:
    return os.path.join(root, f"{STEP_DIR_PREFIX}{step}")


def is_complete_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, COMPLETE_MARKER))


def list_checkpoints(root: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every complete checkpoint under root, oldest first."""
    if not root or not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        match = _STEP_DIR_PATTERN.match(name)
        path = os.path.join(root, name)
        if match and is_complete_checkpoint(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def saved_at(path: str) -> float:
    """When a complete checkpoint was saved: the time its COMPLETE marker records (copies keep it), 0 if unreadable."""
    try:
        with open(os.path.join(path, COMPLETE_MARKER), encoding="utf-8") as handle:
            return float(handle.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0


def checkpoints_by_save_time(root: str | None) -> list[tuple[int, str]]:
    """``list_checkpoints``, oldest save first. A run resumed from an earlier step (trainer.load_checkpoint_path)
    saves steps below the folder's highest, and its saves are the newest: resume and save_limit follow save order,
    as verl's latest_checkpointed_iteration.txt does, not step order."""
    return sorted(list_checkpoints(root) if root else [], key=lambda item: (saved_at(item[1]), item[0]))


def find_last_checkpoint(root: str | None) -> str | None:
    """The complete checkpoint saved last under root; interrupted and temporary saves are skipped."""
    checkpoints = checkpoints_by_save_time(root)
    return checkpoints[-1][1] if checkpoints else None


def read_latest_pointer(root: str) -> int | None:
    """The step in ``latest_checkpointed_iteration.txt``, or None when there is none."""
    try:
        with open(os.path.join(root, LATEST_POINTER_FILE), encoding="utf-8") as handle:
            return int(handle.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def load_trainer_state(path: str) -> dict:
    return load_state(os.path.join(path, TRAINER_STATE_FILE))


def checkpoint_step(path: str) -> int:
    """The global step a checkpoint folder was saved at."""
    return int(load_trainer_state(path)["global_step"])


def load_dataloader_state(path: str) -> dict | None:
    """The driver's dataloader state, or None for a checkpoint saved without one (save_model_only)."""
    file = os.path.join(path, DATALOADER_FILE)
    if os.path.isfile(file):
        return load_state(file)
    if os.path.isfile(os.path.join(path, LEGACY_DRIVER_FILE)):
        raise CheckpointError(
            f"{path} was written by an older easyrl that stored the driver's state as a pickle "
            f"({LEGACY_DRIVER_FILE}), which this version does not load (a pickle can run code). Start the run afresh "
            "in a new trainer.save_checkpoint_path, or continue it with the easyrl version that wrote it."
        )
    return None


def validates_first(config: Any, step: int) -> bool:
    """Whether a run (RL or SFT) validates before its first step, at ``step`` (the checkpoint's it resumed, or 0):
    trainer.val_only validates the model it starts from, a checkpoint's too (EasyR1: only with val_before_train);
    val_before_train only a run that starts from step 0. ``config``: the ``trainer`` section."""
    return config.val_only or (config.val_before_train and step == 0)


def saves_after(config: Any, step: int, is_last: bool, last_save_time: float, stop_requested: bool) -> bool:
    """Whether a run (RL or SFT) checkpoints after ``step``: after the last step, every ``trainer.save_freq`` steps,
    once ``trainer.save_every_minutes`` have passed since ``last_save_time`` (``time.monotonic()``), and when a stop
    signal came during the step. ``config``: the ``trainer`` section."""
    minutes = config.save_every_minutes
    return (
        is_last
        or (config.save_freq > 0 and step % config.save_freq == 0)
        or (minutes > 0 and time.monotonic() - last_save_time >= 60 * minutes)
        or stop_requested
    )


def resolve_resume_path(config: Any) -> str | None:
    """The checkpoint a run resumes from (a PPOConfig or its TrainerConfig), or None to start fresh.

    ``trainer.load_checkpoint_path`` wins, but once the run has gone on from it and saved in its own folder (with
    ``trainer.find_last_checkpoint``; ``load_checkpoint_passed``): the rerun of a killed run (a requeued job cannot
    change its command) goes on from the folder's newest, as verl's resume_mode=auto does, instead of training the
    same steps again from the checkpoint it started from. Otherwise, with ``trainer.find_last_checkpoint``, the
    newest complete checkpoint under ``trainer.save_checkpoint_path``.
    """
    trainer = getattr(config, "trainer", config)
    if (own := load_checkpoint_passed(trainer)) is not None:
        return own
    if trainer.load_checkpoint_path:
        path = os.path.abspath(trainer.load_checkpoint_path)
        if not os.path.isdir(path):
            raise CheckpointError(f"trainer.load_checkpoint_path={path} does not exist.")
        if not is_complete_checkpoint(path):
            last = find_last_checkpoint(path)
            hint = f" It holds checkpoints: did you mean {last}?" if last else ""
            # a folder inside a checkpoint (its actor/, or the actor's huggingface/ model)
            inside = next(
                (parent for parent in (os.path.dirname(path), os.path.dirname(os.path.dirname(path)))
                 if is_complete_checkpoint(parent)),
                None,
            )  # fmt: skip
            if inside is not None:
                model = (
                    " (To start from this model's weights alone, give it as worker.actor.model.model_path.)"
                    if os.path.basename(path) == "huggingface"
                    else ""
                )
                raise CheckpointError(
                    f"trainer.load_checkpoint_path={path} is a folder inside the checkpoint {inside}: give that "
                    f"folder.{model}"
                )
            raise CheckpointError(
                f"trainer.load_checkpoint_path={path} is not a complete checkpoint (no {COMPLETE_MARKER} marker: "
                f"the save was interrupted, or it is not a {STEP_DIR_PREFIX}N folder).{hint} Point it at a "
                f"complete {STEP_DIR_PREFIX}N folder, or unset it to resume from the newest one."
            )
        return path
    if trainer.find_last_checkpoint:
        return find_last_checkpoint(trainer.save_checkpoint_path)
    return None


def own_saves_root(trainer: Any) -> str | None:
    """The run's own folder when a run given ``trainer.load_checkpoint_path`` goes on from what it saved there once it
    has (``trainer.find_last_checkpoint``; ``load_checkpoint_passed``); None otherwise."""
    if not (trainer.load_checkpoint_path and trainer.save_checkpoint_path and trainer.find_last_checkpoint):
        return None
    return os.path.abspath(trainer.save_checkpoint_path)


def in_run_folder(path: str, trainer: Any) -> bool:
    """Whether the checkpoint at ``path`` is one of this run's own (``trainer.save_checkpoint_path``), not another
    run's."""
    root = trainer.save_checkpoint_path
    return bool(root) and os.path.dirname(os.path.abspath(path)) == os.path.abspath(root)


def own_step_row(path: str, trainer: Any, state: dict) -> dict | None:
    """The metrics row the checkpoint at ``path`` kept of its step, for the run's loggers to restore when a crash
    took it (``rewind_to``); None for a warm start from another run's folder, which this run never trained."""
    return state.get("metrics") if in_run_folder(path, trainer) else None


def load_checkpoint_passed(trainer: Any) -> str | None:
    """The newest complete checkpoint of the run's own folder when a run started from ``trainer.load_checkpoint_path``
    has saved it: for a checkpoint of another run's folder (a warm start), any checkpoint of the run's own; for an
    earlier checkpoint of its own folder (a rollback), the newest only when it records that its run started from
    this same checkpoint (``started_from``: a first rollback, past a newest of the branch it leaves, still rolls
    back). None otherwise: the run starts from ``trainer.load_checkpoint_path``."""
    root = own_saves_root(trainer)
    newest = find_last_checkpoint(root) if root else None
    if newest is None:
        return None
    load = os.path.abspath(trainer.load_checkpoint_path)
    if not in_run_folder(load, trainer):
        return newest
    return newest if newest != load and started_from(newest) == load else None


def passed_start_reason(trainer: Any, path: str) -> str:
    """Why the run goes on from its own newest checkpoint ``path`` rather than from trainer.load_checkpoint_path
    (which it follows in a sentence: ``load_checkpoint_passed`` chose ``path``), and how to start from there again."""
    if not in_run_folder(trainer.load_checkpoint_path, trainer):
        return (
            f"is outside this run's folder, which holds checkpoints the run saved since it started from it: it goes on "
            f"from its own newest, {path} (a killed warm-started run rerun with the same command). Give the run a new "
            f"trainer.save_checkpoint_path to start from {trainer.load_checkpoint_path} again."
        )
    return (
        f"is an earlier checkpoint of this run's folder, whose newest, {path}, was saved by a run that rolled back to "
        f"it: it goes on from there (a killed rolled-back run rerun with the same command) instead of rolling back "
        "again. To roll back again, rerun once with trainer.find_last_checkpoint=false (or delete the checkpoints "
        "saved after it)."
    )


def started_from(path: str) -> str | None:
    """The trainer.load_checkpoint_path the run that saved the checkpoint at ``path`` started from (None: it was given
    none, or an earlier version saved it)."""
    try:
        return load_trainer_state(path).get(STARTED_FROM_KEY)
    except (OSError, ValueError):
        return None


def warn_of_config_changes(answers: list, section: str, step: int) -> None:
    """Say which optimizer settings of ``section`` (e.g. "worker.actor.optim") this run's config changed since the
    checkpoint of ``step``; ``answers``: the workers' ``load_checkpoint`` answers (every rank's are the same)."""
    from ..workers.fsdp_checkpoint import SCHEDULED_LR

    for name, saved, configured in (answers[0] if answers else None) or []:
        if name == SCHEDULED_LR:
            logger.warning(
                "The learning-rate schedule of %s differs from the one the checkpoint of step %d was trained with (its "
                "length: trainer.max_steps or total_epochs, or its warmup or kind): step %d trains at lr %.4g, this "
                "run's schedule at its place, where the checkpoint's schedule would give %.4g; the rest of the run "
                "follows this run's schedule.",
                section,
                step,
                step + 1,
                configured,
                saved,
            )
            continue
        logger.warning(
            "%s.%s is %s in the checkpoint of step %d and %s in this run's config: the config's applies from step %d on"
            "%s.",
            section,
            name,
            saved,
            step,
            configured,
            step + 1,
            " (the peak: warmup and decay keep their place in the schedule)" if name == "lr" else "",
        )


def model_only_error(path: str, what: str = "training", trainer: Any = None) -> CheckpointError:
    """The error for resuming from a checkpoint saved with trainer.save_model_only=true (``trainer``: the run's
    TrainerConfig, for a way out that fits where the checkpoint came from)."""
    if trainer is not None and trainer.load_checkpoint_path:
        way_out = (
            "Unset trainer.load_checkpoint_path to start afresh; to start from its weights, turn it into a model "
            f"with `easyrl merge --local_dir {path}/actor` and give {path}/actor/huggingface as "
            "worker.actor.model.model_path."
        )
    else:
        way_out = (
            "Start afresh in a new trainer.save_checkpoint_path (or delete that folder), or turn it into a model with "
            "`easyrl merge`."
        )
    return CheckpointError(
        f"{path} holds no dataloader or optimizer state (saved with trainer.save_model_only=true): {what} cannot "
        f"resume from it. {way_out}"
    )


def check_resume_point(config: Any, what: str = "training") -> str | None:
    """``resolve_resume_path``, checked before Ray starts: a checkpoint a run can resume from, or a fresh start in a
    folder without an earlier run's checkpoints (whose saves would mix with this run's, `trainer.save_limit` deleting
    them by step number, and whose metrics.jsonl rows this run would drop). Given the whole config (not its
    ``trainer`` section alone), the checkpoint's actor must also be one this run's model resumes
    (``check_actor_resumes``)."""
    trainer = getattr(config, "trainer", config)
    path = resolve_resume_path(trainer)
    if path is None:
        earlier = list_checkpoints(trainer.save_checkpoint_path)
        if earlier:
            names = ", ".join(os.path.basename(folder) for _, folder in earlier[-3:])
            raise CheckpointError(
                f"trainer.save_checkpoint_path={os.path.abspath(trainer.save_checkpoint_path)} holds the checkpoints "
                f"of an earlier run ({len(earlier)}, the last {names}) and trainer.find_last_checkpoint=false starts "
                "afresh there: its checkpoints would mix with them, trainer.save_limit would delete them, and its "
                "metrics would replace theirs. Give this run a new trainer.save_checkpoint_path (or delete that "
                "folder), or set trainer.find_last_checkpoint=true to continue the earlier run."
            )
        return None
    loader_state = load_dataloader_state(path)
    if loader_state is None:
        raise model_only_error(path, what, trainer)
    if hasattr(config, "data"):
        check_loader_resumes(path, loader_state, config.data, _fresh_start_advice(trainer))
    if hasattr(config, "worker"):
        check_actor_resumes(path, config.worker.actor.model, _fresh_start_advice(trainer))
    if hasattr(config, "algorithm") and what == "training":
        check_critic_resumes(path, config, _fresh_start_advice(trainer))
    _warn_of_later_steps(trainer, path)
    return path


def check_critic_resumes(path: str, config: Any, fresh_start: str) -> None:
    """A run that trains a critic (algorithm.adv_estimator=gae) resumes only a checkpoint that holds one: the workers'
    load would fail after Ray and the engine started. A checkpoint's critic that this run does not train is said to
    be left unused."""
    from ..config.validate import uses_critic

    held = os.path.isdir(os.path.join(path, CRITIC_FOLDER))
    estimator = config.algorithm.adv_estimator
    if uses_critic(config) and not held:
        saved = (checkpoint_config(path).get("algorithm") or {}).get("adv_estimator")
        raise CheckpointError(
            f"Cannot resume from {path}: it holds no critic"
            + (f" (its run had algorithm.adv_estimator={saved})" if saved else "")
            + f", and this run's algorithm.adv_estimator={estimator} trains one. Set algorithm.adv_estimator as the "
            f"checkpoint's run had it, or {fresh_start}."
        )
    if held and not uses_critic(config):
        logger.warning(
            "%s holds a critic, which this run (algorithm.adv_estimator=%s) does not train: it is left unused.",
            path,
            estimator,
        )


def check_loader_resumes(path: str, state: dict, data: Any, fresh_start: str) -> None:
    """The data position saved in the checkpoint at ``path`` (``state``: the train loader's) can be restored into the
    loader this run's ``data`` settings build: the same number of loader processes (a loader saves its position per
    process), and a shuffled order only by a shuffling one. Otherwise torchdata fails an assertion at the first step,
    after Ray and the workers started. ``fresh_start``: the way out besides setting the keys back."""
    snapshot = state.get("_snapshot")
    saved_workers = len(snapshot.get("_worker_snapshots") or {}) if isinstance(snapshot, dict) else 0
    problems = []
    if saved_workers != data.dataloader_num_workers:
        problems.append(
            f"data.dataloader_num_workers is {saved_workers} in the checkpoint and {data.dataloader_num_workers} in "
            "this run's config (a loader saves its position per process)"
        )
    if _holds_key(state, "generator") and not data.shuffle:
        problems.append("data.shuffle is true in the checkpoint and false in this run's config")
    if problems:
        them = "it" if len(problems) == 1 else "them"
        raise CheckpointError(
            f"Cannot resume from {path}: {'; '.join(problems)}; the data position it saved cannot be restored into "
            f"this run's loader. Set {them} as the checkpoint has {them}, or {fresh_start}."
        )


def _holds_key(tree: Any, key: str) -> bool:
    if isinstance(tree, dict):
        return key in tree or any(_holds_key(value, key) for value in tree.values())
    return False


def _warn_of_later_steps(trainer: Any, path: str) -> None:
    """A run resumed from an earlier step of its own folder branches off: name the later checkpoints it leaves
    behind, that its saves of the same steps replace them, and where a rerun of the same command goes on from."""
    step = checkpoint_step(path)
    root = os.path.abspath(trainer.save_checkpoint_path) if trainer.save_checkpoint_path else None
    later = [os.path.basename(name) for at, name in list_checkpoints(root) if at > step] if root else []
    if not (later and in_run_folder(path, trainer)):
        return
    named = ", ".join(later) if len(later) <= 3 else f"{later[0]}, ..., {later[-1]}"
    rerun = (
        "once this run has saved, the same command rerun (a requeued job) goes on from its newest save, not from "
        f"step {step} again"
        if own_saves_root(trainer)
        else f"a rerun of the same command starts from step {step} again (trainer.find_last_checkpoint=false)"
    )
    logger.warning(
        "Resuming from step %d of %s, which also holds %d later checkpoint%s (%s) saved before: this run's saves of "
        "the same steps replace them, and %s.",
        step,
        root,
        len(later),
        "" if len(later) == 1 else "s",
        named,
        rerun,
    )


# ----------------------------------------------------------------------------------------------------------------------
# whether this run's actor resumes a checkpoint's (before Ray starts)
# ----------------------------------------------------------------------------------------------------------------------
ACTOR_FOLDER = "actor"
CRITIC_FOLDER = "critic"
LORA_KEY = "worker.actor.model.lora"
MODEL_PATH_KEY = "worker.actor.model.model_path"
WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# stretches read from each weight file to tell two model folders apart: a model that differs from another in a
# twentieth of its bytes (a LoRA merged into q_proj and v_proj) goes unnoticed with a chance of 0.95^256, 2e-6
FINGERPRINT_SAMPLES, FINGERPRINT_SAMPLE_BYTES = 256, 4096
# config.json fields that fix the shapes of a model's weights (a vision-language model's are in its text_config)
ARCHITECTURE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)


def _fresh_start_advice(trainer: Any) -> str:
    """The way out of a checkpoint this run cannot resume, besides setting the keys as the checkpoint has them: the
    checkpoint came from trainer.load_checkpoint_path, or was found in trainer.save_checkpoint_path."""
    if trainer.load_checkpoint_path:
        return (
            "point trainer.load_checkpoint_path at a checkpoint of such a run (or unset it and start afresh in a new "
            "trainer.save_checkpoint_path)"
        )
    return "start afresh in a new trainer.save_checkpoint_path"


def check_actor_resumes(path: str, model: Any, fresh_start: str) -> None:
    """The actor of the checkpoint at ``path`` was trained as this run trains (``model``: the ``worker.actor.model``
    section): full weights or LoRA alike, LoRA with the same rank, alpha and adapted modules, on the same base model.

    Otherwise the workers' load fails a minute later, after Ray and the engine started, on a tensor shape, or, with a
    new alpha or base model, not at all: the adapters train on where they do not belong. ``fresh_start``: the way out
    besides setting the keys as the checkpoint has them."""
    from ..workers.fsdp_checkpoint import adapter_config_file, is_role_folder

    role = os.path.join(path, ACTOR_FOLDER)
    if not is_role_folder(role):  # not an actor folder easyrl wrote: the workers' load says what is wrong
        return
    adapter_file = adapter_config_file(role)  # in huggingface/, or in lora_adapter/ after `easyrl merge` in place
    rank = model.lora.rank
    if adapter_file is None:
        _check_vision_tower_stays_frozen(path, model, fresh_start)
        if rank > 0:
            raise CheckpointError(
                f"Cannot resume from {path}: it holds full weights and this run trains LoRA adapters ({LORA_KEY}.rank="
                f"{rank}). Set {LORA_KEY}.rank=0 as the checkpoint has it, or {fresh_start} (adapters on the "
                f"checkpoint's weights: `easyrl merge` its actor and give the merged folder as {MODEL_PATH_KEY})."
            )
        return
    with open(adapter_file, encoding="utf-8") as file:
        saved = json.load(file)
    if rank == 0:
        raise CheckpointError(
            f"Cannot resume from {path}: it holds LoRA adapters (rank {saved.get('r')}) and this run trains full "
            f"weights ({LORA_KEY}.rank=0). Set {LORA_KEY}.rank={saved.get('r')} as the checkpoint has it, or "
            f"{fresh_start} (full weights from the adapters' result: `easyrl merge` its actor and give the merged "
            f"folder as {MODEL_PATH_KEY})."
        )
    _check_base_model(path, role, adapter_file, saved.get("base_model_name_or_path"), model.model_path, fresh_start)
    differences = _lora_differences(saved, model)
    if differences:
        them = "it" if len(differences) == 1 else "them"
        raise CheckpointError(
            f"Cannot resume from {path}: {'; '.join(differences)}. Set {them} as the checkpoint has {them}, or "
            f"{fresh_start}."
        )


def _check_vision_tower_stays_frozen(path: str, model: Any, fresh_start: str) -> None:
    """A full-weight checkpoint trained with the vision tower frozen has no optimizer state for the tower's weights,
    which a run with worker.actor.model.freeze_vision_tower=false would train: its load would fail after Ray starts,
    on a missing key. (Freezing a tower the checkpoint trained resumes: the warning names the key.)"""
    from .run_config import checkpoint_config

    model_section = checkpoint_config(path).get("worker", {}).get("actor", {}).get("model", {})
    if model_section.get("freeze_vision_tower") and not model.freeze_vision_tower:
        raise CheckpointError(
            f"Cannot resume from {path}: it was trained with worker.actor.model.freeze_vision_tower=true, so its "
            "optimizer holds no state for the vision tower's weights, which this run trains (freeze_vision_tower="
            f"false). Set worker.actor.model.freeze_vision_tower=true as the checkpoint has it, or {fresh_start} "
            f"(the checkpoint's weights as the model: `easyrl merge` its actor and give the merged folder as "
            f"{MODEL_PATH_KEY})."
        )


def _lora_differences(saved: dict, model: Any) -> list[str]:
    """What of this run's LoRA differs from the checkpoint's adapter config (``saved``): rank and alpha, and the
    modules that get adapters once this run's target_modules, exclude_modules and vision_tower are resolved on the
    model (a different spelling of the same modules is the same)."""
    lora_config = model.lora
    differences = [
        f"{LORA_KEY}.{key} is {in_checkpoint} in the checkpoint and {configured} in this run's config"
        for key, in_checkpoint, configured in (
            ("rank", saved.get("r"), lora_config.rank),
            ("alpha", saved.get("lora_alpha"), lora_config.alpha),
        )
        if in_checkpoint != configured
    ]
    planned = _planned_adapter_config(model)
    if planned is None:
        return differences
    planned_config, names = planned
    saved_modules = _adapted(saved, names)
    if saved_modules == _adapted(planned_config, names):
        return differences  # another spelling of the same modules (e.g. EasyR1's `.*visual.*` with the tower excluded)
    # the vision encoder's modules alone differ: the key that changed is vision_tower, whatever target_modules says
    flipped = dataclasses.replace(
        model, lora=dataclasses.replace(lora_config, vision_tower=not lora_config.vision_tower)
    )
    flipped_plan = _planned_adapter_config(flipped)
    if flipped_plan is not None and saved_modules == _adapted(flipped_plan[0], names):
        return differences + [
            f"{LORA_KEY}.vision_tower is {not lora_config.vision_tower} in the checkpoint and "
            f"{lora_config.vision_tower} in this run's config"
        ]
    saved_targets, planned_targets = saved.get("target_modules"), planned_config["target_modules"]
    if _as_set(saved_targets) != _as_set(planned_targets):
        asked = _listed(lora_config.target_modules)
        resolved = "" if asked == _listed(planned_targets) else f" (that is {_listed(planned_targets)})"
        differences.append(
            f"{LORA_KEY}.target_modules is {_listed(saved_targets)} in the checkpoint and {asked}{resolved} in this "
            "run's config"
        )
    else:
        differences.append(
            f"the modules kept free of adapters ({LORA_KEY}.exclude_modules, and the vision encoder unless "
            f"{LORA_KEY}.vision_tower) are `{saved.get('exclude_modules')}` in the checkpoint and "
            f"`{planned_config.get('exclude_modules')}` in this run's config"
        )
    return differences


def _adapted(adapter_config: dict, names: list[str]) -> frozenset[str]:
    """The modules among ``names`` that an adapter config (adapter_config.json's target_modules and exclude_modules)
    puts adapters on, matched as peft matches them."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import _ExcludedModule, check_target_module_exists

    config = LoraConfig(
        target_modules=adapter_config.get("target_modules"), exclude_modules=adapter_config.get("exclude_modules")
    )
    return frozenset(
        name
        for name in names
        if (found := check_target_module_exists(config, name)) and not isinstance(found, _ExcludedModule)
    )


def planned_adapter_config(model: Any, compared_with: str = "with the checkpoint's") -> tuple[dict, list[str]] | None:
    """The adapter config this run's workers will write (peft's, as adapter_config.json holds it), and the names of
    the model's modules, from the model's structure alone: built on the meta device, no weight is read. None, with a
    warning, when the model cannot be built here (the workers then say why). Raises ValueError, as the workers
    would, when target_modules / exclude_modules leave no layer to adapt."""
    from ..models import lora, vision
    from ..models.hf_config import load_hf_config
    from ..workers.fsdp_utils import resolve_model_class

    hf_config = load_hf_config(model, "causal_lm")
    model_cls = resolve_model_class(hf_config, "causal_lm")
    try:
        with torch.device("meta"):
            skeleton = model_cls.from_config(hf_config, trust_remote_code=model.trust_remote_code)
    except Exception as error:  # e.g. remote code that needs a GPU library: the workers load the model their own way
        logger.warning(
            "The LoRA target modules of this run were not checked %s: %s cannot be built here (%s: %s).",
            compared_with,
            model.model_path,
            type(error).__name__,
            error,
        )
        return None
    names = [name for name, _ in skeleton.named_modules() if name]
    with torch.device("meta"):
        adapted = lora.apply_lora(skeleton, model.lora, is_vision_language=vision.is_vision_language_config(hf_config))
    return lora.lora_peft_config(adapted), names


def _planned_adapter_config(model: Any) -> tuple[dict, list[str]] | None:
    try:
        return planned_adapter_config(model)
    except ValueError as error:  # a target_modules name that matches nothing: what the workers would stop on
        raise CheckpointError(str(error)) from error


def _as_set(names: Any) -> Any:
    return set(names) if isinstance(names, list | tuple | set) else names


def _listed(names: Any) -> str:
    """target_modules as a user writes it: a comma-separated list, or one string (`all-linear`)."""
    return ",".join(sorted(str(name) for name in names)) if isinstance(names, list | tuple | set) else str(names)


def _check_base_model(
    path: str, role: str, adapter_file: str, saved_base: str | None, model_path: str, fresh_start: str
) -> None:
    """LoRA adapters resume on the base model they were trained on, which their adapter config names
    (base_model_name_or_path): the same folder (links and relative parts resolved) or hub id passes. ``role``: the
    checkpoint's actor folder."""
    from ..demo.builtin_models import resolve_model_path
    from ..workers.fsdp_checkpoint import HF_FOLDER

    configured = resolve_model_path(model_path)
    if not saved_base or not configured or _resolved_name(saved_base) == _resolved_name(configured):
        return
    # A base still at its recorded path is refused under another name unless its weight files are the same bytes (a
    # copy), because another model of its architecture (the instruct or a fine-tuned variant) takes the adapters
    # without a word and is what this check is for; one gone from there is most likely the same model moved (another
    # disk, the run folder taken to another machine), so it passes with a warning when the architecture matches.
    saved_folder, configured_folder = local_model_folder(saved_base), local_model_folder(configured)
    saved_files = _weight_files_fingerprint(saved_folder) if saved_folder else ()
    configured_files = _weight_files_fingerprint(configured_folder) if configured_folder else ()

    def refusal(why: str) -> CheckpointError:
        return CheckpointError(
            f"Cannot resume from {path}: its LoRA adapters were trained on {saved_base} (base_model_name_or_path in "
            f"{adapter_file}) and this run's {MODEL_PATH_KEY} is {configured}, {why}. Set {MODEL_PATH_KEY}="
            f"{saved_base} as the checkpoint has it, or {fresh_start}."
        )

    if saved_files and configured_files:
        if saved_files != configured_files:
            raise refusal("whose weight files differ")
        logger.warning(
            "The LoRA adapters of %s were trained on %s; this run loads them onto %s, whose weight files are the "
            "same (names, sizes and sampled bytes): resuming.",
            path,
            saved_base,
            configured,
        )
        return
    if _is_hub_id(saved_base) and _is_hub_id(configured):
        raise refusal("another hub model")
    saved_shapes = _architecture(os.path.join(role, HF_FOLDER, "config.json"))  # the model's as trained
    configured_shapes = _architecture(os.path.join(configured_folder, "config.json")) if configured_folder else None
    differing = [
        f"{key} {saved_shapes[key]} and {configured_shapes[key]}"
        for key in (saved_shapes or {})
        if configured_shapes
        and None not in (saved_shapes[key], configured_shapes[key])
        and saved_shapes[key] != configured_shapes[key]
    ]
    if differing:
        raise refusal(f"a model of another architecture ({', '.join(differing)})")
    logger.warning(
        "The LoRA adapters of %s were trained on %s%s; this run loads them onto %s, of the same architecture, whose "
        "weights cannot be compared with those here. If it is not the same model (e.g. the instruct variant of a "
        "base), stop the run: set %s to the model the adapters were trained on, or %s.",
        path,
        saved_base,
        "" if saved_folder else ", which is not there any more",
        configured,
        MODEL_PATH_KEY,
        fresh_start,
    )


def _is_hub_id(name: str) -> bool:
    return not looks_local(name) and not os.path.isdir(os.path.expanduser(name))


def _resolved_name(name: str) -> str:
    """A local model path with links, `~` and relative parts resolved; a hub id as it is."""
    return name if _is_hub_id(name) else os.path.realpath(os.path.expanduser(name))


def local_model_folder(name: str) -> str | None:
    """Where a model path's files are here: its folder, or a hub id's snapshot in the local cache; None if neither."""
    local = os.path.expanduser(name)
    if os.path.isdir(local):
        return os.path.realpath(local)
    if looks_local(name):
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a valid hub id either
        return None
    return os.path.dirname(cached) if isinstance(cached, str) else None


def file_digest(path: str) -> str | None:
    """A short digest of a file's contents; None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()[:16]
    except OSError:
        return None


# the most user modules followed from one file: a file importing a whole project of its own is still read quickly
MAX_IMPORTED_FILES = 200


def code_digest(path: str) -> str | None:
    """``file_digest`` of a user's ``.py`` file (reward function, tools, environment) and of the modules of the user's
    that it imports, followed through their own imports: a helper module next to a reward file (on PYTHONPATH) scores
    as the file itself does, so an edit of it must count as one. A file importing none of the user's modules has its
    own file_digest, as checkpoints of earlier versions recorded."""
    if not path.endswith(".py"):
        return file_digest(path)
    first = os.path.abspath(path)
    roots = [os.path.dirname(first), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    found, queue = [first], [first]
    while queue and len(found) < MAX_IMPORTED_FILES:
        for module in _user_modules_imported(queue.pop(), roots):
            if module not in found:
                found.append(module)
                queue.append(module)
    if len(found) == 1:
        return file_digest(first)
    digests = [file_digest(module) for module in found]
    if digests[0] is None:
        return None
    return hashlib.sha256(json.dumps([digests[0], sorted(zip(found[1:], digests[1:]))]).encode()).hexdigest()[:16]


def _user_modules_imported(path: str, roots: list[str]) -> list[str]:
    """The files of the modules ``path`` imports by absolute name that one of ``roots`` holds (``name.py``, or a
    package's ``__init__.py`` and ``name/sub.py``); the standard library's and easyrl's own names are not followed."""
    import ast
    import sys

    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    files = []
    for name in dict.fromkeys(names):
        parts = name.split(".")
        if parts[0] in sys.stdlib_module_names or parts[0] == "easyrl":
            continue
        for root in roots:
            base = os.path.join(root, *parts)
            candidates = [base + ".py", os.path.join(base, "__init__.py")]
            if len(parts) > 1:  # the packages on the way (`from pkg.sub import f` runs pkg/__init__.py)
                candidates += [os.path.join(root, *parts[:i], "__init__.py") for i in range(1, len(parts))]
            files += [os.path.abspath(c) for c in candidates if os.path.isfile(c)]
    return list(dict.fromkeys(files))


def input_file_digests(config: Any) -> dict[str, str]:
    """Digests of the files a run reads by path besides its data and models, by config key: the reward function's
    file, the prompt template, the judge's template, the tools and environment files. A resume warns when one
    changed since its checkpoint (the scores or prompts before and after are not comparable)."""
    from ..workers.reward.loader import CONFIG_KEY, RewardFunctionError, parse_spec, parse_user_file

    reward, multi_turn = config.worker.reward, config.worker.rollout.multi_turn
    paths = {
        "data.format_prompt": config.data.format_prompt,
        "worker.reward.judge.prompt_template": reward.judge.prompt_template if reward.judge.kind != "none" else None,
        "worker.rollout.multi_turn.tools": multi_turn.tools,
    }
    if reward.reward_function:
        try:
            paths[CONFIG_KEY] = str(parse_user_file(parse_spec(reward.reward_function)[0], CONFIG_KEY)[0])
        except (OSError, RewardFunctionError):
            pass
    envs = multi_turn.env if isinstance(multi_turn.env, dict) else {None: multi_turn.env}
    for name, spec in envs.items():
        if isinstance(spec, str) and spec:
            paths["worker.rollout.multi_turn.env" + (f".{name}" if name else "")] = spec.rpartition(":")[0] or spec
    digests = {
        key: code_digest(path) if key.startswith(CODE_KEYS) else file_digest(path)
        for key, path in paths.items()
        if isinstance(path, str) and path
    }
    return {key: digest for key, digest in digests.items() if digest is not None}


# the keys whose file is Python code, whose digest covers the user's modules it imports (code_digest)
CODE_KEYS = ("worker.reward.reward_function", "worker.rollout.multi_turn.tools", "worker.rollout.multi_turn.env")


def changed_input_files(saved: dict[str, str] | None, now: dict[str, str]) -> list[str]:
    """The config keys whose file has other contents now than when a checkpoint was saved (``saved``: its digests,
    None for a checkpoint of an earlier version, which recorded none)."""
    return sorted(key for key, digest in (saved or {}).items() if key in now and now[key] != digest)


def model_weights_fingerprint(model_path: str) -> str | None:
    """A short digest of the weight files of the model at ``model_path`` (a folder, or a hub id's cached snapshot):
    it changes when new weights are written into the same folder. None when no weight file is found here."""
    folder = local_model_folder(model_path) if model_path else None
    files = _weight_files_fingerprint(folder) if folder else ()
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16] if files else None


def _weight_files_fingerprint(folder: str) -> tuple[tuple[str, int, str], ...]:
    """``(name, size, digest of FINGERPRINT_SAMPLES stretches spread over it)`` of each weight file of a model folder:
    the same for two copies of a model, different for two models of one architecture, without reading tens of GB;
    empty for a folder without weight files (a hub id whose weights are not downloaded yet)."""
    found = []
    for name in sorted(os.listdir(folder)):
        file = os.path.join(folder, name)
        if not name.endswith(WEIGHT_FILE_SUFFIXES) or not os.path.isfile(file):
            continue
        size = os.path.getsize(file)
        digest = hashlib.sha256()
        with open(file, "rb") as handle:
            for index in range(FINGERPRINT_SAMPLES):
                handle.seek(size * index // FINGERPRINT_SAMPLES)
                digest.update(handle.read(FINGERPRINT_SAMPLE_BYTES))
        found.append((name, size, digest.hexdigest()))
    return tuple(found)


def _architecture(config_file: str) -> dict[str, Any] | None:
    """The model type and ARCHITECTURE_KEYS of a config.json (None where it says nothing), or None if unreadable."""
    try:
        with open(config_file, encoding="utf-8") as file:
            config = json.load(file)
    except (OSError, ValueError):
        return None
    text = config.get("text_config") or {}
    return {
        "model_type": config.get("model_type"),
        **{key: text.get(key, config.get(key)) for key in ARCHITECTURE_KEYS},
    }


# ----------------------------------------------------------------------------------------------------------------------
# writing checkpoints
# ----------------------------------------------------------------------------------------------------------------------
def _fsync_dir(path: str) -> None:
    """Make a rename or new entry in ``path`` durable; some network filesystems cannot, which is fine."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_checkpoint(path: str, root: str) -> None:
    """Rename out of sight first, so a crash halfway through a delete never leaves a half-deleted "checkpoint"."""
    doomed = os.path.join(root, f"{OLD_DIR_PREFIX}{os.path.basename(path)}.{os.getpid()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


class CheckpointManager:
    """Hands out a temporary folder for a save and publishes it atomically once every part is written.

    The driver calls, for each save::

        tmp_dir = manager.begin(step)        # workers write actor/, critic/ ... into tmp_dir
        ...                                  # wait until every worker has returned
        manager.commit(step, trainer_state={...}, dataloader_state=loader.state_dict(), required=("actor",))
    """

    def __init__(self, save_checkpoint_path: str, save_limit: int = -1, started_from: str | None = None) -> None:
        """``started_from``: the run's trainer.load_checkpoint_path, recorded in each checkpoint it saves (a rerun of
        a rolled-back run goes on from them: ``load_checkpoint_passed``)."""
        self.root = os.path.abspath(save_checkpoint_path)
        self.save_limit = save_limit
        self.started_from = os.path.abspath(started_from) if started_from else None

    def tmp_dir(self, step: int) -> str:
        return os.path.join(self.root, f"{TMP_DIR_PREFIX}{step}")

    def begin(self, step: int) -> str:
        """A fresh, empty temporary folder for the checkpoint of ``step``; leftovers of crashed saves are removed."""
        os.makedirs(self.root, exist_ok=True)
        for name in os.listdir(self.root):
            if name.startswith((TMP_DIR_PREFIX, OLD_DIR_PREFIX)):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        tmp_dir = self.tmp_dir(step)
        os.makedirs(tmp_dir)
        return tmp_dir

    def commit(
        self,
        step: int,
        trainer_state: dict | None = None,
        dataloader_state: dict | None = None,
        required: tuple[str, ...] | list[str] = (),
    ) -> str:
        """Write the driver's files, mark complete, rename into place, update the pointer, rotate old ones.

        ``required`` names the entries the workers must have written (e.g. ``("actor", "critic")``); one that is
        missing means they wrote somewhere the driver cannot see. Returns the final checkpoint folder.
        """
        tmp_dir = self.tmp_dir(step)
        if not os.path.isdir(tmp_dir):
            raise CheckpointError(f"commit({step}) without begin({step}): {tmp_dir} does not exist.")
        missing = [name for name in required if not os.path.exists(os.path.join(tmp_dir, name))]
        if missing:
            raise CheckpointError(
                f"checkpoint of step {step} is missing {missing} in {tmp_dir}: the workers saved where this process "
                "cannot see it. trainer.save_checkpoint_path must be on a filesystem that every node mounts at the "
                "same path (e.g. NFS); set it to such a folder."
            )
        if dataloader_state is not None:
            save_state(os.path.join(tmp_dir, DATALOADER_FILE), dataloader_state)
        state = {"global_step": step, **(trainer_state or {})}
        if self.started_from is not None:
            state[STARTED_FROM_KEY] = self.started_from
        save_state(os.path.join(tmp_dir, TRAINER_STATE_FILE), state)
        run_config = os.path.join(self.root, CONFIG_FILE)
        if os.path.isfile(run_config):  # the config this checkpoint was trained with, which a resume compares with
            shutil.copyfile(run_config, os.path.join(tmp_dir, CONFIG_FILE))
        replace_file(os.path.join(tmp_dir, COMPLETE_MARKER), f"{step} {time.time():.3f}\n")
        _fsync_dir(tmp_dir)

        final_dir = checkpoint_dir(self.root, step)
        if os.path.exists(final_dir):  # the same step saved again (e.g. a resumed run): replace it
            _remove_checkpoint(final_dir, self.root)
        os.rename(tmp_dir, final_dir)
        _fsync_dir(self.root)
        self._write_latest_pointer(step)
        self._rotate(keep=final_dir)
        return final_dir

    def abort(self, step: int) -> None:
        """Throw away an unfinished save of ``step``."""
        shutil.rmtree(self.tmp_dir(step), ignore_errors=True)

    @contextmanager
    def saving(self, step: int) -> Iterator[str]:
        """``begin(step)``'s folder, for the workers' writes and ``commit``. Whatever fails inside removes the partial
        save (``abort``): a full disk is not left full by it. A write that failed (an OSError or torch's RuntimeError,
        raised here or in a worker and brought by Ray) becomes one ``CheckpointSaveError`` naming
        trainer.save_checkpoint_path, why, and for a full disk the space left there."""
        try:
            yield self.begin(step)
        except BaseException as error:  # DCP's CheckpointException is a BaseException
            partial = os.path.lexists(self.tmp_dir(step))
            self.abort(step)
            failure = write_failure(error)
            if failure is None:  # a worker that died, a bug: the caller's handling (a restart, a traceback) applies
                raise
            # the traceback, for a bug report, goes to the driver's log file only (the root logger's INFO)
            logging.getLogger().info("The checkpoint of step %d could not be saved:", step, exc_info=True)
            raise CheckpointSaveError(self._save_failure_text(step, failure, partial)) from error

    def _save_failure_text(self, step: int, failure: BaseException, partial: bool) -> str:
        """What failed, and for a full disk the space left (after the partial save was removed) and what to do."""
        tmp_dir = self.tmp_dir(step)
        if not partial:
            removed = ""
        elif os.path.lexists(tmp_dir):
            removed = f"; delete its partial folder {tmp_dir}, which could not be removed"
        else:
            removed = f"; its partial folder {os.path.basename(tmp_dir)} was removed"
        where = f"the checkpoint of step {step} could not be saved in trainer.save_checkpoint_path={self.root}"
        if not is_disk_full(failure):
            return f"{where} ({type(failure).__name__}: {failure}){removed}."
        try:
            usage = shutil.disk_usage(self.root)
            space = f", {_size(usage.free)} free of {_size(usage.total)} there"
        except OSError:
            space = ""
        return (
            f"{where}: the disk is full ({failure}){space}{removed}. Free space there (a lower trainer.save_limit "
            "keeps fewer checkpoints) before rerunning."
        )

    def _write_latest_pointer(self, step: int) -> None:
        pointer = os.path.join(self.root, LATEST_POINTER_FILE)
        replace_file(pointer, f"{step}\n")
        _fsync_dir(self.root)

    def _rotate(self, keep: str) -> None:
        if self.save_limit is None or self.save_limit <= 0:
            return
        checkpoints = [path for _, path in checkpoints_by_save_time(self.root) if path != keep]
        excess = len(checkpoints) + 1 - self.save_limit
        for path in checkpoints[: max(excess, 0)]:
            _remove_checkpoint(path, self.root)


def write_failure(error: BaseException) -> BaseException | None:
    """The failed write behind an error raised during a save, or None when it is not one: an OSError, or a
    RuntimeError (what torch's file writer raises when a write falls short), unwrapped from Ray's RayTaskError (a
    worker's) and from torch.distributed.checkpoint's CheckpointException (the first failed rank's). A worker that
    died (WorkerDiedError, a RuntimeError too) is not a failed write: the run restarts or names the worker."""
    from ray.exceptions import RayTaskError
    from torch.distributed.checkpoint.api import CheckpointException

    from ..controller.worker_group import WorkerDiedError

    if isinstance(error, RayTaskError):
        error = error.cause
    if isinstance(error, CheckpointException) and error.failures:
        error = next(iter(error.failures.values()))[0]  # rank -> (exception, traceback)
    if isinstance(error, WorkerDiedError) or not isinstance(error, OSError | RuntimeError):
        return None
    return error


# torch's zip writer (torch.save, and DCP's files) says only this when the disk took fewer bytes than it wrote
_SHORT_WRITE = "unexpected pos"


def is_disk_full(error: BaseException) -> bool:
    """Whether a failed write ran out of space (or quota)."""
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return _SHORT_WRITE in str(error) or os.strerror(errno.ENOSPC) in str(error)


def _size(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


# ----------------------------------------------------------------------------------------------------------------------
# random number generator state (each process saves its own)
# ----------------------------------------------------------------------------------------------------------------------
def get_rng_state() -> dict:
    """This process's Python, numpy, torch CPU and (where there is one) accelerator RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if device.is_cuda_available():
        state["device"] = torch.get_device_module(device.get_device_name()).get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "device" in state and device.is_cuda_available():
        torch.get_device_module(device.get_device_name()).set_rng_state(state["device"])


def rng_state_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rng_state_rank_{rank}.json")


def save_rng_state(folder: str, rank: int) -> str:
    os.makedirs(folder, exist_ok=True)
    path = rng_state_file(folder, rank)
    save_state(path, get_rng_state())
    return path


def load_rng_state(folder: str, rank: int) -> None:
    set_rng_state(load_state(rng_state_file(folder, rank)))

"""Checkpoint folders that are atomic, rotated and easy to find again.

Layout under ``trainer.save_checkpoint_path``::

    global_step_<N>/
        actor/ critic/ ...        model + optimizer state (torch.distributed.checkpoint), written by the workers
        dataloader_state.json     the driver's dataloader position
        trainer_state.json        {"global_step": N, "epoch", "kl_coef", "metrics": the step's metrics row}
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

import logging
import os
import random
import re
import shutil
import time
from typing import Any

import numpy as np
import torch

from easyrl.utils import device
from easyrl.utils.files import replace_file
from easyrl.utils.state_file import load_state, save_state


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
_STEP_DIR_PATTERN = re.compile(rf"^{STEP_DIR_PREFIX}(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or resumed; the message says which folder and what to do."""


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

    ``trainer.load_checkpoint_path`` wins; otherwise, with ``trainer.find_last_checkpoint``, the newest complete
    checkpoint under ``trainer.save_checkpoint_path``.
    """
    trainer = getattr(config, "trainer", config)
    if trainer.load_checkpoint_path:
        path = os.path.abspath(trainer.load_checkpoint_path)
        if not os.path.isdir(path):
            raise CheckpointError(f"trainer.load_checkpoint_path={path} does not exist.")
        if not is_complete_checkpoint(path):
            last = find_last_checkpoint(path)
            hint = f" It holds checkpoints: did you mean {last}?" if last else ""
            raise CheckpointError(
                f"trainer.load_checkpoint_path={path} is not a complete checkpoint (no {COMPLETE_MARKER} marker: "
                f"the save was interrupted, or it is not a {STEP_DIR_PREFIX}N folder).{hint} Point it at a "
                f"complete {STEP_DIR_PREFIX}N folder, or unset it to resume from the newest one."
            )
        return path
    if trainer.find_last_checkpoint:
        return find_last_checkpoint(trainer.save_checkpoint_path)
    return None


def warn_of_config_changes(answers: list, section: str, step: int) -> None:
    """Say which optimizer settings of ``section`` (e.g. "worker.actor.optim") this run's config changed since the
    checkpoint of ``step``; ``answers``: the workers' ``load_checkpoint`` answers (every rank's are the same)."""
    for name, saved, configured in (answers[0] if answers else None) or []:
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


def model_only_error(path: str, what: str = "training") -> CheckpointError:
    """The error for resuming from a checkpoint saved with trainer.save_model_only=true."""
    return CheckpointError(
        f"{path} holds no dataloader or optimizer state (saved with trainer.save_model_only=true): {what} cannot "
        "resume from it. Start afresh in a new trainer.save_checkpoint_path (or delete that folder), or turn it into a "
        "model with `easyrl merge`."
    )


def check_resume_point(config: Any, what: str = "training") -> str | None:
    """``resolve_resume_path``, checked before Ray starts: a checkpoint a run can resume from, or a fresh start in a
    folder without an earlier run's checkpoints (whose saves would mix with this run's, `trainer.save_limit` deleting
    them by step number, and whose metrics.jsonl rows this run would drop)."""
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
    if load_dataloader_state(path) is None:
        raise model_only_error(path, what)
    _warn_of_later_steps(trainer, path)
    return path


def _warn_of_later_steps(trainer: Any, path: str) -> None:
    """A run resumed from an earlier step of its own folder branches off: name the later checkpoints it leaves
    behind, and that its saves of the same steps replace them."""
    step = checkpoint_step(path)
    root = os.path.abspath(trainer.save_checkpoint_path) if trainer.save_checkpoint_path else None
    later = [name for at, name in list_checkpoints(root) if at > step] if root else []
    if later and os.path.dirname(path) == root:
        logger.warning(
            "Resuming from step %d of %s, which also holds later checkpoints (%s) of the run that went on from it: "
            "this run's saves of the same steps replace them, and a rerun resumes from whichever was saved last.",
            step,
            root,
            ", ".join(os.path.basename(folder) for folder in later[-3:]),
        )


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

    def __init__(self, save_checkpoint_path: str, save_limit: int = -1) -> None:
        self.root = os.path.abspath(save_checkpoint_path)
        self.save_limit = save_limit

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
        save_state(os.path.join(tmp_dir, TRAINER_STATE_FILE), {"global_step": step, **(trainer_state or {})})
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

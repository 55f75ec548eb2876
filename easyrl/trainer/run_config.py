"""The resolved config of a run, kept in its folder (``<trainer.save_checkpoint_path>/config.yaml``), so that a run
can be read back and repeated from its folder alone whatever its loggers, and a resume that changes settings says
which.

Each start writes the config it runs with. When the folder holds an earlier start's config that differs (a resume
with a new ``trainer.max_steps``, ``worker.rollout.n`` or learning rate), that one is kept as ``config.<n>.yaml``
(numbered from 1 in order) and a warning names the keys that changed, old and new values.
"""

import logging
import os

import yaml

from ..utils.files import replace_file
from .loggers.base import flatten_dict


logger = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
# a trainer.val_only look at a run's checkpoint keeps its config beside the run's, not in place of it: the folder's
# config.yaml still repeats the training run
VAL_ONLY_CONFIG_FILE = "val_only_config.yaml"
# changed keys named in the warning (all of them are in the two files)
CHANGES_NAMED = 8


def config_changes(before: dict, after: dict) -> list[str]:
    """``"key: old -> new"`` for each dotted key a user sets whose value differs (a key only one side has counts as
    null there); the keys derived from others (e.g. per-device batch sizes) follow them and are left out."""
    from ..config.load import DERIVED_KEYS

    old, new = flatten_dict(before), flatten_dict(after)
    return [
        f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key) and key not in DERIVED_KEYS
    ]


# keys a resume does not apply, and why (a checkpoint's state holds what they set at the start)
KEPT_ON_RESUME = {
    "data.seed": "the shuffled order goes on as the checkpoint saved it (its random state is part of the data "
    "position); the new seed does not apply",
    "data.rollout_batch_size": "the checkpoint's step number counts batches of the old size, and the steps left to "
    "trainer.total_epochs are counted in the new one from it, so the run makes more or fewer passes over the data "
    "than total_epochs says; set trainer.max_steps to say where it ends",
}


def record_run_config(
    run_dir: str, config_yaml: str, what: str = "run", resumed_from: str | None = None, val_only: bool = False
) -> list[str]:
    """Write ``config_yaml`` (the resolved config, as ``config_to_yaml`` gives it) to ``<run_dir>/config.yaml``
    (``val_only``: to ``val_only_config.yaml``); an earlier start's that differs is kept beside it. The changes
    announced are those since the config the checkpoint it resumes (``resumed_from``) was trained with, where that
    checkpoint holds a copy of it (a start that failed before its first save left its own config in the folder), else
    since the folder's. Returns the changes."""
    os.makedirs(run_dir, exist_ok=True)
    name = VAL_ONLY_CONFIG_FILE if val_only else CONFIG_FILE
    path = os.path.join(run_dir, name)
    earlier_text = _read(path)
    trained_with = _read(os.path.join(resumed_from, CONFIG_FILE)) if resumed_from and not val_only else None
    config = _parse(config_yaml)
    since_folder = config_changes(_parse(earlier_text), config) if earlier_text is not None else []
    kept = None
    if since_folder:
        stem = name.removesuffix(".yaml")
        number = 1
        while os.path.exists(os.path.join(run_dir, f"{stem}.{number}.yaml")):
            number += 1
        kept = os.path.join(run_dir, f"{stem}.{number}.yaml")
        replace_file(kept, earlier_text)
    changes = config_changes(_parse(trained_with), config) if trained_with is not None else since_folder
    if changes:
        shown = "; ".join(changes[:CHANGES_NAMED])
        more = f"; and {len(changes) - CHANGES_NAMED} more" if len(changes) > CHANGES_NAMED else ""
        if trained_with is not None:
            since = f"the one its checkpoint {os.path.basename(resumed_from)} was trained with"
        else:
            since = f"the one the last {what} in {run_dir} ran with"
        where = f" (the folder's earlier config is kept as {os.path.basename(kept)})" if kept else ""
        notes = "".join(
            f" {key}: {why}." for key, why in KEPT_ON_RESUME.items() if resumed_from and _changed(key, changes)
        )
        logger.warning(
            "This %s's config differs from %s%s in %d key(s): %s%s.%s",
            what,
            since,
            where,
            len(changes),
            shown,
            more,
            notes,
        )
    replace_file(path, config_yaml)
    return changes


def checkpoint_config(path: str) -> dict:
    """The config the checkpoint at ``path`` was trained with (its config.yaml); empty when it has none."""
    text = _read(os.path.join(path, CONFIG_FILE))
    return _parse(text) if text else {}


def _read(path: str) -> str | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _parse(text: str) -> dict:
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return {}


def _changed(key: str, changes: list[str]) -> bool:
    return any(change.startswith(f"{key}: ") for change in changes)

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


def record_run_config(run_dir: str, config_yaml: str, what: str = "run") -> list[str]:
    """Write ``config_yaml`` (the resolved config, as ``config_to_yaml`` gives it) to ``<run_dir>/config.yaml``; an
    earlier start's that differs is kept beside it and its changes are announced. Returns the changes."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, CONFIG_FILE)
    changes: list[str] = []
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            earlier_text = handle.read()
        try:
            earlier = yaml.safe_load(earlier_text) or {}
        except yaml.YAMLError:
            earlier = {}
        changes = config_changes(earlier, yaml.safe_load(config_yaml) or {})
        if changes:
            number = 1
            while os.path.exists(os.path.join(run_dir, f"config.{number}.yaml")):
                number += 1
            kept = os.path.join(run_dir, f"config.{number}.yaml")
            replace_file(kept, earlier_text)
            shown = "; ".join(changes[:CHANGES_NAMED])
            more = f"; and {len(changes) - CHANGES_NAMED} more" if len(changes) > CHANGES_NAMED else ""
            logger.warning(
                "This %s's config differs from the one the last %s in %s ran with (kept as %s) in %d key(s): %s%s.",
                what,
                what,
                run_dir,
                os.path.basename(kept),
                len(changes),
                shown,
                more,
            )
    replace_file(path, config_yaml)
    return changes

"""Paths of a config: files easyrl ships under EasyR1's names, and local paths made absolute."""

import os
from pathlib import Path
from typing import Optional


BUILTIN_PREFIX = "builtin://"
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent


def resolve_shipped_file(path: Optional[str], folder: str) -> Optional[str]:
    """Map a missing EasyR1-style path (e.g. ./examples/reward_function/math.py) to the file easyrl ships.

    EasyR1 keeps its reward modules and templates under examples/; easyrl ships the same names at the top level
    (reward_function/, format_prompt/), so configs written for EasyR1 run unchanged.
    """
    if not path:
        return path
    file, sep, fn = path.partition(":")
    if Path(file).expanduser().exists():
        return path
    shipped = PROJECT_ROOT / folder / Path(file).name
    return str(shipped) + sep + fn if shipped.is_file() else path


def absolute_if_local(path: Optional[str]) -> Optional[str]:
    """An existing local path made absolute (workers run in other folders); hub ids and built-ins unchanged."""
    if path and not path.startswith(BUILTIN_PREFIX) and os.path.exists(os.path.expanduser(path)):
        return os.path.abspath(os.path.expanduser(path))
    return path


def looks_local(path: str) -> bool:
    """A hub id is `org/name`; anything absolute, relative-dotted or deeper is a local path."""
    return path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or os.sep == "\\"

"""Paths a run refers to: files easyrl ships under EasyR1's names, built-in ids, local paths made absolute."""

import logging
import os
from pathlib import Path
from typing import Optional


logger = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin://"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip")


def unreadable_suffix_hint(name: str) -> str:
    """What to do with a data file of a kind the readers do not take (a compressed one: decompress it)."""
    if name.lower().endswith(COMPRESSED_SUFFIXES):
        return f" Decompress it first (e.g. `gunzip {name}` for a .gz file) and give the data file it holds."
    return ""


# Files easyrl ships under the names of EasyR1's examples/ files AND with their contract: the reward functions give
# the same scores under the same keys on the same inputs, the templates have the same text. A missing EasyR1 path
# to one of them is served by easyrl's copy, with a warning. Other shipped files (arithmetic.*) are easyrl's own.
EASYR1_EQUIVALENTS = {
    "reward_function": ("math.py", "r1v.py", "dapo.py", "android_gui.py"),
    "format_prompt": ("math.jinja", "r1v.jinja", "dapo.jinja", "android_gui.jinja"),
}
_CONFIG_KEYS = {
    "reward_function": "worker.reward.reward_function",
    "format_prompt": "data.format_prompt",
    "tools": "worker.rollout.multi_turn.tools",
}


def shipped_files(folder: str) -> list[str]:
    """Names of the files easyrl ships in `folder` (reward_function or format_prompt)."""
    root = PROJECT_ROOT / folder
    return sorted(p.name for p in root.iterdir() if p.suffix in (".py", ".jinja")) if root.is_dir() else []


def shipped_files_hint(folder: str) -> str:
    """One sentence for a missing-file error: where easyrl's own files of this kind are and which match EasyR1."""
    files = shipped_files(folder)
    if not files:
        return ""
    same = [name for name in files if name in EASYR1_EQUIVALENTS.get(folder, ())]
    hint = f"easyrl ships {', '.join(files)} in {PROJECT_ROOT / folder}"
    if same:
        hint += f" ({', '.join(same)} with the contract of EasyR1's examples/{folder}/ files of the same names)"
    return hint + "."


FUNCTION_SEPARATOR = ","  # a reward spec `path.py:f,g` names several functions of one file, combined


def names_functions(suffix: str) -> bool:
    """``suffix`` (what follows a spec's last `:`) names one function, or several joined by FUNCTION_SEPARATOR (spaces
    around the names allowed: `f.py:a, b`)."""
    return all(part.strip().isidentifier() for part in suffix.split(FUNCTION_SEPARATOR))


def _split_function(path: str, folder: str) -> tuple[str, str]:
    """(file, `:function` suffix or ""); reward specs carry functions, environment specs (tools/) a class."""
    if folder in ("reward_function", "tools"):
        file, sep, name = path.rpartition(":")
        if sep and names_functions(name):
            return file, sep + name
    return path, ""


# what EasyR1's first releases called the folders (examples/score_function/math.py)
EARLIER_FOLDER_NAMES = {"reward_function": ("score_function",)}


def resolve_shipped_file(path: Optional[str], folder: str, key: Optional[str] = None) -> Optional[str]:
    """An existing path made absolute, or a missing EasyR1-style path served by the file easyrl ships, announced.

    EasyR1 configs name `./examples/reward_function/math.py` or `./examples/format_prompt/math.jinja`; easyrl ships
    files of the same names at the top level (reward_function/, format_prompt/). A missing path is replaced only
    when its folder is named `folder` (as in both layouts) and easyrl ships a file of that name, and the
    replacement is logged as a warning with both paths. Any other missing path is returned unchanged, for the
    config check to report (with `shipped_files_hint`). The example tool files (tools/) are served the same way, so
    that an example config runs from any folder. ``key``: the config key named in the warning (default: the
    folder's).
    """
    if not path:
        return path
    file, function = _split_function(path, folder)
    local = Path(file).expanduser()
    if local.exists():
        return str(local.resolve()) + function
    shipped = PROJECT_ROOT / folder / local.name
    if local.parent.name not in (folder, *EARLIER_FOLDER_NAMES.get(folder, ())) or not shipped.is_file():
        return path
    if local.name in EASYR1_EQUIVALENTS.get(folder, ()):
        what = f"the same contract as EasyR1's examples/{folder}/{local.name}"
    elif folder in EASYR1_EQUIVALENTS:
        what = "easyrl's own file; EasyR1 has none of this name"
    else:
        what = "easyrl's example"
    logger.warning(
        "%s: %s does not exist; using the file easyrl ships, %s (%s).",
        key or _CONFIG_KEYS[folder],
        file,
        shipped,
        what,
    )
    return str(shipped) + function


def absolute_if_local(path: Optional[str]) -> Optional[str]:
    """An existing local path made absolute (workers run in other folders); hub ids and built-ins unchanged."""
    if path and not path.startswith(BUILTIN_PREFIX) and os.path.exists(os.path.expanduser(path)):
        return os.path.abspath(os.path.expanduser(path))
    return path


def looks_local(path: str) -> bool:
    """A hub id is `org/name`; anything absolute, relative-dotted or deeper is a local path."""
    return path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or os.sep == "\\"

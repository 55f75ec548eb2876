"""Where rows come from: files, saved datasets, hub datasets and the built-in generators, as a ``datasets.Dataset``.

data.jsonl / data.json / data.parquet      one file
path/to/folder                             a folder written by ``Dataset.save_to_disk`` (or of data files)
path/to/folder@test, name@split            a split of a saved DatasetDict, of a data folder, or of a hub dataset
builtin://arithmetic@train                 a generator shipped with easyrl
"""

import os
from pathlib import Path

import datasets

from .synthetic import BUILTIN_PREFIX, load_builtin


FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def split_path(path: str) -> tuple[str, str | None]:
    """``"base@split"`` -> ``("base", "split")``; a path that exists as written keeps its ``@``."""
    if "@" in path and not os.path.exists(path):
        base, split = path.rsplit("@", 1)
        return base, split or None
    return path, None


def _from_saved(folder: Path, split: str | None, config_key: str) -> datasets.Dataset:
    loaded = datasets.load_from_disk(str(folder))
    if isinstance(loaded, datasets.DatasetDict):
        if split is None:
            split = "train" if "train" in loaded else next(iter(loaded))
        if split not in loaded:
            raise ValueError(f"{config_key}: {str(folder)!r} has no split {split!r}; it has {sorted(loaded)}.")
        return loaded[split]
    return loaded


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or Path(path).suffix.lower() in FILE_BUILDERS


def load_rows(path: str, config_key: str = "data.train_files") -> datasets.Dataset:
    """The rows at ``path`` (see the module docstring for the accepted forms)."""
    if not path:
        raise ValueError(f"{config_key} is empty; point it at a .jsonl/.json/.parquet file or a dataset folder.")
    if path.startswith(BUILTIN_PREFIX):
        return datasets.Dataset.from_list(load_builtin(path))
    base, split = split_path(path)
    local = Path(base).expanduser()
    if local.is_dir():
        if (local / "dataset_info.json").exists() or (local / "dataset_dict.json").exists():
            return _from_saved(local, split, config_key)
        return datasets.load_dataset(str(local), split=split or "train")
    if local.is_file():
        builder = FILE_BUILDERS.get(local.suffix.lower())
        if builder is None:
            raise ValueError(
                f"{config_key}: cannot read {base!r}; use one of {', '.join(FILE_BUILDERS)} or a dataset folder."
            )
        return datasets.load_dataset(builder, data_files=str(local), split="train")
    if _looks_local(base):
        raise FileNotFoundError(f"{config_key}: {base!r} does not exist.")
    try:
        return datasets.load_dataset(base, split=split or "train")
    except Exception as error:  # the hub client raises many types (connection, missing repo, missing split)
        raise FileNotFoundError(
            f"{config_key}: {path!r} is neither a local file/folder nor a loadable hub dataset ({error})."
        ) from error

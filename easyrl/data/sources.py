"""Where rows come from: files, saved datasets, hub datasets and the built-in generators, as a ``datasets.Dataset``.

data.jsonl / data.json / data.parquet      one file
path/to/folder                             a folder written by ``Dataset.save_to_disk``, or of data files
path/to/folder@test, name@split            a split of a saved DatasetDict, of a data folder, or of a hub dataset
data.jsonl@train[:N], folder@test[:N%]     a split's first N rows (or N percent of them)
builtin://arithmetic@train                 a generator shipped with easyrl

A folder with several splits read without ``@split`` gives its `train` split (else its first), as EasyR1's
``file@split`` does, and says so in a warning naming the others.

A folder of data files is read file by file, each checked and read as a single file would be, and the files joined
in file-name order. Its splits are those ``datasets`` names from the file names (train-0.jsonl, data/test.csv; with
none named, every file is "train"); files of other types (pictures beside the rows, a README) are not rows, and the
data files must be of one kind (.jsonl and .json are one). A folder whose README.md declares configs (a hub dataset
repository) is read by ``datasets``, as its card says.

A data file is read whole before anything else starts, and what cannot be read is an error naming the config key,
the file and (where there is one) the line: a file with no rows; a byte that is not UTF-8 in a .jsonl/.json/.csv file
(the readers take UTF-8 only; an error, not a skipped row, because such a byte almost always means the whole file is
in another encoding); a line of a .jsonl file that is not JSON. CSV cells are read as the text they hold (an answer
`06` stays "06", not the number 6.0), an empty cell as null. A JSON field whose values mix types across rows (chat
messages whose content is text in one row and a list of parts in another; an answer that is a number here and text
there) holds each value as written: the text "3" stays text (see ``_reread_mixed_json``).
"""

import csv
import json
import logging
import os
import re
from functools import lru_cache
from pathlib import Path

import datasets
import numpy as np

from ..paths import COMPRESSED_SUFFIXES, unreadable_suffix_hint
from .synthetic import BUILTIN_PREFIX, load_builtin


logger = logging.getLogger(__name__)


FILE_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".arrow": "arrow",
    ".feather": "arrow",  # Feather v2 is the Arrow IPC file format
}
TEXT_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")
# Bytes read at a time when checking that a text file is UTF-8.
CHECK_BLOCK_BYTES = 1 << 24


def split_path(path: str) -> tuple[str, str | None]:
    """``"base@split"`` -> ``("base", "split")``; a path that exists as written keeps its ``@``."""
    if "@" in path and not os.path.exists(path):
        base, split = path.rsplit("@", 1)
        return base, split or None
    return path, None


# `@split[:N]` / `@split[:N%]`: a split's first N rows (N a count or a percentage). The slice is read by `datasets`
# (its ReadInstruction, which `load_dataset` applies to a file's split), for a single file as for a folder's split.
SPLIT_SLICE = re.compile(r"(?P<name>.*?)\s*(?P<first>\[\s*:\s*-?\d+%?\s*\])?")


def parse_split(split: str) -> tuple[str, str]:
    """(the split's name, its first-rows slice ``[:N]`` / ``[:N%]`` without spaces, or "") of ``@split``; a bracket of
    another kind (``[5:]``) stays part of the name."""
    match = SPLIT_SLICE.fullmatch(split.strip())
    return match["name"], re.sub(r"\s", "", match["first"] or "")


# the splits that hold rows kept out of training
HELD_OUT_SPLITS = ("test", "validation", "val")


@lru_cache(maxsize=64)
def _warn_split_chosen(config_key: str, folder: str, chosen: str, available: tuple[str, ...]) -> None:
    """Once per source: a folder with several splits read without ``@split`` gives one of them, which the user should
    know (for validation, the training rows when its held-out split was meant)."""
    others = [name for name in available if name != chosen]
    held_out = next((name for name in HELD_OUT_SPLITS if name in others), None)
    on_training_rows = (
        f" Validation then runs on the training rows, though the folder has a {held_out!r} split "
        f"({folder}@{held_out})."
        if config_key == "data.val_files" and chosen == "train" and held_out
        else ""
    )
    logger.warning(
        "%s: %r has the splits %s and no `@split` was given, so %r is read, not %s. Choose one with `%s@<split>`.%s",
        config_key,
        folder,
        ", ".join(repr(name) for name in available),
        chosen,
        " or ".join(repr(name) for name in others),
        folder,
        on_training_rows,
    )


def _pick_split(available: list[str], split: str | None, folder: Path, config_key: str) -> str:
    """``split`` (a name, without its slice) when the folder has it; with none asked for, "train", else the folder's
    first split (EasyR1's ``file@split`` defaults to train), said in a warning when there were others."""
    if split is None:
        split = "train" if "train" in available else available[0]
        if len(available) > 1:
            _warn_split_chosen(config_key, str(folder), split, tuple(sorted(available)))
    if split not in available:
        _refuse_other_slices(split, folder, config_key)
        raise ValueError(f"{config_key}: {str(folder)!r} has no split {split!r}; it has {sorted(available)}.")
    return split


def _refuse_other_slices(name: str, where: Path, config_key: str) -> None:
    """A bracket after a local split's name other than its first rows (``[5:]``, ``[10:20]``) is refused by name: it
    would read as a split called ``train[5:]``, which no file or folder has. Only first rows keep each row's place in
    a folder's files (the row named in a warning is the one in the file)."""
    match = re.fullmatch(r"(?P<split>[^\[\]]*?)\s*(?P<bracket>\[.*\])", name)
    if match:
        split = match["split"] or "train"
        raise ValueError(
            f"{config_key}: `@{name}` of {str(where)!r}: a local split is read whole or by its first rows, "
            f"`@{split}[:N]` or `@{split}[:N%]`, not `{match['bracket']}`. Write the rows you want to a file of "
            "their own."
        )


def _first_rows(rows: datasets.Dataset, split: str, first: str, folder: Path, config_key: str) -> datasets.Dataset:
    """The rows of ``split`` that its slice ``first`` keeps (all of them for ""), read as `datasets` reads the same
    slice of a data file's split."""
    if not first:
        return rows
    try:  # the split's own name may be one `datasets` does not take for a split: the slice is read on a stand-in
        (kept,) = datasets.ReadInstruction.from_spec(f"rows{first}").to_absolute({"rows": len(rows)})
    except ValueError as error:  # a percentage beyond 100
        raise ValueError(f"{config_key}: `@{split}{first}` of {str(folder)!r}: {error}") from None
    if kept.to <= kept.from_:
        raise ValueError(
            f"{config_key}: `@{split}{first}` keeps none of the {len(rows)} rows of the split {split!r} of "
            f"{str(folder)!r}; give a larger N."
        )
    return rows.select(range(kept.from_, kept.to))


def _from_saved(folder: Path, split: str | None, config_key: str) -> datasets.Dataset:
    loaded = datasets.load_from_disk(str(folder))
    name, first = parse_split(split) if split is not None else (None, "")
    if isinstance(loaded, datasets.DatasetDict):
        name = _pick_split(list(loaded), name, folder, config_key)
        return _first_rows(loaded[name], name, first, folder, config_key)
    return _first_rows(loaded, name or "train", first, folder, config_key)  # one Dataset: its rows are its split


def check_text_file(path: Path, config_key: str) -> None:
    """Raise ValueError when a .jsonl/.json/.csv file holds nothing but whitespace, or a byte that is not UTF-8 (named
    by line and byte column, both counted from 1): the readers would otherwise end in a bare StopIteration, or load the
    byte and fail only when its row is drawn."""
    line, has_text, carry = 1, False, b""
    with open(path, "rb") as file:
        while True:
            block = file.read(CHECK_BLOCK_BYTES)
            data = carry + block
            if not data:
                break
            carry = b""
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as error:
                split_at_block_end = block and error.reason == "unexpected end of data" and error.end == len(data)
                if not split_at_block_end:
                    bad = error.start
                    if line == 1 and bad == 0 and data[:2] in (b"\xff\xfe", b"\xfe\xff"):
                        raise ValueError(
                            f"{config_key}: {path} is UTF-16 (it starts with a UTF-16 byte-order mark, as Excel's "
                            f"'Unicode text' files do); the {path.suffix} reader takes UTF-8 only. Re-encode it, e.g. "
                            f"`iconv -f utf-16 -t utf-8 {path.name} > fixed{path.suffix}`, or save it as UTF-8."
                        ) from None
                    bad_line = line + data.count(b"\n", 0, bad)
                    column = bad - data.rfind(b"\n", 0, bad)  # rfind is -1 on the first line: columns count from 1
                    raise ValueError(
                        f"{config_key}: {path} line {bad_line}, byte {column}: 0x{data[bad]:02x} is not UTF-8 (the "
                        f"{path.suffix} reader takes UTF-8 only). Re-encode the file, e.g. `iconv -f latin1 -t utf-8 "
                        f"{path.name} > fixed{path.suffix}`, or fix that line."
                    ) from None
                carry, data = data[error.start :], data[: error.start]  # a character cut in two by the block's end
            line += data.count(b"\n")
            has_text = has_text or bool(data.strip())
    if not has_text:
        raise ValueError(f"{config_key}: {path} has no rows (the file is empty); point {config_key} at a data file.")


def _first_bad_json_line(path: Path) -> str:
    """' (line N: why)' for the first line of a .jsonl file that is not a JSON object, else ''."""
    with open(path, encoding="utf-8") as file:
        for number, text in enumerate(file, 1):
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as error:
                return f" (line {number}: {error.msg} at column {error.colno})"
            if not isinstance(value, dict):
                return f" (line {number}: a {type(value).__name__}, not an object of column: value pairs)"
    return ""


def _innermost_message(error: BaseException) -> str:
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    return f"{type(error).__name__}: {error}"


def _reader_options(local: Path) -> dict:
    """CSV / TSV: every column as text; the reader would otherwise guess numbers (and turn a column with a gap into
    floats)."""
    if local.suffix.lower() not in (".csv", ".tsv"):
        return {}
    delimiter = "\t" if local.suffix.lower() == ".tsv" else ","
    with open(local, newline="", encoding="utf-8-sig") as file:  # the reader drops a byte-order mark too
        header = next(csv.reader(file, delimiter=delimiter), [])
    options = {"features": datasets.Features({name: datasets.Value("string") for name in header})}
    return {**options, "delimiter": delimiter} if delimiter != "," else options


def _check_columnar_json(local: Path, rows: datasets.Dataset, config_key: str) -> None:
    """A .json file holding one object whose fields are equally long lists or objects is a table written by columns
    (pandas' ``DataFrame.to_json()`` default, ``{"col": {"0": v, ...}}``, or ``{"col": [v, ...]}``): the reader
    makes it one row whose values are whole columns."""
    if local.suffix.lower() != ".json" or len(rows) != 1:
        return
    values = list(rows[0].values())
    scalar = (str, int, float, bool, type(None))
    by_index = all(isinstance(v, dict) for v in values) and len({tuple(v) for v in values}) == 1  # pandas' index
    by_list = all(isinstance(v, list) and all(isinstance(item, scalar) for item in v) for v in values)
    sizes = {len(value) for value in values} if by_index or by_list else set()
    if len(sizes) != 1 or min(sizes) < 2:
        return
    with open(local, encoding="utf-8-sig") as file:
        if file.read(4096).lstrip()[:1] != "{":
            return
    raise ValueError(
        f"{config_key}: {local} holds one JSON object whose fields are columns of {sizes.pop()} values each (a table "
        "written by columns, pandas' DataFrame.to_json() default), which reads as a single row. Write it as rows: "
        "a .jsonl file (df.to_json(path, orient='records', lines=True)) or a JSON list of row objects "
        "(orient='records')."
    )


def _file_split(split: str | None, local: Path, config_key: str) -> tuple[str, str]:
    """(the split to read of one data file, its first-rows slice or ""): its rows are the split `train`, whose first
    rows `train[:N]` are (see ``SPLIT_SLICE``); another name would be read as all of them."""
    if split is None:
        return "train", ""
    name, first = parse_split(split)
    _refuse_other_slices(name, local, config_key)
    if name == "train":
        return name, first
    raise ValueError(
        f"{config_key}: {local} is one data file, whose rows are its only split `train`, and `@{split}` asks for "
        "another. Drop it, or give `@train[:N]` (or `@train[:N%]`) for the file's first rows; a folder of data "
        "files names its splits by file name (`train-*.jsonl`, `test-*.jsonl`)."
    )


def _from_file(local: Path, builder: str, config_key: str, split: str | None = None) -> datasets.Dataset:
    split, first = _file_split(split, local, config_key)
    if local.suffix.lower() in TEXT_SUFFIXES:
        check_text_file(local, config_key)
    elif local.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        if pq.ParquetFile(local).metadata.num_rows == 0:  # the reader fails on it with "BatchSize must be > 0"
            raise ValueError(f"{config_key}: {local} has no rows; point {config_key} at a data file.")
    try:
        rows = datasets.load_dataset(builder, data_files=str(local), split=split, **_reader_options(local))
    except Exception as error:  # the readers raise many types (ArrowInvalid, DatasetGenerationError, ValueError)
        if "corresponds to no data" in str(error):  # a CSV header alone, a JSON file holding []
            raise ValueError(f"{config_key}: {local} has no rows; point {config_key} at a data file.") from None
        where = _first_bad_json_line(local) if local.suffix.lower() == ".jsonl" else ""
        raise ValueError(
            f"{config_key}: cannot read {local} as {builder}{where}: {_innermost_message(error)}"
        ) from error
    if len(rows) == 0:
        raise ValueError(f"{config_key}: {local} has no rows; point {config_key} at a data file.")
    if builder == "json":
        _check_columnar_json(local, rows, config_key)
        rows = _reread_mixed_json(local, rows)
    return _first_rows(_without_pandas_index(rows, local), split, first, local, config_key)


def _without_pandas_index(rows: datasets.Dataset, local: Path) -> datasets.Dataset:
    """The rows without the ``__index_level_N__`` columns pandas writes for a frame's own index (``to_parquet`` of an
    indexed or filtered frame): they are no data, yet a TRL-style reward would get them as a keyword and generate's
    rows would carry them. Their removal is said."""
    index = [name for name in rows.column_names if re.fullmatch(r"__index_level_\d+__", name)]
    if index:
        logger.info("%s: left out the pandas index column(s) %s (the frame's index, not data).", local, index)
        rows = rows.remove_columns(index)
    return rows


def _encode_at(value, path: list) -> object:
    """``value`` with the field at ``path`` (a list step is 0) written as JSON text; nulls stay null."""
    if value is None:
        return None
    if not path:
        return json.dumps(value, ensure_ascii=False)
    step, rest = path[0], path[1:]
    if step == 0:
        return [_encode_at(item, rest) for item in value] if isinstance(value, list) else value
    return {**value, step: _encode_at(value.get(step), rest)} if isinstance(value, dict) else value


def _reread_mixed_json(local: Path, rows: datasets.Dataset) -> datasets.Dataset:
    """The rows again, with each mixed-type field as written.

    The JSON reader gives a field that mixes types across rows (a string here, a list or a number there) the ``Json``
    type, and takes every string of it that parses as JSON for JSON already encoded: the answer "3" came back as the
    number 3, "null" as a missing value, "1e3" as 1000.0. The file is read again here and those fields are written as
    JSON text by ``json.dumps`` before the same features decode them, so each value comes back as it was written.
    A column of numbers that mixes integers with decimals (or holds an integer too large for 64 bits) comes back as
    floats from the reader: the answer 2 as 2.0, which a reward comparing text never matches, and the big integer
    with its digits lost. Such a column is read again the same way, each number as written (an integer beyond 64 bits
    as the text of its digits).
    Files without such fields are returned as read."""
    from datasets.features import Json
    from datasets.utils.json import get_json_field_paths_from_feature

    paths = get_json_field_paths_from_feature(rows.features)
    floats = [
        name
        for name, feature in rows.features.items()
        if isinstance(feature, datasets.Value) and feature.dtype in ("float64", "float32", "float16")
    ]
    if not paths and not floats:
        return rows
    with open(local, encoding="utf-8-sig") as file:
        if local.suffix.lower() == ".jsonl":
            records = [json.loads(line) for line in file if line.strip()]
        else:
            records = json.load(file)
    if isinstance(records, list):
        records = records[: len(rows)]  # `@train[:N]` read the first N
    if not isinstance(records, list) or len(records) != len(rows) or not all(isinstance(r, dict) for r in records):
        return rows  # a layout the reader turned into rows some other way: left as read
    features = rows.features.copy()
    for name in floats:  # integers the reader made floats
        if any(type(record.get(name)) is int for record in records):
            features[name] = Json()
            paths.append([name])
    if not paths:
        return rows
    for path in paths:
        records = [_encode_at(record, path) for record in records]
    columns = {name: [record.get(name) for record in records] for name in features}
    return datasets.Dataset.from_dict(columns, features=features)


def _declares_configs(folder: Path) -> bool:
    """Whether the folder's README.md declares configs, as a hub dataset repository's does: they, not the file names,
    pick its files, splits and reader options (read by file names, the files of all its configs would be rows)."""
    from huggingface_hub import DatasetCard

    card = folder / "README.md"
    return card.is_file() and bool(DatasetCard.load(card).data.get("configs"))


def _split_files(folder: Path, config_key: str) -> dict[str, list[Path]]:
    """Split name -> the folder's data files, in file-name order, the splits named by ``datasets``'s own rules."""
    from datasets.data_files import DataFilesDict, EmptyDatasetError, get_data_patterns

    base = folder.resolve()
    try:
        patterns = get_data_patterns(base.as_posix())
    except EmptyDatasetError:  # no file at all
        patterns = {}
    splits = {}
    for name, found in DataFilesDict.from_patterns(patterns, base_path=base.as_posix()).items():
        files = sorted({folder / Path(file).relative_to(base) for file in found})
        files = [file for file in files if file.suffix.lower() in FILE_BUILDERS]
        if files:
            splits[str(name)] = files
    if not splits:
        compressed = sorted(p.name for p in folder.rglob("*") if p.name.lower().endswith(COMPRESSED_SUFFIXES))
        hint = (
            f" It holds compressed files ({', '.join(compressed[:3])}): decompress them first." if compressed else ""
        )
        raise ValueError(
            f"{config_key}: {str(folder)!r} holds no data file ({', '.join(FILE_BUILDERS)}); point {config_key} at a "
            f"data file or a dataset folder.{hint}"
        )
    kinds = sorted({file.suffix.lower() for files in splits.values() for file in files})
    if len({FILE_BUILDERS[kind] for kind in kinds}) > 1:  # datasets would read the most common kind and skip the rest
        raise ValueError(
            f"{config_key}: {str(folder)!r} holds data files of more than one kind ({', '.join(kinds)}); keep one kind "
            f"in a folder (.jsonl and .json count as one), or point {config_key} at a file."
        )
    return splits


def _as_json(rows: datasets.Dataset, names: set[str]) -> datasets.Dataset:
    """``rows`` with the columns ``names`` given the ``Json`` type, each value as it was read."""
    order = rows.column_names
    for name in names & set(order):
        values = [_encode_at(value, []) for value in rows[name]]
        rows = rows.remove_columns(name).add_column(name, values, feature=datasets.Json())
    return rows.select_columns(order)


def _concatenate(parts: list[datasets.Dataset]) -> datasets.Dataset:
    """The files' rows in one dataset. A column typed differently by two files (an answer that is a number in one file
    and text in another) gets the ``Json`` type, each value as written, as one file holding all the rows would give
    it; the files could not be joined otherwise (the reader given them all at once casts every file to the first's
    types: the number 3 became "3")."""
    mixed = set()
    for name in {name for part in parts for name in part.column_names}:
        types = [part.features[name] for part in parts if name in part.features]
        types = [kind for kind in types if kind != datasets.Value("null")]  # a column of nulls joins any type
        if any(kind != types[0] for kind in types):
            mixed.add(name)
    if mixed:
        parts = [_as_json(part, mixed) for part in parts]
    return datasets.concatenate_datasets(parts)


class RowPlaces:
    """Where each row of a dataset read from several files came from, to name a row the way its user finds it: "row
    7" for one source, "train-1.jsonl row 3" for the fourth row of a folder's second file (rows count from 0)."""

    def __init__(self, files: list[tuple[str, int]] | None = None):
        """``files``: (file name, its number of rows), in the order the rows were joined; none for one source."""
        self.names = [name for name, _ in files or []]
        self.starts = np.cumsum([0] + [count for _, count in files or []])[:-1]

    def name(self, index: int) -> str:
        file, row = self.file_and_row(index)
        return f"row {row}" if file is None else f"{file} row {row}"

    def file_and_row(self, index: int) -> tuple[str | None, int]:
        """(the file's name, or None for one source; the row's number in it)."""
        if len(self.names) < 2:
            return None, index
        file = int(np.searchsorted(self.starts, index, side="right")) - 1
        return self.names[file], index - int(self.starts[file])


def _from_folder(folder: Path, split: str | None, config_key: str) -> tuple[datasets.Dataset, RowPlaces]:
    name, first = parse_split(split) if split is not None else (None, "")
    if _declares_configs(folder):
        name = _pick_split(datasets.get_dataset_split_names(str(folder)), name, folder, config_key)
        rows = datasets.load_dataset(str(folder), split=name)
        return _first_rows(rows, name, first, folder, config_key), RowPlaces()
    splits = _split_files(folder, config_key)
    name = _pick_split(list(splits), name, folder, config_key)
    files = splits[name]
    parts = [_from_file(file, FILE_BUILDERS[file.suffix.lower()], config_key) for file in files]
    # the slice keeps the first rows, so each kept row stays where the files' row counts place it
    places = RowPlaces([(file.relative_to(folder).as_posix(), len(part)) for file, part in zip(files, parts)])
    return _first_rows(_concatenate(parts), name, first, folder, config_key), places


def _looks_local(path: str) -> bool:
    """A path no hub dataset can have: a hub name is ``owner/name``, so two slashes, a data file's suffix or a first
    part that is a folder here (``data/train`` beside a ``data`` folder) name a local path that is missing, said at
    once rather than after the hub's lookup (which, offline, takes its network timeouts)."""
    parts = path.split("/")
    return (
        path.startswith((".", "/", "~"))
        or Path(path).suffix.lower() in FILE_BUILDERS
        or len(parts) > 2
        or (len(parts) == 2 and Path(parts[0]).is_dir())
    )


def load_rows(path: str, config_key: str = "data.train_files") -> datasets.Dataset:
    """The rows at ``path`` (see the module docstring for the accepted forms)."""
    return load_rows_and_places(path, config_key)[0]


def load_rows_and_places(path: str, config_key: str = "data.train_files") -> tuple[datasets.Dataset, RowPlaces]:
    """The rows at ``path`` and, for a folder of data files, the file each row came from."""
    base, split = split_path(path)
    local = Path(base).expanduser()
    if path and not path.startswith(BUILTIN_PREFIX) and local.is_dir() and not _is_saved(local):
        return _from_folder(local, split, config_key)
    return _load_one(path, config_key), RowPlaces()


def _is_saved(folder: Path) -> bool:
    """A folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    return (folder / "dataset_info.json").exists() or (folder / "dataset_dict.json").exists()


def _load_one(path: str, config_key: str) -> datasets.Dataset:
    """The rows of a path that is no folder of data files."""
    if not path:
        raise ValueError(f"{config_key} is empty; point it at a .jsonl/.json/.parquet file or a dataset folder.")
    if path.startswith(BUILTIN_PREFIX):
        return datasets.Dataset.from_list(load_builtin(path))
    base, split = split_path(path)
    local = Path(base).expanduser()
    if local.is_dir():
        return _from_saved(local, split, config_key)
    if local.is_file():
        builder = FILE_BUILDERS.get(local.suffix.lower())
        if builder is None:
            raise ValueError(
                f"{config_key}: cannot read {base!r}; use one of {', '.join(FILE_BUILDERS)} or a dataset folder."
                + unreadable_suffix_hint(local.name)
            )
        return _from_file(local, builder, config_key, split)
    if _looks_local(base):
        raise FileNotFoundError(f"{config_key}: {base!r} does not exist.")
    try:
        return datasets.load_dataset(base, split=split or "train")
    except Exception as error:  # the hub client raises many types (connection, missing repo, missing split)
        raise FileNotFoundError(
            f"{config_key}: {path!r} is neither a local file/folder nor a loadable hub dataset ({error})."
        ) from error

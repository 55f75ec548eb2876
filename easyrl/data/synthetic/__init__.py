"""Datasets that ship with easyrl, generated on the fly and addressed as ``builtin://NAME@SPLIT``, or
``builtin://NAME@SPLIT[:N]`` (``[:N%]``) for a split's first rows, as a data file's ``@train[:N]``."""

import re
from collections.abc import Callable


BUILTIN_PREFIX = "builtin://"


def _arithmetic(split: str) -> list[dict]:
    from .arithmetic import generate_arithmetic

    return generate_arithmetic(split)


def _arithmetic_small(split: str) -> list[dict]:
    from .arithmetic import SMALL_SPEC, SMALL_SPLIT_SIZES, generate_arithmetic

    if split not in SMALL_SPLIT_SIZES:
        raise ValueError(f"Unknown arithmetic_small split {split!r}; choose one of {sorted(SMALL_SPLIT_SIZES)}.")
    return generate_arithmetic(split, size=SMALL_SPLIT_SIZES[split], spec=SMALL_SPEC)


def _arithmetic_sft(split: str) -> list[dict]:
    from .arithmetic import generate_arithmetic_sft

    return generate_arithmetic_sft(split)


def _code(split: str) -> list[dict]:
    from .code import generate_code

    return generate_code(split)


def _shapes(split: str) -> list[dict]:
    from .shapes import generate_shapes

    return generate_shapes(split)


def _shapes_sft(split: str) -> list[dict]:
    from .shapes import generate_shapes_sft

    return generate_shapes_sft(split)


# name -> split -> rows
BUILTIN_DATASETS: dict[str, Callable[[str], list[dict]]] = {
    "arithmetic": _arithmetic,
    "arithmetic_small": _arithmetic_small,
    "arithmetic_sft": _arithmetic_sft,
    "code": _code,
    "shapes": _shapes,
    "shapes_sft": _shapes_sft,
}


# the splits each one has (checked before anything is generated: `easyrl check` generates nothing)
BUILTIN_SPLITS: dict[str, tuple[str, ...]] = {
    "arithmetic": ("train", "test"),
    "arithmetic_small": ("train", "test"),
    "arithmetic_sft": ("train",),
    "code": ("train", "test"),
    "shapes": ("train", "test"),
    "shapes_sft": ("train", "test"),
}
_SPLIT = re.compile(r"(\w+)\s*(?:\[\s*:\s*(-?\d+)\s*(%?)\s*\])?")


def parse_builtin(spec: str) -> tuple[str, str, int | None, bool]:
    """(name, split, N of ``[:N]`` or None, whether N is a percentage) of ``builtin://NAME@SPLIT[:N]``; ValueError
    naming the choices for an unknown name or split."""
    name, _, split = spec[len(BUILTIN_PREFIX) :].partition("@")
    if name not in BUILTIN_DATASETS:
        raise ValueError(f"Unknown built-in dataset {spec!r}; choose one of: {', '.join(sorted(BUILTIN_DATASETS))}.")
    match = _SPLIT.fullmatch(split.strip() or "train")
    if match is None or match[1] not in BUILTIN_SPLITS[name]:
        advice = " (its problems are arithmetic_small's training problems: validate on arithmetic_small)"
        raise ValueError(
            f"{spec!r}: {BUILTIN_PREFIX}{name} has the split(s) {', '.join(BUILTIN_SPLITS[name])}"
            + (advice if name == "arithmetic_sft" else "")
            + "; give one, optionally with `[:N]` (or `[:N%]`) for its first rows."
        )
    return name, match[1], None if match[2] is None else int(match[2]), bool(match[3])


def load_builtin(spec: str) -> list[dict]:
    """Rows of ``builtin://NAME@SPLIT`` (split defaults to train), the first N of ``@SPLIT[:N]`` (``[:N%]``: that
    share, rounded)."""
    name, split, stop, percent = parse_builtin(spec)
    rows = BUILTIN_DATASETS[name](split)
    if stop is not None:
        rows = rows[: round(len(rows) * stop / 100) if percent else stop]
    return rows

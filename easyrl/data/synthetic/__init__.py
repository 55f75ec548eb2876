"""Datasets that ship with easyrl, generated on the fly and addressed as ``builtin://NAME@SPLIT``."""

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


def load_builtin(spec: str) -> list[dict]:
    """Rows of ``builtin://NAME@SPLIT`` (split defaults to train)."""
    name, _, split = spec[len(BUILTIN_PREFIX) :].partition("@")
    if name not in BUILTIN_DATASETS:
        raise ValueError(f"Unknown built-in dataset {spec!r}; choose one of: {', '.join(sorted(BUILTIN_DATASETS))}.")
    return BUILTIN_DATASETS[name](split or "train")

"""Integer arithmetic problems (the embedded default task): ``What is 47 + 38?`` -> ``85``.

Deterministic: a split is fully defined by its seed and the difficulty parameters, so every machine trains and
validates on the same problems. The test problems are excluded from the training split, so validation measures
generalisation rather than memory.
"""

import json
import random
from dataclasses import dataclass
from pathlib import Path


OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class ArithmeticSpec:
    """Difficulty of the problems."""

    num_digits: int = 2
    operations: tuple[str, ...] = ("+", "-")
    allow_negative: bool = False  # when False, subtraction puts the larger operand first
    max_operand: int | None = None  # when set, operands are drawn from 1..max_operand instead of by num_digits


# split -> (seed, size); the seeds differ so the two splits are drawn independently
SPLITS = {"train": (1234, 4096), "test": (5678, 128)}


# The embedded default's task (`builtin://arithmetic_small`): sums and differences of numbers up to 20. SmolLM2-135M
# answers ~29% of them right at temperature 0.7 before training, so GRPO groups disagree from the first step and
# accuracy has room to rise within minutes; two-digit problems (~6%) leave most groups all wrong. 610 distinct
# problems exist: 128 for validation, 384 others for training.
SMALL_SPEC = ArithmeticSpec(max_operand=20)
SMALL_SPLIT_SIZES = {"train": 384, "test": 128}


def _problem(rng: random.Random, spec: ArithmeticSpec) -> tuple[int, str, int]:
    if spec.max_operand is not None:
        low, high = 1, spec.max_operand
    else:
        low, high = 10 ** (spec.num_digits - 1) if spec.num_digits > 1 else 0, 10**spec.num_digits - 1
    a, b = rng.randint(low, high), rng.randint(low, high)
    op = rng.choice(spec.operations)
    if op == "-" and not spec.allow_negative and b > a:
        a, b = b, a
    return a, op, b


def _draw(seed: int, size: int, spec: ArithmeticSpec, exclude: set[tuple[int, str, int]]) -> list[dict]:
    rng = random.Random(seed)
    seen: set[tuple[int, str, int]] = set()
    rows = []
    attempts = 0
    while len(rows) < size:
        attempts += 1
        if attempts > 100 * size:
            raise ValueError(f"Cannot draw {size} distinct problems with {spec}; lower the size or raise num_digits.")
        key = _problem(rng, spec)
        if key in seen or key in exclude:
            continue
        seen.add(key)
        a, op, b = key
        rows.append(
            {"problem": f"What is {a} {op} {b}?", "answer": str(OPERATIONS[op](a, b)), "data_source": "arithmetic"}
        )
    return rows


def generate_arithmetic(
    split: str = "train", size: int | None = None, spec: ArithmeticSpec = ArithmeticSpec()
) -> list[dict]:
    """Rows ``{"problem", "answer", "data_source"}`` of ``split`` ("train" or "test"); no training row repeats a
    test problem."""
    if split not in SPLITS:
        raise ValueError(f"Unknown arithmetic split {split!r}; choose one of {sorted(SPLITS)}.")
    test_seed, test_size = SPLITS["test"]
    test = _draw(test_seed, test_size if split != "test" or size is None else size, spec, set())
    if split == "test":
        return test
    test_keys = {_parse(row["problem"]) for row in test}
    seed, default_size = SPLITS[split]
    return _draw(seed, size or default_size, spec, test_keys)


def _parse(problem: str) -> tuple[int, str, int]:
    a, op, b = problem.removeprefix("What is ").removesuffix("?").split(" ")
    return int(a), op, int(b)


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    """Write rows as JSON lines (one object per line) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row) + "\n")
    return path


def worked_answer(problem: str) -> str:
    """A short worked answer in the form the arithmetic reward gives full credit: ``7 + 5 = 12. The answer is
    \\boxed{12}.``"""
    a, op, b = _parse(problem)
    result = OPERATIONS[op](a, b)
    return f"{a} {op} {b} = {result}. The answer is \\boxed{{{result}}}."


def generate_arithmetic_sft(split: str = "train") -> list[dict]:
    """The `builtin://arithmetic_small` problems of ``split`` with a `response` column (:func:`worked_answer`): the
    supervised cold start that teaches the model the boxed format before GRPO. Only the train split exists: its
    problems are those of `arithmetic_small@train`, so none repeats a test problem."""
    if split != "train":
        raise ValueError(
            f"Unknown arithmetic_sft split {split!r}; it has only 'train' (validate on arithmetic_small)."
        )
    rows = generate_arithmetic("train", size=SMALL_SPLIT_SIZES["train"], spec=SMALL_SPEC)
    return [{**row, "response": worked_answer(row["problem"])} for row in rows]

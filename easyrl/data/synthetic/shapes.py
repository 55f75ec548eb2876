"""Counting coloured shapes in a picture (a small built-in vision-language task).

Each image holds a few circles, squares and triangles in a few colours, drawn without overlap on a white
background; the question asks how many shapes of one colour and kind there are. Deterministic per split seed.
"""

import io
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw


COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
SHAPES = ("circle", "square", "triangle")
SPLITS = {"train": (4321, 1024), "test": (8765, 64)}
# the SFT cold start draws more pictures from the train split's seed: its first 1024 rows are `shapes@train`
SFT_ROWS = 8192


@dataclass(frozen=True)
class ShapesSpec:
    """Difficulty of the pictures."""

    image_size: int = 224
    shape_size: int = 28
    max_shapes: int = 8


def _draw_shape(draw: ImageDraw.ImageDraw, kind: str, box: tuple[int, int, int, int], colour: tuple[int, int, int]):
    left, top, right, bottom = box
    if kind == "circle":
        draw.ellipse(box, fill=colour)
    elif kind == "square":
        draw.rectangle(box, fill=colour)
    else:
        draw.polygon([((left + right) // 2, top), (right, bottom), (left, bottom)], fill=colour)


def _picture(rng: random.Random, spec: ShapesSpec) -> tuple[Image.Image, list[tuple[str, str]]]:
    """A picture and the (colour, kind) of each shape in it; shapes sit in distinct grid cells, so never overlap."""
    cells_per_side = spec.image_size // (spec.shape_size * 2)
    cells = rng.sample(range(cells_per_side**2), rng.randint(1, min(spec.max_shapes, cells_per_side**2)))
    image = Image.new("RGB", (spec.image_size, spec.image_size), "white")
    draw = ImageDraw.Draw(image)
    shapes = []
    for cell in cells:
        colour, kind = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
        x = (cell % cells_per_side) * spec.shape_size * 2 + spec.shape_size // 2
        y = (cell // cells_per_side) * spec.shape_size * 2 + spec.shape_size // 2
        _draw_shape(draw, kind, (x, y, x + spec.shape_size, y + spec.shape_size), COLOURS[colour])
        shapes.append((colour, kind))
    return image, shapes


def _questions(split: str, size: int | None, spec: ShapesSpec) -> list[tuple[dict, str, str]]:
    """(row, colour, kind) per picture of ``split``: the row and what its question asks to count."""
    if split not in SPLITS:
        raise ValueError(f"Unknown shapes split {split!r}; choose one of {sorted(SPLITS)}.")
    seed, default_size = SPLITS[split]
    rng = random.Random(seed)
    questions = []
    for _ in range(size or default_size):
        image, shapes = _picture(rng, spec)
        colour, kind = rng.choice(shapes)
        count = sum(shape == (colour, kind) for shape in shapes)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        row = {
            "problem": f"<image>How many {colour} {kind}s are in the picture?",
            "answer": str(count),
            "images": [{"bytes": buffer.getvalue(), "path": None}],
            "data_source": "shapes",
        }
        questions.append((row, colour, kind))
    return questions


def generate_shapes(split: str = "train", size: int | None = None, spec: ShapesSpec = ShapesSpec()) -> list[dict]:
    """Rows ``{"problem", "answer", "images": [{"bytes": png}], "data_source"}``."""
    return [row for row, _, _ in _questions(split, size, spec)]


def worked_answer(colour: str, kind: str, count: str) -> str:
    """The answer an SFT row teaches, in the form reward_function/r1v.py gives full format credit: a short
    ``<think>`` naming what is counted, then the count in ``<answer>`` (short, so a tiny model can learn it)."""
    return f"<think>{colour} {kind}s: {count}</think><answer>{count}</answer>"


def generate_shapes_sft(split: str = "train") -> list[dict]:
    """`builtin://shapes_sft`: SFT_ROWS pictures from the train split's seed (the first 1024 are `shapes@train`) with
    a `response` column (:func:`worked_answer`), for the supervised cold start before GRPO. Only a train split: the
    test pictures come from another seed, and a picture that happens to repeat a test row (same image and question)
    is left out, so none is trained on."""
    if split != "train":
        raise ValueError(f"Unknown shapes_sft split {split!r}; it has only 'train' (validate on shapes@test).")
    test = {(row["images"][0]["bytes"], row["problem"]) for row in generate_shapes("test")}
    return [
        {**row, "response": worked_answer(colour, kind, row["answer"])}
        for row, colour, kind in _questions("train", SFT_ROWS, ShapesSpec())
        if (row["images"][0]["bytes"], row["problem"]) not in test
    ]

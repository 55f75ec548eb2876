"""Counting coloured shapes in a picture (a small built-in vision-language task).

Each image holds a few circles, squares and triangles in a few colours, drawn without overlap on a white
background; the question asks how many shapes of one colour and kind there are. Deterministic per split seed. The
train split leaves out the pictures that repeat a test picture (small pictures of one or two shapes recur), so a
model is never validated on a picture it trained on.
"""

import io
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw


COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
SHAPES = ("circle", "square", "triangle")
SPLITS = {"train": (4321, 1024), "test": (8765, 64)}
# the SFT cold start: its own seed, and as many rows of each count (see generate_shapes_sft); its test split is as
# balanced, so always giving one answer scores 1/3 there (on shapes@test, always "1" scores 46/64)
SFT_SEED, SFT_ROWS, SFT_COUNTS = 2468, 8192, (1, 2, 3)
SFT_TEST_SEED, SFT_TEST_ROWS = 1357, 300


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


# A picture's layout: (grid cell, colour, kind) per shape, in drawing order. Shapes sit in distinct cells and each
# (colour, kind) draws differently, so two pictures are the same exactly when their layouts hold the same shapes:
# splits are kept apart by layout, without drawing or encoding the pictures they compare.
Layout = tuple[tuple[int, str, str], ...]


def _layout(rng: random.Random, spec: ShapesSpec, asked: tuple[str, str] | None = None, count: int = 0) -> Layout:
    """Where each shape of a picture goes and what it is (the random draws of a picture; drawing it takes none).
    With ``asked``, exactly ``count`` shapes are that (colour, kind) and the others (up to max_shapes in all) are not."""
    cells_per_side = spec.image_size // (spec.shape_size * 2)
    most = min(spec.max_shapes, cells_per_side**2)
    cells = rng.sample(range(cells_per_side**2), rng.randint(max(1, count), most))
    others = [(colour, kind) for colour in sorted(COLOURS) for kind in SHAPES if (colour, kind) != asked]
    layout = []
    for i, cell in enumerate(cells):
        if asked is None:
            colour, kind = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
        else:
            colour, kind = asked if i < count else rng.choice(others)
        layout.append((cell, colour, kind))
    return tuple(layout)


def _same_picture(layout: Layout) -> frozenset:
    """What "the same picture" means when splits must not share one (equal exactly when the drawn pictures are)."""
    return frozenset(layout)


def _render(layout: Layout, spec: ShapesSpec) -> Image.Image:
    cells_per_side = spec.image_size // (spec.shape_size * 2)
    image = Image.new("RGB", (spec.image_size, spec.image_size), "white")
    draw = ImageDraw.Draw(image)
    for cell, colour, kind in layout:
        x = (cell % cells_per_side) * spec.shape_size * 2 + spec.shape_size // 2
        y = (cell // cells_per_side) * spec.shape_size * 2 + spec.shape_size // 2
        _draw_shape(draw, kind, (x, y, x + spec.shape_size, y + spec.shape_size), COLOURS[colour])
    return image


def _shapes(layout: Layout) -> list[tuple[str, str]]:
    return [(colour, kind) for _, colour, kind in layout]


def _picture(
    rng: random.Random, spec: ShapesSpec, asked: tuple[str, str] | None = None, count: int = 0
) -> tuple[Image.Image, list[tuple[str, str]]]:
    """A picture and the (colour, kind) of each shape in it; shapes sit in distinct grid cells, so never overlap.
    With ``asked``, exactly ``count`` shapes are that (colour, kind) and the others (up to max_shapes in all) are not."""
    layout = _layout(rng, spec, asked, count)
    return _render(layout, spec), _shapes(layout)


def _row(image: Image.Image, colour: str, kind: str, count: int) -> dict:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return {
        "problem": f"<image>How many {colour} {kind}s are in the picture?",
        "answer": str(count),
        "images": [{"bytes": buffer.getvalue(), "path": None}],
        "data_source": "shapes",
    }


def _drawn_questions(split: str, size: int | None, spec: ShapesSpec) -> list[tuple[Layout, str, str]]:
    """(layout, colour, kind) per picture of ``split``: the picture and what its question asks to count. The train
    split leaves out pictures that repeat a test picture (so it may hold fewer than ``size`` rows)."""
    if split not in SPLITS:
        raise ValueError(f"Unknown shapes split {split!r}; choose one of {sorted(SPLITS)}.")
    seed, default_size = SPLITS[split]
    rng = random.Random(seed)
    questions = []
    for _ in range(size or default_size):
        layout = _layout(rng, spec)
        colour, kind = rng.choice(_shapes(layout))
        questions.append((layout, colour, kind))
    if split == "train":
        test = _test_pictures(spec)
        questions = [question for question in questions if _same_picture(question[0]) not in test]
    return questions


def _questions(split: str, size: int | None, spec: ShapesSpec) -> list[tuple[dict, str, str]]:
    """(row, colour, kind) per picture of ``split`` (``_drawn_questions``, drawn and encoded)."""
    return [
        (_row(_render(layout, spec), colour, kind, _shapes(layout).count((colour, kind))), colour, kind)
        for layout, colour, kind in _drawn_questions(split, size, spec)
    ]


def _test_pictures(spec: ShapesSpec) -> set[frozenset]:
    """Every test picture (for ``spec``, as ``_same_picture``), which no training row may repeat."""
    return {_same_picture(layout) for layout, _, _ in _drawn_questions("test", None, spec)}


def generate_shapes(split: str = "train", size: int | None = None, spec: ShapesSpec = ShapesSpec()) -> list[dict]:
    """Rows ``{"problem", "answer", "images": [{"bytes": png}], "data_source"}``."""
    return [row for row, _, _ in _questions(split, size, spec)]


def worked_answer(colour: str, kind: str, count: str) -> str:
    """The answer an SFT row teaches, in the form reward_function/r1v.py gives full format credit: a short
    ``<think>`` naming what is counted, then the count in ``<answer>`` (short, so a tiny model can learn it)."""
    return f"<think>{colour} {kind}s: {count}</think><answer>{count}</answer>"


def generate_shapes_sft(split: str = "train") -> list[dict]:
    """`builtin://shapes_sft`: pictures with a `response` column (:func:`worked_answer`), for the supervised cold
    start before GRPO. ``train``: SFT_ROWS rows, none repeating a test picture. ``test``: SFT_TEST_ROWS rows drawn
    the same way from their own seed, none repeating a picture of shapes@test, shapes@train or shapes_sft@train, so
    an SFT or RL model can be scored where chance is 1/3 whatever it answers.

    The pictures and questions are drawn exactly as the test's (a random picture, a question about one of its
    shapes), but the rows are RESAMPLED to balanced counts: row i is the next drawn question whose answer is
    SFT_COUNTS[i % 3] (rejection sampling, so each count's rows follow the test's own distribution given that count).
    In the natural draws ~75% of the answers are "1"; an untrained model fitted to them learns to always say "1" (the
    cheapest way down the loss) long before it learns to read the picture, and stays there. Drawing the pictures
    around a target count instead (exactly that many of the asked shape, the rest other shapes) learned more slowly
    in scripts/shapes_vlm_probe.py: in natural pictures the count goes with how full the picture is, an easy first
    cue."""
    spec = ShapesSpec()
    test = _test_pictures(spec)
    if split == "train":
        drawn = _balanced_questions(SFT_SEED, SFT_ROWS, test, spec)
    elif split == "test":
        trained_on = [layout for layout, _, _ in _drawn_questions("train", None, spec)]
        trained_on += [layout for layout, _, _, _ in _balanced_questions(SFT_SEED, SFT_ROWS, test, spec)]
        seen = test | {_same_picture(layout) for layout in trained_on}
        drawn = _balanced_questions(SFT_TEST_SEED, SFT_TEST_ROWS, seen, spec)
    else:
        raise ValueError(f"Unknown shapes_sft split {split!r}; choose 'train' or 'test'.")
    return [
        {**_row(_render(layout, spec), colour, kind, count), "response": worked_answer(colour, kind, str(count))}
        for layout, colour, kind, count in drawn
    ]


def _balanced_questions(
    seed: int, size: int, leave_out: set[frozenset], spec: ShapesSpec
) -> list[tuple[Layout, str, str, int]]:
    """``size`` questions (layout, colour, kind, count) drawn as the test's, resampled to SFT_COUNTS in turn, none with
    a picture in ``leave_out``. Only the kept ones are drawn and encoded, by the caller (one in ~11 draws is kept)."""
    rng = random.Random(seed)
    questions = []
    while len(questions) < size:
        want = SFT_COUNTS[len(questions) % len(SFT_COUNTS)]
        layout = _layout(rng, spec)
        shapes = _shapes(layout)
        colour, kind = rng.choice(shapes)
        if shapes.count((colour, kind)) == want and _same_picture(layout) not in leave_out:
            questions.append((layout, colour, kind, want))
    return questions

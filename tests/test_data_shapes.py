"""The built-in shapes-counting task: deterministic pictures whose answers match what was drawn."""

import io

import numpy as np
from PIL import Image

from easyrl.data.sources import load_rows
from easyrl.data.synthetic.shapes import COLOURS, generate_shapes


# pixels of one shape at the default size (a 28-pixel box, drawn with its edges): a square fills 29 x 29
PIXELS_OF = {841: "square", 657: "circle", 421: "triangle"}


def shapes_in(row: dict) -> list[tuple[str, str]]:
    """(colour, kind) of each shape of a row's picture, read back from its pixels, one 56-pixel grid cell at a time."""
    image = np.asarray(Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB"))
    found = []
    for top in range(0, image.shape[0], 56):
        for left in range(0, image.shape[1], 56):
            cell = image[top : top + 56, left : left + 56]
            for colour, rgb in COLOURS.items():
                pixels = int((cell == rgb).all(-1).sum())
                if pixels:
                    found.append((colour, PIXELS_OF[pixels]))
    return found


def asked(row: dict) -> tuple[str, str]:
    colour, kinds = row["problem"].removeprefix("<image>How many ").split(" ")[:2]
    return colour, kinds.removesuffix("s")


def test_generation_is_deterministic():
    assert generate_shapes("test", size=3) == generate_shapes("test", size=3)


def test_answer_counts_the_asked_shapes():
    for row in generate_shapes("test", size=8):
        assert row["answer"] == str(shapes_in(row).count(asked(row)))


def test_builtin_shapes_loads_as_a_dataset():
    rows = load_rows("builtin://shapes@test")
    assert len(rows) == 64 and rows[0]["problem"].startswith("<image>How many")
    assert asked(rows[0])[0] in COLOURS


def test_train_repeats_no_test_picture():
    # of the 1024 pictures drawn from the train seed, 7 (one or two shapes) are exactly test pictures: left out
    train, test = generate_shapes("train"), generate_shapes("test")
    assert len(train) == 1017
    test_pictures = {row["images"][0]["bytes"] for row in test}
    assert not any(row["images"][0]["bytes"] in test_pictures for row in train)

"""The built-in shapes-counting task: deterministic pictures whose answers match what was drawn."""

import io

import numpy as np
from PIL import Image

from easyrl.data.sources import load_rows
from easyrl.data.synthetic.shapes import COLOURS, generate_shapes


def test_generation_is_deterministic():
    assert generate_shapes("test", size=3) == generate_shapes("test", size=3)


def test_answer_counts_the_asked_shapes():
    row = generate_shapes("test", size=1)[0]
    colour = row["problem"].split(" ")[2]
    image = np.asarray(Image.open(io.BytesIO(row["images"][0]["bytes"])))
    assert 1 <= int(row["answer"]) <= 8 and colour in COLOURS
    assert (image == COLOURS[colour]).all(-1).any()  # the asked colour is in the picture


def test_builtin_shapes_loads_as_a_dataset():
    rows = load_rows("builtin://shapes@test")
    assert len(rows) == 64 and rows[0]["problem"].startswith("<image>How many")

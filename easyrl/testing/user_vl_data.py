"""Image datasets shaped like users' own, for tests: what a person collects and writes into a jsonl file.

Pictures of random sizes (16 px to 4k on a side) and aspect ratios (up to 1:8 and 8:1, some exactly), saved in
many formats and PIL modes (RGB, RGBA with transparency, palette with and without transparency, greyscale,
greyscale + alpha, 16-bit greyscale, bilevel, CMYK JPEG, JPEG with an EXIF rotation, GIF, WebP, BMP, TIFF), each
showing 1-4 red dots on a light background (the answer is the count). Rows hold one picture, two pictures or none,
with the ``<image>`` placeholder written into the question or left out; some paths are relative to the data file's
folder and some to a separate ``data.image_dir``. Optionally one row points at a corrupt file, which the dataset must
skip, count and name.
"""

import io
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw


QUESTION = "How many red dots are in the picture?"
TWO_QUESTION = "How many red dots are in the two pictures together?"
# (format, PIL mode, suffix) of the saved files; the loader must turn every one into RGB
PICTURE_KINDS = (
    ("PNG", "RGB", ".png"),
    ("PNG", "RGBA", ".png"),
    ("PNG", "P", ".png"),
    ("PNG", "P+transparency", ".png"),
    ("PNG", "L", ".png"),
    ("PNG", "LA", ".png"),
    ("PNG", "I;16", ".png"),
    ("PNG", "1", ".png"),
    ("JPEG", "CMYK", ".jpg"),
    ("JPEG", "RGB+exif", ".jpg"),
    ("GIF", "P", ".gif"),
    ("WEBP", "RGBA", ".webp"),
    ("BMP", "RGB", ".bmp"),
    ("TIFF", "RGB", ".tiff"),
)
# width / height of some pictures, exactly: the extremes the processor must clamp
EXTREME_RATIOS = (8.0, 1 / 8)
MIN_SIDE, MAX_SIDE = 16, 4096


@dataclass
class UserDataset:
    """Where a generated dataset lies and what it holds."""

    data_file: Path
    image_dir: Path
    rows: list[dict]
    kinds: list[str] = field(default_factory=list)
    """The ``format/mode`` of every picture written, in order."""
    sizes: list[tuple[int, int]] = field(default_factory=list)
    """The (width, height) of every picture written, in order."""
    corrupt_row: int | None = None


def random_size(rng: random.Random) -> tuple[int, int]:
    """(width, height): the long side log-uniform in [16, 4096], the ratio 1:1, 8:1, 1:8 or anything between."""
    long_side = int(round(math.exp(rng.uniform(math.log(MIN_SIDE), math.log(MAX_SIDE)))))
    ratio = rng.choice([1.0, *EXTREME_RATIOS, math.exp(rng.uniform(math.log(1 / 8), math.log(8)))])
    if ratio >= 1:
        width, height = long_side, long_side / ratio
    else:
        width, height = long_side * ratio, long_side
    width, height = max(MIN_SIDE, int(round(width))), max(MIN_SIDE, int(round(height)))
    if max(width, height) / min(width, height) > 8:  # the 16 px floor can push a thin picture past 1:8
        width, height = (min(width, 8 * height), height) if width > height else (width, min(height, 8 * width))
    return width, height


def draw_dots(width: int, height: int, dots: int, rng: random.Random) -> Image.Image:
    """An RGB picture of ``dots`` red dots on a light gradient (smooth, so that 4k files stay small)."""
    background = Image.linear_gradient("L").resize((width, height)).point(lambda v: 200 + v // 5)
    picture = Image.merge("RGB", (background, background, background.point(lambda v: 255 - v // 4)))
    draw = ImageDraw.Draw(picture)
    radius = max(1, min(width, height) // 8)
    for _ in range(dots):
        x, y = rng.randint(0, max(0, width - 1)), rng.randint(0, max(0, height - 1))
        draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=(220, 20, 20))
    return picture


def encode_picture(picture: Image.Image, kind: tuple[str, str, str]) -> bytes:
    """``picture`` saved as ``kind`` (format, mode, suffix)."""
    file_format, mode, _ = kind
    buffer = io.BytesIO()
    if mode == "RGB+exif":
        # stored on its side with an EXIF tag saying "rotate 90 degrees clockwise to view"
        exif = Image.Exif()
        exif[0x0112] = 6
        picture.transpose(Image.Transpose.ROTATE_90).save(buffer, format=file_format, exif=exif, quality=90)
    elif mode == "P+transparency":
        palette = picture.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
        palette.save(buffer, format=file_format, transparency=0)
    elif mode == "RGBA":
        rgba = picture.convert("RGBA")
        rgba.putalpha(Image.linear_gradient("L").resize(picture.size))
        rgba.save(buffer, format=file_format)
    elif mode == "LA":
        picture.convert("LA").save(buffer, format=file_format)
    elif mode == "I;16":
        picture.convert("L").point(lambda v: v * 257, mode="I").convert("I;16").save(buffer, format=file_format)
    elif mode == "P":
        picture.convert("P", palette=Image.Palette.ADAPTIVE, colors=64).save(buffer, format=file_format)
    else:
        picture.convert(mode).save(buffer, format=file_format, **({"quality": 90} if file_format == "JPEG" else {}))
    return buffer.getvalue()


def write_user_dataset(
    root: str | Path,
    num_rows: int = 24,
    *,
    seed: int = 0,
    text_only_share: float = 0.15,
    two_picture_share: float = 0.25,
    placeholder_share: float = 0.6,
    corrupt_row: bool = True,
) -> UserDataset:
    """Write ``root/data/train.jsonl``, its pictures (some under ``root/data/img``, relative to the data file, some
    under ``root/pictures``, relative to data.image_dir) and return what was written."""
    rng = random.Random(seed)
    root = Path(root)
    data_dir, image_dir = root / "data", root / "pictures"
    (data_dir / "img").mkdir(parents=True, exist_ok=True)
    image_dir.mkdir(parents=True, exist_ok=True)
    written = UserDataset(data_file=data_dir / "train.jsonl", image_dir=image_dir, rows=[])
    picture_index = 0

    def new_picture(dots: int) -> str:
        nonlocal picture_index
        kind = PICTURE_KINDS[picture_index % len(PICTURE_KINDS)]  # every kind appears, in turn
        width, height = random_size(rng)
        name = f"{picture_index:03d}{kind[2]}"
        # even pictures sit next to the data file, odd ones under data.image_dir
        relative = f"img/{name}" if picture_index % 2 == 0 else f"sub/{name}"
        folder = data_dir if picture_index % 2 == 0 else image_dir
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(encode_picture(draw_dots(width, height, dots, rng), kind))
        written.kinds.append(f"{kind[0]}/{kind[1]}")
        written.sizes.append((width, height))
        picture_index += 1
        return relative

    for _ in range(num_rows):
        roll = rng.random()
        with_placeholder = rng.random() < placeholder_share
        if roll < text_only_share:
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            row = {"problem": f"What is {a} + {b}?", "answer": str(a + b), "images": []}
        elif roll < text_only_share + two_picture_share:
            first, second = rng.randint(1, 4), rng.randint(1, 4)
            pictures = [new_picture(first), new_picture(second)]
            text = f"<image> <image>{TWO_QUESTION}" if with_placeholder else TWO_QUESTION
            row = {"problem": text, "answer": str(first + second), "images": pictures}
        else:
            dots = rng.randint(1, 4)
            text = f"<image>{QUESTION}" if with_placeholder else QUESTION
            row = {"problem": text, "answer": str(dots), "images": [new_picture(dots)]}
        written.rows.append(row)
    if corrupt_row:
        (data_dir / "img" / "corrupt.png").write_bytes(
            encode_picture(draw_dots(64, 64, 1, rng), PICTURE_KINDS[0])[:60]
        )
        written.corrupt_row = len(written.rows)
        written.rows.append({"problem": f"<image>{QUESTION}", "answer": "1", "images": ["img/corrupt.png"]})
    written.data_file.write_text("".join(json.dumps(row) + "\n" for row in written.rows), encoding="utf-8")
    return written

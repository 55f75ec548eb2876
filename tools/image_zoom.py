"""A zoom tool for vision-language multi-turn rollouts (`worker.rollout.multi_turn.tools: tools/image_zoom.py`).

The model calls it on a part of the row's input picture, by name or by box:
    <tool_call>{"name": "zoom", "arguments": {"region": "top left"}}</tool_call>
    <tool_call>{"name": "zoom", "arguments": {"bbox": [0.5, 0.0, 1.0, 0.5]}}</tool_call>
and reads back a `tool` message with a line of text and the part, enlarged to the area of the whole picture (at most
MAX_ZOOM times per side): the rollout renders the picture with the model's vision placeholder and adds it to the
trajectory's pictures (README, "Tools and multi-turn rollouts").

The tool takes a `row` argument, so the rollout hands it the prompt's dataset row (not shown to the model in the
schema): the input picture is `row["multi_modal_data"]["images"][0]`, as the dataset stored it.
"""

import math
from typing import Optional

from PIL import Image


REGIONS = {
    "top left": (0.0, 0.0, 0.5, 0.5),
    "top right": (0.5, 0.0, 1.0, 0.5),
    "bottom left": (0.0, 0.5, 0.5, 1.0),
    "bottom right": (0.5, 0.5, 1.0, 1.0),
    "top": (0.0, 0.0, 1.0, 0.5),
    "bottom": (0.0, 0.5, 1.0, 1.0),
    "left": (0.0, 0.0, 0.5, 1.0),
    "right": (0.5, 0.0, 1.0, 1.0),
    "center": (0.25, 0.25, 0.75, 0.75),
}
MAX_ZOOM = 4.0  # a sliver would otherwise be blown up to the whole picture's area


def input_picture(row: Optional[dict]) -> Image.Image:
    """The first picture of the prompt's row."""
    media = (row or {}).get("multi_modal_data") or {}
    images = media.get("images") or []
    if not images:
        raise ValueError("this prompt has no picture to zoom into")
    return images[0]


def region_box(region: str, bbox: Optional[list[float]]) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) as fractions of the picture, from a named region or a box of fractions."""
    if bbox is not None:
        if len(bbox) != 4 or not all(isinstance(v, (int, float)) for v in bbox):
            raise ValueError(f"bbox must be four numbers [left, top, right, bottom], not {bbox!r}")
        left, top, right, bottom = (min(max(float(v), 0.0), 1.0) for v in bbox)
        if right <= left or bottom <= top:
            raise ValueError(f"bbox {bbox!r} is empty: right must exceed left and bottom must exceed top")
        return left, top, right, bottom
    name = " ".join(region.lower().replace("-", " ").replace("_", " ").split())
    if name not in REGIONS:
        raise ValueError(f"unknown region {region!r}; use one of: {', '.join(REGIONS)}, or a bbox")
    return REGIONS[name]


def zoom(region: str = "", bbox: Optional[list[float]] = None, row: Optional[dict] = None) -> list:
    """Zoom into a part of the picture: returns that part, enlarged.

    Args:
        region: The part by name: "top left", "top right", "bottom left", "bottom right", "top", "bottom",
            "left", "right" or "center".
        bbox: Instead of a region, the part as [left, top, right, bottom] fractions of the picture's width and
            height, e.g. [0.5, 0.0, 1.0, 0.5].
    """
    picture = input_picture(row)
    left, top, right, bottom = region_box(region, bbox)
    width, height = picture.size
    box = (round(left * width), round(top * height), round(right * width), round(bottom * height))
    part = picture.crop((box[0], box[1], max(box[2], box[0] + 1), max(box[3], box[1] + 1)))
    scale = min(math.sqrt((width * height) / (part.width * part.height)), MAX_ZOOM)
    size = (max(1, round(part.width * scale)), max(1, round(part.height * scale)))
    enlarged = part.resize(size, Image.Resampling.BICUBIC)
    where = f"the {region_name(region, bbox)}"
    return [f"Zoomed into {where} of the picture ({scale:.1f}x):", enlarged]


def region_name(region: str, bbox: Optional[list[float]]) -> str:
    return f"box {[round(float(v), 3) for v in bbox]}" if bbox is not None else region.strip()


TOOLS = [zoom]

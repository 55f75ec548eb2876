"""Images and videos of a dataset row, loaded and resized the way Qwen-VL models expect.

Images come as a path (absolute, or relative to ``data.image_dir``), a ``{"bytes": ..., "path": ...}`` dict (how
parquet files store them) or a PIL image. Videos come as a file path or a list of frames, and are sampled at
``data.video_fps`` with qwen-vl-utils.
"""

import io
import math
import os
from typing import Any

import torch
from PIL import Image


class UnreadableMediaError(ValueError):
    """An image or video of a row could not be read (missing file, corrupt bytes, unknown format)."""


def resolve_path(path: str, media_dir: str | None) -> str:
    """``path`` itself when absolute (or no folder is set), else ``media_dir/path``."""
    path = path[len("file://") :] if path.startswith("file://") else path
    if media_dir and not os.path.isabs(path):
        return os.path.join(media_dir, path)
    return path


def _open_image(image: Any, image_dir: str | None) -> Image.Image:
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, dict):
        if image.get("bytes") is not None:
            return Image.open(io.BytesIO(image["bytes"]))
        if image.get("path"):
            return Image.open(resolve_path(image["path"], image_dir))
        raise UnreadableMediaError(f"image dict has neither 'bytes' nor 'path' (keys: {sorted(image)})")
    if isinstance(image, bytes):
        return Image.open(io.BytesIO(image))
    if isinstance(image, str):
        return Image.open(resolve_path(image, image_dir))
    raise UnreadableMediaError(f"unsupported image value of type {type(image).__name__}")


def resize_to_pixel_range(image: Image.Image, min_pixels: int | None, max_pixels: int | None) -> Image.Image:
    """Scale ``image`` (keeping its aspect ratio) so that width x height lies within [min_pixels, max_pixels]."""
    width, height = image.size
    if max_pixels is not None and width * height > max_pixels:
        factor = math.sqrt(max_pixels / (width * height))
        image = image.resize((max(1, int(width * factor)), max(1, int(height * factor))))
    elif min_pixels is not None and width * height < min_pixels:
        factor = math.sqrt(min_pixels / (width * height))
        image = image.resize((math.ceil(width * factor), math.ceil(height * factor)))
    return image


def load_image(
    image: Any, image_dir: str | None = None, min_pixels: int | None = None, max_pixels: int | None = None
) -> Image.Image:
    """An RGB PIL image within the pixel range; raises ``UnreadableMediaError`` saying what could not be read."""
    try:
        opened = _open_image(image, image_dir)
        opened.load()  # decode now: a truncated file must fail here, not later inside the processor
    except UnreadableMediaError:
        raise
    except (OSError, ValueError, SyntaxError) as error:  # PIL raises all three for bad files
        where = image if isinstance(image, str) else type(image).__name__
        raise UnreadableMediaError(f"cannot read image {where!r}: {error}") from error
    if opened.mode != "RGB":
        opened = opened.convert("RGB")
    return resize_to_pixel_range(opened, min_pixels, max_pixels)


def _decode_video_frames(path: str) -> tuple[list[Image.Image], float]:
    """All frames of a video file and its frame rate, decoded with PyAV (used when qwen-vl-utils has no reader)."""
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate or stream.guessed_rate or 1)
        frames = [frame.to_image() for frame in container.decode(stream)]
    return frames, fps


def _subsample(frames: list, source_fps: float, target_fps: float) -> list:
    step = max(source_fps / target_fps, 1.0)
    count = max(1, int(len(frames) / step))
    return [frames[min(int(i * step), len(frames) - 1)] for i in range(count)]


def _has_native_video_reader() -> bool:
    from qwen_vl_utils.vision_process import is_decord_available, is_torchcodec_available

    return is_decord_available() or is_torchcodec_available()


def _to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """qwen-vl-utils resizes in float; uint8 frames take a quarter of the memory in every batch that carries them."""
    return frames if frames.dtype == torch.uint8 else frames.round().clamp(0, 255).to(torch.uint8)


def load_video(
    video: Any,
    image_dir: str | None = None,
    fps: float = 2.0,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> tuple[torch.Tensor, float]:
    """Frames ``(num_frames, 3, height, width)`` uint8 sampled at ``fps``, and the sampling rate actually used."""
    from qwen_vl_utils import fetch_video

    info: dict[str, Any] = {"min_pixels": min_pixels, "max_pixels": max_pixels}
    info = {k: v for k, v in info.items() if v is not None}
    try:
        if isinstance(video, str) and _has_native_video_reader():
            frames, sample_fps = fetch_video(
                {"video": resolve_path(video, image_dir), "fps": fps, **info}, return_video_sample_fps=True
            )
            return _to_uint8(frames), float(sample_fps)
        if isinstance(video, str):
            frames, source_fps = _decode_video_frames(resolve_path(video, image_dir))
            frames = _subsample(frames, source_fps, fps)
        else:  # a list of frames (paths, bytes dicts or PIL images), already at the wanted rate
            frames = [_open_image(frame, image_dir).convert("RGB") for frame in video]
        frames, sample_fps = fetch_video({"video": frames, "sample_fps": fps, **info}, return_video_sample_fps=True)
        return _to_uint8(frames), float(sample_fps)
    except UnreadableMediaError:
        raise
    except Exception as error:  # decoders raise many types (av.FFmpegError, OSError, RuntimeError, ...)
        where = video if isinstance(video, str) else f"{len(video)} frames"
        raise UnreadableMediaError(f"cannot read video {where!r}: {error}") from error

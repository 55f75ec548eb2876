"""Images and videos of a dataset row, loaded and sized once, the way every later processor call will keep them.

Images come as a path (absolute, or relative to ``data.image_dir``, else to the data file's folder, else to the
working directory), raw bytes, a ``{"bytes": ..., "path": ...}`` dict (how ``datasets`` and parquet files store
them) or a PIL image. Any PIL mode is converted to RGB once here (transparent pixels over white, 16-bit greyscale
scaled to 8 bits, EXIF orientation applied). Videos come as a file path or a list of frames; a file is sampled at
min(``data.video_fps``, its own rate) by qwen-vl-utils' reader, or by PyAV in a stream when it has none, and a video
is cut to at most ``data.max_frames`` evenly spread frames (``budget_frame_indices``; 768 for a file without a
budget, as qwen-vl-utils' readers stop there). Video frames are sized as pictures are (below), under qwen-vl-utils'
per-frame cap for videos.

The one sizing rule (``PictureSizing``): the Qwen-VL processors resize every picture with ``smart_resize`` (both
sides multiples of patch x merge, the area within the processor's [min_pixels, max_pixels]). The dataset resizes
each picture ONCE to exactly the size that rule gives under the effective limits, and stores that picture. Every
later processor call -- the dataset's own, the actor's (``easyrl.models.vision``) and vLLM's -- then meets a
picture that its own ``smart_resize`` leaves as it is: they cannot disagree on the number of vision tokens, and
they all read the same pixels. The effective limits are ``data.min_pixels`` / ``data.max_pixels`` clamped into the
processor's own range (``None`` takes the processor's value): the processor runs last on every path, so a value
outside its range could never take effect anyway (EasyR1's dataset resize followed by the processor's gives the
same sizes, up to rounding, with two interpolations instead of one).
"""

import base64
import binascii
import functools
import importlib
import inspect
import io
import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps


logger = logging.getLogger(__name__)


class UnreadableMediaError(ValueError):
    """An image or video of a row cannot be used: missing file, corrupt bytes, unknown format, or a shape the
    processor rejects. The dataset skips such rows, counts them and names them."""


# ----------------------------------------------------------------------------------------------------------------------
# where a picture is
# ----------------------------------------------------------------------------------------------------------------------
def _media_dirs(media_dir: str | Sequence[str | None] | None) -> list[str]:
    if media_dir is None or isinstance(media_dir, str):
        return [media_dir] if media_dir else []
    return [folder for folder in media_dir if folder]


def resolve_path(path: str, media_dir: str | Sequence[str | None] | None = None) -> str:
    """``path`` itself when absolute; a relative path is tried against each folder of ``media_dir`` in turn
    (``data.image_dir``, then the data file's folder) and then the working directory, and the first that exists
    wins. When none exists, FileNotFoundError names every place tried; a folder is no picture or video file."""
    path = path[len("file://") :] if path.startswith("file://") else path
    path = os.path.expanduser(path)
    if not path.strip():
        raise FileNotFoundError("the path is empty")
    if os.path.isabs(path):
        candidates = [path]
    else:
        candidates = [os.path.join(folder, path) for folder in _media_dirs(media_dir)] + [path]
    found = next((candidate for candidate in candidates if os.path.exists(candidate)), None)
    if found is None:
        tried = ", ".join(os.path.abspath(candidate) for candidate in candidates)
        raise FileNotFoundError(f"no such file (tried {tried})")
    if os.path.isdir(found):
        raise IsADirectoryError(
            f"{os.path.abspath(found)} is a folder; name a file (a video's frames: a list of picture files)"
        )
    return found


def _open_image(image: Any, media_dir: str | Sequence[str | None] | None) -> Image.Image:
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, dict):
        if image.get("bytes") is not None:
            return Image.open(io.BytesIO(image["bytes"]))
        if image.get("path"):
            return Image.open(resolve_path(image["path"], media_dir))
        raise UnreadableMediaError(f"image dict has neither 'bytes' nor 'path' (keys: {sorted(image)})")
    if isinstance(image, (bytes, bytearray)):
        return Image.open(io.BytesIO(image))
    if isinstance(image, str) and image.startswith("data:"):  # a data URI: data:image/png;base64,<bytes>
        header, comma, payload = image.partition(",")
        if not comma or not header.endswith(";base64"):
            raise UnreadableMediaError("a data URI image must be base64: data:image/<format>;base64,<data>")
        try:
            return Image.open(io.BytesIO(base64.b64decode(payload, validate=True)))
        except binascii.Error as error:
            raise UnreadableMediaError(f"the data URI's base64 is malformed: {error}") from error
    if isinstance(image, str) and image.startswith(("http://", "https://")):
        return Image.open(io.BytesIO(_download(image)))
    if isinstance(image, str):
        return Image.open(resolve_path(image, media_dir))
    raise UnreadableMediaError(
        f"unsupported image value of type {type(image).__name__} (a picture is a path, URL, data URI, bytes or a "
        "{'bytes', 'path'} dict)"
    )


URL_TIMEOUT_S = 30.0


def _download(url: str) -> bytes:
    """The bytes at an http(s) URL (qwen-vl-utils reads pictures from URLs too); an error says what failed."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        raise UnreadableMediaError(f"cannot download {url!r}: HTTP {error.code} {error.reason}") from error
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        raise UnreadableMediaError(f"cannot download {url!r}: {getattr(error, 'reason', error)}") from error


def describe_media(image: Any) -> str:
    """A picture or video as a message names it: its path, the start of a data URI, its stored bytes."""
    if isinstance(image, str) and len(image) > 120:  # a data URI: its start and size, not a screenful of base64
        return f"{image[:60]!r}... ({len(image)} characters)"
    if isinstance(image, str):
        return repr(image)
    if isinstance(image, dict) and image.get("bytes") is None and image.get("path"):
        return repr(image["path"])
    if isinstance(image, dict) and isinstance(image.get("bytes"), (bytes, bytearray)):
        # a Hugging Face Image feature's stored picture (EasyR1's geo3k): named by its path when the row keeps one
        stored = f"({len(image['bytes'])} bytes in the row)"
        return f"{image['path']!r} {stored}" if image.get("path") else stored
    return type(image).__name__


def _pil_error(error: Exception) -> str:
    """PIL's message without the repr of the in-memory file it was given (``<_io.BytesIO object at 0x...>``)."""
    return re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(error))


# ----------------------------------------------------------------------------------------------------------------------
# any PIL mode -> RGB, once
# ----------------------------------------------------------------------------------------------------------------------
EXIF_ORIENTATION = 0x0112
WHITE = (255, 255, 255)


def _high_bit_depth_to_8_bit(image: Image.Image) -> Image.Image:
    """16-bit and 32-bit greyscale (modes I;16*, I, F) scaled to 0-255; PIL's own conversion would clip them."""
    values = np.asarray(image, dtype=np.float64)
    if image.mode.startswith("I;16"):
        top = 65535.0
    elif image.mode == "F" and values.size and values.max() <= 1.0:
        top = 1.0
    else:
        top = 255.0 if not values.size or values.max() <= 255 else (65535.0 if values.max() <= 65535 else values.max())
    scaled = np.clip(np.rint(values * (255.0 / top)), 0, 255).astype(np.uint8)
    return Image.fromarray(scaled, mode="L")


def _orientation(image: Image.Image) -> int:
    try:
        return int(image.getexif().get(EXIF_ORIENTATION, 1))
    except Exception:  # a damaged EXIF block (PIL raises many types) leaves the picture as it is stored
        return 1


def to_rgb(image: Image.Image) -> Image.Image:
    """An RGB picture as a viewer shows ``image``: EXIF orientation applied, transparency over white (as
    qwen-vl-utils does), high bit depths scaled rather than clipped, CMYK / palette / greyscale converted."""
    if _orientation(image) != 1:
        image = ImageOps.exif_transpose(image)
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I") or image.mode == "F":
        image = _high_bit_depth_to_8_bit(image)
    has_alpha = image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        image.mode == "P" and "transparency" in image.info
    )
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, WHITE + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


# ----------------------------------------------------------------------------------------------------------------------
# the one sizing rule
# ----------------------------------------------------------------------------------------------------------------------
def _qwen_smart_resize() -> Callable[..., tuple[int, int]]:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    return smart_resize


def _processor_smart_resize(image_processor: Any) -> Callable[..., tuple[int, int]]:
    """The ``smart_resize`` of the module that defines the image processor (the rule it really applies), when it
    takes (height, width, factor, min_pixels, max_pixels); Qwen2-VL's otherwise."""
    module = importlib.import_module(type(image_processor).__module__)
    rule = getattr(module, "smart_resize", None)
    if rule is not None:
        parameters = set(inspect.signature(rule).parameters)
        if {"height", "width", "factor", "min_pixels", "max_pixels"} <= parameters:
            return rule
    return _qwen_smart_resize()


def processor_pixel_limits(image_processor: Any) -> tuple[int, int] | None:
    """(min_pixels, max_pixels) that a dynamic-resolution (Qwen-VL style) image processor resizes into, or None
    for processors that resize otherwise."""
    if getattr(image_processor, "patch_size", None) is None or getattr(image_processor, "merge_size", None) is None:
        return None
    size = getattr(image_processor, "size", None)
    get = size.get if isinstance(size, dict) else (lambda key: getattr(size, key, None))
    low = get("shortest_edge") if size is not None else None
    high = get("longest_edge") if size is not None else None
    low = low if low is not None else getattr(image_processor, "min_pixels", None)
    high = high if high is not None else getattr(image_processor, "max_pixels", None)
    if low is None or high is None:
        return None
    return int(low), int(high)


# passes of the processor's rule until a size is kept (4096 / 28 = 146 is the longest a 4k picture needs)
MAX_SIZING_PASSES = 256


@functools.lru_cache(maxsize=16)
def _warn_clamped(key: str, value: int, clamped: int, low: int, high: int) -> None:
    # once per process and value: the train and validation datasets share the limits
    logger.warning(
        "%s=%d is outside the model processor's range [%d, %d] (its image processor's size, in the model folder's "
        "preprocessor_config.json or processor_config.json): pictures and video frames are sized with %d, as the "
        "processor would size them anyway.",
        key,
        value,
        low,
        high,
        clamped,
    )


@dataclass(frozen=True)
class PictureSizing:
    """How a picture of a given size becomes the size that every processor call keeps (see the module docstring).

    One object serves a whole dataset; it is small and picklable (the screening runs in worker processes)."""

    factor: int
    """patch_size x merge_size: both sides of a stored picture are multiples of it (28 for Qwen2/2.5-VL, 32 for
    Qwen3-VL)."""
    min_pixels: int
    """The effective lower limit: data.min_pixels clamped into the processor's range."""
    max_pixels: int
    """The effective upper limit: data.max_pixels clamped into the processor's range."""
    processor_min_pixels: int
    processor_max_pixels: int
    resample: int
    """The PIL resampling filter of the processor (3 = bicubic for Qwen-VL)."""
    rule: Callable[..., tuple[int, int]]

    @classmethod
    def from_processor(
        cls, processor: Any, min_pixels: int | None = None, max_pixels: int | None = None
    ) -> "PictureSizing | None":
        """The rule for ``processor`` and the data.* limits; None when the processor does not resize Qwen-style."""
        image_processor = getattr(processor, "image_processor", processor)
        limits = processor_pixel_limits(image_processor) if image_processor is not None else None
        if limits is None:
            return None
        low, high = limits
        if min_pixels is not None and max_pixels is not None and min_pixels > max_pixels:
            raise ValueError(
                f"data.min_pixels ({min_pixels}) is larger than data.max_pixels ({max_pixels}); swap or fix them."
            )

        def clamp(value: int | None, default: int, key: str) -> int:
            if value is None:
                return default
            clamped = min(max(int(value), low), high)
            if clamped != int(value):
                _warn_clamped(key, int(value), clamped, low, high)
            return clamped

        resample = getattr(image_processor, "resample", None)
        return cls(
            factor=int(image_processor.patch_size) * int(image_processor.merge_size),
            min_pixels=clamp(min_pixels, low, "data.min_pixels"),
            max_pixels=clamp(max_pixels, high, "data.max_pixels"),
            processor_min_pixels=low,
            processor_max_pixels=high,
            resample=int(resample) if resample is not None else int(Image.Resampling.BICUBIC),
            rule=_processor_smart_resize(image_processor),
        )

    def _resize(self, height: int, width: int, low: int, high: int) -> tuple[int, int]:
        try:
            return self.rule(height=height, width=width, factor=self.factor, min_pixels=low, max_pixels=high)
        except ValueError as error:  # e.g. "absolute aspect ratio must be smaller than 200"
            raise UnreadableMediaError(f"a {width}x{height} picture cannot be sized for the model: {error}") from error

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) to store a ``width`` x ``height`` picture at: the processor's rule under the effective
        limits, then under the processor's own until nothing changes, so that the processor keeps it as it is. (A
        thin picture's short side is held at one factor, which can leave the area above max_pixels; each pass then
        shortens the long side, so the passes end, after at most long side / factor of them.)"""
        new_height, new_width = self._resize(height, width, self.min_pixels, self.max_pixels)
        for _ in range(MAX_SIZING_PASSES):
            again = self._resize(new_height, new_width, self.processor_min_pixels, self.processor_max_pixels)
            if again == (new_height, new_width):
                return new_width, new_height
            new_height, new_width = again
        raise UnreadableMediaError(
            f"a {width}x{height} picture has no size that the processor keeps (it ends at {new_width}x{new_height})"
        )

    def __call__(self, image: Image.Image) -> Image.Image:
        size = self.target_size(*image.size)
        return image if size == image.size else image.resize(size, resample=Image.Resampling(self.resample))


def resize_to_pixel_range(image: Image.Image, min_pixels: int | None, max_pixels: int | None) -> Image.Image:
    """Scale ``image`` (keeping its aspect ratio) so that width x height lies within [min_pixels, max_pixels]: the
    rule for processors that are not Qwen-style (EasyR1's)."""
    width, height = image.size
    if max_pixels is not None and width * height > max_pixels:
        factor = math.sqrt(max_pixels / (width * height))
        image = image.resize((max(1, int(width * factor)), max(1, int(height * factor))))
    elif min_pixels is not None and width * height < min_pixels:
        factor = math.sqrt(min_pixels / (width * height))
        image = image.resize((math.ceil(width * factor), math.ceil(height * factor)))
    return image


_ANIMATED_SEEN: set[str] = set()


def _warn_if_animated(opened: Image.Image, image: Any) -> None:
    """Say (once per picture and process) that an animated picture (GIF, APNG, WebP) is read as its first frame, as
    the Qwen-VL processors read it: its motion would otherwise be lost without a word."""
    frames = getattr(opened, "n_frames", 1)
    name = describe_media(image)
    if frames > 1 and name not in _ANIMATED_SEEN:
        _ANIMATED_SEEN.add(name)
        logger.warning(
            "image %s is animated (%d frames): only its first frame is used, as the processor reads it; give its "
            "frames as a video (data.video_key) for the model to see them all.",
            name,
            frames,
        )


def load_image(
    image: Any,
    media_dir: str | Sequence[str | None] | None = None,
    sizing: PictureSizing | None = None,
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> Image.Image:
    """An RGB PIL image at its stored size: ``sizing``'s when given (Qwen-VL processors), else scaled into
    [min_pixels, max_pixels]. Raises ``UnreadableMediaError`` saying what could not be read or used."""
    try:
        opened = _open_image(image, media_dir)
        opened.load()  # decode now: a truncated file must fail here, not later inside the processor
        _warn_if_animated(opened, image)
        rgb = to_rgb(opened)
    except UnreadableMediaError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:  # PIL's errors for bad files
        raise UnreadableMediaError(f"cannot read image {describe_media(image)}: {_pil_error(error)}") from error
    if sizing is not None:
        try:
            return sizing(rgb)
        except UnreadableMediaError as error:
            raise UnreadableMediaError(f"image {describe_media(image)}: {error}") from error
    return resize_to_pixel_range(rgb, min_pixels, max_pixels)


def _file_frame_indices(total: int, source_fps: float, fps: float, max_frames: int | None) -> list[int]:
    """Which of a video file's ``total`` frames (at ``source_fps``) are kept: every ``source_fps / fps``-th frame
    (every frame when the file's rate is below ``fps``), then ``budget_frame_indices`` of those under
    ``data.max_frames``, or under qwen-vl-utils' own cap (``FPS_MAX_FRAMES``, 768) when there is no budget, as its
    readers stop there too."""
    from qwen_vl_utils.vision_process import FPS_MAX_FRAMES

    step = max(source_fps / fps, 1.0)
    sampled = [min(int(i * step), total - 1) for i in range(max(1, int(total / step)))]
    cap = FPS_MAX_FRAMES if max_frames is None else max_frames
    return [sampled[i] for i in budget_frame_indices(len(sampled), cap)]


def _decode_video_frames(path: str, fps: float, max_frames: int | None) -> tuple[list[Image.Image], float]:
    """The kept frames of a video file (``_file_frame_indices``) and the rate they were sampled at, decoded with
    PyAV (used when qwen-vl-utils has no reader). The rate is qwen-vl-utils' readers' ``kept / total_frames x the
    file's rate``: min(fps, the file's rate), lowered further when the budget or the cap cuts frames.

    Frames are decoded in a stream and only the kept ones become pictures, so memory holds the kept frames, never the
    whole video (a 10-minute 720p clip is ~50 GB as pictures). The indices need the frame count up front: the
    stream's header gives it; when the header has none (some containers do not store it) or the decoded count
    differs, the file is decoded a second time with the count the first pass found. Decoding twice costs time but
    no memory, unlike keeping a reservoir of candidate frames, and the frames kept are exactly those the true count
    picks."""
    import av

    total = None  # the frame count the indices are chosen from: the header's, or the one the first pass decoded
    for _ in range(2):
        with av.open(path) as container:
            stream = container.streams.video[0]
            source_fps = float(stream.average_rate or stream.guessed_rate or 1)
            assumed = total if total is not None else stream.frames
            keep = set(_file_frame_indices(assumed, source_fps, fps, max_frames)) if assumed else set()
            frames, decoded = [], 0
            for index, frame in enumerate(container.decode(stream)):
                if index in keep:
                    frames.append(frame.to_image())
                decoded = index + 1
        if decoded in (0, assumed):
            break
        total = decoded
    if not frames:
        raise UnreadableMediaError("the video file has no frames")
    return frames, len(frames) / decoded * source_fps


def budget_frame_indices(count: int, max_frames: int | None) -> list[int]:
    """Which of ``count`` frames a video keeps under a budget of ``max_frames``: all of them when they fit (or when
    there is no budget), else ``max_frames`` indices spread evenly over the whole video, first and last frame
    included: ``round(i * (count - 1) / (max_frames - 1))`` for ``i = 0 .. max_frames - 1`` (halves round up).
    Integer arithmetic, so the same video gives the same frames on every machine and in every process."""
    if max_frames is None or count <= max_frames:
        return list(range(count))
    if max_frames == 1:
        return [0]
    span, gaps = count - 1, max_frames - 1
    return [(2 * i * span + gaps) // (2 * gaps) for i in range(max_frames)]


def _apply_frame_budget(frames: Any, max_frames: int | None) -> Any:
    """``frames`` (a list, or a tensor with frames first) cut down to ``budget_frame_indices``."""
    keep = budget_frame_indices(len(frames), max_frames)
    if len(keep) == len(frames):
        return frames
    if isinstance(frames, torch.Tensor):
        return frames[torch.tensor(keep)]
    return [frames[i] for i in keep]


def _has_native_video_reader() -> bool:
    from qwen_vl_utils.vision_process import is_decord_available, is_torchcodec_available

    return is_decord_available() or is_torchcodec_available()


def _read_native(path: str, fps: float, max_frames: int | None) -> tuple[list[Image.Image], float]:
    """The frames qwen-vl-utils' own reader (decord / torchcodec) samples, before any resize, and their rate."""
    from qwen_vl_utils.vision_process import VIDEO_READER_BACKENDS, get_video_reader_backend

    # the readers sample at fps with their own cap (768 frames unless told); they get the budget too, then
    # budget_frame_indices makes the count exact whatever they rounded to
    budget = {} if max_frames is None else {"max_frames": max_frames}
    # (frames, sample_fps) in older qwen-vl-utils, (frames, metadata, sample_fps) in 0.0.14
    read = VIDEO_READER_BACKENDS[get_video_reader_backend()]({"video": path, "fps": fps, **budget})
    video, sample_fps = read[0], read[-1]
    sampled = len(video)
    video = _apply_frame_budget(video, max_frames)  # (frames, 3, height, width) uint8
    frames = [Image.fromarray(np.ascontiguousarray(frame.permute(1, 2, 0).numpy())) for frame in video]
    return frames, float(sample_fps) * len(frames) / sampled


def _open_frames(video: Sequence, keep: list[int], media_dir: str | Sequence[str | None] | None) -> list[Image.Image]:
    """Frames ``keep`` of a video given as a list, as RGB pictures of one size; frames of several sizes are an error
    that names which frames (by their number in the list, and file) have which size."""
    frames = [to_rgb(_open_image(video[i], media_dir)) for i in keep]
    by_size: dict[tuple[int, int], list[int]] = {}
    for i, frame in zip(keep, frames):
        by_size.setdefault(frame.size, []).append(i)
    if len(by_size) > 1:

        def named(indices: list[int]) -> str:
            shown = [
                f"{i} {describe_media(video[i])}" if isinstance(video[i], (str, dict)) else str(i) for i in indices
            ]
            more = f" and {len(indices) - 3} more" if len(indices) > 3 else ""
            return ("frame " if len(indices) == 1 else "frames ") + ", ".join(shown[:3]) + more

        sizes = "; ".join(f"{w}x{h}: {named(indices)}" for (w, h), indices in sorted(by_size.items()))
        raise UnreadableMediaError(
            f"the frames of a video given as a list are of {len(by_size)} sizes ({sizes}); give frames of one size"
        )
    return frames


def _video_sizing(sizing: PictureSizing, num_frames: int) -> PictureSizing:
    """``sizing`` with qwen-vl-utils' per-frame cap for videos on top of the picture limits: at most
    ``VIDEO_MAX_TOKEN_NUM`` (768) tokens a frame and an even share of the ``MODEL_SEQ_LEN`` budget, never below 1.05
    x min_pixels (``fetch_video``'s rule), so that a long or large video is not stored at picture size."""
    from qwen_vl_utils.vision_process import FRAME_FACTOR, MODEL_SEQ_LEN, VIDEO_MAX_TOKEN_NUM

    token = sizing.factor * sizing.factor
    share = MODEL_SEQ_LEN * token * 0.9 / num_frames * FRAME_FACTOR
    cap = int(max(min(VIDEO_MAX_TOKEN_NUM * token, share), sizing.min_pixels * 1.05))
    return replace(sizing, max_pixels=max(sizing.min_pixels, min(sizing.max_pixels, cap)))


def _sized_video(frames: list[Image.Image], sizing: PictureSizing) -> torch.Tensor:
    """(frames, 3, height, width) uint8: each frame sized as a picture is (``PictureSizing``, under qwen-vl-utils'
    per-frame cap for videos), padded to an even count with the last frame as qwen-vl-utils pads a frame list."""
    from qwen_vl_utils.vision_process import FRAME_FACTOR

    frames = frames + frames[-1:] * (-len(frames) % FRAME_FACTOR)
    rule = _video_sizing(sizing, len(frames))
    width, height = frames[0].size
    try:
        size = rule.target_size(width, height)
    except UnreadableMediaError as error:
        raise UnreadableMediaError(
            f"its frames of {width}x{height} (aspect ratio {max(width, height) / min(width, height):.1f}) cannot be "
            f"sized for the model within data.min_pixels={rule.min_pixels} / data.max_pixels={rule.max_pixels} "
            f"(after the clamp to the processor's range): {error}"
        ) from error
    resample = Image.Resampling(rule.resample)
    pixels = np.stack([np.asarray(frame if frame.size == size else frame.resize(size, resample)) for frame in frames])
    return torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous()


def _to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """qwen-vl-utils resizes in float; uint8 frames take a quarter of the memory in every batch that carries them."""
    return frames if frames.dtype == torch.uint8 else frames.round().clamp(0, 255).to(torch.uint8)


def load_video(
    video: Any,
    media_dir: str | Sequence[str | None] | None = None,
    fps: float = 2.0,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    max_frames: int | None = None,
    sizing: PictureSizing | None = None,
) -> tuple[torch.Tensor, float]:
    """Frames ``(num_frames, 3, height, width)`` uint8 sampled at ``fps``, and the sampling rate actually used.

    A video file is sampled at min(``fps``, its own rate), at most 768 frames (qwen-vl-utils' cap); a list of
    frames is taken to be at ``fps`` already. ``max_frames`` (``data.max_frames``) caps the frame count AFTER the
    sampling: a longer video keeps ``budget_frame_indices`` of its sampled frames (evenly spread over the whole
    video), so its frames are further apart in time; the returned rate is lowered by the same ratio, which keeps the
    timestamps Qwen models derive from it covering the real duration. Frames are sized with ``sizing`` (the
    dataset's ``PictureSizing``: pictures' clamped limits and rule) when given, else by qwen-vl-utils within
    [min_pixels, max_pixels]. The dataset stores these frames once and both the actor's processor inputs and the
    rollout engine's ``multi_modal_data`` read them, so both sides see the same frames."""
    from qwen_vl_utils import fetch_video

    try:
        if isinstance(video, str) and _has_native_video_reader():
            frames, rate = _read_native(resolve_path(video, media_dir), fps, max_frames)
        elif isinstance(video, str):
            frames, rate = _decode_video_frames(resolve_path(video, media_dir), fps, max_frames)
        else:  # a list of frames (paths, bytes dicts or PIL images), already at the wanted rate
            if not video:
                raise UnreadableMediaError("a video given as a list of frames has none")
            # cut before opening/resizing: a 1000-frame list only decodes the frames it keeps
            keep = budget_frame_indices(len(video), max_frames)
            frames = _open_frames(video, keep, media_dir)
            rate = fps * len(keep) / len(video)
        if sizing is not None:
            try:
                return _sized_video(frames, sizing), rate
            except UnreadableMediaError as error:
                raise UnreadableMediaError(f"video {_describe_video(video)}: {error}") from error
        info = {k: v for k, v in {"min_pixels": min_pixels, "max_pixels": max_pixels}.items() if v is not None}
        frames, sample_fps = fetch_video({"video": frames, "sample_fps": rate, **info}, return_video_sample_fps=True)
        return _to_uint8(frames), float(sample_fps)
    except UnreadableMediaError:
        raise
    except Exception as error:  # decoders raise many types (av.FFmpegError, OSError, RuntimeError, ...)
        raise UnreadableMediaError(f"cannot read video {_describe_video(video)}: {error}") from error


def _describe_video(video: Any) -> str:
    """A video as a message names it: its path, or its frame count and first frame."""
    if isinstance(video, str) or not video:
        return describe_media(video)
    return f"of {len(video)} frames (the first {describe_media(video[0])})"

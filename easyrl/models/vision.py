"""Vision-language models in the FSDP worker: which class loads them, where their vision tower sits, and the
pixel inputs of one micro-batch.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL (arXiv 2409.12191, 2502.13923, 2511.21631) are image-text-to-text models: a ViT
encodes each picture (or video) into tokens that replace the vision pad tokens of the prompt, and the language model
attends over both with 3-D (temporal, height, width) rotary positions. Rows carry their media as
``multi_modal_data`` {"images": [PIL], "videos": [(frames, 3, H, W) uint8]}; the pixel tensors are built here, per
micro-batch and in sample order, so that a sequence only ever meets its own pictures however the batch is cut or
reordered (micro-batches, dynamic batching).
"""

from dataclasses import dataclass
from typing import Any

import torch


MULTI_MODAL_KEY = "multi_modal_data"


# ----------------------------------------------------------------------------------------------------------------------
# model class and vision tower
# ----------------------------------------------------------------------------------------------------------------------
def is_vision_language_config(hf_config: Any) -> bool:
    """True for configs of image-text-to-text models (those with a vision sub-config)."""
    return getattr(hf_config, "vision_config", None) is not None


def resolve_vision_language_class(hf_config: Any, kind: str) -> type | None:
    """The image-text-to-text class for a VLM actor/reference; None for text models (and for value heads, which
    transformers has no VLM class for)."""
    if kind != "causal_lm" or not is_vision_language_config(hf_config):
        return None
    from transformers import AutoModelForImageTextToText

    # the Auto class itself: it offers from_config as well as from_pretrained
    return AutoModelForImageTextToText if type(hf_config) in AutoModelForImageTextToText._model_mapping else None


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The image/video encoder of a VLM (``model.visual`` for Qwen-VL), or None for a text model."""
    get_encoder = getattr(model, "get_encoder", None)
    if get_encoder is None:
        return None
    try:
        encoder = get_encoder(modality="image")
    except (TypeError, ValueError):  # remote-code models with the older signature
        return None
    if encoder is model or encoder is getattr(model, "base_model", None):
        return None  # transformers falls back to the model itself when there is no vision encoder
    return encoder


def freeze_vision_tower(model: torch.nn.Module, config_key: str) -> None:
    """Stop gradients into the vision encoder (``worker.actor.model.freeze_vision_tower``)."""
    tower = vision_tower(model)
    if tower is None:
        raise ValueError(
            f"`{config_key}` is true but {type(model).__name__} has no vision tower; set it to false for text models."
        )
    tower.requires_grad_(False)


# ----------------------------------------------------------------------------------------------------------------------
# pixel inputs of a micro-batch
# ----------------------------------------------------------------------------------------------------------------------
# Every FSDP-sharded vision block all-gathers its weights when it runs, a collective: all ranks must run the vision
# tower the same number of times per micro-batch, whatever media their samples hold. So each micro-batch runs it
# exactly ONCE: images and videos go through the tower together (the Qwen-VL models encode both with the same
# function; video pads are renamed image pads, features ordered as their pads appear), and a micro-batch without media
# encodes a one-token blank picture in an extra sequence of its own whose outputs nobody reads.


@dataclass
class VisionInputs:
    """What a VLM forward of one micro-batch takes beyond the text inputs."""

    input_ids: torch.Tensor
    """(batch, seq) the token ids with every video pad renamed an image pad."""
    pixel_values: torch.Tensor
    """(patches, channels * temporal_patch * patch * patch) of every picture and video, in pad order."""
    image_grid_thw: torch.Tensor
    """(items, 3) the (t, h, w) patch grid of each picture / video, in pad order."""
    blank_tokens: int
    """Tokens of the blank picture to encode in an extra sequence (0: the batch has media of its own)."""
    image_token_id: int


def _media_lists(rows: Any) -> tuple[list, list]:
    """All images and all videos of the rows, in sample order (rows without media contribute nothing)."""
    images, videos = [], []
    for row in rows if rows is not None else []:
        if not row:
            continue
        images.extend(row.get("images") or [])
        videos.extend(row.get("videos") or [])
    return images, videos


def _process_once_each(items: list, run: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per item (patches, dim) pixels and (3,) grid from ``run(unique items) -> (pixels, grids)``; the n samples of a
    prompt share one picture object, which is processed once."""
    firsts: dict[int, Any] = {}
    for item in items:
        firsts.setdefault(id(item), item)
    slot = {key: i for i, key in enumerate(firsts)}
    pixels, grids = run(list(firsts.values()))
    patches = torch.split(pixels, [int(g.prod()) for g in grids])
    return [patches[slot[id(item)]] for item in items], [grids[slot[id(item)]] for item in items]


def _processed(
    processor: Any, images: list, videos: list
) -> tuple[list[torch.Tensor], list[torch.Tensor], list, list]:
    """Per item (patches, dim) pixel tensors and (3,) grids, images then videos."""
    image_patches, image_grids, video_patches, video_grids = [], [], [], []
    if images:

        def run_images(unique: list) -> tuple[torch.Tensor, torch.Tensor]:
            out = processor.image_processor(images=unique, return_tensors="pt")
            return out["pixel_values"], out["image_grid_thw"]

        image_patches, image_grids = _process_once_each(images, run_images)
    if videos:

        def run_videos(unique: list) -> tuple[torch.Tensor, torch.Tensor]:
            # the dataset sampled the frames already: take every frame, as it did when it counted the video tokens
            out = processor.video_processor(videos=unique, return_tensors="pt", do_sample_frames=False)
            return out["pixel_values_videos"], out["video_grid_thw"]

        video_patches, video_grids = _process_once_each(videos, run_videos)
    return image_patches, image_grids, video_patches, video_grids


def _blank_picture(processor: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(merge^2, dim) zero patches and grid (1, merge, merge): one vision token after the spatial merge."""
    image_processor = processor.image_processor
    merge, patch = image_processor.merge_size, image_processor.patch_size
    dim = 3 * image_processor.temporal_patch_size * patch * patch
    return torch.zeros(merge * merge, dim), torch.tensor([1, merge, merge])


def build_vision_inputs(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: Any, processor: Any
) -> VisionInputs:
    """Pixel inputs of exactly these samples (``rows``: their ``multi_modal_data``), ordered as their pad tokens
    appear in the real tokens of ``input_ids`` read row by row (the order the model fills the pads in)."""
    images, videos = _media_lists(rows)
    image_token, video_token = processor.image_token_id, processor.video_token_id
    merge = processor.image_processor.merge_size
    if not images and not videos:
        patches, grid = _blank_picture(processor)
        return VisionInputs(input_ids, patches, grid[None], int(grid.prod()) // merge**2, image_token)
    image_patches, image_grids, video_patches, video_grids = _processed(processor, images, videos)
    real = input_ids[attention_mask.bool()]
    is_video = real[(real == image_token) | (real == video_token)] == video_token  # (vision tokens,) in pad order
    patches, grids, cursor = [], [], 0
    queues = {False: list(zip(image_patches, image_grids)), True: list(zip(video_patches, video_grids))}
    while cursor < len(is_video):
        queue = queues[bool(is_video[cursor])]
        if not queue:
            raise ValueError(
                "The prompt tokens hold more image/video pads than the row's `multi_modal_data` has pictures/videos; "
                "were prompts truncated (data.max_prompt_length) or encoded with another processor?"
            )
        item_patches, grid = queue.pop(0)
        patches.append(item_patches)
        grids.append(grid)
        cursor += int(grid.prod()) // merge**2
    if queues[False] or queues[True] or cursor != len(is_video):
        raise ValueError(
            "The rows' pictures/videos do not match their image/video pad tokens; the prompts must be encoded by the "
            "same processor (worker.actor.model.model_path / tokenizer_path) that the data pipeline used."
        )
    renamed = torch.where(input_ids == video_token, image_token, input_ids)
    device = input_ids.device
    return VisionInputs(renamed, torch.cat(patches).to(device), torch.stack(grids).to(device), 0, image_token)


def require_processor(rows: Any, processor: Any) -> None:
    """Rows with media need the model's processor to become pixel inputs."""
    images, videos = _media_lists(rows)
    if (images or videos) and processor is None:
        raise ValueError(
            "The batch has images/videos (`multi_modal_data`) but the model has no multimodal processor; point "
            "worker.actor.model.model_path (or tokenizer_path) at a vision-language checkpoint with its processor."
        )


# ----------------------------------------------------------------------------------------------------------------------
# positions and the blank sequence
# ----------------------------------------------------------------------------------------------------------------------
def packed_mrope_position_ids(packed_positions: torch.Tensor, seqlens: torch.Tensor) -> torch.Tensor:
    """(3, 1, total) packed 3-D rope positions -> (4, 1, total) with a text row first that restarts at 0 for each
    sequence: Qwen-VL text models in transformers 5 read packed sequence boundaries from that row (4-row layout)."""
    seqlens = seqlens.to(packed_positions.device)
    starts = torch.repeat_interleave(torch.cumsum(seqlens, 0) - seqlens, seqlens)  # (total,) start of each token's row
    text_row = torch.arange(packed_positions.shape[-1], device=packed_positions.device) - starts
    return torch.cat([text_row.view(1, 1, -1).to(packed_positions.dtype), packed_positions], dim=0)


def append_blank_sequence(
    input_ids: torch.Tensor, position_ids: torch.Tensor, tokens: int, image_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed (1, total) ids and (4, 1, total) positions plus a sequence of ``tokens`` image pads at the end."""
    ids = torch.full((1, tokens), image_token_id, dtype=input_ids.dtype, device=input_ids.device)
    positions = torch.arange(tokens, dtype=position_ids.dtype, device=position_ids.device)
    positions = positions.view(1, 1, -1).expand(position_ids.shape[0], 1, -1)
    return torch.cat([input_ids, ids], dim=-1), torch.cat([position_ids, positions], dim=-1)


def append_blank_row(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, tokens: int, image_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded (batch, seq) ids / mask and (3, batch, seq) positions plus a row holding only ``tokens`` image pads
    (right-aligned)."""
    seq = input_ids.shape[-1]
    ids = torch.zeros((1, seq), dtype=input_ids.dtype, device=input_ids.device)
    ids[:, seq - tokens :] = image_token_id
    mask = torch.zeros((1, seq), dtype=attention_mask.dtype, device=attention_mask.device)
    mask[:, seq - tokens :] = 1
    positions = torch.zeros((position_ids.shape[0], 1, seq), dtype=position_ids.dtype, device=position_ids.device)
    positions[..., seq - tokens :] = torch.arange(tokens, dtype=position_ids.dtype, device=position_ids.device)
    return (
        torch.cat([input_ids, ids]),
        torch.cat([attention_mask, mask]),
        torch.cat([position_ids, positions], dim=1),
    )

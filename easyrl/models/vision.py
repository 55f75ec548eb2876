"""Vision-language models in the FSDP worker: which class loads them, where their vision tower sits, and the
pixel inputs of one micro-batch.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL (arXiv 2409.12191, 2502.13923, 2511.21631) are image-text-to-text models: a ViT
encodes each picture (or video) into tokens that replace the vision pad tokens of the prompt, and the language model
attends over both with 3-D (temporal, height, width) rotary positions. Rows carry their media as
``multi_modal_data`` {"images": [PIL], "videos": [(frames, 3, H, W) uint8]}; the pixel tensors are built here, per
micro-batch and in sample order, so that a sequence only ever meets its own pictures however the batch is cut or
reordered (micro-batches, dynamic batching).
"""

from typing import TYPE_CHECKING, Any

import numpy as np
import torch


if TYPE_CHECKING:
    from ..protocol import DataProto


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

    if type(hf_config) not in AutoModelForImageTextToText._model_mapping:
        return None
    return AutoModelForImageTextToText._model_mapping[type(hf_config)]


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
def _media_lists(rows: np.ndarray) -> tuple[list, list]:
    """All images and all videos of the rows, in sample order (rows without media contribute nothing)."""
    images, videos = [], []
    for row in rows:
        if not row:
            continue
        images.extend(row.get("images") or [])
        videos.extend(row.get("videos") or [])
    return images, videos


def multi_modal_model_inputs(data: "DataProto", processor: Any) -> dict[str, torch.Tensor]:
    """pixel_values (patches, dim) + image_grid_thw (images, 3) and/or pixel_values_videos + video_grid_thw for
    exactly the samples of ``data``, concatenated in sample order (the order the model fills the vision pads in).

    Empty for text batches. Raises when rows carry media but the worker has no processor.
    """
    rows = data.non_tensor_batch.get(MULTI_MODAL_KEY)
    if rows is None:
        return {}
    images, videos = _media_lists(rows)
    if not images and not videos:
        return {}
    if processor is None:
        raise ValueError(
            "The batch has images/videos (`multi_modal_data`) but the model has no multimodal processor; point "
            "worker.actor.model.model_path (or tokenizer_path) at a vision-language checkpoint with its processor."
        )
    device = data.batch["input_ids"].device
    inputs: dict[str, torch.Tensor] = {}
    if images:
        out = processor.image_processor(images=images, return_tensors="pt")
        inputs["pixel_values"] = out["pixel_values"].to(device)  # (patches, channels * t * patch * patch)
        inputs["image_grid_thw"] = out["image_grid_thw"].to(device)  # (images, 3)
    if videos:
        # the dataset sampled the frames already: take every frame, as it did when it counted the video tokens
        out = processor.video_processor(videos=videos, return_tensors="pt", do_sample_frames=False)
        inputs["pixel_values_videos"] = out["pixel_values_videos"].to(device)
        inputs["video_grid_thw"] = out["video_grid_thw"].to(device)  # (videos, 3)
    return inputs


def packed_mrope_position_ids(packed_positions: torch.Tensor, seqlens: torch.Tensor) -> torch.Tensor:
    """(3, 1, total) packed 3-D rope positions -> (4, 1, total) with a text row first that restarts at 0 for each
    sequence: Qwen-VL text models in transformers 5 read packed sequence boundaries from that row (4-row layout)."""
    starts = torch.repeat_interleave(torch.cumsum(seqlens, 0) - seqlens, seqlens)  # (total,) start of each token's row
    text_row = torch.arange(packed_positions.shape[-1], device=packed_positions.device) - starts.to(
        packed_positions.device
    )
    return torch.cat([text_row.view(1, 1, -1).to(packed_positions.dtype), packed_positions], dim=0)

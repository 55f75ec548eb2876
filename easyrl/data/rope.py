"""Position ids of one prompt: 1-D for text models, 3-D multimodal rope (temporal, height, width) for Qwen-VL.

Qwen2-VL / Qwen2.5-VL / Qwen3-VL give each vision token a (t, h, w) position and text tokens equal positions on all
three axes (arXiv 2409.12191, section 2.1). The ids must be exactly the ones the model would compute itself, so they
come from the installed transformers' own ``get_rope_index`` of the model class, called on a small host object that
carries only the model config.
"""

import importlib
import inspect
import logging
from types import SimpleNamespace
from typing import Any

import torch


logger = logging.getLogger(__name__)

# processor class -> the transformers model class whose get_rope_index defines the positions
MROPE_MODELS: dict[str, str] = {
    "Qwen2VLProcessor": "transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VLModel",
    "Qwen2_5_VLProcessor": "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLModel",
    "Qwen3VLProcessor": "transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLModel",
}
# Families whose rope puts every text run and vision block one past the largest position before it (on any axis), as
# vLLM and the released Qwen2-VL / Qwen2.5-VL code do. transformers 5.19's get_rope_index instead continues the text
# after a video at start + max(h, w) / merge, which differs once a video spans more positions in time than in space:
# the rollout engine would then sample with other positions than the actor trains with.
CONTINUE_AFTER_LARGEST = frozenset({"Qwen2VLProcessor", "Qwen2_5_VLProcessor"})
# Qwen2.5-VL's released checkpoints all use 2 (the config class default differs); only needed without a config.
DEFAULT_TOKENS_PER_SECOND = 2


def text_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(..., seq)`` positions counting only attended tokens; padding gets 0."""
    return torch.clip(attention_mask.long().cumsum(-1) - 1, min=0)


def continue_after_largest(positions: torch.Tensor, vision: torch.Tensor) -> torch.Tensor:
    """``positions`` (3, seq) with each text run and each vision block (``vision`` (seq,) bool marks vision tokens)
    moved to start one past the largest position before it; the layout inside a run or block is kept."""
    out = positions.clone()
    boundaries = (torch.nonzero(vision[1:] != vision[:-1]).flatten() + 1).tolist()
    largest = -1
    for start, end in zip([0, *boundaries], [*boundaries, positions.shape[-1]]):
        segment = out[:, start:end]
        segment += largest + 1 - int(segment.min())
        largest = int(segment.max())
    return out


def _import(dotted: str) -> Any:
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _config_from_processor(processor: Any) -> Any:
    """The few config values get_rope_index reads, when no model config.json can be found."""
    tokenizer = processor.tokenizer
    vision = SimpleNamespace(
        spatial_merge_size=processor.image_processor.merge_size, tokens_per_second=DEFAULT_TOKENS_PER_SECOND
    )
    return SimpleNamespace(
        vision_config=vision,
        image_token_id=processor.image_token_id,
        video_token_id=processor.video_token_id,
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
    )


def _load_model_config(processor: Any, model_path: str | None) -> Any:
    from transformers import AutoConfig

    path = model_path or getattr(processor.tokenizer, "name_or_path", None)
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, TypeError):
        logger.warning(
            "No model config found at %r: 3-D rope positions use the processor's merge size and tokens_per_second=%d.",
            path,
            DEFAULT_TOKENS_PER_SECOND,
        )
        return _config_from_processor(processor)


class MRopeIndex:
    """``__call__(model_inputs) -> (3, seq)`` position ids of one unpadded prompt, via the model's get_rope_index."""

    def __init__(self, processor: Any, model_config: Any = None, model_path: str | None = None):
        model_cls = _import(MROPE_MODELS[type(processor).__name__])
        config = model_config if model_config is not None else _load_model_config(processor, model_path)
        members = {"get_rope_index": model_cls.get_rope_index}
        if hasattr(model_cls, "get_vision_position_ids"):
            members["get_vision_position_ids"] = model_cls.get_vision_position_ids
        self.host = type(f"{model_cls.__name__}RopeIndex", (), members)()
        self.host.config = config
        self.accepted = set(inspect.signature(model_cls.get_rope_index).parameters)
        self.image_token_id = processor.image_token_id
        self.video_token_id = processor.video_token_id
        self.continue_after_largest = type(processor).__name__ in CONTINUE_AFTER_LARGEST

    def __call__(self, model_inputs: dict[str, Any]) -> torch.Tensor:
        input_ids = model_inputs["input_ids"].view(1, -1)  # (1, seq)
        kwargs = {
            key: model_inputs[key]
            for key in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
            if key in self.accepted and model_inputs.get(key) is not None
        }
        if "second_per_grid_ts" in kwargs:
            kwargs["second_per_grid_ts"] = torch.as_tensor(kwargs["second_per_grid_ts"])
        if "mm_token_type_ids" in self.accepted:
            token_types = model_inputs.get("mm_token_type_ids")
            if token_types is None:  # text 0, image 1, video 2
                token_types = (input_ids == self.image_token_id).int() + 2 * (input_ids == self.video_token_id).int()
            kwargs["mm_token_type_ids"] = token_types.view(1, -1)
        position_ids, _ = self.host.get_rope_index(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        positions = position_ids[:, 0]  # (3, seq)
        if self.continue_after_largest:
            vision = (input_ids[0] == self.image_token_id) | (input_ids[0] == self.video_token_id)
            positions = continue_after_largest(positions, vision)
        return positions


def make_position_id_fn(processor: Any, model_config: Any = None, model_path: str | None = None):
    """A function ``model_inputs -> position ids`` of one unpadded prompt: (3, seq) for Qwen-VL processors, (seq,)
    otherwise."""
    if processor is not None and type(processor).__name__ in MROPE_MODELS:
        return MRopeIndex(processor, model_config, model_path)
    return _text_positions


def _text_positions(model_inputs: dict[str, Any]) -> torch.Tensor:
    return text_position_ids(torch.ones_like(model_inputs["input_ids"].view(-1)))  # (seq,)

"""Tiny random Qwen2-VL, Qwen2.5-VL and Qwen3-VL models with offline processors, one builder per family.

All share the tokenizer of ``tiny_vl`` (SmolLM2's plus the Qwen-VL vision tokens) and its chat template (start +
ONE pad + end per image or video). Text attention uses head_dim 32 (what vLLM's CPU kernels accept); the vision
towers are two blocks wide enough for the real code paths (Qwen2.5-VL window attention, Qwen3-VL deepstack).
Weights are fp32 (the test machines have no fast bf16 path) and drawn wider than a real initialisation (std
``WEIGHT_STD``), so that greedy answers depend on the picture instead of repeating one token.
"""

from collections.abc import Callable
from pathlib import Path

import torch

from .tiny_vl import QWEN2_VL_CHAT_TEMPLATE, TINY_MAX_PIXELS, TINY_MIN_PIXELS, tiny_vl_processor


WEIGHT_STD = 0.3


def _text_config(tokenizer, **extra) -> dict:
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        **extra,
    }


def _special_token_ids(tokenizer) -> dict:
    token_id = tokenizer.convert_tokens_to_ids
    return {
        "image_token_id": token_id("<|image_pad|>"),
        "video_token_id": token_id("<|video_pad|>"),
        "vision_start_token_id": token_id("<|vision_start|>"),
        "vision_end_token_id": token_id("<|vision_end|>"),
    }


def save_random_model(model_cls: type, config, path: Path, seed: int, processor=None) -> Path:
    """Build ``model_cls(config)`` with N(0, WEIGHT_STD) matrices (norms stay 1, biases 0, under ``seed``) and save
    it (with ``processor``) as a released checkpoint is laid out."""
    from ..models.checkpoint_layout import save_pretrained_in_released_layout

    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, WEIGHT_STD)
    path = Path(path)
    save_pretrained_in_released_layout(model, str(path))
    if processor is not None:
        processor.save_pretrained(path)
    return path


def tiny_qwen2_vl_processor():
    """Qwen2-VL's processor around the shared tiny tokenizer (patch 14, merge 2, as the real one)."""
    from transformers import Qwen2VLProcessor

    base = tiny_vl_processor()
    return Qwen2VLProcessor(
        image_processor=base.image_processor,
        tokenizer=base.tokenizer,
        video_processor=base.video_processor,
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    )


def tiny_qwen3_vl_processor():
    """Qwen3-VL's processor: patch 16, merge 2 (one vision token per 32x32 pixels), mean/std 0.5 as released."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tokenizer = tiny_vl_processor().tokenizer
    vision = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2}
    normalise = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    pixels = {"shortest_edge": TINY_MIN_PIXELS, "longest_edge": TINY_MAX_PIXELS}
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=pixels, **vision, **normalise),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(size=pixels, **vision, **normalise),
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    )


def build_tiny_qwen2_vl(path: str | Path, *, seed: int = 0) -> Path:
    """Save a random Qwen2-VL (text hidden 64, 2 layers; vision width 64, depth 2) and its processor."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    processor = tiny_qwen2_vl_processor()
    tokenizer = processor.tokenizer
    # head_dim 32 -> 16 rotary frequencies split over (temporal, height, width)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}
    config = Qwen2VLConfig(
        text_config=_text_config(tokenizer, rope_parameters=rope),
        vision_config={
            "depth": 2,
            "embed_dim": 64,
            "hidden_size": 64,  # the merger's output width = the text hidden size
            "mlp_ratio": 2,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        tie_word_embeddings=True,
        **_special_token_ids(tokenizer),
    )
    return save_random_model(Qwen2VLForConditionalGeneration, config, path, seed, processor)


def build_tiny_qwen2_5_vl(path: str | Path, *, seed: int = 0) -> Path:
    """Save a random Qwen2.5-VL (text hidden 64, 2 layers; vision depth 2, one windowed and one full block)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    processor = tiny_vl_processor()
    tokenizer = processor.tokenizer
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}
    config = Qwen2_5_VLConfig(
        text_config=_text_config(tokenizer, head_dim=32, rope_parameters=rope),
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,  # 2x2 merged tokens per window: small pictures still span several windows
            "fullatt_block_indexes": [1],
            "out_hidden_size": 64,
            "tokens_per_second": 2,
        },
        tie_word_embeddings=True,
        **_special_token_ids(tokenizer),
    )
    return save_random_model(Qwen2_5_VLForConditionalGeneration, config, path, seed, processor)


def build_tiny_qwen3_vl(path: str | Path, *, seed: int = 0) -> Path:
    """Save a random Qwen3-VL (text hidden 64, head_dim 32, 2 layers; vision depth 2 with one deepstack layer)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    processor = tiny_qwen3_vl_processor()
    tokenizer = processor.tokenizer
    # interleaved mrope over head_dim / 2 = 16 frequencies (the released split is 24/20/20 of 64)
    rope = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [6, 5, 5], "mrope_interleaved": True}
    config = Qwen3VLConfig(
        text_config=_text_config(tokenizer, head_dim=32, rope_parameters=rope),
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 64,  # an 8x8 grid of learned positions, interpolated per image
            "deepstack_visual_indexes": [0],
        },
        tie_word_embeddings=True,
        **_special_token_ids(tokenizer),
    )
    return save_random_model(Qwen3VLForConditionalGeneration, config, path, seed, processor)


# family -> builder(path, seed=...) -> path
TINY_VLM_BUILDERS: dict[str, Callable[..., Path]] = {
    "qwen2_vl": build_tiny_qwen2_vl,
    "qwen2_5_vl": build_tiny_qwen2_5_vl,
    "qwen3_vl": build_tiny_qwen3_vl,
}


def build_tiny_vlm(family: str, path: str | Path, *, seed: int = 0) -> Path:
    """Save a tiny random model of ``family`` (qwen2_vl, qwen2_5_vl, qwen3_vl) with its processor to ``path``."""
    if family not in TINY_VLM_BUILDERS:
        raise ValueError(f"Unknown tiny VLM family {family!r}; choose one of {sorted(TINY_VLM_BUILDERS)}.")
    return TINY_VLM_BUILDERS[family](path, seed=seed)


def ensure_tiny_vlm(family: str, cache_dir: str | Path | None = None) -> Path:
    """A cached tiny random ``family`` model folder (``builtin://Tiny-...`` model paths), built on first use (~10 s)."""
    import os
    import shutil

    from ..demo.smollm2 import DEFAULT_CACHE

    target = Path(cache_dir or DEFAULT_CACHE) / f"tiny-random-{family}"
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    build_tiny_vlm(family, tmp)
    try:
        tmp.rename(target)  # atomic: a half-written folder never looks complete
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def set_pixel_limits(path: str | Path, min_pixels: int, max_pixels: int) -> Path:
    """Give the saved processor of the model at ``path`` other picture limits (its image and video processors'
    ``size`` = {shortest_edge: min_pixels, longest_edge: max_pixels}), as a user's own checkpoint may have."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(path)
    for sub in (processor.image_processor, processor.video_processor):
        sub.size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    processor.save_pretrained(path)
    return Path(path)

"""A tiny Qwen2.5-VL, built offline: processor (tokenizer + image/video processors + chat template) and model.

The tokenizer is SmolLM2's with Qwen-VL's vision tokens added, the image and video processors are built from
arguments (patch 14, merge 2: one vision token per 28x28 pixels), and the chat template is Qwen2.5-VL's. The
random model uses head_dim 32 everywhere so the CPU attention kernels of vLLM accept it.
"""

from functools import lru_cache
from pathlib import Path

import torch


VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

# Qwen2-VL / Qwen2.5-VL chat template (ChatML; each image/video becomes start + ONE pad + end).
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Small images keep tests fast: at most 64 vision patches (16 tokens after the 2x2 merge) per image.
TINY_MIN_PIXELS = 28 * 28
TINY_MAX_PIXELS = 8 * 8 * 14 * 14


@lru_cache(maxsize=1)
def tiny_vl_processor():
    """A Qwen2_5_VLProcessor that needs no download."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    tokenizer = _vl_tokenizer()
    vision = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}
    pixels = {"shortest_edge": TINY_MIN_PIXELS, "longest_edge": TINY_MAX_PIXELS}
    image_processor = Qwen2VLImageProcessor(size=pixels, **vision)
    video_processor = Qwen2VLVideoProcessor(size=pixels, **vision)
    return Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    )


def _vl_tokenizer():
    """SmolLM2's tokenizer (a copy: the cached one stays text-only) plus the Qwen-VL vision tokens."""
    import copy

    from .tiny_models import tiny_tokenizer

    tokenizer = copy.deepcopy(tiny_tokenizer())
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = QWEN2_VL_CHAT_TEMPLATE
    return tokenizer


def build_tiny_qwen2_5_vl(path: str | Path, *, seed: int = 0) -> Path:
    """Save a random-weight Qwen2.5-VL (text hidden 64, 2 layers; vision depth 2) plus its processor to ``path``."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    processor = tiny_vl_processor()
    tokenizer = processor.tokenizer
    token_id = tokenizer.convert_tokens_to_ids
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "max_position_embeddings": 4096,
        # head_dim / 2 = 16 rotary frequencies split over (temporal, height, width)
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision_config = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1],
        "out_hidden_size": 64,
        "tokens_per_second": 2,
    }
    config = Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"),
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
    path = Path(path)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path

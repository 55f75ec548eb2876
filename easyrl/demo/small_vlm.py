"""`builtin://Small-Qwen2.5-VL`: a small Qwen2.5-VL-shaped model, untrained, sized to LEARN a picture task on a CPU.

The `Tiny-*` models (easyrl/testing/tiny_vlms.py) are for exercising code paths: hidden 64 and weights drawn wide
so that greedy answers vary without training. This one is what a user with a new architecture starts from: the
standard initialisation (transformers' `_init_weights`, std `initializer_range`), text hidden 128 over 4 layers
(head_dim 32, which vLLM's CPU kernels accept) and a 2-block vision tower of width 128. Nearly all its compute on a
CPU is the tied 49k-token embedding / output layer, so the layers are cheap; the shared tiny tokenizer and
processor (SmolLM2's tokenizer plus the Qwen-VL vision tokens; patch 14, merge 2) need no download.
"""

import os
import shutil
from pathlib import Path

from .smollm2 import DEFAULT_CACHE


SMALL_VLM_DIR = "small-qwen2_5_vl"


def build_small_qwen2_5_vl(path: str | Path, *, seed: int = 0) -> Path:
    """Save the untrained small Qwen2.5-VL and its processor to ``path``."""
    # torch and transformers load here, not at import: `easyrl check` resolves builtin:// names without them
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from ..models.checkpoint_layout import save_pretrained_in_released_layout
    from ..testing.tiny_vl import tiny_vl_processor

    processor = tiny_vl_processor()
    tokenizer = processor.tokenizer
    token_id = tokenizer.convert_tokens_to_ids
    # head_dim 32 -> 16 rotary frequencies split over (temporal, height, width)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 128,
            "intermediate_size": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "max_position_embeddings": 4096,
            "rope_parameters": rope,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 128,
            "intermediate_size": 512,
            "num_heads": 4,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "fullatt_block_indexes": [1],
            "out_hidden_size": 128,
            "tokens_per_second": 2,
        },
        tie_word_embeddings=True,
        image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"),
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
    path = Path(path)
    save_pretrained_in_released_layout(model, str(path))
    processor.save_pretrained(path)
    return path


def ensure_small_qwen2_5_vl(cache_dir: str | Path | None = None) -> Path:
    """The cached model folder, built on first use (a few seconds)."""
    target = Path(cache_dir or DEFAULT_CACHE) / SMALL_VLM_DIR
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    build_small_qwen2_5_vl(tmp)
    try:
        tmp.rename(target)  # atomic: a half-written folder never looks complete
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target

"""Tiny random mixture-of-experts models (Qwen3-MoE, Qwen3-VL-MoE) saved in the released checkpoints' layout.

Every decoder layer is sparse: 4 experts, 2 per token, top-k weights renormalised (``norm_topk_prob``, which the
released configs set and vLLM reads). The expert width differs from the hidden size and its double, so that a
transposed expert stack cannot pass for the right one. Weights are fp32 N(0, ``WEIGHT_STD``) like the tiny VLMs.
"""

import json
from pathlib import Path

from .tiny_models import tiny_tokenizer
from .tiny_vlms import ensure_tiny_vlm, save_random_model


MOE_KEYS = {"num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": []}
VISION_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def build_tiny_qwen3_moe(path: str | Path, *, moe_intermediate_size: int = 48, seed: int = 0) -> Path:
    """Save a random Qwen3-MoE text model (hidden 64, head_dim 32, 2 layers) and the tiny tokenizer.

    The default expert width 48 is no multiple of 32, so vLLM's CPU expert kernel pads it (the padded path)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=moe_intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        norm_topk_prob=True,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MOE_KEYS,
    )
    path = Path(path)
    save_random_model(Qwen3MoeForCausalLM, config, path, seed)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_qwen3_vl_moe(path: str | Path, *, moe_intermediate_size: int = 128, seed: int = 0) -> Path:
    """Save a random Qwen3-VL-MoE with the tiny Qwen3-VL's vision tower, sizes and processor (the stand-in for
    Qwen3-VL-30B-A3B). The default expert width 128 is a multiple of 64: vLLM pads none of its kernels' sizes."""
    from transformers import AutoProcessor, Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    dense = Path(ensure_tiny_vlm("qwen3_vl"))
    dense_config = json.loads((dense / "config.json").read_text())
    text = {
        **dense_config["text_config"],
        **MOE_KEYS,
        "moe_intermediate_size": moe_intermediate_size,
        "norm_topk_prob": True,  # transformers always renormalises; vLLM reads the key
    }
    config = Qwen3VLMoeConfig(
        text_config=text,
        vision_config=dense_config["vision_config"],
        tie_word_embeddings=True,
        **{key: dense_config[key] for key in VISION_TOKEN_KEYS},
    )
    path = Path(path)
    save_random_model(Qwen3VLMoeForConditionalGeneration, config, path, seed)
    AutoProcessor.from_pretrained(dense).save_pretrained(path)
    return path

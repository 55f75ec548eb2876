"""Memory-efficient token log-probabilities and entropies from logits.

A full-vocabulary fp32 log-softmax over a whole batch costs batch x seq x vocab x 4 bytes (about 2.5 GB for
8 x 512 tokens with a 152k vocabulary), on top of the logits themselves. Here the fp32 work runs over chunks of
rows, and the backward pass recomputes the softmax chunk by chunk from the (bf16 or fp32) logits instead of keeping
fp32 copies alive.
"""

import torch
from torch.utils.checkpoint import checkpoint


# fp32 elements processed at once (64M elements = 256 MB); rows per chunk = this / vocab size
_CHUNK_ELEMENTS = 1 << 26


def _rows_per_chunk(vocab_size: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(vocab_size, 1))


class _TokenLogProbs(torch.autograd.Function):
    """log softmax(z / T)[label] per row, with d/dz = (onehot(label) - softmax(z / T)) / T computed in chunks."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, inv_temperature: float) -> torch.Tensor:
        # logits: (rows, vocab) in any float dtype; labels: (rows,) int64 -> (rows,) fp32
        rows, vocab = logits.shape
        step = _rows_per_chunk(vocab)
        log_probs = torch.empty(rows, dtype=torch.float32, device=logits.device)
        logsumexp = torch.empty(rows, dtype=torch.float32, device=logits.device)
        for start in range(0, rows, step):
            z = logits[start : start + step].float() * inv_temperature
            lse = torch.logsumexp(z, dim=-1)
            log_probs[start : start + step] = z.gather(-1, labels[start : start + step, None]).squeeze(-1) - lse
            logsumexp[start : start + step] = lse
        ctx.save_for_backward(logits, labels, logsumexp)
        ctx.inv_temperature = inv_temperature
        return log_probs

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        logits, labels, logsumexp = ctx.saved_tensors
        inv_temperature = ctx.inv_temperature
        step = _rows_per_chunk(logits.shape[-1])
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], step):
            end = start + step
            g = grad_output[start:end, None].float()  # (chunk, 1)
            probs = torch.exp(logits[start:end].float() * inv_temperature - logsumexp[start:end, None])
            grad = (-probs * g).scatter_add_(-1, labels[start:end, None], g)
            grad_logits[start:end] = (grad * inv_temperature).to(logits.dtype)
        return grad_logits, None, None


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(label) under softmax(logits / temperature): (..., vocab), (...) -> (...) in fp32, differentiable."""
    vocab = logits.shape[-1]
    flat = _TokenLogProbs.apply(logits.reshape(-1, vocab), labels.reshape(-1).long(), 1.0 / temperature)
    return flat.view(labels.shape)


def _entropy_chunk(z: torch.Tensor, inv_temperature: float) -> torch.Tensor:
    z = z.float() * inv_temperature
    lse = torch.logsumexp(z, dim=-1)
    return lse - (torch.softmax(z, dim=-1) * z).sum(-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position: (..., vocab) -> (...) in fp32.

    Under autograd every chunk is recomputed in the backward pass (activation checkpointing), so an entropy bonus
    keeps no fp32 vocabulary-sized activations alive.
    """
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    step = _rows_per_chunk(vocab)
    inv_temperature = 1.0 / temperature
    chunks = []
    for start in range(0, flat.shape[0], step):
        chunk = flat[start : start + step]
        if torch.is_grad_enabled() and chunk.requires_grad:
            chunks.append(checkpoint(_entropy_chunk, chunk, inv_temperature, use_reentrant=False))
        else:
            chunks.append(_entropy_chunk(chunk, inv_temperature))
    entropy = torch.cat(chunks) if chunks else flat.new_zeros(0, dtype=torch.float32)
    return entropy.view(logits.shape[:-1])

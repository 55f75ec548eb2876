"""Token log-probs and entropies straight from hidden states: the (tokens, vocab) logits never exist at once.

With ``worker.actor.model.use_fused_kernels`` the LM head of the actor and the reference computes, for every kept
position, log softmax(W h / T)[label] and the entropy of softmax(W h / T), one chunk of rows at a time: a chunk's
logits (rows x vocab, about 64M fp32 elements, `torch_functional.rows_per_chunk`) are made, reduced and dropped. The
usual path keeps the whole (tokens, vocab) logits tensor alive through the backward pass (4.9 GB in bf16 for 16k
response tokens and a 152k vocabulary, and as much again for its gradient); here the backward pass recomputes each
chunk's logits instead, which costs one more LM-head matmul.

Why the head's own ``forward`` is swapped, and not the hidden states taken out of the model: under FSDP2 the head's
weight (for tied embeddings: the embedding matrix) is gathered only inside the root module's forward and backward, so
the projection has to run where the model runs it. `run_with_fused_head` sets an instance ``forward`` on
``module.get_output_embeddings()`` for one call; the model then carries (rows, kept, 1 or 2) fp32 values (log-prob,
entropy) out as its ``.logits``.

Why a custom autograd Function and not activation checkpointing per chunk: the backward pass needs each chunk's
logits once, for the log-prob and the entropy gradient together, and the forward pass's log-sum-exp and entropy are
kept (two floats per row), so neither is recomputed; checkpointing would re-run the whole chunk forward (log-sum-exp
and entropy passes over rows x vocab) and then differentiate the entropy through autograd, with several fp32
rows x vocab temporaries alive at once. The arithmetic is `torch_functional`'s chunk kernels, eager or compiled by
``worker.actor.use_torch_compile`` (on a GPU the log-prob ones are Triton kernels, `triton_logprobs`):
`_log_probs_chunk` and `_entropy_chunk` forward, their closed-form gradients `_log_probs_grad_chunk` and
`_entropy_grad_chunk` backward.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..utils.torch_functional import ChunkKernels, rows_per_chunk


@dataclass(frozen=True)
class FusedHeadRequest:
    """What the fused head computes at each kept position."""

    temperature: float
    """Logits are divided by it (the rollout's sampling temperature)."""
    kernels: ChunkKernels
    """`torch_functional.select_chunk_kernels(worker.actor.use_torch_compile)`."""
    entropy: bool = False
    """Also the entropy of softmax(logits / T)."""
    entropy_grad: bool = True
    """The entropy takes part in the loss (else it is a metric and carries no gradient)."""


class _FusedHeadLogProbs(torch.autograd.Function):
    """(rows, hidden) x (vocab, hidden) -> log p(label) (rows,) and entropy (rows,) fp32, chunk by chunk."""

    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,  # (rows, hidden)
        weight: torch.Tensor,  # (vocab, hidden)
        bias: torch.Tensor | None,  # (vocab,)
        labels: torch.Tensor,  # (rows,) int64
        inv_temperature: float,
        kernels: ChunkKernels,
        with_entropy: bool,
        entropy_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        rows = hidden.shape[0]
        step = rows_per_chunk(weight.shape[0])
        log_probs = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        logsumexp = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(rows, dtype=torch.float32, device=hidden.device) if with_entropy else None
        for start in range(0, rows, step):
            end = start + step
            logits = F.linear(hidden[start:end], weight, bias)  # (chunk, vocab): the only vocabulary-sized tensor
            log_probs[start:end], logsumexp[start:end] = kernels.log_probs(logits, labels[start:end], inv_temperature)
            if with_entropy:
                entropy[start:end] = kernels.entropy(logits, inv_temperature)
        ctx.save_for_backward(hidden, weight, bias, labels, logsumexp, entropy)
        ctx.inv_temperature = inv_temperature
        ctx.kernels = kernels
        # an output the loss does not use arrives as None in backward, not as zeros to multiply through
        ctx.set_materialize_grads(False)
        if with_entropy and not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        hidden, weight, bias, labels, logsumexp, entropy = ctx.saved_tensors
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if needs_hidden else None
        # accumulated over chunks in the weight's dtype, as autograd accumulates a parameter used several times
        grad_weight = torch.zeros_like(weight) if needs_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if needs_bias else None
        if grad_log_probs is None and grad_entropy is None:
            return grad_hidden, grad_weight, grad_bias, None, None, None, None, None
        inv_temperature, kernels = ctx.inv_temperature, ctx.kernels
        step = rows_per_chunk(weight.shape[0])
        for start in range(0, hidden.shape[0], step):
            end = start + step
            chunk = hidden[start:end]
            logits = F.linear(chunk, weight, bias)  # (chunk, vocab), recomputed: the one extra LM-head matmul
            grad_logits = None
            if grad_log_probs is not None:
                grad_logits = kernels.log_probs_grad(
                    logits, labels[start:end], logsumexp[start:end], grad_log_probs[start:end], inv_temperature
                )
            if grad_entropy is not None:
                grad_from_entropy = kernels.entropy_grad(
                    logits, logsumexp[start:end], entropy[start:end], grad_entropy[start:end], inv_temperature
                )
                grad_logits = grad_from_entropy if grad_logits is None else grad_logits + grad_from_entropy
            if needs_hidden:
                grad_hidden[start:end] = grad_logits @ weight
            if needs_weight:
                grad_weight.addmm_(grad_logits.t(), chunk)
            if needs_bias:
                grad_bias += grad_logits.float().sum(0)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def fused_log_probs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    request: FusedHeadRequest,
) -> torch.Tensor:
    """(..., hidden) hidden states and (...) labels -> (..., 1) fp32 log p(label), or (..., 2) with the entropy
    second, under softmax((hidden @ weight.T + bias) / T); differentiable w.r.t. hidden, weight and bias."""
    log_probs, entropy = _FusedHeadLogProbs.apply(
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        bias,
        labels.reshape(-1).long(),
        1.0 / request.temperature,
        request.kernels,
        request.entropy,
        request.entropy_grad,
    )
    columns = [log_probs] if entropy is None else [log_probs, entropy]
    # stacked last, so that the result is no view (FSDP2 warns when a module returns one: its backward hook would
    # be lost to an in-place op on it)
    return torch.stack([column.view(labels.shape) for column in columns], dim=-1)


@contextmanager
def _forward_replaced(module: torch.nn.Module, forward: Callable) -> Iterator[None]:
    """``module.forward`` is ``forward`` inside the block; whatever was there before (the class's method, or an
    instance attribute some library set) comes back after it, also on an exception."""
    previous = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if previous is None:
            del module.forward
        else:
            module.forward = previous


def run_with_fused_head(
    module: torch.nn.Module, labels: torch.Tensor, request: FusedHeadRequest, run_model: Callable
) -> torch.Tensor:
    """Call ``run_model()`` (one forward of ``module``, with ``logits_to_keep``) with its LM head replaced by the fused
    log-prob / entropy head; return what the model put in ``.logits``: (rows, kept, 1 or 2) fp32.

    ``labels`` (rows, kept) int: the token each kept position predicts (0 where it predicts nothing; the caller drops
    those positions). The head's weight and bias are read inside the call, where FSDP2 has gathered them.
    """
    head = module.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(
            f"`worker.actor.model.use_fused_kernels` computes log-probs from the LM head's weight, but "
            f"{type(module).__name__}'s output embedding is {type(head).__name__}, not a linear layer. "
            "Set worker.actor.model.use_fused_kernels=false for this model."
        )
    produced = []

    def fused_forward(hidden: torch.Tensor) -> torch.Tensor:  # (rows, kept, hidden)
        if hidden.shape[:-1] != labels.shape:
            raise ValueError(
                f"The fused LM head got hidden states for {tuple(hidden.shape[:-1])} positions but labels for "
                f"{tuple(labels.shape)}: {type(module).__name__} keeps positions differently from logits_to_keep. "
                "Set worker.actor.model.use_fused_kernels=false for this model."
            )
        out = fused_log_probs_and_entropy(hidden, head.weight, head.bias, labels, request)
        produced.append(out)
        return out

    with _forward_replaced(head, fused_forward):
        logits = run_model().logits
    # A model that rescales or soft-caps its logits after the head (Gemma's final_logit_softcapping, Cohere's
    # logit_scale) would apply that to log-probs; refuse rather than return numbers that mean something else.
    if len(produced) != 1 or logits is not produced[0]:
        raise ValueError(
            f"{type(module).__name__} changes its logits after the LM head (or calls the head more than once), so "
            "log-probs cannot be fused into the head. Set worker.actor.model.use_fused_kernels=false for this model."
        )
    return logits

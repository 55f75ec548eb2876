"""Reducing a per-token loss matrix to the scalar that is back-propagated (`loss_avg_mode`), and entropy.

Modes (L = loss matrix (batch, response_len), m = response mask, B = rows, |y_i| = valid tokens of row i):
- token-mean:          sum_i sum_t L_it m_it / sum_i |y_i|          every token weighs the same (DAPO, 2503.14476)
- seq-mean-token-mean: (1/B) sum_i (1/|y_i|) sum_t L_it m_it         every sequence weighs the same (GRPO, 2402.03300)
- seq-mean-token-sum:  (1/B) sum_i sum_t L_it m_it                   no length normalisation (Dr. GRPO, 2503.20783)

Dr. GRPO (and TRL's loss_type=dr_grpo, verl's seq-mean-token-sum-norm) also divides by a constant, the largest
response length: the same direction, a gradient that many times smaller. Here it is not divided, so its norm is about
that many times larger than token-mean's, and worker.actor.max_grad_norm (1.0) clips nearly every step.

`denominator` replaces the local count (tokens for token-mean, rows for the seq modes) by a global one, so that a
mini-batch split into micro-batches and devices adds up to exactly the mini-batch loss.
"""

from collections.abc import Callable

import torch

from .masked import masked_mean


_AGGREGATORS: dict[str, Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor]] = {}


def _register(name: str):
    def decorator(fn):
        _AGGREGATORS[name] = fn
        return fn

    return decorator


def list_loss_avg_modes() -> list[str]:
    return sorted(_AGGREGATORS)


@_register("token-mean")
def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None) -> torch.Tensor:
    total = (loss_mat * mask).sum()
    return total / (denominator if denominator is not None else mask.sum().clamp(min=1))


@_register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None) -> torch.Tensor:
    per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (batch,)
    return per_seq.sum() / (denominator if denominator is not None else max(per_seq.numel(), 1))


@_register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None) -> torch.Tensor:
    per_seq = (loss_mat * mask).sum(-1)  # (batch,)
    return per_seq.sum() / (denominator if denominator is not None else max(per_seq.numel(), 1))


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, loss_avg_mode: str, denominator: float | None = None
) -> torch.Tensor:
    """Scalar loss from a (batch, response_len) loss matrix; see the module docstring for the modes."""
    if loss_avg_mode not in _AGGREGATORS:
        raise ValueError(f"loss_avg_mode `{loss_avg_mode}` is not one of: {', '.join(list_loss_avg_modes())}.")
    return _AGGREGATORS[loss_avg_mode](loss_mat, mask.to(loss_mat.dtype), denominator)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H(pi) = logsumexp(z) - sum_v softmax(z)_v z_v per position: (..., vocab) -> (...)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def entropy_bonus(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    entropy_coef: float,
    loss_avg_mode: str,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss term -c * H (added to the policy loss to reward exploration) and the mean entropy metric.

    `entropy` is (batch, response_len), e.g. from `entropy_from_logits`. With c = 0 the term is a zero tensor that
    still carries the metric, so callers need not branch.
    """
    if entropy_coef == 0.0:
        term = entropy.new_zeros(())  # no graph: nothing to back-propagate
    else:
        term = -entropy_coef * aggregate_loss(entropy, response_mask, loss_avg_mode, denominator)
    return term, {"entropy": masked_mean(entropy.detach(), response_mask).item()}

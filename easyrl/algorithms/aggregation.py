"""Reducing a per-token loss matrix to the scalar that is back-propagated (`loss_avg_mode`), and entropy.

Modes (L = loss matrix (batch, response_len), m = response mask, B = rows, |y_i| = valid tokens of row i):
- token-mean:          sum_i sum_t L_it m_it / sum_i |y_i|          every token weighs the same (DAPO, 2503.14476)
- seq-mean-token-mean: (1/B) sum_i (1/|y_i|) sum_t L_it m_it         every sequence weighs the same (GRPO, 2402.03300)
- seq-mean-token-sum:  (1/B) sum_i sum_t L_it m_it                   no length normalisation
- seq-mean-token-sum-norm: (1/(B T)) sum_i sum_t L_it m_it           Dr. GRPO (2503.20783), T a constant

Dr. GRPO removes the per-response 1/|y_i| and divides by a constant instead, the largest response length T
(data.max_response_length, what verl's seq-mean-token-sum-norm divides by when responses are padded to it, and TRL's
dr_grpo's max_completion_length). seq-mean-token-sum is the same direction without T: a gradient T times larger,
which worker.actor.max_grad_norm (1.0) clips nearly every step.

`denominator` replaces the local count (tokens for token-mean, rows for the seq modes, rows x T for the -norm mode)
by a global one, so that a mini-batch split into micro-batches and devices adds up to exactly the mini-batch loss
(``loss_denominator``). Without one, the -norm mode's T is the matrix's width, as verl's first version had it.
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


@_register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None) -> torch.Tensor:
    total = (loss_mat * mask).sum()
    return total / (denominator if denominator is not None else max(loss_mat.shape[0] * loss_mat.shape[-1], 1))


def loss_denominator(rows: float, tokens: float, loss_avg_mode: str, response_length: int) -> float:
    """The count a mode divides the summed loss by, from a batch's ``rows`` and valid ``tokens``; ``response_length``:
    the constant T of seq-mean-token-sum-norm (data.max_response_length)."""
    if loss_avg_mode == "token-mean":
        return tokens
    if loss_avg_mode != "seq-mean-token-sum-norm":
        return rows
    if response_length < 1:
        raise ValueError(
            f"seq-mean-token-sum-norm divides by the response length data.max_response_length, here {response_length}: "
            "give the role's config its response_length (load_config derives it)."
        )
    return rows * response_length


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

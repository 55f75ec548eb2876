"""Policy losses, registered by name (`worker.actor.loss_type`).

Notation (per token t of sample i): r = pi_theta(y_t) / pi_old(y_t) is the importance ratio, A the advantage,
eps_low / eps_high = `clip_ratio_low` / `clip_ratio_high`. Each registered loss builds a per-token loss matrix
(batch, response_len) and per-token metric masks; the shared wrapper then
  1. multiplies by truncated importance-sampling weights when `tis_cap` is set,
  2. reduces the matrix with `loss_avg_mode` (aggregation.py),
  3. averages the metrics over response tokens.

Every registered loss is called the same way:

    loss, metrics = fn(old_log_probs, log_probs, advantages, response_mask, config, rollout_log_probs=None)

with `config` the ActorConfig and metrics `pg_loss`, `pg_clipfrac_higher` (tokens clipped at 1 + eps_high),
`pg_clipfrac_lower` (tokens clipped at 1 - eps_low), `ppo_kl` (k1 estimate of KL(pi_old || pi_theta)) and any extra
ones of the loss.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .aggregation import aggregate_loss
from .masked import masked_mean
from .zero_advantage import ADVANTAGE_WEIGHTED_LOSSES


if TYPE_CHECKING:
    from ..config import ActorConfig

TokenLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

_POLICY_LOSSES: dict[str, PolicyLoss] = {}

# exp() of a log-ratio beyond this overflows or gives useless gradients (also the nan-grad issue pytorch#10729)
LOG_RATIO_LIMIT = 20.0


def register_policy_loss(name: str, advantage_weighted: bool = False):
    """Register a per-token loss `fn(old_log_probs, log_probs, advantages, response_mask, config) -> (loss_mat,
    token_metrics)` under `name`; what gets registered is the full loss with TIS, aggregation and metric means.

    ``advantage_weighted``: each token's loss is its advantage times something finite, so a sample whose advantages
    are all zero adds nothing to the loss or its gradient (the actor then skips that sample's passes, see
    zero_advantage.py). Leave it false for a loss with any other term. The built-in losses are listed there."""

    def decorator(token_loss: TokenLoss) -> TokenLoss:
        if name in _POLICY_LOSSES:
            raise ValueError(f"Policy loss `{name}` is registered twice.")
        _POLICY_LOSSES[name] = _full_loss(token_loss)
        if advantage_weighted:
            ADVANTAGE_WEIGHTED_LOSSES.add(name)
        return token_loss

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    if name not in _POLICY_LOSSES:
        raise ValueError(
            f"`worker.actor.loss_type` is `{name}`, which is not one of: {', '.join(list_policy_losses())}."
        )
    return _POLICY_LOSSES[name]


def list_policy_losses() -> list[str]:
    return sorted(_POLICY_LOSSES)


def compute_policy_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: "ActorConfig",
    rollout_log_probs: torch.Tensor | None = None,
    loss_denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss named by `config.loss_type`; all tensors are (batch, response_len)."""
    return get_policy_loss(config.loss_type)(
        old_log_probs, log_probs, advantages, response_mask, config, rollout_log_probs, loss_denominator
    )


def truncated_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling for the rollout/training mismatch (Yao et al. 2025, "Your Efficient RL Framework
    Secretly Brings You Off-Policy RL Training", fengyao.notion.site/off-policy-rl; TIS after Espeholt et al. 2018,
    arXiv 1802.01561): w_t = min(pi_old(y_t) / pi_rollout(y_t), C), a constant for the gradient."""
    log_w = (old_log_probs - rollout_log_probs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.exp(log_w).clamp(max=cap).detach()


def _full_loss(token_loss: TokenLoss) -> PolicyLoss:
    def policy_loss(
        old_log_probs: torch.Tensor,
        log_probs: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        config: "ActorConfig",
        rollout_log_probs: torch.Tensor | None = None,
        loss_denominator: float | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = response_mask.to(log_probs.dtype)
        loss_mat, token_metrics = token_loss(old_log_probs, log_probs, advantages, mask, config)
        metrics = {}
        tis_cap = getattr(config, "tis_cap", None)
        if tis_cap is not None:
            if rollout_log_probs is None:
                raise ValueError(
                    "`worker.actor.tis_cap` is set but the batch has no `rollout_log_probs`; "
                    "the rollout must return log-probs (or set tis_cap=null)."
                )
            weights = truncated_is_weights(old_log_probs, rollout_log_probs, tis_cap)
            loss_mat = loss_mat * weights
            metrics["tis_weight_mean"] = masked_mean(weights, mask).item()
            metrics["tis_clipfrac"] = masked_mean((weights >= tis_cap).to(mask.dtype), mask).item()
        loss = aggregate_loss(loss_mat, mask, config.loss_avg_mode, loss_denominator)
        metrics["pg_loss"] = loss.detach().item()
        metrics["ppo_kl"] = masked_mean((old_log_probs - log_probs).detach(), mask).item()
        for key, value in token_metrics.items():
            metrics[key] = masked_mean(value.detach().to(mask.dtype), mask).item()
        return loss, metrics

    policy_loss.__name__ = token_loss.__name__
    policy_loss.__doc__ = token_loss.__doc__
    return policy_loss


def _ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def _clipped_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, config: "ActorConfig", dual_clip: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), optionally bounded by C |A| for A < 0 (dual clip)."""
    ratio = _ratio(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * clipped_ratio
    loss = torch.maximum(loss_unclipped, loss_clipped)  # pessimistic bound = -min(rA, clip(r)A)
    clip_active = loss_clipped > loss_unclipped
    metrics = {
        "pg_clipfrac_higher": clip_active & (advantages > 0),  # r > 1 + eps_high with A > 0
        "pg_clipfrac_lower": clip_active & (advantages < 0),  # r < 1 - eps_low with A < 0
    }
    if dual_clip:
        # Dual-clip PPO (Ye et al. 2019, arXiv 1912.09729): for A < 0 the loss may not exceed -C A = C |A|, so a
        # token whose ratio exploded cannot dominate the update.
        dual_bound = -advantages * config.clip_ratio_dual
        dual_active = (advantages < 0) & (loss > dual_bound)
        loss = torch.where(dual_active, dual_bound, loss)
        metrics["pg_clipfrac_dual"] = dual_active
    return loss, metrics


@register_policy_loss("ppo")
def ppo_clip_loss(old_log_probs, log_probs, advantages, response_mask, config):
    """PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347) with decoupled clip ranges (clip-higher, DAPO,
    Yu et al. 2025, arXiv 2503.14476) and dual clip (arXiv 1912.09729):

        L_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t),   then min(L_t, C |A_t|) where A_t < 0
    """
    return _clipped_surrogate(log_probs - old_log_probs, advantages, config, dual_clip=True)


def _sequence_log_ratio(old_log_probs, log_probs, response_mask) -> torch.Tensor:
    """log s_i = (1/|y_i|) sum_t log(pi_theta / pi_old): the length-normalised sequence log-ratio, (batch, 1)."""
    return masked_mean(log_probs - old_log_probs, response_mask, dim=-1).unsqueeze(-1)


@register_policy_loss("gspo")
def gspo_loss(old_log_probs, log_probs, advantages, response_mask, config):
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071): the ratio is per sequence,

        s_i = (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|) = exp((1/|y_i|) sum_t log r_{i,t})
        L_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

    broadcast to the sequence's tokens (the paper averages per sequence: loss_avg_mode=seq-mean-token-mean). The
    paper's clip ranges are tiny (eps_low 3e-4, eps_high 4e-4) because s_i is a geometric mean.
    """
    log_ratio = _sequence_log_ratio(old_log_probs, log_probs, response_mask).expand_as(log_probs)
    return _clipped_surrogate(log_ratio, advantages, config, dual_clip=False)


@register_policy_loss("gspo_token")
def gspo_token_loss(old_log_probs, log_probs, advantages, response_mask, config):
    """GSPO-token (arXiv 2507.18071, section 4.3): token-level advantages with the sequence ratio's value,

        s_{i,t} = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]

    numerically s_{i,t} = s_i, but each token's gradient flows through its own log-prob.
    """
    seq_log_ratio = _sequence_log_ratio(old_log_probs, log_probs, response_mask).detach()
    log_ratio = seq_log_ratio + log_probs - log_probs.detach()
    return _clipped_surrogate(log_ratio, advantages, config, dual_clip=False)


@register_policy_loss("cispo")
def cispo_loss(old_log_probs, log_probs, advantages, response_mask, config):
    """Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585): clip the importance weight, never the
    token, so every token keeps a gradient:

        L_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) A_t log pi_theta(y_t)
    """
    ratio = _ratio(log_probs - old_log_probs)
    low, high = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high
    weight = torch.clamp(ratio, low, high).detach()
    loss = -weight * advantages * log_probs
    return loss, {"pg_clipfrac_higher": ratio > high, "pg_clipfrac_lower": ratio < low}


@register_policy_loss("sapo")
def sapo_loss(old_log_probs, log_probs, advantages, response_mask, config):
    """Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv 2511.20347): a smooth gate replaces the hard clip,

        f_t(r) = (4 / tau_t) sigmoid(tau_t (r_t - 1)),   tau_t = tau_pos if A_t > 0 else tau_neg
        L_t    = -f_t(r_t) A_t

    d f / d r = 4 sigmoid (1 - sigmoid) = sech^2(tau (r - 1) / 2): weight 1 on-policy (r = 1), decaying smoothly as r
    leaves 1, faster for negative advantages (tau_neg > tau_pos). `sapo_gate` logs that mean weight.
    """
    ratio = _ratio(log_probs - old_log_probs)
    tau = torch.where(advantages > 0, config.tau_positive, config.tau_negative).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(4.0 / tau) * gate * advantages
    zeros = torch.zeros_like(ratio, dtype=torch.bool)
    gate_weight = 4.0 * gate * (1.0 - gate)
    return loss, {"pg_clipfrac_higher": zeros, "pg_clipfrac_lower": zeros, "sapo_gate": gate_weight}

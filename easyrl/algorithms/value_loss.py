"""The critic's clipped value loss."""

import torch

from .aggregation import aggregate_loss
from .masked import masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_avg_mode: str,
    loss_denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO value loss with value clipping (Schulman et al. 2017, arXiv 1707.06347; clipping as in OpenAI baselines):

        V_clip = V_old + clip(V - V_old, -c, c)
        L_t    = 1/2 max((V - R_t)^2, (V_clip - R_t)^2)

    All tensors are (batch, response_len): `vpreds` the current values, `values` those at rollout time, `returns`
    the targets. Metrics: `vf_clipfrac` (share of tokens where the clipped term is the larger), `vpred_mean`.
    """
    mask = response_mask.to(vpreds.dtype)
    vpreds_clipped = values + torch.clamp(vpreds - values, -cliprange_value, cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpreds_clipped - returns) ** 2
    loss_mat = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    loss = aggregate_loss(loss_mat, mask, loss_avg_mode, loss_denominator)
    metrics = {
        "vf_loss": loss.detach().item(),
        "vf_clipfrac": masked_mean((loss_clipped > loss_unclipped).to(mask.dtype), mask).item(),
        "vpred_mean": masked_mean(vpreds.detach(), mask).item(),
    }
    return loss, metrics

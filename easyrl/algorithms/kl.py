"""KL divergence to the reference policy: per-token estimators, controllers of its coefficient, and its two uses
(a loss term of the actor with `algorithm.use_kl_loss`, or a per-token reward penalty otherwise).

Estimators of KL(pi_theta || pi_ref) from a sample y_t ~ pi_theta (Schulman 2020, "Approximating KL divergence",
joschu.net/blog/kl-approx.html), with log r = log pi_ref(y_t) - log pi_theta(y_t):
    kl         (k1)  -log r                       unbiased, high variance, can be negative
    abs              |log r|
    mse        (k2)  1/2 (log r)^2                low variance, biased
    low_var_kl (k3)  r - 1 - log r                unbiased, always >= 0; clamped to [-10, 10] for stability
    full             sum_v pi_theta(v) (log pi_theta(v) - log pi_ref(v))   exact, needs full distributions
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from .aggregation import aggregate_loss
from .masked import masked_mean


if TYPE_CHECKING:
    from ..config import AlgorithmConfig
    from ..protocol import DataProto


_KL_PENALTIES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}

# estimators that need full (..., vocab) log-distributions rather than the log-prob of the sampled token
FULL_DISTRIBUTION_PENALTIES = {"full"}


def register_kl_penalty(name: str):
    def decorator(fn):
        _KL_PENALTIES[name] = fn
        return fn

    return decorator


def list_kl_penalties() -> list[str]:
    return sorted(_KL_PENALTIES)


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of kind `kind` (`algorithm.kl_penalty`).

    For every kind but `full`: log-probs of the sampled tokens, (batch, response_len) -> (batch, response_len).
    For `full`: log-softmax over the vocabulary, (batch, response_len, vocab) -> (batch, response_len).
    """
    if kind not in _KL_PENALTIES:
        raise ValueError(f"`algorithm.kl_penalty` is `{kind}`, which is not one of: {', '.join(list_kl_penalties())}.")
    return _KL_PENALTIES[kind](log_probs.float(), ref_log_probs.float())


@register_kl_penalty("kl")
def _k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    return log_probs - ref_log_probs


@register_kl_penalty("abs")
def _abs(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    return (log_probs - ref_log_probs).abs()


@register_kl_penalty("mse")
def _k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_probs - ref_log_probs) ** 2


@register_kl_penalty("low_var_kl")
def _k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    log_ratio = (ref_log_probs - log_probs).clamp(-20.0, 20.0)  # exp() stays finite
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)


@register_kl_penalty("full")
def _full(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    if log_probs.shape != ref_log_probs.shape or log_probs.dim() < 2:
        raise ValueError(
            "kl_penalty=full compares whole distributions: pass log-softmax tensors of shape (..., vocab) for both "
            f"policies (got {tuple(log_probs.shape)} and {tuple(ref_log_probs.shape)})."
        )
    return (torch.exp(log_probs) * (log_probs - ref_log_probs)).sum(-1)


# ----------------------------------------------------------------------------------------------------------------------
# controllers of the in-reward KL coefficient beta (`algorithm.kl_type`)
# ----------------------------------------------------------------------------------------------------------------------
class FixedKLController:
    """beta stays `algorithm.kl_coef`."""

    def __init__(self, kl_coef: float):
        self.kl_coef = kl_coef

    @property
    def value(self) -> float:
        """The current beta (saved in checkpoints and restored on resume)."""
        return self.kl_coef

    @value.setter
    def value(self, kl_coef: float) -> None:
        self.kl_coef = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController(FixedKLController):
    """Adaptive beta of Ziegler et al. 2019 (arXiv 1909.08593), steering the measured KL towards a target:

    e_t  = clip(KL_t / KL_target - 1, -0.2, 0.2)
    beta <- beta (1 + K_beta e_t),   K_beta = n_steps / horizon
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        if horizon <= 0:
            raise ValueError(f"`algorithm.kl_horizon` must be > 0 for the adaptive KL controller, got {horizon}.")
        super().__init__(init_kl_coef)
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.kl_coef *= 1.0 + proportional_error * n_steps / self.horizon


_KL_CONTROLLERS = {
    "fixed": lambda config: FixedKLController(config.kl_coef),
    "adaptive": lambda config: AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon),
}


def get_kl_controller(config: "AlgorithmConfig") -> FixedKLController:
    if config.kl_type not in _KL_CONTROLLERS:
        raise ValueError(f"`algorithm.kl_type` is `{config.kl_type}`; use one of: {', '.join(_KL_CONTROLLERS)}.")
    return _KL_CONTROLLERS[config.kl_type](config)


# ----------------------------------------------------------------------------------------------------------------------
# the two uses
# ----------------------------------------------------------------------------------------------------------------------
def apply_kl_penalty(
    data: "DataProto", kl_ctrl: FixedKLController, kl_penalty_kind: str
) -> tuple["DataProto", dict[str, float]]:
    """KL in the reward (`algorithm.use_kl_loss=false`): r_t = score_t - beta KL_t on every response token.

    Reads `token_level_scores`, `old_log_probs`, `ref_log_probs`, `response_mask`; writes `token_level_rewards`.
    Then updates the controller with the batch KL (mean over samples of the per-sample token-mean KL).
    Metrics: `reward/kl_penalty` (that KL) and `reward/kl_coef` (the beta that was applied).
    """
    if kl_penalty_kind in FULL_DISTRIBUTION_PENALTIES:
        raise ValueError(
            f"`algorithm.kl_penalty={kl_penalty_kind}` needs full distributions, which the batch does not carry; "
            "use kl, abs, mse or low_var_kl for the in-reward penalty."
        )
    batch = data.batch
    mask = batch["response_mask"].to(torch.float32)
    kld = kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], kl_penalty_kind) * mask  # (batch, response_len)
    beta = kl_ctrl.kl_coef
    batch["token_level_rewards"] = batch["token_level_scores"] - beta * kld
    current_kl = masked_mean(kld, mask, dim=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"reward/kl_penalty": current_kl, "reward/kl_coef": beta}


def compute_kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_penalty_kind: str,
    loss_avg_mode: str,
    loss_denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL as a loss term (`algorithm.use_kl_loss=true`, GRPO style): aggregate(KL_t); the actor adds kl_coef times it.

    Shapes as in `kl_penalty`. Metric: `kl_loss`.
    """
    if kl_penalty_kind in FULL_DISTRIBUTION_PENALTIES and log_probs.dim() != response_mask.dim() + 1:
        raise ValueError(
            f"`algorithm.kl_penalty={kl_penalty_kind}` needs (batch, response_len, vocab) log-distributions of both "
            f"policies, but got log-probs of shape {tuple(log_probs.shape)}; use low_var_kl (k3) for the KL loss."
        )
    kld = kl_penalty(log_probs, ref_log_probs, kl_penalty_kind)
    loss = aggregate_loss(kld, response_mask.to(kld.dtype), loss_avg_mode, loss_denominator)
    return loss, {"kl_loss": loss.detach().item()}

"""When the actor update may skip samples whose advantage is zero at every token (`worker.actor.skip_zero_advantage`).

A GRPO group whose samples all scored the same has advantage 0 everywhere. Where every term of the loss is a multiple
of the advantage, such a sample adds nothing to the loss or its gradient, and its forward and backward passes can be
skipped (the loss denominators still count it). This module imports no torch: `easyrl check` says what applies.
"""

from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from ..config import ActorConfig
    from ..protocol import DataProto

# Losses whose every token term is the token's advantage times something finite (policy_loss.py): ppo (-min(rA,
# clip(r)A), dual clip C|A|), gspo / gspo_token (the same with the sequence ratio), cispo (-sg(w) A log pi), sapo
# (-(4/tau) sigmoid(tau (r-1)) A). A loss registered with `register_policy_loss(name, advantage_weighted=True)` joins.
ADVANTAGE_WEIGHTED_LOSSES: set[str] = {"ppo", "gspo", "gspo_token", "cispo", "sapo"}


def skips_zero_advantage(config: "ActorConfig") -> bool:
    """`worker.actor.skip_zero_advantage` where skipping changes nothing: an advantage-weighted loss, no entropy
    bonus, no KL loss."""
    return decision(config)[0]


def decision(config: "ActorConfig") -> tuple[bool, str]:
    """(skip, what happens and why), the latter for the printed run plan."""
    if not config.skip_zero_advantage:
        return False, "computed (worker.actor.skip_zero_advantage=false)"
    if config.entropy_coef != 0.0:
        return False, "computed (the entropy bonus, worker.actor.entropy_coef, counts every sample)"
    if config.use_kl_loss and not config.disable_kl:
        return False, "computed (the KL loss counts every sample)"
    if config.loss_type not in ADVANTAGE_WEIGHTED_LOSSES:
        return False, f"computed (worker.actor.loss_type={config.loss_type} is not registered as advantage-weighted)"
    return True, "their update passes are skipped (they add nothing to the loss; worker.actor.skip_zero_advantage)"


def nonzero_advantage(data: "DataProto") -> Any:
    """(batch,) bool tensor: the samples with a nonzero advantage at some response token (those a skipping update
    computes)."""
    batch = data.batch
    return ((batch["advantages"] != 0) & batch["response_mask"].bool()).any(-1)

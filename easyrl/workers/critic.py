"""The critic role: per-token values V(s_t) of the response and the clipped value update (PPO with GAE).

The value model is the language model with a one-output token-classification head (``num_labels=1``): its output
at the position that predicts response token t is V(s_t), the value of the state before emitting token t.
"""

from typing import TYPE_CHECKING

import torch

from ..models import prefix_group, ulysses
from ..models.dynamic_batching import restore_order
from ..models.forward import forward_response_outputs, scatter_to_response
from .ppo_update import run_ppo_updates


if TYPE_CHECKING:
    from ..config import CriticConfig
    from ..models.ulysses import SequenceParallel
    from ..protocol import DataProto


class Critic:
    def __init__(
        self,
        config: "CriticConfig",
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        mini_batch_size: int | None = None,
        dp_size: int = 1,
        processor=None,
        sp: "SequenceParallel | None" = None,
    ) -> None:
        """``processor``: a vision-language model's (pictures become pixel inputs); ``sp``: this rank's Ulysses group
        (``worker.critic.ulysses_size`` > 1)."""
        self.config = config
        self.processor = processor
        self.module = module
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.dp_size = dp_size
        self.sp = sp
        if sp is not None:
            ulysses.enable(module, sp.size, "worker.critic.ulysses_size")
        # worker.critic.shared_prefix: each prompt computed once per group of samples (models/prefix_group.py)
        self.prefix_stats = prefix_group.PrefixStats() if config.shared_prefix else None
        if config.shared_prefix:
            prefix_group.enable(module)

    def _forward(self, micro_batch: "DataProto") -> torch.Tensor:
        """(batch, response_len) fp32 values; 0 past each response."""
        values, valid = forward_response_outputs(
            self.module,
            micro_batch,
            self.config.padding_free,
            lm_logits=False,
            processor=self.processor,
            sp=self.sp,
            shared_prefix=self.prefix_stats,
        )
        return scatter_to_response(values.squeeze(-1).float(), valid)

    @torch.no_grad()
    def compute_values(self, data: "DataProto") -> torch.Tensor:
        self.module.eval()
        micro_batches, permutation = prefix_group.split_for_pass(
            data,
            self.config.micro_batch_size_per_device_for_experience,
            self.config.dynamic_batching,
            self.prefix_stats,
        )
        return restore_order(torch.cat([self._forward(mb) for mb in micro_batches]), permutation)

    def _micro_loss(self, micro_batch: "DataProto", denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
        from ..algorithms.value_loss import compute_value_loss

        batch = micro_batch.batch
        vpreds = self._forward(micro_batch)
        return compute_value_loss(
            vpreds,
            batch["returns"],
            batch["values"],
            batch["response_mask"],
            self.config.cliprange_value,
            self.config.loss_avg_mode,
            loss_denominator=denominator,
        )

    def update_critic(self, data: "DataProto") -> dict[str, float]:
        """PPO epochs of value regression on ``data`` (needs values, returns, response_mask); ``critic/*`` metrics."""
        if self.optimizer is None or self.mini_batch_size is None:
            raise RuntimeError("This critic was built without an optimizer.")
        if self.prefix_stats is not None:
            self.prefix_stats = prefix_group.PrefixStats()  # this update's counts only
        metrics = run_ppo_updates(
            self.module,
            self.optimizer,
            data,
            self._micro_loss,
            self.config,
            mini_batch_size=self.mini_batch_size,
            dp_size=self.dp_size,
            prefix="critic",
            shared_prefix=self.prefix_stats,
        )
        if self.prefix_stats is not None:
            metrics.update(self.prefix_stats.metrics("critic"))
        return metrics

"""The policy role: log-probabilities of response tokens and the PPO-style policy update.

Works on an FSDP2-wrapped model inside a worker and on a plain Hugging Face model in one process alike.
"""

import dataclasses
from typing import TYPE_CHECKING

import torch

from ..algorithms.zero_advantage import nonzero_advantage, skips_zero_advantage
from ..config import RefConfig
from ..models import prefix_group, ulysses
from ..models.dynamic_batching import restore_order
from ..models.forward import forward_response_outputs, scatter_to_response
from ..models.fused_head import FusedHeadRequest
from ..utils.torch_functional import select_chunk_kernels, select_logprob_kernels
from .ppo_update import run_ppo_updates


if TYPE_CHECKING:
    from ..config import ActorConfig
    from ..models.ulysses import SequenceParallel
    from ..protocol import DataProto


class Actor:
    def __init__(
        self,
        config: "ActorConfig | RefConfig",
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        mini_batch_size: int | None = None,
        dp_size: int = 1,
        processor=None,
        sp: "SequenceParallel | None" = None,
    ) -> None:
        """``mini_batch_size``: samples per optimizer step on this device; ``dp_size``: ranks FSDP averages over;
        ``processor``: a VLM's multimodal processor (builds each micro-batch's pixel inputs); ``sp``: this rank's
        Ulysses group (``ulysses_size`` > 1: its ranks get the same samples and split each packed row)."""
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.dp_size = dp_size
        self.processor = processor
        self.sp = sp
        if sp is not None:  # the reference's size is the actor's (derived): the key to change is the actor's
            ulysses.enable(module, sp.size, "worker.actor.ulysses_size")
        # worker.actor.use_torch_compile (copied to the reference): compiled or eager log-prob / entropy kernels
        self.log_probs_from_logits, self.entropy_from_logits = select_logprob_kernels(config.use_torch_compile)
        # worker.actor.model.use_fused_kernels (the reference, built from the actor's model config, has a copy):
        # log-probs from hidden states in the LM head, no (tokens, vocab) logits
        self.use_fused_kernels = (
            config.use_fused_kernels if isinstance(config, RefConfig) else config.model.use_fused_kernels
        )
        self.chunk_kernels = select_chunk_kernels(config.use_torch_compile)
        # worker.actor.shared_prefix (copied to the reference): each prompt computed once per group of samples;
        # the counts of what sharing did accumulate here (reported with the update's metrics)
        self.prefix_stats = prefix_group.PrefixStats() if config.shared_prefix else None
        if config.shared_prefix:
            prefix_group.enable(module)

    def _forward(
        self, micro_batch: "DataProto", temperature: float, calculate_entropy: bool, entropy_grad: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(batch, response_len) fp32 log-probs (and entropies) of the response tokens; 0 past each response."""
        response_length = micro_batch.batch["responses"].shape[-1]
        if self.use_fused_kernels:
            request = FusedHeadRequest(temperature, self.chunk_kernels, calculate_entropy, entropy_grad)
            per_token = None  # the LM head already returns (valid_tokens, 1 or 2): log-prob, entropy
        else:
            labels = micro_batch.batch["responses"][micro_batch.batch["attention_mask"][:, -response_length:].bool()]
            request = None

            def per_token(logits: torch.Tensor, rows: slice) -> torch.Tensor:
                """(tokens, vocab) logits of the valid tokens ``rows`` -> (tokens, 1 or 2): log-prob, entropy."""
                log_probs = self.log_probs_from_logits(logits, labels[rows], temperature)
                if not calculate_entropy:
                    return log_probs.float()[:, None]
                # an entropy wanted only as a metric keeps no graph
                with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
                    entropy = self.entropy_from_logits(logits, temperature)
                return torch.stack([log_probs.float(), entropy.float()], dim=-1)

        outputs, valid = forward_response_outputs(
            self.module,
            micro_batch,
            self.config.padding_free,
            lm_logits=True,
            processor=self.processor,
            fused=request,
            per_token=per_token,
            sp=self.sp,
            shared_prefix=self.prefix_stats,
        )
        log_probs = scatter_to_response(outputs[:, 0], valid)
        entropy = None
        if calculate_entropy:
            entropy = scatter_to_response(outputs[:, 1] if entropy_grad else outputs[:, 1].detach(), valid)
        return log_probs, entropy

    @torch.no_grad()
    def compute_log_probs(
        self, data: "DataProto", calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi(y_t | x, y_<t) at the rollout's temperature (``meta_info["temperature"]``), (batch, response_len)."""
        temperature = data.meta_info["temperature"]
        self.module.eval()
        micro_batches, permutation = prefix_group.split_for_pass(
            data,
            self.config.micro_batch_size_per_device_for_experience,
            self.config.dynamic_batching,
            self.prefix_stats,
        )
        outputs = [self._forward(mb, temperature, calculate_entropy) for mb in micro_batches]
        log_probs = restore_order(torch.cat([lp for lp, _ in outputs]), permutation)
        entropy = restore_order(torch.cat([e for _, e in outputs]), permutation) if calculate_entropy else None
        return log_probs, entropy

    def _micro_loss(
        self, micro_batch: "DataProto", denominator: float, on_policy: bool = False
    ) -> tuple[torch.Tensor, dict[str, float]]:
        from ..algorithms.aggregation import entropy_bonus
        from ..algorithms.kl import compute_kl_loss
        from ..algorithms.masked import masked_mean
        from ..algorithms.policy_loss import compute_policy_loss
        from .rollout.base import rollout_logprob_mismatch

        config, batch = self.config, micro_batch.batch
        temperature = micro_batch.meta_info["temperature"]
        entropy_coef = getattr(config, "entropy_coef", 0.0)
        # On-policy (the run plan's decision: one epoch, one mini-batch, nothing earlier needs them): the samples'
        # old log-probs are the current ones, so the trainer skips their forward pass and the entropy metric comes
        # from this one.
        log_probs, entropy = self._forward(
            micro_batch, temperature, entropy_coef != 0.0 or on_policy, entropy_grad=entropy_coef != 0.0
        )
        mask = batch["response_mask"]
        rollout_log_probs = batch["rollout_log_probs"] if "rollout_log_probs" in batch.keys() else None
        old_log_probs = log_probs.detach() if on_policy else batch["old_log_probs"]
        loss, metrics = compute_policy_loss(
            old_log_probs,
            log_probs,
            batch["advantages"],
            mask,
            config,
            rollout_log_probs=rollout_log_probs,
            loss_denominator=denominator,
        )
        if entropy_coef != 0.0:
            bonus, entropy_metrics = entropy_bonus(entropy, mask, entropy_coef, config.loss_avg_mode, denominator)
            loss = loss + bonus
            metrics.update(entropy_metrics)
        elif on_policy:
            metrics["entropy"] = masked_mean(entropy, mask).item()
        if on_policy and rollout_log_probs is not None:
            mismatch = rollout_logprob_mismatch(old_log_probs, rollout_log_probs, mask)
            metrics["rollout_logprob_abs_diff"] = mismatch["rollout/logprob_abs_diff/mean"]
        if config.use_kl_loss and not config.disable_kl:
            kl_loss, kl_metrics = compute_kl_loss(
                log_probs, batch["ref_log_probs"], mask, config.kl_penalty, config.loss_avg_mode, denominator
            )
            loss = loss + config.kl_coef * kl_loss
            metrics.update(kl_metrics)
            metrics["kl_coef"] = config.kl_coef
        return loss, metrics

    def update_policy(self, data: "DataProto", on_policy: bool = False) -> dict[str, float]:
        """PPO epochs over ``data`` (this rank's share); needs advantages, response_mask, old_log_probs (unless
        ``on_policy``) and ref_log_probs with use_kl_loss. Returns this rank's ``actor/*`` metrics."""
        if self.optimizer is None or self.mini_batch_size is None:
            raise RuntimeError("This actor was built without an optimizer (a reference model cannot be updated).")
        if self.prefix_stats is not None:
            self.prefix_stats = prefix_group.PrefixStats()  # this update's counts only
        metrics = run_ppo_updates(
            self.module,
            self.optimizer,
            data,
            lambda micro_batch, denominator: self._micro_loss(micro_batch, denominator, on_policy),
            self.config,
            mini_batch_size=self.mini_batch_size,
            dp_size=self.dp_size,
            prefix="actor",
            shared_prefix=self.prefix_stats,
            carries_gradient=nonzero_advantage if skips_zero_advantage(self.config) else None,
        )
        if self.prefix_stats is not None:
            metrics.update(self.prefix_stats.metrics("actor"))
        return metrics

    def _sft_micro_loss(self, micro_batch: "DataProto", denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
        """Cross-entropy of the labelled tokens: -sum log p(y_t | y_<t) over ``response_mask`` / ``denominator`` (the
        mini-batch's labelled tokens over all ranks / dp_size: the token mean of the whole mini-batch)."""
        log_probs, _ = self._forward(micro_batch, 1.0, calculate_entropy=False)  # (batch, response_len)
        mask = micro_batch.batch["response_mask"]
        loss = -(log_probs * mask).sum() / denominator
        return loss, {"loss": loss.item()}

    def update_sft(self, data: "DataProto") -> dict[str, float]:
        """One optimizer step per mini-batch of ``data`` (this rank's share of SFT conversations; ``response_mask`` is
        the loss mask): token-mean cross-entropy, one pass, the actor's micro-batches and gradient clipping. Returns
        this rank's ``sft/*`` metrics (``sft/loss``: the mean over the step's labelled tokens)."""
        if self.optimizer is None or self.mini_batch_size is None:
            raise RuntimeError("This actor was built without an optimizer (a reference model cannot be updated).")
        # SFT is one pass over each batch with the token mean, whatever the RL keys ppo_epochs / loss_avg_mode say
        schedule = dataclasses.replace(self.config, ppo_epochs=1, loss_avg_mode="token-mean")
        return run_ppo_updates(
            self.module,
            self.optimizer,
            data,
            self._sft_micro_loss,
            schedule,
            mini_batch_size=self.mini_batch_size,
            dp_size=self.dp_size,
            prefix="sft",
        )

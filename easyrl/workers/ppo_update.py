"""The PPO update schedule shared by actor and critic: epochs -> mini-batches (one optimizer step each) ->
micro-batches (gradient accumulation).

Scaling: FSDP averages gradients over the ``dp_size`` data-parallel ranks. Each micro-batch loss is therefore
aggregated with the denominator ``global count / dp_size`` (count = tokens for token-mean, sequences for the seq
modes, over the whole mini-batch on all ranks), so that the accumulated, averaged gradient equals the gradient of
the mini-batch loss computed in one piece on one device.
"""

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..algorithms.aggregation import loss_denominator
from ..models.dynamic_batching import max_over_ranks
from ..models.prefix_group import PrefixStats, split_for_pass
from ..utils import device
from .optim import clip_grad_norm_and_step


if TYPE_CHECKING:
    from ..protocol import DataProto

# Loss metrics of a micro-batch are partial sums of the mini-batch loss (see module docstring): they add up.
SUMMED_METRICS = frozenset({"pg_loss", "kl_loss", "vf_loss", "loss"})
# The others (entropy, ppo_kl, clip fractions ...) are means over a micro-batch's response tokens: they are weighted
# by those tokens, on every rank, so that the update reports its token mean whatever the micro-batches and ranks (their
# size, dynamic batching, padding-free packing or the split over ranks cut the same tokens differently; a plain mean
# of micro-batch means moved with them).

# micro_loss(micro_batch, loss_denominator) -> (loss to back-propagate, metrics)
MicroLoss = Callable[["DataProto", float], tuple[torch.Tensor, dict[str, float]]]
# carries_gradient(mini_batch) -> (batch,) bool: the samples whose loss term can be nonzero
GradientFilter = Callable[["DataProto"], torch.Tensor]


def global_loss_denominator(
    response_mask: torch.Tensor, loss_avg_mode: str, dp_size: int, response_length: int = 0
) -> float:
    """Tokens (token-mean), sequences (seq modes) or sequences x ``response_length`` (seq-mean-token-sum-norm) of the
    mini-batch over all ranks, divided by ``dp_size`` (aggregation.loss_denominator)."""
    local = loss_denominator(response_mask.shape[0], response_mask.sum().item(), loss_avg_mode, response_length)
    total = torch.tensor([local], dtype=torch.float64)
    if dp_size > 1 and dist.is_initialized():
        if dist.get_backend() == "nccl":
            total = total.cuda()
        dist.all_reduce(total)
    return max(float(total.item()), 1.0) / dp_size


def samples_to_compute(mini_batch: "DataProto", carries_gradient: torch.Tensor) -> tuple["DataProto", int, bool]:
    """(the part of ``mini_batch`` whose passes run, how many samples were left out, whether any rank's mini-batch
    has a sample that carries a gradient).

    Left out are samples that add nothing to the loss (``carries_gradient`` false). Every rank of a process group
    must run the same number of passes (each FSDP forward is a collective), and the micro-batch planners give equal
    counts for equal sample counts, so each rank computes as many samples as the rank keeping the most, topping up
    with samples that add nothing; and at least one, so the optimizer step sees the same (zero or not) gradients."""
    most = max_over_ranks(int(carries_gradient.sum()))
    target = max(most, 1)
    if target >= len(mini_batch):
        return mini_batch, 0, most > 0
    kept_first = torch.argsort((~carries_gradient).to(torch.uint8), stable=True)
    return mini_batch[kept_first[:target].sort().values], len(mini_batch) - target, most > 0


def _token_means_over_ranks(token_metrics: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Each per-token metric's mean over the tokens of every micro-batch on every rank (ranks whose shares hold more
    tokens weigh more, as the loss's global denominator does); the same on every rank. Without tokens anywhere (an
    empty mask), the plain mean of the micro-batch values."""
    keys = sorted(token_metrics)
    sums = [sum(value * tokens for value, tokens in token_metrics[key]) for key in keys]
    weights = [sum(tokens for _, tokens in token_metrics[key]) for key in keys]
    plain = [sum(value for value, _ in token_metrics[key]) / max(len(token_metrics[key]), 1) for key in keys]
    totals = torch.tensor([sums, weights, plain], dtype=torch.float64, device=device.get_torch_device())
    ranks = 1
    if dist.is_initialized() and dist.get_world_size() > 1 and keys:  # as the worker's metric reduction does
        ranks = dist.get_world_size()
        dist.all_reduce(totals)
    summed, weight, plain_sum = totals.tolist()
    return {key: summed[i] / weight[i] if weight[i] else plain_sum[i] / ranks for i, key in enumerate(keys)}


def run_ppo_updates(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: "DataProto",
    micro_loss: MicroLoss,
    role_config: Any,
    *,
    mini_batch_size: int,
    dp_size: int,
    prefix: str,
    shared_prefix: PrefixStats | None = None,
    carries_gradient: GradientFilter | None = None,
) -> dict[str, float]:
    """Run the update schedule of ``role_config`` (an actor or critic section: ppo_epochs, micro batch size,
    dynamic batching, loss_avg_mode, max_grad_norm) on this rank's share of the batch; metrics are averages over
    steps, ``prefix/``. ``shared_prefix`` (the actor's `shared_prefix`): micro-batches of whole prompt groups.
    ``carries_gradient``: the passes of the samples it marks false are skipped (``samples_to_compute``); the loss
    denominators still count them, so the gradient is unchanged."""
    micro_batch_size = role_config.micro_batch_size_per_device_for_update
    dynamic_batching, ppo_epochs = role_config.dynamic_batching, role_config.ppo_epochs
    loss_avg_mode, max_grad_norm = role_config.loss_avg_mode, role_config.max_grad_norm
    if len(data) % mini_batch_size != 0:
        raise ValueError(
            f"This device holds {len(data)} samples, not a multiple of its mini-batch of {mini_batch_size} "
            f"(`worker.{prefix}.global_batch_size` x `worker.rollout.n` / devices)."
        )
    module.train()
    step_metrics: dict[str, list[float]] = defaultdict(list)
    token_metrics: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (micro-batch mean, its tokens)
    skipped = left_out = seen = 0
    for _ in range(ppo_epochs):
        for mini_batch in data.split(mini_batch_size):
            denominator = global_loss_denominator(
                mini_batch.batch["response_mask"], loss_avg_mode, dp_size, role_config.response_length
            )
            seen += len(mini_batch)
            # a mini-batch in which no sample carries a gradient computes one placeholder sample per rank: its
            # per-token metrics (entropy, ppo_kl, clip fractions) would stand for the whole batch, so they are left out
            carried = True
            if carries_gradient is not None:
                mini_batch, dropped, carried = samples_to_compute(mini_batch, carries_gradient(mini_batch))
                left_out += dropped
            micro_batches, _ = split_for_pass(mini_batch, micro_batch_size, dynamic_batching, shared_prefix)
            summed: dict[str, float] = defaultdict(float)
            for micro_batch in micro_batches:
                loss, metrics = micro_loss(micro_batch, denominator)
                loss.backward()
                tokens = float(micro_batch.batch["response_mask"].sum())
                for key, value in metrics.items():
                    if key in SUMMED_METRICS:
                        summed[key] += float(value)
                    elif carried:
                        token_metrics[key].append((float(value), tokens))
            for key, value in summed.items():
                step_metrics[key].append(value)
            grad_norm, stepped = clip_grad_norm_and_step(module, optimizer, max_grad_norm)
            step_metrics["grad_norm"].append(grad_norm)
            skipped += not stepped
    metrics = {f"{prefix}/{key}": sum(values) / len(values) for key, values in step_metrics.items()}
    metrics.update({f"{prefix}/{key}": mean for key, mean in _token_means_over_ranks(token_metrics).items()})
    metrics[f"{prefix}/nonfinite_grad_skipped_steps"] = float(skipped)
    if carries_gradient is not None:
        metrics[f"{prefix}/zero_advantage_skipped"] = left_out / max(seen, 1)
    return metrics

"""Optimizers (``optim.strategy``), learning-rate schedules, and the clipped optimizer step.

Every optimizer works on FSDP2's sharded parameters (DTensors): each rank updates only its own shard.
"""

import dataclasses
import math
from collections.abc import Callable, Iterable

import torch
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from ..config import OptimConfig


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (sharing its storage), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class BF16StateAdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter, arXiv 1711.05101) whose moment estimates are stored in bf16.

    Halves the optimizer memory against fp32 states; the update itself is computed in fp32 and written back to the
    parameter in its own dtype.
    """

    def __init__(
        self, params: Iterable, lr: float, betas: tuple[float, float], weight_decay: float, eps: float = 1e-8
    ):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    # zeros_like keeps the DTensor sharding, so checkpoints see the states as sharded too
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.bfloat16)
                state["step"] += 1
                step = state["step"].item()
                grad = _local(param.grad).float()
                exp_avg_local, exp_avg_sq_local = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
                exp_avg = exp_avg_local.float().mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq = exp_avg_sq_local.float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                exp_avg_local.copy_(exp_avg)
                exp_avg_sq_local.copy_(exp_avg_sq)
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                denom = (exp_avg_sq / bias_correction2).sqrt_().add_(eps)
                weight = _local(param)
                updated = (
                    weight.float().mul_(1 - lr * weight_decay).addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
                )
                weight.copy_(updated)
        return loss


def _adamw(params: list, config: OptimConfig) -> torch.optim.Optimizer:
    # On CUDA, PyTorch's fused kernel (one launch for all parameters, FSDP2's DTensors included): 2.5% faster than
    # the default multi-tensor path for a whole 0.5B update on an H100 (benchmarks.actor_update_gpu). Elsewhere (the
    # CPU, parameters offloaded by FSDP) the default stays, so CPU runs keep their exact numbers.
    fused = bool(params) and all(p.is_cuda for p in params)
    return torch.optim.AdamW(
        params, lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay, fused=fused or None
    )


def _adamw_bf16(params: list, config: OptimConfig) -> torch.optim.Optimizer:
    return BF16StateAdamW(params, lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay)


def _sgd(params: list, config: OptimConfig) -> torch.optim.Optimizer:
    """Plain SGD (no momentum, decoupled weight decay off): the exact-arithmetic baseline of the tests."""
    return torch.optim.SGD(params, lr=config.lr)


OPTIMIZERS: dict[str, Callable[[list, OptimConfig], torch.optim.Optimizer]] = {
    "adamw": _adamw,
    "adamw_bf16": _adamw_bf16,
    "sgd": _sgd,
}


def build_optimizer(
    module: torch.nn.Module, config: OptimConfig, key: str, lr: float | None = None
) -> torch.optim.Optimizer:
    """The optimizer named by ``config.strategy`` over the trainable parameters of ``module`` (with LoRA: the
    adapters alone; frozen weights get no optimizer state). ``lr``: a peak learning rate other than ``config.lr``
    (``worker.actor.model.lora.lr``)."""
    if config.strategy not in OPTIMIZERS:
        raise ValueError(f"`{key}.strategy` is `{config.strategy}`; choose one of: {', '.join(OPTIMIZERS)}.")
    params = [p for p in module.parameters() if p.requires_grad]
    if lr is not None:
        config = dataclasses.replace(config, lr=lr)
    return OPTIMIZERS[config.strategy](params, config)


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """lr / peak lr after ``step`` scheduler steps: linear warmup to 1 over ``warmup_steps``, then constant or
    cosine decay to ``min_lr_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig, key: str) -> LambdaLR:
    """Warmup + constant/cosine schedule; it advances once per ``update_*`` call (one trainer step)."""
    total = config.training_steps
    if config.lr_warmup_steps is not None:
        warmup = config.lr_warmup_steps
    elif config.lr_warmup_ratio > 0:
        if total <= 0:
            raise ValueError(f"`{key}.lr_warmup_ratio` needs `{key}.training_steps` (the trainer fills it in).")
        warmup = int(config.lr_warmup_ratio * total)
    else:
        warmup = 0
    if config.lr_scheduler_type == "cosine" and total <= 0:
        raise ValueError(f"`{key}.lr_scheduler_type=cosine` needs `{key}.training_steps` (the trainer fills it in).")
    if config.lr_scheduler_type not in ("constant", "cosine"):
        raise ValueError(f"`{key}.lr_scheduler_type` is `{config.lr_scheduler_type}`; choose constant or cosine.")
    min_lr_ratio = config.min_lr_ratio or 0.0
    return LambdaLR(optimizer, lambda step: lr_multiplier(step, warmup, total, config.lr_scheduler_type, min_lr_ratio))


def clip_grad_norm_and_step(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float
) -> tuple[float, bool]:
    """Clip the gradient norm, then step; a non-finite norm skips the step. Returns (norm, stepped).

    A single inf/nan gradient would otherwise poison every parameter through Adam's moments for good.
    """
    params = [p for p in module.parameters() if p.grad is not None]
    max_norm = max_grad_norm if max_grad_norm and max_grad_norm > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm) if params else torch.tensor(0.0)
    if isinstance(grad_norm, DTensor):
        grad_norm = grad_norm.full_tensor()
    grad_norm = float(grad_norm)
    stepped = math.isfinite(grad_norm)
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, stepped

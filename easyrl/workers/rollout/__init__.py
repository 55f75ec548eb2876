"""Rollout engines hosted in the FSDP worker, chosen by ``worker.rollout.name``.

``build_rollout(worker)`` is what the worker calls in ``init_model``; a new engine is one ``@register_rollout``
function. Engines import their heavy dependencies (vLLM) only when built.
"""

from collections.abc import Callable
from typing import Any

from .base import BaseRollout, build_rollout_output, continue_position_ids, rollout_logprob_mismatch


# builder(worker) -> engine; the worker provides config (WorkerConfig), rank, world_size, tokenizer, actor_module
RolloutBuilder = Callable[[Any], BaseRollout]
ROLLOUT_BUILDERS: dict[str, RolloutBuilder] = {}


def register_rollout(name: str) -> Callable[[RolloutBuilder], RolloutBuilder]:
    def decorator(builder: RolloutBuilder) -> RolloutBuilder:
        ROLLOUT_BUILDERS[name] = builder
        return builder

    return decorator


def build_rollout(worker: Any) -> BaseRollout:
    name = worker.config.rollout.name
    if name not in ROLLOUT_BUILDERS:
        raise ValueError(f"Unknown `worker.rollout.name` `{name}`; choose one of: {', '.join(ROLLOUT_BUILDERS)}.")
    return ROLLOUT_BUILDERS[name](worker)


@register_rollout("vllm")
def _build_vllm(worker: Any) -> BaseRollout:
    from ...demo.builtin_models import resolve_model_path
    from ..fsdp_worker import ROLLOUT_MESH
    from .lora_sync import actor_lora
    from .multi_turn import wrap_multi_turn
    from .vllm_rollout import VLLMRollout, rollout_parallel_layout

    config, model_config = worker.config.rollout, worker.config.actor.model
    dp_rank, dp_size, tp_rank = rollout_parallel_layout(worker.rank, worker.world_size, config.tensor_parallel_size)
    # every rank of a tensor-parallel group gets its group's prompts; the group's first rank answers
    worker.register_dispatch_info(ROLLOUT_MESH, dp_rank, dp_size, tp_rank == 0)
    engine = VLLMRollout(
        resolve_model_path(model_config.model_path),
        config,
        worker.tokenizer,
        rank=worker.rank,
        world_size=worker.world_size,
        tokenizer_path=resolve_model_path(model_config.tokenizer_path or model_config.model_path),
        lora=actor_lora(getattr(worker, "actor_module", None)),
        hf_overrides=model_config.override_config,
    )
    # turn by turn with tools / an environment when multi_turn is set; a VLM's processor reads the pictures they return
    model_path = resolve_model_path(model_config.model_path)
    return wrap_multi_turn(engine, config.multi_turn, getattr(worker, "processor", None), model_path)


@register_rollout("hf")
def _build_hf(worker: Any) -> BaseRollout:
    from .hf_rollout import HFRollout

    return HFRollout(worker.actor_module, worker.config.rollout, worker.tokenizer)


__all__ = [
    "ROLLOUT_BUILDERS",
    "BaseRollout",
    "build_rollout",
    "build_rollout_output",
    "continue_position_ids",
    "register_rollout",
    "rollout_logprob_mismatch",
]

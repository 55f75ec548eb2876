"""What a run reads before Ray starts beyond the config, shared by `easyrl check` and the runs: torch-free to import
(check answers in a second), its checks import what they read."""

import dataclasses
import os
from typing import Any

from ..config import RunPlan


def error_text(error: BaseException) -> str:
    """An error's message; a KeyError's without the quotes ``str`` adds."""
    return error.args[0] if isinstance(error, KeyError) and error.args else str(error)


def check_model_files(plan: RunPlan) -> None:
    """What `easyrl check` reads beyond the config, as a run does before Ray starts: the tool files and environments
    (schemas, names) and the head counts Ulysses splits (the model's config.json). Raises ValueError naming the key."""
    multi_turn = plan.config.worker.rollout.multi_turn
    if multi_turn.tools or multi_turn.env:
        from ..workers.rollout.multi_turn import tool_schemas

        tool_schemas(multi_turn.tools, multi_turn.env)
    worker = plan.config.worker
    if worker.actor.ulysses_size > 1 or (plan.use_critic and worker.critic.ulysses_size > 1):
        from ..demo.builtin_models import resolve_model_path
        from ..workers.fsdp_utils import load_hf_config

        actor = dataclasses.replace(worker.actor.model, model_path=resolve_model_path(worker.actor.model.model_path))
        if os.path.isdir(actor.model_path):  # a hub id is read when the run starts (check does not download)
            check_ulysses_heads(plan, load_hf_config(actor, "causal_lm"))


def check_ulysses_heads(plan: RunPlan, actor_config: Any) -> None:
    """The head counts Ulysses splits are in the models' configs: checked now, not in the workers after Ray starts."""
    from ..demo.builtin_models import resolve_model_path
    from ..models.ulysses import check_heads
    from ..workers.fsdp_utils import load_hf_config

    worker = plan.config.worker
    roles = [("actor", worker.actor, actor_config)]
    if plan.use_critic:
        same = worker.critic.model.model_path == worker.actor.model.model_path
        roles.append(("critic", worker.critic, actor_config if same else None))
    for role, settings, model_config in roles:
        if settings.ulysses_size > 1:
            if model_config is None:
                own = dataclasses.replace(settings.model, model_path=resolve_model_path(settings.model.model_path))
                if not os.path.isdir(own.model_path):
                    continue
                model_config = load_hf_config(own, "value")
            text_config = getattr(model_config, "text_config", None) or model_config
            check_heads(text_config, settings.ulysses_size, f"worker.{role}.ulysses_size")

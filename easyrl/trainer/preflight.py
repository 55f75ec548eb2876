"""What a run reads before Ray starts beyond the config, shared by `easyrl check` and the runs: torch-free to import
(check answers in a second), its checks import what they read."""

import copy
import dataclasses
import json
import os
from typing import Any

from ..config import RunPlan


def error_text(error: BaseException) -> str:
    """An error's message; a KeyError's without the quotes ``str`` adds."""
    return error.args[0] if isinstance(error, KeyError) and error.args else str(error)


def check_model_files(plan: RunPlan) -> list[dict] | dict[str, list[dict]] | None:
    """What `easyrl check` reads beyond the config, as a run does before Ray starts: the tool files and environments
    (schemas, names) and the head counts Ulysses splits (the models' config.json). Raises ValueError naming the key.
    Returns the tool schemas the prompts advertise (tool_files.tool_schemas; None without multi-turn tools)."""
    multi_turn = plan.config.worker.rollout.multi_turn
    schemas = None
    if multi_turn.tools or multi_turn.env:
        from ..workers.tool_files import tool_schemas

        schemas = tool_schemas(multi_turn.tools, multi_turn.env)
    check_head_splits(plan)
    check_lora_targets(plan)
    return schemas


def check_lora_targets(plan: RunPlan) -> None:
    """LoRA's target_modules and exclude_modules leave some layer of the model to adapt: the workers would stop on
    it at start, after Ray and the engine. Checked on the model's structure (its config.json, built on the meta
    device) when the model is a local folder; a hub id is checked by the workers."""
    model = plan.config.worker.actor.model
    if model.lora.rank == 0:
        return
    from ..demo.builtin_models import resolve_model_path  # torch: only for LoRA runs

    local = dataclasses.replace(model, model_path=resolve_model_path(model.model_path))
    if os.path.isfile(os.path.join(local.model_path, "config.json")):
        from .checkpoint import planned_adapter_config

        planned_adapter_config(local, "before Ray")


def tool_schema_lines(schemas: list[dict] | dict[str, list[dict]] | None) -> list[str]:
    """The tool schemas as `easyrl check` prints them, one JSON line a tool: what the chat template gets as
    ``tools=``, so that a user can write an SFT ``tools`` column (sft.tools_key) that teaches the same calls."""
    if not schemas:
        return []
    groups = schemas if isinstance(schemas, dict) else {None: schemas}
    lines = []
    for name, listed in groups.items():
        if not listed:
            lines.append(f"environment `{name}` advertises no tools (a stepped environment)")
            continue
        where = f"environment `{name}`'s" if name is not None else "the"
        lines.append(
            f"{where} tools, as the chat template's `tools=` gets them (an SFT `tools` column teaching these calls "
            "should hold the same):"
        )
        lines += [f"  {json.dumps(schema, ensure_ascii=False)}" for schema in listed]
    return lines


def check_head_splits(plan: RunPlan, actor_config: Any = None) -> None:
    """The head counts Ulysses and a tensor-parallel vLLM engine split are in the models' configs: checked before Ray
    starts, not in the workers.
    ``actor_config``: the actor's HF config when the caller has read it (else each role's is read here, from a local
    folder only: a hub id is read when the run starts, and check does not download)."""
    worker = plan.config.worker
    # (key, size, the model whose heads it splits, its kind, what splits them (None: Ulysses))
    splits = [("worker.actor.ulysses_size", worker.actor.ulysses_size, worker.actor.model, "causal_lm", None)]
    if plan.use_critic:
        splits.append(("worker.critic.ulysses_size", worker.critic.ulysses_size, worker.critic.model, "value", None))
    if worker.rollout.name == "vllm":
        # a tensor-parallel engine splits the heads by the same rule; it failed at engine start, after Ray
        engine = "vLLM splits the attention heads over the workers of a tensor-parallel engine"
        tensor_parallel = worker.rollout.tensor_parallel_size
        splits.append(
            ("worker.rollout.tensor_parallel_size", tensor_parallel, worker.actor.model, "causal_lm", engine)
        )
    configs = {worker.actor.model.model_path: actor_config} if actor_config is not None else {}  # read once per model
    for key, size, model, kind, splitter in splits:
        if size <= 1:
            continue
        from ..demo.builtin_models import resolve_model_path  # torch: only where there is something to check
        from ..models.hf_config import check_heads, load_hf_config

        if model.model_path not in configs:
            local = dataclasses.replace(model, model_path=resolve_model_path(model.model_path))
            configs[model.model_path] = load_hf_config(local, kind) if os.path.isdir(local.model_path) else None
        model_config = configs[model.model_path]
        if model_config is None:
            continue
        text_config = getattr(model_config, "text_config", None) or model_config
        check_heads(text_config, size, key, plan.world_size, **({"splitter": splitter} if splitter else {}))


def resume_point(config: Any, what: str = "training") -> str | None:
    """The checkpoint a run of ``config`` resumes from, checked as the run checks it before Ray starts (a checkpoint
    it cannot resume, or a fresh start among an earlier run's checkpoints, raises ValueError saying what to change);
    None: a fresh start. The checkpoint code (torch) is imported only where a checkpoint may be."""
    trainer = config.trainer
    folder = trainer.save_checkpoint_path
    if not trainer.load_checkpoint_path and not (folder and os.path.isdir(folder) and os.listdir(folder)):
        return None
    from .checkpoint import CheckpointError, check_resume_point

    try:
        return check_resume_point(config, what)
    except CheckpointError as error:
        raise ValueError(str(error)) from error


def start_step(path: str | None) -> int:
    """The step a run resumes at from the checkpoint at ``path`` (0: afresh, ``path`` None). The checkpoint code
    (torch) is imported only when there is a checkpoint."""
    if path is None:
        return 0
    from .checkpoint import checkpoint_step

    return checkpoint_step(path)


def resume_summary(plan: Any, path: str | None) -> str:
    """The plan's line about where the run starts: afresh, or from ``path`` (and whether anything is left to train
    from there: a checkpoint at or past the run's last step leaves nothing)."""
    if path is None:
        return "starts afresh"
    step = start_step(path)
    line = f"resumes from {path} (after step {step})"
    trainer = plan.config.trainer
    if getattr(trainer, "load_checkpoint_path", None) and os.path.abspath(trainer.load_checkpoint_path) != path:
        from .checkpoint import passed_start_reason

        line += (
            f", this run's own newest checkpoint: trainer.load_checkpoint_path={trainer.load_checkpoint_path} "
            f"{passed_start_reason(trainer, path)}"
        )
    finished = nothing_left_to_train(plan, path, step)
    if finished is None and plan.training_steps is None and not getattr(trainer, "val_only", False):
        finished = _steps_by_saved_rows(plan, path, step)
    return line if finished is None else f"{line.rstrip('.')}; {finished}"  # one sentence, not `).;`


def _steps_by_saved_rows(plan: Any, path: str, step: int) -> str | None:
    """For `easyrl check`, which reads no data: the run's step count from the training rows the run that saved
    ``path`` read (its trainer_state.json), said as such, when the count is by epochs. None when it cannot tell."""
    if not hasattr(plan, "with_training_steps") or plan.config.trainer.max_steps is not None:
        return None
    from .checkpoint import load_trainer_state

    try:
        rows = load_trainer_state(path).get("train_rows")
        steps = copy.deepcopy(plan).with_training_steps(rows // plan.generation_batch_size).training_steps
    except (ValueError, TypeError, OSError):  # an older checkpoint without the count, or too few rows for a step
        return None
    counted = f"counted from the {rows} training rows the run that saved it read"
    if step < steps:
        return f"{steps - step} of its {steps} steps left ({counted})"
    return (
        f"nothing is left to train unless the data grew: the run has {steps} steps ({counted}, "
        f"trainer.total_epochs={plan.config.trainer.total_epochs}) and the checkpoint is at its last. Raise "
        "trainer.total_epochs (or set trainer.max_steps) to train on from it, or start afresh in a new "
        "trainer.save_checkpoint_path."
    )


def nothing_left_to_train(plan: Any, path: str, step: int) -> str | None:
    """What to say when the checkpoint at ``path`` (of ``step``) is at or past the run's last step (trainer.max_steps
    lowered below it): the run has nothing to train and starts neither Ray nor the engine."""
    trainer = plan.config.trainer
    steps = plan.training_steps or trainer.max_steps  # max_steps, when set, is the count (before the data is read)
    if getattr(trainer, "val_only", False) or steps is None or step < steps:
        return None
    asked = f"trainer.max_steps={trainer.max_steps}" if trainer.max_steps else f"{trainer.total_epochs} epoch(s)"
    return (
        f"Nothing to train: the checkpoint this run resumes from, {path}, is at step {step}, and the run has "
        f"{steps} steps ({asked}). Raise trainer.max_steps (or trainer.total_epochs) to train on from "
        "it, or start afresh in a new trainer.save_checkpoint_path."
    )

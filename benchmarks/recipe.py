"""The embedded default recipe (examples/smollm2_arithmetic_grpo.yaml), shrunk and run in this process.

The benchmarks drive the real trainer (``build_trainer`` + ``PPOTrainer.fit``) and only listen: a ``Recorder``
keeps what the driver sent to and got back from the actor worker group (prompts, rollout metrics such as the weight
sync time, the batch of each actor update), so that a bare baseline can redo exactly the same work.
"""

import argparse
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import REPO_ROOT


DEFAULT_RECIPE = REPO_ROOT / "examples" / "smollm2_arithmetic_grpo.yaml"
CPU_KV_CACHE_BYTES = 256 << 20  # plenty for a few dozen short sequences of a 135M model


def add_recipe_args(
    parser: argparse.ArgumentParser, steps: int = 3, rollout_batch_size: int = 4, n: int = 4, response_length: int = 32
) -> None:
    group = parser.add_argument_group("recipe (examples/smollm2_arithmetic_grpo.yaml, shrunk)")
    group.add_argument("--steps", type=int, default=steps, help="training steps (the first one is warm-up)")
    group.add_argument("--rollout-batch-size", type=int, default=rollout_batch_size, help="prompts per step")
    group.add_argument("--n", type=int, default=n, help="responses per prompt")
    group.add_argument("--max-response-length", type=int, default=response_length, help="new tokens at most")
    group.add_argument("--max-prompt-length", type=int, default=None, help="prompt padding width (recipe: 128)")
    group.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="compute dtype everywhere")
    group.add_argument("--override", action="append", default=[], help="extra key=value for the recipe")


def recipe_overrides(args: argparse.Namespace, save_dir: str) -> list[str]:
    """The recipe with the benchmark's sizes: one optimizer step per rollout batch, no validation, file logger.

    Micro-batches keep the recipe's sizes unless the batch is smaller, in which case the whole batch is one
    micro-batch."""
    import yaml

    with open(DEFAULT_RECIPE, encoding="utf-8") as handle:
        actor = yaml.safe_load(handle)["worker"]["actor"]
    samples = args.rollout_batch_size * args.n
    update_micro = min(actor["micro_batch_size_per_device_for_update"], samples)
    experience_micro = min(actor["micro_batch_size_per_device_for_experience"], samples)
    overrides = [
        f"config={DEFAULT_RECIPE}",
        f"data.format_prompt={REPO_ROOT / 'format_prompt' / 'arithmetic.jinja'}",
        f"data.rollout_batch_size={args.rollout_batch_size}",
        f"data.max_response_length={args.max_response_length}",
        f"worker.actor.global_batch_size={args.rollout_batch_size}",
        f"worker.actor.micro_batch_size_per_device_for_update={update_micro}",
        f"worker.actor.micro_batch_size_per_device_for_experience={experience_micro}",
        f"worker.actor.fsdp.mp_param_dtype={args.dtype}",
        f"worker.rollout.dtype={args.dtype}",
        f"worker.rollout.n={args.n}",
        f"worker.rollout.kv_cache_memory_bytes={CPU_KV_CACHE_BYTES}",
        "worker.rollout.disable_tqdm=true",
        f"worker.reward.reward_function={REPO_ROOT / 'reward_function' / 'arithmetic.py'}:compute_score",
        f"trainer.max_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.val_freq=0",
        "trainer.save_freq=0",
        "trainer.find_last_checkpoint=false",
        "trainer.logger=[file]",
        f"trainer.save_checkpoint_path={save_dir}",
    ]
    if args.max_prompt_length is not None:
        overrides.append(f"data.max_prompt_length={args.max_prompt_length}")
    return overrides + list(args.override)


@dataclass
class Recorder:
    """What crossed the driver <-> actor-worker boundary during a run's training steps (all on the driver, nothing
    re-run; validation calls are left out)."""

    prompt_ids: list[list[list[int]]] = field(default_factory=list)  # per generate call: unpadded prompt ids
    rollout_metrics: list[dict[str, float]] = field(default_factory=list)  # per generate call (worker side)
    generate_wall_s: list[float] = field(default_factory=list)  # per generate call, seen from the driver
    response_tokens: list[int] = field(default_factory=list)  # per generate call
    update_batches: list[Any] = field(default_factory=list)  # per update_actor call: the DataProto sent

    def attach(self, group: Any) -> None:
        generate, update = group.generate_sequences, group.update_actor

        def recorded_generate(data: Any, request: Any = None) -> Any:
            if request is not None and request.validate:  # the run's final validation: not a training step
                return generate(data, request)
            start = time.perf_counter()
            out = generate(data, request)
            self.generate_wall_s.append(time.perf_counter() - start)
            self.prompt_ids.append([list(ids) for ids in data.non_tensor_batch["raw_prompt_ids"]])
            self.rollout_metrics.append(dict(out.meta_info.get("metrics", {})))
            self.response_tokens.append(int(out.batch["response_mask"].sum()))
            return out

        def recorded_update(data: Any, **kwargs: Any) -> Any:
            self.update_batches.append(data)
            return update(data, **kwargs)

        group.generate_sequences = recorded_generate
        group.update_actor = recorded_update


@dataclass
class RecipeRun:
    config: Any
    rows: list[dict[str, Any]]  # metrics.jsonl, one row per step
    recorder: Recorder
    setup_s: float  # Ray, workers, engines, data
    fit_s: float


def run_recipe(args: argparse.Namespace, extra: list[str] | None = None) -> RecipeRun:
    """Train ``args.steps`` steps of the shrunk recipe in this process (Ray started and stopped here)."""
    import ray

    from easyrl.config import load_run_plan
    from easyrl.trainer.main import build_trainer, init_ray

    save_dir = tempfile.mkdtemp(prefix="easyrl_bench_")
    plan = load_run_plan(recipe_overrides(args, save_dir) + list(extra or []))
    start = time.perf_counter()
    init_ray(plan)
    trainer = build_trainer(plan)
    recorder = Recorder()
    recorder.attach(trainer.workers.actor_rollout)
    setup_s = time.perf_counter() - start
    try:
        start = time.perf_counter()
        trainer.fit()
        fit_s = time.perf_counter() - start
    finally:
        trainer.on_shutdown()
        ray.shutdown()
    with open(os.path.join(save_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle]
    shutil.rmtree(save_dir, ignore_errors=True)  # the final checkpoint is not needed
    return RecipeRun(plan.config, rows, recorder, setup_s, fit_s)


def measured_steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps after the first (warm-up: first kernels, allocator growth); the only step when there is one."""
    steps = [row for row in rows if "timing/step" in row]
    return steps[1:] if len(steps) > 1 else steps


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def model_path(config: Any) -> Path:
    return Path(config.worker.actor.model.model_path)

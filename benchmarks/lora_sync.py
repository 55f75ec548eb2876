"""LoRA vs full training: what one weight sync moves into the vLLM engine, how long it takes, and the worker's peak
memory.

    .venv/bin/python -m benchmarks.lora_sync [--model smollm2] [--steps 3] [--rank 8]

Each variant runs in a fresh one-rank actor_rollout worker (FSDP2 + vLLM in one process, fp32, as the CPU recipe
runs): per step, one actor update (AdamW) on a random rollout-shaped batch, then ``sync_rollout_weights``, whose
bytes and seconds the worker reports (``rollout/weight_sync_*``). The worker's peak resident memory (ru_maxrss, the
process's high-water mark: model, engine, optimizer states) is read after the last step. Variants:

    full         all weights trained; each sync streams the whole model
    lora         rank-r adapters (alpha 2r), sync route "adapter": the engine keeps the base, takes the adapter
    lora-merged  the same adapters, sync route "merged" (the fallback): merged weights, a full-model stream
"""

import argparse
import resource
import tempfile
import time
from pathlib import Path

import torch

import easyrl  # noqa: F401  (process environment: Ray and vLLM settings)

from .common import REPO_ROOT, append_result, describe_machine, print_table


BATCH_SIZE, PROMPT_LENGTH, RESPONSE_LENGTH = 4, 32, 32
VARIANTS = ("full", "lora", "lora-merged")


def _tiny(folder: Path) -> str:
    from easyrl.testing.tiny_models import build_tiny_causal_lm

    return str(build_tiny_causal_lm(folder / "tiny"))


def _smollm2(folder: Path) -> str:
    from easyrl.demo.smollm2 import ensure_smollm2

    return str(ensure_smollm2())


MODELS = {"tiny": _tiny, "smollm2": _smollm2}


def _overrides(model_path: str, variant: str, rank: int) -> list[str]:
    overrides = [
        f"config={REPO_ROOT / 'examples' / 'smollm2_arithmetic_grpo.yaml'}",
        f"data.format_prompt={REPO_ROOT / 'format_prompt' / 'arithmetic.jinja'}",
        f"worker.reward.reward_function={REPO_ROOT / 'reward_function' / 'arithmetic.py'}:compute_score",
        f"worker.actor.model.model_path={model_path}",
        "worker.actor.fsdp.mp_param_dtype=fp32",
        "worker.actor.use_torch_compile=false",
        "worker.rollout.dtype=fp32",
        "worker.rollout.n=2",
        f"worker.rollout.kv_cache_memory_bytes={64 << 20}",
        # BATCH_SIZE samples = BATCH_SIZE / 2 prompts x 2 samples: one mini-batch, one micro-batch
        f"data.rollout_batch_size={BATCH_SIZE // 2}",
        f"worker.actor.global_batch_size={BATCH_SIZE // 2}",
        f"worker.actor.micro_batch_size_per_device_for_update={BATCH_SIZE}",
        f"worker.actor.micro_batch_size_per_device_for_experience={BATCH_SIZE}",
    ]
    if variant != "full":
        overrides += [f"worker.actor.model.lora.rank={rank}", f"worker.actor.model.lora.alpha={2 * rank}"]
        overrides.append(f"worker.rollout.lora_sync={'adapter' if variant == 'lora' else 'merged'}")
    return overrides


def _random_batch(vocab: int, seed: int):
    """Rollout-shaped: left-padded prompts ++ right-padded responses, random tokens of the model's vocabulary."""
    from easyrl.protocol import DataProto

    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(5, vocab, (BATCH_SIZE, PROMPT_LENGTH), generator=generator)
    responses = torch.randint(5, vocab, (BATCH_SIZE, RESPONSE_LENGTH), generator=generator)
    prompt_mask = torch.ones(BATCH_SIZE, PROMPT_LENGTH, dtype=torch.long)
    response_mask = torch.ones(BATCH_SIZE, RESPONSE_LENGTH, dtype=torch.long)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
    }
    return DataProto.from_dict(tensors=tensors)


def _worker_state(worker) -> dict[str, float]:
    return {
        **worker.rollout._last_sync_metrics,
        "lora_route": getattr(worker.rollout, "lora_route", None),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # KiB on Linux
    }


def measure(model_path: str, variant: str, steps: int, rank: int) -> list[dict]:
    """``steps`` x (update, sync) in a fresh one-rank worker; each sync's metrics, the update's and the sync's wall
    seconds seen by the driver, the worker's peak RSS so far."""
    import ray

    from easyrl.config import load_config
    from easyrl.controller.resource_pool import ResourcePool
    from easyrl.controller.worker_group import RayWorkerGroup
    from easyrl.workers.fsdp_worker import FSDPWorker

    config = load_config(_overrides(model_path, variant, rank))
    config.worker.actor.optim.training_steps = steps
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False)
    pool = ResourcePool(process_on_nodes=[1])
    group = RayWorkerGroup(pool, FSDPWorker, config.worker, "actor_rollout", name_prefix=f"lora_sync_{variant}")
    results = []
    try:
        group.init_model()
        vocab = group.apply_all(lambda worker: len(worker.tokenizer))[0]
        for step in range(steps):
            batch = _random_batch(vocab, seed=step)
            batch.meta_info["temperature"] = config.worker.rollout.temperature
            batch.batch["old_log_probs"] = group.compute_log_probs(batch).batch["old_log_probs"]
            batch.batch["advantages"] = torch.randn(batch.batch["response_mask"].shape)
            start = time.perf_counter()
            group.update_actor(batch)
            update_s = time.perf_counter() - start
            start = time.perf_counter()
            group.sync_rollout_weights()
            sync_wall_s = time.perf_counter() - start
            (state,) = group.apply_all(_worker_state)
            results.append({**state, "update_s": update_s, "sync_wall_s": sync_wall_s})
    finally:
        group.kill()
        pool.release()
    return results


def summarise(variant: str, steps: list[dict]) -> dict:
    mean = lambda key: sum(s[key] for s in steps) / len(steps)  # noqa: E731
    return {
        "variant": variant,
        "route": steps[-1]["lora_route"] or "-",
        "sync_MB": steps[-1]["rollout/weight_sync_bytes"] / 1e6,
        "sync_bytes": int(steps[-1]["rollout/weight_sync_bytes"]),
        "sync_s": mean("rollout/weight_sync_s"),
        "sync_wall_s": mean("sync_wall_s"),
        "update_s": mean("update_s"),
        "peak_rss_GiB": steps[-1]["peak_rss_bytes"] / 2**30,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", choices=list(MODELS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=3, help="update + sync steps per variant (seconds are the mean)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (alpha = 2 x rank)")
    args = parser.parse_args()

    import ray

    table = []
    with tempfile.TemporaryDirectory(prefix="easyrl_bench_models_") as folder:
        model_path = MODELS[args.model](Path(folder))
        try:
            for variant in args.variants:
                table.append(summarise(variant, measure(model_path, variant, args.steps, args.rank)))
        finally:
            ray.shutdown()
    print_table(
        table,
        title=f"Weight sync per step, full vs LoRA rank {args.rank} ({args.model}, fp32, mean of {args.steps} steps) "
        f"({describe_machine()})",
    )
    append_result("lora_sync", {"args": vars(args), "variants": table})


if __name__ == "__main__":
    main()

"""Weight-sync throughput: GB/s of streaming the actor's full parameters into the vLLM engine it shares a process with.

    .venv/bin/python -m benchmarks.weight_sync [--models tiny smollm2 qwen2-0.5b-body --repeats 3]

Each model runs in the real actor/rollout worker (one FSDP2 rank, vLLM with the external launcher, fp32): the driver
calls ``sync_rollout_weights`` --repeats times, and the worker reports each sync's bytes and seconds (the per-layer
all-gather from the FSDP shards, vLLM's layerwise reload and re-packing, the CPU lm_head refresh). Target on CPU:
>= 1 GB/s. Right after each sync the worker also times plain tensor copies of the same number of bytes ("copy GB/s",
the memory speed the sync got at that moment): on a shared machine the GB/s follow the load, and "sync/copy" (the
median over the syncs) is the figure that compares across runs. vLLM's CPU reload touches every byte at least twice
(a copy into the layer's fused tensor, then the re-pack for its GEMM kernel), so expect sync/copy below ~0.5.

Models (random weights except SmolLM2; all with SmolLM2's 49,152-token vocabulary):

    tiny               2 layers, hidden 64 (the test model; almost all of it is the embedding)
    smollm2            SmolLM2-135M-Instruct
    qwen2-0.5b-body    Qwen2.5-0.5B's layers (24 x hidden 896, 14/2 heads, MLP 4864), ~0.4B with this vocabulary
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import easyrl  # noqa: F401  (process environment: Ray and vLLM settings)

from .common import REPO_ROOT, append_result, describe_machine, print_table
from .recipe import mean


TARGET_GB_PER_S = 1.0


def _tiny(folder: Path) -> Path:
    from easyrl.testing.tiny_models import build_tiny_causal_lm

    return build_tiny_causal_lm(folder / "tiny")


def _smollm2(folder: Path) -> Path:
    from easyrl.demo.smollm2 import ensure_smollm2

    return ensure_smollm2()


def _qwen2_body(folder: Path) -> Path:
    from easyrl.testing.tiny_models import build_tiny_causal_lm

    return build_tiny_causal_lm(
        folder / "qwen2_body", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864
    )


MODELS = {"tiny": _tiny, "smollm2": _smollm2, "qwen2-0.5b-body": _qwen2_body}


def _sync_metrics(worker) -> dict[str, float]:
    return dict(worker.rollout._last_sync_metrics)


COPY_CHUNK_BYTES = 256 << 20  # larger than the last-level cache: copies run at memory speed


def _copy_gb_per_s(worker, num_bytes: float) -> float:
    """GB/s of plain tensor copies of ``num_bytes`` in the worker's process, with its threads: the speed of memory at
    this moment, which a sync (at least one copy and one re-pack of every byte) is compared with."""
    import torch

    numel = int(min(num_bytes, COPY_CHUNK_BYTES)) // 4
    source, target = torch.randn(numel), torch.empty(numel)
    target.copy_(source)  # the first touch faults the pages in; not timed
    copies = max(1, round(num_bytes / (numel * 4)))
    start = time.perf_counter()
    for _ in range(copies):
        target.copy_(source)
    return copies * numel * 4 / 1e9 / (time.perf_counter() - start)


def measure(model_path: Path, repeats: int) -> list[dict[str, float]]:
    """Sync ``repeats`` times in a fresh one-rank worker; the worker's metrics of each sync plus the driver's wall."""
    from easyrl.config import load_run_plan
    from easyrl.controller.resource_pool import ResourcePool
    from easyrl.controller.worker_group import RayWorkerGroup
    from easyrl.trainer.main import cpus_per_worker, init_ray
    from easyrl.workers.fsdp_worker import FSDPWorker

    plan = load_run_plan(
        [
            f"config={REPO_ROOT / 'examples' / 'smollm2_arithmetic_grpo.yaml'}",
            f"data.format_prompt={REPO_ROOT / 'format_prompt' / 'arithmetic.jinja'}",
            f"worker.actor.model.model_path={model_path}",
            "worker.actor.fsdp.mp_param_dtype=fp32",
            "worker.rollout.dtype=fp32",
            f"worker.rollout.kv_cache_memory_bytes={64 << 20}",
            f"worker.reward.reward_function={REPO_ROOT / 'reward_function' / 'arithmetic.py'}:compute_score",
        ]
    )
    plan = plan.with_training_steps(1)  # the step count the actor's lr schedule needs (no data is read here)
    config = plan.config
    init_ray(plan)
    pool = ResourcePool.from_trainer_config(1, 1, cpus_per_worker=cpus_per_worker(plan, 1))
    group = RayWorkerGroup(pool, FSDPWorker, config.worker, "actor_rollout", name_prefix="weight_sync")
    results = []
    try:
        group.init_model()
        for _ in range(repeats):
            start = time.perf_counter()
            group.sync_rollout_weights()
            wall = time.perf_counter() - start
            (metrics,) = group.apply_all(_sync_metrics)
            # right after each sync, so that both see the same load
            (copy_gb_per_s,) = group.apply_all(_copy_gb_per_s, metrics["rollout/weight_sync_bytes"])
            results.append({**metrics, "driver_wall_s": wall, "copy_gb_per_s": copy_gb_per_s})
    finally:
        group.kill()
        pool.release()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeats", type=int, default=3, help="syncs per model (all are reported; the mean is)")
    args = parser.parse_args()

    import ray

    table = []
    with tempfile.TemporaryDirectory(prefix="easyrl_bench_models_") as folder:
        try:
            for name in args.models:
                syncs = measure(MODELS[name](Path(folder)), args.repeats)
                gb = syncs[0]["rollout/weight_sync_gb"]
                table.append(
                    {
                        "model": name,
                        "GB": gb,
                        "buckets": int(syncs[0]["rollout/weight_sync_buckets"]),
                        "sync_s": mean([s["rollout/weight_sync_s"] for s in syncs]),
                        "GB/s": mean([s["rollout/weight_sync_gb_per_s"] for s in syncs]),
                        "best GB/s": max(s["rollout/weight_sync_gb_per_s"] for s in syncs),
                        "driver_wall_s": mean([s["driver_wall_s"] for s in syncs]),
                        "copy GB/s": mean([s["copy_gb_per_s"] for s in syncs]),
                        # per sync, then the median: the load moves between syncs, the two of one sync share it
                        "sync/copy": statistics.median(
                            s["rollout/weight_sync_gb_per_s"] / s["copy_gb_per_s"] for s in syncs
                        ),
                        "load_1m": os.getloadavg()[0],
                    }
                )
        finally:
            ray.shutdown()
    print_table(
        table,
        title=f"Weight sync (fp32, mean of {args.repeats}; target >= {TARGET_GB_PER_S} GB/s) ({describe_machine()})",
    )
    for row in table:
        verdict = "met" if row["GB/s"] >= TARGET_GB_PER_S else f"missed: {row['GB/s'] / TARGET_GB_PER_S:.2f}x of it"
        print(f"{row['model']}: {row['GB/s']:.2f} GB/s ({verdict})")
    append_result("weight_sync", {"args": vars(args), "target_gb_per_s": TARGET_GB_PER_S, "models": table})


if __name__ == "__main__":
    main()

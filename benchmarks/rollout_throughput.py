"""Rollout tokens/s: easyrl's rollout worker against a bare vLLM engine on the same prompts and sampling settings.

    .venv/bin/python -m benchmarks.rollout_throughput [--rounds 3 --rollout-batch-size 8 --n 4 --max-response-length 48]

easyrl: the embedded recipe's actor/rollout worker group (one worker, vLLM inside it) is built as for training and
asked to generate for --rounds batches of prompts from the training loader, with no training in between (so no
weight sync). Throughput is counted two ways: seen from the driver (the whole ``generate_sequences`` call: Ray,
splitting the batch, padding the output) and inside the worker (vLLM's generate call only).

bare: one in-process vLLM engine with the same engine settings generates for the same prompt ids, with the same
sampling settings. The first round of each is warm-up and left out.
"""

import argparse
import time

import easyrl  # noqa: F401  (process environment: Ray and vLLM settings)

from .bare import BareVLLM
from .common import append_result, describe_machine, match_ray_worker_priority, print_table
from .recipe import Recorder, add_recipe_args, mean, recipe_overrides


def easyrl_rounds(args: argparse.Namespace) -> tuple[object, Recorder]:
    """Generate --rounds batches through the trainer's worker group; returns (config, recorder)."""
    import shutil
    import tempfile

    import ray

    from easyrl.config import load_run_plan
    from easyrl.protocol import DataProto
    from easyrl.trainer.main import build_trainer, init_ray
    from easyrl.trainer.ray_trainer import GENERATION_KEYS, GENERATION_NON_TENSOR_KEYS
    from easyrl.workers.rollout.base import GenerationRequest

    save_dir = tempfile.mkdtemp(prefix="easyrl_bench_")
    plan = load_run_plan(recipe_overrides(args, save_dir))
    init_ray(plan)
    trainer = build_trainer(plan)
    config = plan.config
    recorder = Recorder()
    recorder.attach(trainer.workers.actor_rollout)
    try:
        loader = iter(trainer.train_loader)
        for round_index in range(args.rounds):
            batch = next(loader)
            prompts = batch if isinstance(batch, DataProto) else DataProto.from_single_dict(batch)
            gen_input = prompts.select(
                batch_keys=list(GENERATION_KEYS),
                non_tensor_batch_keys=[k for k in GENERATION_NON_TENSOR_KEYS if k in prompts.non_tensor_batch],
            )
            seed = [config.worker.rollout.seed, 0, round_index]
            trainer.workers.actor_rollout.generate_sequences(gen_input, GenerationRequest(seed=seed))
    finally:
        trainer.on_shutdown()
        ray.shutdown()
        shutil.rmtree(save_dir, ignore_errors=True)
    return config, recorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_recipe_args(parser, rollout_batch_size=8, n=4, response_length=48)
    parser.add_argument("--rounds", type=int, default=3, help="generation rounds (the first one is warm-up)")
    args = parser.parse_args()

    config, recorder = easyrl_rounds(args)
    warmup = 1 if args.rounds > 1 else 0
    tokens = recorder.response_tokens[warmup:]
    # the first generate call may include the initial weight sync: subtract what the worker reports for it
    wall = [
        seconds - metrics.get("rollout/weight_sync_s", 0.0)
        for seconds, metrics in zip(recorder.generate_wall_s[warmup:], recorder.rollout_metrics[warmup:])
    ]
    engine = [m["rollout/gen_seconds"] for m in recorder.rollout_metrics[warmup:]]

    match_ray_worker_priority()  # the baseline gets the CPU priority easyrl's workers had
    rollout = config.worker.rollout
    start = time.perf_counter()
    bare = BareVLLM(
        str(config.worker.actor.model.model_path),
        rollout,
        max_model_len=config.data.max_prompt_length + config.data.max_response_length,
    )
    bare_start_s = time.perf_counter() - start
    bare_runs = [
        bare.generate(prompt_ids, config.data.max_response_length, seed=1000 * i)
        for i, prompt_ids in enumerate(recorder.prompt_ids)
    ][warmup:]

    easyrl_driver_tps = sum(tokens) / sum(wall)
    easyrl_engine_tps = sum(tokens) / sum(engine)
    bare_tps = sum(r.response_tokens for r in bare_runs) / sum(r.seconds for r in bare_runs)
    table = [
        {
            "rollout": "easyrl (driver wall)",
            "tokens/s": easyrl_driver_tps,
            "tokens/round": mean(tokens),
            "vs bare": easyrl_driver_tps / bare_tps,
        },
        {
            "rollout": "easyrl (engine call)",
            "tokens/s": easyrl_engine_tps,
            "tokens/round": mean(tokens),
            "vs bare": easyrl_engine_tps / bare_tps,
        },
        {
            "rollout": "bare vLLM",
            "tokens/s": bare_tps,
            "tokens/round": mean([r.response_tokens for r in bare_runs]),
            "vs bare": 1.0,
        },
    ]
    print_table(
        table,
        title=f"Rollout throughput, {len(tokens)} round(s) after warm-up: {args.rollout_batch_size} prompts x "
        f"n={args.n}, <= {args.max_response_length} new tokens, {args.dtype} ({describe_machine()})",
    )
    append_result(
        "rollout_throughput",
        {
            "args": vars(args),
            "easyrl_driver_tokens_per_s": easyrl_driver_tps,
            "easyrl_engine_tokens_per_s": easyrl_engine_tps,
            "bare_tokens_per_s": bare_tps,
            "ratio_driver_vs_bare": easyrl_driver_tps / bare_tps,
            "easyrl_tokens_per_round": tokens,
            "bare_tokens_per_round": [r.response_tokens for r in bare_runs],
            "bare_engine_start_s": bare_start_s,
        },
    )


if __name__ == "__main__":
    main()

"""Rollout tokens/s: easyrl's rollout worker against a bare vLLM engine on the same prompts and sampling settings.

    .venv/bin/python -m benchmarks.rollout_throughput [--rounds 5 --rollout-batch-size 8 --n 4 --max-response-length 48]

easyrl: the embedded recipe's actor/rollout worker group (one worker, vLLM inside it, next to the FSDP actor) is
built as for training and asked to generate for a batch of prompts from the training loader, with no training in
between (so no weight sync). Throughput is counted two ways: seen from the driver (the whole ``generate_sequences``
call: Ray, splitting the batch, padding the output) and inside the worker (the engine call only).

bare: one in-process vLLM engine in the driver with the same engine settings, the same prompt ids and the same
per-prompt seeds as the worker's engine used (``call_request_seeds``), so both sample the same tokens: the table says
whether every token and log-prob agreed.

The two alternate round by round (easyrl, bare, easyrl, bare, ...) at the same CPU priority, and the ratios are
taken per round, then their median: on a machine shared with other jobs the load moves within seconds, and two
phases measured minutes apart compare the load, not the engines. The CPU seconds each process used for its call
(all threads; the worker's include the Ray call and the output padding) are compared too: they depend less on how
many other jobs share the cores. The first round of each is warm-up and left out.
"""

import argparse
import os
import statistics
import time

import easyrl  # noqa: F401  (process environment: Ray and vLLM settings)

from .bare import BareVLLM
from .common import append_result, describe_machine, match_ray_worker_priority, print_table
from .recipe import add_recipe_args, recipe_overrides


def _samples(out) -> tuple[list[list[int]], list[list[float]]]:
    """(token ids, log-probs) per sample of a rollout DataProto, padding removed."""
    lengths = out.batch["response_mask"].sum(-1).tolist()
    responses, log_probs = out.batch["responses"].tolist(), out.batch["rollout_log_probs"].tolist()
    return (
        [row[:length] for row, length in zip(responses, lengths)],
        [row[:length] for row, length in zip(log_probs, lengths)],
    )


def _cpu_seconds(worker=None) -> float:
    """CPU seconds this process has used so far, all threads (inside a worker through ``apply_all``)."""
    return time.process_time()


def _max_log_prob_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max((abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b)), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_recipe_args(parser, rollout_batch_size=8, n=4, response_length=48)
    parser.add_argument("--rounds", type=int, default=5, help="generation rounds per side (the first is warm-up)")
    args = parser.parse_args()

    import shutil
    import tempfile

    import ray

    from easyrl.config import load_run_plan
    from easyrl.protocol import DataProto
    from easyrl.trainer.main import build_trainer, init_ray
    from easyrl.trainer.ray_trainer import GENERATION_KEYS, GENERATION_NON_TENSOR_KEYS
    from easyrl.workers.rollout.base import GenerationRequest
    from easyrl.workers.rollout.vllm_rollout import call_request_seeds

    save_dir = tempfile.mkdtemp(prefix="easyrl_bench_")
    plan = load_run_plan(recipe_overrides(args, save_dir))
    config = plan.config
    rollout = config.worker.rollout
    init_ray(plan)  # before the bare engine changes this process's environment (the workers inherit it)
    trainer = build_trainer(plan)
    rounds = []
    try:
        match_ray_worker_priority()  # the bare engine runs at the CPU priority of easyrl's workers
        bare = BareVLLM(
            str(config.worker.actor.model.model_path),
            rollout,
            max_model_len=config.data.max_prompt_length + config.data.max_response_length,
        )
        loader = iter(trainer.train_loader)
        for round_index in range(args.rounds):
            batch = next(loader)
            prompts = batch if isinstance(batch, DataProto) else DataProto.from_single_dict(batch)
            gen_input = prompts.select(
                batch_keys=list(GENERATION_KEYS),
                non_tensor_batch_keys=[k for k in GENERATION_NON_TENSOR_KEYS if k in prompts.non_tensor_batch],
            )
            seed = [rollout.seed, 0, round_index]
            group = trainer.workers.actor_rollout
            (worker_cpu_before,) = group.apply_all(_cpu_seconds)
            start = time.perf_counter()
            out = group.generate_sequences(gen_input, GenerationRequest(seed=seed))
            driver_s = time.perf_counter() - start - out.meta_info["metrics"].get("rollout/weight_sync_s", 0.0)
            (worker_cpu_after,) = group.apply_all(_cpu_seconds)
            engine_s = out.meta_info["metrics"]["rollout/gen_seconds"]
            token_ids, log_probs = _samples(out)

            prompt_ids = [list(ids) for ids in gen_input.non_tensor_batch["raw_prompt_ids"]]
            seeds = call_request_seeds(seed, 0, len(prompt_ids))  # one worker: data-parallel rank 0
            bare_cpu_before = _cpu_seconds()
            bare_run = bare.generate(prompt_ids, config.data.max_response_length, seeds=seeds)
            bare_cpu_s = _cpu_seconds() - bare_cpu_before
            worker_cpu_s = worker_cpu_after - worker_cpu_before
            same_tokens = token_ids == bare_run.token_ids
            rounds.append(
                {
                    "round": round_index,
                    "tokens": sum(map(len, token_ids)),
                    "bare_tokens": bare_run.response_tokens,
                    "driver_s": driver_s,
                    "engine_s": engine_s,
                    "bare_s": bare_run.seconds,
                    "engine_vs_bare": bare_run.seconds / engine_s,
                    "driver_vs_bare": bare_run.seconds / driver_s,
                    "worker_cpu_s": worker_cpu_s,
                    "bare_cpu_s": bare_cpu_s,
                    "cpu_vs_bare": bare_cpu_s / worker_cpu_s,
                    "same_tokens": same_tokens,
                    "max_log_prob_diff": _max_log_prob_diff(log_probs, bare_run.log_probs) if same_tokens else None,
                    "load_1m": os.getloadavg()[0],
                }
            )
            print(rounds[-1], flush=True)
    finally:
        trainer.on_shutdown()
        ray.shutdown()
        shutil.rmtree(save_dir, ignore_errors=True)

    measured = rounds[1:] if len(rounds) > 1 else rounds
    tokens = sum(r["tokens"] for r in measured)
    bare_tokens = sum(r["bare_tokens"] for r in measured)
    engine_ratio = statistics.median(r["engine_vs_bare"] for r in measured)
    driver_ratio = statistics.median(r["driver_vs_bare"] for r in measured)
    cpu_ratio = statistics.median(r["cpu_vs_bare"] for r in measured)
    same = all(r["same_tokens"] for r in measured)
    log_prob_diffs = [r["max_log_prob_diff"] for r in measured if r["max_log_prob_diff"] is not None]
    table = [
        {
            "rollout": "easyrl (driver wall)",
            "tokens/s": tokens / sum(r["driver_s"] for r in measured),
            "vs bare (median of rounds)": driver_ratio,
        },
        {
            "rollout": "easyrl (engine call)",
            "tokens/s": tokens / sum(r["engine_s"] for r in measured),
            "vs bare (median of rounds)": engine_ratio,
            "CPU s vs bare (median)": cpu_ratio,
        },
        {"rollout": "bare vLLM", "tokens/s": bare_tokens / sum(r["bare_s"] for r in measured)},
    ]
    print_table(
        table,
        title=f"Rollout throughput, {len(measured)} interleaved round(s) after warm-up: {args.rollout_batch_size} "
        f"prompts x n={args.n}, <= {args.max_response_length} new tokens, {args.dtype} ({describe_machine()})",
    )
    print(
        f"same tokens as the bare engine in every round: {same}"
        + (f"; largest log-prob difference {max(log_prob_diffs):.3g}" if log_prob_diffs else "")
    )
    append_result(
        "rollout_throughput",
        {
            "args": vars(args),
            "easyrl_driver_tokens_per_s": table[0]["tokens/s"],
            "easyrl_engine_tokens_per_s": table[1]["tokens/s"],
            "bare_tokens_per_s": table[2]["tokens/s"],
            "ratio_driver_vs_bare_median": driver_ratio,
            "ratio_engine_vs_bare_median": engine_ratio,
            "ratio_cpu_seconds_vs_bare_median": cpu_ratio,
            "same_tokens": same,
            "rounds": rounds,
        },
    )


if __name__ == "__main__":
    main()

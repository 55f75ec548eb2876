"""Where the seconds of one training step go, for the embedded default recipe run by the real trainer.

    .venv/bin/python -m benchmarks.step_breakdown [--steps 3 --rollout-batch-size 4 --n 4 --max-response-length 32]

Phases come from the trainer's own timers (``timing/<phase>`` in metrics.jsonl) and, for the rollout, from the
worker's metrics returned with each generation:

    generate (engine)     vLLM's generate call inside the worker (``rollout/gen_seconds``)
    weight sync           streaming the updated actor weights into the engine after the actor update
                          (``timing/sync_weights``, called by the trainer)
    generate (dispatch)   the rest of ``timing/gen``: Ray calls, splitting/gathering the batch, padding the output
    reward                scoring the responses (``timing/reward``); with ``worker.reward.overlap`` (the default)
                          scoring runs beside the log-prob passes and the row is what the step waited for it
                          (``timing/reward_wait``: the decoding, plus the wait counted inside ``adv``)
    data                  the rest of ``timing/gen_and_reward``: the next batch from the loader and the driver's
                          bookkeeping (repeat n times, union with the responses)
    old_log_probs, ref_log_probs, values, adv, update_critic, update_actor   the trainer's phases as timed
    idle                  ``timing/step`` minus every top-level phase

The first step is warm-up and is left out of the means (unless it is the only step).
"""

import argparse

import easyrl  # noqa: F401  (process environment: Ray and vLLM settings)

from .common import append_result, describe_machine, print_table
from .recipe import add_recipe_args, mean, measured_steps, run_recipe


# top-level phases of PPOTrainer.train_step, in the order they run
TOP_LEVEL_PHASES = (
    "gen_and_reward",
    "old_log_probs",
    "ref_log_probs",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "sync_weights",
)


def step_phases(row: dict, rollout: dict) -> dict[str, float]:
    """Seconds per phase of one step (``row``: its metrics.jsonl row; ``rollout``: the worker's generate metrics)."""
    timing = {key[len("timing/") :]: value for key, value in row.items() if key.startswith("timing/")}
    engine = rollout.get("rollout/gen_seconds", timing.get("gen", 0.0))
    phases = {
        "generate (engine)": engine,
        "generate (dispatch)": timing.get("gen", 0.0) - engine,
    }
    if "reward_wait" in timing:  # overlapped scoring: the step pays only its wait (part of it inside adv)
        phases["reward (waited)"] = timing["reward_wait"]
        phases["data"] = timing.get("gen_and_reward", 0.0) - timing.get("gen", 0.0)
    else:
        phases["reward"] = timing.get("reward", 0.0)
        phases["data"] = timing.get("gen_and_reward", 0.0) - timing.get("gen", 0.0) - timing.get("reward", 0.0)
    for name in TOP_LEVEL_PHASES[1:]:
        if name in timing:
            phases["weight sync" if name == "sync_weights" else name] = timing[name]
    phases["idle"] = timing["step"] - sum(timing.get(name, 0.0) for name in TOP_LEVEL_PHASES)
    phases["step"] = timing["step"]
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_recipe_args(parser)
    args = parser.parse_args()

    run = run_recipe(args)
    steps = measured_steps(run.rows)
    first = len(run.rows) - len(steps)  # index of the first measured step among the generate calls
    per_step = [step_phases(row, run.recorder.rollout_metrics[first + i]) for i, row in enumerate(steps)]
    names = list(per_step[0])
    means = {name: mean([phases.get(name, 0.0) for phases in per_step]) for name in names}
    step_s = means["step"]
    table = [
        {"phase": name, "seconds": seconds, "share_%": 100.0 * seconds / step_s if name != "step" else 100.0}
        for name, seconds in means.items()
    ]
    print_table(
        table,
        title=f"Step breakdown, mean of {len(per_step)} step(s) after warm-up: {args.rollout_batch_size} prompts x "
        f"n={args.n}, <= {args.max_response_length} new tokens, {args.dtype} ({describe_machine()})",
    )
    sync = [m for m in run.recorder.rollout_metrics if "rollout/weight_sync_s" in m]
    if sync:
        print(
            f"weight sync: {mean([m['rollout/weight_sync_gb'] for m in sync]):.3f} GB per sync at "
            f"{mean([m['rollout/weight_sync_gb_per_s'] for m in sync]):.2f} GB/s"
        )
    lengths = {key: mean([row[key] for row in steps]) for key in ("prompt_length/mean", "response_length/mean")}
    print(
        f"tokens per sample: prompt {lengths['prompt_length/mean']:.1f} (padded to {run.config.data.max_prompt_length}), "
        f"response {lengths['response_length/mean']:.1f} (padded to {args.max_response_length})"
    )
    skipped = mean([row.get("actor/zero_advantage_skipped", 0.0) for row in steps])
    print(f"update passes skipped for {skipped:.0%} of the samples (zero advantage: a group that all scored the same)")
    print(f"setup (Ray, workers, engine, data) {run.setup_s:.1f} s; fit {run.fit_s:.1f} s for {len(run.rows)} steps")
    append_result(
        "step_breakdown",
        {
            "args": vars(args),
            "mean_seconds": means,
            "share": {name: seconds / step_s for name, seconds in means.items()},
            "per_step": per_step,
            "response_tokens_per_step": run.recorder.response_tokens,
            "weight_sync_gb_per_s": mean([m["rollout/weight_sync_gb_per_s"] for m in sync]) if sync else None,
            "setup_s": run.setup_s,
            "mean_lengths": lengths,
            "zero_advantage_skipped": skipped,
        },
    )


if __name__ == "__main__":
    main()

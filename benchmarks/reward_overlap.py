"""Overlapped reward scoring: seconds per step with a reward that sleeps 2 s per batch, scored while the reference
log-prob pass runs (`worker.reward.overlap=true`, the default) or before it (`false`).

    .venv/bin/python -m benchmarks.reward_overlap [--sleep 2 --model tiny --steps 4]

Both runs train the embedded recipe shrunk as the other recipe benchmarks do (4 prompts x n=4, <= 32 new tokens,
fp32, one worker), with the KL loss on so that each step has a reference pass for the scoring to overlap with, and
the recipe's arithmetic reward wrapped to sleep `--sleep` seconds per call (one call per step: a `batch` function).
`--model tiny` (default) is a random tiny model (easyrl.testing.tiny_models), whose passes are short; `--model
recipe` is the recipe's SmolLM2-135M-Instruct. The step can save at most min(sleep, the passes it overlaps with):

    timing/reward       the scoring's wall time (decoding + the reward call)
    timing/reward_wait  what the step waited for it (all of it without overlap)

The first step is warm-up and is left out of the means.
"""

import argparse
import tempfile
from pathlib import Path

import easyrl  # noqa: F401  (process environment: Ray and vLLM settings)

from .common import REPO_ROOT, append_result, describe_machine, print_table
from .recipe import add_recipe_args, mean, measured_steps, run_recipe


SLEEPY_REWARD = '''"""The recipe's arithmetic reward, after a sleep of `sleep_s` seconds per call (a slow verifier)."""
import importlib.util
import time

_spec = importlib.util.spec_from_file_location("arithmetic_reward", {path!r})
_arithmetic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_arithmetic)

REWARD_TYPE = "batch"


def compute_score(reward_inputs, sleep_s=2.0):
    time.sleep(sleep_s)
    return _arithmetic.compute_score(reward_inputs)
'''


def sleepy_reward_file(folder: Path) -> Path:
    path = folder / "sleepy_arithmetic_reward.py"
    path.write_text(SLEEPY_REWARD.format(path=str(REPO_ROOT / "reward_function" / "arithmetic.py")))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_recipe_args(parser, steps=4)
    parser.add_argument("--sleep", type=float, default=2.0, help="seconds the reward sleeps per call")
    parser.add_argument("--model", choices=["tiny", "recipe"], default="tiny", help="random tiny model or SmolLM2")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="easyrl_reward_overlap_"))
    extra = [
        f"worker.reward.reward_function={sleepy_reward_file(work)}:compute_score",
        f"worker.reward.reward_function_kwargs={{sleep_s: {args.sleep}}}",
        "algorithm.use_kl_loss=true",
        "algorithm.disable_kl=false",
    ]
    if args.model == "tiny":
        from easyrl.testing.tiny_models import build_tiny_causal_lm

        extra.append(f"worker.actor.model.model_path={build_tiny_causal_lm(work / 'tiny_model')}")

    rows, per_mode = [], {}
    for overlap in (False, True):
        run = run_recipe(args, extra + [f"worker.reward.overlap={str(overlap).lower()}"])
        steps = measured_steps(run.rows)
        phase = {
            name: mean([row.get(f"timing/{name}", 0.0) for row in steps])
            for name in ("step", "reward", "reward_wait", "ref_log_probs", "gen", "update_actor")
        }
        per_mode["overlap" if overlap else "sync"] = {"mean_seconds": phase, "per_step": steps}
        rows.append(
            {
                "worker.reward.overlap": str(overlap).lower(),
                "steps": len(steps),
                **{f"{k}_s": v for k, v in phase.items()},
            }
        )
    sync, overlapped = (per_mode[mode]["mean_seconds"] for mode in ("sync", "overlap"))
    saved = sync["step"] - overlapped["step"]
    print_table(
        rows,
        title=f"Reward overlap, mean of the steps after warm-up: {args.rollout_batch_size} prompts x n={args.n}, reward "
        f"sleeps {args.sleep:g} s per batch, {args.model} model ({describe_machine()})",
    )
    print(
        f"step: {sync['step']:.2f} s -> {overlapped['step']:.2f} s ({saved:+.2f} s saved, "
        f"{100.0 * saved / sync['step']:.1f}%); the step waited {overlapped['reward_wait']:.2f} s of "
        f"{overlapped['reward']:.2f} s of scoring (without overlap: {sync['reward_wait']:.2f} s)"
    )
    append_result(
        "reward_overlap",
        {
            "args": vars(args),
            "sync": per_mode["sync"],
            "overlap": per_mode["overlap"],
            "step_seconds_saved": saved,
            "speedup": sync["step"] / overlapped["step"],
        },
    )


if __name__ == "__main__":
    main()

"""The `easyrl` command: train, check, merge."""

import argparse
import sys
from typing import Optional


USAGE_KEYS = "[config=FILE.yaml] [section.key=value ...]"


def _check(args: list[str]) -> int:
    from .config import ConfigError, config_to_yaml, load_run_plan

    try:
        plan = load_run_plan(args)
    except ConfigError as err:
        print(f"easyrl check: invalid config: {err}", file=sys.stderr)
        return 2
    print(config_to_yaml(plan.config), end="")
    print("# run plan")
    print("\n".join(f"#   {line}" for line in plan.describe().splitlines()))
    print("# config is valid", file=sys.stderr)
    return 0


def _train(args: list[str]) -> int:
    from .config import ConfigError, load_run_plan

    try:
        plan = load_run_plan(args)
    except ConfigError as err:
        print(f"easyrl train: invalid config: {err}", file=sys.stderr)
        return 2
    from .trainer.main import RunSetupError, run_training

    try:
        run_training(plan)
    except RunSetupError as err:
        print(f"easyrl train: cannot start: {err}", file=sys.stderr)
        return 2
    return 0


def _merge(args: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="easyrl merge", description="Turn a checkpoint's sharded actor state into a Hugging Face folder."
    )
    parser.add_argument(
        "--local_dir", required=True, help="the checkpoint's actor folder, e.g. .../global_step_10/actor"
    )
    parser.add_argument("--output_dir", default=None, help="where to write; defaults to <local_dir>/huggingface")
    ns = parser.parse_args(args)
    from .trainer.merge import merge_checkpoint

    out = merge_checkpoint(ns.local_dir, ns.output_dir)
    print(f"Hugging Face model written to {out}")
    return 0


COMMANDS = {
    "train": (_train, f"train with PPO-family RL: easyrl train {USAGE_KEYS}"),
    "check": (_check, f"validate, then print the resolved config and the run plan: easyrl check {USAGE_KEYS}"),
    "merge": (_merge, "write a Hugging Face folder from a checkpoint: easyrl merge --local_dir CKPT/actor"),
}


def _help() -> str:
    lines = ["usage: easyrl <command> [arguments]", "", "commands:"]
    lines += [f"  {name:<7}{text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Configuration: defaults <- config=FILE.yaml <- key=value overrides (e.g. worker.rollout.n=8)."]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_help())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"easyrl: unknown command `{command}`.\n\n{_help()}", file=sys.stderr)
        return 2
    if command != "merge" and any(a in ("-h", "--help") for a in rest):
        print(COMMANDS[command][1])
        return 0
    return COMMANDS[command][0](rest)


if __name__ == "__main__":
    raise SystemExit(main())

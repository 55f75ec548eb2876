"""The `easyrl` command: train, sft, check, merge, generate, eval."""

import argparse
import sys
from typing import Optional


USAGE_KEYS = "[config=FILE.yaml] [section.key=value ...]"


def _check(args: list[str]) -> int:
    """`easyrl check [sft] config=... key=value ...`: an RL run's config (or, after `sft`, an SFT run's)."""
    from .config import ConfigError, load_run_plan
    from .config.load import with_spellings_given

    if args[:1] == ["sft"]:
        return _check_sft(args[1:])
    try:
        plan = load_run_plan(args)
    except ConfigError as err:
        # an SFT config read as an RL one lacks only its reward function
        missing_reward = str(err).startswith("a run needs") and "`worker.reward.reward_function`" in str(err)
        hint = " (an SFT config? `easyrl check sft config=...`)" if missing_reward else ""
        print(f"easyrl check: invalid config: {with_spellings_given(str(err), args)}{hint}", file=sys.stderr)
        return 2
    from .trainer.preflight import (
        check_model_files,
        error_text,
        resume_point,
        resume_summary,
        start_step,
        tool_schema_lines,
    )

    try:  # what a run reads before Ray beyond the config: tool files, the heads Ulysses splits, its checkpoint
        schemas = check_model_files(plan)
        checkpoint = resume_point(plan.config)
        start = resume_summary(plan, checkpoint)
    except (ValueError, KeyError, OSError) as err:
        print(f"easyrl check: invalid config: {with_spellings_given(error_text(err), args)}", file=sys.stderr)
        return 2
    describe = plan.describe(start_step(checkpoint))
    return _print_valid(plan, "run plan", describe, start, tool_schema_lines(schemas))


def _check_sft(args: list[str]) -> int:
    from .config.load import with_spellings_given
    from .config.sft_plan import load_sft_plan
    from .trainer.preflight import resume_point, resume_summary

    try:
        plan = load_sft_plan(args)
        start = resume_summary(plan, resume_point(plan.config, "SFT"))
    except ValueError as err:  # a ConfigError too
        print(f"easyrl check sft: invalid config: {with_spellings_given(str(err), args)}", file=sys.stderr)
        return 2
    return _print_valid(plan, "SFT plan", plan.describe(), start)


def _print_valid(plan, title: str, lines: str, start: str, after: list[str] = ()) -> int:
    """The resolved config as YAML, then the plan's ``lines`` as comments (``start``: where the run starts, afresh or
    from a checkpoint; ``after``: lines printed last, the tool schemas); "config is valid" on stderr."""
    from .config import config_to_yaml

    print(config_to_yaml(plan.config), end="")
    print(f"# {title}")
    print("\n".join(f"#   {line}" for line in [*lines.splitlines(), start, *after]))
    print("# config is valid", file=sys.stderr)
    return 0


def _run_command(command: str, args: list[str], load_plan, load_runner, run_errors=tuple) -> int:
    """Read the plan (an invalid config: one line, exit 2) before importing the runner (torch, Ray), then run it (a
    setup error, or one of the exceptions ``run_errors()`` returns, which name their key/file/row: one line, exit 2).
    Both are functions so that a refused config costs the seconds of reading it, not those of importing torch."""
    from .config import ConfigError
    from .config.load import with_spellings_given

    try:
        plan = load_plan()
    except ConfigError as err:
        print(f"easyrl {command}: invalid config: {with_spellings_given(str(err), args)}", file=sys.stderr)
        return 2
    from .trainer.main import RunSetupError, error_text

    run, errors = load_runner(), run_errors()
    try:
        run(plan)
    except RunSetupError as err:
        print(f"easyrl {command}: cannot start: {err}", file=sys.stderr)
        return 2
    except errors as err:
        text = error_text(err).rstrip("\n")
        for note in getattr(err, "__notes__", ()):  # where a stopped run goes on from: its own line after a traceback
            if "\n" not in text and not text.endswith((".", "!", "?", ":")):
                text += "."  # the note is a sentence of its own
            text += ("\n" if "\n" in text else " ") + note
        print(f"easyrl {command}: {text}", file=sys.stderr)
        return 2
    return 0


def _train(args: list[str]) -> int:
    def load_plan():
        from .config import load_run_plan

        return load_run_plan(args)

    def load_runner():
        from .trainer.main import run_training

        return run_training

    def run_errors():
        # a reward function that cannot score (it raises on every sample, returns the wrong shape) stops the run, as
        # does an environment that fails on every trajectory
        # so does online filtering that finds too few groups with mixed scores (the data or the filter must change)
        # a vllm judge whose engine died: its message names the engine and how it ended
        # a checkpoint that cannot be written (a full disk): its message names the folder and the space left
        from .trainer.checkpoint import CheckpointSaveError
        from .trainer.ray_trainer import OnlineFilteringError
        from .workers.reward.judge import JudgeEngineError
        from .workers.reward.loader import RewardFunctionError
        from .workers.rollout.env_failures import EnvironmentFailedError

        return (
            RewardFunctionError,
            OnlineFilteringError,
            JudgeEngineError,
            EnvironmentFailedError,
            CheckpointSaveError,
        )

    return _run_command("train", args, load_plan, load_runner, run_errors)


def _generation_plan(args: list[str], command: str):
    """The run plan of `easyrl generate` / `easyrl eval`: a train config as it is, read as a validation-only run (no
    training data needed; generate needs no reward either, eval scores)."""
    from .config.load import read_config
    from .config.plan import make_run_plan
    from .config.validate import check_generation_data

    config = read_config(args)
    config.trainer.val_only = True  # nothing is trained: data.train_files may be absent
    # they write their own files and start no tracker: a training config's W&B / SwanLab without a login must not stop them
    config.trainer.logger = ["console"]
    check_generation_data(config)  # before the plan, whose validation would name trainer.val_only, not the command
    return make_run_plan(config, needs_reward=command == "eval")


def _generate_or_eval(command: str, args: list[str]) -> int:
    def load_runner():
        if command == "generate":
            from .trainer.generate import run_generate

            return run_generate
        from .trainer.evaluate import run_eval

        return run_eval

    # data, model and output-file errors name their key/file/row
    return _run_command(
        command, args, lambda: _generation_plan(args, command), load_runner, lambda: (ValueError, KeyError, OSError)
    )


def _generate(args: list[str]) -> int:
    return _generate_or_eval("generate", args)


def _eval(args: list[str]) -> int:
    return _generate_or_eval("eval", args)


def _sft(args: list[str]) -> int:
    def load_plan():
        from .config.sft_plan import load_sft_plan

        return load_sft_plan(args)

    def load_runner():
        from .trainer.sft_trainer import run_sft

        return run_sft

    def run_errors():
        from .trainer.checkpoint import CheckpointSaveError  # a checkpoint that cannot be written, as in RL

        return (CheckpointSaveError,)

    return _run_command("sft", args, load_plan, load_runner, run_errors)


def _merge(args: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="easyrl merge", description="Turn a checkpoint's sharded actor state into a Hugging Face folder."
    )
    parser.add_argument(
        "--local_dir", required=True, help="the checkpoint's actor folder, e.g. .../global_step_10/actor"
    )
    parser.add_argument("--output_dir", default=None, help="where to write; defaults to <local_dir>/huggingface")
    parser.add_argument(
        "--adapter_only",
        action="store_true",
        help="LoRA checkpoints: write the peft adapter folder (default: the full model with the adapters merged in, "
        "as EasyR1's merger writes)",
    )
    parser.add_argument(
        "--merge_lora",
        action="store_true",
        help="LoRA checkpoints: the full model with the adapters merged in (the default; kept for older commands)",
    )
    parser.add_argument(
        "--base_model",
        default=None,
        help="LoRA checkpoints: the base model folder or hub id (default: the one the adapter config names)",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["bf16", "fp16", "fp32", "bfloat16", "float16", "float32"],  # as the config's dtype keys take them
        help="the dtype of the written weights (default: the one the checkpoint's config says, the model path's)",
    )
    parser.add_argument(
        "--hf_upload_path",
        default=None,
        help="then upload the folder to this Hugging Face Hub repo (user/name), as EasyR1's merger does; a new repo "
        "is created private (EasyR1's: public). Needs a login (`hf auth login` or HF_TOKEN)",
    )
    ns = parser.parse_args(args)
    if ns.adapter_only and ns.merge_lora:
        parser.error("--adapter_only and --merge_lora ask for opposite things: give one.")
    from .trainer.merge import merge_checkpoint, upload_to_hub, validate_hub_repo

    try:
        if ns.hf_upload_path:  # before the merge, which may take long: a malformed repo id is known now
            validate_hub_repo(ns.hf_upload_path)
        out = merge_checkpoint(
            ns.local_dir, ns.output_dir, adapter_only=ns.adapter_only, base_model=ns.base_model, dtype=ns.dtype
        )
    except (FileNotFoundError, FileExistsError, ValueError) as err:  # a folder or flag that does not fit: said
        print(f"easyrl merge: {err}", file=sys.stderr)
        return 2
    print(f"{'peft adapter folder' if ns.adapter_only else 'Hugging Face model'} written to {out}")
    if ns.hf_upload_path:
        try:
            url = upload_to_hub(out, ns.hf_upload_path)
        except Exception as err:  # noqa: BLE001 - network, login, permissions: the folder is kept either way
            print(
                f"easyrl merge: the folder is written ({out}), but uploading it to {ns.hf_upload_path} failed: "
                f"{type(err).__name__}: {err}\nUpload it later with: hf upload {ns.hf_upload_path} {out}",
                file=sys.stderr,
            )
            return 1
        print(f"Uploaded to {url}")
    return 0


COMMANDS = {
    "train": (_train, f"train with PPO-family RL: easyrl train {USAGE_KEYS}"),
    "sft": (_sft, f"supervised fine-tuning, loss on the assistant's tokens: easyrl sft {USAGE_KEYS}"),
    "check": (
        _check,
        f"validate, then print the resolved config and the run plan: easyrl check [sft] {USAGE_KEYS} (sft: an SFT config)",
    ),
    "generate": (_generate, f"n samples per prompt of data.val_files into jsonl: easyrl generate {USAGE_KEYS}"),
    "eval": (_eval, f"mean@k and pass@k per data source of data.val_files: easyrl eval {USAGE_KEYS}"),
    "merge": (_merge, "write a Hugging Face folder from a checkpoint: easyrl merge --local_dir CKPT/actor"),
}


CONFIG_HELP = (
    "Configuration: defaults <- config=FILE.yaml <- key=value overrides (e.g. worker.rollout.n=8). Every key, its "
    "default and meaning: docs/config.md; `easyrl check` prints a config resolved, with its run plan."
)


def _help() -> str:
    lines = ["usage: easyrl <command> [arguments]   (easyrl --version: the installed version)", "", "commands:"]
    width = max(len(name) for name in COMMANDS) + 2
    lines += [f"  {name:<{width}}{text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", CONFIG_HELP]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_help())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version", "version"):
        from . import __version__

        print(f"easyrl {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        import difflib

        near = difflib.get_close_matches(command, COMMANDS, n=1, cutoff=0.6)
        hint = f" Did you mean `easyrl {near[0]}`?" if near else ""
        print(f"easyrl: unknown command `{command}`.{hint}\n\n{_help()}", file=sys.stderr)
        return 2
    if command != "merge" and any(a in ("-h", "--help") for a in rest):
        print(f"{COMMANDS[command][1]}\n\n{CONFIG_HELP}")
        return 0
    return COMMANDS[command][0](rest)


if __name__ == "__main__":
    raise SystemExit(main())

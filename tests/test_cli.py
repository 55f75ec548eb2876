"""The `easyrl` command as a user types it (a real subprocess)."""

import json
import os
import subprocess
from pathlib import Path

import yaml

from tests.fixtures import trainer_runs


ROOT = Path(__file__).resolve().parent.parent


def run_easyrl(*args: str) -> subprocess.CompletedProcess:
    # EasyR1's config logs to wandb: the user here can (offline mode stands for a login)
    return trainer_runs.run_easyrl(*args, env={**os.environ, "WANDB_MODE": "offline"}, timeout=120)


def test_help_lists_subcommands():
    result = run_easyrl("--help")
    assert result.returncode == 0
    for command in ("train", "check", "merge"):
        assert f"  {command} " in result.stdout
    # a command's own help says where its keys are described
    sub = run_easyrl("train", "--help")
    assert sub.returncode == 0 and sub.stdout.startswith("train with PPO-family RL: easyrl train [config=FILE.yaml]")
    assert "Every key, its default and meaning: docs/config.md" in sub.stdout


def test_check_accepts_an_easyr1_config_and_prints_resolved_yaml():
    result = run_easyrl("check", "config=tests/data/easyr1_config.yaml", "worker.rollout.n=8")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["worker"]["rollout"]["n"] == 8
    assert resolved["worker"]["rollout"]["response_length"] == 2048  # derived from data.max_response_length
    assert resolved["worker"]["actor"]["model"]["model_path"] == "Qwen/Qwen2.5-7B-Instruct"


def test_check_rejects_a_typo_with_exit_2_and_a_suggestion():
    result = run_easyrl("check", "config=tests/data/easyr1_config.yaml", "worker.rollout.nn=3")
    assert result.returncode == 2
    assert "worker.rollout.nn" in result.stderr
    assert "Did you mean `worker.rollout.n`?" in result.stderr


def test_check_reads_the_heads_ulysses_splits_and_the_tool_files_as_a_run_does(tmp_path):
    """What check accepts runs: a run refuses both before Ray, so check does too."""
    recipe = "config=examples/smollm2_arithmetic_grpo.yaml"
    result = run_easyrl("check", recipe, "worker.actor.ulysses_size=2", "trainer.n_gpus_per_node=2")
    assert result.returncode == 2
    assert "`worker.actor.ulysses_size` is 2" in result.stderr and "9 attention heads" in result.stderr
    assert run_easyrl("check", recipe, "worker.actor.ulysses_size=3", "trainer.n_gpus_per_node=3").returncode == 0
    tools = tmp_path / "tools.py"
    tools.write_text("def add(a: int, b: int) -> int:\n    return a + b\n\nTOOLS = [add]\n")
    result = run_easyrl(
        "check", "config=examples/smollm2_arithmetic_grpo_tools.yaml", f"worker.rollout.multi_turn.tools={tools}"
    )
    assert result.returncode == 2 and "add" in result.stderr and "docstring" in result.stderr, result.stderr
    # a valid tools file: check prints the schemas the prompts advertise, one JSON line a tool (an SFT tools column
    # is written from them)
    tools.write_text(
        'def add(a: int, b: int) -> int:\n    """Add two numbers.\n\n    Args:\n        a: first\n        b: second\n'
        '    """\n    return a + b\n\nTOOLS = [add]\n'
    )
    result = run_easyrl(
        "check", "config=examples/smollm2_arithmetic_grpo_tools.yaml", f"worker.rollout.multi_turn.tools={tools}"
    )
    assert result.returncode == 0, result.stderr
    comments = result.stdout.split("# run plan\n")[1].splitlines()
    heading = comments.index(
        "#   the tools, as the chat template's `tools=` gets them (an SFT `tools` column teaching these calls should "
        "hold the same):"
    )
    assert comments[heading - 1] == "#   starts afresh" and len(comments) == heading + 2
    schema = json.loads(comments[heading + 1].removeprefix("#     "))
    assert schema["function"]["name"] == "add" and schema["function"]["parameters"]["required"] == ["a", "b"]
    assert schema["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "first"}


def test_unknown_subcommand_exits_2():
    result = run_easyrl("fly")
    assert result.returncode == 2
    assert "unknown command `fly`" in result.stderr


def test_a_misspelt_command_is_named_with_the_one_meant_and_the_version_is_printed(capsys):
    import easyrl
    from easyrl.cli import main

    assert main(["trian", "config=x.yaml"]) == 2
    assert "unknown command `trian`. Did you mean `easyrl train`?" in capsys.readouterr().err
    assert main(["fly"]) == 2
    assert "Did you mean" not in capsys.readouterr().err
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"easyrl {easyrl.__version__}\n"


def test_train_with_no_arguments_names_what_a_run_needs_and_the_default_recipe():
    result = run_easyrl("train")
    assert result.returncode == 2
    for key in ("worker.actor.model.model_path", "data.train_files", "worker.reward.reward_function"):
        assert f"`{key}`" in result.stderr
    assert "easyrl train config=examples/smollm2_arithmetic_grpo.yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_refused_config_is_answered_without_importing_torch():
    """A typo costs the seconds of reading the config: each command refuses it before torch, Ray or vLLM load (the
    train command imported the trainer first, ~20 s on a loaded 2-core machine for a one-line answer)."""
    import sys

    script = (
        "import sys, contextlib, io\n"
        "from easyrl.cli import main\n"
        "for argv in (['train'], ['train', 'worker.rollout.nn=2'], ['sft', 'sft.max_lenght=1'],\n"
        "             ['generate', 'data.val_files=x.jsonl', 'trainer.nope=1'], ['eval', 'trainer.nope=1']):\n"
        "    with contextlib.redirect_stderr(io.StringIO()) as err:\n"
        "        code = main(argv)\n"
        "    assert code == 2 and 'invalid config' in err.getvalue(), (argv, err.getvalue())\n"
        "heavy = sorted(name for name in ('torch', 'ray', 'vllm', 'transformers') if name in sys.modules)\n"
        "print('imported:', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported: []"


def test_check_sft_checks_an_sft_config_and_the_rl_check_points_to_it():
    config = "config=examples/smollm2_arithmetic_sft.yaml"
    result = run_easyrl("check", "sft", config, "sft.max_length=300")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["sft"]["max_length"] == 300
    assert "# SFT plan" in result.stdout and "token-mean cross-entropy on the assistant's tokens" in result.stdout
    assert "#   training steps: 40 (trainer.max_steps)\n" in result.stdout  # the recipe's max_steps: 40
    refused = run_easyrl("check", "sft", config, "sft.max_lenght=300")
    assert refused.returncode == 2 and refused.stderr.startswith("easyrl check sft: invalid config:")
    assert "Did you mean `sft.max_length`?" in refused.stderr
    # the RL check of an SFT config misses the reward function, and says where an SFT config is checked
    as_rl = run_easyrl("check", config)
    assert as_rl.returncode == 2
    assert "`worker.reward.reward_function`" in as_rl.stderr
    assert "(an SFT config? `easyrl check sft config=...`)" in as_rl.stderr
    # an RL config's own reward mistakes are not taken for an SFT config
    typo = run_easyrl(
        "check", "config=examples/smollm2_arithmetic_grpo.yaml", "worker.reward.reward_function_kwargs.foo=1"
    )
    assert typo.returncode == 2 and "takes no such argument" in typo.stderr and "SFT" not in typo.stderr


def test_check_refuses_the_data_and_hub_models_a_run_would_refuse_before_ray(tmp_path):
    demo = "config=examples/smollm2_arithmetic_grpo.yaml"
    for value, refusal in [
        ("builtin://nosuch@train", "Unknown built-in dataset 'builtin://nosuch@train'; choose one of: arithmetic,"),
        ("builtin://arithmetic_small@dev", "builtin://arithmetic_small has the split(s) train, test; give one"),
    ]:
        result = run_easyrl("check", demo, f"data.train_files={value}")
        assert result.returncode == 2 and "invalid config: `data.train_files`: " in result.stderr, result.stderr
        assert refusal in result.stderr
    packed = tmp_path / "train.jsonl.gz"
    packed.write_bytes(b"\x1f\x8b")
    result = run_easyrl("check", demo, f"data.train_files={packed}")
    assert result.returncode == 2 and "cannot read `train.jsonl.gz`" in result.stderr
    assert "Decompress it first (e.g. `gunzip train.jsonl.gz` for a .gz file)" in result.stderr
    # a slice of a built-in split is what it is for a data file: the split's first rows
    sliced = run_easyrl("check", demo, "data.val_files=builtin://arithmetic_small@test[:16]")
    assert sliced.returncode == 0, sliced.stderr


def test_an_error_that_stops_a_run_and_its_resume_note_read_as_two_sentences(capsys):
    """A run error printed on one line (exit 2) ends its sentence before the note that says where to resume."""
    from easyrl.cli import _run_command

    def run(plan):
        error = RuntimeError("the judge engine died while judging a batch: killed by a signal (a segfault)")
        error.add_note("The last complete checkpoint is ckpt/global_step_1; rerun the same command to resume from it.")
        raise error

    assert _run_command("train", [], lambda: None, lambda: run, lambda: (RuntimeError,)) == 2
    assert capsys.readouterr().err == (
        "easyrl train: the judge engine died while judging a batch: killed by a signal (a segfault). The last "
        "complete checkpoint is ckpt/global_step_1; rerun the same command to resume from it.\n"
    )


def test_an_error_about_a_renamed_key_names_the_older_spelling_the_config_gave(tmp_path, capsys):
    from easyrl.cli import main

    config = yaml.safe_load((ROOT / "examples" / "smollm2_arithmetic_grpo.yaml").read_text())
    config["worker"]["actor"]["ulysses_sequence_parallel_size"] = 3  # 3 does not divide the 1 worker
    file = tmp_path / "old.yaml"
    file.write_text(yaml.safe_dump(config))
    assert main(["train", f"config={file}"]) == 2
    err = capsys.readouterr().err
    assert "`worker.actor.ulysses_size` (3) must divide" in err
    assert "`worker.actor.ulysses_size` is given in the config as `worker.actor.ulysses_sequence_parallel_size`" in err
    example = f"config={ROOT / 'examples' / 'smollm2_arithmetic_grpo.yaml'}"
    assert main(["check", example, "worker.ref.ulysses_sequence_parallel_size=3"]) == 2
    assert "given in the config as `worker.ref.ulysses_sequence_parallel_size`" in capsys.readouterr().err
    assert main(["check", example, "worker.actor.ulysses_size=3"]) == 2  # the key as easyrl spells it: no note
    assert "older name" not in capsys.readouterr().err

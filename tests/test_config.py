"""Config loading, overrides and validation: every error names the key and the fix."""

import json
import os
import re
from pathlib import Path

import pytest

from easyrl.config import ConfigError, PPOConfig, load_config


ROOT = Path(__file__).resolve().parent.parent
EASYR1_CONFIG = ROOT / "tests" / "data" / "easyr1_config.yaml"


def test_defaults_need_no_file():
    config = load_config([], validate=False)
    assert isinstance(config, PPOConfig)
    assert config.worker.rollout.n == 1
    assert config.algorithm.adv_estimator == "grpo"


def test_yaml_file_then_overrides_take_precedence(tmp_path, valid_args):
    file = tmp_path / "c.yaml"
    file.write_text("worker:\n  rollout:\n    n: 4\n    temperature: 0.7\ntrainer:\n  total_epochs: 3\n")
    config = load_config([f"config={file}", *valid_args, "trainer.total_epochs=5", "trainer.logger=[console,file]"])
    assert config.worker.rollout.temperature == 0.7
    assert config.trainer.total_epochs == 5
    assert config.trainer.logger == ["console", "file"]


def test_scientific_notation_without_dot_is_a_number(valid_args):
    config = load_config([*valid_args, "worker.actor.optim.lr=1e-5"])
    assert config.worker.actor.optim.lr == pytest.approx(1e-5)


def test_derived_values_are_filled(valid_args):
    config = load_config([*valid_args, "data.max_prompt_length=100", "data.max_response_length=50"])
    rollout = config.worker.rollout
    assert (rollout.prompt_length, rollout.response_length, rollout.max_model_len) == (100, 50, 150)
    # 4 prompts x 4 samples over 2 workers
    assert config.worker.actor.global_batch_size_per_device == 8
    assert config.worker.actor.model.tokenizer_path == config.worker.actor.model.model_path
    assert config.worker.critic.model.model_path == config.worker.actor.model.model_path
    assert config.worker.ref.micro_batch_size_per_device_for_experience == 16
    assert config.trainer.save_checkpoint_path.endswith("checkpoints/easy_r1/demo")


def test_easyr1_config_loads_unchanged(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # its logger is wandb: a user who can log (a login, or offline)
    config = load_config([f"config={EASYR1_CONFIG}"])
    assert config.worker.actor.loss_avg_mode == "token-mean"  # EasyR1 spelling `token` is an alias
    assert config.worker.rollout.val_override_config == {"temperature": 0.6, "top_p": 0.95, "n": 1}
    # ./examples/reward_function/math.py of EasyR1 maps to the module easyrl ships
    assert config.worker.reward.reward_function == str(ROOT / "reward_function" / "math.py") + ":compute_score"


def test_legacy_easyr1_keys_are_renamed(valid_args):
    config = load_config([*valid_args, "worker.actor.ulysses_sequence_parallel_size=1", "trainer.total_episodes=2"])
    assert config.trainer.total_epochs == 2


def test_unknown_key_suggests_the_closest(valid_args):
    with pytest.raises(ConfigError, match=r"`worker\.rollout\.nn`.*Did you mean `worker\.rollout\.n`\?"):
        load_config([*valid_args, "worker.rollout.nn=3"])


def test_a_key_given_twice_in_a_config_file_is_refused_with_both_lines(tmp_path):
    file = tmp_path / "c.yaml"
    # a second `trainer:` block pasted lower down: YAML would keep it alone and drop total_epochs silently
    file.write_text("trainer:\n  total_epochs: 3\ndata:\n  seed: 2\ntrainer:\n  save_freq: 5\n")
    with pytest.raises(ConfigError, match=r"c\.yaml`: `trainer` is given twice.*lines 1 and 5.*drop every key"):
        load_config([f"config={file}"])
    file.write_text("data:\n  seed: 1\n  max_prompt_length: 64\n  seed: 2\n")
    with pytest.raises(ConfigError, match=r"`seed` is given twice.*lines 2 and 4.*drop the first value"):
        load_config([f"config={file}"])
    # a YAML merge key may be overridden by the section's own key: that is what merging means
    file.write_text("base: &base\n  seed: 1\ndata:\n  <<: *base\n  seed: 7\n")
    # it is read; then the anchor's own section is no easyrl key
    with pytest.raises(ConfigError, match=r"Unknown config key `base\.seed`"):
        load_config([f"config={file}"])


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("trainer:\n  totl_epochs: 3\n")
    with pytest.raises(ConfigError, match=r"`trainer\.totl_epochs`.*c\.yaml.*`trainer\.total_epochs`"):
        load_config([f"config={file}"])


def test_wrong_type_names_key_and_type(valid_args):
    with pytest.raises(ConfigError, match=r"`worker\.rollout\.n`.*abc.*Expected int"):
        load_config([*valid_args, "worker.rollout.n=abc"])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.adv_estimator=grpoo", "algorithm.adv_estimator"),
        ("worker.actor.loss_type=ppo2", "worker.actor.loss_type"),
        ("worker.actor.loss_avg_mode=mean", "worker.actor.loss_avg_mode"),
        ("algorithm.kl_penalty=klx", "algorithm.kl_penalty"),
        ("trainer.logger=[console,wandbb]", "trainer.logger"),
        ("worker.rollout.name=sglang", "worker.rollout.name"),
        ("worker.actor.fsdp.mp_param_dtype=bf17", "worker.actor.fsdp.mp_param_dtype"),
    ],
)
def test_invalid_choice_names_the_key(valid_args, override, key):
    with pytest.raises(ConfigError, match=rf"`{key.replace('.', chr(92) + '.')}`.*not one of"):
        load_config([*valid_args, override])


def test_the_loss_avg_mode_error_offers_the_short_names_the_docs_use(valid_args):
    with pytest.raises(
        ConfigError, match="not one of: token, seq, token-mean, seq-mean-token-mean, seq-mean-token-sum"
    ):
        load_config([*valid_args, "worker.actor.loss_avg_mode=mean"])


def test_rollout_batch_must_be_multiple_of_global_batch(valid_args):
    with pytest.raises(
        ConfigError, match=r"`data\.rollout_batch_size` \(6\).*`worker\.actor\.global_batch_size` \(4\)"
    ):
        load_config([*valid_args, "data.rollout_batch_size=6"])


def test_a_mapping_without_spaces_after_its_colons_is_refused_with_the_spelling_that_works(valid_args):
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, "worker.rollout.val_override_config={temperature:1.0,n:2}"])
    assert str(error.value) == (
        "`worker.rollout.val_override_config={temperature:1.0,n:2}`: `temperature:1.0` holds a colon: in YAML a "
        "mapping needs a space after it ({temperature: 1.0}, not {temperature:1.0}); or set one key at a time "
        "(worker.rollout.val_override_config.temperature=1.0)."
    )
    config = load_config([*valid_args, "worker.rollout.val_override_config={temperature: 1.0, n: 2}"])
    assert config.worker.rollout.val_override_config == {"temperature": 1.0, "n": 2}


def test_global_batch_must_split_over_workers(valid_args):
    with pytest.raises(ConfigError, match=r"cannot be split evenly over 3 workers"):
        load_config([*valid_args, "trainer.n_gpus_per_node=3", "worker.actor.global_batch_size=2"])
    two = [*valid_args, "trainer.n_gpus_per_node=2", "worker.reward.num_cpus=0", "worker.rollout.n=3"]
    with pytest.raises(ConfigError, match=r"= 3 samples .* over 2 workers .*Choose a global_batch_size among 2, 4\.$"):
        load_config([*two, "data.rollout_batch_size=4", "worker.actor.global_batch_size=1"])
    # no global_batch_size can do: the way out is another n or rollout_batch_size
    odd = [*two, "data.rollout_batch_size=3", "worker.actor.global_batch_size=3"]
    with pytest.raises(ConfigError, match=r"No divisor of data.rollout_batch_size \(3\) does with worker.rollout.n=3"):
        load_config(odd)
    # Ulysses' two workers share one data-parallel group's 9 samples: nothing to split
    config = load_config([*odd, "worker.actor.ulysses_size=2", "worker.actor.padding_free=true"])
    assert config.worker.actor.global_batch_size_per_device == 9


def test_per_device_batch_must_hold_whole_fixed_micro_batches_but_any_with_dynamic_batching(valid_args):
    fixed = [*valid_args, "worker.actor.dynamic_batching=false"]
    with pytest.raises(ConfigError, match=r"micro_batch_size_per_device_for_update` \(3\), as fixed micro-batches"):
        load_config([*fixed, "worker.actor.micro_batch_size_per_device_for_update=3"])
    # a token budget of 3 x the padded length cuts 4 samples per device into as many micro-batches as it takes
    config = load_config([*valid_args, "worker.actor.micro_batch_size_per_device_for_update=3"])
    assert config.worker.actor.dynamic_batching and config.worker.actor.global_batch_size_per_device % 3 != 0


def test_the_critics_batch_refusals_give_the_numbers_and_the_values_that_work(valid_args):
    """The critic's message gave no numbers at all, and neither said which sizes would do."""
    gae = [*valid_args, "algorithm.adv_estimator=gae", "worker.rollout.n=4", "data.rollout_batch_size=8"]
    with pytest.raises(ConfigError) as error:
        load_config(gae)  # the critic's own global_batch_size, 256 by default
    assert "`worker.critic.global_batch_size` (256) (the critic has its own, 256 by default as in EasyR1)" in str(
        error.value
    )
    assert str(error.value).endswith("Make global_batch_size a divisor of it: 1, 2, 4, 8.")
    with pytest.raises(ConfigError) as error:
        load_config(
            [
                *gae,
                "worker.critic.global_batch_size=2",
                "worker.critic.micro_batch_size_per_device_for_update=3",
                "worker.critic.dynamic_batching=false",
            ]
        )
    assert str(error.value) == (  # valid_args: 2 workers
        "Each worker gets 4 samples per optimizer step (`worker.critic.global_batch_size` x `worker.rollout.n` = 8, "
        "over 2 workers), which is not a multiple of `worker.critic.micro_batch_size_per_device_for_update` (3), as "
        "fixed micro-batches (`worker.critic.dynamic_batching=false`) need. Use one that divides 4: 1, 2, 4, or set "
        "worker.critic.dynamic_batching=true."
    )


def test_tensor_parallel_must_divide_world(valid_args):
    with pytest.raises(ConfigError, match=r"`worker\.rollout\.tensor_parallel_size` \(4\) must divide"):
        load_config([*valid_args, "worker.rollout.tensor_parallel_size=4"])


def test_grpo_needs_more_than_one_sample(valid_args):
    with pytest.raises(ConfigError, match=r"needs `worker\.rollout\.n` > 1"):
        load_config([*valid_args, "worker.rollout.n=1", "trainer.n_gpus_per_node=1"])


def test_missing_reward_file(valid_args, tmp_path):
    with pytest.raises(
        ConfigError, match=r"`worker\.reward\.reward_function`: reward file .*nope\.py` does not exist"
    ):
        load_config([*valid_args, f"worker.reward.reward_function={tmp_path}/nope.py:compute_score"])


def test_missing_reward_function_lists_the_ones_found(valid_args):
    reward_file = next(arg for arg in valid_args if arg.startswith("worker.reward.")).split("=", 1)[1].split(":")[0]
    with pytest.raises(ConfigError, match=r"defines no function `score_it`\. Functions found: compute_score"):
        load_config([*valid_args, f"worker.reward.reward_function={reward_file}:score_it"])


def test_combined_reward_functions_and_their_weights_are_checked(valid_args, tmp_path):
    reward_file = tmp_path / "two.py"
    reward_file.write_text("def a(completions, **kw):\n    return []\n\ndef b(completions, **kw):\n    return []\n")
    spec = f"worker.reward.reward_function={reward_file}:a,b"
    config = load_config([*valid_args, spec, "worker.reward.reward_weights=[1.0,0.25]"])
    assert config.worker.reward.reward_weights == [1.0, 0.25]
    with pytest.raises(ConfigError, match=r"`worker\.reward\.reward_weights` has 1 weight\(s\) for 2 .*\(a, b\)"):
        load_config([*valid_args, spec, "worker.reward.reward_weights=[1.0]"])
    with pytest.raises(ConfigError, match=r"`worker\.reward\.reward_weights` is \[1\.0, 'x'\]; give a list"):
        load_config([*valid_args, spec, "worker.reward.reward_weights=[1.0,x]"])
    with pytest.raises(ConfigError, match=r"defines no function `c`\. Functions found: a, b"):
        load_config([*valid_args, f"worker.reward.reward_function={reward_file}:a,c"])


def test_missing_format_prompt_file(valid_args, tmp_path):
    with pytest.raises(ConfigError, match=r"`data\.format_prompt`: prompt template file .*missing\.jinja"):
        load_config([*valid_args, f"data.format_prompt={tmp_path}/missing.jinja"])


def test_missing_local_model_path(valid_args, tmp_path):
    with pytest.raises(ConfigError, match=r"`worker\.actor\.model\.model_path`: local model path .* does not exist"):
        load_config([*valid_args, f"worker.actor.model.model_path={tmp_path}/no_model"])
    # the folder an SFT run writes at its end (the cold-start recipe's model before its SFT ran) says so
    with pytest.raises(
        ConfigError, match=r"does not exist\. A run's huggingface/ folder is written when `easyrl sft`"
    ):
        load_config([*valid_args, f"worker.actor.model.model_path={tmp_path}/run/huggingface"])


@pytest.mark.parametrize(
    "weights", [[], ["model.safetensors"], ["model.safetensors.index.json"], ["pytorch_model.bin"]]
)
def test_a_peft_adapter_folder_as_model_path_is_refused_naming_the_key(valid_args, tmp_path, weights):
    """transformers and vLLM cannot load an adapter folder as a model: refused before Ray, unless model weights sit
    beside the adapters (then it is a model); as tokenizer_path it is fine (it holds the tokenizer)."""
    folder = tmp_path / "adapter"
    folder.mkdir()
    for name in ["adapter_config.json", "adapter_model.safetensors", "config.json", "tokenizer.json", *weights]:
        (folder / name).write_text("{}")
    args = [*valid_args, f"worker.actor.model.model_path={folder}"]
    if weights:
        assert load_config(args).worker.actor.model.model_path == str(folder)
    else:
        with pytest.raises(ConfigError, match=r"`worker\.actor\.model\.model_path`: .* is a peft adapter folder"):
            load_config(args)
    # as `easyrl merge --adapter_only` writes it: no config.json either, still named as an adapter folder
    bare = tmp_path / "adapter_only"
    bare.mkdir()
    for name in ["adapter_config.json", "adapter_model.safetensors"]:
        (bare / name).write_text("{}")
    with pytest.raises(ConfigError, match=r"is a peft adapter folder .* `easyrl merge` without --adapter_only"):
        load_config([*valid_args, f"worker.actor.model.model_path={bare}"])
    no_adapter = tmp_path / "plain_model"
    no_adapter.mkdir()
    (no_adapter / "config.json").write_text("{}")
    config = load_config(
        [*valid_args, f"worker.actor.model.model_path={no_adapter}", f"worker.actor.model.tokenizer_path={folder}"]
    )
    assert config.worker.actor.model.tokenizer_path == str(folder)


def _checkpoint_role(root, step: int, lora: bool = False):
    """The files of an easyrl checkpoint's actor role folder that the check looks at: DCP metadata and shards, and
    ``huggingface/`` with the config (and for LoRA the adapters)."""
    role = root / f"global_step_{step}" / "actor"
    (role / "huggingface").mkdir(parents=True)
    for name in [".metadata", "__0_0.distcp", "huggingface/config.json", "huggingface/tokenizer.json"]:
        (role / name).write_text("{}")
    if lora:  # a LoRA checkpoint's huggingface/ is also the peft adapter folder
        (role / "huggingface" / "adapter_config.json").write_text("{}")
        (role / "huggingface" / "adapter_model.safetensors").write_text("{}")
    return role


@pytest.mark.parametrize("lora", [False, True])
def test_a_checkpoint_given_as_model_path_is_refused_with_the_merge_command(valid_args, tmp_path, lora):
    """A checkpoint, its role folder or its config folder holds sharded training state, no Hugging Face weights:
    the workers would crash loading it. The error names the merge command; a merged folder is a model."""
    run = tmp_path / "run"
    role = _checkpoint_role(run, 10, lora)
    _checkpoint_role(run, 2, lora)
    for given in (role, role.parent, role / "huggingface"):
        with pytest.raises(ConfigError) as error:
            load_config([*valid_args, f"worker.actor.model.model_path={given}"])
        kind = "a LoRA training checkpoint" if lora else "a training checkpoint"
        assert str(error.value).startswith(f"`worker.actor.model.model_path`: `{given}` is part of {kind}")
        if lora:  # the adapters are named as what the folder holds, and where merge moves them
            assert f"`{role / 'huggingface'}` holds the LoRA adapters" in str(error.value)
            assert str(error.value).endswith(f"lora_adapter/); then give `{role / 'huggingface'}`.")
        else:
            assert str(error.value).endswith(f"`easyrl merge --local_dir {role}` and give `{role / 'huggingface'}`.")
    # the run folder (no config.json): the newest checkpoint by step, not by name
    with pytest.raises(ConfigError, match=rf"holds no config\.json.*`easyrl merge --local_dir {role}`\.$"):
        load_config([*valid_args, f"worker.actor.model.model_path={run}"])
    if not lora:  # after `easyrl merge`, huggingface/ holds the weights: a model
        (role / "huggingface" / "model.safetensors").write_text("{}")
        config = load_config([*valid_args, f"worker.actor.model.model_path={role / 'huggingface'}"])
        assert config.worker.actor.model.model_path == str(role / "huggingface")
    # as tokenizer_path, the checkpoint's config folder is fine: it holds the tokenizer
    model = tmp_path / "plain_model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    args = [f"worker.actor.model.model_path={model}", f"worker.actor.model.tokenizer_path={role / 'huggingface'}"]
    assert load_config([*valid_args, *args]).worker.actor.model.tokenizer_path == str(role / "huggingface")


def test_a_folder_without_config_json_is_refused_as_model_path(valid_args, tmp_path):
    (tmp_path / "weights.safetensors").write_text("{}")
    with pytest.raises(
        ConfigError, match=r"`worker\.actor\.model\.model_path`: .* holds no config\.json, so it is not"
    ):
        load_config([*valid_args, f"worker.actor.model.model_path={tmp_path}"])


def test_hub_model_id_is_accepted_without_download(valid_args, monkeypatch):
    # check reads no network; only a declared offline mode refuses a hub id (tests/test_config_ranges.py)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    config = load_config([*valid_args, "worker.actor.model.model_path=Qwen/Qwen2.5-0.5B-Instruct"])
    assert config.worker.actor.model.model_path == "Qwen/Qwen2.5-0.5B-Instruct"


def test_unknown_builtin_model(valid_args):
    with pytest.raises(ConfigError, match=r"unknown built-in model `builtin://GPT-5`"):
        load_config([*valid_args, "worker.actor.model.model_path=builtin://GPT-5"])


def test_a_nullable_key_of_the_wrong_type_names_the_type_a_user_reads(valid_args):
    with pytest.raises(ConfigError, match=r"`trainer\.max_steps`.*2\.5.*Expected int or null\.$"):
        load_config([*valid_args, "trainer.max_steps=2.5"])


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("${oc.env:EASYRL_TEST_UNSET_VARIABLE}", "Environment variable 'EASYRL_TEST_UNSET_VARIABLE' not found"),
        ("${data.sed}", "Interpolation key 'data.sed' not found"),
    ],
)
def test_an_interpolation_that_does_not_resolve_is_a_config_error_naming_the_key(valid_args, value, says, monkeypatch):
    monkeypatch.delenv("EASYRL_TEST_UNSET_VARIABLE", raising=False)
    with pytest.raises(ConfigError, match=rf"^Bad value for `worker\.rollout\.n`: .*{re.escape(says)}"):
        load_config([*valid_args, f"worker.rollout.n={value}"])
    monkeypatch.setenv("EASYRL_TEST_UNSET_VARIABLE", "3")
    assert load_config([*valid_args, "worker.rollout.n=${oc.env:EASYRL_TEST_UNSET_VARIABLE}"]).worker.rollout.n == 3


def test_a_second_config_file_is_refused_naming_both(valid_args, tmp_path):
    first, second = tmp_path / "base.yaml", tmp_path / "mine.yaml"
    first.write_text("worker:\n  rollout:\n    n: 4\n")
    second.write_text("data:\n  max_prompt_length: 64\n")
    with pytest.raises(ConfigError, match=rf"config= is given twice \({first} and {second}\)"):
        load_config([*valid_args, f"config={first}", f"config={second}"])


def test_an_empty_checkpoint_path_is_unset_not_the_working_directory(valid_args):
    config = load_config([*valid_args, "trainer.save_checkpoint_path="])
    assert config.trainer.save_checkpoint_path == os.path.abspath(
        os.path.join("checkpoints", config.trainer.project_name, config.trainer.experiment_name)
    )


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match=r"`worker\.rollout\.n` is not of the form key=value"):
        load_config(["worker.rollout.n"])


def test_a_bare_yaml_path_is_told_to_be_given_as_config():
    with pytest.raises(ConfigError, match=r"`run\.yaml` is not of the form key=value.*given as config=run\.yaml"):
        load_config(["run.yaml"])
    for given in (["--config", "run.yaml"], ["--config=run.yaml"]):  # argparse's spelling
        with pytest.raises(ConfigError, match=r"a config file is given as config=FILE, without dashes"):
            load_config(given)


def test_missing_config_file():
    with pytest.raises(ConfigError, match=r"Config file `nope\.yaml`.*does not exist"):
        load_config(["config=nope.yaml"])


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("actor.optim.lr", "worker.actor.optim.lr"),  # not worker.actor.model.lora.lr: more of the path matches
        ("worker.actor.lr", "worker.actor.optim.lr"),  # not worker.actor.model: the last part decides first
        ("critic.optim.lr", "worker.critic.optim.lr"),
        ("worker.actor.optim.beta", "worker.actor.optim.betas"),  # not TRL's beta (algorithm.kl_coef): the path
        ("rollout.n", "worker.rollout.n"),
        ("actor_rollout_ref.rollout.n", "worker.rollout.n"),
        ("actor_rollout_ref.actor.optim.lr", "worker.actor.optim.lr"),  # verl's section read as worker
        ("worker.rollout.temprature", "worker.rollout.temperature"),
        ("worker.ulysses_size", "worker.actor.ulysses_size"),
    ],
)
def test_unknown_key_suggestion_ranks_the_whole_dotted_path(valid_args, given, meant):
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, f"{given}=1"])
    assert str(error.value) == f"Unknown config key `{given}` (from the command line). Did you mean `{meant}`?"


@pytest.mark.parametrize(
    ("given", "meant", "note"),
    [
        ("worker.actor.optim.learning_rate", "worker.actor.optim.lr", "TRL's learning_rate"),
        (
            "data.train_batch_size",
            "data.rollout_batch_size",
            "verl's data.train_batch_size: prompts per training step",
        ),
        ("trainer.total_training_steps", "trainer.max_steps", "verl's trainer.total_training_steps"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", "worker.actor.global_batch_size", "prompts per optimizer"),
        ("critic.ppo_mini_batch_size", "worker.critic.global_batch_size", "verl's ppo_mini_batch_size"),
        (
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            "worker.actor.micro_batch_size_per_device_for_update",
            "verl's ppo_micro_batch_size_per_gpu",
        ),
        (
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
            "worker.ref.micro_batch_size_per_device_for_experience",
            "verl's log_prob_micro_batch_size_per_gpu",
        ),
        ("num_generations", "worker.rollout.n", "TRL's num_generations"),
        ("beta", "algorithm.kl_coef", "TRL's beta"),
        (
            "actor_rollout_ref.rollout.multi_turn.tool_config_path",
            "worker.rollout.multi_turn.tools",
            "verl's tool YAML",
        ),
        ("worker.rollout.multi_turn.enable", "worker.rollout.multi_turn.tools", "verl's multi_turn.enable"),
        (
            "algorithm.use_kl_in_reward",
            "algorithm.use_kl_loss",
            "a reward penalty when algorithm.disable_kl=false and algorithm.use_kl_loss=false",
        ),
        ("actor_rollout_ref.actor.use_dynamic_bsz", "worker.actor.dynamic_batching", "verl's use_dynamic_bsz"),
        ("actor_rollout_ref.actor.tis_imp_ratio_cap", "worker.actor.tis_cap", "verl's tis_imp_ratio_cap"),
        ("algorithm.rollout_is_threshold", "worker.actor.tis_cap", "verl's rollout_is_threshold"),
        ("data.drop_last", "data.rollout_batch_size", "training drops the last partial batch of each epoch"),
        (
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
            "worker.actor.micro_batch_size_per_device_for_update",
            "micro_batch_size_per_device_for_update x (data.max_prompt_length + data.max_response_length) tokens",
        ),
        (
            "critic.ppo_max_token_len_per_gpu",
            "worker.critic.micro_batch_size_per_device_for_update",
            "easyrl has no token-budget key",
        ),
        (
            "actor_rollout_ref.actor.clip_ratio",
            "worker.actor.clip_ratio_low",
            "give clip_ratio_low and clip_ratio_high",
        ),
    ],
)
def test_verl_and_trl_names_are_refused_naming_the_easyrl_key(valid_args, given, meant, note):
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, f"{given}=4"])
    message = str(error.value)
    assert message.startswith(f"Unknown config key `{given}` (from the command line). Did you mean `{meant}`? (")
    assert note in message


@pytest.mark.parametrize("given", ["worker.actor.kl_loss_type", "actor_rollout_ref.actor.kl_loss_type"])
def test_a_verl_name_wins_over_a_near_spelling_in_the_section_written(valid_args, given):
    """verl's kl_loss_type is the KL estimator: worker.actor.loss_type, the policy loss, is spelt nearer but would
    refuse low_var_kl next."""
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, f"{given}=low_var_kl"])
    assert str(error.value) == (
        f"Unknown config key `{given}` (from the command line). Did you mean `algorithm.kl_penalty`? (verl's "
        "kl_loss_type: the KL estimator (kl, abs, mse, low_var_kl))"
    )


@pytest.mark.parametrize(
    ("derived", "meant"),
    [
        ("worker.actor.use_kl_loss", "`algorithm.use_kl_loss` and cannot be set; remove it and set that instead"),
        ("worker.actor.kl_coef", "`algorithm.kl_coef` and cannot be set"),
        ("worker.ref.dynamic_batching", "`worker.actor.dynamic_batching` and cannot be set"),
        (
            "worker.critic.global_batch_size_per_device",
            "`worker.critic.global_batch_size` and `worker.rollout.n` and cannot be set; remove it and set those",
        ),
    ],
)
def test_a_derived_key_is_refused_naming_the_key_to_set_instead(valid_args, derived, meant):
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, f"{derived}=1"])
    assert f"`{derived}` (from the command line) is derived by easyrl from {meant}" in str(error.value)


def test_a_field_inside_a_derived_dict_is_refused_as_the_dict_is(valid_args, tmp_path):
    """Given dotted, a field of a derived dict was accepted and then dropped when easyrl derived the dict: Qwen3's
    thinking stayed on without a word."""
    key = "worker.rollout.multi_turn.chat_template_kwargs.enable_thinking"
    expected = (
        f"`{key}` (from the command line) is inside `worker.rollout.multi_turn.chat_template_kwargs`, which is "
        "derived by easyrl from `data.apply_chat_template_kwargs` and cannot be set"
    )
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, f"{key}=false"])
    assert expected in str(error.value)
    yaml = tmp_path / "config.yaml"
    yaml.write_text(
        "worker:\n  rollout:\n    multi_turn:\n      chat_template_kwargs:\n        enable_thinking: false\n"
    )
    with pytest.raises(ConfigError, match="derived by easyrl from `data.apply_chat_template_kwargs`"):
        load_config([f"config={yaml}", *valid_args])
    thinking_off = load_config([*valid_args, "+data.apply_chat_template_kwargs.enable_thinking=false"])
    assert thinking_off.worker.rollout.multi_turn.chat_template_kwargs == {"enable_thinking": False}


def test_every_derived_key_names_keys_a_user_can_set():
    from easyrl.config.load import DERIVED_KEYS, derived_from, valid_keys

    for key in DERIVED_KEYS:
        assert derived_from(key) and set(derived_from(key)) <= set(valid_keys()), key


def test_max_try_make_batch_zero_is_refused_as_it_would_mean_no_limit(valid_args):
    with pytest.raises(ConfigError, match=r"`trainer\.max_try_make_batch` is 0; it must be >= 1, or -1 \(-1 means no"):
        load_config([*valid_args, "algorithm.online_filtering=true", "trainer.max_try_make_batch=0"])
    assert load_config([*valid_args, "trainer.max_try_make_batch=-1"]).trainer.max_try_make_batch == -1


@pytest.mark.parametrize("loss_type", ["default", "gspo", "gspo_token"])
def test_a_lower_clip_at_or_below_zero_is_refused_for_the_clipped_losses(valid_args, loss_type):
    with pytest.raises(ConfigError, match=r"`worker\.actor\.clip_ratio_low` is 1\.5: .* 1 - 1\.5 = -0\.5"):
        load_config([*valid_args, f"worker.actor.loss_type={loss_type}", "worker.actor.clip_ratio_low=1.5"])
    with pytest.raises(ConfigError, match="clip_ratio_low` is 1:"):
        load_config([*valid_args, f"worker.actor.loss_type={loss_type}", "worker.actor.clip_ratio_low=1"])


def test_cispo_takes_a_clip_ratio_low_of_one_or_more_for_no_lower_bound(valid_args):
    """MiniMax-M1 (arXiv 2506.13585) sets eps_low large so that the importance weight has no lower bound."""
    config = load_config([*valid_args, "worker.actor.loss_type=cispo", "worker.actor.clip_ratio_low=10"])
    assert config.worker.actor.clip_ratio_low == 10


@pytest.mark.parametrize("critic", [[], ["algorithm.adv_estimator=gae", "worker.critic.global_batch_size=4"]])
def test_a_critic_warmup_as_long_as_the_run_is_refused(valid_args, critic):
    """The actor is first updated at step critic_warmup + 1: the policy would never train."""
    with pytest.raises(ConfigError, match=r"`trainer\.critic_warmup` is 5 and the run has 5 training steps"):
        load_config([*valid_args, *critic, "trainer.max_steps=5", "trainer.critic_warmup=5"])
    assert load_config([*valid_args, *critic, "trainer.max_steps=5", "trainer.critic_warmup=4"])


def test_foreign_key_names_only_suggest_and_each_names_an_easyrl_key():
    """The table of verl/TRL names only suggests (compat.LEGACY_KEYS renames EasyR1's own spellings, and agrees with
    it where a name is in both): none is the last part(s) of a key a user can set, and each target is a key of the
    schema."""
    from easyrl.config.compat import FOREIGN_KEY_NAMES, LEGACY_KEYS
    from easyrl.config.load import DERIVED_KEYS, valid_keys

    keys = valid_keys()
    for name, (target, note) in FOREIGN_KEY_NAMES.items():
        assert not [k for k in keys if (k == name or k.endswith("." + name)) and k not in DERIVED_KEYS], name
        assert any(key == target or key.endswith("." + target) for key in keys), target
        for legacy, renamed in LEGACY_KEYS.items():  # where EasyR1 spells it so too, the two agree
            assert not legacy.endswith("." + name) or renamed.endswith(target), name
        assert note


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "trainer.logger=file",
            "`trainer.logger` (from the command line) takes a list, not `file`: write `trainer.logger=[file]` "
            "(or several: `[console,file]`).",
        ),
        (  # several names joined by commas: the list of them, not a default plus the whole text
            "trainer.logger=console,file",
            "`trainer.logger` (from the command line) takes a list, not `console,file`: write "
            "`trainer.logger=[console,file]`.",
        ),
        (
            "trainer.logger=[console,file,console]",  # the Tracker refused it after Ray had started
            "`trainer.logger` lists 'console' more than once (['console', 'file', 'console']); name each logger once.",
        ),
        (
            "worker.actor.optim.betas=0.9",
            "`worker.actor.optim.betas` (from the command line) takes a list, not `0.9`: write it in brackets, e.g. "
            "`worker.actor.optim.betas=[0.9,0.999]` (its default).",
        ),
        (
            "trainer.logger={wandb: 1}",  # omegaconf raised a bare TypeError (incompatible container types)
            "`trainer.logger` (from the command line) takes a list, not a mapping: write it in brackets, e.g. "
            "`trainer.logger=[console,file]` (its default).",
        ),
        (
            "trainer.logger=null",
            "`trainer.logger` (from the command line) cannot be null: give a list, e.g. its default "
            "`trainer.logger=[console,file]`, or [] for none.",
        ),
        ("worker.rollout.n=[1,2]", "`worker.rollout.n` (from the command line) takes an integer, not a list."),
        (
            "worker.actor=3",
            "`worker.actor` (from the command line) is a section of keys, not a value: set the keys inside it, "
            "e.g. `worker.actor.strategy=fsdp`.",
        ),
        (
            "worker.rollout.n.x=3",
            "Unknown config key `worker.rollout.n.x` (from the command line): `worker.rollout.n` is one setting "
            "(an integer), not a section of keys.",
        ),
    ],
)
def test_a_value_of_the_wrong_shape_names_the_key_and_the_syntax(valid_args, override, message):
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, override])
    assert str(error.value) == message


def test_a_list_key_given_one_value_in_a_yaml_file_shows_the_yaml_syntax(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("trainer:\n  logger: file\n")
    with pytest.raises(ConfigError) as error:
        load_config([f"config={file}"])
    assert str(error.value) == (
        f"`trainer.logger` (from config file {file}) takes a list, not `file`: write `logger: [file]` under "
        "`trainer` (or several: `[console, file]`)."
    )


@pytest.mark.parametrize("key", ["data.val_files", "data.train_files"])
def test_a_list_of_data_files_asks_for_one_path_and_suggests_a_folder(valid_args, tmp_path, key):
    """verl takes lists of files; easyrl one path. The error names the key, the forms a path takes, and a folder
    holding the files, which loads."""
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, f"{key}=[a.jsonl,b.jsonl]"])
    message = str(error.value)
    assert message.startswith(
        f"`{key}` (from the command line) takes one path, not a list: a data file (.jsonl/.json/.parquet/.csv), "
        "a folder of data files,"
    )
    assert f"put them in one folder and give the folder, e.g. `{key}=path/to/folder`" in message
    assert "ListConfig" not in message
    folder = tmp_path / "files"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (folder / name).write_text('{"prompt": "1+1", "answer": "2"}\n')
    assert getattr(load_config([*valid_args, f"{key}={folder}"]).data, key.split(".")[1]) == str(folder)


def test_a_directory_given_as_config_asks_for_a_yaml_file(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config([f"config={tmp_path}"])
    assert str(error.value) == (
        f"Config file `{tmp_path}` (given as config=...) is a directory; config= takes one YAML file. Give the path "
        "of a YAML file, e.g. config=path/to/config.yaml."
    )
    (tmp_path / "grpo.yaml").write_text("trainer:\n  total_epochs: 2\n")
    with pytest.raises(
        ConfigError, match=rf"It holds grpo\.yaml: give one of them, e\.g\. config={tmp_path}/grpo\.yaml\.$"
    ):
        load_config([f"config={tmp_path}"])
    assert load_config([f"config={tmp_path / 'grpo.yaml'}"], validate=False).trainer.total_epochs == 2


def test_an_empty_section_in_a_yaml_file_sets_nothing(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("trainer:\nworker:\n  actor:\n  rollout:\n    n: 3\n")
    config = load_config([f"config={file}"], validate=False)
    assert config.worker.rollout.n == 3
    assert config.trainer.total_epochs == 15


def test_val_only_without_validation_data_is_refused(valid_args):
    with pytest.raises(ConfigError, match=r"trainer.val_only .* needs `data.val_files`"):
        load_config([*valid_args, "trainer.val_only=true", "data.val_files="])


def test_a_ulysses_size_that_does_not_divide_the_workers_is_named_before_the_batch_arithmetic(valid_args):
    for role, extra in (("actor", []), ("critic", ["algorithm.adv_estimator=gae", "worker.critic.padding_free=true"])):
        args = [*valid_args, *extra, "trainer.n_gpus_per_node=2", f"worker.{role}.ulysses_size=3"]
        with pytest.raises(
            ConfigError, match=rf"`worker\.{role}\.ulysses_size` \(3\) must divide the number of workers"
        ):
            load_config(args)


def test_an_image_dir_that_is_no_folder_is_refused(valid_args, tmp_path):
    with pytest.raises(ConfigError, match=r"`data.image_dir`: `.*nowhere` is not a folder"):
        load_config([*valid_args, f"data.image_dir={tmp_path / 'nowhere'}"])
    assert load_config([*valid_args, f"data.image_dir={tmp_path}"]).data.image_dir == str(tmp_path)


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        # a foreign section that is one of easyrl's dicts: the field goes inside it (not the training temperature)
        ("actor_rollout_ref.rollout.val_kwargs.temperature", "worker.rollout.val_override_config.temperature"),
        ("actor_rollout_ref.rollout.val_kwargs.n", "worker.rollout.val_override_config.n"),
        ("chat_template_kwargs.enable_thinking", "data.apply_chat_template_kwargs.enable_thinking"),
        # they drew wrong suggestions by spelling: loss_avg_mode, lr_warmup_steps, worker.rollout.name, data.val_...
        ("actor_rollout_ref.actor.policy_loss.loss_mode", "worker.actor.loss_type"),
        ("actor_rollout_ref.actor.optim.warmup_style", "worker.actor.optim.lr_scheduler_type"),
        ("custom_reward_function.path", "worker.reward.reward_function"),
        ("custom_reward_function.name", "worker.reward.reward_function"),
        ("trainer.resume_mode", "trainer.find_last_checkpoint"),
        ("trainer.max_actor_ckpt_to_keep", "trainer.save_limit"),
        ("trainer.max_ckpt_to_keep", "trainer.save_limit"),  # drew worker.reward.judge.max_tokens
        ("actor_rollout_ref.model.use_remove_padding", "worker.actor.padding_free"),
        ("actor_rollout_ref.model.lora_rank", "worker.actor.model.lora.rank"),
        ("data.truncation", "data.filter_overlong_prompts"),
        ("per_device_train_batch_size", "worker.actor.micro_batch_size_per_device_for_update"),
        ("scale_rewards", "algorithm.norm_adv_by_std_in_grpo"),
        ("importance_sampling_level", "worker.actor.loss_type"),
    ],
)
def test_verl_and_trl_names_point_at_the_easyrl_key_that_means_the_same(valid_args, given, meant):
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, f"{given}=1"])
    assert str(error.value).startswith(
        f"Unknown config key `{given}` (from the command line). Did you mean `{meant}`? ("
    )


def test_every_refused_key_of_a_command_line_is_named_in_one_error(valid_args):
    """A verl command line carries many keys: each is named with its easyrl key at once, not one per run of check."""
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, "data.train_batch_size=8", "worker.rollout.n=2", "trainer.total_training_steps=3"])
    lines = str(error.value).splitlines()
    assert lines[0] == "2 config keys are refused:"
    assert lines[1].startswith(
        "  - Unknown config key `data.train_batch_size` (from the command line). Did you mean `data.rollout_batch_size`?"
    )
    assert lines[2].startswith(
        "  - Unknown config key `trainer.total_training_steps` (from the command line). Did you mean `trainer.max_steps`?"
    )


@pytest.mark.parametrize(
    ("value", "meant"),
    [
        ("dr_grpo", "loss_avg_mode=seq-mean-token-sum-norm with algorithm.norm_adv_by_std_in_grpo=false"),
        ("grpo", "worker.actor.loss_avg_mode=seq-mean-token-mean"),
        ("dapo", "worker.actor.loss_avg_mode=token-mean"),
    ],
)
def test_trl_loss_type_values_name_the_aggregation_not_a_near_spelt_policy_loss(valid_args, value, meant):
    """TRL's loss_type is the aggregation; easyrl's is the policy loss, whose near spellings (gspo for grpo, sapo for
    dapo) were suggested."""
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, f"worker.actor.loss_type={value}"])
    assert f"TRL's loss_type={value} is " in str(error.value) and meant in str(error.value)
    assert "Did you mean" not in str(error.value)


def test_an_ignored_older_easyr1_key_is_named_with_what_to_write(valid_args, caplog):
    """worker.reward.compute_score (EasyR1's older way to pick a built-in reward) was dropped without a word."""
    with caplog.at_level("WARNING", logger="easyrl.config.compat"):
        config = load_config([*valid_args, "worker.reward.compute_score=math"])
    assert "worker.reward.compute_score=math is an older EasyR1 key that easyrl ignores" in caplog.text
    assert "`reward_function/math.py:compute_score`" in caplog.text
    assert config.worker.reward.reward_function == load_config(valid_args).worker.reward.reward_function


def test_a_vision_language_actors_critic_must_cut_pictures_as_the_actor_does(valid_args, tmp_path):
    """The critic reads the actor's sequences and pictures: a text-only critic, or Qwen3-VL's 16-pixel patches under
    a Qwen2.5-VL actor, failed with a bare shape error in its first forward, after Ray, the engine and a rollout."""
    cut = {"spatial_merge_size": 2, "temporal_patch_size": 2}
    folders = {
        "actor": {"model_type": "qwen2_5_vl", "vision_config": {"patch_size": 14, **cut}},
        "small": {"model_type": "qwen2_5_vl", "hidden_size": 64, "vision_config": {"patch_size": 14, **cut}},
        "qwen3": {"model_type": "qwen3_vl", "vision_config": {"patch_size": 16, **cut}},
        "text": {"model_type": "qwen2"},
    }
    for name, content in folders.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(content))
    gae = [
        *valid_args,
        f"worker.actor.model.model_path={tmp_path / 'actor'}",
        "algorithm.adv_estimator=gae",
        "worker.critic.global_batch_size=4",
    ]

    def critic(name: str) -> list[str]:
        return [*gae, f"worker.critic.model.model_path={tmp_path / name}"]

    load_config(critic("small"))  # a smaller model of the actor's family
    no_critic = [*valid_args, f"worker.actor.model.model_path={tmp_path / 'actor'}"]
    load_config([*no_critic, f"worker.critic.model.model_path={tmp_path / 'text'}"])  # GRPO trains no critic
    with pytest.raises(ConfigError) as error:
        load_config(critic("qwen3"))
    assert str(error.value).startswith(
        f"`worker.critic.model.model_path` ({tmp_path / 'qwen3'}): its vision model cuts pictures otherwise "
        f"(patch_size 16 where the actor's is 14), and the actor ({tmp_path / 'actor'}, qwen2_5_vl) is a "
        "vision-language model whose sequences, pictures and 3-D rope positions the critic reads."
    )
    with pytest.raises(ConfigError, match=r"\): it is a text-only model \(qwen2\), and the actor"):
        load_config(critic("text"))

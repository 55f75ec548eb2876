"""Config loading, overrides and validation: every error names the key and the fix."""

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


def test_rollout_batch_must_be_multiple_of_global_batch(valid_args):
    with pytest.raises(
        ConfigError, match=r"`data\.rollout_batch_size` \(6\).*`worker\.actor\.global_batch_size` \(4\)"
    ):
        load_config([*valid_args, "data.rollout_batch_size=6"])


def test_global_batch_must_split_over_workers(valid_args):
    with pytest.raises(ConfigError, match=r"cannot be split evenly over 3 workers"):
        load_config([*valid_args, "trainer.n_gpus_per_node=3", "worker.actor.global_batch_size=2"])


def test_per_device_batch_must_hold_whole_micro_batches(valid_args):
    with pytest.raises(ConfigError, match=r"micro_batch_size_per_device_for_update` \(3\)"):
        load_config([*valid_args, "worker.actor.micro_batch_size_per_device_for_update=3"])


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
        assert str(error.value).startswith(
            f"`worker.actor.model.model_path`: `{given}` is part of a training checkpoint"
        )
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


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match=r"`worker\.rollout\.n` is not of the form key=value"):
        load_config(["worker.rollout.n"])


def test_missing_config_file():
    with pytest.raises(ConfigError, match=r"Config file `nope\.yaml`.*does not exist"):
        load_config(["config=nope.yaml"])

"""Every example command line of EasyR1 runs in easyrl: none is refused, none passes check and then fails in the
workers.

The table below holds, for each `examples/**/*.sh` script of EasyR1 (hiyouga/EasyR1 at b44b311), the arguments its
command passes after `config=examples/config.yaml` (as the program receives them: shell quotes removed, `${VAR}`
replaced by the script's default value) and the plan it must give.

- Test A (fast): each exact command line (EasyR1's config.yaml, `tests/data/easyr1_config.yaml`, plus the script's
  arguments; hub model ids and hub datasets as written: check does not download) goes through `load_run_plan` and gets
  a plan with the recipe's decisions (hand-worked numbers). EasyR1's `examples/reward_function/*.py` and
  `examples/format_prompt/*.jinja` are served by the files easyrl ships under the same names; a file of another
  name that does not exist is refused, naming the key and where easyrl's files are.
- Test B (real runs on CPU): each example, shrunk to tiny sizes, trains 2 steps. Every key that decides the
  algorithm stays as the recipe sets it (estimator, KL, losses, clip ratios, loss averaging, filtering, reward file
  and its keyword arguments scaled to the tiny lengths, prompt template, validation sampling); models, data, batch
  sizes, lengths and the device count are replaced (see `tiny_overrides`). Two runs are in the default suite, the
  whole set is marked slow.

Tiny random models answer nothing right, so every reward would be 0: groups would all be filtered out by DAPO's
online filtering and no run would see a non-zero advantage. The tiny models here are SCRIPTED instead (see
`script_model`): each response is, with probability p (1/2; lower under online filtering), a fixed answer written in
the recipe's expected format (`<think>...</think>\\boxed{1}`, `Answer: 7`, ...), else empty. Rewards then differ
within a group, as they do for a real model, and the filters keep some groups and drop others. The Qwen3-VL-30B-A3B
example runs on a tiny Qwen3-VL mixture-of-experts saved in the released checkpoints' layout; `KNOWN_FAILURES` lists
the examples check accepts that do not run yet (strict xfails, easyrl's to fix).
"""

import functools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest

from easyrl.config import PROJECT_ROOT, ConfigError, RunPlan, load_run_plan
from tests.fixtures.trainer_runs import run_easyrl


ROOT = Path(__file__).resolve().parent.parent
EASYR1_CONFIG = ROOT / "tests" / "data" / "easyr1_config.yaml"
DATA_DIR = ROOT / "tests" / "data" / "easyr1_examples"


@pytest.fixture(autouse=True)
def _tracker_logins(monkeypatch):
    """The recipes log to wandb or swanlab: these tests are a user who can (offline modes stand for a login); the
    test of a user who cannot clears them."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("SWANLAB_MODE", "local")


# ----------------------------------------------------------------------------------------------------------------------
# the table: EasyR1's example scripts
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    script: str
    """The script's path in EasyR1's repository."""
    args: tuple[str, ...]
    """The arguments after `config=examples/config.yaml`, as the program receives them."""
    plan: dict[str, Any] = field(default_factory=dict)
    """Expected values of the plan: dotted attribute of RunPlan -> value (hand-worked from the recipe)."""

    @property
    def name(self) -> str:
        return Path(self.script).stem

    @property
    def vision(self) -> bool:
        return "_vl_" in self.name


# What every example gets from EasyR1's config.yaml: GRPO, KL as a low-variance loss (coef 0.01), 512 prompts x 5
# samples per step in one generation call, global_batch_size 128 (4 optimizer steps per step, so the old log-probs
# come from their own pass), 8 GPUs.
CONFIG_YAML_PLAN = {
    "world_size": 8,
    "use_reference": True,
    "kl_loss": True,
    "kl_in_reward": False,
    "use_critic": False,
    "on_policy": False,
    "actor_optimizer_steps_per_batch": 4,
    "generation_batch_size": 512,
    "generation_rounds_per_step": 1,
    "config.algorithm.kl_penalty": "low_var_kl",
    "config.worker.actor.loss_type": "ppo",
    "config.worker.rollout.n": 5,
    "config.worker.actor.global_batch_size_per_device": 80,  # 128 prompts x 5 samples / 8 workers
}
GEO3K = ("data.train_files=hiyouga/geometry3k@train", "data.val_files=hiyouga/geometry3k@test")
NO_KL = {"use_reference": False, "kl_loss": False, "kl_in_reward": False, "worker_role": "actor_rollout"}

EXAMPLES = [
    Example(
        "examples/baselines/qwen2_5_vl_3b_clevr.sh",
        (
            "data.train_files=BUAADreamer/clevr_count_70k@train",
            "data.val_files=BUAADreamer/clevr_count_70k@test",
            "data.format_prompt=./examples/format_prompt/r1v.jinja",
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-3B-Instruct",
            "worker.rollout.tensor_parallel_size=1",
            "worker.reward.reward_function=./examples/reward_function/r1v.py:compute_score",
            "trainer.experiment_name=qwen2_5_vl_3b_clevr",
            "trainer.n_gpus_per_node=2",
        ),
        plan={"world_size": 2, "config.worker.actor.global_batch_size_per_device": 320},
    ),
    Example(
        "examples/baselines/qwen2_5_vl_3b_geoqa8k.sh",
        (
            "data.train_files=leonardPKU/GEOQA_8K_R1V@train",
            "data.val_files=leonardPKU/GEOQA_8K_R1V@test",
            "data.format_prompt=./examples/format_prompt/r1v.jinja",
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-3B-Instruct",
            "worker.rollout.tensor_parallel_size=1",
            "worker.reward.reward_function=./examples/reward_function/r1v.py:compute_score",
            "trainer.experiment_name=qwen2_5_vl_3b_geoqa8k",
            "trainer.n_gpus_per_node=8",
        ),
    ),
    Example("examples/qwen2_5_7b_math_grpo.sh", ("worker.actor.model.model_path=Qwen/Qwen2.5-7B-Instruct",)),
    Example(
        "examples/qwen2_5_vl_32b_geo3k_grpo.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-32B-Instruct",
            "worker.actor.fsdp.torch_dtype=bf16",
            "worker.actor.optim.strategy=adamw_bf16",
            "worker.rollout.tensor_parallel_size=8",
            "trainer.experiment_name=qwen2_5_vl_32b_geo_grpo",
            "trainer.n_gpus_per_node=8",
        ),
    ),
    Example(
        "examples/qwen2_5_vl_3b_android_gui_grpo.sh",
        (
            "data.train_files=yuehua-s/numbergame@train",
            "data.val_files=yuehua-s/numbergame@test",
            "data.max_prompt_length=3072",
            "data.max_response_length=64",
            "data.rollout_batch_size=32",
            "data.val_batch_size=60",
            "data.format_prompt=examples/format_prompt/android_gui.jinja",
            "data.seed=42",
            "data.filter_overlong_prompts=false",
            "algorithm.kl_coef=4.0e-2",
            "worker.actor.global_batch_size=32",
            "worker.actor.max_grad_norm=0.1",
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-3B-Instruct",
            "worker.actor.model.trust_remote_code=true",
            "worker.actor.optim.lr=1.0e-5",
            "worker.actor.optim.weight_decay=1.0e-1",
            "worker.actor.optim.lr_warmup_ratio=0.05",
            "worker.actor.optim.lr_scheduler_type=constant",
            "worker.rollout.n=8",
            "worker.rollout.temperature=0.9",
            "worker.rollout.top_p=0.95",
            "worker.rollout.limit_images=1",
            "worker.rollout.gpu_memory_utilization=0.75",
            "worker.rollout.tensor_parallel_size=1",
            "worker.reward.reward_function=examples/reward_function/android_gui.py:compute_score",
            "trainer.total_epochs=3",
            "trainer.project_name=easy_r1",
            # the script's default is qwen2_5_vl_3b_android_gui_grpo_$(date +%Y%m%d_%H%M%S): one fixed date here
            "trainer.experiment_name=qwen2_5_vl_3b_android_gui_grpo_20250101_000000",
            'trainer.logger=["console","wandb"]',
            "trainer.n_gpus_per_node=2",
            "trainer.nnodes=1",
            "trainer.val_freq=2",
            "trainer.val_generations_to_log=10",
            "trainer.save_freq=10",
        ),
        # 32 prompts x 8 samples in one optimizer step (global_batch_size = rollout_batch_size, KL as a loss): the
        # update's own log-probs are the old ones; 32 x 8 / 2 workers = 128 samples per device
        plan={
            "world_size": 2,
            "on_policy": True,
            "actor_optimizer_steps_per_batch": 1,
            "generation_batch_size": 32,
            "config.worker.rollout.n": 8,
            "config.worker.actor.global_batch_size_per_device": 128,
            "config.algorithm.kl_coef": 0.04,
        },
    ),
    Example(
        "examples/qwen2_5_vl_3b_geo3k_grpo.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-3B-Instruct",
            "trainer.experiment_name=qwen2_5_vl_3b_geo_grpo",
            "trainer.n_gpus_per_node=2",
        ),
        plan={"world_size": 2, "config.worker.rollout.tensor_parallel_size": 2},
    ),
    Example(
        "examples/qwen2_5_vl_7b_geo3k_cispo.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct",
            "worker.actor.loss_type=cispo",
            "worker.actor.clip_ratio_low=0",
            "worker.actor.clip_ratio_high=4",
            "trainer.experiment_name=qwen2_5_vl_7b_geo_cispo",
            "trainer.n_gpus_per_node=8",
        ),
        plan={"config.worker.actor.loss_type": "cispo"},
    ),
    Example(
        "examples/qwen2_5_vl_7b_geo3k_dapo.sh",
        (
            *GEO3K,
            "data.mini_rollout_batch_size=128",
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct",
            "worker.actor.clip_ratio_low=0.2",
            "worker.actor.clip_ratio_high=0.28",
            "algorithm.disable_kl=True",
            "algorithm.online_filtering=True",
            "trainer.experiment_name=qwen2_5_vl_7b_geo_dapo",
            "trainer.n_gpus_per_node=8",
        ),
        # 512 prompts per step, generated 128 at a time: 4 calls when every group survives the filter
        plan={
            **NO_KL,
            "generation_batch_size": 128,
            "generation_rounds_per_step": 4,
            "config.algorithm.online_filtering": True,
            "config.algorithm.filter_key": "overall",
        },
    ),
    Example(
        "examples/qwen2_5_vl_7b_geo3k_grpo.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct",
            "trainer.experiment_name=qwen2_5_vl_7b_geo_grpo",
            "trainer.n_gpus_per_node=8",
        ),
    ),
    Example(
        "examples/qwen2_5_vl_7b_geo3k_gspo.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct",
            "worker.actor.loss_type=gspo_token",
            "worker.actor.loss_avg_mode=seq",
            "worker.actor.clip_ratio_low=3e-4",
            "worker.actor.clip_ratio_high=4e-4",
            "algorithm.disable_kl=True",
            "trainer.experiment_name=qwen2_5_vl_7b_geo_gspo",
            "trainer.n_gpus_per_node=8",
        ),
        # EasyR1 spells the sequence-mean aggregation `seq`
        plan={
            **NO_KL,
            "config.worker.actor.loss_type": "gspo_token",
            "config.worker.actor.loss_avg_mode": "seq-mean-token-mean",
        },
    ),
    Example(
        "examples/qwen2_5_vl_7b_geo3k_reinforce.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct",
            "algorithm.adv_estimator=reinforce_plus_plus",
            "algorithm.use_kl_loss=false",
            "algorithm.kl_penalty=kl",
            "algorithm.kl_coef=1.0e-3",
            "trainer.experiment_name=qwen2_5_vl_7b_geo_reinforce_pp",
            "trainer.n_gpus_per_node=8",
        ),
        # KL to the reference as a per-token reward penalty, read from the old log-probs before the advantages
        plan={"use_reference": True, "kl_loss": False, "kl_in_reward": True, "config.algorithm.kl_penalty": "kl"},
    ),
    Example(
        "examples/qwen2_5_vl_7b_geo3k_sapo.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct",
            "worker.actor.loss_type=sapo",
            "algorithm.disable_kl=True",
            "trainer.experiment_name=qwen2_5_vl_7b_geo_sapo",
            "trainer.n_gpus_per_node=8",
        ),
        plan={**NO_KL, "config.worker.actor.loss_type": "sapo"},
    ),
    Example(
        "examples/qwen2_5_vl_7b_geo3k_swanlab.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct",
            "trainer.experiment_name=qwen2_5_vl_7b_geo_grpo",
            "trainer.logger=[console,swanlab]",  # the script writes ['console','swanlab']; the shell drops the quotes
            "trainer.n_gpus_per_node=8",
        ),
    ),
    Example(
        "examples/qwen2_5_vl_7b_multi_image.sh",
        (
            "data.train_files=hiyouga/journeybench-multi-image-vqa@train",
            "data.val_files=hiyouga/journeybench-multi-image-vqa@test",
            "data.rollout_batch_size=256",
            "worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct",
            "worker.rollout.limit_images=2",
            "trainer.experiment_name=qwen2_5_vl_7b_multi_image",
            "trainer.n_gpus_per_node=8",
        ),
        plan={"actor_optimizer_steps_per_batch": 2, "generation_batch_size": 256},
    ),
    Example(
        "examples/qwen3_14b_dapo17k_dapo.sh",
        (
            "data.train_files=Saigyouji-Yuyuko1000/dapo17k@train",
            "data.val_files=Saigyouji-Yuyuko1000/dapo17k@test",
            "data.format_prompt=./examples/format_prompt/dapo.jinja",
            "data.max_prompt_length=2048",
            "data.max_response_length=20480",
            "data.rollout_batch_size=512",
            "data.mini_rollout_batch_size=256",
            "worker.actor.ulysses_size=8",
            "worker.actor.model.model_path=Qwen/Qwen3-14B-Base",
            "worker.actor.fsdp.torch_dtype=bf16",
            "worker.actor.optim.strategy=adamw_bf16",
            "worker.actor.optim.weight_decay=0.1",
            "worker.actor.optim.lr_warmup_steps=10",
            "worker.actor.global_batch_size=32",
            "worker.actor.clip_ratio_low=0.2",
            "worker.actor.clip_ratio_high=0.28",
            "worker.actor.clip_ratio_dual=10.0",
            "worker.rollout.n=16",
            "worker.rollout.max_num_batched_tokens=22528",
            'worker.rollout.val_override_config={"n":16,"temperature":1.0,"top_p":0.7}',
            "worker.rollout.gpu_memory_utilization=0.8",
            "worker.rollout.tensor_parallel_size=4",
            "worker.reward.reward_function=./examples/reward_function/dapo.py:compute_score",
            'worker.reward.reward_function_kwargs={"max_response_length":20480,"overlong_buffer_length":4096,'
            '"overlong_penalty_factor":1.0}',
            "algorithm.disable_kl=True",
            "algorithm.online_filtering=True",
            "algorithm.filter_key=accuracy_normalized",
            "algorithm.filter_low=0.01",
            "algorithm.filter_high=0.99",
            "trainer.total_epochs=10",
            "trainer.max_try_make_batch=10",
            "trainer.experiment_name=qwen3_14b_dapo17k_dapo",
            "trainer.n_gpus_per_node=8",
        ),
        # 512 prompts x 16 samples per step, generated 256 prompts at a time; 512 / 32 = 16 optimizer steps;
        # 32 x 16 / (8 workers / ulysses 8 = one data-parallel group) = 512 samples per device per optimizer step
        plan={
            **NO_KL,
            "generation_batch_size": 256,
            "generation_rounds_per_step": 2,
            "actor_optimizer_steps_per_batch": 16,
            "config.worker.rollout.n": 16,
            "config.worker.actor.global_batch_size_per_device": 512,
            # Ulysses: 8 workers split each sequence, so one Ulysses group (the whole node) shares a chunk
            "config.worker.actor.ulysses_size": 8,
            "config.worker.ref.ulysses_size": 8,
            "config.algorithm.online_filtering": True,
            "config.algorithm.filter_key": "accuracy_normalized",
            "config.worker.rollout.max_model_len": 2048 + 20480,
            "config.worker.rollout.val_override_config": {"n": 16, "temperature": 1.0, "top_p": 0.7},
        },
    ),
    Example(
        "examples/qwen3_4b_math_grpo.sh",
        (
            "data.max_response_length=4096",
            "worker.actor.model.model_path=Qwen/Qwen3-4B",
            "trainer.experiment_name=qwen3_4b_math_grpo",
        ),
        plan={"config.worker.rollout.response_length": 4096, "config.worker.rollout.max_model_len": 2048 + 4096},
    ),
    Example(
        "examples/qwen3_4b_math_grpo_lora.sh",
        (
            "data.max_response_length=2048",
            "worker.actor.model.model_path=Qwen/Qwen3-4B",
            "worker.actor.model.lora.rank=64",
            "worker.actor.model.lora.alpha=64",
            "worker.actor.optim.lr=1e-5",
            "worker.rollout.tensor_parallel_size=1",
            "trainer.experiment_name=qwen3_4b_math_grpo_lora",
            "trainer.n_gpus_per_node=1",
        ),
        # the reference policy is the actor with its adapters off: no reference model in the worker
        plan={
            "world_size": 1,
            "config.worker.actor.global_batch_size_per_device": 640,
            "ref_from_actor": True,
            "worker_role": "actor_rollout",
        },
    ),
    Example(
        "examples/qwen3_vl_30b_geo3k_grpo.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen3-VL-30B-A3B-Instruct",
            "worker.actor.fsdp.torch_dtype=bf16",
            "worker.actor.optim.strategy=adamw_bf16",
            "worker.rollout.tensor_parallel_size=8",
            "trainer.experiment_name=qwen3_vl_30b_geo_grpo",
            "trainer.n_gpus_per_node=8",
        ),
    ),
    Example(
        "examples/qwen3_vl_4b_geo3k_grpo.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen3-VL-4B-Instruct",
            "trainer.experiment_name=qwen3_vl_4b_geo_grpo",
            "trainer.n_gpus_per_node=2",
        ),
        plan={"world_size": 2},
    ),
    Example(
        "examples/qwen3_vl_4b_geo3k_grpo_lora.sh",
        (
            *GEO3K,
            "worker.actor.model.model_path=Qwen/Qwen3-VL-4B-Instruct",
            "worker.actor.model.lora.rank=64",
            "worker.actor.optim.lr=1e-5",
            "trainer.experiment_name=qwen3_vl_4b_geo_grpo_lora",
            "trainer.n_gpus_per_node=2",
        ),
        plan={"world_size": 2, "ref_from_actor": True, "worker_role": "actor_rollout"},
    ),
]
RUNS = EXAMPLES
BY_NAME = {example.name: example for example in EXAMPLES}


def command_line(example: Example, *extra: str) -> list[str]:
    return [f"config={EASYR1_CONFIG}", *example.args, *extra]


def expected_plan(example: Example) -> dict[str, Any]:
    """CONFIG_YAML_PLAN, with the values the example's arguments change recomputed by hand in its `plan`."""
    expected = dict(CONFIG_YAML_PLAN)
    world = example.plan.get("world_size", 8)
    if world != 8 and "config.worker.actor.global_batch_size_per_device" not in example.plan:
        expected["config.worker.actor.global_batch_size_per_device"] = 128 * 5 // world
    expected.update(example.plan)
    return expected


def plan_value(plan: RunPlan, dotted: str) -> Any:
    node: Any = plan
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


# ----------------------------------------------------------------------------------------------------------------------
# Test A: the exact command lines through check
# ----------------------------------------------------------------------------------------------------------------------
def test_the_table_holds_every_example_script_of_easyr1():
    # 20 scripts at b44b311, all run (the Android GUI agent's since easyrl ships android_gui.py and .jinja)
    assert len(EXAMPLES) == 20 and len(BY_NAME) == 20


def _resolved(plan: RunPlan, key: str) -> Any:
    return plan_value(plan, "config." + key)


def _assert_argument_took_effect(plan: RunPlan, argument: str) -> None:
    """The value of `key=value` is what the resolved config holds (EasyR1's spellings and paths resolved)."""
    import yaml

    key, raw = argument.split("=", 1)
    value, resolved = yaml.safe_load(raw), _resolved(plan, key)
    if key == "worker.actor.loss_avg_mode":
        value = {"seq": "seq-mean-token-mean", "token": "token-mean"}.get(value, value)
    if key in ("worker.reward.reward_function", "data.format_prompt"):
        # EasyR1's ./examples/<folder>/<file> is served by the file easyrl ships under the same name
        folder, name = Path(value.split(":")[0]).parent.name, Path(value.split(":")[0]).name
        suffix = ":" + value.split(":")[1] if ":" in value else ""
        value = f"{PROJECT_ROOT / folder / name}{suffix}"
    if isinstance(value, str) and isinstance(resolved, float):
        value = float(value)  # YAML 1.1 reads 3e-4 as a string; easyrl reads it as the number it means
    assert resolved == value, f"{argument}: resolved to {resolved!r}"


@pytest.mark.parametrize("example", RUNS, ids=lambda e: e.name)
def test_example_that_runs_passes_check_with_the_recipes_plan(example):
    plan = load_run_plan(command_line(example))
    for argument in example.args:
        _assert_argument_took_effect(plan, argument)
    for dotted, value in expected_plan(example).items():
        assert plan_value(plan, dotted) == value, dotted
    # no GPU here: EasyR1's enforce_eager=false (CUDA graphs) is adjusted and announced
    assert plan.rollout_enforce_eager is True
    assert any("enforce_eager" in note for note in plan.notes)


def test_dapo17k_recipe_plans_dapo_with_easyrl_files_of_easyr1s_contract(caplog):
    plan = load_run_plan(command_line(BY_NAME["qwen3_14b_dapo17k_dapo"], "worker.actor.ulysses_size=1"))
    config = plan.config
    assert config.worker.reward.reward_function == f"{PROJECT_ROOT / 'reward_function' / 'dapo.py'}:compute_score"
    assert config.data.format_prompt == str(PROJECT_ROOT / "format_prompt" / "dapo.jinja")
    assert config.worker.reward.reward_function_kwargs == {
        "max_response_length": 20480,
        "overlong_buffer_length": 4096,
        "overlong_penalty_factor": 1.0,
    }
    assert (config.algorithm.filter_low, config.algorithm.filter_high) == (0.01, 0.99)
    assert config.trainer.max_try_make_batch == 10
    assert "online filtering may add rounds" in plan.describe()


def test_android_gui_recipe_plans_with_easyrl_files_of_easyr1s_contract():
    config = load_run_plan(command_line(BY_NAME["qwen2_5_vl_3b_android_gui_grpo"])).config
    assert config.worker.reward.reward_function == (
        f"{PROJECT_ROOT / 'reward_function' / 'android_gui.py'}:compute_score"
    )
    assert config.data.format_prompt == str(PROJECT_ROOT / "format_prompt" / "android_gui.jinja")
    assert (config.data.filter_overlong_prompts, config.worker.rollout.limit_images) == (False, 1)


# A reward file or a template of a name easyrl does not ship, where the recipe's own file is not there either
MISSING_REWARD = "worker.reward.reward_function=examples/reward_function/gui_agent.py:compute_score"
MISSING_TEMPLATE = "data.format_prompt=examples/format_prompt/gui_agent.jinja"


@pytest.mark.parametrize(
    ("argument", "key", "folder"),
    [
        (MISSING_REWARD, "worker.reward.reward_function", "reward_function"),
        (MISSING_TEMPLATE, "data.format_prompt", "format_prompt"),
    ],
)
def test_a_missing_file_easyrl_does_not_ship_is_refused_naming_the_key_and_easyrls_files(argument, key, folder):
    example = BY_NAME["qwen2_5_vl_3b_android_gui_grpo"]
    with pytest.raises(ConfigError) as refusal:
        load_run_plan(command_line(example, argument))
    message = str(refusal.value)
    assert f"`{key}`" in message and "gui_agent." in message, message
    assert str(PROJECT_ROOT / folder) in message and "android_gui." in message, message


@pytest.mark.parametrize("name", ["qwen2_5_7b_math_grpo", "qwen2_5_vl_7b_geo3k_swanlab"])
def test_check_refuses_a_remote_logger_that_cannot_start(name, tmp_path):
    # EasyR1's config.yaml logs to wandb, the swanlab example to swanlab; with no login, no API key and no offline
    # mode neither can start a run, which check can see before anything starts (environment, ~/.netrc)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WANDB_", "SWANLAB_"))}
    env["HOME"] = str(tmp_path)
    result = run_easyrl("check", *command_line(BY_NAME[name]), env=env, timeout=120)
    assert result.returncode == 2, result.stdout[-2000:]
    assert "trainer.logger" in result.stderr


def test_easyrl_check_exits_2_naming_the_key_of_a_missing_reward_file():
    example = BY_NAME["qwen2_5_vl_3b_android_gui_grpo"]
    result = run_easyrl("check", *command_line(example, MISSING_REWARD), timeout=120)
    assert result.returncode == 2, result.stderr
    assert "worker.reward.reward_function" in result.stderr
    assert "gui_agent.py" in result.stderr


# ----------------------------------------------------------------------------------------------------------------------
# Test B: the examples that run, shrunk, train 2 steps on CPU
# ----------------------------------------------------------------------------------------------------------------------
# The answer each scripted model writes (with probability 1/2, else nothing), in the format of the recipe's reward:
# math.py wants `<think>...</think>...\boxed{...}`, r1v.py `<think>...</think><answer>...</answer>`, dapo.py a line
# `Answer: ...`, android_gui.py a card position. The shapes pictures mostly hold one shape of the asked kind (answer "1"); the DAPO stand-in data
# (`tiny_data`) is answered right.
SCRIPTED_ANSWERS = {
    "math": "<think>x</think>\\boxed{1}",
    # r1v.py matches the response exactly (no whitespace clean-up), and the chain needs a different token for each
    # of the 4 `>`: the vocabulary has few tokens holding one (`>)`, `><`, `>\\`, `>`), hence the odd spelling
    "r1v": "<think>) </think><answer>\\boxed{1}</answer>",
    "dapo": "Answer: 7",
    # android_gui.py reads the first 0, 1 or 2: the middle card (the stand-in data's right card, see `tiny_data`)
    "android_gui": "1",
}
SEVENS = DATA_DIR / "sevens"
MODEL_KEY = "worker.actor.model.model_path"
RUN_TIMEOUT_S = 900
# The run of the default suite: EasyR1's config.yaml as it is (GRPO, KL loss, several optimizer steps per batch,
# validation before and after). DAPO's (mini-batch generation, online filtering on dapo.py's accuracy_normalized, the
# overlong penalty, validation with 16 samples per prompt) is in the slow set with the others, to keep the default
# suite within its time budget: test_trainer_reward_overlap runs mini-batch generation with online filtering, and
# tests/test_reward_builtin.py scores the overlong penalty.
DEFAULT_SUITE_RUNS = ("qwen2_5_7b_math_grpo",)
# Examples whose shrunk run changes one more key: DAPO's Ulysses size 8 needs 8 workers (the shrunk run has 2) and a
# model whose head counts it divides (the scripted tiny model has 1 key/value head); tests/test_ulysses.py trains
# with ulysses_size 2 through `easyrl train`.
RUN_WITH = {"qwen3_14b_dapo17k_dapo": ("worker.actor.ulysses_size=1",)}


def distinct_token_path(tokenizer, text: str) -> list[int]:
    """Token ids, all different, whose decoding is ``text`` (depth-first over the vocabulary, longest pieces first).

    A scripted model walks these ids as a chain (each id's successor is fixed), so an id may appear only once."""
    pieces: dict[str, list[int]] = {}
    special = set(tokenizer.all_special_ids)
    for token_id in range(len(tokenizer)):
        piece = tokenizer.decode([token_id])
        if piece and token_id not in special:
            pieces.setdefault(piece, []).append(token_id)
    longest = max(len(piece) for piece in pieces)

    def search(start: int, used: frozenset) -> Optional[list[int]]:
        if start == len(text):
            return []
        for end in range(min(len(text), start + longest), start, -1):
            for token_id in pieces.get(text[start:end], ()):
                if token_id not in used and (rest := search(end, used | {token_id})) is not None:
                    return [token_id, *rest]
        return None

    ids = search(0, frozenset())
    assert ids is not None and tokenizer.decode(ids) == text, f"no path of distinct tokens spells {text!r}"
    return ids


def script_model(source: Path, target: Path, answer: str, p_answer: float = 0.5) -> Path:
    """Save a copy of the tiny model at ``source`` whose every response is ``answer`` (probability ``p_answer``)
    or empty (the end-of-sequence token at once), whatever the prompt and pictures.

    Construction: the attention output and MLP down projections of the language model are zero, so the hidden state
    at a position is its token's embedding, and the next-token distribution depends on the current token alone (a
    Markov chain). The embeddings are one-hot: token i of the answer's path gets its own dimension i, every other
    token the last dimension. After the final RMSNorm a one-hot e_k is sqrt(hidden) e_k, so the (untied) output
    matrix column k holds the logits of state k: from any prompt token, answer[0] with log p_answer and the end with
    log (1 - p_answer); from answer[i], answer[i + 1]; from the last, the end; every other token -40.
    """
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    from easyrl.models.checkpoint_layout import save_pretrained_in_released_layout

    shutil.copytree(source, target)
    config = AutoConfig.from_pretrained(target)
    config.tie_word_embeddings = False
    if hasattr(config, "text_config"):
        config.text_config.tie_word_embeddings = False
    model_cls = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    model = model_cls.from_pretrained(source, config=config, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source)
    path = distinct_token_path(tokenizer, answer)
    # the last prompt token (the chat template's newline after the assistant header) must be in the default state
    assert not set(path) & set(tokenizer.encode("\n", add_special_tokens=False)), path
    embeddings, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    hidden = embeddings.shape[1]
    default, scale, end = hidden - 1, math.sqrt(hidden), tokenizer.eos_token_id
    assert len(path) < default
    with torch.no_grad():
        for name, param in model.named_parameters():
            # attention output and MLP down projections of the language model, mixture-of-experts stacks included
            if "visual" not in name and (
                name.endswith("self_attn.o_proj.weight") or ("mlp." in name and "down_proj" in name)
            ):
                param.zero_()
        embeddings.zero_()
        embeddings[:, default] = 1.0
        for state, token_id in enumerate(path):
            embeddings[token_id] = 0.0
            embeddings[token_id, state] = 1.0
        head.fill_(-40.0 / scale)
        head[path[0], default] = math.log(p_answer) / scale
        head[end, default] = math.log(1.0 - p_answer) / scale
        for state, next_id in enumerate([*path[1:], end]):
            head[next_id, state] = 0.0
    save_pretrained_in_released_layout(model, str(target))  # vLLM starts from it: the layout it reads
    return target


@pytest.fixture(scope="module")
def scripted_models(tiny_model_path, tmp_path_factory):
    """(model family, reward name, answer probability) -> a scripted tiny model folder, built on first use.

    Families: text (the tiny Qwen2-style model of tests/fixtures/models.py), qwen2_5_vl and qwen3_vl (easyrl's
    built-in tiny random VLMs), qwen3_vl_moe (easyrl.testing.tiny_moe's `build_tiny_qwen3_vl_moe`)."""
    from easyrl.testing.tiny_moe import build_tiny_qwen3_vl_moe
    from easyrl.testing.tiny_vlms import ensure_tiny_vlm

    root = tmp_path_factory.mktemp("scripted_models")
    sources = {
        "text": lambda: Path(tiny_model_path),
        "qwen2_5_vl": lambda: ensure_tiny_vlm("qwen2_5_vl"),
        "qwen3_vl": lambda: ensure_tiny_vlm("qwen3_vl"),
        "qwen3_vl_moe": functools.cache(lambda: build_tiny_qwen3_vl_moe(root / "qwen3_vl_moe_random")),
    }
    built: dict[tuple[str, str, float], Path] = {}

    def get(family: str, reward: str, p_answer: float) -> Path:
        key = (family, reward, p_answer)
        if key not in built:
            target = root / f"{family}_{reward}_{len(built)}"
            built[key] = script_model(sources[family](), target, SCRIPTED_ANSWERS[reward], p_answer)
        return built[key]

    return get


def number_game_rows(count: int, seed: int) -> list[dict]:
    """Rows shaped as EasyR1's Android GUI data (yuehua-s/numbergame): a phone-shaped screenshot (90 x 200) with a
    traffic light at the top and three numbered cards, `problem` "<image>", `answer` the card position as text.
    The right card is always the middle one ("1"), so the scripted model's answer is right on every row (as the
    shapes and sevens stand-ins are): the light and the numbers vary, the rule then puts the right one in the middle."""
    import io
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    lights = {"green": (40, 200, 60), "red": (220, 40, 40), "yellow": (240, 200, 30)}
    rows = []
    for _ in range(count):
        light = rng.choice(sorted(lights))
        low, mid, high = sorted(rng.sample(range(1, 100), 3))
        outer = [low, high]
        rng.shuffle(outer)
        # green: the largest in the middle; red: the smallest; yellow: the middle one
        middle = {"green": high, "red": low, "yellow": mid}[light]
        rest = [n for n in (low, mid, high) if n != middle]
        rng.shuffle(rest)
        cards = [rest[0], middle, rest[1]]
        image = Image.new("RGB", (90, 200), (245, 245, 245))
        draw = ImageDraw.Draw(image)
        for slot, name in enumerate(("red", "yellow", "green")):
            fill = lights[name] if name == light else (90, 90, 90)
            draw.ellipse((30 + slot * 12 - 5, 15, 30 + slot * 12 + 5, 25), fill=fill)
        for slot, number in enumerate(cards):
            draw.rectangle((5 + slot * 28, 90, 29 + slot * 28, 130), outline=(0, 0, 0), fill=(255, 255, 255))
            draw.text((10 + slot * 28, 104), str(number), fill=(0, 0, 0))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        rows.append({"problem": "<image>", "answer": "1", "images": [{"bytes": buffer.getvalue(), "path": None}]})
    return rows


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Callable[[str], tuple[str, str]]:
    """Data kind -> (train_files, val_files) of the shrunk runs, written on first use.

    text: the built-in arithmetic problems (rows `problem`, `answer`, as EasyR1's math12k and dapo17k);
    vision: the first 64 / 16 rows of the built-in shapes task (`problem` with an `<image>` placeholder, `answer`,
    one picture in `images`, as geometry3k, clevr_count_70k and GEOQA_8K_R1V): EasyR1's config filters overlong
    prompts, which measures every row through the processor (a minute for the 1024 rows of shapes@train here);
    multi_image: rows of two shapes pictures each (the question is about the first), as journeybench-multi-image-vqa;
    numbergame: phone-shaped screenshots of EasyR1's Android number game (`number_game_rows`), as yuehua-s/numbergame;
    sevens: tests/data/easyr1_examples/sevens, small sums and differences that all equal 7, the stand-in for dapo17k:
    dapo.py's filter key is the accuracy, and a model that cannot read the problem is right only where every
    answer is the same."""
    import datasets

    from easyrl.data.synthetic import load_builtin

    root = tmp_path_factory.mktemp("easyr1_examples_data")
    shapes = functools.cache(lambda split: load_builtin(f"builtin://shapes@{split}"))

    def save(name: str, splits: dict[str, list[dict]]) -> tuple[str, str]:
        folder = root / name
        datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()}).save_to_disk(str(folder))
        return f"{folder}@train", f"{folder}@test"

    def pairs(rows: list[dict]) -> list[dict]:
        return [
            {
                "problem": first["problem"].replace("<image>", "<image><image>").replace("picture", "first picture"),
                "answer": first["answer"],
                "images": first["images"] + second["images"],
            }
            for first, second in zip(rows[0::2], rows[1::2])
        ]

    kinds = {
        "text": lambda: ("builtin://arithmetic_small@train", "builtin://arithmetic_small@test"),
        "vision": lambda: save("shapes", {"train": shapes("train")[:64], "test": shapes("test")[:16]}),
        "multi_image": lambda: save(
            "multi_image", {"train": pairs(shapes("train")[:128]), "test": pairs(shapes("test")[:32])}
        ),
        "numbergame": lambda: save(
            "numbergame", {"train": number_game_rows(64, seed=0), "test": number_game_rows(16, seed=1)}
        ),
        "sevens": lambda: (f"{SEVENS}@train", f"{SEVENS}@test"),
    }
    return functools.cache(lambda kind: kinds[kind]())


# The Android GUI prompt spells out the game's rules: ~260 tokens before the screenshot's
PROMPT_LENGTHS = {"qwen2_5_vl_3b_android_gui_grpo": 384}


def tiny_overrides(example: Example, full: RunPlan, model_path: Path, data: tuple[str, str]) -> list[str]:
    """The arguments appended to the example's command line to run it on a CPU in seconds per step.

    Sizes shrink with their ratios kept: the prompts of a step are global_batch_size x (optimizer steps per batch,
    at most 4) with global_batch_size 2, generated in mini-batches of the same fraction of them as the recipe's;
    the group size n is the recipe's. 2 workers where the recipe has several GPUs (tensor parallel size capped at 2),
    1 where it has one. Lengths: prompts up to 160 (text) / 192 (with pictures) tokens, responses 24 tokens (the
    recipe's response/prompt length ratio is not kept: the scripted answers are at most 14 tokens). fp32 where the
    recipe does not ask for bf16. The rest as in tests/fixtures/trainer_runs.py: small KV cache, scoring in the
    driver, no progress bars."""
    config = full.config
    world = min(full.world_size, 2)
    steps_per_batch = min(full.actor_optimizer_steps_per_batch, 4)
    global_batch = 2
    rollout_batch = global_batch * steps_per_batch
    args = [
        f"data.train_files={data[0]}",
        f"data.val_files={data[1]}",
        f"data.rollout_batch_size={rollout_batch}",
        f"worker.actor.global_batch_size={global_batch}",
        f"data.max_prompt_length={PROMPT_LENGTHS.get(example.name, 192 if example.vision else 160)}",
        "data.max_response_length=24",
        f"worker.actor.model.model_path={model_path}",
        f"worker.rollout.tensor_parallel_size={min(config.worker.rollout.tensor_parallel_size, world)}",
        f"trainer.n_gpus_per_node={world}",
        "trainer.max_steps=2",
        "worker.rollout.dtype=fp32",
        f"worker.rollout.kv_cache_memory_bytes={128 * 2**20 if example.vision else 64 * 2**20}",
        "worker.rollout.disable_tqdm=true",
        "worker.reward.num_cpus=0",
    ]
    if config.data.mini_rollout_batch_size is not None:
        fraction = config.data.mini_rollout_batch_size / config.data.rollout_batch_size
        args.append(f"data.mini_rollout_batch_size={max(1, round(rollout_batch * fraction))}")
    if example.vision:  # 28x28 to 112x112 pictures: at most 16 vision tokens each (EasyR1: 512x512 to 2048x2048)
        args += ["data.min_pixels=784", "data.max_pixels=12544"]
    if config.worker.actor.fsdp.torch_dtype != "bf16":
        args += ["worker.actor.fsdp.torch_dtype=fp32", "worker.actor.fsdp.mp_param_dtype=fp32"]
    args += ["worker.ref.fsdp.torch_dtype=fp32", "worker.ref.fsdp.mp_param_dtype=fp32"]
    # wandb and swanlab need accounts (and a network): their place is taken by the file logger, which the test reads
    loggers = [name for name in config.trainer.logger if name not in ("wandb", "swanlab", "mlflow")]
    args.append(f"trainer.logger=[{','.join(dict.fromkeys([*loggers, 'file']))}]")
    kwargs = config.worker.reward.reward_function_kwargs
    if "max_response_length" in kwargs:  # DAPO's overlong penalty, scaled to the tiny response length
        buffer = round(24 * kwargs["overlong_buffer_length"] / kwargs["max_response_length"])
        args.append(
            "worker.reward.reward_function_kwargs="
            + json.dumps({**kwargs, "max_response_length": 24, "overlong_buffer_length": buffer})
        )
    return args


def _reward_name(config) -> str:
    return Path(config.worker.reward.reward_function.split(":")[0]).stem


def _data_kind(example: Example) -> str:
    if example.name == "qwen3_14b_dapo17k_dapo":
        return "sevens"
    if example.name == "qwen2_5_vl_7b_multi_image":
        return "multi_image"
    if example.name == "qwen2_5_vl_3b_android_gui_grpo":
        return "numbergame"
    return "vision" if example.vision else "text"


def _answer_probability(plan: RunPlan) -> float:
    """1/2; with online filtering, the p that leaves a group of n samples without any answer with probability 1/4
    ((1 - p)^n = 1/4), so that the filter drops some groups and keeps most (a group with no answer scores 0)."""
    if not plan.config.algorithm.online_filtering:
        return 0.5
    return 1.0 - 0.25 ** (1.0 / plan.config.worker.rollout.n)


def _family(example: Example) -> str:
    if not example.vision:
        return "text"
    if example.name.startswith("qwen3_vl"):
        return "qwen3_vl_moe" if "A3B" in dict(a.split("=", 1) for a in example.args)[MODEL_KEY] else "qwen3_vl"
    return "qwen2_5_vl"


def run_example(
    example: Example, scripted_models, tiny_data, tmp_path: Path
) -> tuple[dict[int, dict], RunPlan, float]:
    """Train the shrunk example 2 steps in `python -m easyrl train`; (metrics by step, its plan, wall seconds)."""
    from tests.fixtures.trainer_runs import metrics_by_step, run_training

    full = load_run_plan(command_line(example, *RUN_WITH.get(example.name, ())))
    model = scripted_models(_family(example), _reward_name(full.config), _answer_probability(full))
    save_dir = tmp_path / "checkpoints"
    args = command_line(
        example,
        *RUN_WITH.get(example.name, ()),
        *tiny_overrides(example, full, model, tiny_data(_data_kind(example))),
        f"trainer.save_checkpoint_path={save_dir}",
    )
    tiny = load_run_plan(args)  # what the run will do, checked before it starts
    start = time.monotonic()
    run_training(args, tmp_path / "train.log", timeout=RUN_TIMEOUT_S)
    wall_s = time.monotonic() - start
    print(f"\n{example.name}: 2 steps (with validation and the final checkpoint) in {wall_s:.0f} s")
    return metrics_by_step(save_dir), tiny, wall_s


def assert_recipe_ran(example: Example, metrics: dict[int, dict], plan: RunPlan) -> None:
    """Finite losses at both steps, and the metrics that show the recipe's own pieces ran (and no others)."""
    assert {1, 2} <= set(metrics), sorted(metrics)
    algorithm = plan.config.algorithm
    for step in (1, 2):
        row = metrics[step]
        losses = {key: value for key, value in row.items() if key.endswith("_loss")}
        assert "actor/pg_loss" in losses, sorted(row)
        assert all(math.isfinite(value) for value in losses.values()), losses
        assert math.isfinite(row["actor/entropy"]) and math.isfinite(row["reward/overall"])
        assert ("actor/kl_loss" in row) == plan.kl_loss, sorted(row)
        assert ("reward/kl_penalty" in row) == plan.kl_in_reward, sorted(row)
        assert ("actor/kl_coef" in row) == plan.kl_loss and ("reward/kl_coef" in row) == plan.kl_in_reward
        assert ("timing/old_log_probs" in row) == (not plan.on_policy), sorted(row)
        # the scripted answers differ within groups: the advantages are not all 0 and the policy gets a gradient
        assert row["actor/grad_norm"] > 0.0, f"step {step}: no gradient reached the policy"
        if algorithm.online_filtering:
            # at least the planned generation calls, every generated group either kept or dropped
            assert row["filter/rounds"] >= plan.generation_rounds_per_step, row["filter/rounds"]
            generated = row["filter/rounds"] * plan.generation_batch_size
            counted = sum(row[f"filter/{key}"] for key in ("kept_groups", "surplus_groups", "dropped_groups"))
            assert counted == generated, row
            assert row["filter/kept_groups"] == plan.config.data.rollout_batch_size, row  # what the step trained
        if algorithm.filter_key != "overall":
            assert f"reward/{algorithm.filter_key}" in row, sorted(row)
        if "overlong_buffer_length" in plan.config.worker.reward.reward_function_kwargs:
            assert math.isfinite(row["reward/overlong"]), sorted(row)  # dapo.py got its keyword arguments
    if algorithm.online_filtering:
        # a quarter of the groups have no answer at all (mean score 0 <= filter_low): some must have been dropped
        assert metrics[1]["filter/dropped_low"] + metrics[2]["filter/dropped_low"] > 0, "the filter dropped nothing"
    validated = [key for key in metrics[2] if key.startswith("val/")]
    assert validated, "no validation after the last step"
    if plan.config.trainer.val_before_train:
        assert any(key.startswith("val/") for key in metrics.get(0, {})), "no validation before training"
        assert metrics[0]["timing/validation"] > 0  # timed as the validations after steps are


def _check_example_runs(example: Example, scripted_models, tiny_data, tmp_path: Path, record_property) -> None:
    metrics, plan, wall_s = run_example(example, scripted_models, tiny_data, tmp_path)
    record_property("wall_s", round(wall_s, 1))
    assert_recipe_ran(example, metrics, plan)


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
@pytest.mark.parametrize("name", DEFAULT_SUITE_RUNS)
def test_example_trains_two_steps_on_cpu(name, scripted_models, tiny_data, tmp_path, record_property):
    _check_example_runs(BY_NAME[name], scripted_models, tiny_data, tmp_path, record_property)


# Examples check accepts that do not run yet: the failure, found by these runs, is easyrl's to fix.
KNOWN_FAILURES: dict[str, str] = {}


def _slow_run_params() -> list:
    return [
        pytest.param(
            example,
            id=example.name,
            marks=[pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=KNOWN_FAILURES[example.name])]
            if example.name in KNOWN_FAILURES
            else [],
        )
        for example in RUNS
        if example.name not in DEFAULT_SUITE_RUNS
    ]


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
@pytest.mark.parametrize("example", _slow_run_params())
def test_every_example_that_runs_trains_two_steps_on_cpu(
    example, scripted_models, tiny_data, tmp_path, record_property
):
    _check_example_runs(example, scripted_models, tiny_data, tmp_path, record_property)

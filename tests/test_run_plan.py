"""The run plan: every decision about a run is made once, before Ray starts, and a config that passes check runs.

The decision grid (KL off / KL loss / KL in the reward) x (on-policy / not) x (critic or not) is asserted on the
plan, and the same grid runs one real training step (the tiny model, one worker, vLLM) so that a plan that passes
never fails in the workers; the default suite runs a covering subset, the full grid is marked slow.
"""

import itertools
import math
import subprocess
import sys

import pytest

from easyrl.config import ConfigError, load_run_plan
from easyrl.testing.tiny_models import build_tiny_reward_model
from tests.fixtures.trainer_runs import REPO_ROOT, TINY_RUN_OVERRIDES, metrics_by_step, train_args


BASE = [
    "worker.actor.model.model_path=builtin://SmolLM2-135M-Instruct",
    "worker.reward.reward_function=reward_function/arithmetic.py:compute_score",
    "data.train_files=builtin://arithmetic_small@train",
    "data.rollout_batch_size=4",
    "worker.actor.global_batch_size=4",
    "worker.rollout.n=4",
    "worker.rollout.tensor_parallel_size=1",
    "trainer.n_gpus_per_node=1",
]
KL_MODES = {
    "off": ["algorithm.disable_kl=true"],
    "loss": ["algorithm.disable_kl=false", "algorithm.use_kl_loss=true"],
    "reward": ["algorithm.disable_kl=false", "algorithm.use_kl_loss=false"],
}
# on-policy: one optimizer step per batch; off-policy: two mini-batches per batch
POLICY_MODES = {"on": ["worker.actor.global_batch_size=4"], "off": ["worker.actor.global_batch_size=2"]}
CRITIC_MODES = {
    "critic": ["algorithm.adv_estimator=gae", "worker.critic.global_batch_size=4"],
    "no_critic": ["algorithm.adv_estimator=grpo"],
}
GRID = list(itertools.product(KL_MODES, POLICY_MODES, CRITIC_MODES))


def _grid_overrides(kl: str, policy: str, critic: str) -> list[str]:
    return KL_MODES[kl] + POLICY_MODES[policy] + CRITIC_MODES[critic]


# ----------------------------------------------------------------------------------------------------------------------
# decisions
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kl", "policy", "critic"), GRID)
def test_plan_decides_roles_kl_and_the_old_log_prob_pass(kl, policy, critic):
    plan = load_run_plan(BASE + _grid_overrides(kl, policy, critic))
    assert plan.use_reference == (kl != "off")
    assert plan.kl_in_reward == (kl == "reward")
    assert plan.kl_loss == (kl == "loss")
    assert plan.use_critic == (critic == "critic")
    assert plan.worker_role == ("actor_rollout" if kl == "off" else "actor_rollout_ref")
    # the in-reward KL reads the old log-probs before the update: their pass can never be skipped then
    assert plan.on_policy == (policy == "on" and kl != "reward")
    assert plan.actor_optimizer_steps_per_batch == (1 if policy == "on" else 2)


def test_recompute_old_log_probs_forces_the_pass_and_ppo_epochs_too():
    assert not load_run_plan(BASE + ["algorithm.disable_kl=true", "algorithm.recompute_old_log_probs=true"]).on_policy
    assert not load_run_plan(BASE + ["algorithm.disable_kl=true", "worker.actor.ppo_epochs=2"]).on_policy
    assert load_run_plan(BASE + ["algorithm.disable_kl=true"]).on_policy


def test_dropout_forces_the_old_log_prob_pass():
    """The update's forward runs in train mode, where peft drops the adapters' inputs: with its detached log-probs as
    the old ones, the engine-vs-trainer check read 0.068 instead of 4e-6 after one update, as if the sync were broken."""
    lora = ["algorithm.disable_kl=true", "worker.actor.model.lora.rank=4"]
    assert load_run_plan(BASE + lora).on_policy
    plan = load_run_plan(BASE + lora + ["worker.actor.model.lora.dropout=0.1"])
    assert not plan.on_policy and "worker.actor.model.lora.dropout=0.1" in plan.old_log_prob_reason
    # the model's own dropout, switched on through its config
    plan = load_run_plan(
        BASE + ["algorithm.disable_kl=true", "worker.actor.model.override_config={attention_dropout: 0.1}"]
    )
    assert not plan.on_policy and "override_config.attention_dropout=0.1" in plan.old_log_prob_reason
    assert load_run_plan(
        BASE + ["algorithm.disable_kl=true", "worker.actor.model.override_config={attention_dropout: 0.0}"]
    ).on_policy


def test_the_plan_says_what_lora_trains_and_how_the_engine_gets_it():
    def lora_line(*overrides):
        lines = load_run_plan(BASE + ["worker.actor.model.lora.rank=8", *overrides]).describe().splitlines()
        return next(line for line in lines if line.startswith("LoRA: "))

    line = lora_line("worker.actor.model.lora.target_modules=[q_proj,v_proj]", "worker.actor.model.lora.lr=1e-3")
    assert line.startswith("LoRA: rank 8, alpha 64, on q_proj,v_proj; learning rate 0.001;")
    assert "vision tower stays frozen (lora.vision_tower: false)" in line and "lora_sync=auto" in line
    line = lora_line("worker.actor.model.lora.vision_tower=true", "worker.rollout.lora_sync=merged")
    assert "gets adapters too" in line and "the merged weights (a full-model sync)" in line
    assert not any(line.startswith("LoRA") for line in load_run_plan(BASE).describe().splitlines())


def test_mini_rollout_batches_plan_generation_rounds_and_steps_per_rollout_batch():
    # EasyR1's DAPO recipe: mini-batches of 32 prompts until 512 are collected; steps count rollout batches
    plan = load_run_plan(BASE + ["data.rollout_batch_size=8", "data.mini_rollout_batch_size=2"])
    assert (plan.generation_batch_size, plan.generation_rounds_per_step) == (2, 4)
    # a loader of 40 mini-batches of 2 prompts = 80 prompts per epoch = 10 steps of 8 prompts per epoch
    assert plan.with_training_steps(40).training_steps == 10 * plan.config.trainer.total_epochs
    assert plan.config.worker.actor.optim.training_steps == 10 * plan.config.trainer.total_epochs
    # a mini-batch that does not divide the rollout batch: 6 batches of 3 prompts per epoch, two a step (4 prompts)
    # make 3 steps; counting 18 prompts // 4 gave 4, and total_epochs=1 ran into a second pass
    one_epoch = ["data.rollout_batch_size=4", "data.mini_rollout_batch_size=3", "trainer.total_epochs=1"]
    assert load_run_plan(BASE + one_epoch).with_training_steps(6).training_steps == 3
    # with online filtering the rounds vary with what is kept: counted by prompts, as EasyR1 counts them
    filtered = load_run_plan(BASE + one_epoch + ["algorithm.online_filtering=true"])
    assert filtered.with_training_steps(6).training_steps == 4


def test_settings_a_switch_turns_off_are_noted_together():
    """kl_coef with disable_kl=true, filter bounds without online filtering, validation keys without validation
    data: each was accepted without a word, so two runs differing in them looked like an experiment."""
    notes = load_run_plan(
        BASE
        + [
            "algorithm.disable_kl=true",
            "algorithm.kl_coef=0.5",
            "algorithm.filter_low=0.2",
            "trainer.max_try_make_batch=5",
            "data.val_files=",
            "trainer.val_freq=2",
        ]
    ).notes
    assert (
        "algorithm.kl_coef=0.5: algorithm.disable_kl=true turns every KL term off, so this setting does nothing. "
        "Set algorithm.disable_kl=false for a KL penalty or loss." in notes
    )
    assert any(
        n.startswith("algorithm.filter_low=0.2, trainer.max_try_make_batch=5: algorithm.online_filtering")
        for n in notes
    )
    assert any(n.startswith("trainer.val_freq=2: data.val_files is empty (no validation), so this") for n in notes)
    # the same keys where their switch is on are read, and nothing is said
    on = load_run_plan(BASE + ["algorithm.kl_coef=0.5", "algorithm.online_filtering=true", "algorithm.filter_low=0.2"])
    assert not any("do nothing" in n or "does nothing" in n for n in on.notes)


def test_judge_settings_the_chosen_kind_does_not_read_are_noted(tiny_model_path, tmp_path):
    """A classifier's prompt_template (even a missing file), a vllm judge's base_url and timeout_s, an http judge's
    model_path, any judge key with kind none: accepted without a word, though the judge never reads them."""
    reward_model = build_tiny_reward_model(tmp_path / "rm")
    judge, server = "worker.reward.judge.", "worker.reward.judge.base_url=http://127.0.0.1:9/v1"
    why = "so {} nothing. docs/config.md says which judge kind reads each key."

    def judge_notes(*overrides: str) -> list[str]:
        with_judge = [] if f"{judge}kind=none" in overrides else ["worker.reward.rule_weight=0.5"]
        notes = load_run_plan(BASE + with_judge + list(overrides)).notes
        return [note for note in notes if "worker.reward.judge.kind=" in note]

    classifier = [f"{judge}kind=classifier", f"{judge}model_path={reward_model}", f"{judge}max_length=512"]
    assert judge_notes(*classifier, f"{judge}prompt_template={tmp_path / 'absent.jinja'}") == [
        f"worker.reward.judge.prompt_template={tmp_path / 'absent.jinja'}: worker.reward.judge.kind=classifier scores "
        f"with a reward model, with no judge prompt and no reply to read, {why.format('this setting does')}"
    ]
    engine = [f"{judge}kind=vllm", f"{judge}model_path={tiny_model_path}", f"{judge}kv_cache_memory_bytes=67108864"]
    assert judge_notes(*engine, server, f"{judge}timeout_s=5", f"{judge}max_tokens=24") == [
        "worker.reward.judge.base_url=http://127.0.0.1:9/v1, worker.reward.judge.timeout_s=5.0: "
        "worker.reward.judge.kind=vllm runs its own engine of model_path, with no server and no request deadline, "
        + why.format("these settings do")
    ]
    http = [f"{judge}kind=http", server, f"{judge}model=judge", f"{judge}timeout_s=5", f"{judge}concurrency=4"]
    assert judge_notes(*http, f"{judge}model_path={tiny_model_path}") == [
        f"worker.reward.judge.model_path={tiny_model_path}: worker.reward.judge.kind=http asks a server for each "
        f"grade and loads no model, {why.format('this setting does')}"
    ]
    assert judge_notes(f"{judge}kind=none", server) == [
        "worker.reward.judge.base_url=http://127.0.0.1:9/v1: worker.reward.judge.kind=none turns the judge off, "
        + why.format("this setting does")
    ]
    # the keys each kind reads, and the defaults of the others, are not noted
    assert judge_notes(*classifier) == judge_notes(*engine) == judge_notes(*http) == []


def test_max_steps_sets_the_step_count_outright_as_in_easyr1():
    plan = load_run_plan(BASE + ["trainer.max_steps=7", "trainer.total_epochs=1"])
    assert plan.with_training_steps(3).training_steps == 7  # more than one epoch: the data is cycled


def test_the_actors_schedule_spans_the_steps_after_the_critic_warmup():
    """The actor's scheduler advances only on the steps that update it: a cosine schedule over every step of the run
    would end at 0.105 of the peak (100 steps, warm-up 20), not at its floor."""
    from torch import nn, optim

    from easyrl.workers.optim import build_lr_scheduler

    overrides = ["trainer.max_steps=100", "algorithm.adv_estimator=gae", "trainer.critic_warmup=20"]
    overrides += ["worker.critic.global_batch_size=4"]
    plan = load_run_plan(BASE + overrides + ["worker.actor.optim.lr_scheduler_type=cosine"]).with_training_steps(3)
    actor, critic = plan.config.worker.actor.optim, plan.config.worker.critic.optim
    assert (plan.training_steps, actor.training_steps, critic.training_steps) == (100, 80, 100)
    assert "the schedule spans the actor's 80 steps" in plan.describe()
    optimizer = optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    scheduler = build_lr_scheduler(optimizer, actor, "worker.actor.optim")
    rates = []
    for _ in range(80):  # the actor's updates, steps 21-100
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[0] == 1.0 and rates[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 79 / 80)))
    assert rates[-1] < 0.001


def test_the_plan_says_how_many_prompts_a_validation_runs_and_that_a_resumed_run_does_not_validate_first(
    tiny_model_path, tmp_path
):
    from easyrl.trainer.main import prepare_run_data

    val_file = tmp_path / "val.jsonl"
    val_file.write_text("".join(f'{{"problem": "What is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(5)))
    args = [
        *TINY_RUN_OVERRIDES,
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.n_gpus_per_node=1",
        f"data.val_files={val_file}",
        "trainer.val_before_train=true",
        "trainer.val_freq=2",
    ]
    plan = prepare_run_data(load_run_plan(args)).plan
    assert plan.validation_prompts == 5

    def schedule(start_step: int) -> str:
        return next(line for line in plan.describe(start_step).splitlines() if line.startswith("validation: "))

    assert schedule(0) == "validation: before training, every 2 steps, at the end (5 prompts each time)"
    assert schedule(3) == (
        "validation: not before training (it resumes after step 3), every 2 steps, at the end (5 prompts each time)"
    )
    # before the data is read (easyrl check) the size is not known and not guessed
    assert "\nvalidation: before training, every 2 steps, at the end\n" in load_run_plan(args).describe()
    assert "prompts each time" not in load_run_plan(args).describe()


def test_too_little_data_for_one_step_is_an_error_naming_the_keys():
    plan = load_run_plan(BASE + ["data.rollout_batch_size=8", "data.mini_rollout_batch_size=2"])
    with pytest.raises(ValueError, match="rollout_batch_size"):
        plan.with_training_steps(3)


def test_validation_runs_at_the_end_whatever_val_freq_says():
    plan = load_run_plan(BASE + ["data.val_files=builtin://arithmetic_small@test", "trainer.val_freq=-1"])
    assert plan.validate_at_end
    assert "at the end" in plan.describe()
    assert not load_run_plan(BASE + ["data.val_files="]).validate_at_end


def test_a_reference_below_the_actors_fp32_is_noted_where_kl_is_on():
    """The reference loads in bf16 unless told (EasyR1's default); beside an fp32 actor the KL of the first step,
    before any update, was 1e-3 of rounding in the CPU demo with KL switched on."""
    fp32_actor = ["worker.actor.fsdp.torch_dtype=fp32", "worker.actor.fsdp.mp_param_dtype=fp32"]
    kl_on = ["algorithm.disable_kl=false", "algorithm.use_kl_loss=true"]
    notes = load_run_plan(BASE + fp32_actor + kl_on).notes
    assert any(
        "the actor computes in fp32 and the reference in bf16 (worker.ref.fsdp: torch_dtype=None, mp_param_dtype=bf16)"
        in note
        for note in notes
    )
    fp32_ref = ["worker.ref.fsdp.torch_dtype=fp32", "worker.ref.fsdp.mp_param_dtype=fp32"]
    half_weights = ["worker.ref.fsdp.torch_dtype=bf16", "worker.ref.fsdp.mp_param_dtype=fp32"]
    assert any("reference in bf16" in note for note in load_run_plan(BASE + fp32_actor + kl_on + half_weights).notes)
    for quiet in (fp32_actor + kl_on + fp32_ref, fp32_actor + ["algorithm.disable_kl=true"], kl_on):
        assert not any("the actor computes in fp32" in note for note in load_run_plan(BASE + quiet).notes), quiet
    # the critic computes in bf16 unless told (its mp_param_dtype): its values are rounded beside an fp32 actor
    critic = [*CRITIC_MODES["critic"], *fp32_actor]
    assert any(
        "the actor computes in fp32 and the critic in bf16 (worker.critic.fsdp: torch_dtype=None, mp_param_dtype=bf16): "
        "its values and their gradients are rounded to bf16" in note
        for note in load_run_plan(BASE + critic).notes
    )
    fp32_critic = ["worker.critic.fsdp.mp_param_dtype=fp32"]
    assert not any("and the critic in" in note for note in load_run_plan(BASE + critic + fp32_critic).notes)
    # the CPU recipes give their reference the actor's fp32
    demo = load_run_plan([f"config={REPO_ROOT / 'examples' / 'smollm2_arithmetic_grpo.yaml'}", *kl_on])
    assert not any("the actor computes in fp32" in note for note in demo.notes)


def test_enforce_eager_false_runs_eagerly_on_a_machine_without_cuda_and_says_so():
    from easyrl.utils import device

    plan = load_run_plan(BASE + ["worker.rollout.enforce_eager=false"])
    if device.is_cuda_available():  # the compute switch and the config's torch-free probe agree
        assert plan.config.worker.rollout.enforce_eager is False
    else:
        assert plan.config.worker.rollout.enforce_eager is True
        assert any("enforce_eager" in note for note in plan.notes)


# ----------------------------------------------------------------------------------------------------------------------
# refusals: what check accepts runs
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("worker.actor.model.lora.alpha=0", "worker.actor.model.lora.alpha"),
        ("worker.actor.ulysses_size=8", "worker.actor.ulysses_size"),
        ("worker.actor.ulysses_sequence_parallel_size=2", "worker.actor.ulysses_size"),
        ("worker.hybrid_engine=false", "worker.hybrid_engine"),
        ("worker.actor.global_batch_size_per_device=3", "worker.actor.global_batch_size_per_device"),
        ("worker.rollout.prompt_length=3", "worker.rollout.prompt_length"),
        ("data.mini_rollout_batch_size=0", "data.mini_rollout_batch_size"),
        ("data.max_pixels=3000", "data.min_pixels"),
        ("worker.rollout.max_model_len=40", "worker.rollout.max_model_len"),  # shorter than a kept prompt
    ],
)
def test_check_refuses_what_the_workers_cannot_run_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_run_plan(BASE + [override])


@pytest.mark.parametrize("estimator", ["grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline"])
def test_group_estimators_refuse_one_sample_per_prompt(estimator):
    # with n=1 every group-relative advantage is 0: the run would train on nothing
    with pytest.raises(ConfigError, match="worker.rollout.n"):
        load_run_plan(BASE + [f"algorithm.adv_estimator={estimator}", "worker.rollout.n=1"])


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "remax", "gae"])
def test_estimators_without_groups_accept_one_sample(estimator):
    plan = load_run_plan(
        BASE + [f"algorithm.adv_estimator={estimator}", "worker.rollout.n=1", "worker.critic.global_batch_size=4"]
    )
    assert plan.config.worker.rollout.n == 1


def test_check_names_match_the_registries():
    from easyrl.algorithms import advantage, kl, policy_loss
    from easyrl.config import validate
    from easyrl.trainer import loggers

    assert validate.ADV_ESTIMATORS == tuple(advantage.list_adv_estimators())
    assert validate.POLICY_LOSSES == tuple(policy_loss.list_policy_losses())
    assert validate.KL_PENALTIES == tuple(kl.list_kl_penalties())
    assert validate.LOGGER_NAMES == tuple(sorted(loggers.LOGGERS))


def test_check_prints_the_plan():
    out = subprocess.run(
        [sys.executable, "-m", "easyrl", "check", *BASE, "algorithm.disable_kl=false"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "# run plan" in out.stdout
    assert "roles: actor, rollout, ref" in out.stdout
    # the estimator, the aggregation and the coefficient, not only where the KL goes
    assert "policy loss: ppo (token-mean), KL: kl in the reward (coefficient 0.001, fixed)" in out.stdout
    assert "old log-probs: computed (the in-reward KL penalty reads them before the update)" in out.stdout
    as_loss = load_run_plan(
        [
            *BASE,
            *KL_MODES["loss"],
            "algorithm.kl_penalty=low_var_kl",
            "algorithm.kl_coef=0.04",
            "worker.actor.loss_avg_mode=seq",
        ]
    ).describe()
    assert "policy loss: ppo (seq-mean-token-mean), KL: low_var_kl as an actor loss (coefficient 0.04)" in as_loss


# ----------------------------------------------------------------------------------------------------------------------
# the same grid, run: one real step each
# ----------------------------------------------------------------------------------------------------------------------
# (kl, policy, critic) together touching every value of every axis, and the step-1 crash of the default KL setting
COVERING = [("reward", "on", "no_critic"), ("loss", "off", "critic"), ("off", "on", "critic")]


def _run_one_step(tiny_model_path, tmp_path, kl, policy, critic) -> dict:
    from easyrl.trainer.main import build_trainer

    save_dir = tmp_path / f"{kl}_{policy}_{critic}"
    overrides = TINY_RUN_OVERRIDES + _grid_overrides(kl, policy, critic)
    overrides += [
        "trainer.n_gpus_per_node=1",
        "trainer.max_steps=1",
        "trainer.find_last_checkpoint=false",
        "trainer.save_model_only=true",
        "data.val_files=",
        "worker.critic.micro_batch_size_per_device_for_update=8",
        "worker.critic.fsdp.torch_dtype=fp32",
        "worker.critic.fsdp.mp_param_dtype=fp32",
    ]
    plan = load_run_plan(train_args(tiny_model_path, save_dir, overrides))
    trainer = build_trainer(plan)
    try:
        trainer.fit()
    finally:
        trainer.on_shutdown()
    return metrics_by_step(save_dir)[1]


def _assert_step_follows_the_plan(row: dict, kl: str, policy: str, critic: str) -> None:
    losses = [value for key, value in row.items() if key.endswith("_loss")]
    assert losses and all(math.isfinite(v) for v in losses), row
    assert math.isfinite(row["actor/pg_loss"])
    assert ("timing/old_log_probs" in row) == (policy == "off" or kl == "reward")
    assert ("reward/kl_penalty" in row) == (kl == "reward")
    assert ("actor/kl_loss" in row) == (kl == "loss")
    # each coefficient under its own name: the KL loss's in actor/, the in-reward beta in reward/
    assert ("actor/kl_coef" in row) == (kl == "loss") and ("reward/kl_coef" in row) == (kl == "reward"), sorted(row)
    assert ("critic/vf_loss" in row) == (critic == "critic")
    assert math.isfinite(row["actor/entropy"])
    assert "timing/sync_weights" in row


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("kl", "policy", "critic"), COVERING)
def test_a_step_runs_as_planned(ray_cluster, tiny_model_path, tmp_path, kl, policy, critic):
    _assert_step_follows_the_plan(_run_one_step(tiny_model_path, tmp_path, kl, policy, critic), kl, policy, critic)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("kl", "policy", "critic"), [combo for combo in GRID if combo not in COVERING])
def test_a_step_runs_as_planned_full_grid(ray_cluster, tiny_model_path, tmp_path, kl, policy, critic):
    _assert_step_follows_the_plan(_run_one_step(tiny_model_path, tmp_path, kl, policy, critic), kl, policy, critic)


def test_check_imports_no_torch_so_it_answers_in_well_under_two_seconds():
    code = (
        "import sys, easyrl.cli; code = easyrl.cli.main(['check', *sys.argv[1:]]); "
        "print('TORCH', 'torch' in sys.modules); sys.exit(code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *BASE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "TORCH False" in out.stdout


def test_the_driver_of_a_run_imports_neither_vllm_nor_peft(tiny_model_path):
    """The driver starts the workers; vLLM and peft load in them. Imported by the driver too (through the vllm judge's
    module, a dtype helper beside FSDP code, and the model config read through the FSDP module at every start), they
    cost every `easyrl train` and `easyrl sft` seconds at start."""
    code = (
        "import sys, easyrl.trainer.main as main, easyrl.trainer.ray_trainer, easyrl.trainer.sft_trainer; "
        "from easyrl.config import load_run_plan; "
        "main.load_model_side(load_run_plan(sys.argv[1:])); "
        "print('LOADED', sorted(name for name in ('vllm', 'peft') if name in sys.modules))"
    )
    args = [*BASE, f"worker.actor.model.model_path={tiny_model_path}"]
    out = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["algorithm.disable_kl=true"], "their update passes are skipped"),
        (["algorithm.disable_kl=false", "algorithm.use_kl_loss=true"], "computed (the KL loss"),
        (["algorithm.disable_kl=false", "algorithm.use_kl_loss=false"], "their update passes are skipped"),
        (["algorithm.disable_kl=true", "worker.actor.entropy_coef=0.01"], "computed (the entropy bonus"),
        (["algorithm.disable_kl=true", "worker.actor.skip_zero_advantage=false"], "skip_zero_advantage=false"),
    ],
)
def test_the_plan_says_whether_zero_advantage_samples_are_computed(overrides, expected):
    description = load_run_plan(BASE + overrides).describe()
    line = next(line for line in description.splitlines() if line.startswith("zero-advantage samples:"))
    assert expected in line


# ----------------------------------------------------------------------------------------------------------------------
# what the run reserves in Ray
# ----------------------------------------------------------------------------------------------------------------------
CRITIC_ON_TWO_WORKERS = BASE + CRITIC_MODES["critic"] + ["trainer.n_gpus_per_node=2"]


@pytest.mark.parametrize(
    "overrides, cores, expected",
    [
        (BASE, 2, 2 + 1),  # one worker with both cores, one reward actor
        (BASE + ["worker.reward.num_cpus=0"], 2, 2),
        (BASE + ["trainer.n_gpus_per_node=2", "worker.reward.num_cpus=3"], 8, 8 + 3),
        (CRITIC_ON_TWO_WORKERS, 2, 2 * 2 * 1 + 1),  # at least one core per worker of each group
        (CRITIC_ON_TWO_WORKERS, 16, 2 * 2 * 4 + 1),
        (
            BASE + ["worker.reward.judge.kind=vllm", "worker.reward.judge.model_path=builtin://SmolLM2-135M-Instruct"],
            2,
            2 + 1 + 1,
        ),
    ],
)
def test_the_cpus_a_run_reserves_count_workers_reward_actors_and_a_judge_engine(
    monkeypatch, overrides, cores, expected
):
    from easyrl.trainer.main import ray_cpus_needed

    monkeypatch.setattr("os.cpu_count", lambda: cores)
    plan = load_run_plan(overrides)
    assert ray_cpus_needed(plan) == expected


LOCAL_CLUSTER_PROBE = """
import os, sys
os.cpu_count = lambda: 2  # the machine the run plans for: 2 cores
import ray
from easyrl.config import load_run_plan
from easyrl.controller.resource_pool import ResourcePool
from easyrl.trainer.main import cpus_per_worker, init_ray
from easyrl.workers.reward.pool import RewardActorPool

plan = load_run_plan(sys.argv[2:])
init_ray(plan)
pool = ResourcePool.from_trainer_config(1, 2, max_colocate_count=2, cpus_per_worker=cpus_per_worker(plan, 2))
try:
    print("CPUS", ray.cluster_resources()["CPU"])
    pool.placement_groups()  # 2 bundles of 2 CPUs
    rewards = RewardActorPool(sys.argv[1], {}, num_actors=1, timeout_s=30, startup_timeout_s=60)
    rewards.wait_ready()
    print("REWARD ACTORS", rewards.num_actors)
    rewards.shutdown()
finally:
    pool.release()
    ray.shutdown()
"""


@pytest.mark.timeout(240)
def test_a_local_cluster_holds_every_reservation_of_a_critic_run_on_two_cores():
    """2 cores, actor and critic on 2 workers: the workers' bundles take 4 logical CPUs, and the reward actor one
    more. The local cluster used to have max(cores, 4) = 4, so the reward actor waited 300 s and failed. (A process
    of its own: the suite's cluster is already up in this one.)"""
    reward = str(REPO_ROOT / "reward_function" / "arithmetic.py") + ":compute_score"
    result = subprocess.run(
        [sys.executable, "-c", LOCAL_CLUSTER_PROBE, reward, *CRITIC_ON_TWO_WORKERS],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CPUS 5.0" in result.stdout and "REWARD ACTORS 1" in result.stdout


# ----------------------------------------------------------------------------------------------------------------------
# what `easyrl check` reads from files without running them
# ----------------------------------------------------------------------------------------------------------------------
def test_check_refuses_reward_kwargs_no_chosen_function_takes_reading_the_source(tmp_path):
    rewards = tmp_path / "rewards.py"
    rewards.write_text(
        "def score(reward_inputs, scale, offset=0.0):\n    return []\n\n"
        "def bonus(reward_inputs, *, bonus_weight=1.0):\n    return []\n\n"
        "def anything(reward_inputs, **kwargs):\n    return []\n"
    )

    def check(spec: str, *kwargs: str) -> None:
        load_run_plan([*BASE, f"worker.reward.reward_function={rewards}:{spec}", *kwargs])

    check("score", "+worker.reward.reward_function_kwargs.scale=2")
    with pytest.raises(ConfigError) as refusal:
        check("score", "+worker.reward.reward_function_kwargs.scael=2")
    # what the user may set, apart from the inputs easyrl passes
    assert str(refusal.value).endswith(
        "takes no such argument (it takes offset, scale; easyrl passes reward_inputs itself)."
    )
    verl = tmp_path / "verl_reward.py"
    verl.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0):\n    return 0\n"
    )
    with pytest.raises(
        ConfigError, match=r"\(it takes bonus; easyrl passes data_source, extra_info, ground_truth, solu"
    ):
        load_run_plan([*BASE, f"worker.reward.reward_function={verl}", "+worker.reward.reward_function_kwargs.bnus=1"])
    # combined functions: each key must be some function's
    check(
        "score,bonus",
        "+worker.reward.reward_function_kwargs.scale=2",
        "+worker.reward.reward_function_kwargs.bonus_weight=3",
    )
    with pytest.raises(ConfigError, match=r"\['other'\]: `score` nor `bonus`"):
        check("score,bonus", "+worker.reward.reward_function_kwargs.other=1")
    check("anything", "+worker.reward.reward_function_kwargs.whatever=1")  # **kwargs takes every name
    # an argument without a default that no key gives (the shipped dapo.py's max_response_length, say)
    with pytest.raises(ConfigError, match=r"`score` in .* needs `scale`, which has no default: give it in"):
        check("score")
    with pytest.raises(ConfigError, match=r"`format_weight:0.2` holds a colon: in YAML a mapping needs a space"):
        check("score", "worker.reward.reward_function_kwargs={format_weight:0.2}")


def test_a_function_taking_the_ground_truth_after_the_response_is_told_the_signatures_not_a_constant(tmp_path):
    """`def compute_score(response, ground_truth)`: the error advised reward_function_kwargs.ground_truth=..., one
    answer for every sample."""
    plain = tmp_path / "plain.py"
    plain.write_text("REWARD_TYPE = 'sequential'\n\ndef compute_score(response, ground_truth):\n    return 0.0\n")
    with pytest.raises(ConfigError) as error:
        load_run_plan([*BASE, f"worker.reward.reward_function={plain}:compute_score"])
    message = str(error.value)
    assert "takes `ground_truth` as an argument after its first, which easyrl fills from" in message
    assert (
        "write `def compute_score(reward_input)` and read reward_input['response'], reward_input['ground_truth']"
        in (message)
    )
    assert "reward_function_kwargs.ground_truth=" not in message


def test_check_refuses_a_load_checkpoint_path_that_does_not_exist(tmp_path):
    with pytest.raises(ConfigError, match=r"`trainer.load_checkpoint_path`: `.*nowhere` does not exist"):
        load_run_plan([*BASE, f"trainer.load_checkpoint_path={tmp_path / 'nowhere'}"])
    assert load_run_plan([*BASE, f"trainer.load_checkpoint_path={tmp_path}"]).config.trainer.load_checkpoint_path


def test_the_plan_notes_a_reward_length_limit_other_than_the_responses():
    dapo = [
        "worker.reward.reward_function=reward_function/dapo.py:compute_score",
        "+worker.reward.reward_function_kwargs.overlong_buffer_length=4",
        "+worker.reward.reward_function_kwargs.overlong_penalty_factor=1.0",
        "data.max_response_length=24",
    ]
    notes = load_run_plan([*BASE, *dapo, "+worker.reward.reward_function_kwargs.max_response_length=4096"]).notes
    assert any("max_response_length is 4096 and data.max_response_length 24" in note for note in notes)
    notes = load_run_plan([*BASE, *dapo, "+worker.reward.reward_function_kwargs.max_response_length=24"]).notes
    assert not any("max_response_length is" in note for note in notes)


def test_the_plan_notes_generation_rounds_that_overshoot_the_rollout_batch():
    notes = load_run_plan([*BASE, "data.mini_rollout_batch_size=3"]).notes
    assert any("each step generates 6 prompts' samples and trains on the first 4; the other 2" in n for n in notes)
    assert any("(reward/* and rollout/* count them too, critic/score/* and response_length/* only" in n for n in notes)
    for divides in (
        ["data.mini_rollout_batch_size=2"],
        ["data.mini_rollout_batch_size=3", "algorithm.online_filtering=true"],
    ):
        assert not any(
            "does not divide data.rollout_batch_size" in note for note in load_run_plan([*BASE, *divides]).notes
        )


ARITHMETIC = "reward_function/arithmetic.py:compute_score"


def test_the_plan_notes_a_kl_loss_that_disable_kl_turns_off():
    notes = load_run_plan([*BASE, "algorithm.disable_kl=true", "algorithm.use_kl_loss=true"]).notes
    assert any("algorithm.use_kl_loss=true asks for a KL loss, but algorithm.disable_kl=true" in n for n in notes)
    notes = load_run_plan([*BASE, *KL_MODES["loss"]]).notes
    assert not any("asks for a KL loss" in note for note in notes)


def test_the_plan_notes_a_k1_kl_loss_whose_expected_gradient_is_zero():
    notes = load_run_plan([*BASE, *KL_MODES["loss"], "algorithm.kl_penalty=kl"]).notes
    assert any("with algorithm.kl_penalty=kl: as a loss, the k1 estimate" in note for note in notes)
    for settings in (["algorithm.kl_penalty=low_var_kl"], ["algorithm.kl_penalty=kl", "algorithm.use_kl_loss=false"]):
        notes = load_run_plan([*BASE, *KL_MODES["loss"], *settings]).notes
        assert not any("the k1 estimate" in note for note in notes), settings


def test_the_plan_notes_a_cispo_weight_with_a_lower_bound():
    notes = load_run_plan([*BASE, "worker.actor.loss_type=cispo", "worker.actor.clip_ratio_low=0"]).notes
    assert any("importance weight is floored at 1 - clip_ratio_low = 1," in note for note in notes)
    for settings in (
        ["worker.actor.loss_type=cispo", "worker.actor.clip_ratio_low=1"],
        ["worker.actor.clip_ratio_low=0"],
    ):
        assert not any("floored" in note for note in load_run_plan([*BASE, *settings]).notes), settings


def test_the_plan_notes_an_adaptive_controller_that_a_kl_loss_does_not_read():
    notes = load_run_plan([*BASE, *KL_MODES["loss"], "algorithm.kl_type=adaptive"]).notes
    assert any("with algorithm.use_kl_loss=true the KL loss keeps algorithm.kl_coef=" in n for n in notes)
    for kl, kind in (("loss", "fixed"), ("reward", "adaptive"), ("reward", "fixed")):
        notes = load_run_plan([*BASE, *KL_MODES[kl], f"algorithm.kl_type={kind}"]).notes
        assert not any("algorithm.kl_type=adaptive steers" in note for note in notes), (kl, kind)


@pytest.mark.parametrize(("kl", "use"), [("reward", "a reward penalty"), ("loss", "a loss term")])
def test_the_plan_notes_a_reference_run_for_a_zero_kl_coefficient(kl, use):
    notes = load_run_plan([*BASE, *KL_MODES[kl], "algorithm.kl_coef=0"]).notes
    assert any(f"a reference model runs every step for {use} of 0 x KL" in note for note in notes)
    assert not any("kl_coef=0" in note for note in load_run_plan([*BASE, *KL_MODES[kl]]).notes)
    assert not any(
        "kl_coef=0" in note for note in load_run_plan([*BASE, *KL_MODES["off"], "algorithm.kl_coef=0"]).notes
    )


def test_the_plan_notes_a_critic_warmup_without_a_critic_which_only_freezes_the_actor():
    notes = load_run_plan([*BASE, *CRITIC_MODES["no_critic"], "trainer.critic_warmup=3"]).notes
    assert any(
        "trainer.critic_warmup=3 but the run has no critic (algorithm.adv_estimator=grpo learns no value model): the "
        "first 3 steps generate and score without updating the actor" in note
        for note in notes
    )
    plan = load_run_plan([*BASE, *CRITIC_MODES["critic"], "trainer.critic_warmup=3"])
    assert not any("critic_warmup" in note for note in plan.notes)
    # with a critic the warmup is the plan's, not a note: when the actor starts to learn
    assert (
        "critic warmup: steps 1-3 train the critic only; the actor's first update, and its learning-rate schedule, "
        "begin at step 4 (trainer.critic_warmup); the schedule spans the actor's remaining steps"
    ) in plan.describe().splitlines()
    assert "critic warmup" not in load_run_plan([*BASE, *CRITIC_MODES["critic"]]).describe()


def test_the_plan_notes_critic_settings_in_a_run_without_a_critic():
    critic_keys = [
        "worker.critic.optim.lr=3e-5",
        "worker.critic.cliprange_value=0.2",
        "worker.critic.global_batch_size=2",
    ]
    notes = load_run_plan([*BASE, *CRITIC_MODES["no_critic"], *critic_keys]).notes
    assert (
        "worker.critic.global_batch_size=2, worker.critic.optim.lr=3e-05, worker.critic.cliprange_value=0.2: "
        "algorithm.adv_estimator=grpo learns no value model, so the run has no critic and these settings do nothing. "
        "Set algorithm.adv_estimator=gae to train a critic."
    ) in notes
    # what the critic copies from the actor (its model), a run with a critic, and a plain run are not noted
    for args in (
        [*CRITIC_MODES["no_critic"], "worker.critic.model.model_path=builtin://SmolLM2-135M-Instruct"],
        [*CRITIC_MODES["critic"], *critic_keys],
        CRITIC_MODES["no_critic"],
    ):
        assert not any(
            "learns no value model, so the run has no critic" in n for n in load_run_plan([*BASE, *args]).notes
        )


def test_the_plan_notes_shared_prefixes_with_one_sample_per_prompt():
    note = "worker.actor.shared_prefix with worker.rollout.n=1: each prompt has one sample"
    one = ["algorithm.adv_estimator=reinforce_plus_plus", "worker.rollout.n=1", "worker.actor.global_batch_size=4"]
    shared = ["worker.actor.padding_free=true", "worker.actor.shared_prefix=true"]
    assert any(n.startswith(note) for n in load_run_plan([*BASE, *one, *shared]).notes)
    assert not any(n.startswith(note) for n in load_run_plan([*BASE, *shared]).notes)


def test_the_plan_notes_lora_settings_in_a_run_without_lora():
    notes = load_run_plan([*BASE, "worker.rollout.lora_sync=adapter", "worker.actor.model.lora.lr=1e-4"]).notes
    assert (
        "worker.actor.model.lora.lr=0.0001, worker.rollout.lora_sync=adapter: worker.actor.model.lora.rank=0 trains "
        "full weights, so these LoRA settings do nothing. Set worker.actor.model.lora.rank (e.g. 64) to train LoRA "
        "adapters."
    ) in notes
    lora = ["worker.actor.model.lora.rank=8", "worker.rollout.lora_sync=adapter", "worker.actor.model.lora.lr=1e-4"]
    for args in (lora, []):
        assert not any("trains full weights, so" in note for note in load_run_plan([*BASE, *args]).notes), args


def test_easyr1s_config_gets_no_lora_note_for_the_exclusion_it_ships_beside_rank_0(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # the config logs to W&B
    plan = load_run_plan(["config=tests/data/easyr1_config.yaml"])
    assert plan.config.worker.actor.model.lora.exclude_modules == ".*visual.*"
    assert not any("trains full weights, so" in note for note in plan.notes)


def test_the_plan_notes_a_run_without_loggers():
    note = "trainer.logger=[]: the run logs no metrics (no line per step, no metrics.jsonl, no curves)"
    assert any(n.startswith(note) for n in load_run_plan([*BASE, "trainer.logger=[]"]).notes)
    assert not any(n.startswith(note) for n in load_run_plan([*BASE, "trainer.logger=[file]"]).notes)


def test_a_critic_warmup_as_long_as_the_epochs_is_refused_once_the_steps_are_counted():
    plan = load_run_plan([*BASE, "trainer.total_epochs=2", "trainer.critic_warmup=4"])
    assert plan.with_training_steps(3).training_steps == 6  # 3 batches of 4 prompts x 2 epochs
    with pytest.raises(
        ConfigError, match=r"`trainer\.critic_warmup` is 4 and the run has 4 training steps \(2 steps per epoch"
    ):
        plan.with_training_steps(2)


def test_the_plan_gives_the_token_budget_of_dynamic_micro_batches():
    sizes = [
        "worker.actor.micro_batch_size_per_device_for_update=2",
        "worker.actor.micro_batch_size_per_device_for_experience=4",
        "data.max_prompt_length=100",
        "data.max_response_length=28",
    ]
    dynamic = load_run_plan([*BASE, *sizes, "worker.actor.dynamic_batching=true"]).describe()
    assert (
        "micro-batches of up to 256 (update) / 512 (log-probs) real tokens (dynamic batching: "
        "micro_batch_size_per_device_for_* x the padded length 128, prompt + response)"
    ) in dynamic
    fixed = load_run_plan([*BASE, *sizes, "worker.actor.dynamic_batching=false"]).describe()
    assert "micro-batches of 2 (update) / 4 (log-probs) samples" in fixed


def test_the_plan_says_what_the_reward_is_made_of():
    lines = load_run_plan(BASE).describe().splitlines()
    assert [line for line in lines if line.startswith("reward: ")] == [f"reward: {REPO_ROOT}/{ARITHMETIC}"]
    judge = [
        "worker.reward.judge.kind=http",
        "worker.reward.judge.base_url=http://127.0.0.1:9/v1",
        "worker.reward.judge.model=grader",
        "worker.reward.rule_weight=0.5",
        "worker.reward.judge.weight=2",
    ]
    described = load_run_plan([*BASE, *judge]).describe()
    assert f"reward: 0.5 x {REPO_ROOT}/{ARITHMETIC} + 2.0 x judge (http: grader at http://127.0.0.1:9/v1)" in described


def test_a_context_below_prompt_plus_response_is_noted_with_the_prompts_whose_responses_it_cuts():
    """vLLM stops a response where prompt and response fill worker.rollout.max_model_len (the engine's context): a
    setting below data.max_prompt_length + data.max_response_length runs, with shorter answers to long prompts."""
    lengths = ["data.max_prompt_length=64", "data.max_response_length=40"]
    assert not [note for note in load_run_plan(BASE + lengths).notes if "max_model_len" in note]
    notes = load_run_plan(BASE + [*lengths, "worker.rollout.max_model_len=70"]).notes
    assert [note for note in notes if "max_model_len" in note] == [
        "worker.rollout.max_model_len=70 is below data.max_prompt_length + data.max_response_length (64 + 40): a "
        "response stops where its prompt and it fill the 70-token context, before data.max_response_length for "
        "prompts longer than 30 tokens."
    ]
    with pytest.raises(ConfigError, match="max_model_len` \\(64\\) leaves no room"):
        load_run_plan(BASE + [*lengths, "worker.rollout.max_model_len=64"])


def test_the_plan_says_when_checkpoints_are_written_and_how_many_stay():
    """verl's trainer.save_freq=-1 saves nothing; easyrl's saves the last step (model and optimizer): a verl user's
    short runs filled a disk with checkpoints nothing said would be written."""
    plan = load_run_plan(BASE + ["trainer.save_freq=-1", "trainer.save_checkpoint_path=/ckpt/run"])
    lines = [line for line in plan.describe().splitlines() if line.startswith("checkpoints: ")]
    assert lines == [
        "checkpoints: after the last step (trainer.save_freq -1: that one only), at a stop signal; model and "
        "optimizer, in /ckpt/run, all kept (trainer.save_limit -1)"
    ]
    periodic = load_run_plan(
        BASE
        + ["trainer.save_freq=5", "trainer.save_every_minutes=30", "trainer.save_limit=2"]
        + ["trainer.save_model_only=true", "trainer.save_checkpoint_path=/ckpt/run"]
    )
    assert "checkpoints: every 5 steps, every 30 minutes, after the last step, at a stop signal; the model alone " in (
        periodic.describe()
    )
    assert "in /ckpt/run, the newest 2 kept" in periodic.describe()
    # EasyR1 reads any value <= 0 as -1; the plan quotes the value the user wrote
    zero = load_run_plan(BASE + ["trainer.save_freq=0", "trainer.save_limit=0"]).describe()
    assert "after the last step (trainer.save_freq 0: that one only)" in zero
    assert "all kept (trainer.save_limit 0)" in zero


def test_the_plan_names_remaxs_greedy_baseline_generation():
    """ReMax generates each prompt's greedy answer beside the samples (its baseline): a generate call the plan left out."""
    remax = load_run_plan(BASE + ["algorithm.adv_estimator=remax"]).describe()
    assert (
        "generated in 1 call(s) of 4 prompts, each followed by one greedy answer per prompt (ReMax's baseline" in remax
    )
    assert "greedy answer" not in load_run_plan(BASE).describe()


def test_the_plan_gives_the_critics_batches_beside_the_actors():
    """The critic's epochs, mini-batches and micro-batches were validated but never shown."""
    critic = [
        "algorithm.adv_estimator=gae",
        "worker.critic.global_batch_size=2",
        "worker.critic.ppo_epochs=3",
        "worker.critic.dynamic_batching=false",
        "worker.critic.micro_batch_size_per_device_for_update=2",
        "worker.critic.micro_batch_size_per_device_for_experience=4",
    ]
    lines = load_run_plan(BASE + critic).describe().splitlines()
    rollout_n = load_run_plan(BASE).config.worker.rollout.n
    assert (
        f"critic: 6 optimizer step(s) per training step, {2 * rollout_n} samples per device per optimizer step, "
        in ("\n".join(lines))
    )
    assert "micro-batches of 2 (update) / 4 (values) samples" in "\n".join(lines)
    assert not [line for line in load_run_plan(BASE).describe().splitlines() if line.startswith("critic:")]


def test_offload_on_a_machine_without_cuda_is_noted_as_moving_nothing():
    from easyrl.utils.platform import nvidia_gpus_visible

    plan = load_run_plan(
        BASE + ["worker.actor.fsdp.enable_cpu_offload=true", "worker.ref.offload.offload_params=true"]
    )
    notes = [note for note in plan.notes if "offloading to host memory" in note]
    if nvidia_gpus_visible():
        assert notes == []
    else:
        assert notes == [
            "worker.actor.fsdp.enable_cpu_offload, worker.ref.offload.offload_params: offloading to host memory is for "
            "GPUs; on a machine without CUDA the parameters and optimizer states are in host memory already, so "
            "nothing moves."
        ]
    assert not [note for note in load_run_plan(BASE).notes if "offloading" in note]
    # without a KL term no reference model runs: its offload key is not among those said to move nothing
    no_ref = load_run_plan(
        BASE
        + [
            "algorithm.disable_kl=true",
            "worker.ref.offload.offload_params=true",
            "worker.actor.offload.offload_params=true",
        ]
    )
    if not nvidia_gpus_visible():
        (note,) = [note for note in no_ref.notes if "offloading to host memory" in note]
        assert note.startswith("worker.actor.offload.offload_params: offloading")


def test_a_setting_the_chosen_estimator_or_loss_does_not_read_is_noted():
    """algorithm.gamma=0.99 beside grpo (or a SAPO temperature beside PPO's clip) changed nothing, silently."""
    plan = load_run_plan(
        BASE + ["algorithm.gamma=0.99", "algorithm.norm_adv_by_std_in_grpo=false", "worker.actor.tau_negative=2"]
    )
    unread = [note for note in plan.notes if "does nothing with" in note]
    assert unread == [
        "algorithm.gamma=0.99 does nothing with algorithm.adv_estimator=grpo: it is read by gae, reinforce_plus_plus "
        "only (the run goes on as with 1.0).",
        "worker.actor.tau_negative=2.0 does nothing with worker.actor.loss_type=ppo: it is read by sapo only (the run "
        "goes on as with 1.05).",
    ]
    # the same values where they are read: no note; defaults: no note
    read = BASE + ["algorithm.adv_estimator=reinforce_plus_plus", "worker.actor.loss_type=sapo"]
    notes = load_run_plan(read + ["algorithm.gamma=0.99", "worker.actor.tau_negative=2"]).notes
    assert not [note for note in notes if "does nothing with" in note]
    assert not [note for note in load_run_plan(BASE).notes if "does nothing with" in note]
    rloo = load_run_plan(BASE + ["algorithm.adv_estimator=rloo", "algorithm.norm_adv_by_std_in_grpo=false"]).notes
    assert [note.split(":")[0] for note in rloo if "does nothing with" in note] == [
        "algorithm.norm_adv_by_std_in_grpo=False does nothing with algorithm.adv_estimator=rloo"
    ]


def test_the_settings_the_plan_says_an_algorithm_reads_are_the_ones_its_function_takes():
    import inspect

    from easyrl.algorithms import advantage
    from easyrl.config import validate

    parameters = {
        "algorithm.gamma": "gamma",
        "algorithm.lam": "lam",
        "algorithm.norm_adv_by_std_in_grpo": "norm_adv_by_std",
    }
    for key, readers in validate.ESTIMATOR_SETTINGS.items():
        takes = {
            name
            for name in validate.ADV_ESTIMATORS
            if parameters[key] in inspect.signature(advantage.get_adv_estimator(name)).parameters
        }
        assert takes == readers, key
    # a loss reads a setting when changing it changes the loss (an off-policy batch, advantages of both signs)
    import dataclasses

    import torch

    from easyrl.algorithms import policy_loss
    from easyrl.config.schema import ActorConfig

    generator = torch.Generator().manual_seed(0)
    old, new = torch.randn(2, 3, 5, generator=generator) - 1.0
    advantages = torch.tensor([[1.0] * 5, [-1.0] * 5, [0.5] * 5])
    mask = torch.ones(3, 5)
    for key, readers in validate.LOSS_SETTINGS.items():
        name = key.rsplit(".", 1)[1]
        changed = set()
        for loss in validate.POLICY_LOSSES:
            config = ActorConfig(loss_type=loss, loss_avg_mode="token-mean")  # the resolved spelling
            other = dataclasses.replace(config, **{name: getattr(config, name) * 1.7})
            losses = [
                policy_loss.compute_policy_loss(old, new, advantages, mask, c)[0].item() for c in (config, other)
            ]
            if losses[0] != losses[1]:
                changed.add(loss)
        assert changed == readers, key


def test_a_local_ray_that_fails_to_start_is_one_line_saying_to_run_again(monkeypatch):
    """On an overloaded machine Ray's node can time out during start-up; its exception has no type of its own and
    reached the user as a 20-line traceback. (A real start-up failure cannot be staged on demand: ray.init raises.)"""
    import ray

    from easyrl.trainer.main import RunSetupError, init_ray

    def times_out(**kwargs):
        raise Exception(
            "The current node timed out during startup. This could happen because some of the raylet\nmore"
        )

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", times_out)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(RunSetupError) as error:
        init_ray(load_run_plan(BASE))
    assert str(error.value) == (
        "Ray could not start a local cluster (The current node timed out during startup. This could happen because "
        "some of the raylet). It happens on a machine under heavy load, or while the processes of a killed run are "
        "still exiting (they do within about 2 minutes): run the command again."
    )


def test_greedy_validation_with_several_samples_and_filtering_single_samples_are_noted():
    """Both run as asked and waste or drop what the user wanted: n greedy answers are one answer n times; a group of
    one sample whose 0/1 score is its mean is outside (filter_low, filter_high), so online filtering drops it."""
    greedy = [note for note in load_run_plan(BASE).notes if "samples greedily" in note]
    assert greedy == []
    (greedy,) = [
        note
        for note in load_run_plan(BASE + ["worker.rollout.val_override_config={temperature: 0, n: 4}"]).notes
        if "samples greedily" in note
    ]
    assert greedy.startswith("worker.rollout.val_override_config samples greedily (temperature 0) with n=4: the 4 ")
    single = ["algorithm.adv_estimator=reinforce_plus_plus", "worker.rollout.n=1", "algorithm.online_filtering=true"]
    (note,) = [note for note in load_run_plan(BASE + single).notes if "online_filtering with" in note]
    assert "a sample scored 0.01 or below, or 0.99 or above, is dropped (with a 0/1 reward, every one)" in note
    assert not [n for n in load_run_plan(BASE + single[:2]).notes if "online_filtering with" in n]

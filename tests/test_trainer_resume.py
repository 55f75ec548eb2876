"""Resume: a run SIGKILLed after its step-2 checkpoint, restarted with the same command, reproduces step 3 of the
uninterrupted run exactly (same samples, rewards, losses, gradients): the model, optimizer, lr scheduler, dataloader
position and the rollout's sampling seeds all come back.

Marked slow to keep the default suite within its time: there, tests/test_faults_runs.py resumes a run stopped by
SIGTERM (a rerun of the same command) and one whose worker was SIGKILLed (a restart from the last periodic
checkpoint), each to the uninterrupted run's exact metrics; the TensorBoard rewind and the edited-file warning this
run also checks have tests of their own (test_trainer_loggers_resume.py, test_trainer_checkpoint.py)."""

import json
import math
import signal

import pytest
import yaml

from tests.fixtures.trainer_runs import (
    GRPO_RUN_OVERRIDES,
    WORD_START_REWARD,
    kill_process_group,
    launch_training,
    metrics_by_step,
    run_training,
    train_args,
    wait_for_path,
)


# Wall-clock measurements differ between any two runs; everything else is a function of the seeds and the state.
TIME_DEPENDENT_PREFIXES = (
    "timing/",
    "timing_per_token_ms/",
    "perf/",
    "rollout/gen_seconds",
    "rollout/gen_tokens_per_s",
    "rollout/weight_sync_s",
    "rollout/weight_sync_gb_per_s",
)


EXACT_PREFIXES = ("reward/", "response_length/", "prompt_length/", "val/")


def _same(name: str, resumed, reference) -> bool:
    if name.startswith(EXACT_PREFIXES) or not isinstance(reference, float):
        return resumed == reference
    return math.isclose(resumed, reference, rel_tol=1e-5, abs_tol=1e-7)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_killed_run_resumes_from_its_last_checkpoint_and_reproduces_the_next_step(tiny_grpo_run, tmp_path):
    save_dir = tmp_path / "checkpoints"
    # the reference run's command, with TensorBoard beside the default loggers: its events are rewound too; its
    # reward file a copy, edited (a comment) before the resume
    reward = tmp_path / "reward.py"
    reward.write_text(WORD_START_REWARD.read_text())
    args = train_args(tiny_grpo_run.model_path, save_dir, GRPO_RUN_OVERRIDES) + [
        "trainer.logger=[console,file,tensorboard]",
        f"worker.reward.reward_function={reward}:compute_score",
    ]

    killed_log = tmp_path / "killed.log"
    proc = launch_training(args, killed_log)
    try:
        wait_for_path(save_dir / "global_step_2" / "COMPLETE", proc, killed_log)
    finally:
        kill_process_group(proc)
    assert proc.returncode == -signal.SIGKILL, "the run ended on its own before it could be killed"
    assert not (save_dir / "global_step_3").exists()

    reward.write_text(reward.read_text() + "\n# edited between the attempts\n")
    resumed_log = tmp_path / "resumed.log"
    run_training(args, resumed_log)
    resumed_text = resumed_log.read_text(errors="replace")
    assert f"Resuming from {save_dir / 'global_step_2'}" in resumed_text
    # an edited reward file is named: the curves before and after measure different things (the config is the same)
    assert (
        f"The file of worker.reward.reward_function changed since {save_dir / 'global_step_2'} was saved: the scores "
        "(or prompts) of the steps before and after this resume are not comparable." in resumed_text
    )

    with open(save_dir / "metrics.jsonl", encoding="utf-8") as handle:
        logged_steps = [int(json.loads(line)["step"]) for line in handle]
    assert logged_steps.count(3) == 1 and logged_steps.count(1) == 1, "the resumed run must train step 3 only"

    resumed, reference = metrics_by_step(save_dir)[3], tiny_grpo_run.metrics[3]
    compared = sorted(name for name in reference if not name.startswith(TIME_DEPENDENT_PREFIXES))
    assert set(compared) <= set(resumed)
    # The sampled batch and its scores must be identical; losses and gradients may differ in the last float bits
    # (CPU matmul kernels can round differently for differently aligned buffers in a new process).
    different = {
        name: (resumed[name], reference[name]) for name in compared if not _same(name, resumed[name], reference[name])
    }
    assert not different, f"step 3 after the resume differs from the uninterrupted run: {different}"
    # the comparison covered the sampled batch, the rewards, the losses and the gradient
    for name in ("reward/overall", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert name in compared and math.isfinite(reference[name])
    assert "val/reward/overall" in compared

    # one TensorBoard run across both attempts, one value per step, the resumed step's as in metrics.jsonl
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(save_dir / "tensorboard"), purge_orphaned_data=False)
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/overall")] == [
        (step, pytest.approx(metrics_by_step(save_dir)[step]["reward/overall"])) for step in (1, 2, 3)
    ]
    assert len(events.Tensors("config/text_summary")) == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_val_only_validates_the_checkpoint_it_resumes_as_the_run_validated_it(tiny_grpo_run, tmp_path):
    """trainer.val_only on a finished run's folder resumed its checkpoint and validated nothing (validation before
    training was for step 0 only); it validates the checkpoint's model, with the step's sampling seeds. On an earlier
    checkpoint it dropped the later steps' rows as if they would be trained again: the folder's history is kept."""
    import shutil

    save_dir = tmp_path / "checkpoints"
    shutil.copytree(tiny_grpo_run.save_dir, save_dir)
    history = (save_dir / "metrics.jsonl").read_text()
    trained_with = (save_dir / "config.yaml").read_text()
    args = train_args(tiny_grpo_run.model_path, save_dir, GRPO_RUN_OVERRIDES) + [
        "trainer.val_only=true",
        f"trainer.load_checkpoint_path={save_dir / 'global_step_2'}",
    ]
    run_training(args, tmp_path / "val_only.log")
    assert "Validated only (trainer.val_only): no checkpoint was written" in (tmp_path / "val_only.log").read_text()
    text = (save_dir / "metrics.jsonl").read_text()
    assert text.startswith(history)  # steps 1-3 as the run logged them
    (last,) = [json.loads(line) for line in text[len(history) :].splitlines()]
    reference = tiny_grpo_run.metrics[2]
    validated = {name: value for name, value in last.items() if name.startswith("val/")}
    assert last["step"] == 2 and "reward/overall" not in last  # the validation's own row, appended
    assert validated and validated == {name: reference[name] for name in validated}
    assert not (save_dir / "global_step_4").exists() and (save_dir / "global_step_3").exists()
    # the folder still repeats the training run; the look's config is kept beside it
    assert (save_dir / "config.yaml").read_text() == trained_with and not (save_dir / "config.1.yaml").exists()
    assert yaml.safe_load((save_dir / "val_only_config.yaml").read_text())["trainer"]["val_only"] is True


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_warm_start_from_another_runs_checkpoint_trains_its_next_step_and_logs_only_its_own(tiny_grpo_run, tmp_path):
    """A warm start into a new folder copied the source run's checkpoint-step row into its metrics.jsonl, under a
    warning that read as if this run had written it; the step after the checkpoint is the source run's step."""
    save_dir = tmp_path / "warm"
    args = train_args(tiny_grpo_run.model_path, save_dir, GRPO_RUN_OVERRIDES) + [
        f"trainer.load_checkpoint_path={tiny_grpo_run.save_dir / 'global_step_2'}"
    ]
    log = tmp_path / "warm.log"
    run_training(args, log)
    assert "restored the row of step 2" not in log.read_text(errors="replace")
    rows = metrics_by_step(save_dir)
    assert sorted(rows) == [3]
    reference = tiny_grpo_run.metrics[3]
    compared = sorted(name for name in reference if not name.startswith(TIME_DEPENDENT_PREFIXES))
    assert {name for name in compared if not _same(name, rows[3][name], reference[name])} == set()

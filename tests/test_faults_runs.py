"""Real `easyrl train` runs (tiny model, 2 FSDP2 workers, vLLM rollout) interrupted the ways jobs die: SIGTERM
(preemption), a worker SIGKILLed (the kernel's OOM killer), the driver SIGKILLed, Ctrl-C twice. After each, the run
continues from its last checkpoint, metrics.jsonl holds exactly one row per step, and the steps trained after the
interruption equal the uninterrupted run's (``tiny_grpo_run``, the same command).

One run is in the default suite (SIGTERM, the preemption every cluster sends); the others are marked slow (a dead
worker is named by tests/test_faults_worker_death.py in the default suite). The signal
goes to the driver only, as Kubernetes sends it, except in the test of a signal to every process of the job.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from easyrl.trainer.checkpoint import list_checkpoints
from tests.fixtures.trainer_runs import (
    GRPO_RUN_OVERRIDES,
    RUN_TIMEOUT_S,
    actor_pids,
    kill_process_group,
    launch_training,
    log_tail,
    metrics_by_step,
    run_training,
    train_args,
    wait_for_path,
    wait_until,
)
from tests.test_trainer_resume import TIME_DEPENDENT_PREFIXES, _same


def _logged_steps(save_dir: Path) -> list[int]:
    with open(save_dir / "metrics.jsonl", encoding="utf-8") as handle:
        return [int(json.loads(line)["step"]) for line in handle]


def _checkpoint_steps(save_dir: Path) -> list[int]:
    return [step for step, _ in list_checkpoints(str(save_dir))]


def _wait_for_row(save_dir: Path, step: int, proc, log_path, timeout: float = RUN_TIMEOUT_S) -> None:
    """Until metrics.jsonl has the row of ``step`` (the next step has then begun)."""

    def logged() -> bool:
        return (save_dir / "metrics.jsonl").exists() and step in _logged_steps(save_dir)

    wait_until(logged, f"the row of step {step} was logged", proc, log_path, timeout)


def _wait_for_exit(proc, log_path, timeout: float = RUN_TIMEOUT_S) -> int:
    try:
        return proc.wait(timeout=timeout)
    except Exception:
        kill_process_group(proc)
        pytest.fail(f"the run did not exit in {timeout} s:\n{log_tail(log_path)}")
    finally:
        kill_process_group(proc)  # Ray stragglers of the run's process group


def _worker_pids(session_leader: int) -> list[int]:
    """The FSDP worker processes (Ray actors) a run started."""
    return actor_pids(session_leader, "FSDPWorker")


def _assert_steps_equal_the_uninterrupted_run(save_dir: Path, reference: dict, steps: list[int]) -> None:
    resumed = metrics_by_step(save_dir)
    for step in steps:
        compared = sorted(
            name
            for name in reference[step]
            if not name.startswith(TIME_DEPENDENT_PREFIXES) and name != "trainer/restarts"
        )
        assert set(compared) <= set(resumed[step])
        different = {
            name: (resumed[step][name], reference[step][name])
            for name in compared
            if not _same(name, resumed[step][name], reference[step][name])
        }
        assert not different, f"step {step} after the interruption differs from the uninterrupted run: {different}"
        for name in ("reward/overall", "actor/pg_loss", "actor/grad_norm"):
            assert name in compared


@pytest.mark.timeout(1800)
def test_sigterm_checkpoints_the_step_in_progress_and_the_rerun_continues_exactly(tiny_grpo_run, tmp_path):
    save_dir = tmp_path / "checkpoints"
    # no periodic saves: the only checkpoints are the one SIGTERM asks for and the last step's
    args = train_args(tiny_grpo_run.model_path, save_dir, GRPO_RUN_OVERRIDES + ["trainer.save_freq=-1"])
    stopped_log = tmp_path / "stopped.log"
    proc = launch_training(args, stopped_log)
    _wait_for_row(save_dir, 1, proc, stopped_log)  # step 2 is under way
    os.kill(proc.pid, signal.SIGTERM)  # the driver only, as Kubernetes does
    returncode = _wait_for_exit(proc, stopped_log)

    checkpoint = save_dir / "global_step_2"
    text = stopped_log.read_text(errors="replace")
    assert returncode == 128 + signal.SIGTERM, log_tail(stopped_log)
    assert "SIGTERM received: finishing the current step" in text
    assert (
        f"easyrl: stopped by SIGTERM after step 2. The last complete checkpoint is {checkpoint}; rerun the same "
        "command to resume from it." in text
    )
    assert _checkpoint_steps(save_dir) == [2] and _logged_steps(save_dir) == [1, 2]
    # the curves of the steps so far are drawn on the way out (a stopped run is read before it is resumed)
    assert f"curves in {save_dir / 'curves.png'}" in text and (save_dir / "curves.png").stat().st_size > 10_000

    resumed_log = tmp_path / "resumed.log"
    run_training(args, resumed_log)
    resumed = resumed_log.read_text(errors="replace")
    assert f"Resuming from {checkpoint}" in resumed
    # said at once, before the data is read (minutes for a large dataset), not only once Ray has started
    found = resumed.index(f"Found the checkpoint {checkpoint}: the run resumes from it once the data is read")
    assert found < resumed.index("Run plan:")
    assert _logged_steps(save_dir) == [1, 2, 3]
    _assert_steps_equal_the_uninterrupted_run(save_dir, tiny_grpo_run.metrics, [3])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_killed_worker_is_restarted_from_the_last_checkpoint_and_the_run_finishes_exactly(tiny_grpo_run, tmp_path):
    save_dir = tmp_path / "checkpoints"
    args = train_args(tiny_grpo_run.model_path, save_dir, GRPO_RUN_OVERRIDES + ["trainer.max_restarts=1"])
    log_path = tmp_path / "train.log"
    proc = launch_training(args, log_path)
    wait_for_path(save_dir / "global_step_1" / "COMPLETE", proc, log_path)
    victim = _worker_pids(proc.pid)[-1]
    os.kill(victim, signal.SIGKILL)  # what the kernel's out-of-memory killer sends
    returncode = _wait_for_exit(proc, log_path)
    assert returncode == 0, log_tail(log_path)

    text = log_path.read_text(errors="replace")
    assert f"(pid {victim}) died during `" in text
    assert "its last resident memory was " in text
    assert f"Restarting every worker and resuming from {save_dir / 'global_step_1'} (restart 1 of" in text
    assert f"Resuming from {save_dir / 'global_step_1'}" in text
    assert _logged_steps(save_dir) == [1, 2, 3]
    rows = metrics_by_step(save_dir)
    assert [rows[step]["trainer/restarts"] for step in (1, 2, 3)] == [0, 1, 1]
    _assert_steps_equal_the_uninterrupted_run(save_dir, tiny_grpo_run.metrics, [2, 3])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_dead_worker_without_restarts_ends_the_run_naming_it_and_the_rerun_resumes(tiny_grpo_run, tmp_path):
    save_dir = tmp_path / "checkpoints"
    # time-based saves only (after every step at this rate): the checkpoint the message names comes from them
    overrides = GRPO_RUN_OVERRIDES + ["trainer.save_freq=-1", "trainer.save_every_minutes=0.0001"]
    args = train_args(tiny_grpo_run.model_path, save_dir, overrides)
    log_path = tmp_path / "died.log"
    proc = launch_training(args, log_path)
    wait_for_path(save_dir / "global_step_1" / "COMPLETE", proc, log_path)
    victim = _worker_pids(proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    returncode = _wait_for_exit(proc, log_path)

    text = log_path.read_text(errors="replace")
    assert returncode == 1, log_tail(log_path)
    line = next(line for line in text.splitlines() if line.startswith("easyrl: in step "))
    assert f"(pid {victim}) died during `" in line
    assert "killed by a signal (SIGKILL; the kernel's out-of-memory killer sends it) or crashed" in line
    assert "its last resident memory was " in line and " GiB (" in line
    assert "set trainer.max_restarts to have easyrl restart the workers" in line
    last = save_dir / f"global_step_{_checkpoint_steps(save_dir)[-1]}"
    assert line.endswith(f"The last complete checkpoint is {last}; rerun the same command to resume from it.")

    run_training(args, tmp_path / "resumed.log")
    assert _logged_steps(save_dir) == [1, 2, 3]
    _assert_steps_equal_the_uninterrupted_run(save_dir, tiny_grpo_run.metrics, [3])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_rerun_right_after_the_driver_is_killed_starts_its_own_ray_and_resumes(tiny_grpo_run, tmp_path):
    save_dir = tmp_path / "checkpoints"
    args = train_args(tiny_grpo_run.model_path, save_dir, GRPO_RUN_OVERRIDES)
    log_path = tmp_path / "killed.log"
    proc = launch_training(args, log_path)
    try:
        wait_for_path(save_dir / "global_step_1" / "COMPLETE", proc, log_path)
        os.kill(proc.pid, signal.SIGKILL)  # the driver only: Ray's agents of that run linger for a while
        proc.wait(timeout=60)
        resumed_log = tmp_path / "resumed.log"
        run_training(args, resumed_log)  # at once, while they are still there
    finally:
        kill_process_group(proc)
    assert "Resuming from" in resumed_log.read_text(errors="replace")
    assert _logged_steps(save_dir) == [1, 2, 3]
    _assert_steps_equal_the_uninterrupted_run(save_dir, tiny_grpo_run.metrics, [3])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_second_ctrl_c_exits_at_once_without_a_checkpoint(tiny_grpo_run, tmp_path):
    save_dir = tmp_path / "checkpoints"
    args = train_args(tiny_grpo_run.model_path, save_dir, GRPO_RUN_OVERRIDES + ["trainer.save_freq=-1"])
    log_path = tmp_path / "interrupted.log"
    proc = launch_training(args, log_path)
    _wait_for_row(save_dir, 1, proc, log_path)
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    returncode = _wait_for_exit(proc, log_path, timeout=60)
    assert time.monotonic() - sent < 10
    assert returncode == 128 + signal.SIGINT
    text = log_path.read_text(errors="replace")
    assert "second SIGINT: exiting now, without a checkpoint." in text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert _checkpoint_steps(save_dir) == []


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_sigterm_to_every_process_of_the_job_exits_at_once_naming_the_last_checkpoint(tiny_grpo_run, tmp_path):
    save_dir = tmp_path / "checkpoints"
    args = train_args(tiny_grpo_run.model_path, save_dir, GRPO_RUN_OVERRIDES)
    log_path = tmp_path / "group.log"
    proc = launch_training(args, log_path)
    wait_for_path(save_dir / "global_step_1" / "COMPLETE", proc, log_path)
    os.killpg(proc.pid, signal.SIGTERM)  # Ray's own processes get it too, as under a scheduler that signals them all
    sent = time.monotonic()
    returncode = _wait_for_exit(proc, log_path, timeout=120)
    assert time.monotonic() - sent < 30  # not Ray's minute of reconnection attempts
    assert returncode == 128 + signal.SIGTERM, log_tail(log_path)
    last = save_dir / f"global_step_{_checkpoint_steps(save_dir)[-1]}"
    assert (
        "easyrl: SIGTERM also ended the Ray cluster's own processes (it was sent to every process of the job, not "
        f"to easyrl alone), so no checkpoint could be written. The last complete checkpoint is {last}; rerun the "
        "same command to resume from it." in log_path.read_text(errors="replace")
    )

    run_training(args, tmp_path / "resumed.log")
    assert _logged_steps(save_dir) == [1, 2, 3]
    _assert_steps_equal_the_uninterrupted_run(save_dir, tiny_grpo_run.metrics, [3])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_reward_that_raises_on_every_sample_stops_the_run_at_its_first_batch(tiny_model_path, tmp_path):
    # the answer column holds numbers; the reward function treats them as text, as EasyR1's own math.py does
    from tests.fixtures.trainer_runs import TINY_RUN_OVERRIDES, bare_run

    data = tmp_path / "numbers.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} + 1?", "answer": i + 1}) + "\n" for i in range(16)))
    reward = tmp_path / "text_reward.py"
    reward.write_text(
        "def compute_score(reward_inputs):\n"
        "    return [{'overall': float(item['ground_truth'].strip() in item['response'])} for item in reward_inputs]\n"
    )
    args = [
        *TINY_RUN_OVERRIDES,
        *bare_run(3, tmp_path / "run"),
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.n_gpus_per_node=1",
        f"data.train_files={data}",
        "data.prompt_key=problem",
        f"worker.reward.reward_function={reward}:compute_score",
    ]
    log_path = tmp_path / "train.log"
    proc = launch_training(args, log_path)
    returncode = _wait_for_exit(proc, log_path)
    text = log_path.read_text(errors="replace")
    assert returncode == 2, log_tail(log_path)
    assert "easyrl train: Reward function `compute_score` in " in text
    assert "raised on every sample of the run so far (16 of 16 in the last batch), so the run stops" in text
    assert "include values of type int, not str" in text and "AttributeError" in text
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or _logged_steps(tmp_path / "run") == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_reward_that_fails_mid_run_stops_naming_the_checkpoint_to_resume_from(tiny_model_path, tmp_path):
    """A grader that goes away after the first step: the run stops with one line that, besides the reward's
    failure, names the last complete checkpoint and that the same command resumes from it."""
    from tests.fixtures.trainer_runs import TINY_RUN_OVERRIDES, bare_run

    marker, reward = tmp_path / "scored_once", tmp_path / "grader.py"
    reward.write_text(
        "import os\n\n"
        "def compute_score(reward_inputs):\n"
        f"    if os.path.exists({str(marker)!r}):\n"
        "        raise ConnectionError('the grading service is gone')\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    return [{'overall': float(i % 2)} for i, _ in enumerate(reward_inputs)]\n"
    )
    save_dir = tmp_path / "run"
    plain = (
        "trainer.save_freq=-1",
        "trainer.save_model_only=true",
        "trainer.find_last_checkpoint=false",
        "worker.reward.reward_function=",
    )
    args = [
        *[arg for arg in TINY_RUN_OVERRIDES if not arg.startswith(plain)],
        *[arg for arg in bare_run(6, save_dir) if not arg.startswith(plain)],
        "trainer.save_freq=1",
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.n_gpus_per_node=1",
        f"worker.reward.reward_function={reward}:compute_score",
    ]
    log_path = tmp_path / "train.log"
    returncode = _wait_for_exit(launch_training(args, log_path), log_path)
    text = log_path.read_text(errors="replace")
    assert returncode == 2, log_tail(log_path)
    last = max(_checkpoint_steps(save_dir))
    message = text[text.index("easyrl train: ") :].rstrip()  # the reward's failure, then where to go on from
    assert "ConnectionError: the grading service is gone" in message, message
    assert message.endswith(
        "ConnectionError: the grading service is gone\nThe last complete checkpoint is "
        f"{save_dir / f'global_step_{last}'}; rerun the same command to resume from it."
    ), message


def _run_a_filter_that_runs_dry(model_path, tmp_path, reward_source: str, steps: int, saves: bool = False) -> str:
    """A tiny run of ``steps`` steps with online filtering (2 rounds a step at most) and the reward function
    ``reward_source`` (in the driver); it must stop with exit 2. Its log. ``saves``: with full checkpoints."""
    from tests.fixtures.trainer_runs import TINY_RUN_OVERRIDES, bare_run

    reward = tmp_path / "reward.py"
    reward.write_text(reward_source)
    args = [
        *[arg for arg in TINY_RUN_OVERRIDES if not arg.startswith("worker.reward.reward_function=")],
        *[arg for arg in bare_run(steps, tmp_path / "run") if not (saves and arg == "trainer.save_model_only=true")],
        f"worker.actor.model.model_path={model_path}",
        "trainer.n_gpus_per_node=1",
        f"worker.reward.reward_function={reward}:compute_score",
        "algorithm.online_filtering=true",
        "trainer.max_try_make_batch=2",
    ]
    log_path = tmp_path / "train.log"
    returncode = _wait_for_exit(launch_training(args, log_path), log_path)
    assert returncode == 2, log_tail(log_path)
    return log_path.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_online_filtering_that_finds_too_few_mixed_groups_stops_with_the_counts(tiny_model_path, tmp_path):
    """Every sample scores the same, so every group is filtered out: after trainer.max_try_make_batch rounds the run
    stops with exit 2 and one line of counts and keys, not a traceback."""
    reward = "def compute_score(reward_inputs):\n    return [{'overall': 0.0} for _ in reward_inputs]\n"
    text = _run_a_filter_that_runs_dry(tiny_model_path, tmp_path, reward, steps=2)
    assert "easyrl train: online filtering kept 0 of the 4 groups a step needs after 2 generation rounds" in text
    assert "of 8 groups, 8 had a mean `overall` at or below 0.01 and 0 at or above 0.99" in text
    assert "Traceback" not in text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_step_online_filtering_cannot_fill_keeps_the_steps_before_it(tiny_model_path, tmp_path):
    """Step 1 finds mixed groups, step 2 none: the run stops with exit 2 and checkpoints step 1 (no save was due)
    with the data position step 2 started from, so that a rerun with a wider filter loses no trained step."""
    from easyrl.data.loader import batches_drawn
    from easyrl.trainer.checkpoint import load_dataloader_state, load_trainer_state

    reward = (
        "CALLS = [0]\n"
        "def compute_score(reward_inputs):\n"
        "    CALLS[0] += 1\n"
        "    return [{'overall': float(CALLS[0] == 1 and i % 2)} for i, _ in enumerate(reward_inputs)]\n"
    )
    text = _run_a_filter_that_runs_dry(tiny_model_path, tmp_path, reward, steps=3, saves=True)
    saved = tmp_path / "run" / "global_step_1"
    assert "easyrl train: online filtering kept 0 of the 4 groups a step needs after 2 generation rounds" in text
    assert f"The 1 steps before it are saved in {saved}; a rerun resumes from there." in text
    assert load_trainer_state(str(saved))["global_step"] == 1 and _logged_steps(tmp_path / "run") == [1]
    # the position step 2 started from (one batch drawn), not the one after its two rounds
    assert batches_drawn(load_dataloader_state(str(saved))) == 1
    assert "Traceback" not in text

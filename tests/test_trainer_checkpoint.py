"""Checkpoints are published atomically, rotated, pointed to, and found again; RNG states round-trip."""

import dataclasses
import os
import random
import shutil

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from easyrl.config import TrainerConfig
from easyrl.trainer.checkpoint import (
    COMPLETE_MARKER,
    CheckpointError,
    CheckpointManager,
    CheckpointSaveError,
    check_resume_point,
    checkpoint_step,
    find_last_checkpoint,
    list_checkpoints,
    load_dataloader_state,
    load_rng_state,
    load_trainer_state,
    read_latest_pointer,
    resolve_resume_path,
    save_rng_state,
)


# Single-process torch.distributed.checkpoint saves warn that no process group exists: expected here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _worker_save(tmp_dir: str, role: str = "actor", seed: int = 0) -> dict[str, torch.Tensor]:
    """What a worker does: write its model state with torch.distributed.checkpoint into the handed-out folder."""
    torch.manual_seed(seed)
    state = torch.nn.Linear(4, 3).state_dict()
    dcp.save(state, checkpoint_id=os.path.join(tmp_dir, role))
    return state


def _save(manager: CheckpointManager, step: int) -> str:
    tmp_dir = manager.begin(step)
    _worker_save(tmp_dir, seed=step)
    return manager.commit(step, trainer_state={"epoch": 0}, dataloader_state={"batches_yielded": step})


def _steps(root) -> list[int]:
    return [step for step, _ in list_checkpoints(str(root))]


def test_commit_publishes_model_state_driver_files_marker_and_pointer(tmp_path):
    manager = CheckpointManager(str(tmp_path), save_limit=-1)
    tmp_dir = manager.begin(5)
    saved = _worker_save(tmp_dir, seed=5)
    path = manager.commit(5, trainer_state={"epoch": 1}, dataloader_state={"batches_yielded": 7}, required=("actor",))

    assert path == str(tmp_path / "global_step_5") and not os.path.exists(tmp_dir)
    assert os.path.isfile(os.path.join(path, COMPLETE_MARKER))
    assert load_trainer_state(path) == {"global_step": 5, "epoch": 1} and checkpoint_step(path) == 5
    assert load_dataloader_state(path) == {"batches_yielded": 7}
    assert read_latest_pointer(str(tmp_path)) == 5
    loaded = {name: torch.zeros_like(value) for name, value in saved.items()}
    dcp.load(loaded, checkpoint_id=os.path.join(path, "actor"))
    assert all(torch.equal(loaded[name], saved[name]) for name in saved)


def test_a_crash_between_begin_and_commit_leaves_the_previous_checkpoint_as_last(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    first = _save(manager, 1)
    _worker_save(manager.begin(2))  # the process dies here: commit never runs

    assert find_last_checkpoint(str(tmp_path)) == first
    assert read_latest_pointer(str(tmp_path)) == 1
    assert resolve_resume_path(TrainerConfig(save_checkpoint_path=str(tmp_path))) == first


def test_a_step_folder_without_the_complete_marker_is_ignored(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    first = _save(manager, 1)
    os.makedirs(tmp_path / "global_step_9" / "actor")  # e.g. copied by hand, or half-deleted by hand
    assert find_last_checkpoint(str(tmp_path)) == first


def test_find_last_checkpoint_orders_steps_numerically_when_saved_in_the_same_instant(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    for step in (9, 10, 2):
        _save(manager, step)
        with open(tmp_path / f"global_step_{step}" / COMPLETE_MARKER, "w") as marker:
            marker.write(f"{step} 1700000000\n")  # the whole-second stamp of older easyrl versions
    assert find_last_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_10")


def test_a_run_resumed_from_an_earlier_step_resumes_its_own_newest_save_and_rotates_the_old_branch(tmp_path, caplog):
    manager = CheckpointManager(str(tmp_path), save_limit=3)
    for step in (4, 5, 6):
        _save(manager, step)
    config = TrainerConfig(save_checkpoint_path=str(tmp_path), load_checkpoint_path=str(tmp_path / "global_step_4"))
    with caplog.at_level("WARNING"):
        assert check_resume_point(config) == str(tmp_path / "global_step_4")
    assert "also holds 2 later checkpoints (global_step_5, global_step_6) saved before" in caplog.text

    _save(manager, 5)  # the branch from step 4 saves step 5, replacing the old one, and the job is killed
    # a rerun without load_checkpoint_path continues the branch, not the old run's step 6
    assert resolve_resume_path(TrainerConfig(save_checkpoint_path=str(tmp_path))) == str(tmp_path / "global_step_5")
    assert read_latest_pointer(str(tmp_path)) == 5 and _steps(tmp_path) == [4, 5, 6]


def test_save_limit_deletes_the_oldest_save_not_the_lowest_step(tmp_path):
    manager = CheckpointManager(str(tmp_path), save_limit=2)
    for step in (7, 8):
        _save(manager, step)
    _save(manager, 3)  # a branch resumed from an earlier checkpoint that has since been rotated away
    assert _steps(tmp_path) == [3, 8]
    _save(manager, 4)
    assert _steps(tmp_path) == [3, 4]
    assert find_last_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_4")


def test_find_last_checkpoint_of_a_missing_folder_is_none(tmp_path):
    assert find_last_checkpoint(str(tmp_path / "never_saved")) is None
    assert find_last_checkpoint(None) is None


def test_begin_clears_the_leftovers_of_a_crashed_save(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    _worker_save(manager.begin(3))  # crashed save
    tmp_dir = manager.begin(4)
    assert os.listdir(tmp_dir) == []
    assert not os.path.exists(manager.tmp_dir(3))


def test_save_limit_deletes_the_oldest_checkpoints(tmp_path):
    manager = CheckpointManager(str(tmp_path), save_limit=2)
    for step in (1, 2, 3, 4):
        _save(manager, step)
    assert _steps(tmp_path) == [3, 4]
    assert sorted(os.listdir(tmp_path)) == ["global_step_3", "global_step_4", "latest_checkpointed_iteration.txt"]


def test_save_limit_minus_one_keeps_every_checkpoint(tmp_path):
    manager = CheckpointManager(str(tmp_path), save_limit=-1)
    for step in (1, 2, 3):
        _save(manager, step)
    assert _steps(tmp_path) == [1, 2, 3]


def test_saving_the_same_step_again_replaces_it(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    _save(manager, 2)
    tmp_dir = manager.begin(2)
    saved = _worker_save(tmp_dir, seed=123)
    path = manager.commit(2, trainer_state={"epoch": 5})
    assert load_trainer_state(path) == {"global_step": 2, "epoch": 5}
    loaded = {name: torch.zeros_like(value) for name, value in saved.items()}
    dcp.load(loaded, checkpoint_id=os.path.join(path, "actor"))
    assert torch.equal(loaded["weight"], saved["weight"])
    assert sorted(os.listdir(tmp_path)) == ["global_step_2", "latest_checkpointed_iteration.txt"]


def test_commit_missing_a_worker_part_explains_the_shared_filesystem(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    _worker_save(manager.begin(1), role="actor")
    with pytest.raises(CheckpointError, match=r"missing \['critic'\].*every node mounts"):
        manager.commit(1, required=("actor", "critic"))
    assert find_last_checkpoint(str(tmp_path)) is None


def test_commit_without_begin_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match=r"commit\(3\) without begin\(3\)"):
        CheckpointManager(str(tmp_path)).commit(3)


# writes to it fail as on a full disk (ENOSPC): a real failed write, without a full filesystem
FULL_DEVICE = "/dev/full"
needs_full_device = pytest.mark.skipif(not os.path.exists(FULL_DEVICE), reason=f"no {FULL_DEVICE} on this system")


@needs_full_device
def test_a_save_that_fills_the_disk_names_the_folder_and_space_left_and_removes_its_partial_folder(tmp_path):
    """A full disk during a save ended the run with Ray's and torch's traceback ("unexpected pos 704 vs 598") and
    left the half-written .tmp_global_step_N filling the disk."""
    manager = CheckpointManager(str(tmp_path), save_limit=1)
    first = _save(manager, 1)
    with pytest.raises(CheckpointSaveError) as raised, manager.saving(2) as tmp_dir:
        _worker_save(tmp_dir, role="critic")  # one part is written, the next finds the disk full
        os.symlink(FULL_DEVICE, os.path.join(tmp_dir, "extra_state.pt"))
        torch.save(torch.zeros(1000), os.path.join(tmp_dir, "extra_state.pt"))  # torch's writer: "unexpected pos"

    text = str(raised.value)
    assert text.startswith(
        f"the checkpoint of step 2 could not be saved in trainer.save_checkpoint_path={tmp_path}: the disk is full ("
    )
    assert "unexpected pos" in text
    usage = shutil.disk_usage(tmp_path)
    assert f" free of {usage.total / 2**30:.1f} GiB there" in text or f" free of {usage.total / 2**20:.1f} MiB" in text
    assert text.endswith(
        "; its partial folder .tmp_global_step_2 was removed. Free space there (a lower trainer.save_limit keeps "
        "fewer checkpoints) before rerunning."
    )
    assert not os.path.lexists(manager.tmp_dir(2))
    assert sorted(os.listdir(tmp_path)) == ["global_step_1", "latest_checkpointed_iteration.txt"]
    assert find_last_checkpoint(str(tmp_path)) == first and read_latest_pointer(str(tmp_path)) == 1


@needs_full_device
@pytest.mark.timeout(180)
@pytest.mark.parametrize("failure", ["disk_full", "a_file_where_its_folder_goes"])
def test_a_workers_failed_write_arrives_through_ray_as_one_save_error(tmp_path, ray_cluster, failure):
    """The workers' DCP save fails in their own process: Ray brings it as RayTaskError(CheckpointException), whose
    failed write (rank 0's) is what the message says."""
    manager = CheckpointManager(str(tmp_path))
    first = _save(manager, 1)

    def worker_save(role_dir: str) -> None:
        dcp.save(torch.nn.Linear(4, 3).state_dict(), checkpoint_id=role_dir)

    save = ray_cluster.remote(worker_save)
    with pytest.raises(CheckpointSaveError) as raised, manager.saving(2) as tmp_dir:
        role_dir = os.path.join(tmp_dir, "actor")
        if failure == "disk_full":
            os.makedirs(role_dir)
            os.symlink(FULL_DEVICE, os.path.join(role_dir, "__0_0.distcp"))  # the file rank 0 writes its shard to
        else:
            open(role_dir, "w").close()
        ray_cluster.get(save.remote(role_dir))

    text = str(raised.value)
    where = f"the checkpoint of step 2 could not be saved in trainer.save_checkpoint_path={tmp_path}"
    if failure == "disk_full":
        assert text.startswith(f"{where}: the disk is full ([Errno 28] No space left on device)")
    else:
        assert text.startswith(
            f"{where} (FileExistsError: [Errno 17] File exists: '{tmp_path}/.tmp_global_step_2/actor')"
        )
        assert "disk is full" not in text
    assert "; its partial folder .tmp_global_step_2 was removed" in text and "Traceback" not in text
    assert not os.path.lexists(manager.tmp_dir(2)) and find_last_checkpoint(str(tmp_path)) == first


def test_a_worker_that_died_during_a_save_is_not_a_failed_write_but_its_partial_folder_goes(tmp_path):
    from easyrl.controller.worker_group import WorkerDiedError

    manager = CheckpointManager(str(tmp_path))
    died = WorkerDiedError("actor_rollout", 1, "save_checkpoint", None, "killed by SIGKILL")
    with pytest.raises(WorkerDiedError) as raised, manager.saving(1) as tmp_dir:
        _worker_save(tmp_dir)
        raise died
    assert raised.value is died  # the run restarts its workers (trainer.max_restarts) or names the dead one
    assert os.listdir(tmp_path) == []


def test_load_checkpoint_path_wins_over_the_newest_checkpoint(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    first, _ = _save(manager, 1), _save(manager, 2)
    config = TrainerConfig(save_checkpoint_path=str(tmp_path), load_checkpoint_path=first)
    assert resolve_resume_path(config) == first


def test_a_warm_started_run_rerun_goes_on_from_its_own_newest_checkpoint(tmp_path, valid_args):
    """trainer.load_checkpoint_path naming another run's checkpoint: a killed run rerun with the same command (a
    requeued job) went back to the other run's step and trained again, and save_limit deleted its own newer saves."""
    from easyrl.config import load_run_plan
    from easyrl.trainer.preflight import resume_summary

    other = _save(CheckpointManager(str(tmp_path / "other")), 6)
    own = tmp_path / "own"
    config = TrainerConfig(save_checkpoint_path=str(own), load_checkpoint_path=other)
    assert resolve_resume_path(config) == other  # the folder holds nothing yet: the warm start
    manager = CheckpointManager(str(own))
    _save(manager, 7), _save(manager, 8)
    assert resolve_resume_path(config) == str(own / "global_step_8")
    # not with find_last_checkpoint off, nor for a checkpoint of the run's own folder (a rollback)
    assert resolve_resume_path(dataclasses.replace(config, find_last_checkpoint=False)) == other
    assert resolve_resume_path(dataclasses.replace(config, load_checkpoint_path=str(own / "global_step_7"))) == str(
        own / "global_step_7"
    )
    # check's plan line says where the run goes on from and why
    plan = load_run_plan([*valid_args, f"trainer.save_checkpoint_path={own}", f"trainer.load_checkpoint_path={other}"])
    assert resume_summary(plan, str(own / "global_step_8")).startswith(
        f"resumes from {own / 'global_step_8'} (after step 8), this run's own newest checkpoint: "
        f"trainer.load_checkpoint_path={other} is outside this run's folder, which holds checkpoints the run saved "
        "since it started from it"
    )


def test_a_rolled_back_run_rerun_goes_on_from_its_own_saves_even_once_save_limit_deleted_its_start(
    tmp_path, valid_args, capsys
):
    """trainer.load_checkpoint_path naming an earlier checkpoint of the run's own folder (a rollback): the same
    command rerun (a requeued job) trained those steps again, or, once save_limit deleted the checkpoint it names,
    was refused as "does not exist"."""
    from easyrl.cli import main

    root = tmp_path / "run"
    for step in range(1, 7):
        _save(CheckpointManager(str(root)), step)
    start = str(root / "global_step_2")
    config = TrainerConfig(save_checkpoint_path=str(root), load_checkpoint_path=start)
    assert resolve_resume_path(config) == start  # a first rollback: the folder's newest (step 6) is the old branch's

    rolled_back = CheckpointManager(str(root), started_from=start)
    _save(rolled_back, 3)  # ... and the job is killed, then requeued with the same command
    assert load_trainer_state(str(root / "global_step_3"))["started_from"] == start
    assert resolve_resume_path(config) == str(root / "global_step_3")
    # to roll back again: once without find_last_checkpoint
    assert resolve_resume_path(dataclasses.replace(config, find_last_checkpoint=False)) == start
    rolled_back.save_limit = 2
    _save(rolled_back, 4), _save(rolled_back, 5)
    assert _steps(root) == [4, 5]  # save_limit deleted global_step_2, which load_checkpoint_path names
    assert resolve_resume_path(config) == str(root / "global_step_5")
    # a rollback to a step of the new branch rolls back: its newest did not start from there
    branch = dataclasses.replace(config, load_checkpoint_path=str(root / "global_step_4"))
    assert resolve_resume_path(branch) == str(root / "global_step_4")

    args = [*valid_args, f"trainer.save_checkpoint_path={root}", f"trainer.load_checkpoint_path={start}"]
    assert main(["check", *args]) == 0
    assert (
        f"#   resumes from {root / 'global_step_5'} (after step 5), this run's own newest checkpoint: "
        f"trainer.load_checkpoint_path={start} is an earlier checkpoint of this run's folder, whose newest, "
        f"{root / 'global_step_5'}, was saved by a run that rolled back to it: it goes on from there (a killed "
        "rolled-back run rerun with the same command) instead of rolling back again. To roll back again, rerun once "
        "with trainer.find_last_checkpoint=false (or delete the checkpoints saved after it)."
    ) in capsys.readouterr().out


def test_resuming_from_an_earlier_step_names_how_many_later_checkpoints_the_folder_holds(tmp_path, caplog):
    manager = CheckpointManager(str(tmp_path))
    for step in range(1, 7):
        _save(manager, step)
    config = TrainerConfig(save_checkpoint_path=str(tmp_path), load_checkpoint_path=str(tmp_path / "global_step_2"))
    with caplog.at_level("WARNING"):
        check_resume_point(config)
    assert (
        f"Resuming from step 2 of {tmp_path}, which also holds 4 later checkpoints (global_step_3, ..., "
        "global_step_6) saved before: this run's saves of the same steps replace them, and once this run has saved, "
        "the same command rerun (a requeued job) goes on from its newest save, not from step 2 again."
    ) in caplog.text


def test_no_resume_when_find_last_checkpoint_is_off(tmp_path):
    _save(CheckpointManager(str(tmp_path)), 1)
    config = TrainerConfig(save_checkpoint_path=str(tmp_path), find_last_checkpoint=False)
    assert resolve_resume_path(config) is None


def test_load_checkpoint_path_pointing_at_the_root_suggests_the_newest_step(tmp_path):
    last = _save(CheckpointManager(str(tmp_path)), 4)
    config = TrainerConfig(load_checkpoint_path=str(tmp_path))
    with pytest.raises(CheckpointError, match=f"not a complete checkpoint.*did you mean {last}"):
        resolve_resume_path(config)


def test_load_checkpoint_path_inside_a_checkpoint_names_the_checkpoint(tmp_path):
    step = _save(CheckpointManager(str(tmp_path)), 4)
    os.makedirs(os.path.join(step, "actor", "huggingface"), exist_ok=True)
    actor = os.path.join(step, "actor")
    with pytest.raises(CheckpointError) as error:
        resolve_resume_path(TrainerConfig(load_checkpoint_path=actor))
    assert str(error.value) == (
        f"trainer.load_checkpoint_path={actor} is a folder inside the checkpoint {step}: give that folder."
    )
    with pytest.raises(CheckpointError) as error:
        resolve_resume_path(TrainerConfig(load_checkpoint_path=os.path.join(actor, "huggingface")))
    assert str(error.value).endswith(
        f"inside the checkpoint {step}: give that folder. (To start from this model's weights alone, give it as "
        "worker.actor.model.model_path.)"
    )


def test_load_checkpoint_path_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="trainer.load_checkpoint_path=.*does not exist"):
        resolve_resume_path(TrainerConfig(load_checkpoint_path=str(tmp_path / "nope")))


def test_rng_state_round_trip_replays_the_same_random_numbers(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    save_rng_state(str(tmp_path / "actor"), rank=3)
    first = (random.random(), np.random.rand(), torch.rand(2))
    load_rng_state(str(tmp_path / "actor"), rank=3)
    again = (random.random(), np.random.rand(), torch.rand(2))
    assert first[0] == again[0] and first[1] == again[1] and torch.equal(first[2], again[2])
    assert os.listdir(tmp_path / "actor") == ["rng_state_rank_3.json"]


def test_saves_after_the_last_step_every_save_freq_steps_after_the_minutes_and_on_a_stop():
    import time
    from types import SimpleNamespace

    from easyrl.trainer.checkpoint import saves_after

    trainer = SimpleNamespace(save_freq=4, save_every_minutes=0.0)
    now = time.monotonic()
    assert [step for step in range(1, 10) if saves_after(trainer, step, step == 9, now, False)] == [4, 8, 9]
    assert saves_after(trainer, 3, False, now, stop_requested=True)
    trainer = SimpleNamespace(save_freq=-1, save_every_minutes=2.0)
    assert not saves_after(trainer, 3, False, now - 119, False)
    assert saves_after(trainer, 3, False, now - 121, False)


@pytest.mark.timeout(300)
def test_a_run_whose_checkpoint_is_past_its_last_step_says_so_without_starting(tmp_path, tiny_model_path):
    """trainer.max_steps lowered below the newest checkpoint: nothing is left to train. The run said nothing, started
    Ray and the engine and exited; it now says so, and how to go on, before Ray starts."""
    import subprocess
    import sys

    from tests.fixtures.trainer_runs import REPO_ROOT

    save_dir = tmp_path / "run"
    _save(CheckpointManager(str(save_dir), save_limit=-1), 4)
    args = [
        f"config={REPO_ROOT / 'examples' / 'smollm2_arithmetic_grpo.yaml'}",
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.max_steps=2",
        f"trainer.save_checkpoint_path={save_dir}",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "easyrl", "train", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        f"Nothing to train: the checkpoint this run resumes from, {save_dir / 'global_step_4'}, is at step 4, and "
        in (result.stdout)
    )
    assert "the run has 2 steps (trainer.max_steps=2)" in result.stdout
    assert not (save_dir / "metrics.jsonl").exists() and _steps(save_dir) == [4]


def test_a_run_that_trains_a_critic_refuses_a_checkpoint_without_one_before_ray(tmp_path, caplog):
    import logging

    from easyrl.config import PPOConfig

    root = tmp_path / "run"
    root.mkdir()
    (root / "config.yaml").write_text("algorithm:\n  adv_estimator: grpo\n")  # the run's config, kept by each save
    manager = CheckpointManager(str(root))
    grpo_checkpoint = _save(manager, 2)
    config = PPOConfig()
    config.trainer.save_checkpoint_path = str(root)
    config.algorithm.adv_estimator = "gae"
    with pytest.raises(CheckpointError) as refusal:
        check_resume_point(config)
    assert str(refusal.value) == (
        f"Cannot resume from {grpo_checkpoint}: it holds no critic (its run had algorithm.adv_estimator=grpo), and "
        "this run's algorithm.adv_estimator=gae trains one. Set algorithm.adv_estimator as the checkpoint's run had "
        "it, or start afresh in a new trainer.save_checkpoint_path."
    )
    config.algorithm.adv_estimator = "grpo"
    assert check_resume_point(config) == grpo_checkpoint

    tmp_dir = manager.begin(3)  # a PPO run's checkpoint: actor and critic
    _worker_save(tmp_dir, seed=3)
    _worker_save(tmp_dir, "critic", seed=3)
    ppo_checkpoint = manager.commit(3, trainer_state={"epoch": 0}, dataloader_state={"batches_yielded": 3})
    with caplog.at_level(logging.WARNING, logger="easyrl.trainer.checkpoint"):
        assert check_resume_point(config) == ppo_checkpoint  # resuming it without the critic is allowed, and said
    assert "holds a critic, which this run (algorithm.adv_estimator=grpo) does not train: it is left unused" in (
        caplog.text
    )
    config.algorithm.adv_estimator = "gae"
    assert check_resume_point(config) == ppo_checkpoint


def _save_model_only(manager: CheckpointManager, step: int) -> str:
    tmp_dir = manager.begin(step)
    _worker_save(tmp_dir, seed=step)
    return manager.commit(step, trainer_state={"epoch": 0})


def test_the_resume_point_is_a_resumable_checkpoint_or_a_fresh_start_in_a_folder_of_no_earlier_run(tmp_path):
    from easyrl.trainer.checkpoint import check_resume_point

    root = tmp_path / "run"
    fresh = TrainerConfig(save_checkpoint_path=str(root), find_last_checkpoint=False)
    assert check_resume_point(fresh) is None  # nothing there
    last = _save(CheckpointManager(str(root)), 2)
    assert check_resume_point(TrainerConfig(save_checkpoint_path=str(root))) == last
    with pytest.raises(
        CheckpointError, match=r"holds the checkpoints of an earlier run \(1, the last global_step_2\)"
    ):
        check_resume_point(fresh)
    # an explicit checkpoint is the user's choice, even in a folder of others
    assert check_resume_point(TrainerConfig(save_checkpoint_path=str(root), load_checkpoint_path=last)) == last

    weights_only = _save_model_only(CheckpointManager(str(tmp_path / "weights")), 3)
    with pytest.raises(CheckpointError, match=f"{weights_only} holds no .*save_model_only=true.*SFT cannot resume"):
        check_resume_point(TrainerConfig(save_checkpoint_path=str(tmp_path / "weights")), "SFT")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["weights_only", "fresh_start_among_an_earlier_runs"])
def test_a_run_that_cannot_resume_or_start_there_stops_before_ray_naming_the_fix(tmp_path, tiny_model_path, case):
    """A rerun of a trainer.save_model_only run crashed with a traceback after Ray and the engine had started; a fresh
    start among an earlier run's checkpoints mixed the two runs (its next rerun resumed the earlier one)."""
    import subprocess
    import sys

    from tests.fixtures.trainer_runs import REPO_ROOT

    save_dir = tmp_path / "run"
    manager = CheckpointManager(str(save_dir), save_limit=-1)
    if case == "weights_only":
        _save_model_only(manager, 1)
        extra, expected = [], "saved with trainer.save_model_only=true): training cannot resume from it"
    else:
        _save(manager, 2)
        extra, expected = ["trainer.find_last_checkpoint=false"], "holds the checkpoints of an earlier run"
    (save_dir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    args = [
        f"config={REPO_ROOT / 'examples' / 'smollm2_arithmetic_grpo.yaml'}",
        f"worker.actor.model.model_path={tiny_model_path}",
        f"trainer.save_checkpoint_path={save_dir}",
        *extra,
    ]
    result = subprocess.run(
        [sys.executable, "-m", "easyrl", "train", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=240
    )
    assert result.returncode != 0
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert (save_dir / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'  # nothing of the earlier run lost
    assert not (save_dir / "logs" / "actor_rollout_0.log").exists()  # no worker started


def test_a_run_validates_first_from_step_0_or_with_val_only_from_any_step():
    from easyrl.trainer.checkpoint import validates_first

    assert validates_first(TrainerConfig(), 0) and not validates_first(TrainerConfig(), 3)  # a resume does not
    assert validates_first(TrainerConfig(val_only=True, val_before_train=False), 3)  # the checkpoint's model
    assert not validates_first(TrainerConfig(val_before_train=False), 0)


def _loader(shuffle: bool, workers: int):
    from torch.utils.data import SequentialSampler
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import RandomSampler

    rows = list(range(10))
    sampler = RandomSampler(rows, generator=torch.Generator().manual_seed(1)) if shuffle else SequentialSampler(rows)
    return StatefulDataLoader(rows, batch_size=4, sampler=sampler, num_workers=workers, drop_last=True)


@pytest.mark.timeout(300)
def test_a_data_position_is_resumed_only_by_a_loader_that_can_restore_it(tmp_path):
    """check_resume_point refuses, before Ray, exactly the loader settings whose load_state_dict fails (torchdata's
    bare AssertionError at the first step): another process count, or a shuffled position without shuffling."""
    from easyrl.config import PPOConfig
    from easyrl.trainer.checkpoint import CheckpointManager, check_resume_point

    settings = [(shuffle, workers) for shuffle in (True, False) for workers in (0, 2)]
    for saved in settings:
        root = tmp_path / f"saved_{saved[0]}_{saved[1]}"
        loader = _loader(*saved)
        batches = iter(loader)
        next(batches)
        manager = CheckpointManager(str(root))
        manager.begin(1)
        path = manager.commit(1, trainer_state={"epoch": 0}, dataloader_state=loader.state_dict())
        del batches
        for shuffle, workers in settings:
            config = PPOConfig()
            config.trainer.save_checkpoint_path = str(root)
            config.data.shuffle, config.data.dataloader_num_workers = shuffle, workers
            try:
                resumed = _loader(shuffle, workers)
                resumed.load_state_dict(load_dataloader_state(path))
                next(iter(resumed))  # a loader with processes reads the state when its iterator starts
                restorable = True
            except AssertionError:
                restorable = False
            if restorable:
                assert check_resume_point(config) == path, (saved, shuffle, workers)
                continue
            with pytest.raises(CheckpointError, match=f"Cannot resume from {path}: data.") as refused:
                check_resume_point(config)
            message = str(refused.value)
            assert ("dataloader_num_workers is" in message) == (workers != saved[1]), (saved, shuffle, workers)
            assert ("data.shuffle is true in the checkpoint" in message) == (saved[0] and not shuffle), message
            assert message.endswith("or start afresh in a new trainer.save_checkpoint_path.")


def test_a_checkpoint_records_the_digests_of_the_files_a_run_reads_and_a_resume_names_the_edited_ones(
    valid_args, tmp_path
):
    from easyrl.config import load_config
    from easyrl.trainer.checkpoint import changed_input_files, input_file_digests

    template = tmp_path / "format.jinja"
    template.write_text("{{ content }} Think first.")
    env = tmp_path / "env.py"
    env.write_text(
        "class Counter:\n    def reset(self, **kwargs):\n        return ''\n\n    def add(self, x: int) -> str:\n        '''Add.\n\n        Args:\n            x: n\n        '''\n        return str(x)\n"
    )
    config = load_config(
        [*valid_args, f"data.format_prompt={template}", f"worker.rollout.multi_turn.env={env}:Counter"]
    )
    saved = input_file_digests(config)
    assert sorted(saved) == [
        "data.format_prompt", "worker.reward.reward_function", "worker.rollout.multi_turn.env"
    ]  # fmt: skip
    assert all(len(digest) == 16 for digest in saved.values())
    assert changed_input_files(saved, input_file_digests(config)) == []
    (tmp_path / "my_reward.py").write_text((tmp_path / "my_reward.py").read_text() + "# fixed\n")
    template.write_text("{{ content }} Answer at once.")
    assert changed_input_files(saved, input_file_digests(config)) == [
        "data.format_prompt", "worker.reward.reward_function"
    ]  # fmt: skip
    assert changed_input_files(None, input_file_digests(config)) == []  # a checkpoint of an earlier version


def test_a_model_only_checkpoint_given_as_load_checkpoint_path_says_how_to_start_from_its_weights(tmp_path):
    manager = CheckpointManager(str(tmp_path / "other"))
    tmp_dir = manager.begin(2)
    _worker_save(tmp_dir, seed=2)
    path = manager.commit(2, trainer_state={"epoch": 0}, dataloader_state=None)
    config = TrainerConfig(save_checkpoint_path=str(tmp_path / "new"), load_checkpoint_path=path)
    with pytest.raises(CheckpointError) as error:
        check_resume_point(config)
    assert str(error.value).endswith(
        "training cannot resume from it. Unset trainer.load_checkpoint_path to start afresh; to start from its "
        f"weights, turn it into a model with `easyrl merge --local_dir {path}/actor` and give "
        f"{path}/actor/huggingface as worker.actor.model.model_path."
    )


def test_a_code_files_digest_covers_the_users_modules_it_imports(tmp_path, monkeypatch):
    """A reward file importing a helper module (on PYTHONPATH) scored otherwise after the helper was edited, yet
    `easyrl generate` / `eval` kept the earlier scores and a resume did not warn: only the file itself was digested."""
    from easyrl.trainer.checkpoint import code_digest, file_digest

    helpers = tmp_path / "helpers"
    (helpers / "pkg").mkdir(parents=True)
    (helpers / "grade.py").write_text("import os\nimport pkg.rules\nWEIGHT = 1.0\n")
    (helpers / "pkg" / "__init__.py").write_text("")
    (helpers / "pkg" / "rules.py").write_text("STRICT = True\n")
    reward = tmp_path / "rewards" / "my_reward.py"
    reward.parent.mkdir()
    reward.write_text("import json\nimport numpy\nfrom grade import WEIGHT\n\ndef compute_score(x):\n    return []\n")
    alone = tmp_path / "alone.py"
    alone.write_text("import json\nimport easyrl\n")
    monkeypatch.setenv("PYTHONPATH", str(helpers))
    assert code_digest(str(alone)) == file_digest(str(alone))  # as checkpoints of earlier versions recorded it
    before = code_digest(str(reward))
    assert before is not None and before != file_digest(str(reward))
    (helpers / "grade.py").write_text("import os\nimport pkg.rules\nWEIGHT = 0.5\n")
    edited_helper = code_digest(str(reward))
    (helpers / "pkg" / "rules.py").write_text("STRICT = False\n")  # followed through the helper's own imports
    edited_rules = code_digest(str(reward))
    assert len({before, edited_helper, edited_rules}) == 3
    (helpers / "grade.py").write_text("from grade import WEIGHT\n")  # a cycle ends
    assert code_digest(str(reward)) not in (before, edited_helper, edited_rules)
    monkeypatch.setenv("PYTHONPATH", "")
    assert code_digest(str(reward)) == file_digest(str(reward))  # no helper found where Python would look


def test_check_counts_the_steps_left_from_the_rows_the_saving_run_read(tmp_path, valid_args):
    """`easyrl check` reads no data: a run that finished its epochs was said to resume. The training rows the saving
    run read (trainer_state.json) give its step count, and whether anything is left."""
    from easyrl.config import load_run_plan
    from easyrl.trainer.preflight import resume_summary

    manager = CheckpointManager(str(tmp_path / "run"))
    saved = {}
    for step in (2, 4):
        _worker_save(manager.begin(step), seed=step)
        saved[step] = manager.commit(step, trainer_state={"epoch": 0, "train_rows": 33})
    plan = load_run_plan([*valid_args, f"trainer.save_checkpoint_path={tmp_path / 'run'}", "trainer.total_epochs=1"])
    counted = "counted from the 33 training rows the run that saved it read"  # 4 whole batches of 8
    assert resume_summary(plan, saved[2]).endswith(f"(after step 2); 2 of its 4 steps left ({counted})")
    assert f"(after step 4); nothing is left to train unless the data grew: the run has 4 steps ({counted}, " in (
        resume_summary(plan, saved[4])
    )
    two_epochs = load_run_plan([*valid_args, "trainer.total_epochs=2"])
    assert resume_summary(two_epochs, saved[4]).endswith("4 of its 8 steps left (" + counted + ")")
    # trainer.max_steps is the count: said without the rows; an older checkpoint without the count: nothing claimed
    assert resume_summary(load_run_plan([*valid_args, "trainer.max_steps=9"]), saved[4]).endswith("(after step 4)")
    old = _save(CheckpointManager(str(tmp_path / "old")), 4)
    assert resume_summary(plan, old).endswith("(after step 4)")

"""The resolved config kept in a run's folder (easyrl/trainer/run_config.py)."""

import logging

import pytest
import yaml

from easyrl.config import config_to_yaml, load_run_plan
from easyrl.trainer.run_config import record_run_config


def _config_yaml(*overrides: str) -> str:
    return config_to_yaml(load_run_plan(["config=examples/smollm2_arithmetic_grpo.yaml", *overrides]).config)


def test_each_start_keeps_its_config_and_a_changed_one_names_its_keys(tmp_path, caplog):
    run = tmp_path / "run"
    first = _config_yaml("trainer.max_steps=4")
    with caplog.at_level(logging.WARNING):
        assert record_run_config(str(run), first) == []
        assert record_run_config(str(run), first) == []  # a resume with the same settings: nothing to say
    assert (run / "config.yaml").read_text() == first
    assert yaml.safe_load(first)["trainer"]["max_steps"] == 4
    assert not caplog.text and sorted(p.name for p in run.iterdir()) == ["config.yaml"]

    second = _config_yaml("trainer.max_steps=8", "worker.rollout.n=2")
    with caplog.at_level(logging.WARNING):
        changes = record_run_config(str(run), second)
    assert changes == ["trainer.max_steps: 4 -> 8", "worker.rollout.n: 6 -> 2"]
    assert (run / "config.yaml").read_text() == second and (run / "config.1.yaml").read_text() == first
    assert (
        f"This run's config differs from the one the last run in {run} ran with (the folder's earlier config is kept "
        "as config.1.yaml) in 2 key(s): "
        "trainer.max_steps: 4 -> 8; worker.rollout.n: 6 -> 2." in caplog.text
    )
    # a third start with other settings again keeps the second's as config.2.yaml
    third = _config_yaml("trainer.max_steps=8", "worker.rollout.n=2", "worker.actor.optim.lr=3e-5")
    assert record_run_config(str(run), third) == ["worker.actor.optim.lr: 2e-05 -> 3e-05"]
    assert (run / "config.2.yaml").read_text() == second


def test_a_resume_names_the_changes_since_its_checkpoints_config_and_the_keys_it_keeps(tmp_path, caplog):
    """The checkpoint keeps the config it was trained with; a start that failed before its first save (its config in
    the folder) does not change what a later resume is compared with."""
    from easyrl.trainer.checkpoint import CheckpointManager

    run = tmp_path / "run"
    trained = _config_yaml("trainer.max_steps=5")
    record_run_config(str(run), trained)
    manager = CheckpointManager(str(run))
    manager.begin(5)
    checkpoint = manager.commit(5, trainer_state={"epoch": 0}, dataloader_state={})
    assert (run / "global_step_5" / "config.yaml").read_text() == trained
    record_run_config(str(run), _config_yaml("trainer.max_steps=6", "data.shuffle=false"), resumed_from=checkpoint)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        changes = record_run_config(
            str(run),
            _config_yaml("trainer.max_steps=5", "data.seed=7", "trainer.val_only=true"),
            resumed_from=checkpoint,
        )
    assert changes == ["data.seed: 1 -> 7", "trainer.val_only: False -> True"]  # not shuffle and max_steps
    assert (
        "This run's config differs from the one its checkpoint global_step_5 was trained with (the folder's earlier "
        "config is kept as config.2.yaml) in 2 key(s): data.seed: 1 -> 7; trainer.val_only: False -> True. data.seed: "
        "the shuffled order goes on as the checkpoint saved it" in caplog.text
    )
    assert yaml.safe_load((run / "config.2.yaml").read_text())["data"]["shuffle"] is False
    # a new rollout batch size counts the steps left to total_epochs in the new size from the old step number
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        resized = _config_yaml("trainer.max_steps=5", "data.rollout_batch_size=4", "worker.actor.global_batch_size=4")
        record_run_config(str(run), resized, resumed_from=checkpoint)
    assert "data.rollout_batch_size: the checkpoint's step number counts batches of the old size" in caplog.text


def test_a_val_only_look_keeps_its_config_beside_the_runs(tmp_path, caplog):
    run = tmp_path / "run"
    trained = _config_yaml("trainer.max_steps=4")
    record_run_config(str(run), trained)
    look = _config_yaml("trainer.max_steps=4", "trainer.val_only=true")
    with caplog.at_level(logging.WARNING):
        assert record_run_config(str(run), look, "validation", val_only=True) == []
    assert not caplog.text  # trainer.val_only itself is no change to announce
    assert (run / "config.yaml").read_text() == trained and (run / "val_only_config.yaml").read_text() == look
    # a second look with other settings keeps the first look's beside it, as a run's restarts do
    other = _config_yaml("trainer.max_steps=4", "trainer.val_only=true", "worker.rollout.n=2")
    assert record_run_config(str(run), other, "validation", val_only=True) == ["worker.rollout.n: 6 -> 2"]
    assert (run / "val_only_config.1.yaml").read_text() == look and (run / "config.yaml").read_text() == trained
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "val_only_config.1.yaml", "val_only_config.yaml"]


@pytest.mark.timeout(120)
def test_a_second_run_in_a_folder_a_run_is_writing_is_refused_naming_the_first(tmp_path, tiny_model_path):
    """Before: a job resubmitted while the first still ran resumed the first one's checkpoint, both trained the same
    step, and metrics.jsonl held it twice."""
    import os
    import socket

    from easyrl.trainer.main import RunSetupError, run_folder_held
    from tests.fixtures.trainer_runs import TINY_RUN_OVERRIDES, bare_run, run_easyrl

    folder = tmp_path / "run"
    with run_folder_held(str(folder)):
        with pytest.raises(RunSetupError) as refused:
            with run_folder_held(str(folder)):
                pass
        assert f"Another easyrl run is writing to {folder} (pid {os.getpid()} on {socket.gethostname()}" in str(
            refused.value
        )
        # the user's command, while the first run holds the folder: one line, nothing written, before Ray
        args = [*TINY_RUN_OVERRIDES, *bare_run(1, folder), f"worker.actor.model.model_path={tiny_model_path}"]
        second = run_easyrl("train", *args)
        assert second.returncode == 2 and f"Another easyrl run is writing to {folder}" in second.stderr
        assert "Traceback" not in second.stderr and sorted(os.listdir(folder)) == [".run.lock"]
    with run_folder_held(str(folder)):  # released with the run
        pass


def test_a_run_folder_that_cannot_be_made_is_one_line_naming_the_key(tmp_path):
    from easyrl.trainer.main import RunSetupError, run_folder_held

    (tmp_path / "a_file").write_text("")
    with pytest.raises(RunSetupError, match=r"trainer.save_checkpoint_path: cannot write to .*a_file/run \("):
        with run_folder_held(str(tmp_path / "a_file" / "run")):
            pass

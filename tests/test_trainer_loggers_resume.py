"""A run resumed from a checkpoint continues its tracker runs: one run per backend, one value per step.

Every attempt below is a real backend writing its own files (MLflow's sqlite store, TensorBoard event files, W&B and
SwanLab offline runs), read back with the backend's own reader. The first attempt logs steps 1-5 and dies; its
checkpoint is of step 3; the second attempt resumes after step 3 and logs steps 4-6 with other values.
"""

import glob
import json
import os
import re

import pytest

from easyrl.trainer.loggers import Tracker
from easyrl.trainer.loggers.record_log import read_records
from easyrl.trainer.loggers.tracker import TRACKER_STATE_FILE


FIRST = {step: float(step) for step in range(1, 6)}  # attempt 1 logs steps 1-5, then dies
SECOND = {step: 10.0 * step for step in range(4, 7)}  # attempt 2 resumes after the checkpoint of step 3


def _attempts(save_dir, loggers, second_resumes=True, first=FIRST, checkpoint=3) -> None:
    with Tracker(loggers, "proj", "exp", {"seed": 1}, str(save_dir)) as tracker:
        tracker.rewind_to(-1)  # what the trainer does at a fresh start
        for step, value in first.items():
            tracker.log({"score": value}, step)
        tracker.log_generations([{"output": f"attempt 1, step {max(first)}"}], max(first))
    with Tracker(loggers, "proj", "exp", {"seed": 1}, str(save_dir), resume=second_resumes) as tracker:
        tracker.rewind_to(checkpoint, {"score": float(checkpoint)} if second_resumes else None)
        for step, value in SECOND.items():
            tracker.log({"score": value}, step)


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # the local store under the save dir
    monkeypatch.chdir(tmp_path)

    def runs(save_dir):
        client = MlflowClient(f"sqlite:///{save_dir / 'mlflow' / 'mlflow.db'}")
        found = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
        return client, found

    return runs


def test_mlflow_continues_one_run_and_keeps_the_first_values_of_the_retrained_steps(tmp_path, mlflow_store):
    _attempts(tmp_path / "run", ["mlflow", "file"])
    client, runs = mlflow_store(tmp_path / "run")
    assert len(runs) == 1
    history = client.get_metric_history(runs[0].info.run_id, "score")
    # steps 4 and 5 were logged before the crash: MLflow cannot drop them, so it is not sent them twice
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0), (6, 60.0)]
    assert runs[0].data.params["seed"] == "1" and runs[0].info.status == "FINISHED"
    # metrics.jsonl drops the rows after the checkpoint and holds the retrained ones
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row["score"]) for row in rows] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
        (5, 50.0),
        (6, 60.0),
    ]
    state = json.loads((tmp_path / "run" / TRACKER_STATE_FILE).read_text())
    assert state == {
        "backends": {"mlflow": {"id": runs[0].info.run_id}, "file": {}},
        "held_through": {"mlflow": 6},
        "names": {"project": "proj", "experiment": "exp"},
    }


def test_mlflow_gets_the_checkpoint_row_that_the_crash_kept_from_it(tmp_path, mlflow_store):
    # the checkpoint of step 3 was written and the process died before step 3's metrics were logged
    _attempts(tmp_path / "run", ["mlflow"], first={1: 1.0, 2: 2.0})
    client, (run,) = mlflow_store(tmp_path / "run")
    history = client.get_metric_history(run.info.run_id, "score")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]


def test_a_run_that_starts_afresh_opens_a_new_mlflow_run(tmp_path, mlflow_store):
    _attempts(tmp_path / "run", ["mlflow"], second_resumes=False, checkpoint=-1)
    client, runs = mlflow_store(tmp_path / "run")
    histories = sorted([(m.step, m.value) for m in client.get_metric_history(r.info.run_id, "score")] for r in runs)
    assert histories == [list(FIRST.items()), list(SECOND.items())]


def test_a_worker_restart_in_the_same_process_does_not_send_mlflow_a_step_twice(tmp_path, mlflow_store):
    with Tracker(["mlflow"], "proj", "exp", {}, str(tmp_path / "run")) as tracker:
        tracker.rewind_to(-1)
        for step in (1, 2, 3):
            tracker.log({"score": float(step)}, step)
        tracker.rewind_to(1, {"score": 1.0})  # the workers died in step 3; the checkpoint is of step 1
        for step in (2, 3, 4):
            tracker.log({"score": 10.0 * step}, step)
    client, (run,) = mlflow_store(tmp_path / "run")
    history = client.get_metric_history(run.info.run_id, "score")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_a_tracker_added_on_resume_opens_its_run_and_gets_every_step_it_is_sent(tmp_path, mlflow_store, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    with Tracker(["tensorboard"], "proj", "exp", {}, str(tmp_path / "run")) as tracker:
        tracker.rewind_to(-1)
        for step, value in FIRST.items():
            tracker.log({"score": value}, step)
    with Tracker(["tensorboard", "mlflow"], "proj", "exp", {}, str(tmp_path / "run"), resume=True) as tracker:
        tracker.rewind_to(3, {"score": 3.0})
        for step, value in SECOND.items():
            tracker.log({"score": value}, step)
    client, (run,) = mlflow_store(tmp_path / "run")
    history = client.get_metric_history(run.info.run_id, "score")
    assert [(m.step, m.value) for m in history] == [(3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]
    assert _scalars(tmp_path / "run" / "tensorboard")[0] == [(1, 1.0), (2, 2.0), (3, 3.0), *SECOND.items()]


def test_an_mlflow_run_resumed_with_another_config_keeps_the_first_parameters(tmp_path, mlflow_store, caplog):
    with Tracker(["mlflow"], "proj", "exp", {"lr": 1.0}, str(tmp_path / "run")) as tracker:
        tracker.log({"score": 1.0}, 1)
    with Tracker(["mlflow"], "proj", "exp", {"lr": 2.0, "seed": 3}, str(tmp_path / "run"), resume=True):
        pass
    _, (run,) = mlflow_store(tmp_path / "run")
    assert run.data.params == {"lr": "1.0", "seed": "3"}
    assert "differs from the first attempt's in lr" in caplog.text


def _scalars(log_dir) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), purge_orphaned_data=False)  # what is in the files, no reader fix-ups
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars("score")], events


def test_tensorboard_rewinds_its_own_event_files_to_the_checkpoint(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from torch.utils.tensorboard import SummaryWriter

    shared = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_DIR", str(shared))
    with SummaryWriter(str(shared)) as other:  # another run writing into the same $TENSORBOARD_DIR
        other.add_scalar("other", 7.0, global_step=9)
    foreign = glob.glob(str(shared / "events.out.tfevents.*"))
    before = open(foreign[0], "rb").read()

    _attempts(tmp_path / "run", ["tensorboard"])
    scalars, events = _scalars(shared)
    assert scalars == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]
    assert "generations/text_summary" not in events.Tags()["tensors"]  # step 5's, dropped
    assert len(events.Tensors("config/text_summary")) == 1
    assert open(foreign[0], "rb").read() == before  # the other run's file is untouched
    suffix = json.loads((tmp_path / "run" / TRACKER_STATE_FILE).read_text())["backends"]["tensorboard"]["suffix"]
    ours = sorted(set(glob.glob(str(shared / "events.out.tfevents.*"))) - set(foreign))
    # the first attempt's (steps 1-3 left) and the second's; those left with the config text only are removed
    assert len(ours) == 2 and all(path.endswith(suffix) for path in ours)
    steps = set()
    for path in ours:
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

        steps |= {Event.FromString(raw).step for raw in RawEventFileLoader(path).Load()}
    assert steps == {0, 1, 2, 3, 4, 5, 6}


def test_tensorboard_restores_the_checkpoint_row_and_a_fresh_start_leaves_old_files(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    _attempts(tmp_path / "run", ["tensorboard"], first={1: 1.0, 2: 2.0})
    scalars, _ = _scalars(tmp_path / "run" / "tensorboard")
    assert scalars == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]

    # a fresh start with a new tracker state: the earlier run's files are another run's now, and kept as they are
    files = sorted(glob.glob(str(tmp_path / "run" / "tensorboard" / "*")))
    with Tracker(["tensorboard"], "proj", "exp", {}, str(tmp_path / "run")) as tracker:
        tracker.rewind_to(-1)
    assert set(files) < set(glob.glob(str(tmp_path / "run" / "tensorboard" / "*")))
    assert _scalars(tmp_path / "run" / "tensorboard")[0] == scalars


def _wandb_runs(save_dir) -> list[tuple[str, str]]:
    """(folder, run id) of each offline run: offline-run-<time>-<id>, with a suffix when two share a second."""
    runs = []
    for folder in glob.glob(str(save_dir / "wandb" / "offline-run-*")):
        match = re.fullmatch(r"offline-run-\d{8}_\d{6}-([a-z0-9]+)(-\d+)?", os.path.basename(folder))
        assert match, folder
        runs.append((folder, match.group(1)))
    assert len(runs) == 2, runs
    return runs


def _wandb_steps(run_dir) -> dict[int, float]:
    from wandb.proto import wandb_internal_pb2

    (run_file,) = glob.glob(os.path.join(run_dir, "*.wandb"))
    steps = {}
    for raw in read_records(run_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            if "score" in items:
                steps[items["_step"]] = items["score"]
    return steps


def test_wandb_continues_the_run_id_and_is_not_sent_the_steps_it_holds(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    _attempts(tmp_path / "run", ["wandb"])
    (first, first_id), (second, second_id) = _wandb_runs(tmp_path / "run")
    assert first_id == second_id  # the same W&B run, continued
    assert sorted([_wandb_steps(first), _wandb_steps(second)], key=min) == [FIRST, {6: 60.0}]

    _attempts(tmp_path / "fresh", ["wandb"], second_resumes=False, checkpoint=-1)
    (first, first_id), (second, second_id) = _wandb_runs(tmp_path / "fresh")
    assert first_id != second_id
    assert sorted([_wandb_steps(first), _wandb_steps(second)], key=min) == [FIRST, SECOND]


def test_swanlab_continues_the_run_id_and_is_not_sent_the_steps_it_holds(tmp_path, monkeypatch):
    pytest.importorskip("swanlab")
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.delenv("SWANLAB_LOGDIR", raising=False)
    _attempts(tmp_path / "run", ["swanlab"])
    runs = sorted(glob.glob(str(tmp_path / "run" / "swanlog" / "run-*")))
    assert len(runs) == 2 and runs[0].rsplit("-", 1)[1] == runs[1].rsplit("-", 1)[1]
    scalars = []
    for run_dir in runs:
        reader = DataStoreReader()
        reader.open(glob.glob(os.path.join(run_dir, "*.swanlab"))[0])
        found = {}
        while (raw := reader.scan()) is not None:
            record = Record()
            record.ParseFromString(raw)
            if record.HasField("scalar") and record.scalar.key == "score":
                found[record.scalar.step] = record.scalar.value.number
        reader.close()
        scalars.append(found)
    assert scalars == [FIRST, {6: 60.0}]


def test_an_mlflow_run_the_store_does_not_hold_is_started_anew_and_sent_every_step(tmp_path, mlflow_store, caplog):
    _attempts(tmp_path / "run", ["mlflow"])
    state_path = tmp_path / "run" / TRACKER_STATE_FILE
    state = json.loads(state_path.read_text())
    state["backends"]["mlflow"]["id"] = "0" * 32  # e.g. MLFLOW_TRACKING_URI now names another store
    state_path.write_text(json.dumps(state))
    with Tracker(["mlflow"], "proj", "exp", {}, str(tmp_path / "run"), resume=True) as tracker:
        tracker.rewind_to(6, {"score": 60.0})
        tracker.log({"score": 70.0}, 7)
    assert "cannot continue run 000" in caplog.text
    client, runs = mlflow_store(tmp_path / "run")
    newest = max(runs, key=lambda run: run.info.start_time)
    history = client.get_metric_history(newest.info.run_id, "score")
    assert len(runs) == 2 and [(m.step, m.value) for m in history] == [(6, 60.0), (7, 70.0)]


def test_an_unreadable_tracker_state_starts_new_runs_and_says_so(tmp_path, mlflow_store, caplog):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / TRACKER_STATE_FILE).write_text('{"backends": {"mlflow": {"id"')  # cut short by a crash
    with Tracker(["mlflow"], "proj", "exp", {}, str(tmp_path / "run"), resume=True) as tracker:
        tracker.log({"score": 1.0}, 1)
    assert "is unreadable" in caplog.text
    _, (run,) = mlflow_store(tmp_path / "run")
    state = json.loads((tmp_path / "run" / TRACKER_STATE_FILE).read_text())
    assert state["backends"]["mlflow"]["id"] == run.info.run_id and state["held_through"] == {"mlflow": 1}


def test_tensorboard_restores_the_scalars_of_a_step_that_a_kill_cut_short(tmp_path, monkeypatch):
    """A kill while step 3's scalars were being written leaves some on disk (the writer drains its queue every few
    events): the others come back from the checkpoint's row, and those on disk are not written twice."""
    pytest.importorskip("tensorboard")
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    save_dir = tmp_path / "run"
    with Tracker(["tensorboard"], "proj", "exp", {}, str(save_dir)) as tracker:
        tracker.rewind_to(-1)
        tracker.log({"score": 1.0, "loss": 0.1}, 1)
        tracker.log({"score": 3.0}, 3)  # "loss" of step 3 never reached the file
    with Tracker(["tensorboard"], "proj", "exp", {}, str(save_dir), resume=True) as tracker:
        tracker.rewind_to(3, {"score": 3.0, "loss": 0.3})
        tracker.log({"score": 40.0, "loss": 0.4}, 4)
    scalars, events = _scalars(save_dir / "tensorboard")
    assert scalars == [(1, 1.0), (3, 3.0), (4, 40.0)]
    assert [(event.step, round(event.value, 6)) for event in events.Scalars("loss")] == [(1, 0.1), (3, 0.3), (4, 0.4)]


def test_a_val_only_look_at_an_earlier_checkpoint_keeps_the_history_and_opens_new_tracker_runs(tmp_path, mlflow_store):
    """trainer.val_only on global_step_3 of a run that went on to step 5 dropped steps 4-5 from metrics.jsonl (as if
    they would be trained again: nothing is), and MLflow, which held step 3, never got the validation."""
    save_dir = tmp_path / "run"
    with Tracker(["mlflow", "file"], "proj", "exp", {"seed": 1}, str(save_dir)) as tracker:
        tracker.rewind_to(-1)
        for step, value in FIRST.items():
            tracker.log({"score": value}, step)
    state = (save_dir / TRACKER_STATE_FILE).read_text()
    with Tracker(["mlflow", "file"], "proj", "exp", {}, str(save_dir), resume=True, val_only=True) as tracker:
        tracker.rewind_to(3, {"score": 3.0})  # what the trainer's resume does
        tracker.log({"val/score": 0.5}, 3)
    rows = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row.get("score"), row.get("val/score")) for row in rows] == [
        *((step, value, None) for step, value in FIRST.items()),
        (3, None, 0.5),
    ]
    client, runs = mlflow_store(save_dir)
    assert len(runs) == 2  # the training run as it was, and the look's own
    by_metric = {tuple(sorted(run.data.metrics)): run for run in runs}
    training, look = by_metric[("score",)], by_metric[("val/score",)]
    assert [(m.step, m.value) for m in client.get_metric_history(training.info.run_id, "score")] == list(FIRST.items())
    assert [(m.step, m.value) for m in client.get_metric_history(look.info.run_id, "val/score")] == [(3, 0.5)]
    assert (save_dir / TRACKER_STATE_FILE).read_text() == state  # a later resume continues the training run


def test_a_resume_under_new_project_or_experiment_names_keeps_the_tracker_runs_names(tmp_path, mlflow_store, caplog):
    """Renamed between the attempts, MLflow opened a second run (steps from the checkpoint on) while W&B and SwanLab
    reopened the run's id under the new names: the history split three ways."""
    save_dir = tmp_path / "run"
    with Tracker(["mlflow", "file"], "proj", "exp", {}, str(save_dir)) as tracker:
        tracker.rewind_to(-1)
        for step in (1, 2, 3):
            tracker.log({"score": float(step)}, step)
    with caplog.at_level("WARNING", logger="easyrl.trainer.loggers.tracker"):
        with Tracker(["mlflow", "file"], "proj2", "exp2", {}, str(save_dir), resume=True) as tracker:
            tracker.rewind_to(3, {"score": 3.0})
            tracker.log({"score": 4.0}, 4)
    client, runs = mlflow_store(save_dir)
    assert len(runs) == 1 and runs[0].info.run_name == "exp"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "score")] == [1, 2, 3, 4]
    assert (
        "trainer.project_name / experiment_name are proj2 / exp2, but the tracker runs this resume continues were "
        "opened as proj / exp: they keep those names." in caplog.text
    )
    assert json.loads((save_dir / TRACKER_STATE_FILE).read_text())["names"] == {"project": "proj", "experiment": "exp"}

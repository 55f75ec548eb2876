"""Logger backends write what they are given, in a form their own readers load back."""

import glob
import importlib.util
import json
import os

import numpy as np
import pytest
import torch

from easyrl.config import PPOConfig, config_to_dict
from easyrl.trainer.loggers import LoggerStartError, MissingLoggerPackage, Tracker
from easyrl.trainer.loggers.base import flatten_dict, import_backend
from easyrl.trainer.loggers.console import format_console_line
from easyrl.trainer.loggers.record_log import read_records


STEPS = {1: {"critic/score/mean": 0.25, "response_length/mean": 40.0}, 2: {"critic/score/mean": 0.5}}
SAMPLES = [
    {"input": "1+1=", "output": "\\boxed{2}", "ground_truth": "2", "score": 1.0},
    {"input": "2+3=", "output": "six | maybe\nseven", "ground_truth": "5", "score": 0.0},
]


def _run(tmp_path, loggers, config=None) -> None:
    with Tracker(loggers, "proj", "exp", config or {"data": {"seed": 1}}, str(tmp_path), total_steps=2) as tracker:
        for step, metrics in STEPS.items():
            tracker.log(metrics, step)
        tracker.log_generations(SAMPLES, step=2)


def test_unknown_logger_name_lists_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"unknown logger 'nope'.*'console'"):
        Tracker(["console", "nope"], "proj", "exp", {}, str(tmp_path))


def test_same_logger_twice_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="twice"):
        Tracker(["file", "file"], "proj", "exp", {}, str(tmp_path))


def test_missing_backend_package_names_the_extra_and_the_config_key():
    with pytest.raises(MissingLoggerPackage) as error:
        import_backend("easyrl_no_such_backend_module", "fancylog", "fancylog")
    message = str(error.value)
    assert "pip install 'easyrl[loggers]'" in message
    assert "pip install fancylog" in message
    assert "trainer.logger" in message


def test_console_line_shows_key_metrics_and_validation():
    line = format_console_line(
        {"critic/score/mean": 0.25, "actor/pg_loss": -0.0123456, "val/accuracy": 0.5, "other/x": 3.0}, 3, 10
    )
    assert line == "step 3/10 | score 0.25 | pg_loss -0.01235 | val/accuracy 0.5"


def test_console_line_of_online_filtering_says_how_many_groups_were_kept():
    metrics = {"critic/score/mean": 0.5125, "reward/accuracy": 0.4062, "filter/kept_groups": 4.0}
    line = format_console_line({**metrics, "filter/dropped_groups": 4.0}, 2, 5)
    # score covers the kept groups, acc every sample generated: the label says which
    assert line == "step 2/5 | kept 4/8 groups | kept_score 0.5125 | acc 0.4062"
    # groups past the batch that passed the filter were generated too: counted among all, not among the kept
    line = format_console_line({**metrics, "filter/dropped_groups": 4.0, "filter/surplus_groups": 1.0}, 2, 5)
    assert line.startswith("step 2/5 | kept 4/9 groups |")


def test_console_prints_one_line_per_step_and_a_generation(tmp_path, capsys):
    _run(tmp_path, ["console"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert lines[0] == "step 1/2 | score 0.25 | resp_len 40"
    assert lines[1] == "step 2/2 | score 0.5"
    assert lines[2].startswith("[generation, step 2] input: 1+1= | output: \\boxed{2}")


def test_console_progress_bar_of_a_resumed_run_starts_at_its_first_step(tmp_path, capsys):
    with Tracker(["console"], "proj", "exp", {}, str(tmp_path), total_steps=10) as tracker:
        tracker.log({"critic/score/mean": 0.5}, step=7)
        bar = tracker.backends["console"].bar
        # the rate counts the steps timed by the bar: step 7 ended before the bar existed
        assert (bar.n, bar.total) == (7, 10) and bar.format_dict["initial"] == 7
        tracker.log({"critic/score/mean": 0.5}, step=8)
        assert bar.n == 8


def test_file_logger_writes_metrics_and_generations_as_json_lines(tmp_path):
    _run(tmp_path, ["file"])
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [{"step": 1, **STEPS[1]}, {"step": 2, **STEPS[2]}]
    generations = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert generations == [{"step": 2, **sample} for sample in SAMPLES]


def test_file_logger_appends_when_a_run_resumes(tmp_path):
    _run(tmp_path, ["file"])
    with Tracker(["file"], "proj", "exp", {}, str(tmp_path)) as tracker:
        tracker.log({"critic/score/mean": 0.75}, step=3)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_tracker_turns_tensors_and_numpy_scalars_into_floats(tmp_path):
    with Tracker(["file"], "proj", "exp", {}, str(tmp_path)) as tracker:
        tracker.log({"a": torch.tensor(0.5), "b": np.float32(1.5), "c": np.array([2]), "d": 3}, step=1)
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row == {"step": 1, "a": 0.5, "b": 1.5, "c": 2.0, "d": 3.0}
    assert all(type(value) is float for key, value in row.items() if key != "step")


def test_tracker_rejects_a_non_scalar_metric_by_name(tmp_path):
    with Tracker(["file"], "proj", "exp", {}, str(tmp_path)) as tracker:
        with pytest.raises(TypeError, match="metric 'actor/lr'"):
            tracker.log({"actor/lr": torch.ones(3)}, step=1)


def test_tensorboard_events_hold_the_scalars_and_generations(tmp_path, monkeypatch):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    _run(tmp_path, ["tensorboard"])
    events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("critic/score/mean")] == [(1, 0.25), (2, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("response_length/mean")] == [(1, 40.0)]
    (text_event,) = events.Tensors("generations/text_summary")
    table = text_event.tensor_proto.string_val[0].decode()
    assert text_event.step == 2 and "| input | output | ground_truth | score |" in table
    assert "six \\| maybe<br>seven" in table  # cells with a pipe or newline stay in one table cell


def test_mlflow_run_holds_metrics_params_and_generations(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # unset for the logger; restored after (MLflow exports it)
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    config = config_to_dict(PPOConfig())  # ~200 parameters: more than one MLflow batch
    _run(tmp_path / "run", ["mlflow", "file"], config=config)

    client = MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5)]
    assert run.data.params["worker.rollout.n"] == str(config["worker"]["rollout"]["n"])
    assert len(run.data.params) == len(flatten_dict(config))
    table_path = client.download_artifacts(run.info.run_id, "generations/step_2.json", str(tmp_path / "dl"))
    table = json.loads(open(table_path).read())
    assert table["columns"] == ["input", "output", "ground_truth", "score"]
    assert table["data"][1][1] == "six | maybe\nseven"
    assert sorted(os.listdir(tmp_path)) == ["dl", "run"]


def test_wandb_offline_run_holds_history_config_and_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _run(tmp_path, ["wandb"])

    (run_dir,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    (run_file,) = glob.glob(os.path.join(run_dir, "*.wandb"))
    history, config = {}, {}
    assert open(run_file, "rb").read(4) == b":W&B"
    for raw in read_records(run_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {
                "/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item
            }
            history.setdefault(items["_step"], {}).update(items)
        elif kind == "run":
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
    assert config["data"] == {"seed": 1}
    assert history[1]["critic/score/mean"] == 0.25 and history[1]["response_length/mean"] == 40
    assert history[2]["critic/score/mean"] == 0.5
    (table_file,) = glob.glob(os.path.join(run_dir, "files", "media", "table", "generations_2_*.table.json"))
    table = json.loads(open(table_file).read())
    assert table["columns"] == ["input", "output", "ground_truth", "score"]
    assert table["data"][0] == ["1+1=", "\\boxed{2}", "2", 1.0]


def test_swanlab_offline_run_holds_scalars_config_and_texts(tmp_path, monkeypatch):
    pytest.importorskip("swanlab")
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.delenv("SWANLAB_LOGDIR", raising=False)
    _run(tmp_path, ["swanlab"])

    (run_dir,) = glob.glob(str(tmp_path / "swanlog" / "run-*"))
    reader = DataStoreReader()
    reader.open(glob.glob(os.path.join(run_dir, "*.swanlab"))[0])
    scalars, finished = {}, False
    while (raw := reader.scan()) is not None:
        record = Record()
        record.ParseFromString(raw)
        if record.HasField("scalar"):
            scalars[(record.scalar.key, record.scalar.step)] = record.scalar.value.number
        finished = finished or record.HasField("finish")
    reader.close()
    assert scalars[("critic/score/mean", 1)] == 0.25 and scalars[("critic/score/mean", 2)] == 0.5
    assert scalars[("response_length/mean", 1)] == 40.0
    assert finished
    assert "seed: 1" in open(os.path.join(run_dir, "files", "config.yaml")).read()
    texts = sorted(open(path).read() for path in glob.glob(os.path.join(run_dir, "media", "text", "*.txt")))
    assert any("[output] \\boxed{2}" in text for text in texts) and len(texts) == 2


def _no_login(monkeypatch, tmp_path, prefix: str) -> None:
    """A fresh home without saved credentials, and no credentials or mode in the environment."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in [name for name in os.environ if name.startswith(prefix)]:
        monkeypatch.delenv(name)


def test_wandb_without_login_says_how_to_log_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    _no_login(monkeypatch, tmp_path, "WANDB_")
    with pytest.raises(LoggerStartError, match="WANDB_MODE=offline.*remove 'wandb' from trainer.logger"):
        Tracker(["file", "wandb"], "proj", "exp", {}, str(tmp_path / "run"))


def test_swanlab_without_login_says_how_to_log_locally(tmp_path, monkeypatch):
    pytest.importorskip("swanlab")
    _no_login(monkeypatch, tmp_path, "SWANLAB_")
    with pytest.raises(LoggerStartError, match="SWANLAB_MODE=offline.*remove 'swanlab' from trainer.logger"):
        Tracker(["swanlab"], "proj", "exp", {}, str(tmp_path / "run"))


@pytest.mark.parametrize(
    ("logger", "prefix", "setting", "can_start"),
    [
        ("wandb", "WANDB_", {}, False),
        ("wandb", "WANDB_", {"WANDB_MODE": "offline"}, True),
        ("wandb", "WANDB_", {"WANDB_MODE": "disabled"}, True),
        ("wandb", "WANDB_", {"WANDB_API_KEY": "x" * 40}, True),
        ("wandb", "WANDB_", {"netrc": "machine api.wandb.ai login user password " + "x" * 40}, True),
        ("wandb", "WANDB_", {"netrc": "machine example.org login user password secret"}, False),
        ("swanlab", "SWANLAB_", {}, False),
        ("swanlab", "SWANLAB_", {"SWANLAB_MODE": "local"}, True),
        ("swanlab", "SWANLAB_", {"SWANLAB_API_KEY": "x" * 21}, True),
        ("swanlab", "SWANLAB_", {"swanlab_netrc": "machine api.swanlab.cn login user password secret"}, True),
    ],
)
def test_start_problem_is_known_without_starting_the_backend(
    tmp_path, monkeypatch, logger, prefix, setting, can_start
):
    # `easyrl check` asks this (no import of the backend) so that a run that cannot log stops before Ray starts
    from easyrl.trainer.loggers import get_logger_class

    _no_login(monkeypatch, tmp_path, prefix)
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    for name, value in setting.items():
        if name == "netrc":
            home.mkdir(exist_ok=True)
            (home / ".netrc").write_text(value + "\n")
        elif name == "swanlab_netrc":
            (home / ".swanlab").mkdir(parents=True)
            (home / ".swanlab" / ".netrc").write_text(value + "\n")
        else:
            monkeypatch.setenv(name, value)
    problem = get_logger_class(logger).start_problem()
    assert (problem is None) == can_start, problem
    if problem is not None:
        assert "MODE" in problem and "API_KEY" in problem
    for name in ("console", "file", "tensorboard", "mlflow"):
        assert get_logger_class(name).start_problem() is None


def test_every_tracker_that_cannot_start_is_named_at_once(tmp_path, monkeypatch):
    # before: only the first was named, and fixing it led to a second refusal for the next
    from easyrl.config import ConfigError
    from easyrl.config.validate import _check_loggers_can_start

    _no_login(monkeypatch, tmp_path, "WANDB_")
    _no_login(monkeypatch, tmp_path, "SWANLAB_")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        _check_loggers_can_start(["console", "wandb", "swanlab"])
    lines = str(refused.value).splitlines()
    assert [line.split("'")[1] for line in lines] == ["wandb", "swanlab"]
    assert "WANDB_MODE" in lines[0] and "SWANLAB_MODE" in lines[1]
    _check_loggers_can_start(["console", "file"])  # nothing to refuse


def test_wandb_writes_under_the_users_wandb_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    _run(tmp_path / "run", ["wandb"])
    assert glob.glob(str(tmp_path / "elsewhere" / "wandb" / "offline-run-*" / "*.wandb"))
    assert not (tmp_path / "run" / "wandb").exists()


def test_swanlab_local_without_its_viewer_says_the_metrics_are_kept(tmp_path, monkeypatch, caplog):
    pytest.importorskip("swanlab")
    if importlib.util.find_spec("swanboard") is not None:
        pytest.skip("swanboard is installed: the viewer starts")
    monkeypatch.setenv("SWANLAB_MODE", "local")
    monkeypatch.delenv("SWANLAB_LOGDIR", raising=False)
    with caplog.at_level("WARNING"):
        _run(tmp_path, ["swanlab"])
    assert "SWANLAB_MODE=local: SwanLab's viewer needs the swanboard package" in caplog.text
    assert f"the metrics are written to {tmp_path / 'swanlog'} all the same" in caplog.text
    assert glob.glob(str(tmp_path / "swanlog" / "run-*" / "*.swanlab"))

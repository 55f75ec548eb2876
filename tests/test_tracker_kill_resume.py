"""A driver killed with SIGKILL loses no tracker step, and none twice: W&B and SwanLab write what they are logged
seconds later (W&B's service process every ~15 s, SwanLab's thread through a file buffer), and die with the driver.

Each attempt below is a real process logging through easyrl's Tracker to offline W&B / SwanLab runs; the test kills it
from outside with SIGKILL at a known point, resumes from a checkpoint step as the trainer would, and reads back every
attempt's files record by record: each step must be in exactly one of them. A value is ``100 * attempt + step``.
"""

import glob
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib

import pytest

from easyrl.trainer.loggers.record_log import BLOCK_SIZE, RecordFile, read_records


def _attempt(args: dict) -> None:
    """One attempt at the run (in its own process): resume after ``checkpoint``, log ``steps``, then finish or wait
    to be killed."""
    from easyrl.trainer.loggers import Tracker

    tracker = Tracker(args["loggers"], "proj", "exp", {}, args["save_dir"], resume=args["checkpoint"] >= 0)
    row = args.get("checkpoint_row")
    tracker.rewind_to(args["checkpoint"], row)
    for step, value in args["steps"]:
        tracker.log({"score": value}, step)
    wait = args.get("wait_until_wandb_holds")
    deadline = time.monotonic() + 150  # W&B writes every ~15 s; far slower on a loaded machine
    while wait is not None and wait not in _wandb_scores(tracker.backends["wandb"].wandb_run.settings.sync_file):
        if time.monotonic() > deadline:
            sys.exit(f"wandb never wrote step {wait}")
        time.sleep(0.2)
    if args["end"] == "finish":
        tracker.finish()
        return
    print("LOGGED", flush=True)
    time.sleep(600)  # the test kills this process now


def _run_attempt(save_dir, loggers, attempt: int, checkpoint: int, steps, end: str, **extra) -> str:
    """Runs one attempt; returns what it logged to stderr (easyrl's warnings)."""
    args = {"save_dir": str(save_dir), "loggers": loggers, "checkpoint": checkpoint, "end": end, **extra}
    args["steps"] = [(step, 100.0 * attempt + step) for step in steps]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "SWANLAB_MODE": "offline"}
    env.pop("WANDB_RUN_ID", None)
    env.pop("SWANLAB_LOGDIR", None)
    command = [sys.executable, __file__, json.dumps(args)]
    process = subprocess.Popen(
        command, cwd=save_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if end == "kill":
        for line in process.stdout:  # SwanLab prints to stdout too
            if line.strip() == "LOGGED":
                break
        os.kill(process.pid, signal.SIGKILL)  # a child that ended before logging fails the return code check
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == (-signal.SIGKILL if end == "kill" else 0), stderr
    return stderr


def _wandb_attempts(save_dir) -> list[dict[int, float]]:
    """Per attempt (in the order they ran): the ``score`` of each step its transaction log holds."""
    return [
        _wandb_scores(path) for path in sorted(glob.glob(str(save_dir / "wandb" / "offline-run-*" / "run-*.wandb")))
    ]


def _wandb_scores(path: str) -> dict[int, float]:
    """The ``score`` of each step one W&B transaction log holds."""
    from wandb.proto import wandb_internal_pb2

    scores = {}
    for raw in read_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        items = {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
        if "score" in items:
            assert record.history.step.num not in scores, f"step {record.history.step.num} twice in {path}"
            scores[record.history.step.num] = items["score"]
    return scores


def _swanlab_attempts(save_dir) -> list[dict[int, float]]:
    """Per attempt: the ``score`` of each step its SwanLab store holds."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    attempts = []
    for path in sorted(glob.glob(str(save_dir / "swanlog" / "run-*" / "run-*.swanlab"))):
        scores = {}
        for raw in read_records(path):
            record = Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "scalar" and record.scalar.key == "score":
                assert record.scalar.step not in scores, f"step {record.scalar.step} twice in {path}"
                scores[record.scalar.step] = record.scalar.value.number
        attempts.append(scores)
    return attempts


@pytest.fixture
def save_dir(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    return path


def test_steps_a_kill_took_from_wandb_and_swanlab_are_sent_again_after_the_resume(save_dir):
    pytest.importorskip("wandb")
    pytest.importorskip("swanlab")
    loggers = ["file", "wandb", "swanlab"]
    _run_attempt(save_dir, loggers, 1, -1, [1, 2, 3, 4], "finish")
    # attempt 2 resumes after the checkpoint of step 4 and is killed right after logging step 7: W&B and SwanLab
    # had written none of steps 5-7
    _run_attempt(save_dir, loggers, 2, 4, [5, 6, 7], "kill")
    state = json.loads((save_dir / "tracker_state.json").read_text())
    assert state["held_through"] == {"wandb": 4, "swanlab": 4}  # not 7: they had not written 5-7
    # attempt 3 resumes after the checkpoint of step 6: steps 5 and 6 are sent again with attempt 2's values, step 7
    # is trained again
    stderr = _run_attempt(save_dir, loggers, 3, 6, [7, 8], "finish", checkpoint_row={"score": 206.0})
    assert "Steps 5-6 never reached wandb before the resume" in stderr
    assert "Steps 5-6 never reached swanlab before the resume" in stderr
    assert "the run trains them again" not in stderr  # no step after the checkpoint reached a tracker

    one_value_per_step = {1: 101.0, 2: 102.0, 3: 103.0, 4: 104.0, 5: 205.0, 6: 206.0, 7: 307.0, 8: 308.0}
    assert _wandb_attempts(save_dir) == [
        {1: 101.0, 2: 102.0, 3: 103.0, 4: 104.0},
        {},
        {5: 205.0, 6: 206.0, 7: 307.0, 8: 308.0},
    ]
    swanlab = _swanlab_attempts(save_dir)
    assert swanlab == [{1: 101.0, 2: 102.0, 3: 103.0, 4: 104.0}, {}, {5: 205.0, 6: 206.0, 7: 307.0, 8: 308.0}]
    rows = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
    assert {row["step"]: row["score"] for row in rows} == one_value_per_step and len(rows) == 8
    state = json.loads((save_dir / "tracker_state.json").read_text())
    assert state["held_through"] == {"wandb": 8, "swanlab": 8} and "unstored" not in state


@pytest.mark.timeout(300)  # waits for W&B's service to write its file (every ~15 s)
def test_wandb_keeps_the_steps_it_wrote_before_a_kill_and_gets_those_it_lost(save_dir):
    pytest.importorskip("wandb")
    loggers = ["file", "wandb"]
    _run_attempt(save_dir, loggers, 1, -1, [1, 2, 3, 4], "finish")
    # attempt 2 logs steps 5-8, waits until W&B has written step 7 (step 8's row stays open until a step 9), and is
    # killed; the checkpoint is of step 6
    _run_attempt(save_dir, loggers, 2, 4, [5, 6, 7, 8], "kill", wait_until_wandb_holds=7)
    stderr = _run_attempt(save_dir, loggers, 3, 6, [7, 8, 9], "kill", checkpoint_row={"score": 206.0})
    # true: step 7 is in attempt 2's file, so W&B keeps its first value; step 8 never got there and is trained again
    assert "Step 7 reached wandb before the resume" in stderr
    assert "never reached wandb" not in stderr
    # attempt 3 was killed before W&B wrote anything: the checkpoint of step 9 brings back its steps 8 and 9
    stderr = _run_attempt(save_dir, loggers, 4, 9, [10], "finish", checkpoint_row={"score": 309.0})
    assert "Steps 8-9 never reached wandb before the resume" in stderr

    attempts = _wandb_attempts(save_dir)
    assert attempts == [
        {1: 101.0, 2: 102.0, 3: 103.0, 4: 104.0},
        {5: 205.0, 6: 206.0, 7: 207.0},
        {},
        {8: 308.0, 9: 309.0, 10: 410.0},
    ]
    rows = [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, 11))


def _chunk(kind: int, payload: bytes) -> bytes:
    return struct.pack("<IHB", zlib.crc32(bytes([kind]) + payload), len(payload), kind) + payload


def test_a_record_file_cut_anywhere_gives_its_whole_records_and_the_rest_once_written(tmp_path):
    # a header, a small record, then one spanning the first block boundary (FIRST + LAST chunks), then a small one
    first_room = BLOCK_SIZE - 7 - (7 + 5) - 7
    data = b":W&B\xe1\xbe\x00" + _chunk(1, b"small") + _chunk(2, b"a" * first_room) + _chunk(4, b"b" * 100)
    data += _chunk(1, b"last")
    path = tmp_path / "run.wandb"
    follower, seen = RecordFile(str(path)), []
    for cut in [*range(0, len(data), 997), len(data)]:
        path.write_bytes(data[:cut])
        seen += follower.new_records()
        assert all(isinstance(record, bytes) for record in seen)
    assert seen == [b"small", b"a" * first_room + b"b" * 100, b"last"] == read_records(str(path))


if __name__ == "__main__":
    _attempt(json.loads(sys.argv[1]))

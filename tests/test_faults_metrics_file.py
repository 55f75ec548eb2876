"""metrics.jsonl agrees with the checkpoint a run resumes from: one row per step, whatever killed the run."""

import json

from easyrl.trainer.loggers import Tracker
from easyrl.trainer.loggers.file import rewind_jsonl


def _write(path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def _steps(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_rows_of_steps_after_the_checkpoint_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    # val_before_train (0), steps 1-4 logged; the run died in step 5 and resumes from the checkpoint of step 2
    _write(path, [json.dumps({"step": s, "x": s / 10}) for s in range(5)])
    assert rewind_jsonl(str(path), 2) == (2, 0, False)
    assert _steps(path) == [0, 1, 2]
    assert json.loads(path.read_text().splitlines()[2]) == {"step": 2, "x": 0.2}


def test_the_row_of_the_checkpoint_step_is_restored_when_the_crash_came_before_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, [json.dumps({"step": 1, "x": 1.0})])  # checkpoint of step 2 committed, its row never written
    assert rewind_jsonl(str(path), 2, restore_row={"x": 2.0, "step": 2}) == (0, 0, True)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"step": 1, "x": 1.0},
        {"step": 2, "x": 2.0},
    ]
    # present already: left alone, nothing rewritten
    assert rewind_jsonl(str(path), 2, restore_row={"x": 99.0}) == (0, 0, False)
    assert json.loads(path.read_text().splitlines()[1])["x"] == 2.0


def test_a_line_cut_short_by_a_crash_is_dropped_and_counted(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n{"step": 3, "x"')
    assert rewind_jsonl(str(path), 3) == (0, 1, False)
    assert _steps(path) == [1, 2]


def test_a_fresh_start_drops_every_row_of_an_earlier_attempt(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, [json.dumps({"step": s}) for s in (0, 1)])
    assert rewind_jsonl(str(path), -1) == (2, 0, False)
    assert path.read_text() == ""
    assert rewind_jsonl(str(tmp_path / "absent.jsonl"), -1) == (0, 0, False)
    assert not (tmp_path / "absent.jsonl").exists()


def test_a_fresh_start_says_whose_rows_it_drops(tmp_path, caplog):
    """An attempt that saved no checkpoint is trained again from the beginning: said so, not as a resume after
    step -1."""
    tracker = Tracker(["file"], "p", "e", save_dir=str(tmp_path))
    tracker.log({"x": 1.0}, step=1)
    tracker.finish()
    tracker = Tracker(["file"], "p", "e", save_dir=str(tmp_path))
    tracker.rewind_to(-1)
    tracker.finish()
    assert (
        "dropped 1 row(s) of an earlier attempt at this run, which saved no checkpoint: the run starts from the "
        "beginning and trains those steps again." in caplog.text
    )
    assert "after -1" not in caplog.text


def test_the_file_logger_continues_after_a_rewind_with_one_row_per_step(tmp_path, caplog):
    for attempt in range(2):  # the first attempt dies after logging step 3; its checkpoint is of step 2
        tracker = Tracker(["file"], "p", "e", save_dir=str(tmp_path))
        if attempt == 1:
            tracker.rewind_to(2, {"x": 2.0})
        for step in (1, 2, 3) if attempt == 0 else (3, 4):
            tracker.log({"x": float(step) + attempt / 10}, step=step)
        tracker.log_generations([{"response": f"r{attempt}"}], step=3)
        tracker.finish()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row["x"]) for row in rows] == [(1, 1.0), (2, 2.0), (3, 3.1), (4, 4.1)]
    generations = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert [(g["step"], g["response"]) for g in generations] == [(3, "r1")]
    assert "dropped 1 row(s) of steps after 2" in caplog.text

"""Bad data files, in every file format: each gives its documented outcome when the datasets are built, which the
driver does before Ray starts (easyrl/data/sources.py and dataset.py state the rules).

- a file with no rows: an error naming the key and the file
- a byte that is not UTF-8 (.jsonl/.json/.csv): an error naming the file, line and byte
- a row without a value for data.prompt_key / data.answer_key: skipped, counted and named; no row with one: an error
  naming the key
- prompts longer than data.max_prompt_length: counted (and named) when built, cut or dropped as configured
"""

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from easyrl.config import DataConfig, load_run_plan
from easyrl.data import sources
from easyrl.data.dataset import RLHFDataset, write_skipped_rows
from easyrl.data.sources import load_rows


ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("jsonl", "json", "parquet", "csv")
TEXT_FORMATS = ("jsonl", "json", "csv")


def write_rows(path: Path, rows: list[dict]) -> str:
    """``rows`` (string or None values) as a file of the format its suffix names."""
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    elif suffix == ".json":
        path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    elif suffix == ".parquet":
        columns = list(rows[0])
        table = pa.table({key: pa.array([row[key] for row in rows], pa.string()) for key in columns})
        pq.write_table(table, path)
    else:
        lines = [",".join(rows[0])] + [",".join("" if v is None else v for v in row.values()) for row in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def data_config(**overrides) -> DataConfig:
    values = {"prompt_key": "problem", "answer_key": "answer", "max_prompt_length": 64}
    return DataConfig(**{**values, **overrides})


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_file_is_an_error_naming_key_and_file(tmp_path, fmt):
    path = tmp_path / f"empty.{fmt}"
    if fmt == "parquet":  # a parquet file always has columns; this one has no rows
        pq.write_table(pa.table({"problem": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), path)
    else:
        path.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"^data\.val_files: {path} has no rows"):
        load_rows(str(path), "data.val_files")


@pytest.mark.parametrize(("fmt", "text"), [("jsonl", "\n\n"), ("json", "[]"), ("csv", "problem,answer\n")])
def test_file_without_rows_is_an_error_naming_the_file(tmp_path, fmt, text):
    path = tmp_path / f"rows.{fmt}"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^data\.train_files: {path} has no rows"):
        load_rows(str(path))


@pytest.mark.parametrize("fmt", TEXT_FORMATS)
def test_non_utf8_byte_is_an_error_naming_file_line_and_byte(tmp_path, fmt):
    path = tmp_path / f"latin1.{fmt}"
    write_rows(path, [{"problem": "1 + 1", "answer": "2"}, {"problem": "caf\u00e9", "answer": "3"}])
    path.write_bytes(path.read_bytes().replace("é".encode(), b"\xe9"))  # the file as latin-1 would write it
    # jsonl: row 2 is line 2; json: one line; csv: header then rows
    line, byte = {"jsonl": (2, 17), "json": (1, 55), "csv": (3, 4)}[fmt]
    assert path.read_bytes().split(b"\n")[line - 1][byte - 1] == 0xE9
    with pytest.raises(ValueError, match=rf"{path} line {line}, byte {byte}: 0xe9 is not UTF-8.*iconv"):
        load_rows(str(path))


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_a_utf16_file_is_named_utf16_with_the_command_that_re_encodes_it(tmp_path, encoding):
    path = tmp_path / "excel_unicode.csv"
    text = "problem,answer\n1 + 1,2\n"
    path.write_bytes(text.encode(encoding) if encoding == "utf-16" else b"\xfe\xff" + text.encode(encoding))
    with pytest.raises(ValueError, match=r"is UTF-16 \(it starts with a UTF-16 byte-order mark.*iconv -f utf-16 -t"):
        load_rows(str(path))
    # the command it gives makes a file that reads as written
    fixed = tmp_path / "fixed.csv"
    subprocess.run(["iconv", "-f", "utf-16", "-t", "utf-8", str(path)], stdout=fixed.open("wb"), check=True)
    assert load_rows(str(fixed)).to_list() == [{"problem": "1 + 1", "answer": "2"}]


def test_a_csv_separated_by_semicolons_is_told_to_use_commas(tmp_path):
    path = tmp_path / "excel_de.csv"
    path.write_text("problem;answer\n1 + 1;2\n")
    with pytest.raises(KeyError, match=r"The header 'problem;answer' is one column: the file seems separated by"):
        RLHFDataset(str(path), None, None, DataConfig(train_files=str(path)))  # refused before any tokenizing


def test_a_character_cut_by_the_check_block_is_valid_utf8(tmp_path, monkeypatch):
    # the checker reads 7 bytes at a time here: "é" (2 bytes) and "€" (3 bytes) straddle block ends
    monkeypatch.setattr(sources, "CHECK_BLOCK_BYTES", 7)
    path = tmp_path / "rows.jsonl"
    write_rows(path, [{"problem": "caf\u00e9 \u20ac\u20ac", "answer": "\u00e9\u00e9\u00e9"}])
    assert load_rows(str(path)).to_list() == [{"problem": "café €€", "answer": "ééé"}]
    path.write_bytes(path.read_bytes()[:-4] + b"\xc3")  # ends inside a character: not UTF-8
    with pytest.raises(ValueError, match=r"line 1, byte \d+: 0xc3 is not UTF-8"):
        load_rows(str(path))


def test_a_jsonl_line_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": "2"\n')
    with pytest.raises(ValueError, match=rf"cannot read {path} as json \(line 2: Expecting ',' delimiter"):
        load_rows(str(path))


def test_csv_cells_are_read_as_written(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("problem,answer\n1 + 1,2\n3 + 3,06\n4 + 4,\n")
    assert load_rows(str(path)).to_list() == [
        {"problem": "1 + 1", "answer": "2"},
        {"problem": "3 + 3", "answer": "06"},
        {"problem": "4 + 4", "answer": None},
    ]


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_without_an_answer_are_skipped_counted_and_named(tmp_path, tokenizer, caplog, fmt):
    rows = [
        {"problem": "1 + 1", "answer": "2"},
        {"problem": "2 + 2", "answer": None},
        {"problem": "3 + 3", "answer": "6"},
        {"problem": "4 + 4", "answer": None},
    ]
    path = write_rows(tmp_path / f"rows.{fmt}", rows)
    with caplog.at_level(logging.WARNING):
        dataset = RLHFDataset(path, tokenizer, None, data_config())
    assert [dataset[i]["ground_truth"] for i in range(len(dataset))] == ["2", "6"]
    assert [row for row, _ in dataset.unusable_rows] == [1, 3]
    assert "skipped 2 of 4 rows without a value for data.answer_key='answer' (rows 1, 3)" in caplog.text


EMPTY_CSV_ANSWER = "no value for data.answer_key='answer'"


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_empty_prompt_is_skipped_and_empty_answers_among_others_are_named(tmp_path, tokenizer, caplog, fmt):
    """An empty prompt asks nothing (the model read data.format_prompt alone); an empty answer among filled ones is
    a lost answer whose samples score 0 in every mean: said, with its rows. All answers empty is a choice."""
    rows = [
        {"problem": "1 + 1", "answer": "2"},
        {"problem": "  ", "answer": "4"},
        {"problem": "3 + 3", "answer": ""},
        {"problem": "4 + 4", "answer": "8"},
    ]
    with caplog.at_level(logging.WARNING):
        dataset = RLHFDataset(write_rows(tmp_path / f"rows.{fmt}", rows), tokenizer, None, data_config())
    if fmt == "csv":  # an empty cell is no value at all: the row is skipped as one without an answer
        assert dataset.unusable_rows == [(1, "no value for data.prompt_key='problem'"), (2, EMPTY_CSV_ANSWER)]
        assert [dataset[i]["ground_truth"] for i in range(len(dataset))] == ["2", "8"]
        return
    assert dataset.unusable_rows == [(1, "no value for data.prompt_key='problem'")]
    assert [dataset[i]["ground_truth"] for i in range(len(dataset))] == ["2", "", "8"]
    assert "1 of 4 rows have an empty answer (data.answer_key=answer): row 2." in caplog.text
    # a tool environment's reset may give the task (TRL's rows that only route to one): an empty prompt is kept
    routed = RLHFDataset(write_rows(tmp_path / f"env.{fmt}", rows), tokenizer, None, data_config(), env_prompts=True)
    assert routed.unusable_rows == []
    caplog.clear()
    unanswered = [{"problem": row["problem"], "answer": ""} for row in rows if row["problem"].strip()]
    with caplog.at_level(logging.WARNING):
        RLHFDataset(write_rows(tmp_path / f"judged.{fmt}", unanswered), tokenizer, None, data_config())
    assert "empty answer" not in caplog.text


def test_rows_absent_from_jsonl_lack_the_key_and_are_skipped(tmp_path, tokenizer):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b"}\n{"answer": "3"}\n')
    dataset = RLHFDataset(str(path), tokenizer, None, data_config())
    assert len(dataset) == 1
    assert dataset.unusable_rows == [
        (1, "no value for data.answer_key='answer'"),
        (2, "no value for data.prompt_key='problem'"),
    ]


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_row_with_an_answer_is_an_error_naming_the_key(tmp_path, tokenizer, fmt):
    path = write_rows(tmp_path / f"rows.{fmt}", [{"problem": "1 + 1", "answer": None}] * 3)
    with pytest.raises(
        ValueError, match=r"no row of .* has a value for data\.answer_key='answer'; set data\.answer_key"
    ):
        RLHFDataset(path, tokenizer, None, data_config())


def test_overlong_prompts_are_counted_and_named_when_built(tmp_path, tokenizer, caplog):
    rows = [{"problem": "short", "answer": "1"}, {"problem": "long " * 80, "answer": "2"}] * 3
    path = write_rows(tmp_path / "rows.parquet", rows)
    with caplog.at_level(logging.WARNING):
        kept = RLHFDataset(path, tokenizer, None, data_config(filter_overlong_prompts=False))
    assert (len(kept), kept.num_truncated) == (6, 3)
    assert "3 of 6 prompts are longer than data.max_prompt_length=64 tokens and are cut" in caplog.text
    assert "as EasyR1 does; rows 1, 3, 5)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        dropped = RLHFDataset(path, tokenizer, None, data_config(filter_overlong_prompts=True))
    assert (len(dropped), dropped.num_filtered_overlong) == (3, 3)
    assert "dropped 3 of 6 prompts longer than data.max_prompt_length=64 tokens (rows 1, 3, 5)" in caplog.text


def test_skipped_rows_of_a_folder_of_files_are_named_by_file_and_listed_whole(tmp_path, tokenizer, caplog):
    folder = tmp_path / "data"
    folder.mkdir()
    write_rows(folder / "part-0.jsonl", [{"problem": "1 + 1", "answer": "2"}, {"problem": "2 + 2", "answer": None}])
    many = [{"problem": f"{i} + {i}", "answer": None if i % 2 else str(2 * i)} for i in range(14)]
    many[4] = {"problem": "long " * 80, "answer": "8"}
    write_rows(folder / "part-1.jsonl", many)
    with caplog.at_level(logging.WARNING):
        dataset = RLHFDataset(str(folder), tokenizer, None, data_config(filter_overlong_prompts=True))
    # the second file's row 1 is the third row read: the warning names the file and the row in it
    assert (
        "(part-0.jsonl row 1, part-1.jsonl row 1, part-1.jsonl row 3, part-1.jsonl row 5, part-1.jsonl row 7 and 3 more)"
        in caplog.text
    )
    assert "dropped 1 of 16 prompts longer than data.max_prompt_length=64 tokens (part-1.jsonl row 4)" in caplog.text
    records = dataset.skipped_rows()
    assert [(r["file"], r["row"]) for r in records] == [("part-0.jsonl", 1)] + [
        ("part-1.jsonl", i) for i in (1, 3, 4, 5, 7, 9, 11, 13)
    ]
    assert records[0] == {
        "data": "data.train_files", "file": "part-0.jsonl", "row": 1, "reason": "no value for data.answer_key='answer'"
    }  # fmt: skip
    assert records[3]["reason"] == "longer than data.max_prompt_length=64 tokens"
    # the whole list, beyond the few rows a warning names, is written where the run keeps its files
    listing = tmp_path / "run" / "skipped_rows.jsonl"
    assert write_skipped_rows(str(listing), [dataset, None]) == str(listing)
    assert [json.loads(line) for line in listing.read_text().splitlines()] == records
    assert f"9 skipped rows (data.train_files: 9) are listed, each with its reason, in {listing}" in caplog.text
    # a later run whose data lost nothing removes the earlier list rather than leave it to mislead
    clean = write_rows(tmp_path / "clean.jsonl", [{"problem": "1 + 1", "answer": "2"}])
    assert write_skipped_rows(str(listing), [RLHFDataset(clean, tokenizer, None, data_config())]) is None
    assert not listing.exists()


def test_rows_of_one_file_are_named_by_row_alone(tmp_path, tokenizer):
    path = write_rows(tmp_path / "rows.jsonl", [{"problem": "1 + 1", "answer": None}, {"problem": "2", "answer": "2"}])
    dataset = RLHFDataset(path, tokenizer, None, data_config())
    assert dataset.skipped_rows() == [
        {"data": "data.train_files", "row": 0, "reason": "no value for data.answer_key='answer'"}
    ]


def test_a_parquet_value_that_is_not_utf8_is_named_when_screened(tmp_path, tokenizer):
    # Arrow stores strings unchecked when cast from binary without validation; reading the row fails
    path = tmp_path / "rows.parquet"
    problem = pa.array([b"1 + 1", b"caf\xe9"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"problem": problem, "answer": pa.array(["2", "3"])}), path)
    rows = datasets.load_dataset("parquet", data_files=str(path), split="train")
    with pytest.raises(UnicodeDecodeError):
        rows[1]  # what drawing the row would do without screening
    with pytest.raises(ValueError, match=rf"data\.train_files: {path} holds a value that is not UTF-8"):
        RLHFDataset(str(path), tokenizer, None, data_config())


def test_prepare_run_data_reads_every_row_before_ray(tmp_path, tiny_model_path):
    from easyrl.trainer.main import prepare_run_data

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"problem": "1 + 1", "answer": "2"}) + "\n" for _ in range(4)))
    path.write_bytes(path.read_bytes() + b'{"problem": "\xff", "answer": "2"}\n')
    plan = load_run_plan(_train_args(tmp_path, tiny_model_path, path))
    with pytest.raises(ValueError, match=rf"data\.train_files: {path} line 5, byte 14: 0xff is not UTF-8"):
        prepare_run_data(plan)


def test_a_run_lists_its_skipped_rows_in_its_folder(tmp_path, tiny_model_path):
    from easyrl.trainer.main import prepare_run_data

    path = tmp_path / "train.jsonl"
    rows = [{"problem": "1 + 1", "answer": "2"}] * 4 + [{"problem": "2 + 2", "answer": None}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    prepare_run_data(load_run_plan(_train_args(tmp_path, tiny_model_path, path)))
    listing = tmp_path / "run" / "skipped_rows.jsonl"
    assert json.loads(listing.read_text()) == {
        "data": "data.train_files", "row": 4, "reason": "no value for data.answer_key='answer'"
    }  # fmt: skip


def _train_args(tmp_path: Path, model_path: Path, train_file: Path) -> list[str]:
    return [
        f"data.train_files={train_file}",
        "data.prompt_key=problem",
        "data.rollout_batch_size=2",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        f"worker.actor.model.model_path={model_path}",
        f"worker.reward.reward_function={ROOT / 'tests' / 'data' / 'word_start_reward.py'}:compute_score",
        "worker.actor.global_batch_size=2",
        "worker.actor.micro_batch_size_per_device_for_update=1",
        "worker.rollout.n=2",
        "worker.rollout.tensor_parallel_size=1",
        "trainer.n_gpus_per_node=1",
        f"trainer.save_checkpoint_path={tmp_path / 'run'}",
    ]


def test_easyrl_train_stops_on_an_empty_file_before_ray_starts(tmp_path, tiny_model_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "easyrl", "train", *_train_args(tmp_path, tiny_model_path, path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode == 2
    assert f"easyrl train: cannot start: data.train_files: {path} has no rows (the file is empty)" in result.stderr
    assert "Traceback" not in output  # one line on the console; the traceback is in the driver log
    driver_log = tmp_path / "run" / "logs" / "driver.log"
    assert f"(traceback in {driver_log})" in result.stderr
    assert "Traceback (most recent call last)" in driver_log.read_text()
    assert "Started a local Ray instance" not in output
    print(f"easyrl train stopped after {elapsed:.1f} s")


def test_a_tracker_that_cannot_start_its_run_stops_easyrl_train_before_ray_starts(tmp_path, tiny_model_path):
    """MLflow (or a tracker whose package is missing) failed after Ray had started, with two chained tracebacks."""
    pytest.importorskip("mlflow")
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"problem": f"say {i}", "answer": str(i)}) + "\n" for i in range(4)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": "nosuchstore://tracking"}
    args = [*_train_args(tmp_path, tiny_model_path, path), "trainer.logger=[console,mlflow]"]
    result = subprocess.run(
        [sys.executable, "-m", "easyrl", "train", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "easyrl train: cannot start: trainer.logger 'mlflow' could not start a run: " in result.stderr
    assert "Check MLFLOW_TRACKING_URI (unset it for a local store), or remove 'mlflow' from trainer.logger." in (
        result.stderr
    )
    assert "Traceback" not in output and "Started a local Ray instance" not in output


@pytest.mark.slow  # a worker and its vLLM engine start before the refusal (~60 s)
@pytest.mark.timeout(400)
def test_a_model_the_cpu_engine_cannot_run_stops_the_run_with_one_line(tmp_path, tiny_model_path):
    """A worker's own refusal (a ValueError naming what to change) reaches the console as one `cannot start` line, the
    worker's traceback in the driver log, as the driver's own refusals do."""
    from easyrl.testing.tiny_models import build_tiny_causal_lm

    narrow = build_tiny_causal_lm(tmp_path / "narrow", hidden_size=32, num_heads=2)  # heads of 16: no CPU kernel
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{i} + 1", "answer": str(i + 1)}) + "\n" for i in range(4)))
    args = [*_train_args(tmp_path, tiny_model_path, path), f"worker.actor.model.model_path={narrow}"]
    result = subprocess.run(
        [sys.executable, "-m", "easyrl", "train", *args, "worker.reward.num_cpus=0", "worker.rollout.dtype=fp32"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=380,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    driver_log = tmp_path / "run" / "logs" / "driver.log"
    assert (
        f"easyrl train: cannot start: a worker could not start: The rollout engine (vLLM on CPU) cannot run {narrow}: "
        "its attention heads have 16 dimensions" in result.stderr
    )
    assert "Set worker.rollout.name=hf (generation by the actor's own model, slower)" in result.stderr
    assert result.stderr.rstrip().endswith(f"(traceback in {driver_log})")
    assert "Traceback" not in result.stdout + result.stderr
    assert "ray.exceptions.RayTaskError(ValueError)" in driver_log.read_text()


def test_only_a_workers_own_refusal_becomes_a_setup_error(ray_cluster):
    from easyrl.trainer.main import _worker_setup_refusal

    @ray_cluster.remote
    def fails(kind):
        raise kind("a message naming the key")

    for kind, refused in ((ValueError, True), (KeyError, True), (OSError, True), (RuntimeError, False)):
        with pytest.raises(ray_cluster.exceptions.RayTaskError) as raised:
            ray_cluster.get(fails.remote(kind))
        cause = _worker_setup_refusal(raised.value)
        assert (cause is not None) == refused, kind
        assert cause is None or (type(cause), cause.args) == (kind, ("a message naming the key",))
    assert _worker_setup_refusal(ValueError("in the driver")) is None  # the driver's own go through its checks


def test_pictures_for_a_model_without_a_processor_name_where_they_are(tmp_path, tokenizer):
    """A text-only model given picture rows stops the run (a misconfigured model path, most likely): the message says
    which key holds the pictures and shows one, so the user finds the rows and the setting."""
    rows = [
        {"problem": "1 + 1?", "answer": "2"},
        {"problem": "<image>How many dots?", "answer": "3", "pics": ["d.png"]},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError) as error:
        RLHFDataset(str(path), tokenizer, None, data_config(train_files=str(path), image_key="pics"))
    assert str(error.value) == (
        "data.train_files: rows have images/videos (in data.image_key='pics' / data.video_key='videos'; the first of "
        "this row is 'd.png') but the model (worker.actor.model.model_path) has no processor: use a vision-language "
        "model, or drop the media from the rows."
    )

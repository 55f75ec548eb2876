"""Rows load from every supported source form, and a bad path says which key and file."""

import json

import datasets
import pytest

from easyrl.data.sources import load_rows


ROWS = [{"prompt": "1 + 1", "answer": "2"}, {"prompt": "2 + 3", "answer": "5"}]


def test_jsonl_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in ROWS))
    assert load_rows(str(path)).to_list() == ROWS


def test_json_file(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(ROWS))
    assert load_rows(str(path)).to_list() == ROWS


def test_parquet_file(tmp_path):
    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    assert load_rows(str(path)).to_list() == ROWS


def test_saved_dataset_folder(tmp_path):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert load_rows(str(tmp_path / "saved")).to_list() == ROWS


def test_split_of_a_saved_dataset_dict(tmp_path):
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    assert load_rows(f"{tmp_path / 'dict'}@test").to_list() == ROWS[:1]
    with pytest.raises(ValueError, match=r"has no split 'validation'; it has \['test', 'train'\]"):
        load_rows(f"{tmp_path / 'dict'}@validation", "data.val_files")


def test_split_of_a_folder_of_data_files(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "test.jsonl").write_text(json.dumps(ROWS[1]))
    (folder / "train.jsonl").write_text(json.dumps(ROWS[0]))
    assert load_rows(f"{folder}@test").to_list() == ROWS[1:]


def test_missing_file_names_the_key_and_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data.val_files: '.*nope.jsonl' does not exist"):
        load_rows(str(tmp_path / "nope.jsonl"), "data.val_files")


def test_unknown_file_type_is_rejected(tmp_path):
    path = tmp_path / "rows.txt"
    path.write_text("hello")
    with pytest.raises(ValueError, match="cannot read"):
        load_rows(str(path))


def test_empty_path_is_an_error():
    with pytest.raises(ValueError, match="data.train_files is empty"):
        load_rows("")

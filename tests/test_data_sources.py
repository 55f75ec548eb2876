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


MIXED_ROWS = [
    {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "Count."}]},
            {"role": "assistant", "content": "3"},
        ],
        "answer": 3,
    },
    {"messages": [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}], "answer": "5"},
    {"messages": [{"role": "user", "content": "null"}, {"role": "assistant", "content": '{"a": 1}'}], "answer": "1e3"},
    {"messages": [{"role": "user", "content": "true"}, {"role": "assistant", "content": "[1, 2]"}], "answer": None},
]


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_fields_mixing_types_across_rows_keep_each_value_as_written(tmp_path, suffix):
    """A field that is text in one row and a list (or a number) in another gets the reader's Json type, which took
    every text that parses as JSON for encoded JSON: the answer "3" came back as 3, "null" as a missing value, "1e3" as
    1000.0, and an SFT row's reply "3" was refused as a list of content parts."""
    path = tmp_path / f"mixed{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in MIXED_ROWS))
    else:
        path.write_text(json.dumps(MIXED_ROWS))
    rows = load_rows(str(path))
    assert [row["messages"] for row in rows] == [row["messages"] for row in MIXED_ROWS]
    assert [row["answer"] for row in rows] == [3, "5", "1e3", None]
    assert isinstance(rows.features["answer"], datasets.Json)  # the reader's own type, decoded right


def test_a_mixed_sft_file_keeps_every_row(tmp_path):
    from easyrl.data.sft import normalize_messages

    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps({"messages": row["messages"]}) + "\n" for row in MIXED_ROWS))
    for index, (row, written) in enumerate(zip(load_rows(str(path)), MIXED_ROWS)):
        pictures = 1 if index == 0 else 0
        assert normalize_messages(row["messages"], pictures) == normalize_messages(written["messages"], pictures)


def test_a_message_whose_content_is_a_json_number_is_its_text():
    from easyrl.data.sft import normalize_messages

    messages = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": 5}]
    assert normalize_messages(messages, 0)[1] == {"role": "assistant", "content": "5"}

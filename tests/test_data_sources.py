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


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_folder_of_files_keeps_each_value_as_written(tmp_path):
    """A folder went to the reader whole: a field mixing types lost its text ("03" became 3, "null" a skipped value),
    and a field typed differently by two files was cast to the first file's type."""
    folder = tmp_path / "rows"
    folder.mkdir()
    _write_jsonl(folder / "a.jsonl", [{"problem": "1+2", "answer": 3}, {"problem": "1+2", "answer": "03"}])
    _write_jsonl(folder / "b.jsonl", [{"problem": "x", "answer": "null"}])
    assert [row["answer"] for row in load_rows(str(folder))] == [3, "03", "null"]
    (folder / "a.jsonl").rename(folder / "c.jsonl")  # the text file first, then the one mixing types
    assert [row["answer"] for row in load_rows(str(folder))] == ["null", 3, "03"]


def test_a_folder_of_files_is_read_in_file_name_order(tmp_path):
    folder = tmp_path / "rows"
    (folder / "sub").mkdir(parents=True)
    names = ["part1.jsonl", "part0.json", "sub/part2.jsonl", "part10.jsonl"]
    for index, name in enumerate(names):
        if name.endswith(".json"):
            (folder / name).write_text(json.dumps([{"prompt": name, "answer": str(index)}]))
        else:
            _write_jsonl(folder / name, [{"prompt": name, "answer": str(index)}])
    (folder / "picture.png").write_bytes(b"\x89PNG")  # media beside the rows are not rows
    (folder / "README.md").write_text("# rows\n")
    expected = ["part0.json", "part1.jsonl", "part10.jsonl", "sub/part2.jsonl"]
    assert [row["prompt"] for row in load_rows(str(folder))] == expected
    # a split's files matched by two of datasets' name patterns (train-*, *-train*) came pattern by pattern
    split_folder = tmp_path / "splits"
    split_folder.mkdir()
    for name in ["train-b.jsonl", "a-train.jsonl", "test.jsonl"]:
        _write_jsonl(split_folder / name, [{"prompt": name, "answer": "1"}])
    assert [row["prompt"] for row in load_rows(str(split_folder))] == ["a-train.jsonl", "train-b.jsonl"]


@pytest.mark.parametrize("content", [b"", b'{"prompt": "caf\xe9", "answer": "2"}\n'])
def test_a_bad_file_in_a_folder_is_named(tmp_path, content):
    folder = tmp_path / "rows"
    folder.mkdir()
    _write_jsonl(folder / "a.jsonl", ROWS)
    (folder / "b.jsonl").write_bytes(content)
    why = "has no rows" if not content else "line 1, byte 16: 0xe9 is not UTF-8"
    with pytest.raises(ValueError, match=rf"data\.val_files: {folder / 'b.jsonl'} {why}"):
        load_rows(str(folder), "data.val_files")


def test_a_bad_line_in_a_folder_is_named(tmp_path):
    folder = tmp_path / "rows"
    folder.mkdir()
    _write_jsonl(folder / "a.jsonl", ROWS)
    (folder / "b.jsonl").write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=rf"cannot read {folder / 'b.jsonl'} as json \(line 2: "):
        load_rows(str(folder))


def test_a_folder_mixing_kinds_of_file_is_an_error(tmp_path):
    """The reader would take the most common kind and skip the other files without a word."""
    folder = tmp_path / "rows"
    folder.mkdir()
    _write_jsonl(folder / "a.jsonl", ROWS)
    _write_jsonl(folder / "b.jsonl", ROWS)
    datasets.Dataset.from_list(ROWS).to_parquet(str(folder / "c.parquet"))
    with pytest.raises(ValueError, match=r"'.*rows' holds data files of more than one kind \(\.jsonl, \.parquet\)"):
        load_rows(str(folder))


def test_a_folder_of_parquet_or_csv_files(tmp_path):
    folder = tmp_path / "rows"
    folder.mkdir()
    datasets.Dataset.from_list(ROWS[1:]).to_parquet(str(folder / "b.parquet"))
    datasets.Dataset.from_list(ROWS[:1]).to_parquet(str(folder / "a.parquet"))
    assert load_rows(str(folder)).to_list() == ROWS
    csv_folder = tmp_path / "csv"
    csv_folder.mkdir()
    (csv_folder / "a.csv").write_text("prompt,answer\n1 + 1,06\n")
    assert load_rows(str(csv_folder)).to_list() == [{"prompt": "1 + 1", "answer": "06"}]


def test_a_folder_without_the_split_names_it_and_its_splits(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    _write_jsonl(folder / "part0.jsonl", ROWS)
    with pytest.raises(ValueError, match=rf"data\.val_files: '{folder}' has no split 'test'; it has \['train'\]"):
        load_rows(f"{folder}@test", "data.val_files")


def test_a_folder_without_data_files_is_an_error(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match=rf"data\.train_files: '{folder}' holds no data file"):
        load_rows(str(folder))


def test_a_saved_folder_still_loads_with_its_splits(tmp_path):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert load_rows(f"{tmp_path / 'saved'}").to_list() == ROWS
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(ROWS[1:])}).save_to_disk(str(tmp_path / "dict"))
    assert load_rows(str(tmp_path / "dict"), "data.val_files").to_list() == ROWS[1:]


def test_a_folder_whose_card_declares_configs_is_read_as_the_card_says(tmp_path):
    """A hub repository with two configs holds a train file for each: read by file names, both would be rows."""
    folder = tmp_path / "repo"
    for config, rows in (("main", ROWS[:1]), ("other", ROWS[1:])):
        (folder / config).mkdir(parents=True)
        _write_jsonl(folder / config / "train.jsonl", rows)
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train.jsonl\n---\n"
    )
    assert load_rows(str(folder)).to_list() == ROWS[:1]
    with pytest.raises(ValueError, match=rf"'{folder}' has no split 'test'; it has \['train'\]"):
        load_rows(f"{folder}@test", "data.val_files")

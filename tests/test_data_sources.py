"""Rows load from every supported source form, and a bad path says which key and file."""

import json
import re

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


def test_a_pandas_index_in_a_parquet_file_is_no_column_and_its_removal_is_said(tmp_path, caplog):
    import pandas as pd

    path = tmp_path / "indexed.parquet"
    # a shuffled or filtered frame keeps its row labels, which pandas writes as a column
    pd.DataFrame(ROWS * 2, index=[7, 2, 9, 4]).to_parquet(path)
    with caplog.at_level("INFO", logger="easyrl.data.sources"):
        rows = load_rows(str(path))
    assert rows.to_list() == ROWS * 2
    assert "left out the pandas index column(s) ['__index_level_0__']" in caplog.text


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


TRAIN_ROWS = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]
TEST_ROWS = [{"prompt": f"t{i}", "answer": str(i)} for i in range(4)]


def _saved_splits(tmp_path, **splits):
    folder = tmp_path / "saved"
    datasets.DatasetDict({name: datasets.Dataset.from_list(rows) for name, rows in splits.items()}).save_to_disk(
        str(folder)
    )
    return folder


def _split_files_folder(tmp_path, **splits):
    folder = tmp_path / "files"
    folder.mkdir()
    for name, rows in splits.items():
        (folder / f"{name}-00000-of-00001.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


@pytest.mark.parametrize("layout", [_saved_splits, _split_files_folder])
def test_several_splits_read_without_a_split_give_train_and_say_so_once(tmp_path, caplog, layout):
    """EasyR1 reads `file@split` as train without a split; that choice is kept, but it is said: a validation set
    given as the folder itself ran on the training rows without a word."""
    folder = layout(tmp_path, train=TRAIN_ROWS, test=TEST_ROWS)
    with caplog.at_level("WARNING", logger="easyrl.data.sources"):
        assert load_rows(str(folder), "data.val_files").to_list() == TRAIN_ROWS
        load_rows(str(folder), "data.val_files")  # the same source again: no second warning
    (warning,) = [record.getMessage() for record in caplog.records]
    assert warning == (
        f"data.val_files: '{folder}' has the splits 'test', 'train' and no `@split` was given, so 'train' is read, "
        f"not 'test'. Choose one with `{folder}@<split>`. Validation then runs on the training rows, though the "
        f"folder has a 'test' split ({folder}@test)."
    )


def test_the_first_split_read_for_training_without_a_split_is_named_with_the_others(tmp_path, caplog):
    folder = _saved_splits(tmp_path, validation=TEST_ROWS, test=TRAIN_ROWS)
    with caplog.at_level("WARNING", logger="easyrl.data.sources"):
        assert load_rows(str(folder), "data.train_files").to_list() == TEST_ROWS
        assert load_rows(f"{folder}@test", "data.train_files").to_list() == TRAIN_ROWS  # asked for: nothing said
    (warning,) = [record.getMessage() for record in caplog.records]
    assert warning.startswith(
        f"data.train_files: '{folder}' has the splits 'test', 'validation' and no `@split` was given, so "
        "'validation' is read, not 'test'."
    )
    assert "Validation then runs" not in warning


def test_a_folder_with_one_split_read_without_a_split_says_nothing(tmp_path, caplog):
    folder = _saved_splits(tmp_path, train=TRAIN_ROWS)
    with caplog.at_level("WARNING", logger="easyrl.data.sources"):
        assert load_rows(str(folder), "data.val_files").to_list() == TRAIN_ROWS
    assert caplog.records == []


@pytest.mark.parametrize("layout", [_saved_splits, _split_files_folder])
def test_a_folders_split_takes_the_first_rows_slice_as_a_file_does(tmp_path, layout):
    """`@test[:2]` on a saved DatasetDict failed with "has no split 'test[:2]'; it has ['test', 'train']"."""
    folder = layout(tmp_path, train=TRAIN_ROWS, test=TEST_ROWS)
    file = tmp_path / "train.jsonl"
    file.write_text("".join(json.dumps(row) + "\n" for row in TRAIN_ROWS))
    assert load_rows(f"{folder}@test[:2]", "data.val_files").to_list() == TEST_ROWS[:2]
    assert load_rows(f"{folder}@test[ : -1 ]", "data.val_files").to_list() == TEST_ROWS[:-1]
    for first in ("[:3]", "[:25%]", "[:15%]", "[:-4]", "[:100]"):  # the same rows as the same slice of a file
        assert load_rows(f"{folder}@train{first}").to_list() == load_rows(f"{file}@train{first}").to_list(), first
    with pytest.raises(ValueError, match=r"has no split 'validation'; it has \['test', 'train'\]"):
        load_rows(f"{folder}@validation[:2]", "data.val_files")
    with pytest.raises(ValueError, match=r"data.val_files: `@test\[:150%\]` of .*: Percent slice boundaries must be"):
        load_rows(f"{folder}@test[:150%]", "data.val_files")
    with pytest.raises(ValueError, match=r"`@test\[:0\]` keeps none of the 4 rows of the split 'test' of"):
        load_rows(f"{folder}@test[:0]", "data.val_files")
    with pytest.raises(ValueError, match=r"`@test\[4:8\]` of .*`@test\[:N\]` or `@test\[:N%\]`, not `\[4:8\]`"):
        load_rows(f"{folder}@test[4:8]", "data.val_files")


def test_a_saved_dataset_takes_the_first_rows_slice(tmp_path):
    datasets.Dataset.from_list(TRAIN_ROWS).save_to_disk(str(tmp_path / "saved"))
    assert load_rows(f"{tmp_path / 'saved'}@train[:3]").to_list() == TRAIN_ROWS[:3]


def test_missing_file_names_the_key_and_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data.val_files: '.*nope.jsonl' does not exist"):
        load_rows(str(tmp_path / "nope.jsonl"), "data.val_files")


def test_a_missing_relative_folder_is_named_without_a_hub_lookup(tmp_path, monkeypatch):
    """`data/train` beside a `data` folder, or a path of three parts, cannot be a hub dataset (`owner/name`); it was
    looked up on the hub, which offline spent its network timeouts before saying so."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    looked_up = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: looked_up.append(args))
    for path in ("data/train", "data/train@test", "my/data/train"):
        with pytest.raises(FileNotFoundError, match=rf"data.train_files: '{path.split('@')[0]}' does not exist"):
            load_rows(path)
    assert looked_up == []
    load_rows("owner/name")  # a hub name is still looked up
    assert looked_up == [("owner/name",)]


def test_unknown_file_type_is_rejected(tmp_path):
    path = tmp_path / "rows.txt"
    path.write_text("hello")
    with pytest.raises(ValueError, match="cannot read"):
        load_rows(str(path))


def test_tsv_and_feather_files_are_read_and_compressed_ones_are_refused_saying_what_to_do(tmp_path):
    import gzip

    import pandas as pd

    from easyrl.config.validate import DATA_FILE_SUFFIXES
    from easyrl.data.sources import FILE_BUILDERS

    assert set(DATA_FILE_SUFFIXES) == set(FILE_BUILDERS)  # what the config check takes for a data file's name
    frame = pd.DataFrame({"problem": ["a, b", 'say "hi"\nthen go', "06"], "answer": ["1", "2", "06"]})
    frame.to_csv(tmp_path / "rows.tsv", sep="\t", index=False)
    frame.to_feather(tmp_path / "rows.feather")
    for name in ("rows.tsv", "rows.feather"):
        rows = load_rows(str(tmp_path / name))
        assert rows["problem"] == frame["problem"].tolist() and rows["answer"] == ["1", "2", "06"], name
    (tmp_path / "rows.jsonl.gz").write_bytes(gzip.compress(b'{"problem": "a", "answer": "1"}\n'))
    with pytest.raises(ValueError, match=r"rows.jsonl.gz.*Decompress it first \(e.g. `gunzip rows.jsonl.gz`"):
        load_rows(str(tmp_path / "rows.jsonl.gz"))
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "part-0.jsonl.gz").write_bytes((tmp_path / "rows.jsonl.gz").read_bytes())
    with pytest.raises(ValueError, match=r"holds no data file .* It holds compressed files \(part-0.jsonl.gz\)"):
        load_rows(str(shards))


@pytest.mark.parametrize("orient", ["columns", "list"])
def test_a_json_table_written_by_columns_is_refused_as_one_row_saying_how_to_write_rows(tmp_path, orient):
    import pandas as pd

    frame = pd.DataFrame({"problem": [f"q{i}" for i in range(5)], "answer": [str(i) for i in range(5)]})
    path = tmp_path / "table.json"
    if orient == "columns":  # pandas' default: {"problem": {"0": "q0", ...}, ...}
        frame.to_json(path)
    else:
        path.write_text(json.dumps(frame.to_dict(orient="list")))
    with pytest.raises(ValueError, match=r"holds one JSON object whose fields are columns of 5 values each"):
        load_rows(str(path))
    # one row whose fields are lists is a row: a list beside a text, or chat messages beside their pictures
    path.write_text(json.dumps({"problem": "q", "answer": ["1", "one"]}))
    assert load_rows(str(path))["answer"] == [["1", "one"]]
    chat = {"messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "Hello"}]}
    path.write_text(json.dumps({**chat, "images": ["a.png", "b.png"]}))
    assert load_rows(str(path))["images"] == [["a.png", "b.png"]]


def test_a_files_first_rows_are_its_train_slice_and_another_split_is_refused(tmp_path):
    """`file@train[:N]` reads the first N rows (a smaller validation set); `file@test` named a split a single file
    does not have and was read as every row without a word."""
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"problem": f"q{i}", "answer": i if i % 2 else i + 0.5}) + "\n" for i in range(10))
    )
    assert load_rows(f"{path}@train[:3]")["answer"] == [0.5, 1, 2.5]  # each number as written in the slice too
    assert load_rows(f"{path}@train[:50%]")["problem"] == [f"q{i}" for i in range(5)]
    assert len(load_rows(f"{path}@train")) == 10
    for split in ("test", "validation"):
        with pytest.raises(
            ValueError, match=rf"is one data file, whose rows are its only split `train`, and `@{re.escape(split)}`"
        ):
            load_rows(f"{path}@{split}", "data.val_files")
    # a slice other than the first rows was refused as a split of another name; an empty one said the file was empty
    for split in ("train[5:]", "train[2:4]", "[5:]"):
        with pytest.raises(ValueError, match=r"read whole or by its first rows, `@train\[:N\]` or `@train\[:N%\]`"):
            load_rows(f"{path}@{split}", "data.val_files")
    for first, message in (("[:0]", "keeps none of the 10 rows"), ("[:150%]", "of .*rows.jsonl.*Percent slice")):
        with pytest.raises(ValueError, match=rf"data.val_files: `@train{re.escape(first)}` {message}"):
            load_rows(f"{path}@train{first}", "data.val_files")


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


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_integers_among_decimals_or_too_big_for_64_bits_stay_as_written(tmp_path, suffix):
    """The reader types a column of 1, 2.5 and 3 as floats (the answer 2 came back 2.0, which a reward comparing
    text never matches) and one of integers beyond 64 bits too (their digits lost): each is read as written."""
    files = {
        "mixed": [1, 2.5, 3, None, 2.0],
        "big": [12345678901234567890123, 2, 3],
        "decimals": [1.5, 2.25],  # a column of decimals alone stays the reader's floats
    }
    for name, answers in files.items():
        rows = [{"problem": f"q{i}", "answer": answer} for i, answer in enumerate(answers)]
        path = tmp_path / f"{name}{suffix}"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows) if suffix == ".jsonl" else json.dumps(rows))
        if name == "big" and suffix == ".json":  # the reader of a JSON array refuses it, naming the file
            with pytest.raises(ValueError, match=f"cannot read {path} as json: ValueError: Value is too big!"):
                load_rows(str(path))
            continue
        read = [row["answer"] for row in load_rows(str(path))]
        if name == "big":
            assert read == ["12345678901234567890123", 2, 3]  # every digit, as text
            continue
        assert read == answers and [type(a) for a in read] == [type(a) for a in answers], name


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
    assert load_rows(f"{folder}@train[:1]").to_list() == ROWS[:1]
    with pytest.raises(ValueError, match=rf"'{folder}' has no split 'test'; it has \['train'\]"):
        load_rows(f"{folder}@test", "data.val_files")

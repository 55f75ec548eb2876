"""The built-in arithmetic task: deterministic, correct answers, validation problems never seen in training."""

import json

import pytest

from easyrl.data.sources import load_rows
from easyrl.data.synthetic.arithmetic import ArithmeticSpec, generate_arithmetic, write_jsonl


def test_generation_is_deterministic():
    assert generate_arithmetic("train", size=50) == generate_arithmetic("train", size=50)


def test_answers_are_the_results_of_the_problems():
    for row in generate_arithmetic("test"):
        a, op, b = row["problem"].removeprefix("What is ").removesuffix("?").split(" ")
        expected = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert row["answer"] == str(expected)
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99 and int(row["answer"]) >= 0


def test_test_problems_never_appear_in_training():
    train = {row["problem"] for row in generate_arithmetic("train")}
    test = {row["problem"] for row in generate_arithmetic("test")}
    assert len(test) == 128 and len(train) == 4096
    assert not train & test


def test_difficulty_parameters_change_the_problems():
    rows = generate_arithmetic("test", size=20, spec=ArithmeticSpec(num_digits=3, operations=("*",)))
    a, op, b = rows[0]["problem"].removeprefix("What is ").removesuffix("?").split(" ")
    assert op == "*" and len(a) == 3 and rows[0]["answer"] == str(int(a) * int(b))


def test_rows_round_trip_through_jsonl(tmp_path):
    rows = generate_arithmetic("test", size=5)
    path = write_jsonl(rows, tmp_path / "arith.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows


def test_builtin_name_is_a_data_path():
    rows = load_rows("builtin://arithmetic@test")
    assert len(rows) == 128 and rows[0] == generate_arithmetic("test")[0]


def test_a_builtin_split_slice_is_its_first_rows_as_a_data_files_is():
    whole = load_rows("builtin://arithmetic_small@test").to_list()
    assert load_rows("builtin://arithmetic_small@test[:16]").to_list() == whole[:16]
    assert load_rows("builtin://arithmetic_small@test[ : 25% ]").to_list() == whole[:32]
    assert load_rows("builtin://arithmetic_small@test[:-8]").to_list() == whole[:-8]
    with pytest.raises(ValueError, match=r"has the split\(s\) train, test; give one, optionally with `\[:N\]`"):
        load_rows("builtin://arithmetic_small@test[5:]")


def test_small_task_draws_numbers_up_to_twenty_and_keeps_splits_apart():
    train, test = load_rows("builtin://arithmetic_small@train"), load_rows("builtin://arithmetic_small@test")
    assert len(train) == 384 and len(test) == 128
    assert not {row["problem"] for row in train} & {row["problem"] for row in test}
    for row in [*train, *test]:
        a, op, b = row["problem"].removeprefix("What is ").removesuffix("?").split(" ")
        assert 1 <= int(a) <= 20 and 1 <= int(b) <= 20 and int(row["answer"]) >= 0
        assert row["answer"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))

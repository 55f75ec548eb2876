"""`builtin://shapes_sft`: the shapes training pictures with worked answers, for the vision-language cold start."""

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from easyrl.data.sources import load_rows
from easyrl.data.synthetic.shapes import SFT_ROWS, SFT_TEST_ROWS, generate_shapes, generate_shapes_sft, worked_answer
from tests.test_data_shapes import asked, shapes_in


def _r1v():
    path = Path(__file__).resolve().parents[1] / "reward_function" / "r1v.py"
    spec = importlib.util.spec_from_file_location("r1v_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sft_rows():
    return generate_shapes_sft("train")


def test_worked_answer_is_short_and_in_r1v_form():
    assert worked_answer("red", "circle", "2") == "<think>red circles: 2</think><answer>2</answer>"


def test_rows_repeat_no_test_picture(sft_rows):
    assert len(sft_rows) == SFT_ROWS == 8192
    test = {row["images"][0]["bytes"] for row in generate_shapes("test")}
    assert not any(row["images"][0]["bytes"] in test for row in sft_rows)


def test_counts_are_balanced_and_match_the_pictures(sft_rows):
    # one row in three for each count 1, 2, 3 (the natural pictures answer "1" three times in four)
    assert Counter(row["answer"] for row in sft_rows) == {"1": 2731, "2": 2731, "3": 2730}
    assert [row["answer"] for row in sft_rows[:6]] == ["1", "2", "3", "1", "2", "3"]
    for row in sft_rows[:30]:
        drawn = shapes_in(row)
        assert row["answer"] == str(drawn.count(asked(row))) and len(drawn) <= 8


def test_rows_are_natural_questions_resampled_to_balanced_counts(sft_rows):
    # drawn as the test's are (random pictures, a question about one of their shapes), so a count of 3 comes from
    # fuller pictures than a count of 1, as in the test split; only the share of each count differs
    def shapes_per_picture(rows, count):
        pictures = [len(shapes_in(row)) for row in rows if row["answer"] == count][:60]
        return sum(pictures) / len(pictures)

    test = generate_shapes("train", size=400)
    for rows in (sft_rows[:300], test):
        assert shapes_per_picture(rows, "3") > shapes_per_picture(rows, "1") + 1.5
    assert abs(shapes_per_picture(sft_rows[:300], "1") - shapes_per_picture(test, "1")) < 1.0


def test_each_response_gets_r1v_full_score_for_its_own_answer(sft_rows):
    r1v = _r1v()
    scores = [r1v.compute_score({"response": row["response"], "ground_truth": row["answer"]}) for row in sft_rows]
    assert all(score == {"overall": 1.0, "format": 1.0, "accuracy": 1.0} for score in scores)
    # and a wrong count keeps the format credit only
    wrong = r1v.compute_score({"response": worked_answer("red", "circle", "3"), "ground_truth": "2"})
    assert wrong == {"overall": 0.5, "format": 1.0, "accuracy": 0.0}


def test_response_names_what_the_question_asks(sft_rows):
    row = sft_rows[0]
    colour, kind = row["problem"].removeprefix("<image>How many ").split(" ")[:2]
    assert row["response"] == f"<think>{colour} {kind}: {row['answer']}</think><answer>{row['answer']}</answer>"


def test_builtin_shapes_sft_loads_as_a_dataset(sft_rows):
    rows = load_rows("builtin://shapes_sft@train")
    assert len(rows) == len(sft_rows) and rows[0]["response"] == sft_rows[0]["response"]


def test_test_split_is_balanced_and_repeats_no_picture_seen_elsewhere(sft_rows):
    # scored where always giving one answer earns 1/3, on pictures no shapes or shapes_sft split trains on
    rows = generate_shapes_sft("test")
    assert len(rows) == len(load_rows("builtin://shapes_sft@test")) == SFT_TEST_ROWS == 300
    assert Counter(row["answer"] for row in rows) == {"1": 100, "2": 100, "3": 100}
    for row in rows[:30]:
        assert row["answer"] == str(shapes_in(row).count(asked(row)))
    pictures = {row["images"][0]["bytes"] for row in rows}
    assert len(pictures) == 300
    for split in (sft_rows, generate_shapes("train"), generate_shapes("test")):
        assert not pictures & {row["images"][0]["bytes"] for row in split}


def test_unknown_split():
    with pytest.raises(ValueError, match="choose 'train' or 'test'"):
        generate_shapes_sft("validation")

"""`builtin://arithmetic_sft`: worked answers to the arithmetic_small training problems that the arithmetic reward
scores in full, none of them a test problem."""

import importlib.util
from pathlib import Path

import pytest

from easyrl.data.sources import load_rows
from easyrl.data.synthetic.arithmetic import worked_answer


ROOT = Path(__file__).resolve().parents[1]


def _reward():
    spec = importlib.util.spec_from_file_location("arithmetic_reward", ROOT / "reward_function" / "arithmetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


def test_worked_answer_by_hand():
    assert worked_answer("What is 7 + 5?") == "7 + 5 = 12. The answer is \\boxed{12}."
    assert worked_answer("What is 20 - 3?") == "20 - 3 = 17. The answer is \\boxed{17}."


def test_rows_are_the_small_training_problems_with_full_credit_answers():
    rows = load_rows("builtin://arithmetic_sft@train")
    train = load_rows("builtin://arithmetic_small@train")
    assert len(rows) == 384
    assert [(r["problem"], r["answer"]) for r in rows] == [(r["problem"], r["answer"]) for r in train]
    scores = _reward()([{"response": r["response"], "ground_truth": r["answer"]} for r in rows])
    assert all(s == {"overall": 1.0, "format": 1.0, "accuracy": 1.0} for s in scores)


def test_disjoint_from_the_test_split():
    test = {r["problem"] for r in load_rows("builtin://arithmetic_small@test")}
    assert len(test) == 128
    assert not test & {r["problem"] for r in load_rows("builtin://arithmetic_sft@train")}


def test_only_a_train_split():
    with pytest.raises(ValueError, match=r"has the split\(s\) train \(its problems are arithmetic_small's training"):
        load_rows("builtin://arithmetic_sft@test")

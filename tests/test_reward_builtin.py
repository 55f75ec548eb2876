"""The shipped reward functions on real response strings, loaded the way training loads them."""

from pathlib import Path

import pytest

from easyrl.workers.reward.grading import extract_boxed, math_equal
from easyrl.workers.reward.loader import load_reward_function


ROOT = Path(__file__).resolve().parent.parent


def score(name, response, ground_truth, response_length=10, **kwargs):
    fn = load_reward_function(str(ROOT / "reward_function" / f"{name}.py"), kwargs)
    item = {"response": response, "response_length": response_length, "ground_truth": ground_truth}
    return fn.score([item])[0]


def test_extract_boxed_takes_the_last_box_with_nested_braces():
    assert extract_boxed(r"first \boxed{1}, then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert extract_boxed("no box here") is None


def test_math_equal_accepts_equivalent_forms():
    assert math_equal(r"\frac{1}{2}", "0.5")
    assert math_equal("1,000", "1000")
    assert not math_equal("3", "4")


def test_arithmetic_right_answer_scores_one():
    result = score("arithmetic", r"37 + 45 = 82, so the answer is \boxed{82}.", "82")
    assert result == {"overall": pytest.approx(1.0), "format": 1.0, "accuracy": 1.0}


def test_arithmetic_wrong_boxed_integer_earns_format_credit_only():
    # overall = 0.1 * format + 0.9 * accuracy = 0.1
    result = score("arithmetic", r"The answer is \boxed{81}", "82")
    assert result == {"overall": pytest.approx(0.1), "format": 1.0, "accuracy": 0.0}


def test_arithmetic_unboxed_final_number_earns_accuracy_without_format():
    # overall = 0.1 * 0 + 0.9 * 1
    assert score("arithmetic", "37 + 45 = 82.", "82") == {
        "overall": pytest.approx(0.9),
        "format": 0.0,
        "accuracy": 1.0,
    }
    assert score("arithmetic", "The sum is 1,024", "1024")["accuracy"] == 1.0
    assert score("arithmetic", "82 is close, but the answer is 81.", "82")["overall"] == 0.0  # the LAST number counts


def test_arithmetic_box_without_an_integer_scores_zero_and_hides_earlier_numbers():
    assert score("arithmetic", r"37 + 45 = 82, so \boxed{N}", "82")["overall"] == 0.0
    assert score("arithmetic", r"82 \boxed{}", "82")["overall"] == 0.0
    assert score("arithmetic", "no digits here", "82")["overall"] == 0.0


def test_arithmetic_negative_answer():
    assert score("arithmetic", r"12 - 30 = \boxed{-18}", "-18")["accuracy"] == 1.0


def test_math_full_credit_needs_think_tags_and_a_correct_box():
    response = r"<think>2/4 reduces to 1/2.</think> The answer is \boxed{\frac{1}{2}}."
    assert score("math", response, "0.5") == {"overall": pytest.approx(1.0), "format": 1.0, "accuracy": 1.0}


def test_math_correct_answer_without_think_gets_accuracy_only():
    # overall = 0.9 * 1 + 0.1 * 0
    assert score("math", r"The answer is \boxed{4}", "4")["overall"] == pytest.approx(0.9)


def test_math_wrong_answer_with_format_gets_format_only():
    assert score("math", r"<think>hmm</think> \boxed{5}", "4")["overall"] == pytest.approx(0.1)


def test_r1v_multiple_choice_compares_letters():
    response = "<think>The red one is a circle.</think> <answer>(B) circle</answer>"
    assert score("r1v", response, "B") == {"overall": pytest.approx(1.0), "format": 1.0, "accuracy": 1.0}
    assert score("r1v", "<think>x</think><answer>C</answer>", "B")["accuracy"] == 0.0


def test_r1v_numbers_compare_numerically():
    assert score("r1v", "<think>count</think><answer>3.0</answer>", "3")["accuracy"] == 1.0
    assert score("r1v", "<think>count</think><answer>4</answer>", "3")["accuracy"] == 0.0


def test_r1v_missing_answer_tag_scores_zero():
    assert score("r1v", "It is 3.", "3")["overall"] == 0.0


def test_dapo_reads_the_answer_line_and_scores_plus_minus_one():
    kwargs = {"max_response_length": 100, "overlong_buffer_length": 20, "overlong_penalty_factor": 1.0}
    right = score("dapo", "Step 1: 6 * 7.\nAnswer: 42", "42", response_length=50, **kwargs)
    wrong = score("dapo", "Answer: 41", "42", response_length=50, **kwargs)
    assert right == {"overall": 1.0, "accuracy": 1.0, "overlong": 0.0}
    assert wrong == {"overall": -1.0, "accuracy": 0.0, "overlong": 0.0}


def test_dapo_overlong_penalty_is_linear_in_the_buffer():
    # L_max 100, L_cache 20: |y| = 90 is 10 tokens into the buffer -> (80 - 90) / 20 = -0.5, times factor 0.5
    kwargs = {"max_response_length": 100, "overlong_buffer_length": 20, "overlong_penalty_factor": 0.5}
    result = score("dapo", "Answer: 42", "42", response_length=90, **kwargs)
    assert result["overlong"] == pytest.approx(-0.25)
    assert result["overall"] == pytest.approx(0.75)
    # at or past L_max the penalty is the full -1 * factor
    assert score("dapo", "Answer: 42", "42", response_length=100, **kwargs)["overlong"] == pytest.approx(-0.5)

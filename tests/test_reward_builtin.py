"""The shipped reward functions on real response strings, loaded the way training loads them.

math.py, r1v.py, dapo.py and android_gui.py carry EasyR1's contract: every expected value below is worked out by hand
from EasyR1's examples/reward_function files (their formulas, regular expressions and mathruler's grading rules),
except that a number in the answer column is graded as its text (EasyR1's files raised on it or scored it 0).
"""

from pathlib import Path

import pytest

from easyrl.workers.reward.grading import extract_boxed, math_equal
from easyrl.workers.reward.loader import RewardFunctionError, load_reward_function


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


def test_arithmetic_with_tools_reads_the_models_last_turn_not_the_calculators_result():
    """The trajectory's last integer was the calculator's result: a final turn that answered nothing, or a
    trajectory cut right after a tool result, scored as correct."""
    fn = load_reward_function(str(ROOT / "reward_function" / "arithmetic.py"), {})
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "15 + 4"}}</tool_call>'
    result = "\n<|im_start|>user\n<tool_response>\n19\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

    def scored(*turns):
        messages = [{"role": "assistant", "content": call}, {"role": "tool", "content": "19"}]
        messages += [{"role": "assistant", "content": turn} for turn in turns]
        return fn.score([{"response": call + result + "".join(turns), "ground_truth": "19", "messages": messages}])[0]

    assert scored("I am not sure.")["overall"] == 0.0
    assert scored()["overall"] == 0.0  # cut after the tool result: the last turn is the call, whose 4 is no answer
    assert scored("15 + 4 = \\boxed{19}")["overall"] == pytest.approx(1.0)
    assert scored("It is 19.") == {"overall": pytest.approx(0.9), "format": 0.0, "accuracy": 1.0}
    # a call and the answer in one turn: the call's numbers are not read
    call_then = f"{call} so 15 + 4 makes 19"
    assert scored(call_then)["accuracy"] == 1.0 and scored(f"19 {call}")["accuracy"] == 1.0


def test_arithmetic_negative_answer():
    assert score("arithmetic", r"12 - 30 = \boxed{-18}", "-18")["accuracy"] == 1.0


# ---- math.py: overall = 0.9 * accuracy + 0.1 * format; accuracy by mathruler on the last \boxed{}
def test_math_full_credit_needs_think_tags_and_a_correct_box():
    # mathruler: \frac{1}{2} -> 1/2, and sympy finds 1/2 - 0.5 == 0
    response = r"<think>2/4 reduces to 1/2.</think> The answer is \boxed{\frac{1}{2}}."
    assert score("math", response, "0.5") == {"overall": pytest.approx(1.0), "format": 1.0, "accuracy": 1.0}


def test_math_removes_the_spaces_around_tag_characters_before_both_checks():
    # "< think >" -> "<think>", "</ think >" -> "</think>", "1 / 2" -> "1/2"
    response = r"< think >halve it</ think > \boxed{1 / 2}"
    assert score("math", response, r"\frac{1}{2}") == {"overall": pytest.approx(1.0), "format": 1.0, "accuracy": 1.0}


def test_math_correct_answer_without_think_gets_accuracy_only():
    assert score("math", r"The answer is \boxed{4}", "4") == {
        "overall": pytest.approx(0.9),
        "format": 0.0,
        "accuracy": 1.0,
    }


def test_math_wrong_answer_with_format_gets_format_only():
    assert score("math", r"<think>hmm</think> \boxed{5}", "4")["overall"] == pytest.approx(0.1)


def test_math_integer_truth_needs_an_integer_answer_as_in_mathruler():
    # mathruler refuses sympy for an integer ground truth against a non-integer string: 8/2 is not accepted for 4
    # (math-verify would accept it; EasyR1 does not, so neither does the shipped file)
    assert score("math", r"<think>4 quarters</think> \boxed{8/2}", "4") == {
        "overall": pytest.approx(0.1),
        "format": 1.0,
        "accuracy": 0.0,
    }


def test_math_without_a_box_scores_zero_and_format_weight_is_a_keyword():
    assert score("math", "<think>x</think> 4", "4")["overall"] == 0.0
    # format_weight 0.5: 0.5 * 1 + 0.5 * 0
    assert score("math", r"\boxed{4}", "4", format_weight=0.5)["overall"] == pytest.approx(0.5)


# ---- r1v.py (sequential): overall = 0.5 * accuracy + 0.5 * format, on the response exactly as decoded
def test_r1v_full_credit():
    assert score("r1v", "<think>count</think><answer>3.0</answer>", "3") == {
        "overall": 1.0,
        "format": 1.0,
        "accuracy": 1.0,
    }


def test_r1v_multiple_choice_is_graded_as_text():
    # mathruler compares "(b)circle" with "b": different text, too many letters for sympy -> wrong
    response = "<think>The red one is a circle.</think> <answer>(B) circle</answer>"
    assert score("r1v", response, "B") == {"overall": 0.5, "format": 1.0, "accuracy": 0.0}


def test_r1v_surrounding_whitespace_breaks_the_format_but_not_the_answer():
    assert score("r1v", " <think>a</think><answer>B</answer>\n", "B") == {
        "overall": 0.5,
        "format": 0.0,
        "accuracy": 1.0,
    }


def test_r1v_spaced_tags_are_not_cleaned():
    # unlike math.py, r1v.py keeps "< answer >": no format, no tag, and the whole response is not "B"
    assert score("r1v", "<think>a</think> < answer >B</ answer >", "B")["overall"] == 0.0


def test_r1v_without_an_answer_tag_grades_the_whole_response():
    assert score("r1v", " 3 ", "3") == {"overall": 0.5, "format": 0.0, "accuracy": 1.0}


def test_r1v_answer_tag_spanning_lines_is_not_an_answer():
    # the format check spans lines; the answer search does not, so the whole response is graded against "3"
    assert score("r1v", "<think>x</think><answer>\n3\n</answer>", "3") == {
        "overall": 0.5,
        "format": 1.0,
        "accuracy": 0.0,
    }


def test_r1v_ground_truth_that_is_a_number_is_graded_as_its_text():
    # EasyR1's r1v.py scored it 0 (its `.strip()` failed inside a catch-all): every answer counted as wrong
    assert score("r1v", "<think>x</think><answer>3</answer>", 3) == {"overall": 1.0, "format": 1.0, "accuracy": 1.0}


# ---- dapo.py: overall = (+1 | -1) + factor * R_length; accuracy_normalized = (accuracy + 1) / 2
DAPO_KWARGS = {"max_response_length": 100, "overlong_buffer_length": 20, "overlong_penalty_factor": 1.0}


def test_dapo_reads_the_answer_line_and_scores_plus_minus_one():
    right = score("dapo", "Step 1: 6 * 7.\nAnswer: 42", "42", response_length=50, **DAPO_KWARGS)
    wrong = score("dapo", "Answer: 41", "42", response_length=50, **DAPO_KWARGS)
    missing = score("dapo", "It is 42.", "42", response_length=50, **DAPO_KWARGS)
    assert right == {"overall": 1.0, "accuracy": 1.0, "overlong": 0.0, "accuracy_normalized": 1.0}
    assert wrong == {"overall": -1.0, "accuracy": -1.0, "overlong": 0.0, "accuracy_normalized": 0.0}
    assert missing == wrong


def test_dapo_normalises_answers_the_minerva_way():
    # "$1,000$ dollars": spaces and "dollars" go, $...$ unwraps, the commas of a plain integer go -> "1000"
    assert score("dapo", "answer : $1,000$ dollars", "1000", **DAPO_KWARGS)["accuracy"] == 1.0
    # the part after the last "=" counts, and \frac12 is shorthand for \frac{1}{2}
    assert score("dapo", r"Answer: x = \frac12", r"\frac{1}{2}", **DAPO_KWARGS)["accuracy"] == 1.0
    # no symbolic equivalence: 0.5 is not \frac{1}{2}
    assert score("dapo", "Answer: 0.5", r"\frac{1}{2}", **DAPO_KWARGS)["accuracy"] == -1.0


def test_dapo_only_reads_the_last_300_characters():
    assert score("dapo", "Answer: 42\n" + "x" * 300, "42", **DAPO_KWARGS)["accuracy"] == -1.0
    assert score("dapo", "Answer: 42\n" + "x" * 289, "42", **DAPO_KWARGS)["accuracy"] == 1.0


def test_dapo_overlong_penalty_is_linear_in_the_buffer():
    # L_max 100, L_cache 20: |y| = 90 is 10 tokens into the buffer -> (80 - 90) / 20 = -0.5, times factor 0.5
    kwargs = {**DAPO_KWARGS, "overlong_penalty_factor": 0.5}
    result = score("dapo", "Answer: 42", "42", response_length=90, **kwargs)
    assert result == {"overall": 0.75, "accuracy": 1.0, "overlong": -0.5, "accuracy_normalized": 1.0}
    assert score("dapo", "Answer: 42", "42", response_length=80, **kwargs)["overlong"] == 0.0
    assert score("dapo", "Answer: 42", "42", response_length=100, **kwargs)["overlong"] == -1.0
    assert score("dapo", "Answer: 41", "42", response_length=101, **kwargs)["overall"] == -1.5


def test_dapo_without_a_buffer_punishes_only_past_the_maximum():
    kwargs = {**DAPO_KWARGS, "overlong_buffer_length": 0}
    assert score("dapo", "Answer: 42", "42", response_length=100, **kwargs)["overlong"] == 0.0
    assert score("dapo", "Answer: 42", "42", response_length=101, **kwargs)["overlong"] == -1.0


def test_dapo_keyword_arguments_are_required_as_in_easyr1():
    with pytest.raises(RewardFunctionError, match=r"reward_function_kwargs.*max_response_length"):
        load_reward_function(str(ROOT / "reward_function" / "dapo.py"), {})


@pytest.mark.parametrize("truth", [72, 72.0, "72"])
@pytest.mark.parametrize(
    ("name", "response", "kwargs", "accuracy"),
    [
        ("math", "<think>sum</think> \\boxed{72}", {}, 1.0),
        ("r1v", "<think>sum</think><answer>72</answer>", {}, 1.0),
        (
            "dapo",
            "Answer: 72",
            {"max_response_length": 100, "overlong_buffer_length": 10, "overlong_penalty_factor": 1.0},
            1.0,
        ),
        ("math", "<think>sum</think> \\boxed{71}", {}, 0.0),
    ],
)
def test_a_number_in_the_answer_column_grades_as_its_text(name, response, kwargs, accuracy, truth):
    # a parquet or jsonl answer column of numbers (GSM8K-style) reaches the function as int or float, not str
    assert score(name, response, truth, **kwargs)["accuracy"] == accuracy


@pytest.mark.parametrize(
    ("response", "truth", "right"),
    [
        # the cases of EasyR1's own android_gui.py, scored as it scores them
        ("0", "0", True),
        ("1", "1", True),
        ("2", "2", True),
        ("The answer is 1", "1", True),
        ("I choose option 2", "2", True),
        ("0", "1", False),
        ("2", "0", False),
        ("I don't know", "1", False),
        ("", "2", False),
        # the first of 0, 1, 2 anywhere: "12" names the middle card, "3 or 2" the right one; other digits are no card
        ("12", "1", True),
        ("3 or 2", "2", True),
        ("\n 2 \n", "2", True),
        ("9", "9", False),
        # a number in the answer column is its text; no choice is never right, even against an empty answer
        ("2", 2, True),
        ("1", 1.0, True),
        ("1", " 1 ", True),
        ("no digit", "", False),
    ],
)
def test_android_gui_scores_the_card_position_the_response_names(response, truth, right):
    scores = score("android_gui", response, truth)
    assert scores == {"overall": float(right), "accuracy": float(right)}


def test_android_gui_is_a_batch_function_named_as_easyr1s():
    fn = load_reward_function(str(ROOT / "reward_function" / "android_gui.py:compute_score"), {})
    assert (fn.reward_type, fn.reward_name) == ("batch", "number_game")
    items = [{"response": r, "response_length": 1, "ground_truth": "1"} for r in ("1", "0", "middle: 1")]
    assert [s["overall"] for s in fn.score(items)] == [1.0, 0.0, 1.0]

"""reward_function/code.py: programs from responses run against stdin/stdout and function-call tests in the sandbox,
with hand-worked pass rates; the built-in code problems and the code-RL recipe."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from easyrl.data.synthetic import load_builtin
from easyrl.data.synthetic.code import split_problems
from easyrl.workers.reward.loader import load_reward_function
from tests.fixtures.trainer_runs import run_training


REPO_ROOT = Path(__file__).resolve().parents[1]
REWARD_FILE = REPO_ROOT / "reward_function" / "code.py"
RECIPE_TIMEOUT_S = 900  # a quiet 2-core machine needs ~3 minutes; a busy one several times that
FAST = {"cpu_seconds": 1.0, "wall_seconds": 4.0, "memory_mb": 512}

SUM_TESTS = json.dumps({"inputs": ["1 2\n", "5 7\n", "-3 4\n", "10 0\n"], "outputs": ["3\n", "12\n", "1\n", "10\n"]})
ADD_TESTS = {"fn_name": "add", "inputs": [[1, 2], [5, 7], [-3, 4]], "outputs": [3, 12, 1]}


def block(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nIt reads two numbers."


def score(responses_and_tests: list[tuple[str, object]], **kwargs) -> list[dict]:
    reward = load_reward_function(f"{REWARD_FILE}:compute_score", {**FAST, **kwargs})
    inputs = [{"response": r, "response_length": 1, "ground_truth": t} for r, t in responses_and_tests]
    return reward.score(inputs)


@pytest.fixture(scope="module")
def code_module():
    return load_reward_function(f"{REWARD_FILE}:compute_score").fn.__globals__


# ----------------------------------------------------------------------------------------------------------------------
# stdin / stdout tests
# ----------------------------------------------------------------------------------------------------------------------
def test_stdin_programs_right_wrong_crashing_and_looping_score_their_pass_rates():
    right = block("a, b = map(int, input().split())\nprint(a + b)")
    wrong_when_negative = block("a, b = map(int, input().split())\nprint(abs(a) + b)")  # fails "-3 4" only
    crashes_on_zero = block("a, b = map(int, input().split())\nprint(a + b + 0 // b)")  # fails "10 0" only
    wrong_on_two = block("a, b = map(int, input().split())\nprint(a * b if a > 1 else a + b)")  # passes 1 2, -3 4
    loops = block("while True:\n    pass")
    scores = score([(r, SUM_TESTS) for r in (right, wrong_when_negative, crashes_on_zero, wrong_on_two, loops)])
    assert [s["pass_rate"] for s in scores] == [1.0, 0.75, 0.75, 0.5, 0.0]
    assert [s["all_pass"] for s in scores] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert [s["overall"] for s in scores] == [s["pass_rate"] for s in scores]
    assert [s["format"] for s in scores] == [1.0] * 5
    # why the tests failed, as shares of samples: the loop ran out of time, the zero division crashed, the wrong
    # answers are neither (a batch of zeros tells a too-tight limit from a wrong model)
    assert [(s["timed_out"], s["crashed"], s["over_limit"]) for s in scores] == [
        (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 0.0), (1.0, 0.0, 0.0)
    ]  # fmt: skip
    assert [s["syntax_error"] for s in score([(block("def f(:\n    pass"), SUM_TESTS), (right, SUM_TESTS)])] == [
        1.0,
        0.0,
    ]


def test_output_is_compared_line_by_line_with_whitespace_collapsed():
    tests = {"inputs": ["3\n"], "outputs": ["1 2 3\n"]}
    spaced = block("n = int(input())\nprint()\nprint('  1   2 3  ')\nprint()")
    split_over_lines = block("print(1)\nprint(2)\nprint(3)")
    assert [s["pass_rate"] for s in score([(spaced, tests), (split_over_lines, tests)])] == [1.0, 0.0]


def test_all_pass_reward_pays_only_programs_passing_every_test():
    right = block("a, b = map(int, input().split())\nprint(a + b)")
    partial = block("a, b = map(int, input().split())\nprint(abs(a) + b)")
    scores = score([(right, SUM_TESTS), (partial, SUM_TESTS)], reward="all_pass")
    assert [(s["overall"], s["pass_rate"]) for s in scores] == [(1.0, 1.0), (0.0, 0.75)]


def test_response_without_a_code_block_is_run_whole_and_scores_no_format():
    bare = "a, b = map(int, input().split())\nprint(a + b)"
    prose = "The answer is to add the two numbers."
    scores = score([(bare, SUM_TESTS), (prose, SUM_TESTS), ("", SUM_TESTS)])
    assert [(s["pass_rate"], s["format"]) for s in scores] == [(1.0, 0.0), (0.0, 0.0), (0.0, 0.0)]


def test_the_last_python_block_is_the_program(code_module):
    response = "```python\nprint('draft')\n```\ntext\n```py\nprint('final')\n```\n```text\nnot code\n```"
    assert code_module["extract_program"](response) == ("print('final')\n", True)
    assert code_module["extract_program"]("print(1)") == ("print(1)", False)


def test_after_a_time_out_the_remaining_tests_fail_without_running():
    # slow only on the first test: it times out, so tests 2-4 count as failed even though they would pass
    slow_first = block("import time\na, b = map(int, input().split())\nwhile a == 1:\n    pass\nprint(a + b)")
    assert score([(slow_first, SUM_TESTS)], max_workers=1)[0]["pass_rate"] == 0.0
    assert score([(slow_first, SUM_TESTS)], max_workers=1, skip_after_timeout=False)[0]["pass_rate"] == 0.75


def test_a_program_that_does_not_compile_fails_every_test_without_running_one(monkeypatch):
    """Each of its tests started a sandbox that could only fail: a 200-test row cost ~25 s a sample."""
    reward = load_reward_function(f"{REWARD_FILE}:compute_score", FAST)
    runs, real = [], reward.fn.__globals__["run_program"]
    counted = lambda *args, **kwargs: runs.append(1) or real(*args, **kwargs)  # noqa: E731  (runs them all)
    monkeypatch.setitem(reward.fn.__globals__, "run_program", counted)
    tests = json.dumps({"inputs": ["1 2\n"] * 200, "outputs": ["3\n"] * 200})
    right = block("a, b = map(int, input().split())\nprint(a + b)")
    rows = [(block("def f(:"), tests), ("The sum of the two numbers.", tests), (right, SUM_TESTS)]
    scores = reward.score([{"response": r, "response_length": 1, "ground_truth": t} for r, t in rows])
    assert [s["pass_rate"] for s in scores] == [0.0, 0.0, 1.0]
    assert len(runs) == 4  # the right program's four tests alone


def test_a_sandbox_that_cannot_start_the_interpreter_stops_scoring_naming_the_limit():
    """With memory_mb too small for Python to start, every test failed as if every program were wrong: the run
    trained on zeros with nothing said."""
    right = block("a, b = map(int, input().split())\nprint(a + b)")
    with pytest.raises(RuntimeError, match=r"could not run 4 of the batch's 4 test runs.*memory_mb=16"):
        score([(right, SUM_TESTS)], memory_mb=16)


# ----------------------------------------------------------------------------------------------------------------------
# function-call tests
# ----------------------------------------------------------------------------------------------------------------------
def test_function_call_programs_score_their_pass_rates():
    function = block("def add(a, b):\n    return a + b")
    method = block("class Solution:\n    def add(self, a: int, b: int) -> int:\n        return a + b")
    wrong_when_negative = block("def add(a, b):\n    return abs(a) + b")
    prints_instead = block("def add(a, b):\n    print(a + b)")
    missing = block("def plus(a, b):\n    return a + b")
    chatty = block("print('hello')\ndef add(a, b):\n    print('adding')\n    return a + b")
    responses = (function, method, wrong_when_negative, prints_instead, missing, chatty)
    scores = score([(r, ADD_TESTS) for r in responses])
    assert [round(s["pass_rate"], 4) for s in scores] == [1.0, 1.0, 0.6667, 0.0, 0.0, 1.0]


def test_a_function_result_json_cannot_hold_is_a_wrong_answer_not_a_crash():
    tests = {"fn_name": "pair", "inputs": [[1, 2]], "outputs": [[1, 2]]}
    wrong, right = block("def pair(a, b):\n    return {a, b}"), block("def pair(a, b):\n    return [a, b]")
    scores = score([(wrong, tests), (right, tests)])
    assert [(s["pass_rate"], s["crashed"]) for s in scores] == [(0.0, 0.0), (1.0, 0.0)]


def test_function_results_compare_as_json_values():
    pair = {"fn_name": "pair", "inputs": [[1], [2]], "outputs": [[1, 1], [2, 2]]}
    ratio = {"fn_name": "ratio", "inputs": [[1, 3]], "outputs": [0.333333333]}
    wrapped = {"fn_name": "add", "inputs": [[1, 2]], "outputs": [[3]]}  # APPS / TACO wrap call outputs in a list
    typed = {"fn_name": "total", "inputs": [[[1, 2, 3]]], "outputs": [6]}
    scores = score(
        [
            (block("def pair(x):\n    return (x, x)"), pair),  # a tuple equals the list
            (block("def ratio(a, b):\n    return a / b"), ratio),  # within 1e-6 relative
            (block("def add(a, b):\n    return a + b"), wrapped),
            (block("def total(xs: List[int]) -> int:\n    return sum(xs)"), typed),  # typing names predefined
            (block("def pair(x):\n    return [x, x + 1]"), pair),
        ]
    )
    assert [s["pass_rate"] for s in scores] == [1.0, 1.0, 1.0, 1.0, 0.0]


# ----------------------------------------------------------------------------------------------------------------------
# malicious and broken programs, bad data
# ----------------------------------------------------------------------------------------------------------------------
def test_malicious_programs_score_zero_beside_a_correct_one(tmp_path):
    right = block("a, b = map(int, input().split())\nprint(a + b)")
    flood = block("import sys\nwhile True:\n    sys.stdout.write('3\\n' * 100000)")
    bomb = block("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    escape = block(f"open({str(tmp_path / 'owned')!r}, 'w').write('x')\nprint(3)")
    scores = score([(right, SUM_TESTS), (flood, SUM_TESTS), (bomb, SUM_TESTS), (right, SUM_TESTS)])
    assert [s["pass_rate"] for s in scores] == [1.0, 0.0, 0.0, 1.0]
    assert scores[1]["over_limit"] == 1.0 and scores[0]["over_limit"] == 0.0  # the flood hit the output cap
    escape_score = score([(escape, {"inputs": ["1 2\n"], "outputs": ["3\n"]})])[0]["pass_rate"]
    from easyrl.workers.reward.sandbox import host_protections

    if host_protections().landlock:
        assert escape_score == 0.0 and not (tmp_path / "owned").exists()


def test_a_malformed_row_scores_zero_alone_and_the_valid_rows_are_scored(caplog):
    right = block("a, b = map(int, input().split())\nprint(a + b)")
    wrong = block("print(0)")
    two_inputs_one_output = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n"]}
    # 3 valid rows of 2 samples each, and the malformed row's sample at position 2 of the batch
    batch = [(right, SUM_TESTS), (wrong, SUM_TESTS), (right, two_inputs_one_output), (right, ADD_TESTS)]
    batch += [(block("def add(a, b):\n    return a + b"), ADD_TESTS), (right, SUM_TESTS), (wrong, SUM_TESTS)]
    with caplog.at_level("WARNING"):
        scores = score(batch)
    assert [s["pass_rate"] for s in scores] == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert [s["invalid_tests"] for s in scores] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert scores[2] == {
        "overall": 0.0, "pass_rate": 0.0, "all_pass": 0.0, "format": 1.0, "invalid_tests": 1.0,
        "syntax_error": 0.0, "timed_out": 0.0, "over_limit": 0.0, "crashed": 0.0,
    }  # fmt: skip
    assert all(s.keys() == scores[0].keys() for s in scores)  # every sample has the same named scores
    warnings = [r.getMessage() for r in caplog.records if "malformed tests" in r.getMessage()]
    assert len(warnings) == 1  # once per batch
    assert "1 of 7 samples" in warnings[0] and "sample 2 of the batch" in warnings[0] and "row" not in warnings[0]
    assert "2 inputs but 1 output" in warnings[0] and "'inputs': ['1 2" in warnings[0]


def test_each_kind_of_malformed_ground_truth_scores_zero_with_its_problem(code_module):
    problems = {
        "not json": "not JSON",
        json.dumps({"inputs": ["1"]}): "no lists `inputs` and `outputs`",
        json.dumps({"inputs": [], "outputs": []}): "no tests",
        json.dumps({"inputs": ["1", "2"], "outputs": ["1"]}): "2 inputs but 1 output",
    }
    for ground_truth, problem in problems.items():
        with pytest.raises(ValueError, match=problem):
            code_module["parse_tests"](ground_truth)
    scores = score([("print(1)", ground_truth) for ground_truth in [*problems, SUM_TESTS]])
    assert [(s["overall"], s["invalid_tests"], s["format"]) for s in scores[:-1]] == [(0.0, 1.0, 0.0)] * len(problems)
    assert scores[-1]["invalid_tests"] == 0.0


def test_a_batch_none_of_whose_tests_is_well_formed_raises_rather_than_train_on_zeros():
    """Tests in a neighbouring format (open-r1's verification_info, MBPP's assert lists) made every sample of every
    batch score 0, with a warning a batch: the run trained on zeros. The batch raises (the run stops at its first)."""
    mbpp = json.dumps(["assert add(1, 2) == 3"])
    open_r1 = json.dumps({"language": "python", "test_cases": [{"input": "1 2", "output": "3", "type": "stdin"}]})
    with pytest.raises(ValueError, match=r"2 of 2 samples of the batch have malformed tests"):
        score([(block("print(3)"), mbpp), (block("print(3)"), open_r1)])


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"reward": "allpass"}, "`reward` is 'allpass'; use one of pass_rate, all_pass"),
        ({"wall_seconds": 0}, "`wall_seconds` is 0; it must be a number above 0"),
        ({"memory_mb": -1}, "`memory_mb` is -1; it must be a number above 0"),
        ({"cpu_seconds": -1.0}, "`cpu_seconds` is -1.0; it must be a number above 0"),
        ({"max_workers": 0}, "`max_workers` is 0; it must be a number above 0"),
        ({"max_workers": 1.5}, "`max_workers` is 1.5; it must be a whole number"),
        ({"max_output_bytes": 0}, "`max_output_bytes` is 0"),
        ({"require": ["foo"]}, r"`require` names \['foo'\]; choose from namespaces, landlock, seccomp or all"),
    ],
)
def test_a_setting_the_sandbox_cannot_use_is_refused_when_the_file_is_loaded(setting, message):
    """A wall_seconds of 0 scored every test 0 as timed out, a negative memory_mb turned the memory limit off, a
    max_workers of 0 was taken as 1, and a misspelt reward kind was found at the first batch, after Ray started."""
    from easyrl.workers.reward.loader import RewardFunctionError

    with pytest.raises(RewardFunctionError, match=r"reward_function_kwargs` for `.*code.py`: " + message):
        load_reward_function(f"{REWARD_FILE}:compute_score", {**FAST, **setting})
    fn = load_reward_function(f"{REWARD_FILE}:compute_score").fn
    with pytest.raises(ValueError, match=message):  # called on its own, as a user's file may
        fn([{"response": "print(1)", "ground_truth": SUM_TESTS}], **{**FAST, **setting})


def test_require_all_is_taken_as_a_string_by_the_check_and_the_loader():
    from easyrl.workers.reward.loader import check_reward_kwargs

    check_reward_kwargs(f"{REWARD_FILE}:compute_score", {"require": "all"})
    load_reward_function(f"{REWARD_FILE}:compute_score", {"require": "all"})


def test_an_expected_output_longer_than_the_cap_is_warned_about_and_the_cap_can_be_raised(caplog):
    long_output = json.dumps({"inputs": [""], "outputs": ["x" * 300 + "\n"]})
    program = block("print('x' * 300)")
    with caplog.at_level("WARNING"):
        capped = score([(program, long_output)], max_output_bytes=100)
    assert capped[0]["pass_rate"] == 0.0 and capped[0]["over_limit"] == 1.0
    assert "1 tests of the batch expect more output than max_output_bytes=100" in caplog.text
    assert score([(program, long_output)], max_output_bytes=1000)[0]["pass_rate"] == 1.0


# ----------------------------------------------------------------------------------------------------------------------
# the built-in problems and the recipe
# ----------------------------------------------------------------------------------------------------------------------
def test_builtin_problems_have_both_styles_and_three_to_six_tests():
    train, test = load_builtin("builtin://code@train"), load_builtin("builtin://code@test")
    assert (len(train), len(test)) == (24, 8)
    for rows in (train, test):
        specs = [json.loads(row["answer"]) for row in rows]
        assert all(3 <= len(spec["inputs"]) == len(spec["outputs"]) <= 6 for spec in specs)
        assert {"fn_name" in spec for spec in specs} == {True, False}
    assert not {row["problem"] for row in train} & {row["problem"] for row in test}


def reference_scores(splits: tuple[str, ...]) -> list[str]:
    """Names of the built-in problems of `splits` whose reference solution fails one of its tests."""
    rows, problems = [], []
    for split in splits:
        rows += load_builtin(f"builtin://code@{split}")
        problems += split_problems(split)
    scores = score([(block(p.solution), row["answer"]) for p, row in zip(problems, rows)], max_workers=4)
    return [p.name for p, s in zip(problems, scores) if s["pass_rate"] != 1.0]


def test_every_reference_solution_of_the_test_split_passes_all_its_tests():
    assert reference_scores(("test",)) == []


@pytest.mark.slow
def test_every_reference_solution_passes_all_its_tests():
    assert reference_scores(("train", "test")) == []


def test_code_recipe_passes_the_config_check():
    result = subprocess.run(
        [sys.executable, "-m", "easyrl", "check", f"config={REPO_ROOT / 'examples' / 'smollm2_code_grpo.yaml'}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reward_function/code.py:compute_score" in result.stdout
    assert "config is valid" in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(RECIPE_TIMEOUT_S + 60)
def test_code_recipe_trains_two_steps_end_to_end(tmp_path):
    """`easyrl train` on the recipe as shipped (SmolLM2-135M-Instruct, built-in problems, sandboxed code reward),
    shrunk to 2 steps of 2 prompts x 4 samples: every step logs the code reward's scores."""
    overrides = [
        f"config={REPO_ROOT / 'examples' / 'smollm2_code_grpo.yaml'}",
        "trainer.max_steps=2",
        "data.rollout_batch_size=2",
        "worker.rollout.n=4",
        "data.max_response_length=96",
        "worker.actor.global_batch_size=2",
        "worker.rollout.kv_cache_memory_bytes=134217728",
        "worker.rollout.disable_tqdm=true",
        "trainer.val_before_train=false",
        "trainer.val_freq=0",
        "trainer.save_freq=0",
        f"trainer.save_checkpoint_path={tmp_path / 'run'}",
    ]
    run_training(overrides, tmp_path / "train.log", timeout=RECIPE_TIMEOUT_S)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "reward/pass_rate" in row]
    assert [row["step"] for row in steps] == [1.0, 2.0]
    for row in steps:
        assert 0.0 <= row["reward/all_pass"] <= row["reward/pass_rate"] == row["reward/overall"] <= 1.0
        assert 0.0 <= row["reward/format"] <= 1.0 and row["reward/errors"] == 0.0

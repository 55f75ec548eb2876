"""Code reward: run the model's program against the row's test cases, each test in its own sandbox.

    program   = the last ```python (or ```py / ```python3) fenced block of the response; without one, the whole text
    format    = 1 if the response has such a block, else 0
    pass_rate = tests passed / tests
    all_pass  = 1 if every test passed, else 0
    overall   = pass_rate (`reward: pass_rate`, the default) or all_pass (`reward: all_pass`)
    invalid_tests = 1 if the sample's ground truth is malformed (not JSON, no `inputs`/`outputs` lists, no tests,
                or not one output per input), else 0: that sample alone scores 0, the rest of the batch is scored as
                usual, and the batch logs one warning with the first such sample's problem and ground truth
    syntax_error / timed_out / over_limit / crashed = 1 if the program did not compile / ran out of time / hit the
                memory, output or file limit / exited non-zero or was killed (a blocked system call) on some test

`ground_truth` holds the tests as a JSON string or a dict, in either style of the public code-RL data sets:
    standard input / output (APPS, TACO, CodeContests):
        {"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}
        the program reads the input on stdin; it passes when its stdout equals the output line by line, with the
        whitespace inside each line collapsed and blank lines at the start and end ignored.
    function call (LeetCode-style sets):
        {"fn_name": "add", "inputs": [[1, 2], ...], "outputs": [3, ...]}
        the program defines `add` (or a class `Solution` with a method `add`); it passes when add(*inputs[i])
        equals outputs[i] after a JSON round trip (tuples compare as lists; floats to 1e-6 relative), or equals
        outputs[i][0] when that is a one-element list (APPS and TACO wrap function outputs so).

Each test is one sandboxed run (easyrl.workers.reward.sandbox: a separate process with CPU, wall, memory, output
and file limits, no network, a throwaway folder, no access to the trainer's environment or files where the host
supports it). A program that crashes, hangs, floods its output or misbehaves fails that test, so it scores 0 for it;
the training run never sees its exceptions. The program runs as `python -I -S` (standard library only: no
third-party package such as numpy imports) and its stdout and stderr are capped at `max_output_bytes` (8 MiB)
each, past which it is killed and fails the test (a test that expects more output than that is warned about).
Tests of the whole batch run concurrently on `max_workers` threads.
After a program hits its time limit its remaining tests are failed without being run (`skip_after_timeout`), so an
infinite loop costs one time-out, not one per test; a program that does not compile fails every test without one
being run. A test the sandbox itself could not start (e.g. `memory_mb` too small for the interpreter) fails too, with
a warning; when no test of a batch could start, scoring raises, so the run stops rather than learn from zeros.

Keyword arguments (`worker.reward.reward_function_kwargs`): reward, max_workers, cpu_seconds (rounded up to whole
seconds, the kernel's unit), wall_seconds,
memory_mb, max_output_bytes, skip_after_timeout, require (sandbox layers that must be present, e.g. ["namespaces",
"landlock", "seccomp"] or "all"; without them the run stops instead of scoring with less isolation). They are checked
when the run loads the file (`check_kwargs`), before Ray starts. A batch none of whose samples has well-formed
tests (data in another format) raises, so the run stops rather than learn from zeros.
"""

import json
import logging
import math
import re
import threading
from concurrent.futures import ThreadPoolExecutor

from easyrl.workers.reward.sandbox import Limits, RunResult, run_program


_log = logging.getLogger(__name__)

REWARD_NAME = "code"
REWARD_TYPE = "batch"

REWARDS = ("pass_rate", "all_pass")
_FENCED_PYTHON = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_RESULT_MARKER = "__easyrl_result__:"

# Runs the program as a module, then calls its function on the JSON arguments read from stdin and prints the JSON
# result after a marker line (the program's own prints come before it). `typing` names are predefined, as LeetCode
# does, so `List[int]` annotations work without an import. A value JSON cannot hold (a set) is written as its repr:
# a wrong answer, not a crash.
_CALL_HARNESS = """\
import json, sys
namespace = {"__name__": "solution"}
exec("from typing import *", namespace)
exec(compile(open("solution.py", encoding="utf-8").read(), "solution.py", "exec"), namespace)
function = namespace.get(FN_NAME)
if not callable(function) and isinstance(namespace.get("Solution"), type):
    function = getattr(namespace["Solution"](), FN_NAME, None)
if not callable(function):
    sys.exit(f"the program defines no function {FN_NAME!r} (nor a Solution class with that method)")
result = function(*json.loads(sys.stdin.read()))
sys.stdout.write("\\nMARKER" + json.dumps(result, default=repr) + "\\n")
"""


def extract_program(response: str) -> tuple[str, bool]:
    """(program, True) from the last fenced python block, else (the whole response, False)."""
    blocks = _FENCED_PYTHON.findall(response)
    if blocks:
        return blocks[-1], True
    return response, False


def parse_tests(ground_truth) -> dict:
    """The tests as {"inputs", "outputs", "fn_name" (or None)}; a malformed spec raises ValueError saying what is
    wrong (compute_score turns that into a score of 0 for that sample alone)."""
    spec = ground_truth
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except ValueError as err:
            raise ValueError(f"not JSON ({err})") from None
    if (
        not isinstance(spec, dict)
        or not isinstance(spec.get("inputs"), list)
        or not isinstance(spec.get("outputs"), list)
    ):
        raise ValueError("no lists `inputs` and `outputs`")
    inputs, outputs = len(spec["inputs"]), len(spec["outputs"])
    if inputs != outputs or not inputs:
        raise ValueError(
            f"{inputs} input{'s' * (inputs != 1)} but {outputs} output{'s' * (outputs != 1)}"
            if inputs != outputs
            else "no tests"
        )
    return {"inputs": spec["inputs"], "outputs": spec["outputs"], "fn_name": spec.get("fn_name") or None}


def _parse_or_none(ground_truth) -> tuple[dict | None, str | None]:
    """(tests, None), or (None, what is wrong) for a malformed ground truth."""
    try:
        return parse_tests(ground_truth), None
    except ValueError as err:
        return None, str(err)


def normalize_lines(text: str) -> list[str]:
    """Lines with their whitespace runs collapsed, without blank lines at the start and end."""
    lines = [" ".join(line.split()) for line in text.strip().splitlines()]
    return lines


def values_equal(actual, expected) -> bool:
    """JSON values equal, floats within 1e-6 relative (1e-9 absolute)."""
    if isinstance(actual, bool) or isinstance(expected, bool):
        return actual is expected
    if isinstance(actual, (int, float)) and isinstance(expected, (int, float)):
        return math.isclose(actual, expected, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(values_equal(a, e) for a, e in zip(actual, expected))
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(values_equal(actual[k], expected[k]) for k in actual)
    return actual == expected


def _stdin_text(test_input) -> str:
    return "\n".join(map(str, test_input)) + "\n" if isinstance(test_input, list) else str(test_input)


def compiles(program: str) -> bool:
    """Whether the program is Python at all. Compiling runs none of it; one that does not compile fails every test
    without a sandbox being started for each (a 200-test row cost ~25 s of runs that could only fail)."""
    try:
        compile(program, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def run_test(program: str, tests: dict, index: int, limits: Limits, require=()) -> tuple[bool, RunResult]:
    """(passed, the run's result: its `limit`, and its `error` when the sandbox could not run it) for test `index`
    of `tests`."""
    expected = tests["outputs"][index]
    if tests["fn_name"] is None:
        result = run_program(program, _stdin_text(tests["inputs"][index]), limits, require=require)
        passed = result.ok and normalize_lines(result.stdout) == normalize_lines(_stdin_text(expected))
        return passed, result
    harness = _CALL_HARNESS.replace("FN_NAME", repr(str(tests["fn_name"]))).replace("MARKER", _RESULT_MARKER)
    arguments = tests["inputs"][index]
    arguments = arguments if isinstance(arguments, list) else [arguments]
    result = run_program(harness, json.dumps(arguments), limits, files={"solution.py": program}, require=require)
    if not result.ok:
        return False, result
    marked = [line for line in result.stdout.splitlines() if line.startswith(_RESULT_MARKER)]
    try:
        actual = json.loads(marked[-1][len(_RESULT_MARKER) :])
    except (IndexError, ValueError):
        return False, result
    expected = json.loads(json.dumps(expected))
    wrapped = isinstance(expected, list) and len(expected) == 1 and values_equal(actual, expected[0])
    return values_equal(actual, expected) or wrapped, result


def _check_sandbox_errors(results: list[RunResult], limits: Limits) -> None:
    """A run the sandbox could not start (the program never ran) fails its test: said in a warning, and an error
    when no run of the batch started, which would otherwise train on zeros a weak model also scores (e.g. memory_mb
    too small for the interpreter to start)."""
    failed = [result for result in results if result.limit == "sandbox_error"]
    if not failed:
        return
    message = (
        f"code reward: the sandbox could not run {len(failed)} of the batch's {len(results)} test runs, which fail; "
        f"the first error: {failed[0].error or '(no message)'}. Limits: cpu_seconds={limits.cpu_seconds:g}, "
        f"wall_seconds={limits.wall_seconds:g}, memory_mb={limits.memory_mb} (worker.reward.reward_function_kwargs)."
    )
    if len(failed) == len(results):
        raise RuntimeError(message)
    _log.warning(message)


def check_kwargs(kwargs: dict) -> None:
    """The settings of `worker.reward.reward_function_kwargs` this file reads, checked when the run loads it (before
    Ray starts) and at each call: a ValueError names the key and the values it takes. A limit of 0 or below would
    fail every test (wall_seconds) or turn the limit off (a negative memory_mb is no address-space limit)."""
    reward = kwargs.get("reward", "pass_rate")
    if reward not in REWARDS:
        raise ValueError(f"`reward` is {reward!r}; use one of {', '.join(REWARDS)}.")
    for key in ("cpu_seconds", "wall_seconds", "memory_mb", "max_output_bytes", "max_workers"):
        value = kwargs.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"`{key}` is {value!r}; it must be a number above 0.")
        if key == "max_workers" and value != int(value):
            raise ValueError(f"`max_workers` is {value!r}; it must be a whole number of threads, at least 1.")
    from easyrl.workers.reward.sandbox import LAYERS

    require = kwargs.get("require", ())
    required = [require] if isinstance(require, str) else list(require or ())
    unknown = [layer for layer in required if layer not in (*LAYERS, "all")]
    if unknown:
        raise ValueError(f"`require` names {unknown}; choose from {', '.join(LAYERS)} or all.")


def compute_score(
    reward_inputs: list[dict],
    reward: str = "pass_rate",
    max_workers: int = 4,
    cpu_seconds: float = 2.0,
    wall_seconds: float = 6.0,
    memory_mb: int = 1024,
    skip_after_timeout: bool = True,
    require: list[str] | tuple[str, ...] | str = (),
    max_output_bytes: int = 8 << 20,
) -> list[dict[str, float]]:
    settings = {
        "reward": reward,
        "max_workers": max_workers,
        "cpu_seconds": cpu_seconds,
        "wall_seconds": wall_seconds,
        "memory_mb": memory_mb,
        "require": require,
        "max_output_bytes": max_output_bytes,
    }
    try:
        check_kwargs(settings)
    except ValueError as err:
        raise ValueError(f"code reward: {err} (worker.reward.reward_function_kwargs)") from None
    limits = Limits(
        cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=int(memory_mb), max_output_bytes=max_output_bytes
    )
    programs = [extract_program(item["response"]) for item in reward_inputs]
    parsed = [_parse_or_none(item["ground_truth"]) for item in reward_inputs]
    tests = [spec or {"inputs": [], "outputs": [], "fn_name": None} for spec, _problem in parsed]
    invalid = [row for row, (_spec, problem) in enumerate(parsed) if problem is not None]
    if invalid:
        row, problem = invalid[0], parsed[invalid[0]][1]
        message = (
            f"code reward: {len(invalid)} of {len(reward_inputs)} samples of the batch have malformed tests and score "
            f"0 (score `invalid_tests` = 1); the first, sample {row} of the batch: {problem}, in ground_truth "
            f"{str(reward_inputs[row]['ground_truth'])[:120]!r}. Store the tests as "
            '{"inputs": [...], "outputs": [...]} with one output per input (add "fn_name" for function-call tests).'
        )
        if len(invalid) == len(reward_inputs):  # data in another format: nothing would be learnt but zeros
            raise ValueError(message)
        _log.warning(message)
    _warn_unmatchable_outputs(tests, max_output_bytes)
    first_timeout = [math.inf] * len(reward_inputs)  # per row: the index of its first test that ran out of time
    lock = threading.Lock()

    def one_test(row: int, index: int) -> tuple[bool, RunResult | None]:
        if skip_after_timeout and first_timeout[row] < index:
            return False, None
        passed, result = run_test(programs[row][0], tests[row], index, limits, require)
        if result.limit in TIME_LIMITS:
            with lock:
                first_timeout[row] = min(first_timeout[row], index)
        return passed, result

    runnable = [row for row, (program, _fenced) in enumerate(programs) if compiles(program)]
    runnable_rows = set(runnable)
    jobs = [(row, index) for row in runnable for index in range(len(tests[row]["inputs"]))]
    with ThreadPoolExecutor(max_workers=max(1, int(max_workers)), thread_name_prefix="code-reward") as pool:
        outcomes = list(pool.map(lambda job: one_test(*job), jobs))
    _check_sandbox_errors([result for _ok, result in outcomes if result is not None], limits)
    passed = [0] * len(reward_inputs)
    causes = [set() for _ in reward_inputs]  # why a sample's tests failed, beyond a wrong answer
    for (row, index), (ok, result) in zip(jobs, outcomes):
        # tests after a time-out fail whether or not they had already started: the score does not depend on timing
        passed[row] += ok and not (skip_after_timeout and index > first_timeout[row])
        if result is not None and not ok:
            causes[row].add(_failure_cause(result))
    scores = []
    for row, (_program, fenced) in enumerate(programs):
        count = len(tests[row]["inputs"])  # 0 for malformed tests: they score 0
        pass_rate = passed[row] / count if count else 0.0
        all_pass = 1.0 if count and passed[row] == count else 0.0
        scores.append(
            {
                "overall": pass_rate if reward == "pass_rate" else all_pass,
                "pass_rate": pass_rate,
                "all_pass": all_pass,
                "format": 1.0 if fenced else 0.0,
                "invalid_tests": 0.0 if count else 1.0,
                # the shares of samples (as reward/* means) whose program did not compile, ran out of time, hit a
                # memory / output / file limit, or crashed (a non-zero exit, a signal, a blocked system call) on
                # some test: a batch of zeros tells a too-tight cpu_seconds from a wrong model
                "syntax_error": 0.0 if row in runnable_rows or not count else 1.0,
                **{name: float(name in causes[row]) for name in FAILURE_CAUSES},
            }
        )
    return scores


def _warn_unmatchable_outputs(tests: list[dict], max_output_bytes: int) -> None:
    """A standard-output test whose expected output is longer than the output cap cannot pass: the right program is
    killed at the cap (`over_limit`), like one flooding its output."""
    longer = sum(
        len(_stdin_text(output).encode("utf-8")) > max_output_bytes
        for spec in tests
        if spec["fn_name"] is None
        for output in spec["outputs"]
    )
    if longer:
        _log.warning(
            "code reward: %d tests of the batch expect more output than max_output_bytes=%d, so no program can pass "
            "them (it is stopped at the cap, `over_limit`); raise worker.reward.reward_function_kwargs."
            "max_output_bytes above the longest expected output.",
            longer,
            max_output_bytes,
        )


FAILURE_CAUSES = ("timed_out", "over_limit", "crashed")
TIME_LIMITS = ("cpu_time", "wall_time")  # RunResult.limit of a program that ran out of time


def _failure_cause(result: RunResult) -> str | None:
    """A failed test's cause: its time limit, another limit (memory, output, file size), a crash; None for a program
    that ran and answered wrong."""
    if result.limit in TIME_LIMITS:
        return "timed_out"
    if result.limit is not None and result.limit != "sandbox_error":
        return "over_limit"
    if result.limit is None and result.exit_code != 0:
        return "crashed"
    return None

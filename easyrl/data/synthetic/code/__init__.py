"""Built-in programming problems (``builtin://code@train`` / ``@test``) for code RL with reward_function/code.py.

Rows: ``{"problem": statement, "answer": tests as a JSON string, "data_source": "code"}``, where the tests follow
the two public styles the code reward reads: ``{"inputs": [stdin, ...], "outputs": [stdout, ...]}`` or
``{"fn_name": name, "inputs": [[args], ...], "outputs": [return value, ...]}``. Every fourth problem is held out
for the test split (8 of 32, both styles); the training split has the other 24.
"""

import json

from .problems import PROBLEMS, Problem


SPLITS = ("train", "test")
TEST_EVERY = 4  # problem i goes to the test split when i % TEST_EVERY == TEST_EVERY - 1


def tests_json(problem: Problem) -> str:
    spec = {"inputs": [test[0] for test in problem.tests], "outputs": [test[1] for test in problem.tests]}
    if problem.fn_name is not None:
        spec = {"fn_name": problem.fn_name, **spec}
    return json.dumps(spec)


def split_problems(split: str) -> list[Problem]:
    if split not in SPLITS:
        raise ValueError(f"Unknown code split {split!r}; choose one of {list(SPLITS)}.")
    held_out = [i % TEST_EVERY == TEST_EVERY - 1 for i in range(len(PROBLEMS))]
    return [problem for problem, test in zip(PROBLEMS, held_out) if test == (split == "test")]


def generate_code(split: str = "train") -> list[dict]:
    """Rows of ``split`` ("train" or "test")."""
    return [
        {"problem": problem.statement, "answer": tests_json(problem), "data_source": "code"}
        for problem in split_problems(split)
    ]

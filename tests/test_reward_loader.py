"""Loading reward functions from files: the calling conventions, and errors that name the file and the fix."""

import pytest

from easyrl.workers.reward.loader import (
    RewardFunction,
    RewardFunctionError,
    import_user_file,
    load_reward_function,
    resolve_reward_function,
)


def write(tmp_path, text, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


BATCH = """
def compute_score(reward_inputs, bonus=0.0):
    return [{"overall": float(len(x["response"])) + bonus, "format": 1} for x in reward_inputs]
"""


def test_without_main_the_default_function_is_compute_score_and_default_type_is_batch(tmp_path):
    fn = load_reward_function(str(write(tmp_path, BATCH)), {"bonus": 0.5})
    assert fn.reward_type == "batch" and fn.name == "compute_score"
    assert fn.score([{"response": "abc"}, {"response": ""}]) == [
        {"overall": 3.5, "format": 1.0},
        {"overall": 0.5, "format": 1.0},
    ]


def test_named_sequential_function_is_called_once_per_input(tmp_path):
    path = write(
        tmp_path, "REWARD_TYPE = 'sequential'\ndef judge(item):\n    return {'overall': item['ground_truth']}\n"
    )
    fn = load_reward_function(f"{path}:judge", {})
    assert fn.reward_type == "sequential"
    assert fn.score([{"ground_truth": 1}, {"ground_truth": 0}]) == [{"overall": 1.0}, {"overall": 0.0}]


def test_an_older_easyr1_configs_reward_type_says_how_a_file_without_reward_type_is_called(tmp_path, caplog):
    """EasyR1 configs chose the calling convention with worker.reward.reward_type; the key was dropped, so a
    sequential function was called with the whole batch and the run died at the first step."""
    from easyrl.config import load_config

    path = write(
        tmp_path, "def compute_score(item, format_weight=0.1):\n    return {'overall': item['ground_truth']}\n"
    )
    fn = load_reward_function(str(path), {"format_weight": 0.2}, None, "sequential")
    assert fn.reward_type == "sequential"
    assert fn.score([{"ground_truth": 1}, {"ground_truth": 0}]) == [{"overall": 1.0}, {"overall": 0.0}]
    config = load_config(
        [f"worker.reward.reward_function={path}", "worker.reward.reward_type=sequential"], validate=False
    )
    assert config.worker.reward.reward_type == "sequential"
    # the file's own REWARD_TYPE is what its function is written for: it wins, and the difference is said
    batch = write(tmp_path, "REWARD_TYPE = 'batch'\n" + BATCH, name="batch_reward.py")
    with caplog.at_level("WARNING"):
        assert load_reward_function(str(batch), {}, None, "sequential").reward_type == "batch"
    assert "worker.reward.reward_type is 'sequential' but" in caplog.text and "REWARD_TYPE = 'batch'" in caplog.text


def test_missing_file_names_the_config_key(tmp_path):
    with pytest.raises(RewardFunctionError, match=r"worker.reward.reward_function.*nope.py.*does not exist"):
        load_reward_function(str(tmp_path / "nope.py"), {})


def test_missing_function_lists_the_functions_found(tmp_path):
    path = write(tmp_path, BATCH)
    with pytest.raises(RewardFunctionError, match=r"defines no function `score`.*Functions found: compute_score"):
        load_reward_function(f"{path}:score", {})


def test_bad_reward_type_says_which_values_work(tmp_path):
    path = write(tmp_path, "REWARD_TYPE = 'parallel'\n" + BATCH)
    with pytest.raises(RewardFunctionError, match=r"REWARD_TYPE.*'parallel'.*'batch'.*'sequential'"):
        load_reward_function(str(path), {})
    # `easyrl check` reads the file without importing it, and refuses it as the run would
    with pytest.raises(RewardFunctionError, match=r"REWARD_TYPE.*'parallel'.*'batch'.*'sequential'"):
        resolve_reward_function(str(path))
    # a literal the file reassigns later counts as its last; one computed at import is left to the import
    resolve_reward_function(str(write(tmp_path, "REWARD_TYPE = 'bacth'\nREWARD_TYPE = 'batch'\n" + BATCH, "a.py")))
    resolve_reward_function(str(write(tmp_path, "REWARD_TYPE = 'b' + 'atch'\n" + BATCH, "b.py")))


def test_unexpected_kwargs_are_reported_with_the_config_key(tmp_path):
    path = write(tmp_path, BATCH)
    with pytest.raises(RewardFunctionError, match=r"reward_function_kwargs"):
        load_reward_function(str(path), {"temperature": 1.0})


def test_import_error_in_the_file_is_reported(tmp_path):
    path = write(tmp_path, "import not_a_module_anywhere\n" + BATCH)
    with pytest.raises(RewardFunctionError, match=r"importing .*my_reward.py.*ModuleNotFoundError"):
        load_reward_function(str(path), {})


@pytest.mark.parametrize("code", [0, 2])
def test_a_script_exiting_at_import_is_an_error_naming_the_file_not_an_exit_of_easyrl(tmp_path, code):
    """argparse at a reward file's top level parsed easyrl's command line and exited 2 with a usage line that looked
    like easyrl's; sys.exit(0) ended `easyrl train` with status 0 having trained nothing."""
    body = "import argparse\nargparse.ArgumentParser().parse_args(['--x'])\n" if code else "import sys\nsys.exit(0)\n"
    path = write(tmp_path, body + BATCH)
    with pytest.raises(
        RewardFunctionError, match=rf"importing `.*my_reward.py` ran sys.exit\({code}\) at its top level"
    ):
        load_reward_function(str(path), {})
    with pytest.raises(RewardFunctionError, match=r"multi_turn.tools`: importing .* under `if __name__"):
        import_user_file(str(path), "worker.rollout.multi_turn.tools")


@pytest.mark.parametrize(
    "source",
    [
        "REWARD_TYPE = 'batch'\nasync def compute_score(reward_inputs):\n"
        "    await asyncio.sleep(0)\n    return [{'overall': len(x['response'])} for x in reward_inputs]\n",
        "REWARD_TYPE = 'sequential'\nasync def compute_score(reward_input):\n"
        "    await asyncio.sleep(0)\n    return {'overall': len(reward_input['response'])}\n",
        "async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    await asyncio.sleep(0)\n    return len(solution_str)\n",
        "async def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
        "    await asyncio.sleep(0)\n    return numpy.array([len(s) for s in solution_strs], dtype=numpy.float32)\n",
        "def compute_score(completions, **kwargs):\n    return torch.tensor([len(c) for c in completions])\n",
        "def compute_score(completions, **kwargs):\n    return numpy.array([len(c) for c in completions])\n",
    ],
    ids=["batch-async", "sequential-async", "verl-async", "verl-batch-async-numpy", "trl-tensor", "trl-numpy"],
)
def test_async_functions_and_array_returns_score_in_every_convention(tmp_path, source):
    """Only TRL's convention awaited an `async def` (the others stopped the run: 'it returned a coroutine'), and a
    batch's numpy array (TRL and verl index it) was refused as not a list."""
    path = write(tmp_path, "import asyncio\nimport numpy\nimport torch\n" + source)
    fn = load_reward_function(str(path), {})
    inputs = [{"response": "abc", "ground_truth": "1"}, {"response": "", "ground_truth": "2"}]
    scores = fn.score(inputs)
    assert [score["overall"] for score in scores] == [3.0, 0.0]


def test_a_reward_file_importing_a_helper_next_to_it_is_told_its_folder_is_not_on_the_import_path(tmp_path):
    """verl users' reward files often import their own grader next to them."""
    (tmp_path / "my_grader.py").write_text("def grade(text):\n    return 1.0\n")
    path = write(tmp_path, "from my_grader import grade\n" + BATCH)
    with pytest.raises(RewardFunctionError) as error:
        load_reward_function(str(path), {})
    assert f"`my_grader` is next to it in `{tmp_path}`, but easyrl imports the file by its path" in str(error.value)
    assert "pip install" not in str(error.value).split("(pip install -e)")[0]


def test_batch_function_returning_wrong_length_names_function_and_file(tmp_path):
    path = write(tmp_path, "def compute_score(reward_inputs):\n    return [{'overall': 1.0}]\n")
    fn = load_reward_function(str(path), {})
    with pytest.raises(
        RewardFunctionError, match=r"`compute_score` in .*my_reward.py.*list of 2 dicts.*list of length 1"
    ):
        fn.score([{}, {}])


def test_bare_number_return_suggests_a_dict(tmp_path):
    path = write(tmp_path, "REWARD_TYPE = 'sequential'\ndef compute_score(item):\n    return 1.0\n")
    with pytest.raises(RewardFunctionError, match=r"\{'overall': score\}"):
        load_reward_function(str(path), {}).score([{}])


def test_dict_without_overall_lists_its_keys(tmp_path):
    path = write(tmp_path, "REWARD_TYPE = 'sequential'\ndef compute_score(item):\n    return {'acc': 1.0}\n")
    with pytest.raises(RewardFunctionError, match=r"no `overall` key \(keys: acc\)"):
        load_reward_function(str(path), {}).score([{}])
    # one bad entry of a batch's list is named by its input's ground truth (the file alone did not say which)
    source = "REWARD_TYPE = 'batch'\ndef compute_score(items):\n    return [{'overall': 1.0}, None]\n"
    batch = load_reward_function(str(write(tmp_path, source, name="batch.py")), {})
    with pytest.raises(
        RewardFunctionError, match=r"it returned a NoneType \(for the input with ground truth '7'\)\.$"
    ):
        batch.score([{"ground_truth": "5"}, {"ground_truth": "7"}])


def test_non_numeric_score_is_rejected(tmp_path):
    path = write(tmp_path, "REWARD_TYPE = 'sequential'\ndef compute_score(item):\n    return {'overall': 'high'}\n")
    with pytest.raises(RewardFunctionError, match=r"non-numeric score `overall`: 'high'"):
        load_reward_function(str(path), {}).score([{}])
    # a number written as text is text too ("0.5" passed where "1/2" failed, by float()'s parsing alone)
    path = write(
        tmp_path, "REWARD_TYPE = 'sequential'\ndef compute_score(item):\n    return {'overall': 1.0, 'acc': '0.5'}\n"
    )
    with pytest.raises(RewardFunctionError, match=r"non-numeric score `acc`: '0.5'"):
        load_reward_function(str(path), {}).score([{}])


def test_a_file_named_math_does_not_shadow_the_standard_library(tmp_path):
    path = write(tmp_path, BATCH, name="math.py")
    load_reward_function(str(path), {})
    import math

    assert math.sqrt(4.0) == 2.0


# ---- functions written for verl: compute_score(data_source, solution_str, ground_truth, extra_info), per response
VERL_STYLE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.0):
    right = solution_str.strip().endswith("#### " + ground_truth)
    if data_source != "openai/gsm8k":
        return {"score": -1.0, "pred": "not gsm8k"}
    return {"score": 1.0 if right else format_score, "acc": right, "index": extra_info["index"], "pred": solution_str}
"""

VERL_ITEMS = [
    {"response": "so #### 72", "response_length": 4, "ground_truth": "72", "data_source": "openai/gsm8k",
     "extra_info": {"index": 3}},
    {"response": "so #### 71", "response_length": 4, "ground_truth": "72", "data_source": "openai/gsm8k",
     "extra_info": {"index": 4}},
    {"response": "x", "response_length": 1, "ground_truth": "1", "data_source": "other", "extra_info": None},
]  # fmt: skip


def test_a_verl_reward_function_is_called_as_verl_calls_it(tmp_path):
    fn = load_reward_function(str(write(tmp_path, VERL_STYLE)), {"format_score": 0.1})
    assert fn.reward_type == "verl" and "as verl calls it" in fn.describe()
    # score -> overall; numeric entries (bools too) -> named scores; text (the predicted answer) dropped
    assert fn.score(VERL_ITEMS) == [
        {"overall": 1.0, "acc": 1.0, "index": 3.0},
        {"overall": 0.1, "acc": 0.0, "index": 4.0},
        {"overall": -1.0},
    ]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def compute_score(solution_str, ground_truth):\n    return float(ground_truth in solution_str)\n", 1.0),
        ("def compute_score(solution_str, **kwargs):\n    return float(kwargs['extra_info']['index'])\n", 3.0),
        ("def compute_score(solution_str, ground_truth, method='strict'):\n    return 2\n", 2.0),
    ],
)
def test_a_verl_function_gets_the_arguments_it_declares(tmp_path, source, expected):
    fn = load_reward_function(str(write(tmp_path, source)), {})
    assert fn.score(VERL_ITEMS[:1]) == [{"overall": expected}]


def test_verl_style_errors_name_the_convention(tmp_path):
    no_score = write(tmp_path, "def compute_score(solution_str, ground_truth):\n    return {'acc': 1.0}\n")
    with pytest.raises(
        RewardFunctionError, match=r"\(verl's convention\) returned a dict without `score` \(keys: acc\)"
    ):
        load_reward_function(str(no_score), {}).score(VERL_ITEMS[:1])
    needs_more = write(tmp_path, "def compute_score(solution_str, ground_truth, tokenizer):\n    return 0.0\n", "b.py")
    with pytest.raises(RewardFunctionError, match=r"cannot be called with verl's arguments by name .*: missing a"):
        load_reward_function(str(needs_more), {})
    # `**kwargs` alone does not make a function verl's: EasyR1's batch convention stays the default
    batch = write(tmp_path, "def compute_score(reward_inputs, **kwargs):\n    return [1.0]\n", "d.py")
    assert load_reward_function(str(batch), {}).reward_type == "batch"
    # a file that says REWARD_TYPE keeps easyrl's own conventions, whatever its parameters are called
    explicit = write(
        tmp_path, "REWARD_TYPE = 'sequential'\ndef compute_score(solution_str):\n    return 1.0\n", "c.py"
    )
    assert load_reward_function(str(explicit), {}).reward_type == "sequential"


COLUMNS_SEEN = """
def seen(completions, prompts, completion_ids, **kwargs):
    columns = {k: v for k, v in kwargs.items() if k not in ("trainer_state", "log_extra", "log_metric")}
    return [repr(sorted(columns.items()))] * len(completions)
"""


def test_a_trl_reward_function_gets_the_rows_columns_by_name(tmp_path):
    """Every column of the row arrives under its name (TRL passes them all); the names of TRL's own arguments and
    `prompt` / `completion` (which TRL does not pass) do not, and reward_function_kwargs win over a column."""
    fn = load_reward_function(f"{write(tmp_path, COLUMNS_SEEN)}:seen", {"weight": 2})
    fn._check = lambda output, item=None: output  # the raw return value: what the function was given
    columns = {"task": "add", "prompt": "p", "completion": "c", "completions": "x", "weight": 9, "tests": [1]}
    columns["log_metric"] = "a column of that name"  # skipped: the name of one of TRL's own arguments
    item = {"response": "r", "response_length": 1, "ground_truth": "7", "row_columns": columns, "prompt": "P"}
    (seen,) = fn.score([item])
    assert seen == {"overall": repr([("ground_truth", ["7"]), ("task", ["add"]), ("tests", [[1]]), ("weight", 2)])}


TRL_EXTRAS = """
import asyncio

async def graded(completions, trainer_state, log_metric, log_extra, **kwargs):
    await asyncio.sleep(0)
    log_metric("progress", trainer_state.global_step / trainer_state.max_steps)
    log_metric("progress", 0.0)
    log_extra("judged", ["a"] * len(completions))
    return [trainer_state.epoch] * len(completions)

def declared_only(completions, answer):
    return [float(c == a) for c, a in zip(completions, answer)]
"""


def test_trl_trainer_state_log_metric_log_extra_and_async_functions(tmp_path, caplog):
    """TRL's further arguments: the training progress, a scalar logged as a named score of the batch (the mean of
    its calls), log_extra accepted with one warning; an `async def` function is awaited."""
    path = write(tmp_path, TRL_EXTRAS)
    fn = load_reward_function(f"{path}:graded", {})
    state = {"global_step": 3, "max_steps": 4, "epoch": 1.5}
    items = [{"response": "r", "response_length": 1, "ground_truth": "7", "trainer_state": state}] * 2
    with caplog.at_level("WARNING"):
        assert fn.score(items) == [{"overall": 1.5, "progress": 0.375}] * 2
        fn.score(items)
    assert sum("easyrl keeps no completions table" in r.getMessage() for r in caplog.records) == 1
    taken = write(
        tmp_path, "def f(completions, log_metric, **kw):\n    log_metric('overall', 1.0)\n    return [0.0]\n", "t.py"
    )
    with pytest.raises(RewardFunctionError, match=r"log_metric\('overall', \.\.\.\): reward/overall is easyrl's own"):
        load_reward_function(f"{taken}:f", {}).score(items[:1])
    # without **kwargs only the declared names arrive (TRL's full call would raise on the others)
    declared = load_reward_function(f"{path}:declared_only", {})
    row = {"answer": "7", "task": "add"}
    items = [{"response": "7", "response_length": 1, "ground_truth": "7", "row_columns": row, "prompt": "p"}]
    assert declared.score(items) == [{"overall": 1.0}]


COMBINED = """
def accuracy(completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]

def brevity(completions, limit):  # no **kwargs: gets the reward_function_kwargs it names only
    return [float(len(c) <= limit) for c in completions]

def verl_style(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.5, "acc": solution_str.strip() == ground_truth}
"""


def test_several_functions_of_one_file_combine_with_their_weights(tmp_path):
    """`file.py:f,g` (TRL's reward_funcs + reward_weights): overall is the weighted sum, each function's own score
    is named after it, a function's other named scores are prefixed with its name, kwargs go where they fit."""
    path = write(tmp_path, COMBINED)
    fn = load_reward_function(f"{path}:accuracy,brevity,verl_style", {"limit": 3}, [1.0, 0.5, 2.0])
    assert fn.whole_batch and fn.uses("trl") and fn.uses("verl") and not fn.uses("batch")
    assert [part.kwargs for part in fn.parts] == [{"limit": 3}, {"limit": 3}, {}]
    assert "overall = 1 x accuracy + 0.5 x brevity + 2 x verl_style" in fn.describe()
    items = [
        {"response": " 7", "response_length": 1, "ground_truth": "7", "row_columns": {"answer": "7"}},
        {"response": "wrong", "response_length": 1, "ground_truth": "7", "row_columns": {"answer": "7"}},
    ]
    assert fn.score(items) == [
        {"overall": 1.0 + 0.5 + 1.0, "accuracy": 1.0, "brevity": 1.0, "verl_style": 0.5, "verl_style/acc": 1.0},
        {"overall": 0.0 + 0.0 + 1.0, "accuracy": 0.0, "brevity": 0.0, "verl_style": 0.5, "verl_style/acc": 0.0},
    ]
    with pytest.raises(RewardFunctionError, match=r"reward_weights` has 1 weight\(s\) for 2 reward function"):
        load_reward_function(f"{path}:accuracy,brevity", {"limit": 3}, [1.0])
    with pytest.raises(RewardFunctionError, match=r"\['unknown'\]: none of the functions.*takes them"):
        load_reward_function(f"{path}:brevity,verl_style", {"limit": 3, "unknown": 1})  # neither takes **kwargs
    with pytest.raises(RewardFunctionError, match=r"defines no function `missing`"):
        load_reward_function(f"{path}:accuracy,missing")
    # one function with weight 1 is the function itself; with another weight, its scores are scaled
    assert isinstance(load_reward_function(f"{path}:accuracy", {}, [1.0]), RewardFunction)
    assert load_reward_function(f"{path}:accuracy", {}, [0.5]).score(items[:1]) == [{"overall": 0.5, "accuracy": 1.0}]


def test_a_combined_function_that_raises_is_named_alone(tmp_path):
    """The failure of one of `file.py:f,g` was reported as a failure of every function, `g` never having run."""
    from easyrl.workers.reward.loader import CombinedPartError

    path = write(tmp_path, COMBINED + "\ndef broken(completions, **kwargs):\n    raise ValueError('even answer 8')\n")
    fn = load_reward_function(f"{path}:accuracy,broken", {})
    items = [{"response": " 7", "response_length": 1, "ground_truth": "7", "row_columns": {"answer": "7"}}]
    with pytest.raises(CombinedPartError) as error:
        fn.score(items)
    assert str(error.value) == (
        "`broken`, one of the combined functions, raised ValueError: even answer 8 (the samples of this call score 0 "
        "for all of them)"
    )
    assert isinstance(error.value.__cause__, ValueError)


# ---- functions written for TRL: fn(prompts=..., completions=..., completion_ids=..., **columns) -> list of numbers
TRL_STYLE = """
def accuracy_reward(completions, solution, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [None if s is None else float(t.strip() == s) for t, s in zip(texts, solution)]
"""


def test_a_trl_reward_function_is_called_once_per_batch_as_trl_calls_it(tmp_path):
    fn = load_reward_function(f"{write(tmp_path, TRL_STYLE)}:accuracy_reward", {})
    assert fn.reward_type == "trl" and fn.whole_batch and "as TRL's GRPOTrainer calls it" in fn.describe()
    items = [
        {"response": " 72", "response_length": 2, "ground_truth": "72", "solution": "72", "conversational": True},
        {"response": "71", "response_length": 1, "ground_truth": "72", "solution": "72", "conversational": False},
        {"response": "x", "response_length": 1, "ground_truth": None, "solution": None},  # None: does not apply
    ]
    assert fn.score(items) == [{"overall": 1.0}, {"overall": 0.0}, {"overall": 0.0}]
    wrong = write(tmp_path, "def reward(completions, **kwargs):\n    return [1.0]\n", "w.py")
    with pytest.raises(
        RewardFunctionError, match=r"TRL's convention.*must return a list of 3 numbers.*list of length 1"
    ):
        load_reward_function(f"{wrong}:reward", {}).score(items)


def test_a_function_taking_completion_ids_or_environments_is_trls(tmp_path):
    """TRL's docs write reward functions that take only `completion_ids` or only `environments` (its 2048 and Wordle
    examples score `env.score` / `env.reward`): they are called as TRL calls them, not as EasyR1's batch functions."""
    source = (
        "def by_ids(completion_ids, **kwargs):\n    return [float(len(ids)) for ids in completion_ids]\n"
        "def by_env(environments, **kwargs):\n    return [env.score for env in environments]\n"
    )
    path = write(tmp_path, source, "trl_style.py")
    items = [
        {"response": "ab", "response_length": 2, "ground_truth": "", "completion_ids": [5, 6], "environments": None}
    ]
    by_ids = load_reward_function(f"{path}:by_ids", {})
    assert by_ids.reward_type == "trl" and by_ids.score(items) == [{"overall": 2.0}]
    by_env = load_reward_function(f"{path}:by_env", {})
    items[0]["environments"] = type("State", (), {"score": 4.5})()
    assert by_env.reward_type == "trl" and by_env.score(items) == [{"overall": 4.5}]
    assert "it takes one of `completions`, `completion_ids`, `environments`" in by_env.describe()


def test_async_user_code_runs_on_one_loop_so_what_it_opens_stays_usable():
    """An `async def` of the user's (reward function, tool, environment method) runs on one event loop per process,
    from any thread: a loop-bound object it made at one call (a future here; an HTTP client session in real code)
    works at the next, as in TRL. A fresh loop per call failed that second call."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from easyrl.workers.reward.loader import resolved

    state = {}

    async def open_it():  # a connection whose reader answers later, on the loop it was opened on
        loop = asyncio.get_running_loop()
        state["pending"] = loop.create_future()
        loop.call_later(0.05, state["pending"].set_result, 7)
        return "opened"

    async def use_it():
        return await asyncio.wait_for(state["pending"], 5)

    assert resolved(open_it()) == "opened" and resolved(use_it()) == 7

    async def loop_id():
        await asyncio.sleep(0.05)  # the calls overlap: they run concurrently on the loop
        return id(asyncio.get_running_loop())

    with ThreadPoolExecutor(4) as pool:
        loops = list(pool.map(lambda _: resolved(loop_id()), range(8)))
    assert len(set(loops)) == 1
    assert resolved(5) == 5  # not awaitable: as it is

    async def fails():
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        resolved(fails())


def test_a_loop_blocked_by_a_sync_call_is_left_and_said(monkeypatch, caplog):
    """A sync call inside an `async def` blocks the shared loop; the next calls get a new one instead of waiting out
    every deadline after it."""
    import threading
    import time

    from easyrl.workers.reward import loader

    monkeypatch.setattr(loader, "HEARTBEAT_S", 0.02)
    monkeypatch.setattr(loader, "BLOCKED_AFTER_S", 0.5)
    monkeypatch.setattr(loader, "_USER_LOOP", None)

    async def blocking():
        time.sleep(3.0)  # the user's mistake: a sync sleep inside async def
        return "late"

    async def quick():
        return "quick"

    assert loader.resolved(quick()) == "quick"
    first = loader.user_loop()
    late = []
    thread = threading.Thread(target=lambda: late.append(loader.resolved(blocking())), daemon=True)
    thread.start()
    time.sleep(1.0)
    assert loader.resolved(quick()) == "quick" and not late  # answered while the blocked loop still sleeps
    assert loader.user_loop() is not first
    assert caplog.text.count("has blocked its event loop") == 1
    thread.join(5)
    assert late == ["late"]  # the blocked call still finished, on its own loop


def test_a_main_that_takes_no_input_is_the_files_self_test_and_compute_score_is_called(tmp_path):
    """verl's reward files often end in `def main(): ...` run under `if __name__ == "__main__"`: without `:function`,
    that `main` was chosen (EasyR1's default name) and the run stopped at its start."""
    from easyrl.workers.reward.loader import resolve_reward_function

    source = (
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str.strip() == ground_truth)\n\n"
        "def main():\n    print(compute_score('x', '3', '3'))\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    path = write(tmp_path, source)
    assert resolve_reward_function(str(path)) == (str(path), "compute_score")  # what check reports
    fn = load_reward_function(str(path), {})
    assert (fn.name, fn.reward_type) == ("compute_score", "verl")
    assert fn.score([{"response": "3", "ground_truth": "3", "data_source": "x"}])[0]["overall"] == 1.0
    # a main that takes the inputs is EasyR1's default and stays the choice
    easyr1 = write(tmp_path, BATCH + "\ndef main(reward_inputs):\n    return compute_score(reward_inputs)\n", "e.py")
    assert load_reward_function(str(easyr1), {}).name == "main"


def test_functions_of_two_files_are_refused_naming_the_one_file_form(tmp_path):
    first, second = write(tmp_path, BATCH, "a.py"), write(tmp_path, BATCH, "b.py")
    with pytest.raises(RewardFunctionError, match=r"functions to combine come from one file \(`file.py:f,g`\)"):
        load_reward_function(f"{first}:compute_score,{second}:compute_score", {})


def test_a_verl_batch_reward_function_is_called_once_per_batch_with_lists(tmp_path):
    """verl's BatchRewardManager convention (solution_strs, ground_truths, ... as lists): check told the user to put
    `solution_strs` in reward_function_kwargs."""

    path = write(
        tmp_path,
        "calls = []\n"
        "def compute_score(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):\n"
        "    calls.append(len(solution_strs))\n"
        "    return [{'score': float(s == g) + bonus, 'acc': s == g} if d == 'gsm8k' else float(s == g)\n"
        "            for d, s, g in zip(data_sources, solution_strs, ground_truths)]\n",
    )
    fn = load_reward_function(str(path), {"bonus": 0.5})
    assert (fn.reward_type, fn.whole_batch, fn.uses("verl")) == ("verl_batch", True, True)
    assert "as verl's BatchRewardManager calls it" in fn.describe()
    items = [
        {"response": "3", "ground_truth": "3", "data_source": "gsm8k", "extra_info": {"index": 0}},
        {"response": "4", "ground_truth": "3", "data_source": "math", "extra_info": {"index": 1}},
    ]
    assert fn.score(items) == [{"overall": 1.5, "acc": 1.0}, {"overall": 0.0}]
    assert fn.fn.__globals__["calls"] == [2]  # one call for the batch
    # what check reads from the source: verl's argument names are no keyword arguments to give (it asked for them)
    from easyrl.workers.reward.loader import check_reward_kwargs

    check_reward_kwargs(str(path), {"bonus": 1.0})
    with pytest.raises(RewardFunctionError, match=r"\['unknown'\]"):
        check_reward_kwargs(str(path), {"unknown": 1.0})
    with pytest.raises(RewardFunctionError, match=r"must return a list of 2 numbers or dicts with `score`"):
        write(tmp_path, "def compute_score(solution_strs, ground_truths):\n    return [1.0]\n", "short.py")
        load_reward_function(str(tmp_path / "short.py"), {}).score(items)


def test_check_refuses_a_kwarg_value_of_another_type_than_the_function_takes(tmp_path):
    """`reward=yes` (a YAML bool) or `require=seccomp` (a str for a list) passed the check and failed every sample
    after the workers started."""
    from easyrl.workers.reward.loader import check_reward_kwargs

    path = write(
        tmp_path,
        "from typing import Optional\n"
        "def compute_score(reward_inputs, mode: str = 'a', layers: list[str] | tuple[str, ...] = (),\n"
        "                  scale: float = 1.0, count: int = 2, cap: Optional[float] = None, flag=False, limit=3,\n"
        "                  shape: 'Shape' = None, extra=None):\n"
        "    return [0.0 for _ in reward_inputs]\n",
    )
    accepted = [
        {"mode": "yes", "layers": ["seccomp"], "scale": 2, "count": 3, "cap": None, "flag": True, "limit": 4},
        {"cap": 0.5, "layers": ("a",), "shape": [1, 2], "extra": {"any": "thing"}, "limit": 0.5},
    ]
    for kwargs in accepted:
        check_reward_kwargs(str(path), kwargs)
    refused = {
        "mode": (True, "`mode: str = 'a'`", "YAML reads yes/no/on/off/true/false unquoted as booleans"),
        "layers": ("seccomp", "`layers: list[str] | tuple[str, ...] = ()`", "Give a list: [seccomp]."),
        "scale": ("1e-3", "`scale: float = 1.0`", "write 1.0e-3"),
        "count": (1.5, "`count: int = 2`", ""),
        "cap": ("high", "`cap: Optional[float] = None`", ""),
        "flag": ("true", "`flag = False`", ""),  # no annotation: the default's type
        "limit": (True, "`limit = 3`", ""),  # a bool is no count
    }
    for key, (value, takes, hint) in refused.items():
        with pytest.raises(RewardFunctionError) as error:
            check_reward_kwargs(str(path), {key: value})
        message = str(error.value)
        assert message.startswith(
            f"`worker.reward.reward_function_kwargs.{key}` is {value!r} (a {type(value).__name__}), but "
            f"`compute_score` in `{path}` takes {takes}."
        ), message
        assert hint in message

"""Loading reward functions from files: the calling conventions, and errors that name the file and the fix."""

import pytest

from easyrl.workers.reward.loader import RewardFunctionError, load_reward_function


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


def test_unexpected_kwargs_are_reported_with_the_config_key(tmp_path):
    path = write(tmp_path, BATCH)
    with pytest.raises(RewardFunctionError, match=r"reward_function_kwargs"):
        load_reward_function(str(path), {"temperature": 1.0})


def test_import_error_in_the_file_is_reported(tmp_path):
    path = write(tmp_path, "import not_a_module_anywhere\n" + BATCH)
    with pytest.raises(RewardFunctionError, match=r"importing .*my_reward.py.*ModuleNotFoundError"):
        load_reward_function(str(path), {})


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


def test_non_numeric_score_is_rejected(tmp_path):
    path = write(tmp_path, "REWARD_TYPE = 'sequential'\ndef compute_score(item):\n    return {'overall': 'high'}\n")
    with pytest.raises(RewardFunctionError, match=r"non-numeric score `overall`: 'high'"):
        load_reward_function(str(path), {}).score([{}])


def test_a_file_named_math_does_not_shadow_the_standard_library(tmp_path):
    path = write(tmp_path, BATCH, name="math.py")
    load_reward_function(str(path), {})
    import math

    assert math.sqrt(4.0) == 2.0

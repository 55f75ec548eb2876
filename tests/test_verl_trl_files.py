"""verl and TRL users' files as they are, through `easyrl train`: verl's preprocessed parquet (chat-message prompts,
the answer in ``reward_model.ground_truth``, ``extra_info``) with a reward function of verl's signature, and TRL's
conversational data with a reward function of TRL's."""

import pytest

from tests.fixtures.trainer_runs import TINY_RUN_OVERRIDES, bare_run, metrics_by_step, run_training


VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # scores what reached it, not the (random) response: 1 when verl's arguments carry the row's own values
    same_row = data_source == "openai/gsm8k" and extra_info["index"] + 1 == int(ground_truth)
    return {"score": float(same_row), "has_response": isinstance(solution_str, str), "pred": solution_str[:5]}
"""


def _verl_files(folder) -> list[str]:
    """verl's gsm8k parquet (12 rows) and a reward file of verl's signature; the keys that name them."""
    import datasets

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + 1? Answer after ####."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(12)
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "train.parquet"))
    (folder / "gsm8k_reward.py").write_text(VERL_REWARD)
    return [
        "data.prompt_key=prompt",
        "data.answer_key=reward_model.ground_truth",
        "data.format_prompt=",
        f"worker.reward.reward_function={folder / 'gsm8k_reward.py'}:compute_score",
    ]


@pytest.mark.timeout(900)
# remax also scores each prompt's greedy answer; slow set only (57 s): the default suite nears the CI budget
@pytest.mark.parametrize("estimator", ["grpo", pytest.param("remax", marks=pytest.mark.slow)])
def test_a_verl_parquet_and_reward_function_train_unchanged(tiny_model_path, tmp_path, estimator):
    args = [
        *TINY_RUN_OVERRIDES,
        *bare_run(2, tmp_path / "run"),
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.n_gpus_per_node=1",
        f"data.train_files={tmp_path / 'train.parquet'}",
        *_verl_files(tmp_path),
        f"algorithm.adv_estimator={estimator}",
    ]
    log_path = tmp_path / "train.log"
    run_training(args, log_path)
    rows = metrics_by_step(tmp_path / "run")
    assert sorted(rows) == [1, 2]
    for row in rows.values():
        assert row["reward/overall"] == 1.0 and row["reward/has_response"] == 1.0 and row["reward/errors"] == 0
        assert "reward/pred" not in row
        if estimator == "remax":  # the greedy answers were scored with their rows' arguments too: baseline 1
            assert row["critic/advantages/max"] == row["critic/advantages/min"] == 0.0
    assert "as verl calls it (it takes `solution_str`)" in log_path.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eval_scores_a_verl_parquet_with_its_verl_reward_function(tiny_model_path, tmp_path):
    import json

    args = [
        *TINY_RUN_OVERRIDES,
        f"worker.actor.model.model_path={tiny_model_path}",
        f"trainer.save_checkpoint_path={tmp_path / 'eval'}",
        "trainer.n_gpus_per_node=1",
        f"data.val_files={tmp_path / 'train.parquet'}",
        "data.val_batch_size=6",
        "eval.k=2",
        *_verl_files(tmp_path),
    ]
    run_training(args, tmp_path / "eval.log", command="eval")
    results = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert list(results["sources"]) == ["openai/gsm8k"]
    assert results["sources"]["openai/gsm8k"]["prompts"] == 12 and results["sources"]["openai/gsm8k"]["mean@2"] == 1.0


TRL_REWARD = """
def same_row_reward(completions, solution, prompts, completion_ids, task, trainer_state, log_metric, **kwargs):
    # scores what reached it, not the (random) response: 1 when TRL's arguments are shaped and paired as TRL's are
    # (a conversational prompt as its messages), every column of the row included (open-r1's code rewards read
    # kwargs["verification_info"])
    log_metric("steps_done", trainer_state.global_step)
    log_metric("max_steps", trainer_state.max_steps)
    return [
        float(
            isinstance(c, list) and c[0]["role"] == "assistant" and isinstance(c[0]["content"], str)
            and s == g and p == [{"role": "user", "content": f"What is {int(s) - 1} + 1?"}] and isinstance(ids, list)
            and t == f"sum-{s}" and info["answer"] == int(s)
        )
        for c, s, g, p, ids, t, info in zip(
            completions, solution, kwargs["ground_truth"], prompts, completion_ids, task, kwargs["verification_info"]
        )
    ]


def half(completions, **kwargs):  # a second function of the file, combined with the first (TRL's reward_funcs)
    return [0.5] * len(completions)
"""


def _trl_files(folder, reward: str = TRL_REWARD) -> list[str]:
    """TRL's conversational parquet (12 rows, with the columns a TRL reward function reads) and a reward file of
    TRL's signature; the keys that name them."""
    import datasets

    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "solution": str(i + 1),
            "task": f"sum-{i + 1}",
            "verification_info": {"answer": i + 1, "language": "python"},
        }
        for i in range(12)
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "train.parquet"))
    (folder / "trl_reward.py").write_text(reward)
    return [
        f"data.train_files={folder / 'train.parquet'}",
        "data.prompt_key=prompt",
        "data.answer_key=solution",
        "data.format_prompt=",
        f"worker.reward.reward_function={folder / 'trl_reward.py'}:same_row_reward",
    ]


def test_a_trl_reward_function_gets_every_column_and_one_the_data_lacks_stops_before_ray(tiny_model_path, tmp_path):
    from easyrl.config import load_run_plan
    from easyrl.trainer.main import prepare_run_data
    from easyrl.workers.reward.loader import RewardFunctionError

    args = [
        *TINY_RUN_OVERRIDES,
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.n_gpus_per_node=1",
        "data.val_files=",
        *_trl_files(tmp_path),
    ]
    batch = next(iter(prepare_run_data(load_run_plan(args)).train_loader))
    row = batch.non_tensor_batch["row_columns"][0]
    assert sorted(row) == ["prompt", "solution", "task", "verification_info"]
    assert row["task"] == f"sum-{row['solution']}" and row["verification_info"]["answer"] == int(row["solution"])
    # a reward function of EasyR1's kind gets none of it: the batch carries only what the scorer reads
    easyr1 = [*args, f"worker.reward.reward_function={tmp_path / 'easyr1.py'}:compute_score"]
    (tmp_path / "easyr1.py").write_text("def compute_score(reward_inputs):\n    return [{'overall': 0.0}]\n")
    assert "row_columns" not in next(iter(prepare_run_data(load_run_plan(easyr1)).train_loader)).non_tensor_batch

    (tmp_path / "trl_reward.py").write_text(
        "def same_row_reward(completions, tests, solution, **kwargs):\n    return []\n"
    )
    with pytest.raises(RewardFunctionError, match=r"takes `tests`, but `data\.train_files` has no such column.*task"):
        prepare_run_data(load_run_plan(args))
    # a default, or the value given in reward_function_kwargs, fills it
    prepare_run_data(load_run_plan([*args, "worker.reward.reward_function_kwargs={tests: []}"]))


@pytest.mark.timeout(900)
def test_trl_conversational_data_and_a_trl_reward_function_train_unchanged(tiny_model_path, tmp_path):
    args = [
        *TINY_RUN_OVERRIDES,
        *bare_run(1, tmp_path / "run"),
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.n_gpus_per_node=1",
        *_trl_files(tmp_path),
        f"worker.reward.reward_function={tmp_path / 'trl_reward.py'}:same_row_reward,half",
        "worker.reward.reward_weights=[1.0,2.0]",
    ]
    log_path = tmp_path / "train.log"
    run_training(args, log_path)
    row = metrics_by_step(tmp_path / "run")[1]
    assert row["reward/overall"] == 1.0 + 2.0 * 0.5 and row["reward/errors"] == 0
    assert row["reward/same_row_reward"] == 1.0 and row["reward/half"] == 0.5
    # trainer_state, logged with log_metric (under the function's name: two functions may log the same name)
    assert row["reward/same_row_reward/steps_done"] == 0 and row["reward/same_row_reward/max_steps"] == 1
    assert "as TRL's GRPOTrainer calls it" in log_path.read_text(errors="replace")


def test_trl_prompt_only_data_trains_with_trl_reward_functions_and_empty_answers(tiny_model_path, tmp_path, caplog):
    """TRL's prompt-only data (no answer: TRL's reward functions have no ground truth) was refused for the missing
    data.answer_key column; it is accepted where every reward function is written for TRL, each answer empty."""
    import json

    from easyrl.config import load_run_plan
    from easyrl.trainer.main import prepare_run_data

    data = tmp_path / "tldr.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"Summarise: {i} cats."}], "completion": "x"} for i in range(8)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "rewards.py").write_text(
        "def reward_len(completions, **kwargs):\n    return [-abs(20 - len(c[0]['content'])) for c in completions]\n"
        "def compute_score(reward_inputs):\n    return [{'overall': float(x['ground_truth'] == '')} for x in reward_inputs]\n"
    )
    args = [
        *TINY_RUN_OVERRIDES,
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.n_gpus_per_node=1",
        "data.val_files=",
        f"data.train_files={data}",
        "data.prompt_key=prompt",
        "data.format_prompt=",
        f"worker.reward.reward_function={tmp_path / 'rewards.py'}:reward_len",
    ]
    with caplog.at_level("WARNING"):
        batch = next(iter(prepare_run_data(load_run_plan(args)).train_loader))
    assert list(batch.non_tensor_batch["ground_truth"]) == [""] * 4
    assert sorted(batch.non_tensor_batch["row_columns"][0]) == ["completion", "prompt"]  # no made-up answer column
    assert "has no column 'answer' (data.answer_key): the reward functions are written for TRL" in caplog.text
    # a function of EasyR1's kind reads answers: the column stays required, with or beside a TRL one
    for spec in ("compute_score", "reward_len,compute_score"):
        with pytest.raises(KeyError, match=r"no column 'answer' \(data\.answer_key\)"):
            prepare_run_data(load_run_plan([*args, f"worker.reward.reward_function={tmp_path / 'rewards.py'}:{spec}"]))

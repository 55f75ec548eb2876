"""A verl user's files as they are: a preprocessed parquet (chat-message prompts, the answer in
``reward_model.ground_truth``, ``extra_info``) and a reward function with verl's signature, through `easyrl train`."""

import pytest

from tests.fixtures.trainer_runs import TINY_RUN_OVERRIDES, bare_run, metrics_by_step, run_training


VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # scores what reached it, not the (random) response: 1 when verl's arguments carry the row's own values
    same_row = data_source == "openai/gsm8k" and extra_info["index"] + 1 == int(ground_truth)
    return {"score": float(same_row), "has_response": isinstance(solution_str, str), "pred": solution_str[:5]}
"""


@pytest.mark.timeout(900)
def test_a_verl_parquet_and_reward_function_train_unchanged(tiny_model_path, tmp_path):
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
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    (tmp_path / "gsm8k_reward.py").write_text(VERL_REWARD)
    args = [
        *TINY_RUN_OVERRIDES,
        *bare_run(2, tmp_path / "run"),
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.n_gpus_per_node=1",
        f"data.train_files={tmp_path / 'train.parquet'}",
        "data.prompt_key=prompt",
        "data.answer_key=reward_model.ground_truth",
        "data.format_prompt=",
        f"worker.reward.reward_function={tmp_path / 'gsm8k_reward.py'}:compute_score",
    ]
    log_path = tmp_path / "train.log"
    run_training(args, log_path)
    rows = metrics_by_step(tmp_path / "run")
    assert sorted(rows) == [1, 2]
    for row in rows.values():
        assert row["reward/overall"] == 1.0 and row["reward/has_response"] == 1.0 and row["reward/errors"] == 0
        assert "reward/pred" not in row
    assert "as verl calls it (it takes `solution_str`)" in log_path.read_text(errors="replace")

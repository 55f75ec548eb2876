"""Scoring a rollout batch: decoding, the score on the last response token, and per-sample named metrics."""

from pathlib import Path

import numpy as np
import pytest
import torch

from easyrl.config import RewardConfig
from easyrl.protocol import DataProto
from easyrl.workers.reward.scorer import RewardScorer, reduce_reward_metrics, scores_to_non_tensor


ROOT = Path(__file__).resolve().parent.parent


def rollout_batch(tokenizer, responses, truths, width=24):
    """Right-padded response ids ending with the eos token, as the rollout returns them."""
    rows = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in responses]
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return DataProto.from_dict(
        tensors={"responses": ids, "response_mask": mask},
        non_tensors={"ground_truth": np.array(truths, dtype=object)},
    )


def with_text_prompts(tokenizer, batch, texts):
    """``batch`` with the left-padded chat-template prompts of ``texts`` and their rows' `question` column, as the
    rollout hands a batch of text prompts to the scorer."""
    rendered = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False) for t in texts]
    prompt_ids = [tokenizer.encode(r, add_special_tokens=False) for r in rendered]
    width = max(map(len, prompt_ids))
    prompts = torch.full((len(texts), width), tokenizer.pad_token_id, dtype=torch.long)
    for i, ids in enumerate(prompt_ids):
        prompts[i, width - len(ids) :] = torch.tensor(ids)
    batch.batch["prompts"] = prompts
    batch.batch["attention_mask"] = torch.cat(
        [(prompts != tokenizer.pad_token_id).long(), batch.batch["response_mask"]], 1
    )
    batch.non_tensor_batch["conversational"] = np.array([False] * len(texts), dtype=object)
    batch.non_tensor_batch["row_columns"] = np.array([{"question": t} for t in texts], dtype=object)
    return batch


@pytest.fixture
def arithmetic_scorer(tokenizer):
    config = RewardConfig(reward_function=str(ROOT / "reward_function" / "arithmetic.py"))
    return RewardScorer(config, tokenizer, in_process=True)  # decoding and placement: no actors needed


def test_overall_score_sits_on_the_last_response_token(tokenizer, arithmetic_scorer):
    data = rollout_batch(tokenizer, [r"So \boxed{12}", r"\boxed{7}", "no idea"], ["12", "8", "3"])
    scores, metrics = arithmetic_scorer.score(data)
    lengths = data.batch["response_mask"].sum(-1)
    # overall = 0.1 * format + 0.9 * accuracy: right 1.0, wrong but boxed 0.1, unboxed 0
    assert scores.sum(-1).tolist() == pytest.approx([1.0, 0.1, 0.0])
    for row, length in enumerate(lengths.tolist()):
        assert scores[row, length - 1] == scores[row].sum()
    assert metrics["reward/accuracy"] == [1.0, 0.0, 0.0]
    assert metrics["reward/format"] == [1.0, 1.0, 0.0]
    assert metrics["reward/errors"] == metrics["reward/timeouts"] == [0.0, 0.0, 0.0]


def test_special_tokens_are_stripped_before_scoring(tokenizer, arithmetic_scorer):
    inputs = arithmetic_scorer.build_inputs(rollout_batch(tokenizer, [r"\boxed{5}"], ["5"]))
    assert inputs[0]["response"] == r"\boxed{5}"
    assert inputs[0]["response_length"] == len(tokenizer.encode(r"\boxed{5}", add_special_tokens=False)) + 1


def test_named_scores_become_metrics_and_non_tensor_columns(tokenizer, arithmetic_scorer):
    _, metrics = arithmetic_scorer.score(rollout_batch(tokenizer, [r"\boxed{1}", r"\boxed{2}"], ["1", "1"]))
    assert reduce_reward_metrics(metrics) == {
        "reward/overall": pytest.approx(0.55),
        "reward/format": 1.0,
        "reward/accuracy": 0.5,
        "reward/errors": 0.0,
        "reward/timeouts": 0.0,
    }
    columns = scores_to_non_tensor(metrics)
    assert sorted(columns) == ["accuracy", "format", "overall"]
    assert columns["accuracy"].tolist() == [1.0, 0.0]


def test_missing_ground_truth_names_the_dataset_key(tokenizer, arithmetic_scorer):
    data = rollout_batch(tokenizer, ["x"], ["1"])
    data.non_tensor_batch.pop("ground_truth")
    with pytest.raises(KeyError, match="data.answer_key"):
        arithmetic_scorer.score(data)


def test_reward_inputs_hold_exactly_easyr1s_keys(tokenizer, arithmetic_scorer):
    inputs = arithmetic_scorer.build_inputs(rollout_batch(tokenizer, ["7", "eight"], ["7", 8]))
    assert [sorted(item) for item in inputs] == [["ground_truth", "response", "response_length"]] * 2
    assert inputs[1]["ground_truth"] == 8  # the dataset's answer as stored, not turned into text
    assert all(type(item["response_length"]) is int for item in inputs)


def test_shipped_dapo_scores_carry_easyr1s_filter_key(tokenizer):
    # EasyR1's DAPO recipe filters groups on algorithm.filter_key=accuracy_normalized
    kwargs = {"max_response_length": 100, "overlong_buffer_length": 20, "overlong_penalty_factor": 1.0}
    config = RewardConfig(
        reward_function=f"{ROOT / 'reward_function' / 'dapo.py'}:compute_score",
        reward_function_kwargs=kwargs,
    )
    scores, metrics = RewardScorer(config, tokenizer, in_process=True).score(
        rollout_batch(tokenizer, ["Answer: 42", "Answer: 41"], ["42", "42"])
    )
    columns = scores_to_non_tensor(metrics)
    assert sorted(columns) == ["accuracy", "accuracy_normalized", "overall", "overlong"]
    assert columns["accuracy_normalized"].tolist() == [1.0, 0.0]
    assert scores.sum(-1).tolist() == [1.0, -1.0]


def test_a_failure_warning_names_the_samples_row_in_the_data(tokenizer, tmp_path, caplog):
    import logging

    from easyrl.data.dataset import ROW_PLACE_KEY

    reward = tmp_path / "fails.py"
    reward.write_text(
        "REWARD_TYPE = 'sequential'\n"
        "def compute_score(reward_input):\n"
        "    if reward_input['ground_truth'] == 'bad':\n"
        "        raise KeyError('no such answer')\n"
        "    return {'overall': 1.0}\n"
    )
    scorer = RewardScorer(RewardConfig(reward_function=str(reward)), tokenizer, in_process=True)
    data = rollout_batch(tokenizer, ["1", "2", "3"], ["ok", "bad", "ok"])
    places = [f"data.train_files math.jsonl row {row}" for row in (4, 9, 2)]
    data.non_tensor_batch[ROW_PLACE_KEY] = np.array(places, dtype=object)
    with caplog.at_level(logging.WARNING, logger="easyrl.workers.reward.scorer"):
        scores, metrics = scorer.score(data)
    assert scores.sum(-1).tolist() == [1.0, 0.0, 1.0] and metrics["reward/errors"] == [0.0, 1.0, 0.0]
    (message,) = [r.getMessage() for r in caplog.records if "raised on sample" in r.getMessage()]
    assert "raised on sample 1 (data.train_files math.jsonl row 9, ground truth 'bad');" in message
    assert "KeyError" in message


def test_a_trl_function_gets_a_text_prompt_as_the_row_holds_it(tokenizer, tmp_path):
    """TRL hands `prompts` as the dataset's column: a text prompt reached the function as the decoded chat template
    (SmolLM2's system prompt, role names and data.format_prompt around it), so a prompt-keyed lookup failed."""
    (tmp_path / "trl.py").write_text(
        "def echo(prompts, completions, **kwargs):\n"
        "    return [1.0 if p == 'What is 2 + 3?' else 0.0 for p in prompts]\n"
    )
    texts = ["What is 2 + 3?", "What is 4 + 4?"]
    batch = with_text_prompts(tokenizer, rollout_batch(tokenizer, ["5", "8"], ["5", "8"]), texts)
    config = RewardConfig(reward_function=f"{tmp_path / 'trl.py'}:echo")
    scores, _ = RewardScorer(config, tokenizer, in_process=True, prompt_key="question").score(batch)
    assert scores.sum(-1).tolist() == [1.0, 0.0]


def test_a_trl_function_gets_messages_held_as_json_text_or_one_message_as_a_list_of_messages(tokenizer, tmp_path):
    """The dataset reads such prompts as chat messages (template.read_prompt), so TRL's `prompts` are those messages,
    as for a prompt column that holds the list itself."""
    import json

    (tmp_path / "trl.py").write_text("def echo(prompts, completions, **kwargs):\n    return [0.0 for _ in prompts]\n")
    message = {"role": "user", "content": "What is 2 + 3?"}
    batch = with_text_prompts(tokenizer, rollout_batch(tokenizer, ["5", "5"], ["5", "5"]), ["What is 2 + 3?"] * 2)
    batch.non_tensor_batch["conversational"] = np.array([True, True], dtype=object)
    batch.non_tensor_batch["row_columns"] = np.array([{"question": json.dumps([message])}, {"question": message}])
    config = RewardConfig(reward_function=f"{tmp_path / 'trl.py'}:echo")
    inputs = RewardScorer(config, tokenizer, in_process=True, prompt_key="question").build_inputs(batch)
    assert [item["prompt"] for item in inputs] == [[message], [message]]


def test_a_sample_no_function_scores_is_counted_named_and_stops_a_run_that_scores_nothing(tokenizer, tmp_path, caplog):
    """One TRL function returning None for a sample (it does not apply) gave it 0 with no count and no word: a
    function that returned None for every sample trained a whole run on zeros. TRL warns; easyrl counts it in
    reward/errors, names its row once, and stops a run that no function ever scores."""
    import logging

    from easyrl.data.dataset import ROW_PLACE_KEY
    from easyrl.workers.reward.loader import RewardFunctionError

    reward = tmp_path / "partial.py"
    reward.write_text(
        "def math_reward(completions, ground_truth, **kwargs):\n"
        "    return [None if truth == 'code' else float(text == truth) for text, truth in zip(completions, ground_truth)]\n"
        "def never(completions, **kwargs):\n"
        "    return [None for _ in completions]\n"
        "def half(completions, **kwargs):\n"
        "    return [0.5 for _ in completions]\n"
    )
    batch = rollout_batch(tokenizer, ["4", "5", "x"], ["4", "4", "code"])
    batch = with_text_prompts(tokenizer, batch, ["2 + 2?", "2 + 2?", "Write code."])
    batch.non_tensor_batch[ROW_PLACE_KEY] = np.array(
        [f"data.train_files t.jsonl row {r}" for r in (0, 1, 2)], dtype=object
    )
    scorer = RewardScorer(
        RewardConfig(reward_function=f"{reward}:math_reward"), tokenizer, in_process=True, prompt_key="q"
    )
    with caplog.at_level(logging.WARNING, logger="easyrl.workers.reward.scorer"):
        scores, metrics = scorer.score(batch)
    assert scores.sum(-1).tolist() == [1.0, 0.0, 0.0] and metrics["reward/errors"] == [0.0, 0.0, 1.0]
    (message,) = [r.getMessage() for r in caplog.records if "returned None for sample" in r.getMessage()]
    assert "returned None for sample 2 (data.train_files t.jsonl row 2, ground truth 'code')" in message
    # combined with a function that scores it, the sample has a reward: nothing to count
    both = RewardScorer(
        RewardConfig(reward_function=f"{reward}:math_reward,half"), tokenizer, in_process=True, prompt_key="q"
    )
    assert both.score(batch)[1]["reward/errors"] == [0.0, 0.0, 0.0]
    # a function that scores no sample at all stops the run, as one that raises on every sample does
    never = RewardScorer(RewardConfig(reward_function=f"{reward}:never"), tokenizer, in_process=True, prompt_key="q")
    with pytest.raises(RewardFunctionError, match=r"scored no sample \(3 no score\) of the run so far"):
        never.score(batch)


@pytest.mark.parametrize("convention", ["sequential", "batch", "trl"])
def test_a_score_that_is_not_a_number_stops_the_run_naming_the_samples_data_row(tokenizer, tmp_path, convention):
    """The stop named the ground truth only; where many rows share an answer that finds no row."""
    from easyrl.data.dataset import ROW_PLACE_KEY
    from easyrl.workers.reward.loader import RewardFunctionError

    text = "'0.5' if truth == '3' else 1.0"
    source = {
        "sequential": "REWARD_TYPE = 'sequential'\ndef compute_score(item):\n    truth = item['ground_truth']\n"
        f"    return {{'overall': {text}}}\n",
        "batch": "def compute_score(items):\n"
        f"    return [{{'overall': {text}}} for truth in (item['ground_truth'] for item in items)]\n",
        "trl": f"def compute_score(completions, ground_truth, **kwargs):\n    return [{text} for truth in ground_truth]\n",
    }[convention]
    (tmp_path / "reward.py").write_text(source)
    batch = rollout_batch(tokenizer, ["1", "2", "3", "4"], ["1", "2", "3", "3"])
    places = [f"data.train_files t.jsonl row {row}" for row in (5, 6, 7, 8)]
    batch.non_tensor_batch[ROW_PLACE_KEY] = np.array(places, dtype=object)
    scorer = RewardScorer(
        RewardConfig(reward_function=str(tmp_path / "reward.py")), tokenizer, in_process=True, prompt_key="q"
    )
    with pytest.raises(RewardFunctionError) as stop:
        scorer.score(with_text_prompts(tokenizer, batch, ["a?", "b?", "c?", "d?"]))
    assert "non-numeric score `overall`: '0.5' (for the input with ground truth '3')" in str(stop.value)
    assert str(stop.value).endswith(" The sample is data.train_files t.jsonl row 7.")


def test_a_score_is_averaged_over_the_samples_that_have_it_and_a_failed_sample_counts_zero(tokenizer, tmp_path):
    # TRL: a function returning None does not apply to that sample (its reward/<function> is a nanmean); EasyR1: a
    # score a sample's dict lacks is left out of that score's mean. A sample whose scoring failed counts 0 in all.
    reward = tmp_path / "multi_task.py"
    reward.write_text(
        "def math_reward(completions, ground_truth, **kwargs):\n"
        "    return [None if truth == 'code' else float(text == truth) for text, truth in zip(completions, ground_truth)]\n"
        "def length_reward(completions, **kwargs):\n"
        "    return [0.5 for _ in completions]\n"
    )
    config = RewardConfig(reward_function=f"{reward}:math_reward,length_reward", reward_weights=[1.0, 2.0])
    batch = rollout_batch(tokenizer, ["4", "5", "x"], ["4", "4", "code"])
    scores, metrics = RewardScorer(config, tokenizer, in_process=True, prompt_key="question").score(
        with_text_prompts(tokenizer, batch, ["2 + 2?", "2 + 2?", "Write code."])
    )
    assert scores.sum(-1).tolist() == [2.0, 1.0, 1.0]  # the None adds 0 to the weighted sum, as TRL's nansum
    reduced = reduce_reward_metrics(metrics)
    assert reduced["reward/math_reward"] == 0.5  # over the two samples it scored, not 1/3
    assert reduced["reward/length_reward"] == 0.5
    assert reduced["reward/overall"] == pytest.approx(4.0 / 3)
    assert scores_to_non_tensor(metrics)["math_reward"].tolist() == [1.0, 0.0, 0.0]  # per sample: what it added

    sequential = tmp_path / "some_keys.py"
    sequential.write_text(
        "REWARD_TYPE = 'sequential'\n"
        "def compute_score(reward_input):\n"
        "    if reward_input['ground_truth'] == 'bad':\n"
        "        raise ValueError('cannot score')\n"
        "    if reward_input['ground_truth'] == 'text':\n"
        "        return {'overall': 0.25}\n"
        "    return {'overall': 1.0, 'accuracy': 1.0}\n"
    )
    _, metrics = RewardScorer(RewardConfig(reward_function=str(sequential)), tokenizer, in_process=True).score(
        rollout_batch(tokenizer, ["1", "2", "3", "4"], ["7", "text", "bad", "7"])
    )
    reduced = reduce_reward_metrics(metrics)
    assert reduced["reward/accuracy"] == pytest.approx(2.0 / 3)  # the failed sample counts 0, `text` is left out
    assert reduced["reward/overall"] == pytest.approx(2.25 / 4)
    assert reduced["reward/errors"] == 1.0

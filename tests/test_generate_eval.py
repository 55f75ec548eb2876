"""`easyrl generate` and `easyrl eval`: the pass@k estimator against hand-worked numbers, the resumable jsonl file,
and real runs of both commands on the tiny model (Ray, one worker, vLLM rollout, the word-share reward)."""

import json
import logging
import math
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from easyrl.config import load_run_plan
from easyrl.config.schema import DataConfig
from easyrl.data.dataset import RLHFDataset
from easyrl.trainer.evaluate import (
    format_table,
    k_values,
    pass_at_k,
    rows_per_source,
    summarize,
    unreachable_correctness,
)
from easyrl.trainer.generate import GenerationFileError, append_rows, read_rows, sample_scores
from tests.fixtures.trainer_runs import (
    REPO_ROOT,
    RUN_TIMEOUT_S,
    TINY_RUN_OVERRIDES,
    kill_process_group,
    launch_training,
    metrics_by_step,
    run_training,
    wait_until,
)


SLEEPY_REWARD = REPO_ROOT / "tests" / "data" / "sleepy_word_start_reward.py"


# ----------------------------------------------------------------------------------------------------------------------
# pass@k (Chen et al., arXiv 2107.03374)
# ----------------------------------------------------------------------------------------------------------------------
def test_pass_at_k_matches_the_hand_worked_example():
    # n=5 samples, c=2 correct: pass@k = 1 - C(3, k) / C(5, k)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # 1 - 3/5
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - 3/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - 1/10
    assert pass_at_k(5, 2, 4) == 1.0  # C(3, 4) = 0: every draw of 4 holds a correct one
    assert pass_at_k(5, 2, 5) == 1.0


def test_pass_at_k_equals_the_binomial_formula_for_every_n_c_k_up_to_16():
    for n in range(1, 17):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


def test_pass_at_k_edge_cases_none_correct_all_correct_and_too_few_samples():
    assert [pass_at_k(8, 0, k) for k in (1, 2, 8)] == [0.0, 0.0, 0.0]
    assert [pass_at_k(8, 8, k) for k in (1, 2, 8)] == [1.0, 1.0, 1.0]
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)  # a product, not C(1000, k): no overflow
    with pytest.raises(ValueError, match=r"pass@8 needs between 1 and n=4 samples"):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)


def test_reported_k_are_the_powers_of_two_up_to_n_and_n():
    assert k_values(1) == [1]
    assert k_values(8) == [1, 2, 4, 8]
    assert k_values(6) == [1, 2, 4, 6]


def _row(index, source, accuracies, overall=None):
    overall = overall or accuracies
    scores = [{"overall": o, "accuracy": a} for o, a in zip(overall, accuracies)]
    return {
        "index": index,
        "data_source": source,
        "prompt": f"p{index}",
        "responses": ["r"] * len(scores),
        "scores": scores,
    }


def test_summary_per_source_mean_and_pass_at_k_by_hand():
    rows = [
        _row(0, "math", [1, 1, 0, 0], overall=[1.0, 1.0, 0.1, 0.0]),  # c=2 of n=4
        _row(1, "math", [0, 0, 0, 0]),  # c=0
        _row(2, "code", [1, 0, 0, 0]),  # c=1
    ]
    results = summarize(rows)
    assert results["n"] == 4 and results["correct"] == "accuracy >= 1"
    math_ = results["sources"]["math"]
    assert math_["prompts"] == 2
    assert math_["mean@4"] == pytest.approx(2.1 / 8)
    assert math_["accuracy@4"] == pytest.approx(2 / 8)
    # prompt 0: pass@1 = 1/2, pass@2 = 1 - C(2,2)/C(4,2) = 5/6, pass@4 = 1; prompt 1: 0
    assert math_["pass@1"] == pytest.approx(0.25)
    assert math_["pass@2"] == pytest.approx(5 / 12)
    assert math_["pass@4"] == pytest.approx(0.5)
    code = results["sources"]["code"]
    assert (code["pass@1"], code["pass@2"], code["pass@4"]) == pytest.approx((0.25, 0.5, 1.0))
    table = format_table(results)
    assert table.splitlines()[0].split() == ["source", "prompts", "mean@4", "accuracy@4", "pass@1", "pass@2", "pass@4"]
    assert table.splitlines()[1].split() == ["code", "1", "0.2500", "0.2500", "0.2500", "0.5000", "1.0000"]
    assert "max_prompt_length" not in table
    # every score the reward names, per source, as the validation logs them (a format score says why mean@n is low)
    assert results["scores"] == {
        "code": {"accuracy": pytest.approx(0.25), "overall": pytest.approx(0.25)},
        "math": {"accuracy": pytest.approx(2 / 8), "overall": pytest.approx(2.1 / 8)},
    }
    assert (
        table.splitlines()[-1]
        == "(the mean of each score the reward names, per source, is in the JSON's `scores`: accuracy)"
    )
    # prompts cut at data.max_prompt_length were scored as the others: the table says how many
    results["data"] = {"rows": 3, "skipped": 0, "truncated": 2, "max_prompt_length": 64}
    assert (
        format_table(results)
        .splitlines()[-1]
        .startswith(
            "(2 prompts were longer than data.max_prompt_length=64 tokens and were cut to their first 64, losing their "
            "end and the generation prompt, yet scored as the others"
        )
    )


def test_a_vision_language_models_file_is_refused_for_other_picture_or_video_settings(tiny_vl_model_path, tmp_path):
    """The compared prompt holds one placeholder per picture or video: other frames (data.video_fps, max_frames) or
    pixels were continued, or a finished file reported under the new settings."""
    from easyrl.trainer.generate import _check_resumed_row, generation_settings
    from easyrl.workers.rollout.base import GenerationRequest

    val_file = tmp_path / "val.jsonl"
    val_file.write_text('{"problem": "1+1", "answer": "2"}\n')
    reward = f"worker.reward.reward_function={REPO_ROOT / 'reward_function' / 'arithmetic.py'}:compute_score"
    args = _args(tiny_vl_model_path, val_file, tmp_path, reward)
    settings = generation_settings(load_run_plan(args), GenerationRequest())
    assert settings["media"] == {"min_pixels": 262144, "max_pixels": 4194304, "video_fps": 2.0, "max_frames": None}
    row = {"index": 0, "prompt": "p", "responses": ["r"], "settings": settings}
    fewer_frames = generation_settings(load_run_plan([*args, "data.video_fps=1.0"]), GenerationRequest())
    with pytest.raises(GenerationFileError, match=r"other settings \(data.video_fps: 2.0 in the file, 1.0 now\)"):
        _check_resumed_row("f.jsonl", row, "p", 1, fewer_frames)
    _check_resumed_row("f.jsonl", row, "p", 1, settings)  # the same settings go on
    # rows of an earlier version, without them, are not refused; a text model's file has none
    _check_resumed_row(
        "f.jsonl", {**row, "settings": {k: v for k, v in settings.items() if k != "media"}}, "p", 1, settings
    )


def test_samples_the_reward_failed_on_count_as_wrong_and_are_counted_per_source():
    failed = {"overall": 0.0, "accuracy": 0.0, "scoring_failed": True}
    rows = [
        {"index": 0, "data_source": "a", "scores": [{"overall": 1.0, "accuracy": 1.0}, failed]},
        {
            "index": 1,
            "data_source": "b",
            "scores": [{"overall": 1.0, "accuracy": 1.0}, {"overall": 0.0, "accuracy": 0.0}],
        },
    ]
    results = summarize(rows)
    assert results["sources"]["a"]["scoring_failed"] == 1 and results["sources"]["b"]["scoring_failed"] == 0
    assert results["sources"]["a"]["pass@1"] == results["sources"]["b"]["pass@1"] == 0.5
    assert format_table(results).splitlines()[0].split()[-1] == "scoring_failed"
    # under the table: how many, and that a re-run scores them again
    said = format_table({**results, "generations": "/runs/eval.jsonl"}).splitlines()
    assert said[5].startswith("(1 samples could not be fully scored, column `scoring_failed`") and said[5].endswith(
        "Running the command again generates and scores their prompts again, e.g. once the judge is back)"
    )
    assert "scoring_failed" not in summarize(rows[1:])["sources"]["b"]  # no column when every sample was scored
    assert "could not be scored" not in format_table(summarize(rows[1:]))
    assert results["scores"]["a"] == {"accuracy": 0.5, "overall": 0.5}  # the failed sample's zeros count, its flag not


def test_each_source_reports_the_rows_of_its_data_and_how_many_were_skipped():
    rows = [_row(i, "math", [1, 0]) for i in range(8)] + [_row(8, "gsm8k", [1, 1])]
    counts = {
        "aime": {"rows": 5, "skipped": 5},
        "gsm8k": {"rows": 1, "skipped": 0},
        "math": {"rows": 16, "skipped": 8},
    }
    results = summarize(rows, row_counts=counts)
    math_ = results["sources"]["math"]
    assert (math_["prompts"], math_["rows"], math_["skipped"], math_["pass@1"]) == (8, 16, 8, 0.5)
    assert results["sources"]["gsm8k"]["skipped"] == 0
    # a benchmark whose every row was skipped is reported, with no score, rather than left out
    assert results["sources"]["aime"] == {"prompts": 0, "rows": 5, "skipped": 5}
    assert results["data"] == {"rows": 22, "skipped": 13}
    lines = format_table(results).splitlines()
    assert lines[0].split() == ["source", "prompts", "rows", "skipped", "mean@2", "accuracy@2", "pass@1", "pass@2"]
    assert lines[1].split() == ["aime", "0", "5", "5", "-", "-", "-", "-"]
    assert lines[3].split() == ["math", "8", "16", "8", "0.5000", "0.5000", "0.5000", "1.0000"]
    assert lines[-1] == (
        "(13 of 22 rows of data.val_files were skipped when read: no score counts them; the log names each and why)"
    )
    assert "rows" not in summarize(rows)["sources"]["math"] and "data" not in summarize(rows)  # without counts


def test_rows_per_source_counts_the_rows_the_dataset_skipped_under_their_source(tmp_path, tokenizer):
    rows = [
        {"problem": "1+1?", "answer": "2", "data_source": "math"},
        {"problem": "2+2?", "answer": None, "data_source": "math"},  # no answer: skipped
        {"problem": "long " * 80, "answer": "3", "data_source": "math"},  # overlong, dropped
        {"problem": None, "answer": "4", "data_source": "aime"},  # no prompt: skipped
        {"problem": "3+3?", "answer": "6", "data_source": None},  # no source: the file's name stands for it
    ]
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = DataConfig(prompt_key="problem", max_prompt_length=64, filter_overlong_prompts=True)
    dataset = RLHFDataset(str(path), tokenizer, None, config, config_key="data.val_files")
    assert len(dataset) == 2
    assert rows_per_source(dataset) == {
        "aime": {"rows": 1, "skipped": 1},
        "bench": {"rows": 1, "skipped": 0},
        "math": {"rows": 3, "skipped": 2},
    }
    # data without a source column: one source, named after the file
    path.write_text("".join(json.dumps({k: v for k, v in row.items() if k != "data_source"}) + "\n" for row in rows))
    dataset = RLHFDataset(str(path), tokenizer, None, config, config_key="data.val_files")
    assert rows_per_source(dataset) == {"bench": {"rows": 5, "skipped": 3}}


def test_summary_without_accuracy_uses_overall_and_the_threshold():
    rows = [{"index": 0, "data_source": "s", "responses": ["a", "b"], "scores": [{"overall": 0.5}, {"overall": 0.2}]}]
    assert summarize(rows)["sources"]["s"]["pass@2"] == 0.0  # overall >= 1 by default
    results = summarize(rows, threshold=0.5)
    assert results["correct"] == "overall >= 0.5"
    assert results["sources"]["s"]["pass@1"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="eval.correct_key: the reward gives no `accuracy` score"):
        summarize(rows, correct_key="accuracy")


def test_with_a_judge_and_no_accuracy_score_an_unreachable_correctness_is_said(tmp_path):
    """Correctness falls back to overall >= 1; with a judge, overall = rule_weight x rule + weight x judge, which at
    0.5 + 0.25 never reaches 1: pass@k read 0 without a word."""
    from easyrl.config import PPOConfig

    config = PPOConfig()
    config.worker.reward.judge.kind, config.worker.reward.judge.weight = "http", 0.25
    config.worker.reward.rule_weight = 0.5
    scores = [{"overall": 0.75, "rule": 1.0, "judge": 1.0}, {"overall": 0.3, "rule": 0.0, "judge": 0.2}]
    rows = [{"index": 0, "data_source": "s", "responses": ["a", "b"], "scores": scores}]
    results = summarize(rows)
    said = unreachable_correctness(config, results, rows)
    assert said.startswith("No sample can be correct: the reward gives no accuracy score, so correctness is overall")
    assert "worker.reward.rule_weight=0.5 x rule + worker.reward.judge.weight=0.25 x judge, at most 0.75" in said
    assert f"({said})" in format_table({**results, "correct_unreachable": said}).splitlines()
    # a classifier's sigmoid never reaches 1: 0.5 + 0.5 is not enough either; a linear one is unbounded
    config.worker.reward.judge.kind, config.worker.reward.judge.weight = "classifier", 0.5
    assert "judge, below 1 (pass@k is 0" in unreachable_correctness(config, results, rows)
    config.worker.reward.judge.score_transform = "linear"
    assert unreachable_correctness(config, results, rows) is None
    # full marks reach the threshold: an http judge at 0.5 + 0.5, or a lower threshold
    config.worker.reward.judge.kind = "http"
    assert unreachable_correctness(config, results, rows) is None
    config.worker.reward.judge.weight = 0.25
    config.eval.correct_threshold = 0.7
    assert unreachable_correctness(config, summarize(rows, threshold=0.7), rows) is None
    # a key the user chose, or a rule reward above 1 (a sample did reach the threshold): nothing claimed
    config.eval.correct_threshold = 1.0
    config.eval.correct_key = "overall"
    assert unreachable_correctness(config, results, rows) is None
    config.eval.correct_key = None
    above = [{**rows[0], "scores": [{"overall": 1.5, "rule": 2.0, "judge": 1.0}, scores[1]]}]
    assert unreachable_correctness(config, summarize(above), above) is None
    config.worker.reward.judge.kind = "none"
    assert unreachable_correctness(config, results, rows) is None


def test_combined_functions_are_judged_by_their_accuracy_not_the_weighted_sum():
    # TRL's accuracy_reward + format_reward at weight 1 each: a well-formatted wrong answer has overall 1
    scores = [
        {"overall": 1.0, "accuracy_reward": 0.0, "format_reward": 1.0},
        {"overall": 2.0, "accuracy_reward": 1.0, "format_reward": 1.0},
    ]
    rows = [{"index": 0, "data_source": "s", "responses": ["a", "b"], "scores": scores}]
    results = summarize(rows)
    assert results["correct"] == "accuracy_reward >= 1" and results["sources"]["s"]["pass@1"] == pytest.approx(0.5)
    assert summarize(rows, correct_key="overall")["sources"]["s"]["pass@1"] == pytest.approx(1.0)


def test_a_score_a_trl_function_gives_none_is_null_in_the_file_and_eval_leaves_its_prompts_out(tokenizer, tmp_path):
    """TRL's accuracy_reward returns None for a solution it cannot parse: the file held 0, so eval counted those
    prompts as answered wrong. The sample's score is null and eval leaves the prompt out of pass@k, counted."""
    from easyrl.config import RewardConfig
    from easyrl.workers.reward.scorer import RewardScorer
    from tests.test_reward_scorer import rollout_batch, with_text_prompts

    reward = tmp_path / "trl_rewards.py"
    reward.write_text(
        "def accuracy_reward(completions, ground_truth, **kwargs):\n"
        "    return [None if truth == '?' else float(text == truth) for text, truth in zip(completions, ground_truth)]\n"
        "def format_reward(completions, **kwargs):\n"
        "    return [1.0 for _ in completions]\n"
    )
    config = RewardConfig(reward_function=f"{reward}:accuracy_reward,format_reward")
    responses, truths = ["4", "5", "9", "9", "x", "y"], ["4", "4", "9", "9", "?", "?"]
    batch = with_text_prompts(tokenizer, rollout_batch(tokenizer, responses, truths), ["q"] * 6)
    token_scores, metrics = RewardScorer(config, tokenizer, in_process=True, prompt_key="question").score(batch)
    scores = json.loads(json.dumps(sample_scores(token_scores, metrics)))  # as written to the file and read back
    assert [score["accuracy_reward"] for score in scores] == [1.0, 0.0, 1.0, 1.0, None, None]
    assert [score["overall"] for score in scores] == [2.0, 1.0, 2.0, 2.0, 1.0, 1.0]  # the None added 0
    rows = [{"index": i, "data_source": "math", "scores": scores[2 * i : 2 * i + 2]} for i in range(3)]
    results = summarize(rows)
    entry = results["sources"]["math"]
    assert results["correct"] == "accuracy_reward >= 1" and results["unjudged"] == entry["unjudged"] == 1
    assert entry["pass@1"] == pytest.approx(0.75) and entry["pass@2"] == 1.0  # over prompts 0 and 1, not 0.5
    assert entry["accuracy_reward@2"] == pytest.approx(0.75) and entry["mean@2"] == pytest.approx(9 / 6)
    table = format_table(results)
    assert "1 prompts have samples whose `accuracy_reward` is null" in table
    # a source whose every prompt the function does not apply to has no pass@k, rather than 0
    alone = summarize([{"index": 0, "data_source": "code", "scores": scores[4:]}])["sources"]["code"]
    assert alone["pass@1"] is None and alone["accuracy_reward@2"] is None and alone["unjudged"] == 1
    assert "unjudged" not in summarize(rows[:2])["sources"]["math"]  # no column when every prompt was judged


# ----------------------------------------------------------------------------------------------------------------------
# the resumable file
# ----------------------------------------------------------------------------------------------------------------------
def test_a_partial_last_line_is_dropped_with_a_warning_and_cut_off_the_file(tmp_path, caplog):
    path = str(tmp_path / "out.jsonl")
    append_rows(path, [_row(0, "s", [1]), _row(1, "s", [0])])
    whole = Path(path).read_bytes()
    with open(path, "ab") as handle:  # what a kill in the middle of a write leaves
        handle.write(b'{"index": 2, "data_source": "s", "resp')
    with caplog.at_level(logging.WARNING):
        rows = read_rows(path, repair=True)
    assert [row["index"] for row in rows] == [0, 1]
    assert "the last line (38 bytes) is incomplete" in caplog.text
    assert Path(path).read_bytes() == whole  # the next batch appends after the last whole row


def test_a_line_that_is_not_a_generation_row_is_an_error_naming_it(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"index": 0, "responses": []}\nnot json\n{"index": 1, "responses": []}\n')
    with pytest.raises(GenerationFileError, match=r"out.jsonl: line 2 is not JSON"):
        read_rows(str(path))


# ----------------------------------------------------------------------------------------------------------------------
# real runs on the tiny model
# ----------------------------------------------------------------------------------------------------------------------
PROMPTS = [(1, 2), (3, 4), (5, 6), (2, 9), (4, 4), (6, 1)]


@pytest.fixture(scope="module")
def val_file(tmp_path_factory) -> Path:
    """Six arithmetic prompts in two data sources of three (odd and even first operand)."""
    path = tmp_path_factory.mktemp("generate_data") / "val.jsonl"
    rows = [
        {"problem": f"What is {a} + {b}?", "answer": str(a + b), "data_source": ("odd", "even")[a % 2 == 0]}
        for a, b in PROMPTS
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _args(model_path, val_file, save_dir, *extra) -> list[str]:
    # one worker, two prompts per generate call: three batches
    return [
        *TINY_RUN_OVERRIDES,
        f"worker.actor.model.model_path={model_path}",
        f"trainer.save_checkpoint_path={save_dir}",
        f"data.val_files={val_file}",
        "data.val_batch_size=2",
        "trainer.n_gpus_per_node=1",
        "worker.rollout.n=4",
        "worker.rollout.temperature=1.0",
        *extra,
    ]


def test_eval_results_go_beside_a_named_generations_file_so_two_models_keep_theirs(
    tiny_model_path, val_file, tmp_path
):
    """Two models compared by their own eval.generations (the README's advice) both wrote
    <trainer.save_checkpoint_path>/eval.json, the second over the first, without a word."""
    from easyrl.trainer.evaluate import eval_paths

    def paths(*extra):
        return eval_paths(load_run_plan(_args(tiny_model_path, val_file, tmp_path, *extra)))

    assert paths() == (str(tmp_path / "eval_generations.jsonl"), str(tmp_path / "eval.json"))
    assert paths(f"eval.generations={tmp_path / 'rl.jsonl'}") == (
        str(tmp_path / "rl.jsonl"),
        str(tmp_path / "rl.eval.json"),
    )
    assert paths(f"eval.generations={tmp_path / 'a' / 'base.jsonl'}", f"eval.output={tmp_path / 'mine.json'}") == (
        str(tmp_path / "a" / "base.jsonl"),
        str(tmp_path / "mine.json"),
    )


def _run(command: str, args: list[str], log_path: Path) -> str:
    run_training(args, log_path, command=command)
    return log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def generated(tiny_model_path, val_file, tmp_path_factory) -> Path:
    """An uninterrupted `easyrl generate`: 6 prompts x 4 samples at temperature 1."""
    root = tmp_path_factory.mktemp("generate")
    _run("generate", _args(tiny_model_path, val_file, root), root / "generate.log")
    return root / "samples.jsonl"


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_generate_writes_n_scored_samples_per_prompt_once_each(generated):
    rows = [json.loads(line) for line in generated.read_text().splitlines()]
    assert [row["index"] for row in rows] == list(range(len(PROMPTS)))
    for row, (a, b) in zip(rows, PROMPTS):
        assert f"What is {a} + {b}?" in row["prompt"] and row["prompt"].startswith("<|im_start|>")
        assert row["ground_truth"] == str(a + b)
        assert row["data_source"] == ("odd", "even")[a % 2 == 0]
        assert len(row["responses"]) == 4 and all(isinstance(text, str) for text in row["responses"])
        assert len(row["scores"]) == 4
        for score in row["scores"]:  # the word-share reward's two scores, equal by its definition
            assert 0.0 <= score["overall"] <= 1.0 and score["overall"] == pytest.approx(score["word_share"])
    assert len({text for row in rows for text in row["responses"]}) > len(rows)  # sampled, not copies


def _generate_until_a_batch_is_written(tiny_model_path, val_file, tmp_path):
    """(args, output, process) of an `easyrl generate` whose scoring sleeps 3 s a batch, once its first batch (two
    rows) is written; its log is first.log."""
    args = _args(
        tiny_model_path,
        val_file,
        tmp_path,
        f"worker.reward.reward_function={SLEEPY_REWARD}:compute_score",
        "worker.reward.reward_function_kwargs={sleep_s: 3.0}",
    )
    output, log_path = tmp_path / "samples.jsonl", tmp_path / "first.log"
    proc = launch_training(args, log_path, "generate")
    wait_until(lambda: output.exists() and output.read_text().count("\n") >= 2, "a batch written", proc, log_path)
    return args, output, proc


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_generate_killed_after_a_batch_resumes_without_duplicates_and_samples_as_the_uninterrupted_run(
    tiny_model_path, val_file, generated, tmp_path
):
    # the run is killed (SIGKILL, its Ray processes with it) between batches
    args, output, proc = _generate_until_a_batch_is_written(tiny_model_path, val_file, tmp_path)
    kill_process_group(proc)
    lines = output.read_text().splitlines(keepends=True)
    assert 2 <= len(lines) < len(PROMPTS), "the kill came after the last batch: nothing left to resume"
    # as if the kill had cut a batch's write short: its first row whole, its second cut off
    before = "".join(lines[:-1])
    written = len(lines) - 1
    output.write_text(before + lines[-1][:20])

    log = _run("generate", args, tmp_path / "second.log")
    assert "is incomplete, the trace of a run that was stopped while writing" in log
    assert f"({len(PROMPTS) - written} generated now, {written} by an earlier run)" in log
    text = output.read_text()
    assert text.startswith(before)  # the rows of the killed run stay as they were
    rows = [json.loads(line) for line in text.splitlines()]
    assert sorted(row["index"] for row in rows) == list(range(len(PROMPTS)))
    # each batch samples with a seed of (rollout.seed, batch) only, and the batch whose second row was lost is
    # generated whole again: the same responses as the uninterrupted run
    reference = {row["index"]: row for row in map(json.loads, generated.read_text().splitlines())}
    for row in rows:
        assert row["responses"] == reference[row["index"]]["responses"]


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_stop_ends_generate_with_one_line_keeping_its_rows_and_the_rerun_says_how_many_are_done(
    tiny_model_path, val_file, tmp_path, stop
):
    args, output, proc = _generate_until_a_batch_is_written(tiny_model_path, val_file, tmp_path)
    log_path = tmp_path / "first.log"
    if stop == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground process group
    else:
        os.kill(proc.pid, signal.SIGTERM)  # a scheduler's stop, to the driver only (Ray's handler exited with 15)
    try:
        returncode = proc.wait(timeout=120)
    finally:
        kill_process_group(proc)
    log = log_path.read_text(errors="replace")
    kept = len(read_rows(str(output)))
    assert returncode == 128 + stop, log
    assert 2 <= kept < len(PROMPTS), "the stop came after the last batch: nothing left to continue"
    assert f"easyrl generate: interrupted ({stop.name}): {output} keeps the rows of {kept} prompts" in log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log

    log = _run("generate", args, tmp_path / "second.log")
    left = len(PROMPTS) - kept
    assert f"holds the rows of {kept} of the {len(PROMPTS)} prompts of data.val_files (an earlier run): " in log
    assert f"generating the other {left}." in log
    assert f"({left} generated now, {kept} by an earlier run)" in log
    assert sorted(row["index"] for row in read_rows(str(output))) == list(range(len(PROMPTS)))


def _without_reward(args: list[str]) -> list[str]:
    return [
        *(arg for arg in args if not arg.startswith("worker.reward.reward_function=")),
        "worker.reward.reward_function=null",
    ]


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_generation_plans_ignore_the_batch_arithmetic_of_updates_they_never_make(
    tiny_model_path, val_file, tmp_path, command
):
    """generate and eval build no optimizer: an n that does not split into the update's micro-batches, or n=1 with a
    group estimator, is theirs to choose; the same values still stop a training run."""
    from easyrl.cli import _generation_plan
    from easyrl.config import ConfigError

    cases = (
        (3, 8, "not a multiple of `worker.actor.micro_batch_size_per_device_for_update`"),
        (1, 4, "needs `worker.rollout.n` > 1"),
    )
    for n, micro_batch, message in cases:
        args = _args(
            tiny_model_path,
            val_file,
            tmp_path,
            f"worker.rollout.n={n}",
            f"worker.actor.micro_batch_size_per_device_for_update={micro_batch}",
            "worker.actor.dynamic_batching=false",  # a token budget takes any number of samples per device
            "algorithm.adv_estimator=grpo",
        )
        assert _generation_plan(args, command).config.worker.rollout.n == n
        with pytest.raises(ConfigError, match=message):
            load_run_plan([*args, f"data.train_files={val_file}"])


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_generation_starts_no_tracker_so_a_remote_one_without_a_login_does_not_stop_it(
    tiny_model_path, val_file, tmp_path, monkeypatch, command
):
    from easyrl.cli import _generation_plan
    from easyrl.config import ConfigError

    for name in [name for name in os.environ if name.startswith(("WANDB_", "SWANLAB_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login either
    args = _args(tiny_model_path, val_file, tmp_path, "trainer.logger=[console,file,wandb,swanlab]")
    with pytest.raises(ConfigError, match="`trainer.logger` includes 'wandb'"):  # the training run would stop
        load_run_plan([*args, f"data.train_files={val_file}"])
    assert _generation_plan(args, command).config.trainer.logger == ["console"]


def test_generate_needs_no_reward_function_and_eval_names_the_key(tiny_model_path, val_file, tmp_path):
    from easyrl.cli import _generation_plan
    from easyrl.config import ConfigError

    args = _without_reward(_args(tiny_model_path, val_file, tmp_path))
    assert _generation_plan(args, "generate").config.worker.reward.reward_function is None
    with pytest.raises(ConfigError, match="`worker.reward.reward_function`"):
        _generation_plan(args, "eval")


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_generate_without_a_reward_writes_the_samples_unscored(tiny_model_path, val_file, tmp_path):
    _run("generate", _without_reward(_args(tiny_model_path, val_file, tmp_path)), tmp_path / "generate.log")
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [row["index"] for row in rows] == list(range(len(PROMPTS)))
    assert all(len(row["responses"]) == 4 and "scores" not in row for row in rows)
    assert all(row["settings"]["reward_function"] is None for row in rows)


def test_eval_sums_each_samples_tool_counts_per_source_and_warns_when_most_tool_calls_failed(caplog):
    """eval and generate dropped the multi-turn counts: a score measured with every tool call failing (a sandbox or
    API that was down) looked like any other."""
    from easyrl.trainer.evaluate import format_table, summarize
    from easyrl.trainer.generate import describe_multi_turn, multi_turn_totals, warn_failing_tools

    def sample(turns, calls, errors, late, cut=0):
        return {"turns": turns, "tool_calls": calls, "tool_errors": errors, "tool_timeouts": late,
                "tool_args_coerced": 0, "truncated": cut, "max_turns_reached": int(turns == 3)}  # fmt: skip

    rows = [
        {"index": 0, "data_source": "math", "multi_turn": [sample(3, 2, 2, 1), sample(1, 0, 0, 0)]},
        {"index": 1, "data_source": "math", "multi_turn": [sample(2, 1, 1, 0, cut=1), sample(2, 1, 0, 0)]},
        {"index": 2, "data_source": "code", "multi_turn": [sample(3, 4, 4, 4), sample(3, 4, 3, 3)]},
        {"index": 3, "data_source": "code"},  # a row an older easyrl wrote: not counted
    ]
    for row in rows:
        row["scores"] = [{"overall": 0.0}, {"overall": 1.0}]
    totals = multi_turn_totals(rows)
    assert totals["math"] == {
        "prompts": 2, "samples": 4, "turns_max": 3, "turns_mean": 2.0, "tool_calls": 4, "tool_errors": 3,
        "tool_timeouts": 1, "tool_args_coerced": 0, "truncated": 1, "max_turns_reached": 1,
    }  # fmt: skip
    assert totals["code"]["tool_calls"] == 8 and totals["code"]["tool_timeouts"] == 7
    line = describe_multi_turn(totals)
    assert line == (
        "multi-turn over 3 prompts: 12 tool calls, 10 answered with an error (8 of them timed out); turns 2.33 mean, "
        "3 max; 1 of 6 samples cut at data.max_response_length, 3 stopped at worker.rollout.multi_turn.max_turns"
    )
    results = summarize(rows)
    results["multi_turn"] = totals
    assert f"({line}; per source in the JSON's `multi_turn`)" in format_table(results).splitlines()
    with caplog.at_level("WARNING"):
        warn_failing_tools(totals, "eval_generations.jsonl")
    assert "10 of 12 tool calls answered the model with an error (8 timed out)" in caplog.text
    assert multi_turn_totals([{k: v for k, v in row.items() if k != "multi_turn"} for row in rows]) == {}


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_generate_with_tools_writes_each_samples_turns(tiny_model_path, val_file, tmp_path):
    """A multi-turn row held the responses alone: tool results decoded into them without special tokens, so the
    model's text and a tool's could not be told apart."""
    tools = f"worker.rollout.multi_turn.tools={REPO_ROOT / 'tools' / 'calculator.py'}"
    args = _without_reward(_args(tiny_model_path, val_file, tmp_path, tools, "data.max_response_length=24"))
    log = _run("generate", args, tmp_path / "generate.log")
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == len(PROMPTS)
    calls = sum(sample["tool_calls"] for row in rows for sample in row["multi_turn"])
    assert f"multi-turn over {len(PROMPTS)} prompts: {calls} tool calls, " in log
    for row in rows:
        assert len(row["messages"]) == len(row["responses"]) == len(row["multi_turn"]) == 4
        assert [s["turns"] for s in row["multi_turn"]] == [
            sum(m["role"] == "assistant" for m in t) for t in row["messages"]
        ]
        for messages, response in zip(row["messages"], row["responses"]):
            assert messages[0]["role"] == "assistant" and {m["role"] for m in messages} <= {"assistant", "tool"}
            if len(messages) == 1:  # answered without a tool call: the one turn is the response
                assert messages[0]["content"] == response


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_eval_prints_the_table_and_writes_per_source_mean_and_pass_at_k(tiny_model_path, val_file, tmp_path):
    # the data's row 3 has no answer: skipped, so the rows after it are a prompt index behind their row in the file;
    # it has no data_source, so the file's name stands for it; the last row, an odd one, has no prompt
    lines = val_file.read_text().splitlines(keepends=True)
    data = tmp_path / "val_with_a_gap.jsonl"
    gap = json.dumps({"problem": "What is 1 + 1?", "answer": None}) + "\n"
    no_prompt = json.dumps({"problem": None, "answer": "2", "data_source": "odd"}) + "\n"
    data.write_text("".join(lines[:3]) + gap + "".join(lines[3:]) + no_prompt)
    extra = ["eval.k=4", "eval.correct_key=word_share", "eval.correct_threshold=0.8"]
    log = _run("eval", _args(tiny_model_path, data, tmp_path, *extra), tmp_path / "eval.log")
    results = json.loads((tmp_path / "eval.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "eval_generations.jsonl").read_text().splitlines()]
    assert sorted(row["index"] for row in rows) == list(range(len(PROMPTS)))
    assert [row["row"] for row in sorted(rows, key=lambda row: row["index"])] == [0, 1, 2, 4, 5, 6]
    assert all(len(row["responses"]) == 4 and len(row["scores"]) == 4 for row in rows)
    assert results["settings"]["model_path"] == str(tiny_model_path)
    assert results["settings"]["sampling"]["n"] == 4 and results["settings"]["reward_function"].endswith(
        ":compute_score"
    )
    assert all(row["settings"] == results["settings"] for row in rows)
    assert results["n"] == 4 and results["correct"] == "word_share >= 0.8"
    # the rows of each source and those skipped; a source with no prompt left is reported without a score
    assert sorted(results["sources"]) == ["even", "odd", "val_with_a_gap"]
    assert results["sources"]["val_with_a_gap"] == {"prompts": 0, "rows": 1, "skipped": 1}
    assert [results["sources"][source]["skipped"] for source in ("odd", "even")] == [1, 0]
    assert {key: results["data"][key] for key in ("val_files", "rows", "skipped")} == {
        "val_files": str(data),
        "rows": 8,
        "skipped": 2,
    }
    driver_log = tmp_path / "logs" / "driver.log"
    listing = tmp_path / "eval_generations.skipped_rows.jsonl"
    assert results["data"]["skipped_reasons"] == f"each skipped row and why: {listing}"
    assert [json.loads(line) for line in listing.read_text().splitlines()] == [
        {"data": "data.val_files", "row": 3, "reason": "no value for data.answer_key='answer'"},
        {"data": "data.val_files", "row": 7, "reason": "no value for data.prompt_key='problem'"},
    ]
    assert "skipped 1 of 8 rows without a value for data.answer_key='answer' (row 3)" in driver_log.read_text()
    reasons = results["data"]["skipped_reasons"]
    assert f"(2 of 8 rows of data.val_files were skipped when read: no score counts them; {reasons})" in log
    for source in ("odd", "even"):
        entry = results["sources"][source]
        mine = [row for row in rows if row["data_source"] == source]
        shares = [[score["word_share"] for score in row["scores"]] for row in mine]
        correct = [sum(share >= 0.8 for share in row) for row in shares]
        assert entry["prompts"] == len(mine) == 3 and entry["rows"] == 3 + entry["skipped"]
        assert entry["mean@4"] == pytest.approx(sum(map(sum, shares)) / 12)
        for k in (1, 2, 4):
            by_formula = sum(1 - math.comb(4 - c, k) / math.comb(4, k) for c in correct) / 3
            assert entry[f"pass@{k}"] == pytest.approx(by_formula)
        line = next(line for line in log.splitlines() if line.startswith(source + " "))
        counts = [str(entry[c]) for c in ("prompts", "rows", "skipped")]
        assert line.split()[1:] == counts + [f"{entry[c]:.4f}" for c in list(entry)[3:]]
    assert "source" in log and "pass@4" in log


def test_rows_with_samples_not_fully_scored_leave_the_file_and_count_as_left(tmp_path):
    """A judge that was down marks its samples `scoring_failed`: a rerun of eval took their zeros as final. Those rows
    leave the file (atomically), the rest stay as they were, and they are counted among the prompts left."""
    from easyrl.trainer.generate import drop_unscored_rows

    path = tmp_path / "eval.jsonl"
    scored = {"overall": 1.0}
    rows = [
        {"index": 0, "responses": ["a", "b"], "scores": [scored, scored]},
        {"index": 1, "responses": ["c", "d"], "scores": [scored, {"overall": 0.0, "scoring_failed": True}]},
        {"index": 2, "responses": ["e", "f"]},  # generate without a reward: no scores
    ]
    append_rows(str(path), rows)
    assert drop_unscored_rows(str(path)) == 1
    assert read_rows(str(path)) == [rows[0], rows[2]]
    assert drop_unscored_rows(str(path)) == 0 and read_rows(str(path)) == [rows[0], rows[2]]


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_a_rerun_generates_and_scores_again_the_rows_whose_scoring_failed(tiny_model_path, val_file, tmp_path):
    """The rerun generates the batch of a row whose scoring failed again, with its seed, and writes the row anew: its
    samples and scores are those of the first run; the rows that were scored stay as they were."""
    extra = ["eval.k=4", "eval.correct_key=word_share", "eval.correct_threshold=0.8"]
    _run("eval", _args(tiny_model_path, val_file, tmp_path, *extra), tmp_path / "eval.log")
    results = json.loads((tmp_path / "eval.json").read_text())
    generations = tmp_path / "eval_generations.jsonl"
    rows = [json.loads(line) for line in generations.read_text().splitlines()]
    failed = {**rows[1], "responses": ["unscored"] * 4, "scores": [{**rows[1]["scores"][0], "scoring_failed": True}]}
    generations.write_text("".join(json.dumps(failed if row is rows[1] else row) + "\n" for row in rows))
    log = _run("eval", _args(tiny_model_path, val_file, tmp_path, *extra), tmp_path / "rerun.log")
    assert "1 rows held samples that were not fully scored (`scoring_failed`" in log
    again = [json.loads(line) for line in generations.read_text().splitlines()]
    assert again == [row for row in rows if row is not rows[1]] + [rows[1]]  # the same samples and scores
    assert json.loads((tmp_path / "eval.json").read_text())["sources"] == results["sources"]


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_eval_at_k_1_greedy_equals_the_trainers_validation_reward(tiny_model_path, val_file, tmp_path):
    greedy = ["worker.rollout.val_override_config={temperature: 0, n: 1}", "data.val_batch_size=4"]
    args = _args(tiny_model_path, val_file, tmp_path / "eval", "eval.k=1", "eval.val_sampling=true", *greedy)
    _run("eval", args, tmp_path / "eval.log")
    results = json.loads((tmp_path / "eval" / "eval.json").read_text())
    train = _args(tiny_model_path, val_file, tmp_path / "train", *greedy) + [
        f"data.train_files={val_file}",
        "trainer.val_only=true",
        "trainer.val_before_train=true",
    ]
    run_training(train, tmp_path / "train.log")
    validation = metrics_by_step(tmp_path / "train")[0]
    for source in ("odd", "even"):
        assert results["sources"][source]["mean@1"] == pytest.approx(validation[f"val/{source}/reward"], abs=1e-6)


@pytest.mark.timeout(120)
def test_a_file_made_by_other_weights_answers_or_reward_code_is_refused(tiny_model_path, val_file, tmp_path):
    """A model folder rewritten in place (a resumed `easyrl sft`, a merge run again), a benchmark answer corrected or
    a reward function fixed left the earlier rows standing: a rerun reported the old model's or old scores' numbers as
    the new ones. A row of an earlier version, without the weights' and reward file's digests, is still read."""
    import shutil

    from easyrl.config.plan import load_run_plan
    from easyrl.data.loader import create_val_loader
    from easyrl.data.tokenizer import load_tokenizer_and_processor
    from easyrl.trainer.generate import generation_settings, prompts_left
    from easyrl.workers.rollout.base import GenerationRequest

    model = tmp_path / "model"
    shutil.copytree(tiny_model_path, model)
    reward = tmp_path / "my_reward.py"
    reward.write_text((REPO_ROOT / "reward_function" / "arithmetic.py").read_text())
    args = _args(model, val_file, tmp_path, f"worker.reward.reward_function={reward}:compute_score")
    tokenizer, _ = load_tokenizer_and_processor(str(model))

    def settings_and_loader(data_file=val_file):
        plan = load_run_plan([*args, f"data.val_files={data_file}"])
        return generation_settings(plan, GenerationRequest()), create_val_loader(plan.config.data, tokenizer)

    settings, loader = settings_and_loader()
    assert len(settings["model_weights"]) == 16 and len(settings["reward_file"]) == 16
    batches = list(loader)
    texts = [tokenizer.decode(ids) for batch in batches for ids in batch.non_tensor_batch["raw_prompt_ids"]]
    truths = [str(truth) for batch in batches for truth in batch.non_tensor_batch["ground_truth"]]
    output = str(tmp_path / "samples.jsonl")
    rows = [
        {"index": i, "prompt": text, "ground_truth": truth, "responses": ["r"] * 4, "settings": settings}
        for i, (text, truth) in enumerate(zip(texts, truths))
    ]
    append_rows(output, rows[:3])
    assert prompts_left(output, tokenizer, loader, 4, settings) == len(PROMPTS) - 3

    # new weights in the same folder: the tensors' bytes (after safetensors' header) all change, as training does
    weights = next(model.glob("*.safetensors"))
    data = weights.read_bytes()
    start = 8 + int.from_bytes(data[:8], "little")
    weights.write_bytes(data[:start] + np.random.default_rng(0).bytes(len(data) - start))
    new_weights, _ = settings_and_loader()
    with pytest.raises(
        GenerationFileError,
        match=r"other settings \(model_weights \(the weight files in .*\): '[0-9a-f]{16}' in the file, '",
    ):
        prompts_left(output, tokenizer, loader, 4, new_weights)
    # the reward function fixed
    reward.write_text(reward.read_text() + "\n# fixed\n")
    fixed = {**settings, "reward_file": generation_settings(load_run_plan(args), GenerationRequest())["reward_file"]}
    assert fixed["reward_file"] != settings["reward_file"]
    with pytest.raises(
        GenerationFileError,
        match=r"other settings \(reward_file \(the reward function's file and the modules of yours it imports\): '",
    ):
        prompts_left(output, tokenizer, loader, 4, fixed)
    with pytest.raises(GenerationFileError, match=r"Choose another output file \(eval.generations, or another"):
        prompts_left(output, tokenizer, loader, 4, fixed, "eval.generations")  # `easyrl eval` names its own key
    # an answer of the data corrected
    corrected = tmp_path / "val.jsonl"
    lines = val_file.read_text().splitlines()
    row = json.loads(lines[1])
    lines[1] = json.dumps({**row, "answer": "99"})
    corrected.write_text("\n".join(lines) + "\n")
    _, corrected_loader = settings_and_loader(corrected)
    with pytest.raises(
        GenerationFileError, match=rf"prompt index 1 holds the answer '{row['answer']}', data.val_files now '99'"
    ):
        prompts_left(output, tokenizer, corrected_loader, 4, settings)
    # an edited tools file: each trajectory that called a tool would read another answer now
    tools = tmp_path / "tools.py"
    tools.write_text(
        'def add(a: int, b: int) -> int:\n    """Add.\n\n    Args:\n        a: a\n        b: b\n    """\n    return a + b\n\n\nTOOLS = [add]\n'
    )
    with_tools = [*args, f"worker.rollout.multi_turn.tools={tools}"]
    before = generation_settings(load_run_plan(with_tools), GenerationRequest())
    assert list(before["input_files"]) == ["worker.rollout.multi_turn.tools"]
    append_rows(str(tmp_path / "tools.jsonl"), [{**rows[0], "settings": before}])
    tools.write_text(tools.read_text().replace("return a + b", "return a + b + 1"))
    after = generation_settings(load_run_plan(with_tools), GenerationRequest())
    with pytest.raises(
        GenerationFileError,
        match=r"other settings \(input_files.worker.rollout.multi_turn.tools: '[0-9a-f]{16}' in the file, '",
    ):
        prompts_left(str(tmp_path / "tools.jsonl"), tokenizer, loader, 4, after)
    assert "input_files" not in settings  # no tools, environment or judge: nothing to digest
    # sampled generations draw per batch (a seed of the batch's index): other batches, other samples
    sampled = [*args, "worker.rollout.val_override_config={temperature: 0.7}"]
    by_two = generation_settings(load_run_plan([*sampled, "data.val_batch_size=2"]), GenerationRequest(validate=True))
    append_rows(str(tmp_path / "sampled.jsonl"), [{**rows[0], "settings": by_two}])
    by_three = generation_settings(
        load_run_plan([*sampled, "data.val_batch_size=3"]), GenerationRequest(validate=True)
    )
    with pytest.raises(GenerationFileError, match=r"other settings \(val_batch_size: 2 in the file, 3 now\)"):
        prompts_left(str(tmp_path / "sampled.jsonl"), tokenizer, loader, 4, by_three)
    assert "media" not in settings  # a text model's pictures: none to compare
    greedy = [*args, "worker.rollout.val_override_config={temperature: 0}"]
    assert "val_batch_size" not in generation_settings(load_run_plan(greedy), GenerationRequest(validate=True))
    # rows of an earlier version have no digests: read, not refused for lacking them
    older = {key: value for key, value in settings.items() if key not in ("model_weights", "reward_file")}
    earlier = str(tmp_path / "earlier.jsonl")
    append_rows(earlier, [{**row, "settings": older} for row in rows[:2]])
    assert prompts_left(earlier, tokenizer, loader, 4, settings) == len(PROMPTS) - 2


@pytest.mark.timeout(300)
def test_an_existing_output_is_checked_and_a_finished_one_ends_the_run_before_ray(tiny_model_path, val_file, tmp_path):
    """The rows of an earlier run are checked against this run's prompts and samples before the engine starts (a
    refusal took the engine's start-up, ~25 s, first), and a file holding every prompt ends the run at once."""
    import subprocess
    import sys

    from easyrl.config.plan import load_run_plan
    from easyrl.data.loader import create_val_loader
    from easyrl.data.tokenizer import load_tokenizer_and_processor
    from easyrl.trainer.generate import generation_settings, prompts_left
    from easyrl.workers.rollout.base import GenerationRequest

    args = _args(tiny_model_path, val_file, tmp_path)
    plan = load_run_plan(args)
    config = plan.config
    tokenizer, _ = load_tokenizer_and_processor(str(tiny_model_path))
    loader = create_val_loader(config.data, tokenizer)
    texts = [tokenizer.decode(ids) for batch in loader for ids in batch.non_tensor_batch["raw_prompt_ids"]]
    output = tmp_path / "samples.jsonl"
    settings = generation_settings(plan, GenerationRequest())
    assert settings["model_path"] == str(tiny_model_path) and settings["sampling"]["temperature"] == 1.0
    assert prompts_left(str(output), tokenizer, loader, 4, settings) is None  # no file yet
    rows = [{"index": i, "prompt": text, "responses": ["r"] * 4, "settings": settings} for i, text in enumerate(texts)]
    append_rows(str(output), rows[:2])
    assert prompts_left(str(output), tokenizer, loader, 4, settings) == len(PROMPTS) - 2
    with pytest.raises(GenerationFileError, match="has 4 responses, this run samples 2 per prompt"):
        prompts_left(str(output), tokenizer, loader, 2, settings)
    # another model, another temperature or another reward: the file's rows are not this run's
    cooler = generation_settings(plan, GenerationRequest(sampling_override={"temperature": 0.5}))
    with pytest.raises(GenerationFileError, match=r"sampling.temperature: 1.0 in the file, 0.5 now"):
        prompts_left(str(output), tokenizer, loader, 4, cooler)
    other_model = {**settings, "model_path": "/models/trained"}
    with pytest.raises(GenerationFileError, match=r"model_path: '.*' in the file, '/models/trained' now"):
        prompts_left(str(output), tokenizer, loader, 4, other_model)
    unscored = {**settings, "reward_function": None}
    with pytest.raises(GenerationFileError, match="reward_function: "):
        prompts_left(str(output), tokenizer, loader, 4, unscored)
    judge = ["worker.reward.judge.kind=http", "worker.reward.judge.base_url=http://127.0.0.1:9/v1"]
    judged_plan = load_run_plan([*args, *judge, "worker.reward.judge.model=judge", "worker.reward.rule_weight=0.5"])
    judged = generation_settings(judged_plan, GenerationRequest())
    assert judged["judge"]["base_url"] == "http://127.0.0.1:9/v1" and judged["rule_weight"] == 0.5
    with pytest.raises(GenerationFileError, match=r"judge: None in the file, \{.*'kind': 'http'"):
        prompts_left(str(output), tokenizer, loader, 4, judged)
    # how grades are fetched (concurrency, timeouts, retries) is no grade: a file of a rate-limited eval goes on with
    # gentler settings, rows of earlier versions (which wrote every judge key) too; what grades are is compared
    judged_file = tmp_path / "judged.jsonl"
    earlier = {**judged, "judge": {**judged["judge"], "concurrency": 16, "timeout_s": 60.0, "max_retries": 3}}
    append_rows(str(judged_file), [{**rows[0], "settings": earlier}, {**rows[1], "settings": judged}])
    gentler = [
        "worker.reward.judge.concurrency=2",
        "worker.reward.judge.timeout_s=300",
        "worker.reward.judge.max_retries=9",
    ]
    gentle_plan = load_run_plan(
        [*args, *judge, "worker.reward.judge.model=judge", "worker.reward.rule_weight=0.5", *gentler]
    )
    gentle = generation_settings(gentle_plan, GenerationRequest())
    assert "concurrency" not in gentle["judge"] and gentle["judge"]["model"] == "judge"
    assert prompts_left(str(judged_file), tokenizer, loader, 4, gentle) == len(PROMPTS) - 2
    graded_otherwise = {**gentle, "judge": {**gentle["judge"], "score_range": [0, 5]}}
    with pytest.raises(
        GenerationFileError, match=r"worker\.reward\.judge\.score_range: \[0, 10\] in the file, \[0, 5\] now"
    ):
        prompts_left(str(judged_file), tokenizer, loader, 4, graded_otherwise)
    # tools make other responses: samples made without them are not a tool run's
    tools = f"worker.rollout.multi_turn.tools={REPO_ROOT / 'tools' / 'calculator.py'}"
    with_tools = generation_settings(load_run_plan([*args, tools]), GenerationRequest())
    assert with_tools["multi_turn"]["tools"].endswith("calculator.py") and "multi_turn" not in settings
    with pytest.raises(GenerationFileError, match=r"multi_turn: None in the file, \{.*calculator.py"):
        prompts_left(str(output), tokenizer, loader, 4, with_tools)
    append_rows(str(output), rows[2:])
    assert prompts_left(str(output), tokenizer, loader, 4, settings) == 0

    result = subprocess.run(
        [sys.executable, "-m", "easyrl", "generate", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "holds a row for every prompt of data.val_files: nothing to generate" in result.stdout + result.stderr
    assert f"{len(PROMPTS)} prompts x 4 samples in {output} (0 generated now, {len(PROMPTS)} by an earlier run)" in (
        result.stdout
    )
    assert not (tmp_path / "logs" / "actor_rollout_0.log").exists()  # no worker started


def test_a_stop_signal_that_a_ray_wait_turns_into_keyboard_interrupt_is_still_named(tmp_path, capsys):
    """SIGTERM while generating: easyrl's handler raises inside a wait of Ray's, which hands the driver a plain
    KeyboardInterrupt; the run still says SIGTERM and exits 143 (a scheduler's preemption, not Ctrl-C's 130)."""
    from easyrl.trainer.generate import GenerationStopped, stop_keeps_rows, stop_signals_raise

    output = tmp_path / "samples.jsonl"
    output.write_text('{"index": 0, "responses": ["a"]}\n')
    received: list[int] = []
    with pytest.raises(SystemExit) as stopped:
        with stop_keeps_rows("eval", str(output), received):
            with stop_signals_raise(received):
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(5)  # the handler raises here, in the main thread
                except GenerationStopped:
                    raise KeyboardInterrupt from None  # what ray.wait made of it
    assert stopped.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err.startswith(
        f"easyrl eval: interrupted (SIGTERM): {output} keeps the rows of 1 prompts, every batch that was finished"
    )
    assert received == [signal.SIGTERM]


def test_a_file_holds_the_score_the_function_gave_not_its_float32_rounding():
    """The batch holds scores in float32: 0.9 was written as 0.8999999761581421. The file holds the overall the
    function gave, as its other scores are written, and without it, the shortest decimal of the float32."""
    import torch

    token_scores = torch.zeros(3, 4)
    token_scores[:, -1] = torch.tensor([0.9, 0.1, 2 / 3])
    metrics = {"reward/overall": [0.9, 0.1, 2 / 3], "reward/accuracy": [0.9, 0.1, 2 / 3]}
    scores = json.loads(json.dumps(sample_scores(token_scores, metrics)))
    assert [score["overall"] for score in scores] == [score["accuracy"] for score in scores] == [0.9, 0.1, 2 / 3]
    scores = json.loads(json.dumps(sample_scores(token_scores, {"reward/accuracy": [0.9, 0.1, 2 / 3]})))
    assert [score["overall"] for score in scores] == [0.9, 0.1, 0.6666667]

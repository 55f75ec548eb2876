"""The sequence-classification reward model (`worker.reward.judge.kind=classifier`): the score mapping, the config
check, the FSDP2-sharded worker's scores against a plain HF forward, the scorer's weighted sum, and a 2-step GRPO run
through `easyrl train` with the reward model in the reward."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.config import ConfigError, RewardConfig, load_config
from easyrl.config.plan import make_run_plan
from easyrl.config.schema import JudgeConfig
from easyrl.protocol import DataProto, as_object_array
from easyrl.testing.tiny_models import build_tiny_reward_model
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.reward.classifier import ClassifierJudge, reward_model_score
from easyrl.workers.reward.judge import combine_scores
from easyrl.workers.reward.scorer import RewardScorer
from tests.fixtures.trainer_runs import TWO_STEP_HALF_RULE_OVERRIDES, metrics_by_step, run_training, train_args
from tests.fsdp_helpers import worker_config, worker_group
from tests.test_reward_judge import judged_batch


@pytest.fixture(scope="session")
def tiny_reward_model_path(tmp_path_factory):
    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny_rm"), seed=0)


# ----------------------------------------------------------------------------------------------------------------------
# raw score -> judge score
# ----------------------------------------------------------------------------------------------------------------------
def test_sigmoid_and_linear_map_the_raw_score_with_scale_and_offset():
    assert reward_model_score(0.0, "sigmoid", 1.0, 0.0) == 0.5
    assert reward_model_score(3.0, "sigmoid", 2.0, 3.0) == 0.5  # the offset is the raw score mapped to 0.5
    assert reward_model_score(1.0, "sigmoid", 1.0, 0.0) == pytest.approx(1 / (1 + math.exp(-1)))
    assert reward_model_score(-1.0, "sigmoid", 0.5, 1.0) == pytest.approx(1 / (1 + math.exp(1)))  # 0.5 x (-2)
    assert reward_model_score(-1000.0, "sigmoid", 1.0, 0.0) == 0.0  # no overflow at either end
    assert reward_model_score(1000.0, "sigmoid", 1.0, 0.0) == 1.0
    assert reward_model_score(4.0, "linear", 0.25, 2.0) == 0.5  # 0.25 x (4 - 2)


class AnsweredCall:
    """What the worker group's non-blocking call returns, already answered with these raw scores."""

    def __init__(self, raw_scores):
        self.raw_scores = raw_scores

    def get(self):
        return DataProto.from_dict(tensors={"rm_scores": torch.tensor(self.raw_scores, dtype=torch.float32)})


def test_a_non_finite_raw_score_scores_zero_and_counts_as_a_judge_error(caplog):
    config = JudgeConfig(kind="classifier", model_path="rm", score_transform="linear", score_scale=2.0, score_offset=1)
    judge = ClassifierJudge(config, reward_model_group=lambda: None)
    verdicts = judge.collect(AnsweredCall([3.0, math.nan, math.inf, -1.0]))
    assert [verdict.score for verdict in verdicts] == [4.0, 0.0, 0.0, -4.0]  # 2 x (r - 1)
    rule = [{"overall": 1.0}] * 4
    combined, judge_errors = combine_scores(rule, verdicts, rule_weight=1.0, judge_weight=0.5)
    assert [score["overall"] for score in combined] == [3.0, 1.0, 1.0, -1.0]
    assert judge_errors == [0.0, 1.0, 1.0, 0.0]
    judge.collect(AnsweredCall([math.nan]))
    assert caplog.text.count("non-finite raw score") == 1  # logged once per run
    assert "Reward model rm: sample 1 got a non-finite raw score; 2 of 4 samples" in caplog.text
    # with the rows' places (the scorer's), the warning names the data row, as the reward function's warnings do
    fresh = ClassifierJudge(config, reward_model_group=lambda: None)
    places = [f"data.train_files rows.jsonl row {row}" for row in (3, 8)]
    fresh.collect(AnsweredCall([0.5, math.nan]), places)
    assert "sample 1 (data.train_files rows.jsonl row 8) got a non-finite raw score" in caplog.text


def test_a_judges_first_failure_of_each_kind_names_its_data_row(caplog):
    from easyrl.workers.reward.judge import UNPARSABLE, JudgeFailure, JudgeResult, report_failures

    verdicts = [JudgeResult(0.7), JudgeResult(0.0, JudgeFailure(UNPARSABLE, "no match"))]
    with caplog.at_level("WARNING"):
        report_failures(verdicts, set(), "Judge x", ["val.jsonl row 0", "val.jsonl row 5"])
    assert [record.getMessage() for record in caplog.records] == [
        "Judge x: sample 1 (val.jsonl row 5) unparsable: no match. 1 of 2 samples of this batch get judge score 0 "
        "(counted in reward/judge_errors; logged once)."
    ]


# ----------------------------------------------------------------------------------------------------------------------
# the config check
# ----------------------------------------------------------------------------------------------------------------------
def classifier_args(valid_args, model_path, *extra):
    return [*valid_args, "worker.reward.judge.kind=classifier", f"worker.reward.judge.model_path={model_path}", *extra]


def test_check_accepts_a_classifier_and_the_plan_adds_the_reward_model_role(valid_args, tiny_reward_model_path):
    config = load_config(classifier_args(valid_args, tiny_reward_model_path, "worker.reward.judge.max_length=512"))
    plan = make_run_plan(config)
    assert plan.use_reward_model
    assert plan.worker_role in ("actor_rollout_rm", "actor_rollout_ref_rm")
    assert "reward model" in plan.describe()


def test_check_refuses_a_classifier_it_cannot_run(valid_args, tiny_reward_model_path, tmp_path):
    two_labels = tmp_path / "two_labels"
    two_labels.mkdir()
    (two_labels / "config.json").write_text(json.dumps({"model_type": "qwen2", "id2label": {"0": "a", "1": "b"}}))
    cases = [
        ([*valid_args, "worker.reward.judge.kind=classifier"], "`worker.reward.judge.model_path` is not set"),
        (classifier_args(valid_args, two_labels), "has 2 labels; a classifier reward model has one output"),
        (classifier_args(valid_args, tmp_path / "absent"), "does not exist"),
        (classifier_args(valid_args, tiny_reward_model_path, "worker.reward.judge.score_scale=0"), "non-zero"),
        (classifier_args(valid_args, tiny_reward_model_path, "worker.reward.judge.score_transform=tanh"), "sigmoid"),
        (classifier_args(valid_args, tiny_reward_model_path, "worker.reward.judge.max_length=0"), ">= 1"),
    ]
    for args, message in cases:
        with pytest.raises(ConfigError, match=message):
            load_config(args)


def test_check_refuses_a_classifier_whose_tokenizer_has_no_chat_template(valid_args, tiny_reward_model_path, tmp_path):
    """The workers write each sample in the reward model's chat template and refuse a tokenizer without one after Ray
    and the workers started: check reads the local folder's files and says it first."""
    no_template = tmp_path / "rm_no_template"
    shutil.copytree(tiny_reward_model_path, no_template)
    (no_template / "chat_template.jinja").unlink()
    with pytest.raises(ConfigError) as refused:
        load_config(classifier_args(valid_args, no_template))
    assert str(refused.value) == (
        f"`worker.reward.judge.model_path` ({no_template}): its tokenizer has no chat template, and easyrl writes "
        "each sample as [user: prompt, assistant: response] in the reward model's own template. Give the folder a "
        "chat_template.jinja, or `chat_template` in its tokenizer_config.json (the template of the model it was "
        "trained from)."
    )
    # the loaded tokenizer agrees with the files: none here, and the template held in tokenizer_config.json is one
    assert AutoTokenizer.from_pretrained(no_template).chat_template is None
    template = (tiny_reward_model_path / "chat_template.jinja").read_text()
    tokenizer_config = json.loads((no_template / "tokenizer_config.json").read_text())
    (no_template / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "chat_template": template}))
    assert AutoTokenizer.from_pretrained(no_template).chat_template == template
    assert load_config(classifier_args(valid_args, no_template)).worker.reward.judge.model_path == str(no_template)


def test_check_refuses_a_causal_lm_as_a_classifier_and_names_the_generative_kinds(valid_args, tiny_model_path):
    with pytest.raises(ConfigError) as refused:
        load_config(classifier_args(valid_args, tiny_model_path))
    assert str(refused.value) == (
        f"`worker.reward.judge.model_path` ({tiny_model_path}) is a Qwen2ForCausalLM (a generative model), not a "
        "sequence-classification reward model (a *ForSequenceClassification with one output, as Skywork-Reward's). "
        "For a judge that writes its grade, set worker.reward.judge.kind=vllm (an engine of this model) or http (a "
        "server of it); for kind classifier, give a reward model's folder."
    )


# ----------------------------------------------------------------------------------------------------------------------
# the worker: two ranks, one FSDP2-sharded reward model
# ----------------------------------------------------------------------------------------------------------------------
MAX_LENGTH = 48


@pytest.fixture(scope="module")
def rm_workers(ray_cluster, tiny_model_path, tiny_reward_model_path):
    config = worker_config(tiny_model_path, 2, micro_batch_size=2)  # fp32 reference settings serve the reward model
    config.reward.judge.kind = "classifier"
    config.reward.judge.model_path = str(tiny_reward_model_path)
    config.reward.judge.max_length = MAX_LENGTH
    with worker_group(FSDPWorker, config, "rm", name_prefix="rm", processes=2) as group:
        group.init_model()
        yield group


# a prompt is text, or (a dataset's prompt_messages) its messages, a system prompt among them
SPELL = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Spell cat."}]
PROMPTS = ["What is 2 + 3?", "Name a prime number.", SPELL, "What is 2 + 3?", "Write a long story. " * 6]
RESPONSES = ["5", "7 is prime.", "c-a-t", "It is 6.", "Once upon a time"]


def plain_hf_scores(model_path, prompts, responses, max_length):
    """Each text alone through AutoModelForSequenceClassification (fp32, no padding): its pooled logit."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    scores, lengths = [], []
    for prompt, response in zip(prompts, responses):
        turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        messages = [*turns, {"role": "assistant", "content": response}]
        ids = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
        lengths.append(len(ids))
        ids = ids[:max_length]
        assert ids[-1] != model.config.pad_token_id  # HF pools at the last non-pad token: here, the last token
        with torch.no_grad():
            scores.append(model(torch.tensor([ids])).logits[0, 0].item())
    return torch.tensor(scores), lengths


@pytest.mark.timeout(300)
def test_worker_scores_equal_a_plain_hf_forward_of_the_same_texts(rm_workers, tiny_reward_model_path):
    texts = DataProto.from_dict(
        non_tensors={"rm_prompts": as_object_array(PROMPTS), "rm_responses": np.array(RESPONSES, dtype=object)}
    )
    scores = rm_workers.compute_rm_scores(texts).get().batch["rm_scores"]  # 5 texts: padded to 6 over 2 ranks
    expected, lengths = plain_hf_scores(tiny_reward_model_path, PROMPTS, RESPONSES, MAX_LENGTH)
    assert lengths[-1] > MAX_LENGTH >= max(lengths[:-1])  # the last text is cut, the others are whole
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)
    assert scores[0] != scores[3]  # the same prompt, another answer, another score


@pytest.mark.timeout(300)
def test_the_scorer_adds_the_mapped_reward_model_score_to_the_rule_reward(
    rm_workers, tokenizer, tiny_reward_model_path
):
    from tests.fixtures.trainer_runs import REPO_ROOT

    config = RewardConfig(
        reward_function=str(REPO_ROOT / "reward_function" / "arithmetic.py"),
        rule_weight=0.5,
        judge=JudgeConfig(
            kind="classifier", weight=2.0, model_path=str(tiny_reward_model_path), score_scale=0.5, score_offset=1.0
        ),
    )
    scorer = RewardScorer(config, tokenizer, in_process=True, reward_model_group=lambda: rm_workers)
    prompts, responses = ["5 + 7 = ?", "3 + 5 = ?"], [r"\boxed{12}", r"\boxed{7}"]
    data = judged_batch(tokenizer, prompts, responses, ["12", "8"])
    try:
        token_level_scores, metrics = scorer.score(data)
    finally:
        scorer.shutdown()
    # the reward model saw the decoded prompt and the response (eos removed with the special tokens)
    raw, _ = plain_hf_scores(tiny_reward_model_path, prompts, responses, 4096)
    judge = [1 / (1 + math.exp(-0.5 * (r - 1.0))) for r in raw.tolist()]
    assert metrics["reward/judge"] == pytest.approx(judge, abs=1e-5)
    assert metrics["reward/rule"] == pytest.approx([1.0, 0.1])  # arithmetic.py: 0.1 format + 0.9 accuracy
    overall = [0.5 * 1.0 + 2.0 * judge[0], 0.5 * 0.1 + 2.0 * judge[1]]
    assert metrics["reward/overall"] == pytest.approx(overall, abs=1e-5)
    assert token_level_scores.sum(-1).tolist() == pytest.approx(overall, abs=1e-5)
    assert metrics["reward/judge_errors"] == [0.0, 0.0]


# ----------------------------------------------------------------------------------------------------------------------
# end to end
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow  # ~75 s on 2 busy cores; the worker and scorer tests above are its fast representatives
@pytest.mark.timeout(600)
def test_two_grpo_steps_train_with_the_reward_model_in_the_reward(tiny_model_path, tiny_reward_model_path, tmp_path):
    """`easyrl train` on the tiny policy (two workers, with the reference and the KL loss) with the tiny reward model
    sharded beside them: its calls interleave with the log-prob passes in the same order on both ranks, every step's
    reward is the weighted sum of the rule reward and the reward model's sigmoid score, and every metric is finite."""
    save_dir, log_path = tmp_path / "run", tmp_path / "train.log"
    overrides = TWO_STEP_HALF_RULE_OVERRIDES + [
        "trainer.n_gpus_per_node=2",
        "algorithm.disable_kl=false",
        "algorithm.use_kl_loss=true",
        "worker.reward.judge.kind=classifier",
        "worker.reward.judge.weight=0.25",
        f"worker.reward.judge.model_path={tiny_reward_model_path}",
        "worker.reward.judge.max_length=256",
    ]
    run_training(train_args(tiny_model_path, save_dir, overrides), log_path, timeout=540)
    rows = metrics_by_step(save_dir)
    assert sorted(rows) == [1, 2]
    for step, row in rows.items():
        assert all(math.isfinite(value) for value in row.values() if isinstance(value, float)), step
        assert row["reward/overall"] == pytest.approx(0.5 * row["reward/rule"] + 0.25 * row["reward/judge"]), step
        assert row["reward/judge_errors"] == 0.0
        assert 0.0 < row["reward/judge"] < 1.0
        assert math.isfinite(row["actor/kl_loss"]), step

"""The generative judge on its own vLLM engine (worker.reward.judge.kind=vllm): a tiny random judge model (fixed seed,
its head shaped so that replies end and hold digits; easyrl/testing/tiny_judge.py) in a Ray actor, its replies read
by a regex as the HTTP judge reads them, the weighted sum with the rule reward, the config check, and a 2-step GRPO
run through `easyrl train` with the judge engine on."""

import json
import os
import re
import signal
from pathlib import Path

import pytest
import ray

from easyrl.config import ConfigError, RewardConfig, load_config
from easyrl.config.schema import JudgeConfig
from easyrl.workers.reward.judge import (
    JUDGE_SILENT_STREAK,
    REQUEST_FAILED,
    UNPARSABLE,
    JudgeEngineDied,
    JudgeUnreachableError,
    compile_score_pattern,
)
from easyrl.workers.reward.judge_engine import JudgeEngineError, VllmJudge, read_replies
from easyrl.workers.reward.scorer import RewardScorer
from easyrl.workers.rollout.vllm_rollout import kv_cache_kwargs
from tests.fixtures.trainer_runs import (
    TWO_STEP_HALF_RULE_OVERRIDES,
    actor_pids,
    kill_process_group,
    launch_training,
    log_tail,
    metrics_by_step,
    run_training,
    train_args,
    wait_for_path,
)
from tests.test_reward_judge import judged_batch


ROOT = Path(__file__).resolve().parent.parent
DIGIT = re.compile("([0-9])")


@pytest.fixture(scope="module")
def tiny_judge_path(tmp_path_factory):
    from easyrl.testing.tiny_judge import build_tiny_judge_lm

    return build_tiny_judge_lm(tmp_path_factory.mktemp("tiny_judge"))


def engine_config(model_path, template=None, **overrides) -> JudgeConfig:
    """The judge samples (temperature 1) up to 24 tokens; the last digit of its reply, 0-9, is the grade."""
    settings = {
        "kind": "vllm",
        "model_path": str(model_path),
        "prompt_template": template,
        "dtype": "fp32",
        "kv_cache_memory_bytes": 64 << 20,
        "temperature": 1.0,
        "max_tokens": 24,
        "score_pattern": DIGIT.pattern,
        "score_range": [0, 9],
    }
    return JudgeConfig(**{**settings, **overrides})


@pytest.mark.timeout(300)
def test_the_engine_judges_a_batch_and_its_replies_are_read_by_the_regex(ray_cluster, tiny_judge_path, tmp_path):
    template = tmp_path / "judge.jinja"
    template.write_text("Grade this answer to {{ prompt }}: {{ response }}")
    judge = VllmJudge(engine_config(tiny_judge_path, str(template)))
    try:
        responses = [f"{a} + {b} = {a + b}" for a, b in zip(range(11), range(3, 14))]
        responses.append("word " * 3000)  # longer than the judge model's 2048 positions
        inputs = [{"response": text, "ground_truth": ""} for text in responses]
        verdicts = judge.score(["a sum"] * len(inputs), inputs)
        # the message went through the judge model's chat template as one user turn, the assistant's turn opened
        ids = ray.get(judge.engine.encode.remote("Grade this answer to a sum: 1 + 4 = 5"))
        # the rollout's KV-cache arguments: the configured size, and on CPU the rollout's short blocks, so the
        # judge messages share their template's blocks
        cache = ray.get(
            judge.engine.__ray_call__.remote(lambda engine: engine.llm.llm_engine.vllm_config.cache_config)
        )
        # an exception inside the engine's generate (a message that is not text) is named as that exception, not as
        # a death: the engine lives on
        with pytest.raises(JudgeEngineError) as raised:
            judge.collect(judge.engine.generate.remote([None]))
        assert ray.get(judge.engine.ready.remote())
        # replies the pattern never reads, JUDGE_SILENT_STREAK batches in a row, stop the run as the http judge's do
        # (they trained on a judge share of 0 for every sample)
        judge.pattern = compile_score_pattern("(never-in-a-reply)")
        for _ in range(JUDGE_SILENT_STREAK - 1):
            assert [v.failure.kind for v in judge.score(["a sum"] * 2, inputs[:2])] == [UNPARSABLE] * 2
        with pytest.raises(JudgeUnreachableError) as silent:
            judge.score(["a sum"] * 2, inputs[:2])
        # an engine that died says so, with the key to look at, instead of scoring every sample 0; a run restarts it
        # (trainer.max_restarts): a new engine judges the next batch
        ray.kill(judge.engine, no_restart=True)
        with pytest.raises(JudgeEngineDied, match=r"judge engine \(worker.reward.judge.model_path=.*\) died while"):
            judge.score(["a sum"], inputs[:1])
        judge.pattern = compile_score_pattern(DIGIT.pattern)
        judge.restart()
        # at temperature 1 each message samples with a seed of its own: the new engine grades the first batch's
        # messages, in the reverse order, with the same replies (a resumed run's judge grades as the first run's)
        again = judge.score(["a sum"] * 11, inputs[10::-1])
    finally:
        judge.close()
    assert type(raised.value) is JudgeEngineError  # not JudgeEngineDied, which a run would restart to no end
    assert str(raised.value).startswith(
        f"The judge engine (worker.reward.judge.model_path={tiny_judge_path}) raised TypeError while judging a batch: "
    )
    message = str(silent.value)
    assert message.startswith(
        f"The judge engine (worker.reward.judge.model_path={tiny_judge_path}) gave a score to none of the samples of "
        f"{JUDGE_SILENT_STREAK} batches in a row (the last had 2; "
    )
    assert "(the last had 2; it scored earlier batches): 2 had no readable score. The first failure" in message
    assert "worker.reward.judge.score_pattern and score_range against the replies" in message
    assert cache.block_size == kv_cache_kwargs(None)["block_size"] == 32
    assert kv_cache_kwargs(64 << 20)["kv_cache_memory_bytes"] == 64 << 20
    assert kv_cache_kwargs(None)["kv_cache_memory_bytes"] == 1 << 30  # vLLM would read a share of host RAM
    assert len(verdicts) == 12
    parsed = [v for v in verdicts if v.failure is None]
    cut = [
        v for v in verdicts if v.failure and v.failure.kind == UNPARSABLE and "cut at max_tokens" in v.failure.detail
    ]
    no_digit = [v for v in verdicts if v.failure and v.failure.kind == UNPARSABLE and "no match" in v.failure.detail]
    refused = [v for v in verdicts if v.failure and v.failure.kind == REQUEST_FAILED]
    assert len(parsed) + len(cut) + len(no_digit) + len(refused) == 12
    assert parsed and no_digit  # the fixed seed gives both, so that both paths are checked
    for verdict in parsed:  # the score is what the regex reads from the engine's own text: its last digit / 9
        assert verdict.score == pytest.approx(int(DIGIT.findall(verdict.reply)[-1]) / 9)
    for verdict in no_digit:
        assert verdict.score == 0.0 and not DIGIT.search(verdict.reply)
    assert [verdicts.index(v) for v in refused] == [11]
    assert [v.reply for v in again] == [v.reply for v in verdicts[10::-1]]
    assert len({v.reply for v in again}) > 1  # sampled, not one greedy reply
    assert "the judge model takes 2047 at most" in refused[0].failure.detail
    from easyrl.testing.tiny_models import tiny_tokenizer

    chat = tiny_tokenizer().apply_chat_template(
        [{"role": "user", "content": "Grade this answer to a sum: 1 + 4 = 5"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert chat.endswith("<|im_start|>assistant\n")
    assert ids == tiny_tokenizer()(chat, add_special_tokens=False)["input_ids"]


@ray.remote
class ActorThatFails:
    """Stands in for the engine's actor: its `generate` raises (the actor lives on) or ends its process."""

    def generate(self, messages: list[str]) -> list:
        raise ValueError(f"cannot judge {len(messages)} messages")

    def exit(self) -> None:
        os._exit(1)


@pytest.mark.timeout(120)
def test_an_exception_in_generate_is_named_and_only_a_dead_engine_counts_as_died(ray_cluster):
    """An exception the engine's `generate` raises is a JudgeEngineError naming it: no restart (trainer.max_restarts)
    can help, the same batch would raise it again. Only an actor whose process is gone is JudgeEngineDied."""
    actor = ActorThatFails.remote()
    with pytest.raises(JudgeEngineError) as raised:
        read_replies(actor.generate.remote(["a", "b"]), "/models/judge")
    with pytest.raises(JudgeEngineDied) as died:
        read_replies(actor.exit.remote(), "/models/judge")
    assert type(raised.value) is JudgeEngineError  # not its subclass JudgeEngineDied, which the trainer restarts
    assert str(raised.value) == (
        "The judge engine (worker.reward.judge.model_path=/models/judge) raised ValueError while judging a batch: "
        "cannot judge 2 messages. The engine did not die, and restarting it (trainer.max_restarts) would meet the "
        "same error: fix the judge model or its settings (worker.reward.judge.*)."
    )
    assert str(died.value).startswith(
        "the judge engine (worker.reward.judge.model_path=/models/judge) died while judging a batch: "
    )


@pytest.mark.slow  # vLLM's import in a fresh actor (~20 s)
@pytest.mark.timeout(300)
def test_an_engine_that_cannot_start_names_the_model_path(ray_cluster, tmp_path):
    with pytest.raises(JudgeEngineError, match=r"judge engine \(worker.reward.judge.model_path=.*\) failed to start"):
        VllmJudge(engine_config(tmp_path))  # an empty folder: no config.json


@pytest.mark.slow  # a second engine start (~30 s); the weighted sum itself is tested with the HTTP judge
@pytest.mark.timeout(300)
def test_the_scorer_adds_the_engine_grade_to_the_rule_reward(ray_cluster, tiny_judge_path, tokenizer):
    config = RewardConfig(
        reward_function=str(ROOT / "reward_function" / "arithmetic.py"),
        rule_weight=0.5,
        judge=engine_config(tiny_judge_path, weight=2.0),
    )
    scorer = RewardScorer(config, tokenizer, in_process=True)
    prompts, truths = ["5 + 7 = ?", "3 + 5 = ?", "1 + 2 = ?", "2 + 2 = ?"], ["12", "8", "3", "4"]
    responses = [r"\boxed{12}", r"\boxed{7}", "no idea", r"\boxed{4}"]
    try:
        token_level_scores, metrics = scorer.score(judged_batch(tokenizer, prompts, responses, truths))
    finally:
        scorer.shutdown()
    # rule (arithmetic.py): 0.1 x format + 0.9 x accuracy
    assert metrics["reward/rule"] == pytest.approx([1.0, 0.1, 0.0, 1.0])
    judge = metrics["reward/judge"]
    assert all(0.0 <= score <= 1.0 for score in judge)
    assert metrics["reward/overall"] == pytest.approx(
        [0.5 * r + 2.0 * j for r, j in zip(metrics["reward/rule"], judge)]
    )
    assert token_level_scores.sum(-1).tolist() == pytest.approx(metrics["reward/overall"])
    assert len(metrics["reward/judge_errors"]) == 4
    # a failed sample scores 0: every judge error has judge score 0
    assert all(score == 0.0 for score, error in zip(judge, metrics["reward/judge_errors"]) if error)


def vllm_judge_args(valid_args, *extra):
    return [*valid_args, "worker.reward.judge.kind=vllm", *extra]


def test_check_accepts_a_judge_engine_and_refuses_one_it_cannot_run(valid_args, tmp_path):
    config = load_config(vllm_judge_args(valid_args, "worker.reward.judge.model_path=builtin://SmolLM2-135M-Instruct"))
    assert config.worker.reward.judge.num_gpus == 0  # a CPU engine unless told
    judge = tmp_path / "judge"  # a model folder as far as the check reads it
    judge.mkdir()
    (judge / "config.json").write_text("{}")
    for extra, message in [
        ([], "`worker.reward.judge.model_path` is not set"),
        ([f"worker.reward.judge.model_path={tmp_path / 'nowhere'}"], "does not exist"),
        (["worker.reward.judge.model_path=builtin://Nope"], "unknown built-in model"),
        ([f"worker.reward.judge.model_path={judge}", "worker.reward.judge.dtype=int8"], "which is not one of"),
        ([f"worker.reward.judge.model_path={judge}", "worker.reward.judge.num_gpus=-1"], "must be >= 0"),
        ([f"worker.reward.judge.model_path={judge}", "worker.reward.judge.num_gpus=1"], "has no NVIDIA GPU"),
        ([f"worker.reward.judge.model_path={judge}", "worker.reward.judge.score_pattern=x"], "0 groups"),
        ([f"worker.reward.judge.model_path={tmp_path}"], "holds no config.json"),
        ([f"worker.reward.judge.model_path={judge}", "worker.reward.judge.max_model_len=0"], "must be >= 1"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(vllm_judge_args(valid_args, *extra))
    # a CPU engine's KV cache must hold one request of its context, or vLLM refuses to start it: said before Ray
    # starts, with what fits (SmolLM2-135M's shape: 30 layers x 3 key-value heads x 64, 8192 positions)
    shaped = tmp_path / "smollm2_shaped"
    shaped.mkdir()
    (shaped / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 30,
                "num_attention_heads": 9,
                "num_key_value_heads": 3,
                "hidden_size": 576,
                "max_position_embeddings": 8192,
            }
        )
    )
    small_cache = [f"worker.reward.judge.model_path={shaped}", "worker.reward.judge.kv_cache_memory_bytes=67108864"]
    per_token = 2 * 30 * 3 * 64 * 2  # bf16: 23040 bytes, 0.18 GiB for 8192 tokens
    with pytest.raises(ConfigError) as refused:
        load_config(vllm_judge_args(valid_args, *small_cache))
    assert str(refused.value) == (
        "the judge engine's KV cache (`worker.reward.judge.kv_cache_memory_bytes`: 0.06 GiB) cannot hold one request "
        f"of its context (8192 tokens of {shaped} x {per_token} bytes in bf16 = 0.18 GiB), and the engine would refuse "
        "to start. Set worker.reward.judge.max_model_len to what a judge message and its reply need (at most "
        f"{(64 << 20) // per_token} tokens fit), or give worker.reward.judge.kv_cache_memory_bytes at least "
        f"{8192 * per_token}."
    )
    config = load_config(vllm_judge_args(valid_args, *small_cache, "worker.reward.judge.max_model_len=2048"))
    assert config.worker.reward.judge.max_model_len == 2048
    load_config(vllm_judge_args(valid_args, f"worker.reward.judge.model_path={shaped}"))  # 1 GiB holds it


def test_check_refuses_a_sequence_classification_model_as_a_generative_judge(valid_args, tmp_path):
    """vLLM loads a *ForSequenceClassification as a pooling model, whose generate raises at the first batch, after
    Ray, the workers and a rollout: check reads the local folder's architectures and points to kind classifier."""
    from easyrl.testing.tiny_models import build_tiny_reward_model

    reward_model = build_tiny_reward_model(tmp_path / "rm")
    with pytest.raises(ConfigError) as refused:
        load_config(vllm_judge_args(valid_args, f"worker.reward.judge.model_path={reward_model}"))
    assert str(refused.value) == (
        f"`worker.reward.judge.model_path` ({reward_model}) is a Qwen2ForSequenceClassification, a reward model that "
        "scores a text and writes none, and a kind vllm judge generates its grade as text. Set "
        "worker.reward.judge.kind=classifier to score with it, or give a generative judge model (a *ForCausalLM)."
    )


def judge_engine_run_overrides(judge_path) -> list[str]:
    """Two tiny GRPO steps on one worker whose reward is 0.5 x rule + 0.25 x the tiny judge's grade."""
    return TWO_STEP_HALF_RULE_OVERRIDES + [
        "worker.reward.judge.kind=vllm",
        "worker.reward.judge.weight=0.25",
        f"worker.reward.judge.model_path={judge_path}",
        "worker.reward.judge.dtype=fp32",
        "worker.reward.judge.kv_cache_memory_bytes=67108864",
        "worker.reward.judge.temperature=1.0",
        "worker.reward.judge.max_tokens=24",
        "worker.reward.judge.score_pattern=([0-9])",
        "worker.reward.judge.score_range=[0,9]",
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_grpo_steps_train_with_the_judge_engine_in_the_reward(tiny_model_path, tiny_judge_path, tmp_path):
    """`easyrl train` on the tiny model (one worker) with the tiny judge's engine in its own actor: every step's
    reward is the weighted sum of the rule reward and the engine's grade, every sample judged or counted."""
    save_dir, log_path = tmp_path / "run", tmp_path / "train.log"
    overrides = judge_engine_run_overrides(tiny_judge_path)
    run_training(train_args(tiny_model_path, save_dir, overrides), log_path, timeout=540)
    rows = metrics_by_step(save_dir)
    assert sorted(rows) == [1, 2]
    for step, row in rows.items():
        # 4 prompts x 4 samples per step; the means combine like the samples: 0.5 x rule + 0.25 x judge
        assert row["reward/overall"] == pytest.approx(0.5 * row["reward/rule"] + 0.25 * row["reward/judge"]), step
        assert 0.0 <= row["reward/judge"] <= 1.0
        assert 0 <= row["reward/judge_errors"] <= 16 and row["reward/judge_errors"] == int(row["reward/judge_errors"])
        assert all(value == value and abs(value) != float("inf") for value in row.values() if isinstance(value, float))
    # the engine's own output went to the run's logs, not to the console
    assert "Qwen2ForCausalLM" in (save_dir / "logs" / "judge_engine_0.log").read_text()
    assert "Qwen2ForCausalLM" not in log_path.read_text()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_judge_engine_killed_mid_run_is_restarted_with_the_workers_and_the_run_finishes(
    tiny_model_path, tiny_judge_path, tmp_path
):
    """trainer.max_restarts covers the judge's engine as it covers a training worker: SIGKILL of the engine (what
    the out-of-memory killer sends) after step 1's checkpoint, and the run starts its workers and a new engine,
    resumes from its last checkpoint and trains every step with the judge's grades."""
    save_dir, log_path = tmp_path / "run", tmp_path / "train.log"
    overrides = [
        *judge_engine_run_overrides(tiny_judge_path),
        "trainer.max_steps=3",
        "trainer.save_model_only=false",
        "trainer.save_freq=1",
        "trainer.max_restarts=1",
    ]
    proc = launch_training(train_args(tiny_model_path, save_dir, overrides), log_path)
    try:
        wait_for_path(save_dir / "global_step_1" / "COMPLETE", proc, log_path, timeout=900)
        (engine,) = actor_pids(proc.pid, "JudgeEngine")
        os.kill(engine, signal.SIGKILL)
        returncode = proc.wait(timeout=1200)
    finally:
        kill_process_group(proc)
    assert returncode == 0, log_tail(log_path)
    text = log_path.read_text(errors="replace")
    assert f"the judge engine (worker.reward.judge.model_path={tiny_judge_path}) died while judging a batch" in text
    assert re.search(rf"Restarting every worker and resuming from {re.escape(str(save_dir))}/global_step_\d", text)
    rows = metrics_by_step(save_dir)
    assert sorted(rows) == [1, 2, 3]
    assert rows[1]["trainer/restarts"] == 0 and rows[3]["trainer/restarts"] == 1
    for step in (2, 3):
        assert rows[step]["reward/overall"] == pytest.approx(
            0.5 * rows[step]["reward/rule"] + 0.25 * rows[step]["reward/judge"]
        )

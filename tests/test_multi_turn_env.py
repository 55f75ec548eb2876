"""Multi-turn rollouts with an environment (worker.rollout.multi_turn.env): reset with the prompt's row, a step per
model turn, observations as user messages out of response_mask, summed rewards handed to the reward function, and a
raising or hanging reset/step counted and ending its trajectory only. The turn bookkeeping runs with a scripted turn
source; the real engine path (the tiny model in the FSDP worker, log-probs against the actor) is a slow test."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.config import ConfigError, RewardConfig, load_config
from easyrl.config.schema import MultiTurnConfig
from easyrl.workers.rollout.base import rollout_logprob_mismatch
from easyrl.workers.rollout.env_failures import ENV_ERROR_KEY, EnvFailureWatch, EnvironmentFailedError
from easyrl.workers.rollout.multi_turn import MultiTurnRollout
from easyrl.workers.tool_files import load_env_class
from tests.rollout_helpers import PROMPT_LENGTH, make_prompts, rollout_worker_config
from tests.test_multi_turn import LOGPROB_TOLERANCE, _runs, scripted_engine


ROOT = Path(__file__).resolve().parent.parent
STEP_TIMEOUT = 0.5

# The environment reads its task from the row (ground_truth): "7" answers once then is done, "never" never is done,
# "boom" raises in step, "hang" hangs in step, "bad_reset" raises in reset.
SCRIPTED_ENV = """
import time


class ScriptedEnv:
    def reset(self, row):
        self.task, self.steps = row["ground_truth"], 0
        if self.task == "bad_reset":
            raise ValueError("no such task")

    def step(self, action_text):
        self.steps += 1
        if self.task == "boom":
            raise RuntimeError("boom")
        if self.task == "hang":
            time.sleep(30)
        if self.task == "7" and self.steps == 2:
            return "bye", 1.0, True
        return f"obs {self.steps} {self.task}", 0.5, False
"""


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "scripted_env.py"
    path.write_text(SCRIPTED_ENV)
    return f"{path}:ScriptedEnv"


def _with_truths(prompts, truths):
    prompts.non_tensor_batch["ground_truth"] = np.array(truths, dtype=object)
    return prompts


def _scripted_env_rollout(tokenizer, env, turns, max_turns, response_length=128):
    engine, llm = scripted_engine(tokenizer, turns, response_length)
    multi_turn = MultiTurnConfig(env=env, max_turns=max_turns, tool_timeout=STEP_TIMEOUT)
    return MultiTurnRollout(engine, multi_turn), llm


def _fine_rollout(tokenizer, env, trajectories, max_turns, turns=None):
    """A scripted rollout whose ``trajectories`` each answer "Fine." at every one of their ``turns`` (max_turns)."""
    turn = tokenizer.encode("Fine.", add_special_tokens=False) + [tokenizer.eos_token_id]
    script = {i: [turn] * (turns or max_turns) for i in range(trajectories)}
    return _scripted_env_rollout(tokenizer, env, script, max_turns=max_turns)[0]


def test_env_observations_are_user_turns_out_of_the_mask_and_failures_end_only_their_trajectory(tokenizer, env_file):
    from easyrl.workers.reward.scorer import RewardScorer

    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    turn = encode("Fine.") + [tokenizer.eos_token_id]
    truths = ["7", "boom", "hang", "never", "bad_reset"]
    rollout, llm = _scripted_env_rollout(tokenizer, env_file, {i: [turn] * 3 for i in range(5)}, max_turns=3)
    out = rollout.generate_sequences(_with_truths(make_prompts(tokenizer, ["a", "b", "c", "d", "e"]), truths))
    observation = lambda text: encode(f"\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")  # noqa: E731
    # (tokens, is the model's) segments of each trajectory
    segments = {
        0: [(turn, 1), (observation("obs 1 7"), 0), (turn, 1)],  # done at its second step: "bye" is not appended
        1: [(turn, 1)],
        2: [(turn, 1)],
        3: [(turn, 1), (observation("obs 1 never"), 0), (turn, 1), (observation("obs 2 never"), 0), (turn, 1)],
        4: [(turn, 1)],
    }
    for row, parts in segments.items():
        tokens = [token for ids, _ in parts for token in ids]
        length = int(out.batch["attention_mask"][row, PROMPT_LENGTH:].sum())
        assert out.batch["responses"][row, :length].tolist() == tokens, row
        assert out.batch["response_mask"][row].tolist() == [model for ids, model in parts for _ in ids] + [0] * (
            128 - length
        ), row
    log_probs = out.batch["rollout_log_probs"][0, : 2 * len(turn) + len(observation("obs 1 7"))]
    want = [-0.1] * len(turn) + [0.0] * len(observation("obs 1 7")) + [-0.2] * len(turn)
    torch.testing.assert_close(log_probs, torch.tensor(want))
    assert len(llm.seen) == 3 and [len(s) for s in llm.seen] == [5, 2, 1]  # failed and done trajectories stop
    assert out.non_tensor_batch["env_reward"].tolist() == [1.5, 0.0, 0.0, 1.5, 0.0]
    messages = out.non_tensor_batch["messages"]
    assert [m["role"] for m in messages[0]] == ["assistant", "user", "assistant", "user"]
    assert messages[0][3] == {"role": "user", "content": "bye"}  # recorded for the reward function, not tokenized
    assert messages[1][-1]["content"] == f"Error: {env_file} step raised RuntimeError: boom."
    assert messages[2][-1]["content"] == f"Error: {env_file} step took longer than 0.5 s."
    # the model's one turn, then the failed reset's error, which the model never read
    assert [m["role"] for m in messages[4]] == ["assistant", "user"]
    assert messages[4][1]["content"] == f"Error: {env_file} reset raised ValueError: no such task."
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/multi_turn/env_errors"] == 3 and metrics["rollout/multi_turn/env_timeouts"] == 1
    assert metrics["rollout/multi_turn/max_turns_reached"] == 1 and metrics["rollout/multi_turn/turns/max"] == 3
    assert metrics["rollout/multi_turn/env_reward/mean"] == pytest.approx(0.6)  # (1.5 + 1.5) / 5
    assert metrics["rollout/multi_turn/turns/mean"] == pytest.approx((2 + 1 + 1 + 3 + 1) / 5)
    # the reward function gets the summed rewards; reward_function/env_reward.py scores with them alone
    scorer = RewardScorer(
        RewardConfig(reward_function=str(ROOT / "reward_function" / "env_reward.py")), tokenizer, in_process=True
    )
    assert [item["env_reward"] for item in scorer.build_inputs(out)] == [1.5, 0.0, 0.0, 1.5, 0.0]
    scores, _ = scorer.score(out)
    assert scores.sum(-1).tolist() == [1.5, 0.0, 0.0, 1.5, 0.0]


# What step returns for each task (the row's ground_truth): "nan", "text" and "done_text" break the contract; "numpy"
# (numpy's float and bool) keeps it; "late_nan" is rewarded 1.0 on its first step, then returns NaN; "gymnasium" and
# "gym_terminated" return Gymnasium's 5-tuple, "four" gym's old 4-tuple.
BAD_OUTPUT_ENV = """
import numpy as np


class BadOutputEnv:
    def reset(self, row):
        self.task, self.steps = row["ground_truth"], 0

    def step(self, action_text):
        self.steps += 1
        if self.task == "nan" or (self.task == "late_nan" and self.steps == 2):
            return "obs", float("nan"), False
        if self.task == "text":
            return "obs", "0.5", False
        if self.task == "done_text":
            return "obs", 0.5, "False"
        if self.task == "numpy":
            return "obs", np.float32(0.25), np.bool_(self.steps == 2)
        if self.task == "gymnasium":  # truncated at its second step
            return f"obs {self.steps}", 1.0, False, self.steps == 2, {"steps": self.steps}
        if self.task == "gym_terminated":
            return "obs", 0.5, True, False, {}
        if self.task == "four":  # gym's old (observation, reward, done, info)
            return "obs", 1.0, False, {}
        return "obs", 1.0, False
"""


def test_a_step_returning_a_bad_reward_or_done_is_an_environment_error_and_zeroes_the_reward(tokenizer, tmp_path):
    path = tmp_path / "bad_output_env.py"
    path.write_text(BAD_OUTPUT_ENV)
    spec = f"{path}:BadOutputEnv"
    truths = ["nan", "text", "done_text", "numpy", "late_nan"]
    rollout = _fine_rollout(tokenizer, spec, 5, max_turns=3)
    out = rollout.generate_sequences(_with_truths(make_prompts(tokenizer, list("abcde")), truths))
    errors = [messages[-1]["content"] for messages in out.non_tensor_batch["messages"]]
    assert errors[0] == f"Error: {spec} step returned reward nan; reward must be a finite number."
    assert errors[1] == f"Error: {spec} step returned reward '0.5' (str); reward must be a finite number."
    assert errors[2] == f"Error: {spec} step returned done 'False' (str); done must be True or False."
    assert errors[4] == errors[0]
    assert out.non_tensor_batch["env_reward"].tolist() == [0.0, 0.0, 0.0, 0.5, 0.0]  # numpy's values are fine
    assert [len(m) for m in out.non_tensor_batch["messages"]] == [2, 2, 2, 4, 4]  # failures end their trajectory
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/multi_turn/env_errors"] == 4 and metrics["rollout/multi_turn/env_timeouts"] == 0
    assert metrics["rollout/multi_turn/env_reward/mean"] == pytest.approx(0.1)


def test_a_step_may_return_gymnasiums_five_tuple_done_when_terminated_or_truncated(tokenizer, tmp_path):
    path = tmp_path / "bad_output_env.py"
    path.write_text(BAD_OUTPUT_ENV)
    spec = f"{path}:BadOutputEnv"
    rollout = _fine_rollout(tokenizer, spec, 3, max_turns=3)
    prompts = make_prompts(tokenizer, list("abc"))
    out = rollout.generate_sequences(_with_truths(prompts, ["gymnasium", "gym_terminated", "four"]))
    messages = out.non_tensor_batch["messages"]
    assert [m["content"] for m in messages[0]] == ["Fine.", "obs 1", "Fine.", "obs 2"]  # truncated at step 2
    assert [m["content"] for m in messages[1]] == ["Fine.", "obs"]  # terminated at step 1
    assert messages[2][-1]["content"] == (
        f"Error: {spec} step returned a tuple of 4 items; it must return (observation, reward, done), or "
        "Gymnasium's (observation, reward, terminated, truncated, info)."
    )
    assert out.non_tensor_batch["env_reward"].tolist() == [2.0, 0.5, 0.0]
    assert out.meta_info["metrics"]["rollout/multi_turn/env_errors"] == 1


def test_a_stepped_environment_reads_its_prompts_seed_in_the_row(tokenizer, tmp_path):
    """The row a stepped environment is reset with carries `seed`: the same for the samples of a prompt, another for
    each prompt (a column of that name is the row's own)."""
    from easyrl.workers.rollout.base import GenerationRequest

    path = tmp_path / "seed_env.py"
    path.write_text(
        "class SeedEnv:\n"
        "    def reset(self, row):\n"
        "        self.seed = row['seed']\n"
        "    def step(self, action_text):\n"
        "        return str(self.seed), 0.0, True\n"
    )
    rollout = _fine_rollout(tokenizer, f"{path}:SeedEnv", 6, max_turns=1, turns=2)
    request = GenerationRequest(sampling_override={"n": 2}, seed=[1, 0, 3, 0])
    out = rollout.generate_sequences(make_prompts(tokenizer, ["a", "b", "c"]), request)
    seeds = [messages[-1]["content"] for messages in out.non_tensor_batch["messages"]]
    assert seeds[0::2] == seeds[1::2] and len(set(seeds)) == 3 and all(s.isdigit() for s in seeds), seeds
    prompts = make_prompts(tokenizer, ["a", "b", "c"])
    prompts.non_tensor_batch["seed"] = np.array([4, 4, 9], dtype=object)
    out = rollout.generate_sequences(prompts, request)
    assert [m[-1]["content"] for m in out.non_tensor_batch["messages"]] == ["4", "4", "4", "4", "9", "9"]


def test_a_stepped_environment_gets_the_rows_other_columns(tokenizer, tmp_path):
    """A task's parameters (a level, a target) live in columns of their own, as verl and gym users keep them; the
    dataset carries them for an environment and reset finds them in its row beside ground_truth."""
    from easyrl.config import DataConfig
    from easyrl.data.collate import collate_fn
    from easyrl.data.dataset import RLHFDataset
    from easyrl.workers.rollout.base import GenerationRequest

    path = tmp_path / "level_env.py"
    path.write_text(
        "class LevelEnv:\n"
        "    def reset(self, row):\n"
        "        self.said = f\"{row['mode']}/{row['ground_truth']}/{row['answer']}\"\n"
        "    def step(self, action_text):\n"
        "        return self.said, 0.0, True\n"
    )
    rows = [{"problem": "p0", "answer": "1", "mode": "easy"}, {"problem": "p1", "answer": "2", "mode": "hard"}]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = DataConfig(prompt_key="problem", answer_key="answer", max_prompt_length=64)
    dataset = RLHFDataset(str(data), tokenizer, None, config, carry_columns=True)
    prompts = collate_fn([dataset[0], dataset[1]])
    rollout = _fine_rollout(tokenizer, f"{path}:LevelEnv", 4, max_turns=2)
    out = rollout.generate_sequences(prompts, GenerationRequest(sampling_override={"n": 1}, seed=[1, 0, 0]))
    said = [messages[-1]["content"] for messages in out.non_tensor_batch["messages"]]
    assert said == ["easy/1/1", "hard/2/2"], said


def test_env_class_is_loaded_from_path_and_name(env_file, tmp_path):
    assert load_env_class(env_file).__name__ == "ScriptedEnv"
    with pytest.raises(ValueError, match="give it as path/to/file.py:ClassName"):
        load_env_class(env_file.rpartition(":")[0])
    with pytest.raises(ValueError, match="must be a class with `reset\\(row\\)` and `step\\(action_text\\)`"):
        load_env_class(env_file.replace(":ScriptedEnv", ":time"))


def test_check_accepts_an_env_and_refuses_a_bad_one_naming_the_key(valid_args, env_file):
    config = load_config([*valid_args, f"worker.rollout.multi_turn.env={env_file}"])
    assert config.worker.rollout.multi_turn.enabled and config.worker.rollout.multi_turn.env == env_file
    path = env_file.rpartition(":")[0]
    cases = [
        ([f"worker.rollout.multi_turn.env={path}:Nope"], f"`{path}` defines no `Nope`"),
        ([f"worker.rollout.multi_turn.env={path}"], "give it as path/to/file.py:ClassName"),
        ([f"worker.rollout.multi_turn.env={path}x:E"], f"`worker.rollout.multi_turn.env`: file `{path}x` does not"),
        (
            [
                f"worker.rollout.multi_turn.env={env_file}",
                f"worker.rollout.multi_turn.tools={ROOT / 'tools/calculator.py'}",
            ],
            "and `worker.rollout.multi_turn.tools` are both set",
        ),
        ([f"worker.rollout.multi_turn.env={env_file}", "worker.rollout.name=hf"], "vllm engine only"),
    ]
    for args, message in cases:
        with pytest.raises(ConfigError) as error:
            load_config([*valid_args, *args])
        assert message in str(error.value)


# ----------------------------------------------------------------------------------------------------------------------
# the real engine in the FSDP worker
# ----------------------------------------------------------------------------------------------------------------------
ENGINE_ENV = """
class CountingEnv:
    def reset(self, row):
        self.steps = 0

    def step(self, action_text):
        self.steps += 1
        return f"step {self.steps}", 0.25, False
"""


@pytest.fixture(scope="module")
def env_worker(ray_cluster, tiny_model_path, tmp_path_factory):
    from easyrl.workers.fsdp_worker import FSDPWorker
    from tests.fsdp_helpers import worker_group

    env_path = tmp_path_factory.mktemp("env") / "counting_env.py"
    env_path.write_text(ENGINE_ENV)
    config = rollout_worker_config(tiny_model_path, 1)
    rollout = config.rollout
    rollout.response_length = 96
    rollout.max_model_len = PROMPT_LENGTH + rollout.response_length
    rollout.multi_turn = MultiTurnConfig(env=f"{env_path}:CountingEnv", max_turns=3, turn_max_tokens=6, tool_timeout=5)
    with worker_group(
        FSDPWorker, config, "actor_rollout", name_prefix="multiturnenv", process_group_timeout_s=240
    ) as group:
        group.init_model()
        yield group


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_engine_env_trajectories_mask_the_observations_and_match_the_actor(env_worker, tokenizer):
    from easyrl.workers.rollout.base import GenerationRequest

    prompts = make_prompts(tokenizer)
    prompts.non_tensor_batch["ground_truth"] = np.array(["x"] * len(prompts), dtype=object)
    out = env_worker.generate_sequences(prompts, GenerationRequest(sampling_override={"n": 2}, seed=3))
    batch = out.batch
    for row in range(len(out)):
        length = int(batch["attention_mask"][row, PROMPT_LENGTH:].sum())
        mask = batch["response_mask"][row, :length].tolist()
        tokens = batch["responses"][row, :length].tolist()
        model_runs = [(s, e) for v, s, e in _runs(mask) if v == 1]
        observation_runs = [(s, e) for v, s, e in _runs(mask) if v == 0]
        assert len(model_runs) == 3 and all(e - s <= 6 for s, e in model_runs)  # max_turns=3, turn_max_tokens=6
        for index, (s, e) in enumerate(observation_runs):
            text = tokenizer.decode(tokens[s:e])
            assert text.endswith(f"<|im_start|>user\nstep {index + 1}<|im_end|>\n<|im_start|>assistant\n"), text
    assert out.non_tensor_batch["env_reward"].tolist() == [0.75] * len(out)  # 3 steps of 0.25
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/multi_turn/turns/mean"] == 3 and metrics["rollout/multi_turn/env_errors"] == 0
    actor = env_worker.compute_log_probs(out).batch["old_log_probs"]
    mismatch = rollout_logprob_mismatch(actor, batch["rollout_log_probs"], batch["response_mask"])
    print(f"environment rollout vs actor log-prob |diff|: {mismatch}")
    assert mismatch["rollout/logprob_abs_diff/max"] < LOGPROB_TOLERANCE


def test_the_trainer_hands_the_whole_row_to_the_rollout_when_an_env_is_set(tokenizer):
    from easyrl.config import PPOConfig
    from easyrl.trainer.ray_trainer import PPOTrainer

    prompts = _with_truths(make_prompts(tokenizer, ["a"]), ["7"])
    prompts.non_tensor_batch["data_source"] = np.array(["arith"], dtype=object)
    config = PPOConfig()
    trainer = SimpleNamespace(config=config)
    assert PPOTrainer._generation_non_tensor_keys(trainer, prompts) == ["raw_prompt_ids"]
    config.worker.rollout.multi_turn.env = "env.py:Env"
    keys = PPOTrainer._generation_non_tensor_keys(trainer, prompts)
    assert keys == ["raw_prompt_ids", "ground_truth", "data_source"]


# ----------------------------------------------------------------------------------------------------------------------
# a run: GRPO with an environment through `easyrl train`
# ----------------------------------------------------------------------------------------------------------------------
ARITHMETIC_ENV = """
class ArithmeticEnv:
    def reset(self, row):
        self.answer = str(row["ground_truth"]).strip()

    def step(self, action_text):
        if self.answer in action_text:
            return "Correct.", 1.0, True
        return "Not yet: check your arithmetic and answer again.", 0.0, False
"""


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_grpo_steps_with_an_environment(tmp_path):
    """The calculator recipe with an environment instead of the tools (the answer in a turn earns 1, else the model
    is told to try again) and env_reward.py as the reward, 4 prompts x 4 samples, 2 steps."""
    from tests.fixtures.trainer_runs import REPO_ROOT, small_tools_run, train_for_metrics

    env_path = tmp_path / "arith_env.py"
    env_path.write_text(ARITHMETIC_ENV)
    args = small_tools_run(
        2,
        tmp_path / "checkpoints",
        "worker.rollout.multi_turn.tools=",
        f"worker.rollout.multi_turn.env={env_path}:ArithmeticEnv",
        f"worker.reward.reward_function={REPO_ROOT / 'reward_function' / 'env_reward.py'}:compute_score",
    )
    val = tmp_path / "val.jsonl"
    val.write_text("".join(f'{{"problem": "What is {a} + 2?", "answer": "{a + 2}"}}\n' for a in range(3)))
    metrics = train_for_metrics([*args, f"data.val_files={val}", "trainer.val_before_train=true"], tmp_path, 2)
    for step in (1, 2):
        row = metrics[step]
        assert row["rollout/multi_turn/env_errors"] == 0  # reset got the row's ground_truth
        assert 1 <= row["rollout/multi_turn/turns/mean"] <= 3
        # the reward is the environment's, summed per trajectory
        assert row["reward/overall"] == pytest.approx(row["rollout/multi_turn/env_reward/mean"])
    # validation keeps its own multi-turn counts
    first = metrics[0]
    assert first["val/multi_turn/env_errors"] == 0 and 1 <= first["val/multi_turn/turns/mean"] <= 3
    assert first["val/reward/overall"] == pytest.approx(first["val/multi_turn/env_reward/mean"])


# ----------------------------------------------------------------------------------------------------------------------
# `easyrl generate` / `easyrl eval`: the same multi-turn rollout, with whole rows
# ----------------------------------------------------------------------------------------------------------------------
def test_generate_hands_whole_rows_to_the_environment_and_writes_whole_trajectories(tokenizer, env_file, tmp_path):
    import json

    from easyrl.config import PPOConfig
    from easyrl.trainer.generate import generate_to_file
    from easyrl.workers.rollout.base import GenerationRequest

    rollout = _fine_rollout(tokenizer, env_file, 2, max_turns=3)
    prompts = _with_truths(make_prompts(tokenizer, ["a", "b"]), ["7", "never"])
    prompts.non_tensor_batch["data_source"] = np.array(["x", "x"], dtype=object)
    config = PPOConfig()
    config.worker.rollout.multi_turn.env = env_file
    path = tmp_path / "generations.jsonl"
    summary = generate_to_file(
        SimpleNamespace(config=config),
        tokenizer,
        [prompts],
        rollout,
        None,
        str(path),
        lambda _: GenerationRequest(),
        1,
    )
    assert summary.generated == 2
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    # reset read ground_truth ("7": done at the second step; "never": three turns); the observations are in the text
    assert rows[0]["responses"] == ["Fine.\nuser\nobs 1 7\nassistant\nFine."]
    assert rows[1]["responses"] == ["Fine.\nuser\nobs 1 never\nassistant\nFine.\nuser\nobs 2 never\nassistant\nFine."]


def test_the_rollouts_pictures_replace_the_prompts_when_the_batch_is_joined(tokenizer):
    from easyrl.trainer.ray_trainer import join_rollout_output

    prompts = make_prompts(tokenizer, ["a"])
    prompts.non_tensor_batch["multi_modal_data"] = np.array([{"images": ["prompt picture"]}], dtype=object)
    generated = make_prompts(tokenizer, ["a"])
    generated.batch["responses"] = torch.ones(1, 3, dtype=torch.long)
    generated.non_tensor_batch["multi_modal_data"] = np.array(
        [{"images": ["prompt picture", "tool picture"]}], dtype=object
    )
    joined = join_rollout_output(prompts, generated)
    assert joined.non_tensor_batch["multi_modal_data"][0] == {"images": ["prompt picture", "tool picture"]}
    assert joined.batch["responses"].tolist() == [[1, 1, 1]]


# __init__ slower than tool_timeout (a sandbox starting), close() releasing what it holds (Gymnasium's name)
SLOW_CLOSED_ENV = """
import time

BUILT, CLOSED = [], []


class SandboxEnv:
    def __init__(self):
        time.sleep(0.8)
        BUILT.append(self)

    def reset(self, row):
        if row["ground_truth"] == "bad_reset":
            raise ValueError("no such task")

    def step(self, action_text):
        return "ok", 1.0, True

    def close(self):
        CLOSED.append(self)
"""


def _wait_for(condition, seconds=5.0):
    """close() runs in a daemon thread: wait a moment for it."""
    import time

    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_an_environment_built_slower_than_tool_timeout_works_and_every_instance_is_closed(tokenizer, tmp_path, caplog):
    """__init__ ran inside the reset's deadline, so an environment that takes longer to build than tool_timeout failed
    every trajectory of every step (blamed on reset), and no instance was ever closed: a subprocess or sandbox per
    trajectory per step piled up until the worker exited."""
    import logging

    path = tmp_path / "sandbox_env.py"
    path.write_text(SLOW_CLOSED_ENV)
    spec = f"{path}:SandboxEnv"
    module = load_env_class(spec).__init__.__globals__
    turn = tokenizer.encode("42", add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, _ = scripted_engine(tokenizer, {i: [turn] for i in range(3)}, response_length=16)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=spec, max_turns=2, tool_timeout=STEP_TIMEOUT))
    prompts = _with_truths(make_prompts(tokenizer, ["a", "b", "c"]), ["1", "2", "bad_reset"])
    with caplog.at_level(logging.WARNING, logger="easyrl.workers.rollout.multi_turn"):
        out = rollout.generate_sequences(prompts)
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/multi_turn/env_timeouts"] == 0 and metrics["rollout/multi_turn/env_errors"] == 1
    assert out.non_tensor_batch["env_reward"].tolist() == [1.0, 1.0, 0.0]
    assert len(module["BUILT"]) == 3
    # the failed reset's instance when dropped, the two others when their trajectories ended
    assert _wait_for(lambda: len(module["CLOSED"]) == 3) and set(map(id, module["CLOSED"])) == set(
        map(id, module["BUILT"])
    )
    (slow,) = [r.getMessage() for r in caplog.records if "which does not apply to __init__" in r.getMessage()]
    assert slow.startswith(f"Building 3 instance(s) of environment {spec} took ")
    assert "instances are built for every trajectory of every step" in slow


# ----------------------------------------------------------------------------------------------------------------------
# an environment that fails on every trajectory stops the run
# ----------------------------------------------------------------------------------------------------------------------
RAISING_ENV = """
class RaisingEnv:
    def reset(self, row):
        self.task = row["ground_truth"]

    def step(self, action_text):
        if self.task != "works":
            raise RuntimeError("step is broken")
        return "obs", 1.0, True
"""


def test_an_environment_class_whose_init_needs_an_argument_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "init_env.py"
    path.write_text(
        "class E:\n    def __init__(self, size, *args, seed=0):\n        pass\n\n    def reset(self, row):\n"
        "        pass\n\n    def step(self, text):\n        return 'x', 0.0, True\n"
    )
    with pytest.raises(ValueError) as error:
        load_env_class(f"{path}:E")
    assert str(error.value).startswith(f"`worker.rollout.multi_turn.env`: `E` in `{path}` needs size in `__init__`")
    assert "give them defaults, or read them from the row in `reset`" in str(error.value)


def test_the_rollout_hands_each_trajectorys_first_environment_error_to_the_trainer(tokenizer, tmp_path):
    path = tmp_path / "raising_env.py"
    path.write_text(RAISING_ENV)
    spec = f"{path}:RaisingEnv"
    rollout = _fine_rollout(tokenizer, spec, 2, max_turns=2)
    out = rollout.generate_sequences(_with_truths(make_prompts(tokenizer, ["a", "b"]), ["works", "broken"]))
    assert out.non_tensor_batch[ENV_ERROR_KEY].tolist() == [None, f"{spec}: step raised RuntimeError: step is broken"]


def test_an_environment_failing_on_every_trajectory_of_the_run_so_far_stops_it_with_its_first_error():
    counts = [{"env_errors": 1, "env_timeouts": 0}] * 2
    with pytest.raises(EnvironmentFailedError) as error:
        EnvFailureWatch("envs.py:E").check(["envs.py:E: __init__ raised TypeError: size", "other"], counts)
    message = str(error.value)
    assert "`worker.rollout.multi_turn.env` (envs.py:E) failed on every trajectory of the run so far" in message
    assert (
        "(2 in the last batch)" in message
        and "The first error: envs.py:E: __init__ raised TypeError: size." in message
    )


def test_an_environment_that_worked_stops_the_run_only_after_three_batches_in_a_row_of_failures():
    watch = EnvFailureWatch("envs.py:E")
    failed = [{"env_errors": 1, "env_timeouts": 0}] * 2
    watch.check([None, "e"], failed)  # one trajectory worked
    watch.check(["e", "e"], failed)
    watch.check(["e", "e"], failed)
    watch.check([None, "e"], failed)  # the streak is broken
    watch.check(["e", "e"], failed)
    watch.check(["e", "e"], failed)
    with pytest.raises(EnvironmentFailedError, match="failed on every trajectory of 3 batches in a row"):
        watch.check(["e", "e"], failed)


def test_an_environment_that_only_timed_out_stops_the_run_only_after_three_batches_in_a_row():
    watch = EnvFailureWatch("envs.py:E")
    late = [{"env_errors": 1, "env_timeouts": 1}]
    watch.check(["step timed out"], late)
    watch.check(["step timed out"], late)
    with pytest.raises(EnvironmentFailedError, match="3 batches in a row"):
        watch.check(["step timed out"], late)


def test_a_step_returning_none_as_observation_is_recorded_as_the_empty_turn_the_model_reads(
    tokenizer, tmp_path, caplog
):
    path = tmp_path / "none_env.py"
    path.write_text(
        "class NoneObs:\n    def reset(self, row):\n        pass\n\n    def step(self, text):\n        return None, 1.0, False\n"
    )
    turn = tokenizer.encode("Fine.", add_special_tokens=False) + [tokenizer.eos_token_id]
    rollout = _fine_rollout(tokenizer, f"{path}:NoneObs", 2, max_turns=3)
    with caplog.at_level("WARNING"):
        out = rollout.generate_sequences(_with_truths(make_prompts(tokenizer, ["a", "b"]), ["1", "2"]))
    empty = tokenizer.encode("\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    response = out.batch["responses"][0, : out.batch["attention_mask"][0, PROMPT_LENGTH:].sum()].tolist()
    assert response == turn + empty + turn + empty + turn
    assert [m["role"] for m in out.non_tensor_batch["messages"][0]] == ["assistant", "user"] * 2 + ["assistant"]
    assert [m["content"] for m in out.non_tensor_batch["messages"][0] if m["role"] == "user"] == ["", ""]
    warned = [r.message for r in caplog.records if "returned None as the observation" in r.message]
    assert len(warned) == 1 and "the model reads an empty user turn, recorded in `messages` as one" in warned[0]

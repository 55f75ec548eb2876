"""Tool environments (worker.rollout.multi_turn.env naming a class without `step`: the contract of TRL's
environment_factory): one instance per trajectory whose public methods are the model's tools, `reset(**columns)`
whose text joins the prompt's last user message (in the engine's prompt and in the actor's, ids, masks and
positions), `get_reward()` added to the reward function's overall, and each instance's attributes handed to reward
functions as TRL's `environments`. The turn bookkeeping runs with a scripted turn source; the real engine against the
actor is a slow test."""

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.config import ConfigError, RewardConfig, load_config
from easyrl.config.schema import MultiTurnConfig
from easyrl.data.dataset import ROW_PLACE_KEY
from easyrl.trainer.preflight import tool_schema_lines
from easyrl.workers.rollout.base import rollout_logprob_mismatch
from easyrl.workers.rollout.multi_turn import EnvState, MultiTurnRollout, reset_arguments
from easyrl.workers.tool_files import is_tool_env, load_env_class, tool_schemas
from tests.rollout_helpers import padded_prompts, rollout_worker_config
from tests.test_multi_turn import LOGPROB_TOLERANCE, _runs, scripted_engine


ROOT = Path(__file__).resolve().parent.parent
WIDTH = 48  # the prompts' width (data.max_prompt_length) in the scripted tests

# TRL's documented example, with the target read from the row: reset returns the task, `increment` is the tool,
# get_reward scores the counter; a negative target fails the reset.
COUNTER_ENV = '''
import threading


class CounterEnv:
    def reset(self, target, **kwargs):
        self.counter, self.target = 0, int(target)
        self.lock = threading.Lock()  # cannot be pickled: not handed to the reward function
        if self.target < 0:
            raise ValueError("no such target")
        return f" Reach {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step
        return self.counter

    def _helper(self):
        return "not a tool"
'''


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "counter_env.py"
    path.write_text(COUNTER_ENV)
    return f"{path}:CounterEnv"


def chat_prompts(tokenizer, texts, columns, width=WIDTH):
    """Prompts as the dataset makes them from chat rows: the template's rendering of one user message, left-padded
    to ``width``, with the row's columns carried (``row_columns``)."""
    token_lists = [tokenizer.encode(rendered(tokenizer, text), add_special_tokens=False) for text in texts]
    truths = [str(c.get("target")) for c in columns]
    return padded_prompts(token_lists, width, tokenizer.pad_token_id, row_columns=columns, ground_truth=truths)


def rendered(tokenizer, text):
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )


def test_the_methods_are_each_trajectorys_tools_and_the_reset_text_joins_the_last_user_message(tokenizer, env_file):
    from easyrl.workers.reward.scorer import RewardScorer

    eos = tokenizer.eos_token_id
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731

    def call(step):
        return encode(f'<tool_call>{{"name": "increment", "arguments": {{"step": {step}}}}}</tool_call>') + [eos]

    done = encode("Done.") + [eos]
    # 0: target 3, one call of 3 then done (reward 1); 1: target 2, calls 1 then done (reward 0); 2: its reset fails
    turns = {0: [call(3), done], 1: [call(1), done], 2: [done]}
    engine, llm = scripted_engine(tokenizer, turns, 128)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=env_file, max_turns=3, tool_timeout=5.0))
    assert rollout.tool_env and rollout.env_methods == {None: {"increment": "increment"}}
    columns = [
        {"prompt": "Count.", "target": 3},
        {"prompt": "Count.", "target": 2},
        {"prompt": "Count.", "target": -1},
    ]
    prompts = chat_prompts(tokenizer, ["Count."] * 3, columns)
    original = [list(ids) for ids in prompts.non_tensor_batch["raw_prompt_ids"]]
    out = rollout.generate_sequences(prompts)

    # the engine generated from the template's rendering of the user message with reset's text at its end
    grown = [encode(rendered(tokenizer, f"Count. Reach {target}.")) for target in (3, 2)]
    assert llm.seen[0] == [grown[0], grown[1], original[2]]  # the failed reset leaves its prompt as it was
    tool = encode("\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n")
    assert llm.seen[1] == [
        grown[0] + call(3) + tool,
        grown[1] + call(1) + encode("\n<|im_start|>tool\n1<|im_end|>\n<|im_start|>assistant\n"),
    ]
    # the actor reads the same prompt: ids, mask, positions 0.. and the response counting on after it
    batch = out.batch
    for row, ids in enumerate([grown[0], grown[1], original[2]]):
        length = len(ids)
        assert batch["prompts"][row, WIDTH - length :].tolist() == ids, row
        assert batch["prompts"][row, : WIDTH - length].eq(tokenizer.pad_token_id).all()
        assert batch["attention_mask"][row, :WIDTH].tolist() == [0] * (WIDTH - length) + [1] * length
        assert batch["position_ids"][row, WIDTH - length :].tolist() == list(range(length + 128))
        assert batch["input_ids"][row, WIDTH - length : WIDTH].tolist() == ids
        assert list(out.non_tensor_batch["raw_prompt_ids"][row]) == ids
    first = call(3) + tool + done
    assert batch["responses"][0, : len(first)].tolist() == first
    assert batch["response_mask"][0, : len(first)].tolist() == [1] * len(call(3)) + [0] * len(tool) + [1] * len(done)
    assert batch["responses"][2, : len(done)].tolist() == done and batch["response_mask"][2].sum() == len(done)
    # get_reward per trajectory; the instances' attributes (the lock left out) for TRL's `environments`
    assert out.non_tensor_batch["env_get_reward"].tolist() == [1.0, 0.0, 0.0]
    states = out.non_tensor_batch["environments"]
    assert (states[0].counter, states[0].target, states[1].counter) == (3, 3, 1) and states[2] is None
    with pytest.raises(AttributeError, match="CounterEnv.lock is not available to the reward function: its value"):
        _ = states[0].lock
    assert "env_reward" not in out.non_tensor_batch  # a stepped environment's key
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/multi_turn/tool_calls"] == 2 and metrics["rollout/multi_turn/tool_errors"] == 0
    assert metrics["rollout/multi_turn/env_errors"] == 1
    assert metrics["rollout/multi_turn/env_reward/mean"] == pytest.approx(1 / 3)
    assert (
        out.non_tensor_batch["messages"][2][1]["content"]
        == f"Error: {env_file} reset raised ValueError: no such target."
    )

    # the reward: a TRL function reading `environments`, plus get_reward (weight 1, TRL's sum) ...
    reward_file = Path(env_file.rpartition(":")[0]).parent / "rewards.py"
    reward_file.write_text(
        "def tried(completions, environments, **kwargs):\n"
        "    return [0.5 if env is not None and env.counter > 0 else 0.0 for env in environments]\n"
    )
    scorer = RewardScorer(RewardConfig(reward_function=f"{reward_file}:tried"), tokenizer, in_process=True)
    scores, metrics = scorer.score(out)
    assert scores.sum(-1).tolist() == [1.5, 0.5, 0.0]
    assert metrics["reward/env_reward"] == [1.0, 0.0, 0.0] and metrics["reward/overall"] == [1.5, 0.5, 0.0]
    # ... not added twice where the reward file scores with env_reward itself
    scorer = RewardScorer(
        RewardConfig(reward_function=str(ROOT / "reward_function" / "env_reward.py")), tokenizer, in_process=True
    )
    scores, _ = scorer.score(out)
    assert scores.sum(-1).tolist() == [1.0, 0.0, 0.0]


def test_a_greedy_rollout_copies_the_grown_prompt_to_every_sample(tokenizer, env_file):
    from easyrl.workers.rollout.base import GenerationRequest

    eos = tokenizer.eos_token_id
    done = tokenizer.encode("Done.", add_special_tokens=False) + [eos]
    engine, _ = scripted_engine(tokenizer, {0: [done], 1: [done]}, 64)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=env_file, max_turns=2, tool_timeout=5.0))
    prompts = chat_prompts(tokenizer, ["Go.", "Run."], [{"target": 1}, {"target": 4}])
    out = rollout.generate_sequences(prompts, GenerationRequest(sampling_override={"temperature": 0.0, "n": 2}))
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    want = [
        encode(rendered(tokenizer, text))
        for text in ("Go. Reach 1.", "Go. Reach 1.", "Run. Reach 4.", "Run. Reach 4.")
    ]
    for row, ids in enumerate(want):
        assert out.batch["prompts"][row, WIDTH - len(ids) :].tolist() == ids
        assert int(out.batch["attention_mask"][row, :WIDTH].sum()) == len(ids)
    assert out.non_tensor_batch["env_get_reward"].tolist() == [0.0] * 4


def test_generate_writes_the_prompt_each_sample_was_generated_from(tokenizer, env_file, tmp_path):
    """`easyrl generate` keeps the dataset's prompt (what a resumed run checks) and, where a reset added text, the
    prompt each sample saw; a row whose prompts no reset changed has no sample_prompts."""
    from types import SimpleNamespace

    from easyrl.config.schema import PPOConfig
    from easyrl.trainer.generate import generate_to_file, read_rows
    from easyrl.workers.rollout.base import GenerationRequest

    done = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, _ = scripted_engine(tokenizer, {0: [done], 1: [done]}, 32)
    multi_turn = MultiTurnConfig(env=env_file, max_turns=1, tool_timeout=5.0)
    rollout = MultiTurnRollout(engine, multi_turn)
    config = PPOConfig()
    config.worker.rollout.multi_turn = multi_turn
    prompts = chat_prompts(tokenizer, ["Go.", "Run."], [{"target": 2}, {"target": -1}])  # the second reset fails
    path = str(tmp_path / "generations.jsonl")
    summary = generate_to_file(
        SimpleNamespace(config=config), tokenizer, [prompts], rollout, None, path, lambda b: GenerationRequest(), 1
    )
    assert summary.generated == 2
    grown, failed = read_rows(path)
    assert grown["prompt"] == rendered(tokenizer, "Go.") and grown["responses"] == ["Done."]
    assert grown["sample_prompts"] == [rendered(tokenizer, "Go. Reach 2.")]
    assert failed["prompt"] == rendered(tokenizer, "Run.") and "sample_prompts" not in failed


def test_reset_text_that_cannot_join_the_prompt_is_an_environment_error(tokenizer, env_file):
    """Text that would not fit data.max_prompt_length, or a prompt that does not end with a user message (a plain
    text prompt), ends the trajectory after its first turn, counted and said; the prompt stays as it was."""
    eos = tokenizer.eos_token_id
    done = tokenizer.encode("Done.", add_special_tokens=False) + [eos]
    engine, llm = scripted_engine(tokenizer, {0: [done], 1: [done]}, 64)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=env_file, max_turns=2, tool_timeout=5.0))
    tight = chat_prompts(tokenizer, ["Count.", "Count."], [{"target": 3}, {"target": 3}])
    length = len(tight.non_tensor_batch["raw_prompt_ids"][0])
    tight = chat_prompts(tokenizer, ["Count.", "Count."], [{"target": 3}, {"target": 3}], width=length + 2)
    plain_ids = tokenizer.encode("Count to three:", add_special_tokens=False)
    tight.non_tensor_batch["raw_prompt_ids"][1] = plain_ids
    out = rollout.generate_sequences(tight)
    messages = out.non_tensor_batch["messages"]
    assert "more than data.max_prompt_length=" in messages[0][1]["content"]
    assert "does not end with a user message" in messages[1][1]["content"]
    assert out.meta_info["metrics"]["rollout/multi_turn/env_errors"] == 2
    assert llm.seen[0][0] == list(tight.non_tensor_batch["raw_prompt_ids"][0]) and llm.seen[0][1] == plain_ids
    assert out.non_tensor_batch["environments"].tolist() == [None, None]


def test_a_failing_get_reward_counts_and_gives_zero(tokenizer, tmp_path, caplog):
    path = tmp_path / "env.py"
    path.write_text(
        "class Env:\n"
        "    def reset(self, **kwargs):\n        self.n = kwargs['target']\n"
        "    def get_reward(self):\n"
        "        return float('nan') if self.n == 1 else '0.5' if self.n == 3 else 1 / (self.n - 2)\n"
        "    def noop(self) -> str:\n        '''Does nothing.'''\n        return ''\n"
    )
    done = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, _ = scripted_engine(tokenizer, {i: [done] for i in range(4)}, 32)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=f"{path}:Env", max_turns=1, tool_timeout=5.0))
    prompts = chat_prompts(tokenizer, list("abcd"), [{"target": n} for n in (1, 2, 4, 3)])
    places = [f"data.train_files env.jsonl row {row}" for row in (7, 3, 5, 0)]  # as a dataset's items name them
    prompts.non_tensor_batch[ROW_PLACE_KEY] = np.array(places, dtype=object)
    with caplog.at_level(logging.WARNING, logger="easyrl.workers.rollout.multi_turn"):
        out = rollout.generate_sequences(prompts)
    # NaN, ZeroDivisionError and the text "0.5" give 0
    assert out.non_tensor_batch["env_get_reward"].tolist() == [0.0, 0.0, 0.5, 0.0]
    assert out.meta_info["metrics"]["rollout/multi_turn/env_errors"] == 3
    # each warning names the row the failing environment was reset from
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Environment ")]
    assert len(warned) == 3 and all("environment reward is 0" in text for text in warned)
    assert f"{path}:Env (on data.train_files env.jsonl row 3): get_reward raised ZeroDivisionError" in "".join(warned)
    assert sorted(text.split("(on ")[1].split(")")[0] for text in warned) == sorted(places[:2] + places[3:])


def test_a_batch_of_failing_environments_logs_three_lines_and_a_count(tokenizer, tmp_path, caplog):
    """An environment that fails on every trajectory printed a line for each: the first three of a batch, then one
    line with the rest's count (each counted in env_errors)."""
    path = tmp_path / "env.py"
    path.write_text(
        "class Env:\n"
        "    def reset(self, **kwargs):\n        pass\n"
        "    def get_reward(self):\n        raise RuntimeError('scorer offline')\n"
        "    def noop(self) -> str:\n        '''Does nothing.'''\n        return ''\n"
    )
    done = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, _ = scripted_engine(tokenizer, {i: [done, done] for i in range(7)}, 32)  # a turn per batch
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=f"{path}:Env", max_turns=1, tool_timeout=5.0))
    for size in (7, 2):  # the count starts again with each batch
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="easyrl.workers.rollout.multi_turn"):
            out = rollout.generate_sequences(chat_prompts(tokenizer, list("abcdefg"[:size]), [{}] * size))
        assert out.meta_info["metrics"]["rollout/multi_turn/env_errors"] == size
        warned = [r.getMessage() for r in caplog.records]
        one_by_one = [text for text in warned if text.startswith("Environment ")]
        assert len(one_by_one) == min(size, 3) and all("scorer offline" in text for text in one_by_one)
        summed = [text for text in warned if "more environment failures in this batch" in text]
        expected = "4 more environment failures in this batch, not logged one by one (each is counted in "
        assert summed == ([expected + "rollout/multi_turn/env_errors)."] if size == 7 else [])


def test_schemas_kinds_reset_arguments_and_state(env_file, tmp_path):
    cls = load_env_class(env_file)
    assert is_tool_env(cls)
    (schema,) = tool_schemas(None, env_file)
    function = schema["function"]
    assert function["name"] == "increment" and list(function["parameters"]["properties"]) == ["step"]
    assert function["parameters"]["properties"]["step"] == {
        "type": "integer",
        "description": "Value to add to the counter.",
    }
    both = tool_schemas(str(ROOT / "tools" / "calculator.py"), env_file)
    assert [s["function"]["name"] for s in both] == ["calculator", "increment"]

    # reset gets every column with **kwargs, else only the names it declares (TRL would pass them all and fail)
    def declared(self, target):
        pass

    def open_ended(self, **kwargs):
        pass

    columns = {"prompt": "p", "target": 3}
    assert reset_arguments(declared.__get__(object()), columns) == {"target": 3}
    assert reset_arguments(open_ended.__get__(object()), columns) == columns

    # a class with neither step nor a public method is refused, naming the key
    (tmp_path / "empty.py").write_text("class Empty:\n    def reset(self, **kwargs):\n        pass\n")
    with pytest.raises(ValueError, match="has neither `step\\(action_text\\)` nor a public method"):
        load_env_class(f"{tmp_path / 'empty.py'}:Empty")

    class Box:
        def __init__(self):
            self.count, self.handle = 2, (lambda: None)

    state = pickle.loads(pickle.dumps(EnvState(Box())))
    assert state.count == 2 and repr(state) == "Box(count=2)"
    assert vars(state) == {"count": 2}  # the instance's attributes that travel, none of easyrl's bookkeeping
    with pytest.raises(AttributeError, match="Box.handle is not available to the reward function"):
        _ = state.handle
    with pytest.raises(AttributeError, match="methods stay in the rollout worker"):
        state.get_reward()


def test_two_tool_methods_of_one_name_are_refused_naming_both_methods_and_the_file(tmp_path):
    path = tmp_path / "renamed_env.py"
    path.write_text(
        "class RenamedEnv:\n"
        "    def reset(self, **kwargs):\n"
        "        pass\n"
        "    def look(self):\n"
        "        return 'look'\n"
        "    def wipe(self):\n"
        "        return 'wipe'\n"
        "    look.schema = {'type': 'function', 'function': {'name': 'look'}}\n"
        "    wipe.schema = {'type': 'function', 'function': {'name': 'look'}}\n"
    )
    spec = f"{path}:RenamedEnv"
    message = f"`worker.rollout.multi_turn.env`: `{spec}` has two tools named 'look': `look` and `wipe`"
    with pytest.raises(ValueError) as error:
        tool_schemas(None, spec)
    assert message in str(error.value)


def test_check_accepts_tools_beside_a_tool_env_and_refuses_them_beside_a_stepped_one(valid_args, env_file, tmp_path):
    from easyrl.trainer.main import dataset_options

    calculator = f"worker.rollout.multi_turn.tools={ROOT / 'tools/calculator.py'}"
    config = load_config([*valid_args, f"worker.rollout.multi_turn.env={env_file}", calculator])
    assert config.worker.rollout.multi_turn.enabled
    options = dataset_options(config, None)
    assert options["carry_columns"] and options["env_prompts"]  # reset gets the row's columns, may give its task
    assert [s["function"]["name"] for s in options["tools"]] == ["calculator", "increment"]
    stepped = tmp_path / "stepped.py"
    stepped.write_text(
        "class Stepped:\n    def reset(self, row):\n        pass\n    def step(self, text):\n        pass\n"
    )
    with pytest.raises(ConfigError, match="and `Stepped` has `step`; give one of them"):
        load_config([*valid_args, f"worker.rollout.multi_turn.env={stepped}:Stepped", calculator])
    config = load_config([*valid_args, f"worker.rollout.multi_turn.env={stepped}:Stepped"])
    assert dataset_options(config, None) == {
        "tools": None,
        "carry_columns": True,  # a stepped reset gets the row's columns too
        "env_prompts": False,
        "carry_prompt_messages": False,
        "max_images": 0,
        "answer_optional": False,
    }


# ----------------------------------------------------------------------------------------------------------------------
# the real engine in the FSDP worker: the grown prompt is what the actor scores
# ----------------------------------------------------------------------------------------------------------------------
ENGINE_ENV = '''
class NoteEnv:
    def reset(self, target, **kwargs):
        self.notes = []
        return f" The secret word is {target}."

    def get_reward(self) -> float:
        return float(len(self.notes))

    def note(self, text: str) -> str:
        """Write a note.

        Args:
            text: The note.
        """
        self.notes.append(text)
        return "noted"
'''


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_engine_tool_env_prompts_and_log_probs_match_the_actor(ray_cluster, tiny_model_path, tokenizer, tmp_path):
    from easyrl.workers.fsdp_worker import FSDPWorker
    from easyrl.workers.rollout.base import GenerationRequest
    from tests.fsdp_helpers import worker_group

    env_path = tmp_path / "note_env.py"
    env_path.write_text(ENGINE_ENV)
    config = rollout_worker_config(tiny_model_path, 1)
    rollout = config.rollout
    rollout.prompt_length = WIDTH
    rollout.response_length = 64
    rollout.max_model_len = WIDTH + rollout.response_length
    rollout.multi_turn = MultiTurnConfig(env=f"{env_path}:NoteEnv", max_turns=2, turn_max_tokens=8, tool_timeout=5)
    prompts = chat_prompts(tokenizer, ["Hi.", "Say it."], [{"target": "apple"}, {"target": "kiwi"}])
    with worker_group(
        FSDPWorker, config, "actor_rollout", name_prefix="toolenv", process_group_timeout_s=240
    ) as group:
        group.init_model()
        out = group.generate_sequences(prompts, GenerationRequest(sampling_override={"n": 2}, seed=5))
        actor = group.compute_log_probs(out).batch["old_log_probs"]
    batch = out.batch
    for row in range(len(out)):
        target = ("apple", "kiwi")[row // 2]
        length = int(batch["attention_mask"][row, :WIDTH].sum())
        text = tokenizer.decode(batch["prompts"][row, WIDTH - length :])
        assert text.endswith(f" The secret word is {target}.<|im_end|>\n<|im_start|>assistant\n"), text
        mask = batch["response_mask"][row].tolist()
        assert [v for v, _, _ in _runs(mask)][0] == 1  # the response opens with the model's turn
    mismatch = rollout_logprob_mismatch(actor, batch["rollout_log_probs"], batch["response_mask"])
    print(f"tool environment rollout vs actor log-prob |diff|: {mismatch}")
    assert mismatch["rollout/logprob_abs_diff/max"] < LOGPROB_TOLERANCE
    assert out.non_tensor_batch["env_get_reward"].shape == (4,)


# ----------------------------------------------------------------------------------------------------------------------
# a run: GRPO with a tool environment and a reward function written for TRL, through `easyrl train`
# ----------------------------------------------------------------------------------------------------------------------
TRL_ENV = '''
import ast
import operator
import os
import pathlib

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _value(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("only whole numbers and + - * //")


MARKS = pathlib.Path(__file__).parent / "instances"  # one file per instance, written when built and when closed


class CalculatorEnv:
    def __init__(self):
        MARKS.mkdir(exist_ok=True)
        self.mark = MARKS / f"{os.getpid()}-{id(self)}"
        self.mark.write_text("built")

    def close(self):
        self.mark.write_text("closed")

    def reset(self, answer, **kwargs):
        self.answer, self.calls, self.last = str(answer).strip(), 0, None
        return " Check it with the calculator."

    def get_reward(self) -> float:  # 1 for a calculation that gave the answer, else 0.5
        return 1.0 if self.last == self.answer else 0.5

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * (3 + 4)".
        """
        self.calls += 1
        self.last = str(_value(ast.parse(expression, mode="eval").body))
        return self.last
'''

TRL_REWARD = """
def tried(completions, environments, answer, **kwargs):  # each sample's environment was reset with its row
    return [0.25 if env.answer == str(a).strip() else -1.0 for env, a in zip(environments, answer)]
"""


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_grpo_steps_with_a_trl_tool_environment(tmp_path):
    """The calculator recipe with TRL's environment_factory class in place of the tools file (its calculator is a
    method, reset adds a sentence to the prompt, get_reward scores the last result) and a TRL reward function that
    reads `environments`: 4 prompts x 4 samples, 2 steps."""
    from tests.fixtures.trainer_runs import small_tools_run, train_for_metrics

    (tmp_path / "calc_env.py").write_text(TRL_ENV)
    (tmp_path / "rewards.py").write_text(TRL_REWARD)
    args = small_tools_run(
        2,
        tmp_path / "checkpoints",
        "worker.rollout.multi_turn.tools=",
        f"worker.rollout.multi_turn.env={tmp_path / 'calc_env.py'}:CalculatorEnv",
        f"worker.reward.reward_function={tmp_path / 'rewards.py'}:tried",
        "data.max_prompt_length=136",
    )
    metrics = train_for_metrics(args, tmp_path, 2)
    # every instance was closed when the run ended (the pooled ones by the worker's shutdown)
    marks = [p.read_text() for p in (tmp_path / "instances").iterdir()]
    assert len(marks) >= 4 and set(marks) == {"closed"}
    for step in (1, 2):
        row = metrics[step]
        assert row["rollout/multi_turn/env_errors"] == 0  # every reset got `answer` and its text fit the prompt
        assert row["reward/errors"] == 0  # the reward function read env.answer of every sample
        assert "rollout/multi_turn/tool_calls" in row
        assert 0.5 <= row["reward/env_reward"] <= 1.0
        # overall = the function's 0.25 + get_reward, summed as TRL sums them
        assert row["reward/env_reward"] == pytest.approx(row["rollout/multi_turn/env_reward/mean"])
        assert row["reward/overall"] == pytest.approx(0.25 + row["reward/env_reward"])


def test_the_shipped_calculator_environment_and_a_name_both_sources_give(tokenizer, valid_args):
    """tools/calculator.py:CalculatorEnv: the calculator as each trajectory's method, a bonus when its last result is
    the row's answer; a tools file naming a tool like a method is refused before Ray starts."""
    from easyrl.trainer.main import dataset_options
    from easyrl.workers.tool_files import check_tool_names

    spec = f"{ROOT / 'tools' / 'calculator.py'}:CalculatorEnv"
    eos = tokenizer.eos_token_id
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731

    def call(expression):
        return encode(
            f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'
        ) + [eos]

    done = encode("Done.") + [eos]
    turns = {0: [call("3*4"), done], 1: [call("2+2"), done], 2: [done]}
    engine, _ = scripted_engine(tokenizer, turns, 128)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=spec, max_turns=3, tool_timeout=5.0))
    columns = [{"answer": 12}, {"answer": "5"}, {"answer": "1"}]
    out = rollout.generate_sequences(chat_prompts(tokenizer, ["q"] * 3, columns))
    assert out.non_tensor_batch["env_get_reward"].tolist() == [0.1, 0.0, 0.0]
    assert [state.results for state in out.non_tensor_batch["environments"]] == [["12"], ["4"], []]
    with pytest.raises(ValueError, match="both name calculator; the model could only call one"):
        check_tool_names({"calculator": None}, {"calculator": "calculator"})
    config = load_config(
        [
            *valid_args,
            f"worker.rollout.multi_turn.env={spec}",
            f"worker.rollout.multi_turn.tools={ROOT / 'tools' / 'calculator.py'}",
        ]
    )
    with pytest.raises(ValueError, match="both name calculator"):
        dataset_options(config, None)


# ----------------------------------------------------------------------------------------------------------------------
# several environments (TRL's dictionary environment_factory): each row names its own in an `environment` column
# ----------------------------------------------------------------------------------------------------------------------
ECHO_ENV = '''
class EchoEnv:
    def reset(self, **kwargs):
        self.heard = []
        assert "environment" not in kwargs  # the routing column is not the environment's

    def echo(self, text: str) -> str:
        """Say the text back.

        Args:
            text: What to say back.
        """
        self.heard.append(text)
        return text.upper()
'''


@pytest.fixture
def two_envs(env_file, tmp_path):
    (tmp_path / "echo_env.py").write_text(ECHO_ENV)
    return {"counter": env_file, "echo": f"{tmp_path / 'echo_env.py'}:EchoEnv"}


def test_each_row_gets_its_own_environment_and_only_its_tools(tokenizer, two_envs):
    eos = tokenizer.eos_token_id
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731

    def call(name, arguments):
        return encode(f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>') + [eos]

    done = encode("Done.") + [eos]
    turns = {
        0: [call("increment", '{"step": 3}'), done],  # a counter row
        1: [call("echo", '{"text": "hi"}'), done],  # an echo row
        2: [call("increment", '{"step": 1}'), done],  # an echo row calling the counter's tool
        3: [done],  # a row naming no known environment
    }
    engine, llm = scripted_engine(tokenizer, turns, 128)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=two_envs, max_turns=3, tool_timeout=5.0))
    columns = [
        {"environment": "counter", "target": 3},
        {"environment": "echo", "target": 0},
        {"environment": "echo", "target": 0},
        {"environment": "chess", "target": 0},
    ]
    out = rollout.generate_sequences(chat_prompts(tokenizer, ["Go."] * 4, columns))
    messages = out.non_tensor_batch["messages"]
    assert messages[0][1]["content"] == "3" and messages[1][1]["content"] == "HI"
    assert messages[2][1]["content"] == "Error: unknown tool 'increment'; the tools are: echo."
    assert "the row's `environment` is 'chess', not one of 'counter', 'echo'" in messages[3][1]["content"]
    # only the counter's reset added text; get_reward only where the class has it
    assert llm.seen[0][0] == tokenizer.encode(rendered(tokenizer, "Go. Reach 3."), add_special_tokens=False)
    assert llm.seen[0][1] == tokenizer.encode(rendered(tokenizer, "Go."), add_special_tokens=False)
    assert out.non_tensor_batch["env_get_reward"].tolist() == [1.0, 0.0, 0.0, 0.0]
    states = out.non_tensor_batch["environments"]
    assert states[1].heard == ["hi"] and states[2].heard == [] and states[3] is None
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/multi_turn/env_errors"] == 1
    # each environment's own reward, as TRL logs it: the counter's only (the echo has no get_reward)
    assert metrics["rollout/multi_turn/env_reward/counter/mean"] == 1.0
    assert not any(key.startswith("rollout/multi_turn/env_reward/echo") for key in metrics)


def test_rows_advertise_their_own_environments_tools_and_a_row_naming_none_is_skipped(tokenizer, two_envs, tmp_path):
    import json

    from easyrl.data.dataset import RLHFDataset
    from tests.test_bad_data import data_config
    from tests.test_multi_turn_template import TOOL_TEMPLATE

    template = tmp_path / "tools.jinja"
    template.write_text(TOOL_TEMPLATE)
    path = tmp_path / "rows.jsonl"
    rows = [
        {"problem": "count", "answer": "3", "environment": "counter", "target": 3},
        {"problem": "say", "answer": "x", "environment": "echo", "target": 0},
        {"problem": "lost", "answer": "x", "environment": None, "target": 0},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tools = tool_schemas(str(ROOT / "tools" / "calculator.py"), two_envs)
    assert {name: [s["function"]["name"] for s in schemas] for name, schemas in tools.items()} == {
        "counter": ["calculator", "increment"],
        "echo": ["calculator", "echo"],
    }
    # easyrl check prints each environment's list under its name (one JSON line a tool)
    lines = tool_schema_lines(tools)
    assert [line for line in lines if not line.startswith("  ")] == [
        f"environment `{name}`'s tools, as the chat template's `tools=` gets them (an SFT `tools` column teaching "
        "these calls should hold the same):"
        for name in ("counter", "echo")
    ]
    assert [json.loads(line)["function"]["name"] for line in lines if line.startswith("  ")] == [
        "calculator",
        "increment",
        "calculator",
        "echo",
    ]
    config = data_config(override_chat_template=str(template), max_prompt_length=128)
    dataset = RLHFDataset(str(path), tokenizer, None, config, tools=tools, carry_columns=True)
    assert len(dataset) == 2 and dataset.unusable_rows[0][0] == 2
    assert "its `environment` is None; with several environments" in dataset.unusable_rows[0][1]
    prompts = [tokenizer.decode(dataset[i]["raw_prompt_ids"]) for i in range(2)]
    assert prompts[0].startswith("TOOLS: calculator(expression) increment(step)<user>count")
    assert prompts[1].startswith("TOOLS: calculator(expression) echo(text)<user>say")
    assert dataset[0]["row_columns"]["environment"] == "counter"
    # no such column at all: one refusal naming it, not each row skipped with "its `environment` is None"
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps({k: v for k, v in row.items() if k != "environment"}) + "\n" for row in rows))
    with pytest.raises(KeyError, match=r"no column `environment`: with several environments \(worker.rollout"):
        RLHFDataset(str(bare), tokenizer, None, config, tools=tools, carry_columns=True)


def test_check_reads_several_environments_and_refuses_a_stepped_one_among_them(
    tokenizer, valid_args, two_envs, tmp_path
):
    from easyrl.trainer.main import dataset_options

    args = [f"worker.rollout.multi_turn.env.{name}={spec}" for name, spec in two_envs.items()]
    config = load_config([*valid_args, *args])
    assert config.worker.rollout.multi_turn.env == two_envs
    options = dataset_options(config, None)
    assert options["carry_columns"] and set(options["tools"]) == {"counter", "echo"}
    stepped = tmp_path / "stepped.py"
    stepped.write_text(
        "class Stepped:\n    def reset(self, row):\n        pass\n    def step(self, text):\n        pass\n"
    )
    with pytest.raises(ConfigError, match="`worker.rollout.multi_turn.env.game`: .* has `step`; several environments"):
        load_config([*valid_args, *args, f"worker.rollout.multi_turn.env.game={stepped}:Stepped"])
    with pytest.raises(ValueError, match="has `step`; several environments are tool environments"):
        MultiTurnRollout(
            scripted_engine(tokenizer, {}, 8)[0],
            MultiTurnConfig(env={**two_envs, "game": f"{stepped}:Stepped"}),
        )


def test_a_reset_may_return_text_parts_pictures_and_content_parts():
    """TRL also takes a list from reset: text parts are its text, pictures (PIL, or image parts) come with it."""
    from PIL import Image

    from easyrl.workers.rollout.multi_turn import _tool_env_reset

    class Parts:
        answer: list = []

        def reset(self, **kwargs):
            return Parts.answer

        def look(self) -> str:
            """Look."""
            return ""

    Parts.answer = [{"type": "text", "text": " Reach 3."}, " Go."]
    assert _tool_env_reset(Parts(), {}).observation == " Reach 3.\n Go."
    picture = Image.new("RGB", (8, 8))
    Parts.answer = [{"type": "text", "text": "See:"}, {"type": "image", "image": picture}]
    outcome = _tool_env_reset(Parts(), {})
    assert outcome.observation == [{"type": "text", "text": "See:"}, {"type": "image"}]
    assert outcome.pictures == [picture]
    Parts.answer = picture  # a picture alone
    assert _tool_env_reset(Parts(), {}).observation == [{"type": "image"}]
    Parts.answer = [3]
    with pytest.raises(TypeError, match="items that are neither text, pictures nor content parts"):
        _tool_env_reset(Parts(), {})


# Counts its constructions: each instance knows its serial; reset keeps a log it never clears (state that a reused
# instance carries)
SERIAL_ENV = """
import itertools

_serials = itertools.count()


class SerialEnv:
    def __init__(self):
        self.serial, self.log = next(_serials), []

    def reset(self, target, **kwargs):
        if int(target) < 0:
            raise ValueError("no such target")
        self.log.append(int(target))

    def noop(self) -> str:
        \"\"\"Do nothing.\"\"\"
        return ""
"""


def test_instances_are_reused_across_steps_but_not_after_a_failure(tokenizer, tmp_path):
    """TRL's "construct once, reset often": the instances of one call are reset at the next instead of built again,
    but for one whose reset failed."""
    from easyrl.workers.rollout.base import GenerationRequest

    path = tmp_path / "serial_env.py"
    path.write_text(SERIAL_ENV)
    done = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, _ = scripted_engine(tokenizer, {i: [done] * 3 for i in range(6)}, 16)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=f"{path}:SerialEnv", max_turns=1, tool_timeout=5.0))
    request = GenerationRequest(sampling_override={"n": 2})

    def serials_and_logs(targets):
        columns = [{"target": target} for target in targets]
        out = rollout.generate_sequences(chat_prompts(tokenizer, ["Count."] * len(targets), columns), request)
        states = out.non_tensor_batch["environments"]
        return [s.serial if s is not None else None for s in states], [s.log if s else None for s in states]

    serials, logs = serials_and_logs([1, 2, -1])
    assert sorted(serials[:4]) == [0, 1, 2, 3] and serials[4:] == [None, None]  # -1: two failed resets
    assert logs[:4] == [[1], [1], [2], [2]]
    again, relogged = serials_and_logs([3, 4, 5])
    # the four healthy instances are reset again; the two failed ones were dropped, two new ones take their place
    assert sorted(again) == [0, 1, 2, 3, 6, 7]
    by_serial = dict(zip(again, relogged))
    assert all(len(by_serial[s]) == 2 for s in (0, 1, 2, 3)) and by_serial[6] == [5] and by_serial[7] == [5]


TRL_PROMPT_REWARD = """
def asked(prompts, completions, **kwargs):
    return [float("Reach" in prompt[-1]["content"]) for prompt in prompts]
"""


def test_a_trl_reward_function_reads_the_prompt_the_reset_grew(tokenizer, env_file, tmp_path):
    """TRL hands its reward functions the prompts with each reset's text in the last user message; so does easyrl,
    for chat rows (and the reset's pictures as image parts)."""
    import numpy as np

    from easyrl.data.template import with_reset_content
    from easyrl.workers.reward.loader import RewardFunctionError
    from easyrl.workers.reward.scorer import RewardScorer

    done = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, _ = scripted_engine(tokenizer, {i: [done] for i in range(2)}, 16)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=env_file, max_turns=1, tool_timeout=5.0))
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count."}]
    columns = [{"prompt": chat, "target": 3}, {"prompt": chat, "target": -1}]  # the second reset fails
    prompts = chat_prompts(tokenizer, ["Count."] * 2, columns)
    prompts.non_tensor_batch["conversational"] = np.array([True, True], dtype=object)
    out = rollout.generate_sequences(prompts)
    path = tmp_path / "asked.py"
    path.write_text(TRL_PROMPT_REWARD)
    config = RewardConfig(reward_function=f"{path}:asked")
    scorer = RewardScorer(config, tokenizer, in_process=True, prompt_key="prompt")
    inputs = scorer.build_inputs(out)
    assert inputs[0]["prompt"] == [chat[0], {"role": "user", "content": "Count. Reach 3."}]
    assert inputs[1]["prompt"] == chat  # no reset text: the row's prompt as it was
    assert columns[0]["prompt"] == chat  # the row is not changed
    scores, _ = scorer.score(out)
    assert scores.sum(-1).tolist() == [1.0, 0.0]

    # text rows: the row's text with the reset's text at its end, and the failed reset's row as written: one form in
    # a batch (the failed row's prompt was the decoded chat template, the other's the row's text)
    texts = [{"prompt": "Count.", "target": 3}, {"prompt": "Count.", "target": -1}]
    text_prompts = chat_prompts(tokenizer, ["Count."] * 2, texts)
    text_prompts.non_tensor_batch["conversational"] = np.array([False, False], dtype=object)
    engine, _ = scripted_engine(tokenizer, {i: [done] for i in range(2)}, 16)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=env_file, max_turns=1, tool_timeout=5.0))
    inputs = scorer.build_inputs(rollout.generate_sequences(text_prompts))
    assert [item["prompt"] for item in inputs] == ["Count. Reach 3.", "Count."]

    # a function reading env.<attribute> trips on the None of the failed reset: the stop says why
    path.write_text(
        "def reached(completions, environments, **kwargs):\n    return [env.counter for env in environments]\n"
    )
    engine, _ = scripted_engine(tokenizer, {i: [done] for i in range(2)}, 16)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=env_file, max_turns=1, tool_timeout=5.0))
    out = rollout.generate_sequences(prompts)
    scorer = RewardScorer(RewardConfig(reward_function=f"{path}:reached"), tokenizer, in_process=True)
    with pytest.raises(RewardFunctionError) as stopped:
        scorer.score(out)
    assert "1 sample(s) of the batch have None in `environments`: their tool environment's reset failed" in str(
        stopped.value
    )
    assert "'NoneType' object has no attribute 'counter'" in str(stopped.value)

    picture = object()
    parts = [{"type": "text", "text": " See:"}, {"type": "image", "image": picture}]
    grown = with_reset_content([{"role": "user", "content": "Count."}], parts)
    assert grown == [{"role": "user", "content": [{"type": "text", "text": "Count."}, *parts]}]
    listed = [{"role": "user", "content": [{"type": "text", "text": "Count."}]}]
    assert with_reset_content(listed, " More.")[0]["content"][-1] == {"type": "text", "text": " More."}


def test_rows_that_only_route_to_an_environment_get_an_empty_prompt_its_reset_fills(
    tokenizer, two_envs, tmp_path, caplog
):
    """TRL's multi-environment data: rows holding only `environment` (and the reset's arguments), no prompt or answer
    column. Each prompt is an empty user message; the counter's reset gives its task, the echo's adds nothing."""
    import json

    from easyrl.data.collate import collate_fn
    from easyrl.data.dataset import RLHFDataset
    from easyrl.protocol import DataProto
    from tests.test_bad_data import data_config

    path = tmp_path / "routes.jsonl"
    rows = [{"environment": "counter", "target": 3}, {"environment": "echo", "target": 0}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    template = tmp_path / "format.jinja"
    template.write_text("Solve: {{ content }}")
    tools = tool_schemas(None, two_envs)
    config = data_config(max_prompt_length=128, format_prompt=str(template))
    dataset = RLHFDataset(str(path), tokenizer, None, config, tools=tools, carry_columns=True, env_prompts=True)
    assert len(dataset) == 2 and not dataset.unusable_rows
    assert "has no column 'problem' or 'answer': the environment's reset gives each row its task" in caplog.text
    assert "without data.format_prompt" in caplog.text
    assert "set data.prompt_key / data.answer_key to those (the columns are ['environment', 'target'])" in caplog.text
    assert dataset.carried_columns == ["environment", "target"]  # the filled columns are not the row's
    items = [dataset[i] for i in range(2)]
    empty = tokenizer.apply_chat_template(
        [{"role": "user", "content": ""}], tools=tools["counter"], add_generation_prompt=True, tokenize=False
    )
    assert tokenizer.decode(items[0]["raw_prompt_ids"]) == empty  # no "Solve:" of the format template
    assert items[0]["ground_truth"] == ""

    # through the rollout: the counter's reset writes the task into the empty message
    done = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, llm = scripted_engine(tokenizer, {0: [done], 1: [done]}, 16)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=two_envs, max_turns=1, tool_timeout=5.0))
    batch = collate_fn(items)
    batch = batch if isinstance(batch, DataProto) else DataProto.from_single_dict(batch)
    rollout.generate_sequences(batch)
    grown = tokenizer.apply_chat_template(
        [{"role": "user", "content": " Reach 3."}], tools=tools["counter"], add_generation_prompt=True, tokenize=False
    )
    assert tokenizer.decode(llm.seen[0][0]) == grown

    # without a tool environment, a missing prompt column is still an error naming the key
    with pytest.raises(KeyError, match="no column 'problem' \\(data.prompt_key\\)"):
        RLHFDataset(str(path), tokenizer, None, config, carry_columns=True)


@pytest.mark.parametrize(
    ("key", "value", "near"), [("prompt_key", "questoin", "question"), ("answer_key", "answr", "answer")]
)
def test_a_misspelt_key_beside_a_tool_environment_is_refused_not_filled(
    tokenizer, two_envs, tmp_path, key, value, near
):
    """Beside a tool environment a missing prompt (or answer) column is filled with an empty value for rows that only
    route to it; a column whose name is close to the key means a typo, which would train on empty prompts (or score
    against empty answers): refused, naming the close column."""
    import json

    from easyrl.data.dataset import RLHFDataset
    from tests.test_bad_data import data_config

    path = tmp_path / "rows.jsonl"
    rows = [{"environment": "counter", "question": "Count to 3.", "answer": "3", "target": 3}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    keys = {"prompt_key": "question", "answer_key": "answer"}
    config = data_config(max_prompt_length=128, **{**keys, key: value})
    tools = tool_schemas(None, two_envs)
    with pytest.raises(KeyError, match=rf"no column '{value}' \(data.{key}\), but '{near}' is close; set data.{key}="):
        RLHFDataset(str(path), tokenizer, None, config, tools=tools, carry_columns=True, env_prompts=True)
    # spelt right, the same rows load with their own prompts and answers
    config = data_config(max_prompt_length=128, **keys)
    dataset = RLHFDataset(str(path), tokenizer, None, config, tools=tools, carry_columns=True, env_prompts=True)
    assert dataset[0]["ground_truth"] == "3"
    assert "Count to 3." in tokenizer.decode(dataset[0]["raw_prompt_ids"])


SLOW_TOOL_ENV = '''
import time

BUILT, CLOSED = [], []


class SandboxEnv:
    def __init__(self):
        time.sleep(0.8)
        BUILT.append(self)

    def reset(self, target, **kwargs):
        self.target = int(target)
        if self.target < 0:
            raise ValueError("no such target")

    def look(self) -> str:
        """Look around."""
        return "nothing"

    def close(self):
        CLOSED.append(self)
'''


def test_a_tool_environment_built_slower_than_tool_timeout_is_built_once_and_reused(tokenizer, tmp_path):
    """Each instance was built inside its reset's deadline: an __init__ longer than tool_timeout timed out at every
    step, and the late instances were never pooled nor closed. An instance dropped after a failed reset is closed."""
    import time

    from tests.test_multi_turn_env import _wait_for

    path = tmp_path / "sandbox_env.py"
    path.write_text(SLOW_TOOL_ENV)
    spec = f"{path}:SandboxEnv"
    module = load_env_class(spec).__init__.__globals__
    done = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, _ = scripted_engine(tokenizer, {i: [done, done] for i in range(2)}, 16)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=spec, max_turns=1, tool_timeout=0.5))
    columns = [{"prompt": "Count.", "target": 3}, {"prompt": "Count.", "target": -1}]
    first = rollout.generate_sequences(chat_prompts(tokenizer, ["Count."] * 2, columns))
    assert first.meta_info["metrics"]["rollout/multi_turn/env_timeouts"] == 0
    assert first.meta_info["metrics"]["rollout/multi_turn/env_errors"] == 1  # the -1 target's reset
    assert len(module["BUILT"]) == 2
    # the instances are built concurrently, so BUILT's order is not the rows': find them by the target they were given
    assert _wait_for(lambda: len(module["CLOSED"]) == 1)  # dropped after its failed reset, closed
    assert module["CLOSED"][0].target == -1
    (healthy,) = [env for env in module["BUILT"] if env not in module["CLOSED"]]
    start = time.monotonic()
    rollout.generate_sequences(chat_prompts(tokenizer, ["Count."] * 2, columns))
    # the healthy instance is reused, one new one replaces the dropped: 3 built in all, not 4
    assert len(module["BUILT"]) == 3 and time.monotonic() - start < 5
    assert _wait_for(lambda: len(module["CLOSED"]) == 2)  # whichever instance got the -1 target failed again
    assert module["CLOSED"][1].target == -1 and module["CLOSED"][1] is not module["CLOSED"][0]
    # the worker's shutdown closes the pooled instance, which would otherwise outlive the killed process
    (pooled,) = [env for env in module["BUILT"] if env not in module["CLOSED"]]
    assert pooled.target == 3 and (pooled is healthy or module["CLOSED"][1] is healthy)
    assert rollout.close() == 1
    assert module["CLOSED"][2] is pooled and len(module["CLOSED"]) == 3
    assert rollout.close() == 0  # the pool is empty: nothing is closed twice

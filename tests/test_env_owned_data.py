"""A tool environment that owns the data and the reward (TRL's GRPOTrainer with an environment_factory and no
train_dataset or reward function): empty data.train_files makes each training prompt one user message holding what
the trajectory's reset returns, trainer.max_steps sets the length, and a get_reward method is the reward when no
reward function is given."""

import random

import pytest

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.config import ConfigError, load_run_plan
from easyrl.config.schema import MultiTurnConfig
from easyrl.workers.rollout.base import GenerationRequest
from easyrl.workers.rollout.multi_turn import MultiTurnRollout
from tests.rollout_helpers import padded_prompts
from tests.test_multi_turn import scripted_engine
from tests.test_multi_turn_tool_env import COUNTER_ENV


# TRL's counter environment as one that owns the data: no row names the target, reset picks it (a fixed one here, so
# that the prompts are known) and returns the whole task
OWNING_ENV = COUNTER_ENV.replace("def reset(self, target, **kwargs)", "def reset(self, target=2, **kwargs)").replace(
    'return f" Reach {self.target}."', 'return f"Increment the counter by {self.target}."'
)


@pytest.fixture
def owning_env(tmp_path):
    path = tmp_path / "increment_env.py"
    path.write_text(OWNING_ENV)
    return f"{path}:CounterEnv"


def without(args: list[str], *keys: str) -> list[str]:
    return [arg for arg in args if arg.split("=", 1)[0] not in keys]


def owning_args(valid_args, env_spec, *more):
    bare = without(valid_args, "data.train_files", "worker.reward.reward_function")
    return [*bare, f"worker.rollout.multi_turn.env={env_spec}", *more]


def test_the_plan_takes_the_prompts_and_the_reward_from_the_environment(valid_args, owning_env):
    plan = load_run_plan(owning_args(valid_args, owning_env, "trainer.max_steps=3"))
    reward = plan.config.worker.reward.reward_function
    assert reward.endswith("reward_function/env_reward.py:compute_score"), reward
    assert plan.config.data.train_files in ("", None)
    notes = "\n".join(plan.notes)
    assert "the reward is what it returns" in notes
    assert "the environment owns the data; each training prompt is what its reset returns, 3 steps" in notes
    assert "training steps: 3 (trainer.max_steps)" in plan.describe()
    # a reward function of the user's is kept, and the data is the user's when given
    kept = load_run_plan([*owning_args(valid_args, owning_env, "trainer.max_steps=3"), valid_args[2]])
    assert kept.config.worker.reward.reward_function == valid_args[2].split("=", 1)[1]
    with_data = load_run_plan([*valid_args, f"worker.rollout.multi_turn.env={owning_env}"])
    assert not any("owns the data" in note for note in with_data.notes)


def test_what_cannot_own_the_data_or_the_reward_is_refused_naming_the_key(valid_args, owning_env, tmp_path):
    with pytest.raises(ConfigError, match="there are no epochs to count: set `trainer.max_steps`"):
        load_run_plan(owning_args(valid_args, owning_env))
    # several environments need a routing column, which only a dataset has (as TRL says)
    mapping = f"worker.rollout.multi_turn.env={{a: '{owning_env}', b: '{owning_env}'}}"
    bare = without(valid_args, "data.train_files")
    with pytest.raises(ConfigError, match="set `data.train_files`"):
        load_run_plan([*bare, mapping, "trainer.max_steps=3"])
    # a stepped environment reads its task from the row
    stepped = tmp_path / "stepped.py"
    stepped.write_text(
        "class Stepped:\n    def reset(self, row):\n        pass\n    def step(self, text):\n        pass\n"
    )
    with pytest.raises(ConfigError, match="set `data.train_files`"):
        load_run_plan([*bare, f"worker.rollout.multi_turn.env={stepped}:Stepped", "trainer.max_steps=3"])
    # without get_reward there is no reward source: the error says both ways out
    no_reward = tmp_path / "no_reward.py"
    no_reward.write_text(OWNING_ENV.replace("def get_reward", "def _get_reward"))
    with pytest.raises(ConfigError, match="`worker.reward.reward_function`.*that defines get_reward needs no reward"):
        load_run_plan(owning_args(valid_args, f"{no_reward}:CounterEnv", "trainer.max_steps=3"))
    with pytest.raises(ConfigError, match="defines no `Missing`"):
        load_run_plan(owning_args(valid_args, f"{no_reward}:Missing", "trainer.max_steps=3"))


def test_each_training_prompt_is_the_template_rendering_of_its_reset_text(tokenizer, valid_args, owning_env, tmp_path):
    """The loader serves data.rollout_batch_size rows of an empty user message (data.format_prompt left out); the
    engine generates from the chat template's rendering of the reset text as the user message, with the tools."""
    from easyrl.data.loader import ENV_PROMPTS, create_dataloaders
    from easyrl.trainer.main import dataset_options

    template = tmp_path / "template.jinja"
    template.write_text("{{ content }} Answer in one line.")
    overrides = ["trainer.max_steps=2", "data.rollout_batch_size=3", "worker.actor.global_batch_size=3"]
    overrides += [
        "worker.actor.micro_batch_size_per_device_for_update=1",
        "data.val_files=",
        f"data.format_prompt={template}",
    ]
    plan = load_run_plan(owning_args(valid_args, owning_env, *overrides))
    options = dataset_options(plan.config, None)
    train_loader, val_loader = create_dataloaders(plan.config.data, tokenizer, None, **options)
    assert val_loader is None and len(train_loader.dataset) == 3
    prompts = next(iter(train_loader))
    assert prompts.non_tensor_batch["data_source"].tolist() == [ENV_PROMPTS] * 3
    # warnings name a prompt as the environment's: there is no data.train_files to find a row in
    assert train_loader.dataset.place(2) == "the environment's prompt 2"

    done = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, llm = scripted_engine(tokenizer, {i: [done] for i in range(3)}, 32)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(env=owning_env, max_turns=1, tool_timeout=5.0))
    out = rollout.generate_sequences(prompts)
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Increment the counter by 2."}],
        tools=options["tools"],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert [tokenizer.decode(ids) for ids in llm.seen[0]] == [expected] * 3
    assert [tokenizer.decode(ids) for ids in out.non_tensor_batch["raw_prompt_ids"]] == [expected] * 3
    assert out.non_tensor_batch["env_get_reward"].tolist() == [0.0] * 3
    assert out.meta_info["metrics"]["rollout/multi_turn/env_errors"] == 0


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_grpo_steps_with_an_environment_that_owns_the_data_and_the_reward(tmp_path, owning_env):
    """`easyrl train` with no data file and no reward function, as TRL's example runs: the prompts are the reset
    texts, the reward is get_reward's."""
    from tests.fixtures.trainer_runs import small_tools_run, train_for_metrics

    args = small_tools_run(
        2,
        tmp_path / "checkpoints",
        "data.train_files=",
        "worker.reward.reward_function=",
        "worker.rollout.multi_turn.tools=",
        f"worker.rollout.multi_turn.env={owning_env}",
    )
    metrics = train_for_metrics(args, tmp_path, 2)
    for step in (1, 2):
        row = metrics[step]
        # the reward is get_reward's alone (env_reward.py puts it into overall: it is not added a second time)
        assert 0.0 <= row["reward/overall"] <= 1.0
        assert row["reward/overall"] == pytest.approx(row["rollout/multi_turn/env_reward/mean"])
        assert row["rollout/multi_turn/env_errors"] == 0 and row["reward/errors"] == 0
    log = (tmp_path / "train.log").read_text()
    assert "the environment owns the data" in log and "the reward is what it returns" in log


# Reset draws its task from a generator: seeded by reset's `seed` argument, or by nothing (then every trajectory of a
# prompt gets another task, which GRPO's group baseline cannot compare)
DRAWING_ENV = '''
import random


class DrawingEnv:
    def reset(self, seed=None, **kwargs):
        self.target = random.Random(seed).randint(1, 10**9)
        return f"Reach {self.target}."

    def get_reward(self) -> float:
        return 0.0

    def guess(self, number: int) -> str:
        """Guess the target.

        Args:
            number: The guess.
        """
        return "right" if number == self.target else "wrong"
'''


def drawn_targets(tokenizer, out) -> list[int]:
    texts = [tokenizer.decode(ids) for ids in out.non_tensor_batch["raw_prompt_ids"]]
    return [int(text.split("Reach ")[1].split(".")[0]) for text in texts]


def drawing_rollout(tokenizer, tmp_path, source):
    path = tmp_path / "drawing_env.py"
    path.write_text(source)
    done = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    engine, _ = scripted_engine(tokenizer, {i: [done] * 8 for i in range(6)}, 16)  # a turn per call
    return MultiTurnRollout(engine, MultiTurnConfig(env=f"{path}:DrawingEnv", max_turns=1, tool_timeout=5.0))


def empty_user_prompts(tokenizer, count, **columns):
    text = tokenizer.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    rows = [{key: values[i] for key, values in columns.items()} for i in range(count)]
    return padded_prompts([list(ids)] * count, 48, tokenizer.pad_token_id, row_columns=rows)


def test_reset_gets_a_seed_shared_by_the_samples_of_a_prompt_and_fixed_by_the_calls_seed(tokenizer, tmp_path, caplog):
    rollout = drawing_rollout(tokenizer, tmp_path, DRAWING_ENV)
    step = lambda seed: GenerationRequest(sampling_override={"n": 2}, seed=[1, 0, seed, 0])  # noqa: E731
    out = rollout.generate_sequences(empty_user_prompts(tokenizer, 3), step(5))
    targets = drawn_targets(tokenizer, out)
    # one task per prompt, the same for its two samples; three prompts, three tasks
    assert targets[0::2] == targets[1::2] and len(set(targets)) == 3, targets
    assert out.meta_info["metrics"]["rollout/multi_turn/reset_differs"] == 0
    # a resumed run's call of the same step resets as the first did; another step draws other tasks
    assert drawn_targets(tokenizer, rollout.generate_sequences(empty_user_prompts(tokenizer, 3), step(5))) == targets
    other = drawn_targets(tokenizer, rollout.generate_sequences(empty_user_prompts(tokenizer, 3), step(6)))
    assert other[0::2] == other[1::2] and not set(other) & set(targets)
    # a column named seed is the row's own and wins
    rows = empty_user_prompts(tokenizer, 3, seed=[11, 11, 12])
    expected = [random.Random(seed).randint(1, 10**9) for seed in (11, 11, 11, 11, 12, 12)]
    assert drawn_targets(tokenizer, rollout.generate_sequences(rows, step(5))) == expected
    assert "got different text from reset" not in caplog.text


def test_samples_of_a_prompt_reset_to_different_tasks_are_counted_and_said_once(tokenizer, tmp_path, caplog):
    unseeded = DRAWING_ENV.replace("random.Random(seed).randint", "random.randint")
    rollout = drawing_rollout(tokenizer, tmp_path, unseeded)
    request = GenerationRequest(sampling_override={"n": 2}, seed=[1, 0, 5, 0])
    for _ in range(2):
        out = rollout.generate_sequences(empty_user_prompts(tokenizer, 3), request)
        assert out.meta_info["metrics"]["rollout/multi_turn/reset_differs"] == 3
    assert caplog.text.count("the samples of 3 of 3 prompts got different text from reset") == 1
    assert "its `seed` argument" in caplog.text
    # one sample per prompt has nothing to compare
    single = rollout.generate_sequences(empty_user_prompts(tokenizer, 3), GenerationRequest(seed=[1, 0, 5, 0]))
    assert single.meta_info["metrics"]["rollout/multi_turn/reset_differs"] == 0


ASKED_REWARD = """
def asked(prompts, completions, **kwargs):  # TRL's call: the prompt holds what reset returned
    return [float(prompt[-1]["content"] == "Increment the counter by 2.") for prompt in prompts]
"""


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_trl_reward_function_reads_the_task_reset_put_in_the_prompt(tmp_path, owning_env):
    """The environment owns the data, a TRL reward function reads `prompts` (each holds its reset's task, as TRL
    hands it) and get_reward adds to it: overall = 1 + get_reward on every sample."""
    from tests.fixtures.trainer_runs import small_tools_run, train_for_metrics

    (tmp_path / "asked.py").write_text(ASKED_REWARD)
    args = small_tools_run(
        1,
        tmp_path / "checkpoints",
        "data.train_files=",
        f"worker.reward.reward_function={tmp_path / 'asked.py'}:asked",
        "worker.rollout.multi_turn.tools=",
        f"worker.rollout.multi_turn.env={owning_env}",
    )
    row = train_for_metrics(args, tmp_path, 1)[1]
    assert row["reward/errors"] == 0
    assert row["reward/overall"] == pytest.approx(1.0 + row["rollout/multi_turn/env_reward/mean"])


def test_generate_without_val_files_is_refused_before_the_model_loads_saying_what_rows_an_environment_takes(
    valid_args, owning_env, tmp_path
):
    from easyrl.cli import _generation_plan

    with pytest.raises(ConfigError, match="`data.val_files` is empty") as plain:
        _generation_plan(valid_args, "generate")
    assert "reset" not in str(plain.value)
    with pytest.raises(ConfigError, match=r'reset arguments, e.g. one \{"seed": N\} per line'):
        _generation_plan(owning_args(valid_args, owning_env), "eval")
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text('{"seed": 1}\n{"seed": 2}\n')
    plan = _generation_plan(owning_args(valid_args, owning_env, f"data.val_files={seeds}"), "eval")
    assert plan.config.data.val_files == str(seeds)
    assert plan.config.worker.reward.reward_function.endswith("reward_function/env_reward.py:compute_score")

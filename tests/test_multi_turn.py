"""Multi-turn rollouts with tools (worker.rollout.multi_turn): parsing, tool calls, chat-template tokens, the config
check, and the real vLLM engine in the FSDP worker (fp32, tiny model), whose model tokens must carry the actor's
log-probs and whose tool tokens must be in the sequence but out of response_mask."""

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.config import ConfigError, RolloutConfig, load_config
from easyrl.config import validate as config_check
from easyrl.config.schema import MultiTurnConfig
from easyrl.workers import tool_files
from easyrl.workers.rollout import multi_turn
from easyrl.workers.rollout.base import rollout_logprob_mismatch
from easyrl.workers.rollout.multi_turn import (
    MultiTurnRollout,
    ToolCall,
    ToolMessageRenderer,
    ToolResult,
    parse_hermes_tool_calls,
    run_tool_calls,
)
from easyrl.workers.tool_files import load_tools
from tests.rollout_helpers import PROMPT_LENGTH, make_prompts, rollout_worker_config


CALCULATOR = str(Path(__file__).resolve().parent.parent / "tools" / "calculator.py")
LOGPROB_TOLERANCE = 1e-3

# A tools file for the engine tests: a random tiny model never writes a tool call, so the file registers a parser
# that reads three calls from every turn (a working tool, one that raises, one that hangs); the engine, the template
# and the tools are all real.
SCRIPTED_TOOLS = '''
import time
from easyrl.workers.rollout.multi_turn import ToolCall, register_tool_call_parser


def echo(text: str, times: int = 1) -> str:
    """Answer ok.

    Args:
        text: Anything.
        times: How often.
    """
    assert isinstance(times, int)
    return "ok"


def boom() -> str:
    """Raise."""
    raise RuntimeError("boom")


def hang() -> str:
    """Never answer in time."""
    time.sleep(30)
    return "late"


@register_tool_call_parser("every_turn")
def every_turn(text):
    # `times` as a string, as small models write numbers: read as the integer the schema advertises, and counted
    return [ToolCall("echo", {"text": text[:5], "times": "1"}), ToolCall("boom", {}), ToolCall("hang", {})]


TOOLS = [echo, boom, hang]
'''
TOOL_TIMEOUT = 0.5
# what the SmolLM2 (ChatML) template renders for the three results, after a turn that ended without its stop token
SCRIPTED_TOOL_TEXT = (
    "<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n"
    "<|im_start|>tool\nError: boom raised RuntimeError: boom<|im_end|>\n"
    "<|im_start|>tool\nError: hang took longer than 0.5 s and was abandoned.<|im_end|>\n<|im_start|>assistant\n"
)


# ----------------------------------------------------------------------------------------------------------------------
# parsing and calling
# ----------------------------------------------------------------------------------------------------------------------
def test_hermes_parser_reads_every_call_and_names_malformed_ones():
    text = (
        'I will add. <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": "{\\"expression\\": \\"4*5\\"}"}\n</tool_call>'
        "<tool_call>{not json}</tool_call><tool_call>[1, 2]</tool_call>"
    )
    calls = parse_hermes_tool_calls(text)
    assert calls[0] == ToolCall("calculator", {"expression": "2+3"})
    assert calls[1] == ToolCall("calculator", {"expression": "4*5"})  # arguments sent as a JSON string
    assert calls[2].startswith("Error: the tool call is not valid JSON")
    assert calls[3] == 'Error: a tool call must be {"name": "<tool>", "arguments": {...}}.'
    assert parse_hermes_tool_calls("The answer is \\boxed{5}.") == []


def test_hermes_parser_reads_an_unclosed_call_to_the_turns_end_and_answers_one_without_arguments():
    # as vLLM's hermes parser: a call the model did not close (it stopped at its end-of-turn token) still runs, one
    # cut off inside its JSON (turn_max_tokens) is answered as malformed, not taken for a final answer
    assert parse_hermes_tool_calls(
        'Adding. <tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}'
    ) == [ToolCall("calculator", {"expression": "2+3"})]
    cut = parse_hermes_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "calc')
    assert cut[0] == ToolCall("a", {})
    assert cut[1].startswith("Error: the tool call is not valid JSON (Unterminated string starting at) (it has no ")
    # Llama's / verl's "parameters" is never run with the tool's defaults: the model is told what is missing
    calls = parse_hermes_tool_calls(
        '<tool_call>{"name": "calculator", "parameters": {"expression": "2+3"}}</tool_call>'
        '<tool_call>{"name": "now"}</tool_call><tool_call>{"name": "calculator", "arguments": [1]}</tool_call>'
    )
    shape = 'Error: a tool call must be {"name": "<tool>", "arguments": {...}}'
    assert calls == [
        f'{shape}; this one has no "arguments" (its keys: "name", "parameters").',
        f'{shape}; this one has no "arguments" (its keys: "name").',
        f'{shape}; its "arguments" is no JSON object.',
    ]


def test_tools_run_concurrently_and_a_raising_or_hanging_tool_becomes_a_counted_error():
    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return f"slept {seconds}"

    def boom() -> str:
        raise ZeroDivisionError("division by zero")

    tools = {"slow": slow, "boom": boom}
    calls = [ToolCall("slow", {"seconds": 0.4}), ToolCall("slow", {"seconds": 0.4}), ToolCall("boom", {})]
    calls += [ToolCall("slow", {"seconds": 30}), ToolCall("nope", {}), ToolCall("slow", {"bad": 1}), "Error: parse"]
    start = time.perf_counter()
    results, seconds = run_tool_calls(calls, tools, timeout=1.0)
    elapsed = time.perf_counter() - start
    assert [r.content for r in results[:3]] == [
        "slept 0.4",
        "slept 0.4",
        "Error: boom raised ZeroDivisionError: division by zero",
    ]
    assert results[3] == ToolResult("Error: slow took longer than 1 s and was abandoned.", error=True, timed_out=True)
    assert results[4].content == "Error: unknown tool 'nope'; the tools are: boom, slow."
    assert results[5].error and "unexpected keyword argument 'bad'" in results[5].content
    assert results[6] == ToolResult("Error: parse", error=True)
    assert [r.error for r in results] == [False, False, True, True, True, True, True]
    assert 1.0 <= elapsed < 2.0 and seconds == pytest.approx(elapsed, abs=0.05)  # the hung call did not hold the step


TYPED_TOOLS = '''
from typing import Optional


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def configure(
    enabled: bool, scale: Optional[float] = None, ids: Optional[list[int]] = None, counts: Optional[dict[str, int]] = None
) -> str:
    """Set a flag.

    Args:
        enabled: Whether it is on.
        scale: A factor.
        ids: Some ids.
        counts: Some counts.
    """
    return f"{enabled!r} {scale!r} {ids!r}" + (f" {counts!r}" if counts else "")


def lookup(key):
    return f"key {key!r}"


lookup.schema = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}},
}


class Counter:
    def reset(self, **columns):
        self.total = 0

    def bump(self, by: int) -> str:
        """Add to the count.

        Args:
            by: How much.
        """
        self.total += by
        return str(self.total)


TOOLS = [add, configure, lookup]
'''


def test_tool_arguments_are_read_as_their_schemas_types_or_refused_before_the_tool_runs(tmp_path, caplog):
    """A tool typed `int` got the string "2" a model wrote and computed "2" + "3" = "23"; "false" switched a flag on.
    A value whose text says the advertised type is read as it (and counted); any other is the model's error."""
    path = tmp_path / "typed.py"
    path.write_text(TYPED_TOOLS)
    tools = load_tools(str(path))
    env = tool_files.load_env_class(f"{path}:Counter")()
    env.reset()
    tools["bump"] = env.bump  # a tool environment's method, as a trajectory's tools hold it
    calls = [
        ToolCall("add", {"a": "2", "b": "3"}),
        ToolCall("add", {"a": 2.0, "b": 3}),
        ToolCall("configure", {"enabled": "false", "scale": "1.5", "ids": "[1, 2]"}),
        ToolCall("configure", {"enabled": True, "scale": None, "ids": [1, 2], "counts": {"a": "3"}}),
        ToolCall("lookup", {"key": 42}),
        ToolCall("bump", {"by": " 4 "}),
        ToolCall("add", {"a": "2x", "b": 1}),
        ToolCall("add", {"a": True, "b": 1}),
        ToolCall("configure", {"enabled": 1}),
        ToolCall("configure", {"enabled": False, "ids": [1, "x"]}),
        ToolCall("add", {"a": [1], "b": 2}),
    ]
    results, _ = run_tool_calls(calls, tools, timeout=5.0)
    with caplog.at_level("WARNING"):  # logged by the rollout, once per tool
        MultiTurnRollout._log_first_coercions(SimpleNamespace(_warned_coercions=set()), calls, results)
    assert [(r.content, r.error, len(r.coerced)) for r in results] == [
        ("5", False, 2),
        ("5", False, 1),
        ("False 1.5 [1, 2]", False, 3),
        ("True None [1, 2] {'a': 3}", False, 1),
        ("key '42'", False, 1),
        ("4", False, 1),
        ('Error: add: argument "a" must be an integer; got "2x" (a string).', True, 0),
        ('Error: add: argument "a" must be an integer; got true (a boolean).', True, 0),
        ('Error: configure: argument "enabled" must be a boolean; got 1 (an integer).', True, 0),
        ('Error: configure: argument "ids[1]" must be an integer; got "x" (a string).', True, 0),
        ('Error: add: argument "a" must be an integer; got [1] (an array).', True, 0),
    ]
    assert env.total == 4
    warned = [r.getMessage() for r in caplog.records if "read as the advertised type" in r.getMessage()]
    assert any(m.startswith("Tool 'add' got arguments") and "\"a\" = '2' read as an integer" in m for m in warned)


ODD_RESULT_TOOLS = '''
class Box:
    pass


def forgot(x: int) -> str:
    """Forgets to return.

    Args:
        x: anything
    """
    if x > 100:
        return "big"


def lazy(n: int) -> str:
    """Returns a generator.

    Args:
        n: how many
    """
    return (str(i) for i in range(n))


def boxed(n: int) -> str:
    """Returns an object without its own str().

    Args:
        n: anything
    """
    return Box()


def fine(n: int) -> str:
    """Returns text.

    Args:
        n: anything
    """
    return str(n)


TOOLS = [forgot, lazy, boxed, fine]
'''


def test_a_tool_returning_none_a_generator_or_a_bare_object_is_said_once_per_tool(tmp_path, caplog, monkeypatch):
    """The model read 'None' or '<generator object ...>' (a branch without return, a generator not made a list)
    and nothing said so: the result is still shown as documented, and the tool is named once."""
    monkeypatch.setattr(multi_turn, "_ODD_RESULTS_SAID", set())
    path = tmp_path / "odd.py"
    path.write_text(ODD_RESULT_TOOLS)
    tools = load_tools(str(path))
    calls = [ToolCall(name, {"x" if name == "forgot" else "n": 2}) for name in ("forgot", "lazy", "boxed", "fine")]
    with caplog.at_level("WARNING"):
        results, _ = run_tool_calls(calls * 2, tools, timeout=5.0)
    assert results[0].content == "None" and results[1].content.startswith("<generator object")
    said = [r.getMessage() for r in caplog.records if "Said once per tool" in r.getMessage()]
    assert len(said) == 3, said
    assert any(m.startswith("Tool 'forgot' returned None (a branch without `return`?)") for m in said)
    assert any(m.startswith("Tool 'lazy' returned a generator") and "return list(...)" in m for m in said)
    assert any(m.startswith("Tool 'boxed' returned a Box without its own str()") for m in said)


def test_a_call_missing_a_required_argument_or_naming_an_unknown_one_is_the_models_error_not_the_tools(tmp_path):
    """Both read as "add raised TypeError: ...", as if the tool had failed; the tool does not run."""
    path = tmp_path / "typed.py"
    path.write_text(TYPED_TOOLS)
    tools = load_tools(str(path))
    calls = [ToolCall("add", {"a": 1}), ToolCall("add", {"a": 1, "b": 2, "c": 3}), ToolCall("add", {"a": 1, "b": 2})]
    results, _ = run_tool_calls(calls, tools, timeout=5.0)
    assert [(r.content, r.error) for r in results] == [
        ('Error: add: missing required argument(s) "b".', True),
        ('Error: add: unknown argument(s) "c"; it takes: a, b.', True),
        ("3", False),
    ]


SCHEMA_TOOL = """
def f(x, scale=1.0{extra}):
    return x


f.schema = {{"type": "function", "function": {{"name": "f", "parameters": {parameters}}}}}
TOOLS = [f]
"""


@pytest.mark.parametrize(
    ("extra", "parameters", "message"),
    [
        ("", '"notadict"', "`parameters` is 'notadict'; it must be a JSON object schema"),
        ("", '{"type": "string"}', "`parameters` is {'type': 'string'}; it must be a JSON object schema"),
        (
            "",
            '{"type": "object", "properties": {"x": {}, "y": {"type": "string"}}}',
            "advertises argument(s) y, which the function does not take (it takes scale, x)",
        ),
        ("", '{"type": "object", "properties": {"scale": {}}}', "leaves out x, which the function requires"),
        (", **kwargs", '{"type": "object", "properties": {"x": {}, "y": {}}}', None),
    ],
)
def test_a_schema_attribute_is_checked_against_the_functions_parameters(tmp_path, extra, parameters, message):
    path = tmp_path / "schema_tools.py"
    path.write_text(SCHEMA_TOOL.format(extra=extra, parameters=parameters))
    if message is None:  # a function taking **kwargs takes any property
        assert list(load_tools(str(path))) == ["f"]
        return
    with pytest.raises(ValueError) as error:
        load_tools(str(path))
    assert str(error.value).startswith(f"`worker.rollout.multi_turn.tools`: `f.schema` in `{path}`")
    assert message in str(error.value)


def test_a_kwargs_tool_without_a_schema_is_told_to_give_it_one(tmp_path):
    path = tmp_path / "kwargs_tools.py"
    path.write_text('def kw(**kwargs) -> str:\n    """Anything."""\n    return "x"\n\n\nTOOLS = [kw]\n')
    with pytest.raises(ValueError) as error:
        load_tools(str(path))
    assert f"no JSON schema for `kw` in `{path}`: it takes `**kwargs`" in str(error.value)
    assert "Give it a `schema` attribute" in str(error.value)


def test_the_first_error_and_the_first_timeout_of_each_tool_are_logged_once(caplog):
    """The counts alone did not say which tool failed, nor why (an environment's failures were logged, a tool's not)."""

    def boom() -> str:
        raise RuntimeError("kaputt")

    def hang() -> str:
        time.sleep(30)

    calls = [ToolCall("boom", {}), ToolCall("hang", {}), ToolCall("boom", {}), ToolCall("hang", {})]
    results, _ = run_tool_calls(calls, {"boom": boom, "hang": hang}, timeout=0.3)
    rollout = SimpleNamespace(_warned_tools=set())
    with caplog.at_level("WARNING"):
        MultiTurnRollout._log_first_failures(rollout, calls, results)
        MultiTurnRollout._log_first_failures(rollout, calls, results)  # a later turn or step: said already
    logged = [record.getMessage() for record in caplog.records]
    assert len(logged) == 2
    assert logged[0].startswith("Tool 'boom': the model read 'Error: boom raised RuntimeError: kaputt' (counted in ")
    assert logged[1].startswith("Tool 'hang': the model read 'Error: hang took longer than 0.3 s and was abandoned.'")
    assert "rollout/multi_turn/tool_timeouts and tool_errors" in logged[1] and "blocks its event loop" in logged[1]


def test_calls_abandoned_at_their_deadline_that_still_run_are_counted_and_said_once(caplog):
    """An abandoned CPU-bound call kept running in the worker that also trains, slowing it more every step, unsaid."""
    done = threading.Event()

    def spin() -> str:
        done.wait(30)
        return "late"

    calls = [ToolCall("spin", {}), ToolCall("spin", {})]
    held: list = []  # a rollout's own list: another rollout's abandoned calls are not its to report
    run_tool_calls(calls, {"spin": spin}, timeout=0.2, abandoned=held)
    assert multi_turn.abandoned_still_running(held)["tool-spin"] == 2
    rollout = SimpleNamespace(_warned_running=set(), _abandoned=held)
    with caplog.at_level("WARNING"):
        assert MultiTurnRollout._warn_abandoned(rollout) >= 2
        assert MultiTurnRollout._warn_abandoned(rollout) >= 2  # said once
    logged = [r.getMessage() for r in caplog.records if "still run in this worker" in r.getMessage()]
    assert len(logged) == 1 and "tool-spin x2" in logged[0]
    done.set()
    deadline = time.monotonic() + 10
    while multi_turn.abandoned_still_running(held)["tool-spin"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert multi_turn.abandoned_still_running(held)["tool-spin"] == 0 and held == []  # finished ones are dropped


def test_a_wait_without_deadline_says_every_interval_that_it_is_still_waiting(monkeypatch):
    """An environment whose __init__ hung froze the run without a line: no deadline applies to constructors."""
    monkeypatch.setattr(multi_turn, "INIT_NOTICE_S", 0.2)
    said = []
    jobs = [lambda: multi_turn.EnvOutcome(), lambda: time.sleep(0.7) or multi_turn.EnvOutcome(env="built")]
    outcomes, seconds = multi_turn.run_with_deadline(jobs, None, "__init__", lambda s, left: said.append((s, left)))
    assert [outcome.env for outcome in outcomes] == [None, "built"] and 0.7 <= seconds < 1.5
    assert 2 <= len(said) <= 4 and all(left == 1 for _, left in said)
    assert all(0.15 < b - a < 0.45 for (a, _), (b, _) in zip(said, said[1:]))  # once per interval


def test_a_tool_calling_sys_exit_is_an_error_of_that_call_not_a_timeout():
    """SystemExit is no Exception: the tool's thread ended without a result and the call was reported as one that took
    longer than tool_timeout, though it returned at once."""

    def leave(code: int) -> str:
        raise SystemExit(code)

    results, seconds = run_tool_calls([ToolCall("leave", {"code": 3})], {"leave": leave}, timeout=5.0)
    assert results == [ToolResult("Error: leave raised SystemExit: 3", error=True)]
    assert seconds < 2.0


def test_calculator_tool_evaluates_arithmetic_and_refuses_anything_else():
    tools = load_tools(CALCULATOR)
    calculator = tools["calculator"]
    assert list(tools) == ["calculator"]
    assert calculator("12 * (3 + 4)") == "84"
    assert calculator("7 / 2") == "3.5"
    assert calculator("-3 + 10 / 2") == "2"
    for bad in ["__import__('os').system('true')", "2 ** 1000", "x + 1", "open('f')"]:
        with pytest.raises(ValueError):
            calculator(bad)


RENAMED_TOOL = '''
def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: First.
        b: Second.
    """
    return a + b


def add_v2(a: int, b: int) -> int:
    """Add again: renamed to `add` by its schema.

    Args:
        a: First.
        b: Second.
    """
    return -999


add_v2.schema = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


def delete_everything(path: str) -> str:
    """Delete a path.

    Args:
        path: The path.
    """
    return "deleted " + path


TOOLS = [add, add_v2, delete_everything]
'''


def test_two_tools_of_one_name_are_refused_naming_the_name_both_functions_and_the_file(tmp_path):
    path = tmp_path / "renamed.py"
    path.write_text(RENAMED_TOOL)
    message = (
        f"`worker.rollout.multi_turn.tools`: `{path}` has two tools named 'add': `add` and `add_v2`; the model would "
        "be shown 'add' twice"
    )
    with pytest.raises(ValueError) as error:
        load_tools(str(path))
    assert message in str(error.value)
    with pytest.raises(ValueError) as error:  # what the trainer calls before Ray to build the prompts
        tool_files.tool_schemas(str(path))
    assert message in str(error.value)
    path.write_text(RENAMED_TOOL.replace("[add, add_v2, delete_everything]", "[add, delete_everything, add]"))
    with pytest.raises(ValueError, match=f"`{path}` lists `add` twice"):
        load_tools(str(path))
    path.write_text(RENAMED_TOOL.replace("add_v2.schema = ", "unused = "))
    tools = load_tools(str(path))  # each name bound to its own function
    assert list(tools) == ["add", "add_v2", "delete_everything"]
    assert [tools["add"](1, 2), tools["add_v2"](1, 2), tools["delete_everything"]("x")] == [3, -999, "deleted x"]


CALLABLE_TOOLS = '''
import functools


class Searcher:
    def __call__(self, query: str) -> str:
        """Search the notes.

        Args:
            query: What to look for.
        """
        return "nothing"


def power(base: float, exponent: float) -> float:
    """Raise a number to a power.

    Args:
        base: The number.
        exponent: The power.
    """
    return base**exponent
'''


@pytest.mark.parametrize(
    ("listed", "kind"),
    [("Searcher()", "a Searcher object"), ("functools.partial(power, exponent=2)", "a functools.partial")],
)
def test_a_callable_object_or_a_partial_as_a_tool_is_told_to_become_a_function(tmp_path, listed, kind):
    """Both were refused with transformers' "... is not a module, class, method, or function.." and advice to add the
    type hints and docstring they had; a `schema` attribute still makes any callable a tool."""
    path = tmp_path / "callables.py"
    path.write_text(f"{CALLABLE_TOOLS}\nTOOLS = [{listed}]\n")
    with pytest.raises(ValueError) as error:
        load_tools(str(path))
    assert f"`{path}` lists {kind}, not a function, as a tool" in str(error.value)
    assert "Wrap it in a `def`" in str(error.value)
    argument = {"type": "string"} if listed == "Searcher()" else {"type": "number"}
    properties = {"query" if listed == "Searcher()" else "base": argument}
    schema = {
        "type": "function",
        "function": {"name": "search", "parameters": {"type": "object", "properties": properties}},
    }
    path.write_text(f"{CALLABLE_TOOLS}\nsearcher = {listed}\nsearcher.schema = {schema!r}\nTOOLS = [searcher]\n")
    assert list(load_tools(str(path))) == ["search"]


@pytest.mark.parametrize(
    "schema", ['"calc(expression: str)"', '{"type": "function", "function": {"description": "x"}}']
)
def test_a_schema_that_is_no_openai_dict_with_a_name_is_refused_naming_the_tool_and_the_file(tmp_path, schema):
    path = tmp_path / "schema_tools.py"
    path.write_text(f"def calc(expression):\n    return expression\n\n\ncalc.schema = {schema}\nTOOLS = [calc]\n")
    with pytest.raises(ValueError) as error:
        load_tools(str(path))
    assert str(error.value).startswith(f"`worker.rollout.multi_turn.tools`: `calc.schema` in `{path}` is ")
    assert "it must be an OpenAI-style dict" in str(error.value)
    # the bare function object (verl's and OpenAI's function) names the tool too
    path.write_text(
        'def calc(expression):\n    return expression\n\n\ncalc.schema = {"name": "calc2", "parameters": {"type": '
        '"object", "properties": {"expression": {"type": "string"}}}}\nTOOLS = [calc]\n'
    )
    assert list(load_tools(str(path))) == ["calc2"]


def test_a_tool_file_importing_a_helper_next_to_it_is_told_its_folder_is_not_on_the_import_path(tmp_path):
    (tmp_path / "my_helpers.py").write_text("def double(x):\n    return 2 * x\n")
    path = tmp_path / "uses_helper.py"
    path.write_text("from my_helpers import double\n\nTOOLS = [double]\n")
    with pytest.raises(ValueError) as error:
        load_tools(str(path))
    message = str(error.value)
    assert message.startswith(
        f"`worker.rollout.multi_turn.tools`: importing `{path}` failed with ModuleNotFoundError: No module named "
        f"'my_helpers'. `my_helpers` is next to it in `{tmp_path}`, but easyrl imports the file by its path, so that "
        f"folder is not on the import path. Put it there (PYTHONPATH={tmp_path}"
    )
    assert "pip install my_helpers" not in message
    # a module that is nowhere to be found still gets the hint to install it
    path.write_text("import no_such_package_here\n\nTOOLS = []\n")
    with pytest.raises(ValueError, match="Install the missing package into this environment"):
        load_tools(str(path))


def test_tool_results_become_tool_messages_of_the_chat_template(tokenizer):
    renderer = ToolMessageRenderer(tokenizer)
    assert renderer.role == "tool"  # SmolLM2's ChatML template renders any role
    messages = renderer.messages([ToolCall("calculator", {}), "Error: bad"], [ToolResult("5"), ToolResult("x", True)])
    assert messages == [
        {"role": "tool", "name": "calculator", "content": "5"},
        {"role": "tool", "name": "error", "content": "x"},
    ]
    expected = "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>tool\nx<|im_end|>\n<|im_start|>assistant\n"
    # after a turn that ended with <|im_end|> (the model's stop token) the template's own <|im_end|> is not repeated
    assert tokenizer.decode(renderer.token_ids(messages, "<|im_end|>")) == expected
    assert renderer.token_ids(messages, "<|im_end|>") == tokenizer.encode(expected, add_special_tokens=False)
    assert tokenizer.decode(renderer.token_ids(messages, "")) == "<|im_end|>" + expected


def test_parser_names_of_the_check_are_the_registered_ones():
    assert config_check.TOOL_CALL_PARSERS == tuple(sorted(multi_turn.TOOL_CALL_PARSERS))


# ----------------------------------------------------------------------------------------------------------------------
# the config check, before Ray
# ----------------------------------------------------------------------------------------------------------------------
def test_check_accepts_the_calculator_tools_file(valid_args):
    config = load_config([*valid_args, f"worker.rollout.multi_turn.tools={CALCULATOR}"])
    assert config.worker.rollout.multi_turn.enabled and config.worker.rollout.multi_turn.max_turns == 4


@pytest.mark.parametrize(
    "source, message",
    [
        (None, "`worker.rollout.multi_turn.tools`: file `{path}` does not exist."),
        ("def f():\n    pass\n", "`worker.rollout.multi_turn.tools`: `{path}` defines no module-level `TOOLS`"),
        ("def f():\n    pass\n\nTOOLS = [f, g]\n", "`TOOLS` in `{path}` names g, which the file does not define."),
        ("def f(:\n", "`worker.rollout.multi_turn.tools`: `{path}` line 1"),
    ],
)
def test_check_refuses_a_bad_tools_file_naming_the_key(valid_args, tmp_path, source, message):
    path = tmp_path / "my_tools.py"
    if source is not None:
        path.write_text(source)
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, f"worker.rollout.multi_turn.tools={path}"])
    assert message.format(path=path) in str(error.value)


def test_check_refuses_tools_given_as_file_colon_function_saying_tools_are_a_file_listing_them(valid_args, tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text('def g(x: int) -> int:\n    """G.\n\n    Args:\n        x: X.\n    """\n    return x\n')
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, f"worker.rollout.multi_turn.tools={path}:g"])
    assert str(error.value) == (
        f"`worker.rollout.multi_turn.tools` is '{path}:g': tools are a file whose module-level `TOOLS` lists them, "
        f"given without `:name`; write worker.rollout.multi_turn.tools={path} with `TOOLS = [g, ...]` in it."
    )


def test_check_refuses_tools_with_the_hf_rollout_and_an_unknown_parser(valid_args):
    with pytest.raises(ConfigError, match="multi-turn rollouts run on the vllm engine only"):
        load_config([*valid_args, f"worker.rollout.multi_turn.tools={CALCULATOR}", "worker.rollout.name=hf"])
    with pytest.raises(ConfigError, match="worker.rollout.multi_turn.parser"):
        load_config(
            [*valid_args, f"worker.rollout.multi_turn.tools={CALCULATOR}", "worker.rollout.multi_turn.parser=x"]
        )


def test_check_accepts_a_parser_the_tools_file_registers(valid_args, tmp_path):
    path = tmp_path / "scripted_tools.py"
    path.write_text(SCRIPTED_TOOLS)
    tools = f"worker.rollout.multi_turn.tools={path}"
    config = load_config([*valid_args, tools, "worker.rollout.multi_turn.parser=every_turn"])
    assert config.worker.rollout.multi_turn.parser == "every_turn"
    with pytest.raises(ConfigError) as error:
        load_config([*valid_args, tools, "worker.rollout.multi_turn.parser=other"])
    assert "`worker.rollout.multi_turn.parser` is 'other'; choose one of: hermes, every_turn" in str(error.value)


# ----------------------------------------------------------------------------------------------------------------------
# turn bookkeeping with a scripted turn source (the engine path is tested below with the real engine)
# ----------------------------------------------------------------------------------------------------------------------
class ScriptedTurns:
    """Stands in for the engine's generate call only: returns the scripted token ids of each trajectory's next turn
    (trajectories numbered among those still running), with log-prob -(turn + 1) / 10 on every token, and records
    the prompts it was given."""

    def __init__(self, turns: dict[int, list[list[int]]]):
        self.turns, self.seen = turns, []

    def generate(self, inputs, params, use_tqdm, lora_request):
        self.seen.append([item["prompt_token_ids"] for item in inputs])
        outputs = []
        for param in params:
            trajectory, turn = param.trajectory, param.turn
            ids = self.turns[trajectory][turn][: param.max_tokens]
            logprobs = [{token: SimpleNamespace(logprob=-(turn + 1) / 10)} for token in ids]
            outputs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs)]))
        return outputs


def scripted_engine(tokenizer, turns, response_length):
    """The attributes MultiTurnRollout reads of a VLLMRollout, with the scripted turns in place of ``llm.generate``:
    (engine, the scripted llm)."""
    config = RolloutConfig(n=1, temperature=1.0, response_length=response_length, prompt_length=PROMPT_LENGTH)
    llm = ScriptedTurns(turns)
    calls = {"turn": -1}

    def sampling_params(settings, count, seed):
        calls["turn"] += 1
        return [SimpleNamespace(trajectory=i, turn=calls["turn"], max_tokens=None) for i in range(count)]

    engine = SimpleNamespace(
        config=config,
        dp_rank=0,
        tokenizer=tokenizer,
        pad_token_id=tokenizer.pad_token_id,
        stop_token_ids=[tokenizer.eos_token_id],
        llm=llm,
        _lora_request=None,
        _last_sync_metrics={},
        _wake=lambda tags: None,
        _sampling_params=sampling_params,
    )
    return engine, llm


def _scripted_rollout(tokenizer, turns, response_length, max_turns):
    engine, llm = scripted_engine(tokenizer, turns, response_length)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(tools=CALCULATOR, max_turns=max_turns, tool_timeout=5.0))
    return rollout, llm


def test_turns_are_assembled_with_tool_tokens_masked_out(tokenizer):
    eos = tokenizer.eos_token_id
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call = encode('<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call>') + [eos]
    answer = encode("It is \\boxed{7}.") + [eos]
    # one prompt calls the tool then answers; the other answers at once
    rollout, llm = _scripted_rollout(tokenizer, {0: [call, answer], 1: [answer]}, response_length=128, max_turns=3)
    prompts = make_prompts(tokenizer, ["What is 3 + 4?", "Say 7."])
    out = rollout.generate_sequences(prompts)
    tool = encode("\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n")
    first = call + tool + answer
    responses, mask = out.batch["responses"], out.batch["response_mask"]
    assert responses[0, : len(first)].tolist() == first
    assert mask[0, : len(first)].tolist() == [1] * len(call) + [0] * len(tool) + [1] * len(answer)
    assert mask[0, len(first) :].sum() == 0 and mask[1].tolist()[: len(answer) + 1] == [1] * len(answer) + [0]
    assert out.batch["attention_mask"][0, PROMPT_LENGTH:].sum() == len(first)  # tool tokens are attended to
    log_probs = out.batch["rollout_log_probs"][0, : len(first)]
    expected = [-0.1] * len(call) + [0.0] * len(tool) + [-0.2] * len(answer)
    torch.testing.assert_close(log_probs, torch.tensor(expected))
    # the second turn was generated from the prompt, the first turn and the tool tokens: exactly the actor's input
    raw = prompts.non_tensor_batch["raw_prompt_ids"]
    assert llm.seen == [[raw[0], raw[1]], [list(raw[0]) + call + tool]]
    assert out.non_tensor_batch["messages"][0] == [
        {"role": "assistant", "content": tokenizer.decode(call, skip_special_tokens=True)},
        {"role": "tool", "name": "calculator", "content": "7"},
        {"role": "assistant", "content": "It is \\boxed{7}."},
    ]
    # the generations table tells the model's text from the tool's (its `response` cannot: special tokens are gone)
    from easyrl.trainer.ray_trainer import PPOTrainer

    out.non_tensor_batch["ground_truth"] = np.array(["7", "7"], dtype=object)
    trainer = SimpleNamespace(global_step=3, tokenizer=tokenizer)
    samples = PPOTrainer._decode_samples(trainer, out, [1.0, 0.0])
    assert samples[0]["turns"] == (
        f"[assistant] {tokenizer.decode(call, skip_special_tokens=True)}\n[tool calculator] 7\n"
        "[assistant] It is \\boxed{7}."
    )
    assert samples[1]["turns"] == "[assistant] It is \\boxed{7}." and samples[1]["step"] == 3
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/multi_turn/turns/mean"] == 1.5 and metrics["rollout/multi_turn/turns/max"] == 2
    assert metrics["rollout/multi_turn/tool_calls"] == 1 and metrics["rollout/multi_turn/tool_errors"] == 0
    assert metrics["rollout/multi_turn/truncated"] == 0
    assert metrics["rollout/response_length/mean"] == (len(call) + 2 * len(answer)) / 2  # model tokens only


def test_a_lone_surrogate_a_tool_hands_back_reaches_the_model_as_a_replacement_character(tokenizer, tmp_path):
    """JSON's "\\ud800" escape in a call's arguments decodes to a lone surrogate; a tool quoting its argument returned
    it, and the tokenizer's TypeError on the tool message ended the step (and the run)."""
    tools = tmp_path / "echo.py"
    tools.write_text(
        "def search(query: str) -> str:\n"
        '    """Search the notes.\n\n    Args:\n        query: what to look for\n    """\n'
        '    return f"No results for {query}."\n\n'
        "TOOLS = [search]\n"
    )
    eos = tokenizer.eos_token_id
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call = encode('<tool_call>{"name": "search", "arguments": {"query": "\\ud800"}}</tool_call>') + [eos]
    answer = encode("Nothing found.") + [eos]
    engine, _ = scripted_engine(tokenizer, {0: [call, answer]}, response_length=128)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(tools=str(tools), max_turns=3, tool_timeout=5.0))
    out = rollout.generate_sequences(make_prompts(tokenizer, ["Find the note."]))
    assert out.non_tensor_batch["messages"][0][1] == {
        "role": "tool",
        "name": "search",
        "content": "No results for \ufffd.",
    }
    assert out.meta_info["metrics"]["rollout/multi_turn/tool_errors"] == 0
    tool = encode("\n<|im_start|>tool\nNo results for \ufffd.<|im_end|>\n<|im_start|>assistant\n")
    assert out.batch["responses"][0, : len(call) + len(tool)].tolist() == call + tool


def test_a_result_far_over_the_budget_is_cut_before_it_is_tokenized_and_kept_cut(tokenizer, tmp_path, caplog):
    """A tool returning a megabyte was tokenized whole per trajectory and kept whole in `messages` (and so in every
    file of turns), though the model read a few dozen tokens of it. The model reads the same tokens either way."""
    tools = tmp_path / "dump.py"
    tools.write_text(
        "def dump(part: int) -> str:\n"
        '    """Dump the log.\n\n    Args:\n        part: which part\n    """\n'
        '    return "line of the log, " * 70_000 if part else "short"\n\n'
        "TOOLS = [dump]\n"
    )
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call = encode('<tool_call>{"name": "dump", "arguments": {"part": 1}}</tool_call>') + [tokenizer.eos_token_id]
    budget = len(call) + 40
    engine, _ = scripted_engine(tokenizer, {0: [call, call]}, response_length=budget)
    rollout = MultiTurnRollout(engine, MultiTurnConfig(tools=str(tools), max_turns=3, tool_timeout=5.0))
    with caplog.at_level("WARNING"):
        out = rollout.generate_sequences(make_prompts(tokenizer, ["Read the log."]))
    kept = out.non_tensor_batch["messages"][0][1]["content"]
    limit = 40 * max(map(len, tokenizer.get_vocab()))
    assert len(kept) == limit and ("line of the log, " * 70_000).startswith(kept)
    assert (
        f"Tool 'dump' returned {17 * 70_000} characters where its trajectory had room for 40 more tokens"
        in caplog.text
    )
    assert out.meta_info["metrics"]["rollout/multi_turn/truncated"] == 1
    stop = tokenizer.decode([tokenizer.eos_token_id])  # the call ended with the stop token
    messages = rollout.renderer.messages([ToolCall("dump", {})], [ToolResult("line of the log, " * 70_000)])
    whole = rollout.renderer.token_ids(messages, stop)
    assert out.batch["responses"][0, len(call) :].tolist() == whole[:40]  # what the model read did not change


def test_max_turns_and_the_token_budget_end_trajectories_and_are_counted(tokenizer):
    eos = tokenizer.eos_token_id
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'
    call = tokenizer.encode(text, add_special_tokens=False) + [eos]
    # trajectory 0 keeps calling (max_turns=2 ends it), trajectory 1 runs out of budget inside its tool result
    rollout, _ = _scripted_rollout(tokenizer, {0: [call, call], 1: [call, call]}, response_length=128, max_turns=2)
    out = rollout.generate_sequences(make_prompts(tokenizer, ["a", "b"]))
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/multi_turn/max_turns_reached"] == 2  # both called a tool in their last turn
    assert metrics["rollout/multi_turn/tool_errors"] == 2  # 1/0 raised once per trajectory, in turn 1
    assert metrics["rollout/multi_turn/tool_calls"] == 2  # the calls of the last turn are not run
    messages = out.non_tensor_batch["messages"][0]
    assert messages[1]["content"] == "Error: calculator raised ZeroDivisionError: division by zero"

    budget = len(call) + 5  # the tool result does not fit: cut, and no further turn
    rollout, llm = _scripted_rollout(tokenizer, {0: [call, call]}, response_length=budget, max_turns=4)
    out = rollout.generate_sequences(make_prompts(tokenizer, ["a"]))
    assert out.meta_info["metrics"]["rollout/multi_turn/truncated"] == 1 and len(llm.seen) == 1
    assert out.batch["response_mask"][0].tolist() == [1] * len(call) + [0] * 5
    assert out.batch["attention_mask"][0, PROMPT_LENGTH:].tolist() == [1] * budget
    # cut at the limit, though the model wrote fewer tokens than the limit: the clip ratio counts the whole span
    assert out.meta_info["metrics"]["rollout/response_length/clip_ratio"] == 1.0


def test_the_reward_reads_the_whole_trajectory_and_sits_on_the_models_last_token(tokenizer):
    from easyrl.config import RewardConfig
    from easyrl.protocol import DataProto
    from easyrl.workers.reward.scorer import RewardScorer

    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call = encode('<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call><|im_end|>')
    tool = encode("\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n")
    answer = encode("\\boxed{7}<|im_end|>")
    tokens, width = call + tool + answer, len(call + tool + answer) + 3
    responses = torch.full((1, width), tokenizer.pad_token_id)
    responses[0, : len(tokens)] = torch.tensor(tokens)
    model = torch.tensor([[1] * len(call) + [0] * len(tool) + [1] * len(answer) + [0] * 3])
    attended = torch.tensor([[1] * len(tokens) + [0] * 3])
    messages = np.empty(1, dtype=object)
    messages[0] = [
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "\\boxed{7}"},
    ]
    data = DataProto.from_dict(
        tensors={"responses": responses, "response_mask": model, "attention_mask": torch.cat([attended] * 2, -1)},
        non_tensors={"ground_truth": np.array(["7"], dtype=object), "messages": messages},
    )
    root = Path(__file__).resolve().parent.parent
    scorer = RewardScorer(
        RewardConfig(reward_function=str(root / "reward_function" / "arithmetic.py")), tokenizer, in_process=True
    )
    (item,) = scorer.build_inputs(data)
    assert item["response_length"] == len(tokens) and item["response"].endswith("7\nassistant\n\\boxed{7}")
    assert item["messages"] == messages[0]
    scores, _ = scorer.score(data)
    assert scores[0, len(tokens) - 1] == 1.0 and scores.sum() == 1.0  # the answer's <|im_end|>, a model token


# ----------------------------------------------------------------------------------------------------------------------
# the real engine in the FSDP worker
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def multi_turn_worker(ray_cluster, tiny_model_path, tmp_path_factory):
    from easyrl.workers.fsdp_worker import FSDPWorker
    from tests.fsdp_helpers import worker_group

    tools_file = tmp_path_factory.mktemp("tools") / "scripted_tools.py"
    tools_file.write_text(SCRIPTED_TOOLS)
    config = rollout_worker_config(tiny_model_path, 1)
    rollout = config.rollout
    rollout.response_length = 160
    rollout.max_model_len = PROMPT_LENGTH + rollout.response_length
    rollout.multi_turn = MultiTurnConfig(
        tools=str(tools_file), max_turns=3, turn_max_tokens=6, tool_timeout=TOOL_TIMEOUT, parser="every_turn"
    )
    with worker_group(
        FSDPWorker, config, "actor_rollout", name_prefix="multiturn", process_group_timeout_s=240
    ) as group:
        group.init_model()
        yield group


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal values."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


@pytest.mark.timeout(400)
def test_engine_trajectories_mask_exactly_the_model_tokens_and_match_the_actor(multi_turn_worker, tokenizer):
    from easyrl.workers.rollout.base import GenerationRequest

    prompts = make_prompts(tokenizer)
    out = multi_turn_worker.generate_sequences(prompts, GenerationRequest(sampling_override={"n": 2}, seed=3))
    batch = out.batch
    tool_ids = tokenizer.encode(SCRIPTED_TOOL_TEXT, add_special_tokens=False)
    stopped_tool_ids = tokenizer.encode(SCRIPTED_TOOL_TEXT[len("<|im_end|>") :], add_special_tokens=False)
    attended = batch["attention_mask"][:, PROMPT_LENGTH:]
    for row in range(len(out)):
        length = int(attended[row].sum())
        mask = batch["response_mask"][row, :length].tolist()
        tokens = batch["responses"][row, :length].tolist()
        messages = out.non_tensor_batch["messages"][row]
        model_runs = [(s, e) for v, s, e in _runs(mask) if v == 1]
        tool_runs = [(s, e) for v, s, e in _runs(mask) if v == 0]
        # 3 turns of at most 6 tokens, the tool results after the first two (max_turns=3: the last calls are not run)
        assert len(model_runs) == 3 and all(e - s <= 6 for s, e in model_runs)
        assert len(tool_runs) == 2
        for (s, e), (ms, _) in zip(tool_runs, model_runs):
            stopped = tokens[ms:s][-1] == tokenizer.eos_token_id
            assert tokens[s:e] == (stopped_tool_ids if stopped else tool_ids)
        assert [m["role"] for m in messages] == ["assistant", "tool", "tool", "tool"] * 2 + ["assistant"]
        log_probs = batch["rollout_log_probs"][row, :length]
        assert (log_probs[torch.tensor(mask) == 0] == 0).all() and (log_probs[torch.tensor(mask) == 1] < 0).all()
        assert np.isclose(float(batch["response_mask"][row, length:].sum()), 0.0)
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/multi_turn/turns/mean"] == 3 and metrics["rollout/multi_turn/max_turns_reached"] == 8
    assert metrics["rollout/multi_turn/tool_calls"] == 8 * 2 * 3
    assert metrics["rollout/multi_turn/tool_errors"] == 8 * 2 * 2 and metrics["rollout/multi_turn/tool_timeouts"] == 16
    assert metrics["rollout/multi_turn/tool_args_coerced"] == 8 * 2
    # the same counts per sample, which `easyrl generate` / `easyrl eval` write into each row and sum
    counts = out.non_tensor_batch["multi_turn_counts"]
    assert len(counts) == len(out) and all(c["turns"] == 3 and c["max_turns_reached"] == 1 for c in counts)
    for name in ("tool_calls", "tool_errors", "tool_timeouts", "tool_args_coerced", "truncated"):
        assert sum(c[name] for c in counts) == metrics[f"rollout/multi_turn/{name}"], name
    assert metrics["rollout/multi_turn/tool_seconds"] >= 2 * TOOL_TIMEOUT
    # the actor scores the whole sequence (tool tokens as context): equal to vLLM's on the model's tokens
    actor = multi_turn_worker.compute_log_probs(out).batch["old_log_probs"]
    mismatch = rollout_logprob_mismatch(actor, batch["rollout_log_probs"], batch["response_mask"])
    print(f"multi-turn rollout vs actor log-prob |diff|: {mismatch}")
    assert mismatch["rollout/logprob_abs_diff/max"] < LOGPROB_TOLERANCE


# ----------------------------------------------------------------------------------------------------------------------
# a run: GRPO with the calculator tool through `easyrl train`
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_three_grpo_steps_with_the_calculator_tool(tmp_path):
    """The shipped recipe (SmolLM2-135M-Instruct, the calculator), shrunk to 4 prompts x 4 samples, 3 steps."""
    from tests.fixtures.trainer_runs import small_tools_run, train_for_metrics

    metrics = train_for_metrics(small_tools_run(3, tmp_path / "checkpoints"), tmp_path, 3)
    for step in (1, 2, 3):
        row = metrics[step]
        print(step, {key: value for key, value in row.items() if "multi_turn" in key or key == "reward/overall"})
        assert np.isfinite(row["actor/pg_loss"]) and np.isfinite(row["reward/overall"])
        assert 1 <= row["rollout/multi_turn/turns/mean"] <= 3
        assert row["rollout/multi_turn/tool_errors"] <= row["rollout/multi_turn/tool_calls"]


ENUM_TOOL = '''
import enum
from typing import Optional


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


def paint(color: Color, size: Optional[Size] = None) -> str:
    """Paint the wall.

    Args:
        color: The paint.
        size: The brush.
    """
    assert isinstance(color, Color) and (size is None or isinstance(size, Size))
    return f"painted {color.name} with {size.name if size else 'any'} brush"


TOOLS = [paint]
'''


def test_an_enum_argument_is_advertised_with_its_values_and_reaches_the_tool_as_the_member(tmp_path):
    """transformers' schema reader (TRL's too) shows an Enum as {"type": "object"} without its values, and the tool got
    the model's string instead of the member."""
    path = tmp_path / "paint.py"
    path.write_text(ENUM_TOOL)
    (schema,) = tool_files.tool_schemas(str(path))
    properties = schema["function"]["parameters"]["properties"]
    assert properties["color"] == {"type": "string", "description": "The paint.", "enum": ["red", "blue"]}
    assert properties["size"]["type"] == "integer" and properties["size"]["enum"] == [1, 2]
    tools = load_tools(str(path))
    calls = [ToolCall("paint", {"color": "red", "size": 2}), ToolCall("paint", {"color": "green"})]
    calls.append(ToolCall("paint", {"color": "blue"}))
    results, _ = run_tool_calls(calls, tools, timeout=5.0)
    assert results[0] == ToolResult("painted RED with LARGE brush")
    assert results[1] == ToolResult("Error: paint raised ValueError: 'green' is not a valid Color", error=True)
    assert results[2].content == "painted BLUE with any brush"

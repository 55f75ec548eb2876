"""Multi-turn rollouts with tools, on top of the vLLM engine (``worker.rollout.multi_turn``).

All trajectories of a batch advance together, turn by turn:
    1. one engine call generates the next model turn of every unfinished trajectory, from its token ids so far
       (prompt ++ every earlier turn), so the actor later scores exactly the tokens vLLM saw;
    2. tool calls are parsed from each turn's text (a registered parser: ``hermes`` reads
       ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``);
    3. all calls of the batch run at once, each in its own thread with a deadline (``tool_timeout``): a call that
       raises, hangs or is malformed answers the model with an error message and is counted, the step goes on;
    4. the results are rendered as ``tool`` messages by the chat template and their tokens appended.
A trajectory ends when the model answers without a tool call, after ``max_turns`` model turns, or when the whole
response (model and tool tokens) reaches ``data.max_response_length`` tokens (cut there and counted).

With an environment (``worker.rollout.multi_turn.env: file.py:Class``) instead of tools, step 2-4 become: every
trajectory's environment ``step``s on its turn's text (all at once, each in a thread with the same deadline) and its
observation is rendered as a ``user`` message; a trajectory ends when its environment says done. The dataset prompt
is the first observation (it is already rendered and tokenized, ending with the assistant header, so ``reset(row)``
only sets the environment up). The rewards of a trajectory's steps are summed into the non-tensor ``env_reward``,
which the reward function receives.

A class without ``step`` is a tool environment, the contract of TRL's ``environment_factory``: one instance per
trajectory, its public methods (all but ``reset`` and ``get_reward``) are the model's tools on that instance (beside
the tools file's, when ``tools`` is set too), and the prompts advertise their schemas. ``reset(**columns)`` gets the
row's columns; the text it returns is added to the end of the prompt's last user message (the engine and the actor
both read the grown prompt, which must fit data.max_prompt_length). ``get_reward()``, when the class has it, is called
once the trajectory ends and handed over as the non-tensor ``env_get_reward``, which the scorer adds to the reward
function's ``overall``, as TRL sums it with its reward functions. The non-tensor ``environments`` holds each
instance's attributes (``EnvState``) for reward functions that read TRL's ``environments``.

Output: BaseRollout's format (base.py). ``responses`` holds every turn's tokens back to back; ``response_mask`` is 1
only on tokens the model generated (tool tokens are in the sequence, attended to, but out of the loss, the log-probs
and the KL, which all aggregate over response_mask); ``rollout_log_probs`` is the engine's log-prob on model tokens
and 0 elsewhere. The non-tensor ``messages`` holds each trajectory's turns after the prompt (assistant and tool
messages, in order) for reward functions that read them.

Pictures (vision-language models): a tool or an environment step may return a PIL image, or a list mixing text and
PIL images, shown to the model in that order (``to_content``). The message is rendered by the chat template with ONE
vision pad per picture, the form vLLM takes with the pictures in ``multi_modal_data``; the actor's copy of the
response has each pad expanded to the picture's vision tokens, as the dataset expands the prompt's. So a trajectory
keeps two views of its response: ``engine_ids`` (what vLLM reads back at the next turn) and ``response_ids`` (what the
actor scores); model tokens are the same in both. The output row's ``multi_modal_data`` holds the prompt's pictures
then the tool pictures in order, and its 3-D rope positions over the response are the model's own (``PictureTokens``).
A tool that takes a ``row`` argument gets the prompt's dataset row (its ``multi_modal_data`` holds the input
pictures); ``row`` is not part of the schema the model sees.
"""

import inspect
import json
import logging
import math
import numbers
import pickle
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np
import torch
from PIL import Image

from ...config.schema import MultiTurnConfig
from ...data.dataset import ENVIRONMENT_COLUMN, ROW_PLACE_KEY
from ...data.rope import make_position_id_fn
from ...data.template import RESET_CONTENT, ChatTemplate
from ...data.vision import PictureSizing, load_image, to_rgb
from ...models.vision import text_token_for_sampled_pads
from ..reward.loader import resolved, short_repr
from ..tool_files import (
    ENV_KEY,
    MULTI_TURN_COUNTS,
    ROW_ARGUMENT,
    TOOLS_KEY,
    ToolArgumentError,
    check_tool_names,
    checked_arguments,
    enum_arguments,
    env_specs,
    env_tool_methods,
    env_tool_schemas,
    is_tool_env,
    load_env_classes,
    load_tools,
    takes_row,
)
from .base import (
    BaseRollout,
    GenerationRequest,
    GenerationTimer,
    WeightBuckets,
    build_rollout_output,
    continue_position_ids,
    generation_metrics,
    prompt_token_lists,
    repeat_greedy,
    resolve_sampling,
)
from .env_failures import ENV_ERROR_KEY
from .vllm_rollout import MAX_REQUEST_SEED, _vllm_multi_modal_data, call_request_seeds


logger = logging.getLogger(__name__)
# the environment failures of one batch logged one line each; the others are counted in one line
ENV_FAILURES_LOGGED = 3


# ----------------------------------------------------------------------------------------------------------------------
# tools: loading and calling
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(content: Any) -> Any:
    """Text (or the text parts of chat content) with each lone surrogate replaced by U+FFFD. JSON's `"\\ud800"`
    escape decodes to one, so a model can write one into a tool call's arguments and a tool that quotes its argument
    hands it back; `os.fsdecode` and `errors="surrogateescape"` make them of bytes that are not UTF-8. No tokenizer
    encodes them and no UTF-8 file holds them: the step would die on a tool's answer."""
    if isinstance(content, str):
        return _LONE_SURROGATE.sub("\ufffd", content)
    if isinstance(content, list):
        return [
            {**part, "text": encodable(part["text"])} if isinstance(part.get("text"), str) else part
            for part in content
        ]
    return content


@dataclass
class ToolResult:
    content: str | list[dict]
    """Text, or chat content parts ({"type": "text", "text": ...} / {"type": "image"}) when there are pictures."""
    error: bool = False
    timed_out: bool = False
    pictures: list = field(default_factory=list)
    """The PIL images of the image parts of ``content``, in order."""
    coerced: list[str] = field(default_factory=list)
    """The arguments of the call read as the type the tool's schema advertises (the string "2" as the integer 2)."""

    def __post_init__(self) -> None:
        self.content = encodable(self.content)


def to_content(value: Any) -> tuple[str | list[dict], list]:
    """What a tool returns (or an environment observes) -> (chat message content, its pictures). A string is text; a
    PIL image is a picture; a dict is JSON text (as function-calling models are trained to read results; Python's
    repr, with its single quotes and True/None, is not JSON); a list or tuple mixes these, shown in its order; anything
    else is str(value). Without pictures the content is plain text (list items joined by newlines). The items of a
    list may also be chat content parts, as TRL's multimodal tools return them (``_content_item``)."""
    items = [_content_item(item) for item in value] if isinstance(value, (list, tuple)) else [value]
    pictures = [item for item in items if isinstance(item, Image.Image)]
    if not pictures:
        return "\n".join(map(_as_text, items)), []
    parts = [
        {"type": "image"} if isinstance(item, Image.Image) else {"type": "text", "text": _as_text(item)}
        for item in items
    ]
    return parts, pictures


_ODD_RESULTS_SAID: set[str] = set()


def _say_an_odd_result(tool: str, value: Any) -> None:
    """Once per tool and process: a result the model reads as Python's text of it, which is almost always a bug of
    the tool (a branch without `return`, a generator not made a list, an object without its own str())."""
    if tool in _ODD_RESULTS_SAID:
        return
    if value is None:
        why = "None (a branch without `return`?): the model reads the text 'None'"
    elif (
        inspect.isgenerator(value)
        or inspect.isasyncgen(value)
        or (isinstance(value, Iterator) and not isinstance(value, (str, bytes)))
    ):
        why = f"a {type(value).__name__}, which the model reads as its repr: return list(...) of it"
    elif type(value).__str__ is object.__str__ and type(value).__repr__ is object.__repr__:
        why = f"a {type(value).__name__} without its own str(), which the model reads as {object.__repr__(value)!r}"
    else:
        return
    _ODD_RESULTS_SAID.add(tool)
    logger.warning("Tool %r returned %s. Said once per tool.", tool, why)


def _as_text(item: Any) -> str:
    """A tool result's item as text: a dict as JSON (values JSON cannot hold as their str()), anything else str()."""
    return json.dumps(item, ensure_ascii=False, default=str) if isinstance(item, dict) else str(item)


def _content_item(item: Any) -> Any:
    """A chat content part -> its text or its picture: ``{"type": "text", "text": ...}``, ``{"type": "image",
    "image": ...}`` (TRL's and Qwen's; a PIL image, or a path, URL or data URI, read here) and OpenAI's
    ``{"type": "image_url", "image_url": {"url": ...}}``. Anything else is returned as it is."""
    if not isinstance(item, dict):
        return item
    kind = item.get("type")
    if kind == "text" and isinstance(item.get("text"), str):
        return item["text"]
    if kind == "image" and item.get("image") is not None:
        picture = item["image"]
    elif kind == "image_url" and item.get("image_url"):
        picture = item["image_url"]["url"] if isinstance(item["image_url"], dict) else item["image_url"]
    else:
        return item
    return picture if isinstance(picture, Image.Image) else load_image(picture)


def _call(fn: Callable, arguments: dict, row: Optional[dict] = None) -> tuple[Any, list[str]]:
    """The tool's result and its arguments read as their advertised type (tool_files.checked_arguments); raises what
    the tool raises, and ToolArgumentError for an argument of another type."""
    arguments, coerced = checked_arguments(fn, arguments)
    arguments = enum_arguments(fn, arguments)
    if takes_row(fn):
        arguments = {**arguments, ROW_ARGUMENT: row}
    result = fn(**arguments)
    return resolved(result), coerced


def _abandon(threads: list[threading.Thread], abandoned: Optional[list]) -> None:
    """Keep the threads of calls abandoned at their deadline that still run (Python cannot stop a thread, and a
    CPU-bound one takes the interpreter lock from the training that shares the process) in ``abandoned``."""
    if abandoned is not None:
        abandoned.extend(thread for thread in threads if thread.is_alive())


def abandoned_still_running(abandoned: list[threading.Thread]) -> Counter:
    """How many of the ``abandoned`` calls still run, by thread name ("tool-<name>", "env <what>"); the finished ones
    are dropped from the list."""
    abandoned[:] = [thread for thread in abandoned if thread.is_alive()]
    return Counter(thread.name for thread in abandoned)


def run_tool_calls(
    calls: list[ToolCall | str],
    tools: dict[str, Callable] | list[dict[str, Callable]],
    timeout: float,
    rows: Optional[list[Optional[dict]]] = None,
    abandoned: Optional[list] = None,
) -> tuple[list[ToolResult], float]:
    """Run every call at once, each in a daemon thread, and wait at most ``timeout`` seconds for all of them; returns
    the results in order and the wall seconds. A string in ``calls`` is a parse error, answered as an error.
    ``tools``: name -> function, or one such dict per call (a tool environment's methods are its trajectory's own).
    ``rows[i]``: the dataset row that call i's tool gets when it takes a ``row`` argument; ``abandoned``: a list that
    keeps the threads of the calls abandoned at the deadline (``abandoned_still_running``).

    Daemon threads, not a pool: a tool that hangs forever cannot be stopped from Python, and its thread must neither
    hold a pool slot nor keep the worker process from exiting."""
    start = time.perf_counter()
    results: list[Optional[ToolResult]] = [None] * len(calls)
    threads = []

    def tools_of(index: int) -> dict[str, Callable]:
        return tools[index] if isinstance(tools, list) else tools

    def work(index: int, call: ToolCall) -> None:
        try:
            fn = tools_of(index)[call.name]
            value, coerced = _call(fn, call.arguments, rows[index] if rows else None)
            _say_an_odd_result(call.name, value)
            content, pictures = to_content(value)
            results[index] = ToolResult(content, pictures=pictures, coerced=coerced)
        except ToolArgumentError as err:  # the tool did not run
            results[index] = ToolResult(f"Error: {call.name}: {err}.", error=True)
        except (Exception, SystemExit) as err:  # the model reads what went wrong; the step goes on
            results[index] = ToolResult(f"Error: {call.name} raised {type(err).__name__}: {err}", error=True)

    for index, call in enumerate(calls):
        if isinstance(call, str):
            results[index] = ToolResult(call, error=True)
        elif call.name not in tools_of(index):
            known = ", ".join(sorted(tools_of(index)))
            results[index] = ToolResult(f"Error: unknown tool {call.name!r}; the tools are: {known}.", error=True)
        else:
            thread = threading.Thread(target=work, args=(index, call), daemon=True, name=f"tool-{call.name}")
            thread.start()
            threads.append(thread)
    deadline = start + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()))
    _abandon(threads, abandoned)
    for index, call in enumerate(calls):
        if results[index] is None:
            results[index] = ToolResult(
                f"Error: {call.name} took longer than {timeout:g} s and was abandoned.", error=True, timed_out=True
            )
    return results, time.perf_counter() - start


# ----------------------------------------------------------------------------------------------------------------------
# environments: loading and stepping
# ----------------------------------------------------------------------------------------------------------------------
# An environment's reset gets `seed` (Gymnasium's name), an integer shared by the samples of a prompt, unless the row
# has a column of that name; RESET_SEED_STREAM keeps these seeds apart from the sampling seeds of the same call.
RESET_SEED = "seed"
RESET_SEED_STREAM = 7


def reset_arguments(reset: Callable, columns: dict) -> dict:
    """What a tool environment's ``reset`` gets of its row's columns: all of them as keyword arguments (TRL passes
    every column), or only the names it declares when it takes no ``**kwargs``."""
    parameters = inspect.signature(reset).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(columns)
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {name: value for name, value in columns.items() if name in names}


class EnvState:
    """What a reward function gets as one of TRL's ``environments``: the attributes of a trajectory's environment
    instance when the trajectory ended. The instance stays in the rollout worker (it may hold a process or a socket);
    its attributes that can be pickled travel to the reward function, methods do not. They are the instance's objects
    (a corpus that every instance refers to is pickled once with the batch), sent from the rollout worker before the
    instance is reset for another trajectory."""

    # easyrl's own two fields are slots: ``vars(state)`` (what a reward function may read) is the instance's alone
    __slots__ = ("_class_name", "_dropped", "__dict__")

    def __init__(self, env: Any) -> None:
        self._class_name = type(env).__name__
        self._dropped: list[str] = []
        for name, value in vars(env).items():
            try:
                pickle.dumps(value)
            except Exception:
                self._dropped.append(name)
                continue
            setattr(self, name, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_class_name", "_dropped"):
            raise AttributeError(name)
        if name in self._dropped:
            why = "its value cannot be pickled"
        else:
            why = "it is no attribute of the instance (methods stay in the rollout worker: use them in get_reward)"
        raise AttributeError(f"{self._class_name}.{name} is not available to the reward function: {why}.")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{self._class_name}({fields})"


class EnvOutputError(ValueError):
    """An environment returned a value its contract does not allow (a reward that is no finite number, a done that is
    no bool); the message says what it returned."""


@dataclass
class EnvOutcome:
    observation: Optional[str | list[dict]] = None  # message content (to_content): text, or parts with pictures
    pictures: list = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    error: Optional[str] = None  # what went wrong: the trajectory ends
    timed_out: bool = False
    env: Any = None  # the environment a reset built

    def __post_init__(self) -> None:
        self.observation, self.error = encodable(self.observation), encodable(self.error)


INIT_NOTICE_S = 60.0  # how often a wait without deadline (environment constructors) says it is still waiting


def run_with_deadline(
    jobs: list[Callable[[], Any]],
    timeout: Optional[float],
    what: str,
    still_waiting: Optional[Callable[[float, int], None]] = None,
    abandoned: Optional[list] = None,
) -> tuple[list[EnvOutcome], float]:
    """Run every job at once, each in a daemon thread (see run_tool_calls), waiting at most ``timeout`` seconds for
    all (None: until all are done, calling ``still_waiting(seconds, jobs left)`` every INIT_NOTICE_S seconds); a job
    returns an EnvOutcome, one that raises or is late becomes an EnvOutcome with ``error`` set."""
    start = time.perf_counter()
    results: list[Optional[EnvOutcome]] = [None] * len(jobs)

    def work(index: int, job: Callable[[], Any]) -> None:
        try:
            results[index] = job()
        except EnvOutputError as err:
            results[index] = EnvOutcome(error=str(err))
        except (Exception, SystemExit) as err:  # sys.exit in a thread ends the thread alone: not a timeout
            results[index] = EnvOutcome(error=f"{what} raised {type(err).__name__}: {err}")

    threads = [
        threading.Thread(target=work, args=(i, job), daemon=True, name=f"env {what}") for i, job in enumerate(jobs)
    ]
    for thread in threads:
        thread.start()
    if timeout is None and still_waiting is not None:
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(max(0.0, INIT_NOTICE_S - (time.perf_counter() - start) % INIT_NOTICE_S))
                if thread.is_alive():
                    break
            left = sum(thread.is_alive() for thread in threads)
            if left:
                still_waiting(time.perf_counter() - start, left)
    for thread in threads:
        thread.join(None if timeout is None else max(0.0, start + timeout - time.perf_counter()))
    _abandon(threads, abandoned)
    for index in range(len(jobs)):
        if results[index] is None:
            results[index] = EnvOutcome(error=f"{what} took longer than {timeout:g} s", timed_out=True)
    return results, time.perf_counter() - start


def _env_step(env: Any, action_text: str) -> EnvOutcome:
    """A stepped environment's step: ``(observation, reward, done)``, or Gymnasium's ``(observation, reward,
    terminated, truncated, info)``, whose trajectory is done when it is terminated or truncated (info is not read).
    Four items are refused: gym's old (observation, reward, done, info) and verl's interactions (done, response,
    reward, metrics) cannot be told apart."""
    output = resolved(env.step(action_text))
    size = len(output) if isinstance(output, (tuple, list)) else None
    if size == 3:
        observation, reward, done = output
        done = _checked_done(done, "done")
    elif size == 5:
        observation, reward, terminated, truncated, _ = output
        done = _checked_done(terminated, "terminated") | _checked_done(truncated, "truncated")
    else:
        returned = f"a {type(output).__name__} of {size} items" if size is not None else short_repr(output)
        raise EnvOutputError(
            f"step returned {returned}; it must return (observation, reward, done), or Gymnasium's (observation, "
            "reward, terminated, truncated, info)"
        )
    reward = _checked_reward(reward, "step", "reward")
    if observation is None:
        return EnvOutcome(None, reward=reward, done=done)
    content, pictures = to_content(observation)
    return EnvOutcome(content, pictures, reward, done)


def _checked_reward(value: Any, method: str, what: str = "") -> float:
    """A reward an environment's ``method`` returned (``what``: its place in the output) as a float: a finite real
    number (numpy's and 0-d arrays or tensors too; a bool is 0 or 1); text such as "0.5", None or NaN is an
    EnvOutputError, as a reward the environment got wrong must not reach training."""
    plain = value.item() if getattr(value, "ndim", None) == 0 else value
    if not isinstance(plain, numbers.Real) or not math.isfinite(plain):
        returned = f"{what} {short_repr(value)}" if what else short_repr(value)
        kind = "" if isinstance(plain, numbers.Real) else f" ({type(value).__name__})"
        raise EnvOutputError(f"{method} returned {returned}{kind}; {what or 'it'} must be a finite number")
    return float(plain)


def _checked_done(value: Any, what: str) -> bool:
    """A stepped environment's done (``what``: Gymnasium's terminated or truncated): a bool (numpy's too) or the int 0
    or 1; text ("False" is true to Python) or anything else is an EnvOutputError."""
    plain = value.item() if getattr(value, "ndim", None) == 0 else value
    if isinstance(plain, bool) or (isinstance(plain, numbers.Integral) and plain in (0, 1)):
        return bool(plain)
    raise EnvOutputError(
        f"step returned {what} {short_repr(value)} ({type(value).__name__}); {what} must be True or False"
    )


def _env_reset(env: Any, row: dict) -> EnvOutcome:
    resolved(env.reset(row))
    return EnvOutcome(env=env)


def _tool_env_reset(env: Any, columns: dict) -> EnvOutcome:
    """A tool environment instance reset with its row's columns; what it returns (None: nothing) is added to the last
    user message of the prompt, as TRL does: text, or a list of text and pictures (PIL images, or TRL's / OpenAI's
    content parts), whose text alone is joined by newlines as a tool result's."""
    output = resolved(env.reset(**reset_arguments(env.reset, columns)))
    if isinstance(output, Image.Image):
        output = [output]
    if isinstance(output, (list, tuple)):
        if not all(isinstance(part, (str, dict, Image.Image)) for part in output):
            raise TypeError("reset returned a list with items that are neither text, pictures nor content parts")
        content, pictures = to_content(output)
        return EnvOutcome(observation=content or None, pictures=pictures, env=env)
    if output is not None and not isinstance(output, str):
        raise TypeError(f"reset must return None, text or a list of text and pictures, not {type(output).__name__}")
    return EnvOutcome(observation=output or None, env=env)


def _env_get_reward(env: Any) -> EnvOutcome:
    return EnvOutcome(reward=_checked_reward(resolved(env.get_reward()), "get_reward"))


# ----------------------------------------------------------------------------------------------------------------------
# tool-call parsers: text of one model turn -> calls (a string for each malformed call: the error the model reads)
# ----------------------------------------------------------------------------------------------------------------------
ToolCallParser = Callable[[str], list]
TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {}


def register_tool_call_parser(name: str) -> Callable[[ToolCallParser], ToolCallParser]:
    def decorator(parser: ToolCallParser) -> ToolCallParser:
        TOOL_CALL_PARSERS[name] = parser
        return parser

    return decorator


# a call runs to its closing tag, or to the end of the turn when it has none (a model that stops at its end-of-turn
# token, or a turn cut at turn_max_tokens), as vLLM's hermes parser reads it
HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
HERMES_SHAPE = '{"name": "<tool>", "arguments": {...}}'


@register_tool_call_parser("hermes")
def parse_hermes_tool_calls(text: str) -> list[ToolCall | str]:
    """``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``, any number per turn (Qwen2.5/Qwen3, Hermes).

    Read as vLLM's hermes parser and Qwen2.5's own read them: a call without its closing tag is read to the end of
    the turn, and a call without ``arguments`` (Llama's and verl's ``parameters``) is no call to them. Here it is
    answered with an error the model reads, as is malformed JSON, so a call is never dropped in silence nor run
    without the arguments the model gave."""
    calls: list[ToolCall | str] = []
    for match in HERMES_CALL.finditer(text):
        closed = match.group(1) is not None
        body = (match.group(1) if closed else match.group(2)).strip()
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as err:
            unclosed = "" if closed else " (it has no closing </tool_call>)"
            calls.append(f"Error: the tool call is not valid JSON ({err.msg}){unclosed}: {body[:200]}")
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            calls.append(f"Error: a tool call must be {HERMES_SHAPE}.")
            continue
        if "arguments" not in payload:
            keys = ", ".join(f'"{key}"' for key in payload)
            calls.append(f'Error: a tool call must be {HERMES_SHAPE}; this one has no "arguments" (its keys: {keys}).')
            continue
        arguments = payload["arguments"]
        if isinstance(arguments, str):  # some models send the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(arguments, dict):
            calls.append(f'Error: a tool call must be {HERMES_SHAPE}; its "arguments" is no JSON object.')
            continue
        calls.append(ToolCall(payload["name"], arguments))
    return calls


# ----------------------------------------------------------------------------------------------------------------------
# tool messages through the chat template
# ----------------------------------------------------------------------------------------------------------------------
_TURN_END = "EASYRL_ASSISTANT_TURN_END"
_PROBE = "EASYRL_TOOL_PROBE"


class ToolMessageRenderer:
    """Tokens that follow a model turn (ended by its stop token) to present tool results and open the next turn.

    Rendered as template(conversation + tool messages, add_generation_prompt) after the end of the last assistant
    message, minus the model's stop token that the turn already holds: the same text the template would give the whole
    conversation, so a trajectory reads as one chat. A template that renders no ``tool`` role (its text is missing)
    gets the results as ``user`` messages, said once in the log."""

    def __init__(
        self,
        tokenizer: Any,
        tools: bool = True,
        processor: Any = None,
        chat_template: Optional[str] = None,
        template_kwargs: Optional[dict] = None,
    ) -> None:
        """``chat_template``: the data.override_chat_template file the prompts were rendered with (None: the model's
        own template); ``template_kwargs``: the variables they were rendered with (data.apply_chat_template_kwargs)."""
        self.tokenizer = tokenizer
        # a VLM's processor holds the template that renders pictures in messages (the dataset renders prompts with it)
        owner = processor if getattr(processor, "chat_template", None) else None
        self.chat_template = ChatTemplate(tokenizer, owner, chat_template, template_kwargs=template_kwargs)
        self.role = "tool"
        if not tools:  # an environment's observations are user messages: no tool role to look for
            return
        try:
            probe = self._render([{"role": "tool", "name": "probe", "content": _PROBE}])
        except Exception:
            probe = ""
        if _PROBE not in probe:
            self.role = "user"
            logger.warning(
                "The chat template renders no `tool` role: tool results are given to the model as `user` messages."
            )

    def _render(self, tool_messages: list[dict]) -> str:
        conversation = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _TURN_END}]
        text = self._apply(conversation + tool_messages)
        return text[text.rindex(_TURN_END) + len(_TURN_END) :]

    def user_turn_end(self) -> list[int]:
        """The tokens between a user message's text and the model's turn: the end of the message and the assistant
        header (``<|im_end|>\n<|im_start|>assistant\n`` for Qwen), where text added to the last user message goes."""
        text = self._apply([{"role": "user", "content": _PROBE}])
        return self.tokenizer.encode(text[text.rindex(_PROBE) + len(_PROBE) :], add_special_tokens=False)

    def user_content_ids(self, parts: list[dict]) -> list[int]:
        """The tokens of content ``parts`` (text and ``{"type": "image"}``) as the template renders them inside a user
        message: a picture's are its placeholder (one pad, vLLM's form)."""
        fenced = [{"type": "text", "text": _PROBE}, *parts, {"type": "text", "text": _PROBE}]
        text = self._apply([{"role": "user", "content": fenced}])
        return self.tokenizer.encode(
            text[text.index(_PROBE) + len(_PROBE) : text.rindex(_PROBE)], add_special_tokens=False
        )

    def _apply(self, messages: list[dict]) -> str:
        return self.chat_template.render(messages, add_generation_prompt=True)

    def messages(self, calls: list, results: list[ToolResult]) -> list[dict]:
        """The tool messages of ``results`` (content: text, or parts with {"type": "image"} for each picture)."""
        named = [call.name if isinstance(call, ToolCall) else "error" for call in calls]
        return [{"role": self.role, "name": n, "content": r.content} for n, r in zip(named, results)]

    def token_ids(self, messages: list[dict], stop_text: str) -> list[int]:
        text = self._render(messages)
        if stop_text and text.startswith(stop_text):
            text = text[len(stop_text) :]  # the model's turn already ends with its stop token
        return self.tokenizer.encode(text, add_special_tokens=False)


# ----------------------------------------------------------------------------------------------------------------------
# pictures in tool messages (vision-language models)
# ----------------------------------------------------------------------------------------------------------------------
class PictureTokens:
    """The vision side of tool / observation pictures for a VLM's processor.

    - ``prepare``: a picture as the dataset stores one (RGB, at the size the processor keeps: data/vision.py
      PictureSizing held to data.max_pixels), so that vLLM and the actor cut it into the same patches;
    - ``expand``: the rendered message's tokens (one pad per picture, vLLM's form) -> the actor's form (each pad
      repeated once per vision token of its picture) and the pictures' (t, h, w) patch grids;
    - ``engine_view``: a model turn as vLLM reads it back at the next turn: a vision pad the policy sampled is not a
      picture, so it becomes the text token the actor reads it as (models/vision.py text_token_for_sampled_pads);
    - ``response_positions``: 3-D rope positions of a response with pictures, from the model's own get_rope_index.
    """

    def __init__(self, processor: Any, model_path: Optional[str] = None, max_pixels: Optional[int] = None) -> None:
        """``max_pixels``: data.max_pixels (None: the processor's own limit). The floor is the processor's, not
        data.min_pixels: EasyR1's default (512 x 512) would raise a tool's 56-pixel crop to 334 vision tokens."""
        self.processor = processor
        self.sizing = PictureSizing.from_processor(processor, None, max_pixels)
        self.image_pad = int(processor.image_token_id)
        self.vision_pads = torch.tensor([processor.image_token_id, processor.video_token_id])
        self.text_token = text_token_for_sampled_pads(processor)
        self.merge = int(processor.image_processor.merge_size)
        self.position_ids = make_position_id_fn(processor, model_path=model_path)

    def prepare(self, picture: Image.Image) -> Image.Image:
        picture = to_rgb(picture)
        return self.sizing(picture) if self.sizing is not None else picture

    def grid(self, picture: Image.Image) -> torch.Tensor:
        """(3,) the (t, h, w) patch grid the processor cuts ``picture`` into."""
        return self.processor.image_processor(images=[picture], return_tensors="pt")["image_grid_thw"][0]

    def expand(self, token_ids: list[int], pictures: list) -> tuple[list[int], list[torch.Tensor]]:
        found = sum(token == self.image_pad for token in token_ids)
        if found != len(pictures):
            raise ValueError(
                f"The chat template rendered {found} image placeholder(s) for {len(pictures)} picture(s) of a tool "
                "result, observation or reset: it does not render pictures in that role. Use a template whose "
                "tool/user messages take content lists with {'type': 'image'} (data.override_chat_template)."
            )
        grids = [self.grid(picture) for picture in pictures]
        tokens = iter(int(grid.prod()) // self.merge**2 for grid in grids)
        expanded = []
        for token in token_ids:
            expanded.extend([token] * next(tokens) if token == self.image_pad else [token])
        return expanded, grids

    def engine_view(self, token_ids: list[int]) -> list[int]:
        pads = set(self.vision_pads.tolist())
        return [self.text_token if token in pads else token for token in token_ids]

    def response_positions(
        self, response_ids: list[int], model_mask: list[int], grids: list[torch.Tensor], after: torch.Tensor
    ) -> torch.Tensor:
        """(3, len(response_ids)) positions of a response that follows a prompt whose last token sits at ``after``
        (3,). Every text run and picture starts one past the largest position before it (all Qwen-VL families do so
        for pictures), so the response's own positions shifted past the prompt's last are the whole sequence's."""
        ids = torch.tensor(response_ids)
        sampled = torch.tensor(model_mask, dtype=torch.bool) & torch.isin(ids, self.vision_pads)
        ids = torch.where(sampled, self.text_token, ids)  # sampled pads are text, as vLLM and the actor read them
        positions = self.position_ids({"input_ids": ids, "image_grid_thw": torch.stack(grids)})
        return positions + after.view(3, 1) + 1


# ----------------------------------------------------------------------------------------------------------------------
# trajectories
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class Trajectory:
    prompt_ids: list[int]
    multi_modal_data: Any = None
    row: Optional[dict] = None  # the prompt's dataset row, for tools that take `row`
    place: Optional[str] = None  # where that row is in the data (data key, file, row number), for the warnings
    response_ids: list[int] = field(default_factory=list)  # the actor's view: pads expanded per picture
    engine_ids: list[int] = field(default_factory=list)  # vLLM's view: one pad per picture, sampled pads as text
    pictures: list = field(default_factory=list)  # tool / observation pictures, in order
    grids: list = field(default_factory=list)  # their (3,) patch grids
    model_mask: list[int] = field(default_factory=list)  # 1 on model tokens, 0 on tool tokens
    log_probs: list[float] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_args_coerced: int = 0
    env: Any = None  # this trajectory's environment instance (worker.rollout.multi_turn.env)
    prompt_insert: list[int] = field(default_factory=list)  # a tool environment's reset text, in the last user message
    prompt_pictures: list = field(default_factory=list)  # the reset's pictures (in prompt_insert, after the row's)
    prompt_grids: list = field(default_factory=list)  # their (3,) patch grids
    reset_content: Any = None  # what the reset added, as message content (its pictures in place), for TRL rewards
    env_name: Optional[str] = None  # with several environments, the name of this trajectory's (its row's column)
    env_reward: float = 0.0
    env_errors: int = 0
    env_timeouts: int = 0
    env_error: Optional[str] = None  # the first environment error, for a run whose environment always fails
    pending_error: Optional[dict] = None  # a failed reset's message, put in `messages` after the first turn
    truncated: bool = False
    max_turns_reached: bool = False
    stopped: bool = False  # the last model turn ended with a stop token
    done: bool = False

    def append(
        self, token_ids: list[int], log_probs: list[float] | None, budget: int, engine_ids: list[int] | None = None
    ) -> bool:
        """Append a model turn (with its log-probs) or tool tokens (None), cut at ``budget`` response tokens; True when
        the cut removed tokens. ``engine_ids``: the same tokens as vLLM reads them back (default: ``token_ids``)."""
        room = budget - len(self.response_ids)
        kept = token_ids[:room]
        self.response_ids += kept
        self.engine_ids += (engine_ids if engine_ids is not None else token_ids)[: len(kept)]
        self.model_mask += [1 if log_probs is not None else 0] * len(kept)
        self.log_probs += list(log_probs[: len(kept)]) if log_probs is not None else [0.0] * len(kept)
        return len(kept) < len(token_ids)

    def append_pictured(
        self,
        engine_ids: list[int],
        expanded: list[int],
        pictures: list,
        grids: list,
        pad: int,
        sizes: list[int],
        budget: int,
    ) -> bool:
        """Append tool / observation tokens with pictures (``engine_ids`` one ``pad`` each, ``expanded`` the actor's
        with ``sizes[k]`` pads for picture k); True when they did not fit. A picture is never cut: the tokens stop
        before the first picture whose vision tokens do not all fit (the trajectory ends there, so vLLM never reads
        the engine view again)."""
        room = budget - len(self.response_ids)
        end, kept = len(expanded), len(pictures)
        if end > room:
            end, kept, position = room, 0, 0
            while position < room:
                if expanded[position] != pad:
                    position += 1
                    continue
                if position + sizes[kept] > room:
                    end = position  # this picture does not fit whole
                    break
                position, kept = position + sizes[kept], kept + 1
        self.response_ids += expanded[:end]
        self.engine_ids += engine_ids if kept == len(pictures) else []
        self.pictures += pictures[:kept]
        self.grids += grids[:kept]
        self.model_mask += [0] * end
        self.log_probs += [0.0] * end
        return end < len(expanded)


def trajectory_counts(t: Trajectory, env: bool = False, tools: bool = True) -> dict[str, int]:
    """One trajectory's counts, named as its metrics (``multi_turn_metrics``) are: what `easyrl generate` and `easyrl
    eval` keep per sample."""
    counts = {"turns": t.turns}
    if tools:
        counts.update(
            tool_calls=t.tool_calls,
            tool_errors=t.tool_errors,
            tool_timeouts=t.tool_timeouts,
            tool_args_coerced=t.tool_args_coerced,
        )
    if env:
        counts.update(env_errors=t.env_errors, env_timeouts=t.env_timeouts)
    counts.update(truncated=int(t.truncated), max_turns_reached=int(t.max_turns_reached))
    return counts


def multi_turn_metrics(
    trajectories: list[Trajectory], tool_seconds: float, env: bool = False, tools: bool = True
) -> dict[str, float]:
    """``env``: the environment counts (a stepped or a tool environment); ``tools``: the tool-call counts (tools, or a
    tool environment's methods). The seconds spent in tools and environments are one figure (they run in turn)."""
    turns = np.array([t.turns for t in trajectories], dtype=float)
    metrics = {
        "rollout/multi_turn/turns/mean": float(turns.mean()) if len(turns) else 0.0,
        "rollout/multi_turn/turns/max": float(turns.max()) if len(turns) else 0.0,
    }
    if env:
        rewards = np.array([t.env_reward for t in trajectories], dtype=float)
        metrics["rollout/multi_turn/env_reward/mean"] = float(rewards.mean()) if len(rewards) else 0.0
        metrics["rollout/multi_turn/env_errors"] = float(sum(t.env_errors for t in trajectories))
        metrics["rollout/multi_turn/env_timeouts"] = float(sum(t.env_timeouts for t in trajectories))
    if tools:
        metrics["rollout/multi_turn/tool_calls"] = float(sum(t.tool_calls for t in trajectories))
        metrics["rollout/multi_turn/tool_errors"] = float(sum(t.tool_errors for t in trajectories))
        metrics["rollout/multi_turn/tool_timeouts"] = float(sum(t.tool_timeouts for t in trajectories))
        metrics["rollout/multi_turn/tool_args_coerced"] = float(sum(t.tool_args_coerced for t in trajectories))
    metrics["rollout/multi_turn/tool_seconds" if tools else "rollout/multi_turn/env_seconds"] = tool_seconds
    metrics["rollout/multi_turn/truncated"] = float(sum(t.truncated for t in trajectories))
    metrics["rollout/multi_turn/max_turns_reached"] = float(sum(t.max_turns_reached for t in trajectories))
    return metrics


class MultiTurnRollout(BaseRollout):
    """Wraps a VLLMRollout: the engine, its weight sync and its sleep/wake are the engine's; generation is turn by
    turn. Any other attribute (the LoRA route, ``update_adapter``) is the engine's."""

    def __init__(
        self, engine: Any, config: MultiTurnConfig, processor: Any = None, model_path: Optional[str] = None
    ) -> None:
        """``processor``: a VLM's multimodal processor (pictures from tools / environments need it); ``model_path``:
        the model folder whose config gives the 3-D rope (defaults to the processor's tokenizer's)."""
        self.engine = engine
        self.multi_turn = config
        self.env_specs = env_specs(config.env)
        self.env_classes = load_env_classes(config.env)
        self.env_class = next(iter(self.env_classes.values()), None)  # the one environment (a stepped one is alone)
        self.multi_env = isinstance(config.env, Mapping)  # rows name their environment (ENVIRONMENT_COLUMN)
        # a tool environment (TRL's environment_factory): its methods are tools, each trajectory's on its own instance
        self.tool_env = self.env_class is not None and is_tool_env(self.env_class)
        self.stepped_env = self.env_class is not None and not self.tool_env
        if config.tools and self.stepped_env:
            raise ValueError(
                f"`{TOOLS_KEY}` and `{ENV_KEY}` are both set, and the environment has `step`; give one of them (a "
                "stepped environment reads tool calls in its step if it wants them)."
            )
        self.tools = load_tools(config.tools) if config.tools else {}  # first: it may register its own parser
        if config.parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"`worker.rollout.multi_turn.parser` is {config.parser!r}; registered: {', '.join(TOOL_CALL_PARSERS)}."
            )
        self.parse = TOOL_CALL_PARSERS[config.parser]
        self.renderer = ToolMessageRenderer(
            engine.tokenizer,
            tools=not self.stepped_env,
            processor=processor,
            chat_template=config.chat_template,
            template_kwargs=config.chat_template_kwargs,
        )
        self.tools_take_row = any(takes_row(fn) for fn in self.tools.values())
        if self.tool_env:
            # per environment: the name the model calls each method by (its schema's) -> the method's attribute name
            self.env_methods = {
                name: dict(zip(env_tool_schemas(cls), env_tool_methods(cls))) for name, cls in self.env_classes.items()
            }
            for name, cls in self.env_classes.items():
                check_tool_names(self.tools, self.env_methods[name])
                self.tools_take_row |= any(takes_row(getattr(cls, m)) for m in self.env_methods[name].values())
            self.env_rewards = any(callable(getattr(cls, "get_reward", None)) for cls in self.env_classes.values())
            self.user_turn_end = self.renderer.user_turn_end()
            self._warned_tasks_differ = False
            self._idle_envs: dict[Optional[str], list] = {name: [] for name in self.env_classes}
        self._warned_slow_init = self._warned_close = False
        self._warned_tools: set[tuple[str, bool]] = set()  # (tool, timed out) whose first failure was logged
        self._warned_coercions: set[str] = set()  # the tools whose first argument re-reading was logged
        self._warned_long: set[str] = set()  # the tools whose cut result was logged
        self._warned_no_observation: set[str] = set()  # the environments whose step returned None as observation
        self._warned_running: set[str] = set()  # the abandoned calls (by thread name) said to be still running
        self._env_failures_logged = 0  # this batch's environment failures logged one by one (ENV_FAILURES_LOGGED)
        self._abandoned: list[threading.Thread] = []  # this rollout's calls abandoned at their deadline, still running
        # the most characters one token can stand for (a vocabulary piece is at least as long as its text): a result
        # of room x this many characters holds every token that fits, so the rest is never tokenized
        vocabulary = engine.tokenizer.get_vocab()
        self._chars_per_token = max(map(len, vocabulary), default=1) if vocabulary else 1
        # the reset seeds of calls that name no seed of their own (library callers)
        self._reset_rng = np.random.default_rng([engine.config.seed, engine.dp_rank, RESET_SEED_STREAM])
        vlm = processor is not None and getattr(processor, "image_token_id", None) is not None
        self.pictures = PictureTokens(processor, model_path, engine.config.max_pixels) if vlm else None

    def __getattr__(self, name: str) -> Any:
        if name == "engine":  # not set yet: no recursion while unpickling / before __init__
            raise AttributeError(name)
        return getattr(self.engine, name)

    def update_weights(self, buckets: WeightBuckets) -> None:
        self.engine.update_weights(buckets)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def generate_sequences(self, prompts: Any, request: GenerationRequest | None = None) -> Any:
        request = request or GenerationRequest()
        engine = self.engine
        settings = resolve_sampling(engine.config, request)
        budget = settings.max_tokens
        engine._wake({"weights", "kv_cache"})
        multi_modal = prompts.non_tensor_batch.get("multi_modal_data")
        fields = prompts.non_tensor_batch if self.tools_take_row else {}
        places = prompts.non_tensor_batch.get(ROW_PLACE_KEY)
        stepped, tool_env = self.stepped_env, self.tool_env
        trajectories = [
            Trajectory(
                ids,
                multi_modal[i] if multi_modal is not None else None,
                row={key: values[i] for key, values in fields.items()} if self.tools_take_row else None,
                place=str(places[i]) if places is not None else None,
            )
            for i, ids in enumerate(prompt_token_lists(prompts, engine.pad_token_id))
            for _ in range(settings.engine_n)
        ]
        one_sample = replace(settings, n=1)
        tool_seconds, self._env_failures_logged = 0.0, 0
        with GenerationTimer() as timer:
            if stepped or tool_env:
                seeds = self._reset_seeds(request, len(prompts))
                reset = self._reset_envs if stepped else self._reset_tool_envs
                tool_seconds += reset(trajectories, prompts, settings.engine_n, seeds)
            reset_differs = self._tasks_differ(trajectories, settings.engine_n) if tool_env else 0
            for turn in range(self.multi_turn.max_turns):
                active = [t for t in trajectories if not t.done]
                if not active:
                    break
                self._generate_turn(active, one_sample, budget, request, turn)
                if stepped:
                    tool_seconds += self._step_envs(active, budget, turn)
                    continue
                for t in active:
                    if tool_env and t.env is None:
                        t.done = True  # its reset failed: the first turn is all it gets
                calling = [(t, self.parse(t.messages[-1]["content"])) for t in active if not t.done]
                calling = [(t, calls) for t, calls in calling if calls]
                for t in active:
                    if not t.done and not any(t is c for c, _ in calling):
                        # answered without a tool call; cut by turn_max_tokens when it did not stop by itself
                        t.done, t.truncated = True, not t.stopped
                if not calling:
                    break
                if turn == self.multi_turn.max_turns - 1:
                    for t, _ in calling:  # no turn is left to read the results: the calls are not run
                        t.done, t.max_turns_reached = True, True
                    break
                flat = [call for _, calls in calling for call in calls]
                rows = [t.row for t, calls in calling for _ in calls]
                tools = [self._tools_of(t) for t, calls in calling for _ in calls] if tool_env else self.tools
                results, seconds = run_tool_calls(flat, tools, self.multi_turn.tool_timeout, rows, self._abandoned)
                tool_seconds += seconds
                position = 0
                for t, calls in calling:
                    mine = results[position : position + len(calls)]
                    position += len(calls)
                    self._append_tool_results(t, calls, mine, budget)
            if tool_env and self.env_rewards:
                tool_seconds += self._env_get_rewards(trajectories)
        self._log_env_failures_left()
        response_ids = repeat_greedy([t.response_ids for t in trajectories], settings)
        data = build_rollout_output(
            prompts,
            response_ids,
            repeat_greedy([t.log_probs for t in trajectories], settings),
            n=settings.n,
            response_length=budget,
            pad_token_id=engine.pad_token_id,
        )
        if any(t.prompt_insert for t in trajectories):
            self._insert_into_prompts(data, repeat_greedy(trajectories, settings))
        # every token is attended to (attention_mask); only the model's are trained on (response_mask)
        model_mask = repeat_greedy([t.model_mask for t in trajectories], settings)
        response_mask = torch.zeros_like(data.batch["response_mask"])
        for i, mask in enumerate(model_mask):
            response_mask[i, : len(mask)] = torch.tensor(mask, dtype=response_mask.dtype)
        data.batch["response_mask"] = response_mask
        data.non_tensor_batch["messages"] = _object_array(repeat_greedy([t.messages for t in trajectories], settings))
        counted = {"env": stepped or tool_env, "tools": not stepped}
        counts = [trajectory_counts(t, **counted) for t in trajectories]
        data.non_tensor_batch[MULTI_TURN_COUNTS] = _object_array(repeat_greedy(counts, settings))
        if any(t.pictures or t.prompt_pictures for t in trajectories):
            self._add_pictures(data, repeat_greedy(trajectories, settings), budget)
        rewards = np.array(repeat_greedy([t.env_reward for t in trajectories], settings), dtype=np.float64)
        if stepped or tool_env:  # read by the trainer, which stops a run whose environment always fails
            data.non_tensor_batch[ENV_ERROR_KEY] = _object_array(
                repeat_greedy([t.env_error for t in trajectories], settings)
            )
        if stepped:
            data.non_tensor_batch["env_reward"] = rewards
            self._release_envs(trajectories)  # each closed: a stepped environment is new for every trajectory
        if tool_env:
            # TRL's `environments`: each trajectory's instance, as its attributes (the instance stays here)
            states = [EnvState(t.env) if t.env is not None else None for t in trajectories]
            data.non_tensor_batch["environments"] = _object_array(repeat_greedy(states, settings))
            if any(t.reset_content is not None for t in trajectories):  # TRL's reward functions read grown prompts
                contents = [t.reset_content for t in trajectories]
                data.non_tensor_batch[RESET_CONTENT] = _object_array(repeat_greedy(contents, settings))
            self._release_envs(trajectories)
            if self.env_rewards:  # added to the reward function's overall by the scorer (TRL's contract)
                data.non_tensor_batch["env_get_reward"] = rewards
        width = response_mask.shape[-1]
        metrics = generation_metrics(response_mask, timer.seconds, data.batch["attention_mask"][:, -width:])
        metrics.update(multi_turn_metrics(trajectories, tool_seconds, **counted))
        metrics["rollout/multi_turn/abandoned_still_running"] = float(self._warn_abandoned())
        if tool_env:
            metrics["rollout/multi_turn/reset_differs"] = float(reset_differs)
            metrics.update(self._env_reward_by_name(trajectories))
        metrics.update(engine._last_sync_metrics)  # reported once, with the first generation after a sync
        engine._last_sync_metrics = {}
        data.meta_info["metrics"] = metrics
        return data

    def _generate_turn(
        self, active: list[Trajectory], settings: Any, budget: int, request: GenerationRequest, turn: int
    ) -> None:
        engine = self.engine
        seed = None if request.seed is None else [*np.atleast_1d(request.seed), turn]
        params = engine._sampling_params(settings, len(active), seed)
        inputs = []
        for t, param in zip(active, params):
            param.max_tokens = budget - len(t.response_ids)
            if self.multi_turn.turn_max_tokens is not None:
                param.max_tokens = min(param.max_tokens, self.multi_turn.turn_max_tokens)
            item: dict[str, Any] = {"prompt_token_ids": t.prompt_ids + t.engine_ids}
            mm_data = _vllm_multi_modal_data(_media(t))
            if mm_data is not None:
                item["multi_modal_data"] = mm_data
            inputs.append(item)
        outputs = engine.llm.generate(
            inputs, params, use_tqdm=not engine.config.disable_tqdm, lora_request=engine._lora_request
        )
        for t, output in zip(active, outputs):
            completion = output.outputs[0]
            token_ids = list(completion.token_ids)
            log_probs = [step[token].logprob for step, token in zip(completion.logprobs or [], token_ids)]
            engine_view = self.pictures.engine_view(token_ids) if self.pictures is not None else None
            t.append(token_ids, log_probs, budget, engine_view)
            t.turns += 1
            t.messages.append(
                {"role": "assistant", "content": engine.tokenizer.decode(token_ids, skip_special_tokens=True)}
            )
            if t.pending_error is not None:
                t.messages.append(t.pending_error)
                t.pending_error = None
            t.stopped = bool(token_ids) and token_ids[-1] in engine.stop_token_ids
            if len(t.response_ids) >= budget and not t.stopped:
                t.truncated, t.done = True, True  # cut mid-answer at the response budget

    def _reset_seeds(self, request: GenerationRequest, num_prompts: int) -> list[int]:
        """The ``seed`` each prompt's environments are reset with: one per prompt, shared by its n samples (GRPO
        compares the samples of one task), a function of the call's seed, the rollout rank and the prompt only when
        the trainer names the call's seed (a resumed run resets as the uninterrupted run did)."""
        if request.seed is None:
            return self._reset_rng.integers(0, MAX_REQUEST_SEED, size=num_prompts).tolist()
        return call_request_seeds([*np.atleast_1d(request.seed), RESET_SEED_STREAM], self.engine.dp_rank, num_prompts)

    def _reset_envs(self, trajectories: list[Trajectory], prompts: Any, engine_n: int, seeds: list[int]) -> float:
        """One new environment per trajectory (built first, all at once: ``_build_envs``), reset with its prompt's row
        and ``seeds`` (all at once, with the deadline). A failed reset ends the trajectory after its first turn (a
        response is never empty), with no step taken."""
        fields = prompts.non_tensor_batch
        rows = [stepped_reset_row(fields, i // engine_n, seeds[i // engine_n]) for i in range(len(trajectories))]
        built = self._build_envs(trajectories, {None: self.env_class})
        ready = [(t, row) for t, row in zip(trajectories, rows) if t.env is not None]
        jobs = [lambda t=t, row=row: _env_reset(t.env, row) for t, row in ready]
        outcomes, seconds = run_with_deadline(jobs, self.multi_turn.tool_timeout, "reset", abandoned=self._abandoned)
        for (t, _), outcome in zip(ready, outcomes):
            self._count_env_failure(t, outcome)
        return built + seconds

    def _build_envs(self, trajectories: list[Trajectory], classes: dict[Optional[str], type]) -> float:
        """Give each trajectory of a known environment an instance (``classes``: name -> class): an idle one (tool
        environments are pooled), else one built now, all at once and without the tool_timeout deadline: an
        expensive ``__init__`` (a sandbox, a browser, an emulator) is paid once per concurrent trajectory for a tool
        environment and would otherwise time out at every step. A constructor that raises is an error of its
        trajectory. Returns the wall seconds."""
        building = []
        for t in trajectories:
            idle = self._idle_envs.get(t.env_name) if self.tool_env else None
            if idle:
                t.env = idle.pop()
            elif t.env_name in classes:
                building.append(t)
        if not building:
            return 0.0
        jobs = [lambda cls=classes[t.env_name]: EnvOutcome(env=cls()) for t in building]

        def still_waiting(seconds: float, left: int) -> None:  # a frozen progress bar says nothing
            logger.warning(
                "Still building %d of %d instance(s) of environment %s after %.0f s: their __init__ has not returned "
                "(worker.rollout.multi_turn.tool_timeout does not apply to __init__).",
                left,
                len(building),
                self._label(building[0]),
                seconds,
            )

        outcomes, seconds = run_with_deadline(jobs, None, "__init__", still_waiting, self._abandoned)
        for t, outcome in zip(building, outcomes):
            if not self._count_env_failure(t, outcome):
                t.env = outcome.env
        if seconds > self.multi_turn.tool_timeout and not self._warned_slow_init:
            self._warned_slow_init = True
            again = (
                "once per concurrent trajectory (reused)" if self.tool_env else "for every trajectory of every step"
            )
            logger.warning(
                "Building %d instance(s) of environment %s took %.1f s, longer than worker.rollout.multi_turn."
                "tool_timeout=%g s, which does not apply to __init__; instances are built %s. Logged once.",
                len(building),
                self._label(building[0]),
                seconds,
                self.multi_turn.tool_timeout,
                again,
            )
        return seconds

    def _reset_tool_envs(self, trajectories: list[Trajectory], prompts: Any, engine_n: int, seeds: list[int]) -> float:
        """One new tool environment per trajectory, reset with its row's columns and ``seeds`` (all at once, with the
        deadline); the text a reset returns joins the end of the prompt's last user message. A failed reset, or text
        that does not fit data.max_prompt_length, ends the trajectory after its first turn (a response is never
        empty)."""
        fields = prompts.non_tensor_batch
        columns = [
            {RESET_SEED: seeds[i // engine_n], **reset_columns(fields, i // engine_n)}
            for i in range(len(trajectories))
        ]
        for t, row in zip(trajectories, columns):
            # TRL's routing column chooses the environment and is not handed to reset
            t.env_name = row.pop(ENVIRONMENT_COLUMN, None) if self.multi_env else None
        built = self._build_envs(trajectories, self.env_classes)
        ready = [(index, t, row) for index, (t, row) in enumerate(zip(trajectories, columns)) if not t.env_errors]
        jobs = [lambda t=t, row=row: self._reset_one(t, row) for _, t, row in ready]
        outcomes, seconds = run_with_deadline(jobs, self.multi_turn.tool_timeout, "reset", abandoned=self._abandoned)
        attended = prompts.batch["attention_mask"].sum(-1).tolist()
        width = prompts.batch["attention_mask"].shape[-1]
        for (index, t, _), outcome in zip(ready, outcomes):
            if self._count_env_failure(t, outcome) or outcome.observation is None:
                continue
            try:
                self._add_to_prompt(t, outcome, int(attended[index // engine_n]), width)
            except ValueError as err:
                self._count_env_failure(t, EnvOutcome(error=f"reset: {err}"))
        return built + seconds

    def _tasks_differ(self, trajectories: list[Trajectory], engine_n: int) -> int:
        """The prompts whose samples' resets returned different text, said once in the log: the samples of a prompt
        are compared with each other (GRPO's group baseline), which means nothing when each was given another task."""
        groups = (
            [trajectories[i : i + engine_n] for i in range(0, len(trajectories), engine_n)] if engine_n > 1 else []
        )
        differ = sum(len({_reset_task(t) for t in group if t.env is not None}) > 1 for group in groups)
        if differ and not self._warned_tasks_differ:
            self._warned_tasks_differ = True
            logger.warning(
                "Environment %s: the samples of %d of %d prompts got different text from reset. The samples of a "
                "prompt are compared with each other (GRPO's group baseline), which needs one task for all of them: "
                "make reset depend only on the row's columns and its `seed` argument, which is the same for the "
                "samples of a prompt (counted in rollout/multi_turn/reset_differs).",
                self._label(trajectories[0]),
                differ,
                len(groups),
            )
        return differ

    def _reset_one(self, t: Trajectory, columns: dict) -> EnvOutcome:
        """The trajectory's tool environment instance (its row's environment, with several) reset with ``columns``.
        Instances are reused across steps, TRL's "construct once, reset often" (``_build_envs``)."""
        if t.env_name not in self.env_classes:
            names = ", ".join(map(repr, self.env_classes))
            raise ValueError(f"the row's `{ENVIRONMENT_COLUMN}` is {t.env_name!r}, not one of {names}")
        return _tool_env_reset(t.env, columns)

    def _release_envs(self, trajectories: list[Trajectory]) -> None:
        """The instances of finished trajectories back to the idle pool (tool environments) or closed (stepped ones,
        new for every trajectory), but for those a call may still be running in (a reset, tool or get_reward past its
        deadline), which are closed; those whose reset or step failed were closed when dropped."""
        for t in trajectories:
            if t.env is None:
                continue
            if self.tool_env and not t.tool_timeouts and not t.env_timeouts:
                self._idle_envs[t.env_name].append(t.env)
            else:
                self._close_env(t.env)
            t.env = None

    def close(self, timeout: float = 5.0) -> int:
        """Close the pooled tool environment instances, at the worker's shutdown: the sandboxes and subprocesses they
        hold would otherwise outlive the worker, whose process is killed. Waits ``timeout`` seconds at most for all
        of them together (the worker group gives its shutdown 10). Returns how many were closed in time."""
        pools = getattr(self, "_idle_envs", {}).values()  # only a tool environment's rollout pools its instances
        envs = [env for pool in pools for env in pool]
        for pool in pools:
            pool.clear()
        threads = [thread for thread in map(self._close_env, envs) if thread is not None]
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(not thread.is_alive() for thread in threads)

    def _close_env(self, env: Any) -> Optional[threading.Thread]:
        """Call a dropped instance's ``close()`` (Gymnasium's name, what a sandbox or a subprocess is released in),
        when it has one, in a daemon thread: the rollout does not wait for it, and one of a hung call may still hold
        the instance. A close that raises is logged once. Returns the thread (None without a ``close``)."""
        close = getattr(env, "close", None)
        if not callable(close):
            return None

        def work() -> None:
            try:
                resolved(close())
            except (Exception, SystemExit) as err:
                if not self._warned_close:
                    self._warned_close = True
                    logger.warning(
                        "Environment %s: close() raised %s: %s (logged once).",
                        type(env).__name__,
                        type(err).__name__,
                        err,
                    )

        thread = threading.Thread(target=work, daemon=True, name="env-close")
        thread.start()
        return thread

    def _add_to_prompt(self, t: Trajectory, outcome: EnvOutcome, actor_length: int, width: int) -> None:
        """Put a reset's text (tokenized on its own) or its text and pictures (rendered by the chat template as parts
        of a user message) at the end of the prompt's last user message, before the tokens that close it and open
        the model's turn (``actor_length``: the prompt's tokens as the actor reads it, ``width``:
        data.max_prompt_length). The pictures follow the row's in the trajectory's multi_modal_data."""
        end = self.user_turn_end
        if not end or t.prompt_ids[-len(end) :] != end:
            raise ValueError(
                "it returned text for the last user message, but the prompt does not end with a user message and the "
                f"assistant header of the chat template ({self.engine.tokenizer.decode(end)!r}), so there is no user "
                "message to add it to; give the data chat prompts ending with the user's message (a prompt cut at "
                "data.max_prompt_length loses that end: raise it)"
            )
        pictures, grids = self._prepare_pictures(t, outcome.pictures, "it"), []
        if pictures:
            insert = self.renderer.user_content_ids(outcome.observation)
            expanded, grids = self.pictures.expand(insert, pictures)
        else:
            insert = expanded = self.engine.tokenizer.encode(outcome.observation, add_special_tokens=False)
        if actor_length + len(expanded) > width:
            raise ValueError(
                f"the {len(expanded)} tokens of what it returned and the prompt's {actor_length} are more than "
                f"data.max_prompt_length={width}; raise data.max_prompt_length"
            )
        t.prompt_ids = t.prompt_ids[: -len(end)] + insert + end
        t.prompt_insert, t.prompt_pictures, t.prompt_grids = expanded, pictures, grids
        t.reset_content = _with_pictures(outcome.observation, pictures)
        if pictures:  # a copy: the samples of a prompt share the row's
            media = dict(t.multi_modal_data or {})
            media["images"] = list(media.get("images") or []) + pictures
            t.multi_modal_data = media

    def _insert_into_prompts(self, data: Any, trajectories: list[Trajectory]) -> None:
        """The output rows' prompts with each trajectory's reset text in its last user message (what the engine
        generated from): prompt ids, masks and positions, and the whole sequence's, which follow the prompt."""
        prompt_ids, mask = data.batch["prompts"].clone(), data.batch["attention_mask"].clone()
        positions = data.batch["position_ids"].clone()
        if positions.dim() == 2 and any(t.prompt_grids for t in trajectories):  # 3-D rope from here on
            positions = positions[:, None, :].expand(-1, 3, -1).clone()
        width, responses = prompt_ids.shape[-1], data.batch["responses"]
        end = len(self.user_turn_end)
        raw = data.non_tensor_batch.get("raw_prompt_ids")
        for row, t in enumerate(trajectories):
            if not t.prompt_insert:
                continue
            length = int(mask[row, :width].sum())
            grown = length + len(t.prompt_insert)
            insert = torch.tensor(t.prompt_insert, dtype=prompt_ids.dtype)
            ids = torch.cat([prompt_ids[row, width - length : width - end], insert, prompt_ids[row, width - end :]])
            kept = positions[row, ..., width - length : width - end].clone()
            if t.prompt_grids:  # the pictures' 3-D rope positions, after the text the insert follows
                tail = ids[len(ids) - len(insert) - end :].tolist()
                added = self.pictures.response_positions(tail, [0] * len(tail), t.prompt_grids, kept[:, -1])
            else:  # text follows: every rope axis counts on
                added = kept[..., -1:] + torch.arange(1, len(insert) + end + 1, dtype=positions.dtype)
            prompt_ids[row] = self.engine.pad_token_id
            prompt_ids[row, width - grown :] = ids
            mask[row, :width] = 0
            mask[row, width - grown : width] = 1
            positions[row, ..., :width] = 0
            positions[row, ..., width - grown : width] = torch.cat([kept, added], dim=-1)
            if raw is not None:
                raw[row] = list(t.prompt_ids)
        prompt_positions = positions[..., :width]
        data.batch["prompts"] = prompt_ids
        data.batch["input_ids"] = torch.cat([prompt_ids, responses], dim=-1)
        data.batch["attention_mask"] = mask
        data.batch["position_ids"] = torch.cat(
            [prompt_positions, continue_position_ids(prompt_positions, responses.shape[-1])], dim=-1
        )

    def _tools_of(self, t: Trajectory) -> dict[str, Callable]:
        """A trajectory's tools: the tools file's, then its own environment instance's methods."""
        if t.env is None:
            return dict(self.tools)
        methods = self.env_methods[t.env_name]
        return {**self.tools, **{name: getattr(t.env, method) for name, method in methods.items()}}

    def _env_get_rewards(self, trajectories: list[Trajectory]) -> float:
        """Each tool environment's ``get_reward()`` once its trajectory ended (all at once, with the deadline); one
        that raises, is late or is not a finite number counts as an environment error and its reward is 0."""
        scored = [t for t in trajectories if t.env is not None and callable(getattr(t.env, "get_reward", None))]
        outcomes, seconds = run_with_deadline(
            [lambda t=t: _env_get_reward(t.env) for t in scored],
            self.multi_turn.tool_timeout,
            "get_reward",
            abandoned=self._abandoned,
        )
        for t, outcome in zip(scored, outcomes):
            if outcome.error is None:
                t.env_reward = outcome.reward
                continue
            self._note_env_error(t, outcome, outcome.error)
            self._log_env_failure("Environment %s%s: %s; the trajectory's environment reward is 0.", t, outcome.error)
        return seconds

    def _env_reward_by_name(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """With several tool environments, each one's mean get_reward over its trajectories of the batch (TRL logs each
        environment's reward on its own): `rollout/multi_turn/env_reward/<name>/mean`."""
        if not self.multi_env:
            return {}
        rewarded = {name for name, cls in self.env_classes.items() if callable(getattr(cls, "get_reward", None))}
        by_name: dict[str, list[float]] = {}
        for t in trajectories:
            if t.env_name in rewarded:
                by_name.setdefault(t.env_name, []).append(t.env_reward)
        return {f"rollout/multi_turn/env_reward/{name}/mean": float(np.mean(v)) for name, v in by_name.items()}

    def _note_env_error(self, t: Trajectory, outcome: EnvOutcome, error: str) -> None:
        """Count a failed environment call on its trajectory and keep its first error, which the trainer reads to stop
        a run whose environment fails on every trajectory (env_failures.py)."""
        t.env_errors += 1
        t.env_timeouts += outcome.timed_out
        t.env_error = t.env_error or f"{self._label(t)}{_at_row(t)}: {error}"

    def _count_env_failure(self, t: Trajectory, outcome: EnvOutcome) -> bool:
        """A reset or step that failed (raised, was late, returned what the contract does not allow) ends its
        trajectory, whose environment reward is 0 as for a failed get_reward: a broken environment's rewards so far
        are not trusted."""
        if outcome.error is None:
            return False
        error = outcome.error.rstrip(".")  # a message of its own may end in a full stop
        self._note_env_error(t, outcome, error)
        if t.env is not None:
            self._close_env(t.env)
        t.env = None  # abandoned: a hung call may still hold it
        t.env_reward = 0.0
        message = {"role": "user", "content": f"Error: {self._label(t)} {error}."}
        if t.turns:
            t.messages.append(message)
        else:  # a failed reset: recorded after the one turn the trajectory gets (the model never read it)
            t.pending_error = message
        self._log_env_failure("Environment %s%s: %s; the trajectory ends and its environment reward is 0.", t, error)
        return True

    def _log_env_failure(self, text: str, t: Trajectory, error: str) -> None:
        """The first ENV_FAILURES_LOGGED environment failures of a batch, one line each; the rest are summed up once
        at the batch's end (_log_env_failures_left): a broken environment would print a line per trajectory."""
        self._env_failures_logged += 1
        if self._env_failures_logged <= ENV_FAILURES_LOGGED:
            logger.warning(text, self._label(t), _at_row(t), error)

    def _log_env_failures_left(self) -> None:
        left, self._env_failures_logged = self._env_failures_logged - ENV_FAILURES_LOGGED, 0
        if left > 0:
            logger.warning(
                "%d more environment failures in this batch, not logged one by one (each is counted in "
                "rollout/multi_turn/env_errors).",
                left,
            )

    def _warn_no_observation(self, t: Trajectory, shown: bool) -> None:
        """A step that returned None as its observation (often a branch that forgot its ``return``), once per
        environment."""
        label = self._label(t)
        if label in self._warned_no_observation:
            return
        self._warned_no_observation.add(label)
        read = "an empty user turn, recorded in `messages` as one" if shown else "nothing (the step said done)"
        logger.warning(
            'Environment %s%s: step returned None as the observation; the model reads %s. Return text ("" for '
            "nothing to say), a picture or a list of both (logged once per environment).",
            label,
            _at_row(t),
            read,
        )

    def _label(self, t: Trajectory) -> str:
        """The environment of a trajectory as the config names it."""
        return self.env_specs.get(t.env_name) or str(self.multi_turn.env)

    def _step_envs(self, active: list[Trajectory], budget: int, turn: int) -> float:
        """Step every active trajectory's environment on its turn's text; append the observations of those that go on."""
        stepping = [t for t in active if t.env is not None]
        for t in active:
            if t.env is None:
                t.done = True  # its reset failed: the first turn is all it gets
        jobs = [lambda t=t: _env_step(t.env, t.messages[-1]["content"]) for t in stepping]
        outcomes, seconds = run_with_deadline(jobs, self.multi_turn.tool_timeout, "step", abandoned=self._abandoned)
        for t, outcome in zip(stepping, outcomes):
            if self._count_env_failure(t, outcome):
                t.done = True
                continue
            t.env_reward += outcome.reward
            last_turn = turn == self.multi_turn.max_turns - 1
            shown = not (outcome.done or t.done or last_turn)  # a last observation is never shown: nor its pictures
            pictures = []
            if shown:
                try:
                    pictures = self._prepare_pictures(t, outcome.pictures, "an environment observation")
                except ValueError as err:
                    self._count_env_failure(t, EnvOutcome(error=f"step: {err}"))
                    t.done = True
                    continue
            message = {"role": "user", "content": outcome.observation or ""}
            if outcome.observation is None:
                self._warn_no_observation(t, shown)
            if outcome.observation is not None or shown:  # `messages` holds what the model reads
                t.messages.append(message)
            if outcome.done or t.done:
                t.done = True  # the environment is done, or the turn used up the response budget
                continue
            if last_turn:
                t.done, t.max_turns_reached = True, True
                continue
            self._append_context(t, [message], pictures, budget)
        return seconds

    def _append_tool_results(self, t: Trajectory, calls: list, results: list[ToolResult], budget: int) -> None:
        pictures = []
        for index, (call, result) in enumerate(zip(calls, results)):
            try:
                source = f"tool {getattr(call, 'name', call)!r}"
                result.pictures = self._prepare_pictures(t, result.pictures, source, already=len(pictures))
            except ValueError as err:
                results[index] = ToolResult(f"Error: {err}", error=True)
                continue
            pictures += result.pictures
        self._log_first_failures(calls, results)
        self._log_first_coercions(calls, results)
        self._cut_long_results(t, calls, results, budget)
        t.tool_calls += len(calls)
        t.tool_errors += sum(r.error for r in results)
        t.tool_timeouts += sum(r.timed_out for r in results)
        t.tool_args_coerced += sum(len(r.coerced) for r in results)
        messages = self.renderer.messages(calls, results)
        t.messages += messages
        self._append_context(t, messages, pictures, budget)

    def _warn_abandoned(self) -> int:
        """The calls abandoned at their deadline that still run in this worker (a metric), and a warning for each
        tool or environment method the first time its calls are found still running at the end of a generate call."""
        running = abandoned_still_running(self._abandoned)
        new = sorted(set(running) - self._warned_running)
        if new:
            self._warned_running.update(new)
            logger.warning(
                "%d calls abandoned at worker.rollout.multi_turn.tool_timeout still run in this worker (%s): Python "
                "cannot stop a thread, and a CPU-bound one slows the training that shares this process, more with "
                "every step. Make the tool bound its own time (CPU-bound work in a subprocess with a timeout, or a "
                "deadline checked in its loop). Counted in rollout/multi_turn/abandoned_still_running.",
                sum(running.values()),
                ", ".join(f"{name} x{count}" for name, count in sorted(running.items())),
            )
        return sum(running.values())

    def _cut_long_results(self, t: Trajectory, calls: list, results: list[ToolResult], budget: int) -> None:
        """A text result longer than the trajectory's room (tokens left x the longest token's characters) is cut to
        that before it is tokenized, and `messages` keep the cut text: a tool returning a megabyte cost a megabyte's
        tokenization per trajectory, and wrote it whole into every file that keeps the turns, though the model read a
        few hundred tokens of it. The trajectory still ends cut at the budget, as before."""
        limit = max(budget - len(t.response_ids), 0) * self._chars_per_token
        for call, result in zip(calls, results):
            if not isinstance(result.content, str) or len(result.content) <= limit:
                continue
            name = getattr(call, "name", "?")
            if name not in self._warned_long:
                self._warned_long.add(name)
                logger.warning(
                    "Tool %r returned %d characters where its trajectory had room for %d more tokens "
                    "(data.max_response_length): kept its first %d characters, more than those tokens can hold, and "
                    "the trajectory ends cut there (counted in rollout/multi_turn/truncated; logged once per tool).",
                    name,
                    len(result.content),
                    budget - len(t.response_ids),
                    limit,
                )
            result.content = result.content[:limit]

    def _log_first_coercions(self, calls: list, results: list[ToolResult]) -> None:
        """The first call of each tool whose arguments were read as their schema's types, once per tool."""
        for call, result in zip(calls, results):
            name = getattr(call, "name", None)
            if not result.coerced or name is None or name in self._warned_coercions:
                continue
            self._warned_coercions.add(name)
            logger.warning(
                "Tool %r got arguments of another type than its schema advertises, read as the advertised type: %s "
                "(counted in rollout/multi_turn/tool_args_coerced; logged once per tool). An argument no such reading "
                "fits answers the model with an error, counted in tool_errors.",
                name,
                ", ".join(result.coerced),
            )

    def _log_first_failures(self, calls: list, results: list[ToolResult]) -> None:
        """The first error and the first timeout of each tool, once per process: the counts alone do not say which
        tool fails, nor why."""
        for call, result in zip(calls, results):
            name = getattr(call, "name", None)
            if not result.error or name is None or (name, result.timed_out) in self._warned_tools:
                continue
            self._warned_tools.add((name, result.timed_out))
            counted = "tool_timeouts and tool_errors" if result.timed_out else "tool_errors"
            logger.warning(
                "Tool %r: the model read %s (counted in rollout/multi_turn/%s; the first of this tool's %s is "
                "logged, once).%s",
                name,
                short_repr(result.content if isinstance(result.content, str) else "", 300),
                counted,
                "timeouts" if result.timed_out else "errors",
                " An `async def` tool that blocks its event loop (time.sleep, a sync request) makes every async call "
                "waiting on that loop time out with it."
                if result.timed_out
                else "",
            )

    def _prepare_pictures(self, t: Trajectory, pictures: list, source: str, already: int = 0) -> list:
        """Pictures at the size the processor keeps. ValueError for a text model, which cannot read them, and past
        `worker.rollout.limit_images` pictures in the trajectory (``already``: pictures of this turn accepted before
        these), which the engine would refuse; the caller answers the model with it and logs it as it logs the tool's
        or environment's other errors (a tool's once per tool)."""
        if not pictures:
            return []
        limit = self.engine.config.limit_images
        held = len(((t.multi_modal_data or {}).get("images")) or []) + len(t.pictures) + already
        if 0 < limit < held + len(pictures):
            message = (
                f"{source} returned {len(pictures)} picture(s), but the trajectory already holds {held} and "
                f"worker.rollout.limit_images is {limit}; raise it to allow more pictures per trajectory."
            )
            raise ValueError(message)
        if self.pictures is None:
            message = (
                f"{source} returned {len(pictures)} picture(s), but the model has no multimodal processor to read "
                "them; return text, or train a vision-language model."
            )
            raise ValueError(message)
        return [self.pictures.prepare(picture) for picture in pictures]

    def _append_context(self, t: Trajectory, messages: list[dict], pictures: list, budget: int) -> None:
        """Tool results / an observation (and their pictures) through the chat template, out of the mask; a
        trajectory they do not fit is cut and ends."""
        stop_text = self.engine.tokenizer.decode([t.response_ids[-1]]) if t.stopped else ""
        token_ids = self.renderer.token_ids(messages, stop_text)
        if pictures:
            expanded, grids = self.pictures.expand(token_ids, pictures)
            sizes = [int(grid.prod()) // self.pictures.merge**2 for grid in grids]
            cut = t.append_pictured(token_ids, expanded, pictures, grids, self.pictures.image_pad, sizes, budget)
        else:
            cut = t.append(token_ids, None, budget)
        if cut or len(t.response_ids) >= budget:
            t.truncated, t.done = True, True  # no room left for another model turn

    def _add_pictures(self, data: Any, trajectories: list[Trajectory], budget: int) -> None:
        """Each row's multi_modal_data becomes its prompt's pictures then its tool pictures, and the 3-D rope positions
        of a response with pictures are recomputed over it (the rollout continued them as text)."""
        data.non_tensor_batch["multi_modal_data"] = _object_array([_media(t) for t in trajectories])
        positions = data.batch["position_ids"]
        if positions.dim() == 2:  # text positions (a prompt without pictures): the same on all three axes
            positions = positions[:, None, :].expand(-1, 3, -1).clone()
        prompt_length = positions.shape[-1] - budget
        for row, t in enumerate(trajectories):
            if not t.pictures:
                continue
            after = positions[row, :, prompt_length - 1]
            response = self.pictures.response_positions(t.response_ids, t.model_mask, t.grids, after)
            length = response.shape[-1]
            positions[row, :, prompt_length : prompt_length + length] = response
            tail = torch.arange(1, budget - length + 1, dtype=positions.dtype)
            positions[row, :, prompt_length + length :] = response[:, -1:] + tail
        data.batch["position_ids"] = positions


def _with_pictures(content: str | list[dict], pictures: list) -> str | list[dict]:
    """Message content with its ``{"type": "image"}`` placeholders holding their pictures, in order."""
    if not pictures:
        return content
    shown = iter(pictures)
    return [{"type": "image", "image": next(shown)} if part.get("type") == "image" else part for part in content]


def _reset_task(t: Trajectory) -> tuple:
    """What a trajectory's reset put into its prompt: the tokens and the pictures' pixels."""
    return tuple(t.prompt_insert), tuple(picture.tobytes() for picture in t.prompt_pictures)


def stepped_reset_row(fields: dict, index: int, seed: int) -> dict:
    """What a stepped environment's ``reset(row)`` gets: the row's columns (a task's level, id or target, carried as
    ``row_columns``) and the prompt's non-tensor fields (ground_truth, data_source, the pictures ...), over ``seed``
    (a column of that name is the row's own)."""
    row = {RESET_SEED: seed}
    row.update(fields["row_columns"][index] or {} if "row_columns" in fields else {})
    row.update({key: values[index] for key, values in fields.items() if key != "row_columns"})
    return row


def _at_row(t: Trajectory) -> str:
    """`` (on data.train_files row 17)`` for the warnings about a trajectory whose prompt came from a dataset."""
    return f" (on {t.place})" if t.place else ""


def reset_columns(fields: dict, index: int) -> dict:
    """The columns a tool environment's reset gets for prompt ``index``, as TRL passes a row's: the row's own columns
    (``row_columns``: all but the media columns), ``ground_truth`` and ``data_source``, and the row's pictures as
    ``images`` (PIL, at the size the model sees them) unless a column has that name."""
    columns = dict(fields["row_columns"][index] or {}) if "row_columns" in fields else {}
    for key in ("ground_truth", "data_source"):
        if key in fields and key not in columns:
            columns[key] = fields[key][index]
    media = fields["multi_modal_data"][index] if "multi_modal_data" in fields else None
    if media and media.get("images") and "images" not in columns:
        columns["images"] = list(media["images"])
    return columns


def _media(t: Trajectory) -> Any:
    """A trajectory's multi_modal_data: its prompt's, with the tool / observation pictures after the prompt's."""
    if not t.pictures:
        return t.multi_modal_data
    media = dict(t.multi_modal_data or {})
    media["images"] = list(media.get("images") or []) + list(t.pictures)
    return media


def _object_array(rows: list) -> np.ndarray:
    out = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        out[i] = row
    return out


def wrap_multi_turn(
    engine: BaseRollout, config: MultiTurnConfig, processor: Any = None, model_path: Optional[str] = None
) -> BaseRollout:
    """The engine itself, or wrapped for multi-turn rollouts when ``worker.rollout.multi_turn.tools`` / ``env`` is
    set (``processor``: a VLM's, for pictures in tool results and observations)."""
    return MultiTurnRollout(engine, config, processor, model_path) if config.enabled else engine

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

import asyncio
import functools
import inspect
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np
import torch
from PIL import Image

from ...config.schema import MultiTurnConfig
from ...data.rope import make_position_id_fn
from ...data.vision import PictureSizing, to_rgb
from ...models.vision import text_token_for_sampled_pads
from ..reward.loader import import_user_file
from .base import (
    BaseRollout,
    GenerationRequest,
    GenerationTimer,
    WeightBuckets,
    build_rollout_output,
    generation_metrics,
    prompt_token_lists,
    repeat_greedy,
    resolve_sampling,
)
from .vllm_rollout import _vllm_multi_modal_data


logger = logging.getLogger(__name__)

TOOLS_KEY = "worker.rollout.multi_turn.tools"
ENV_KEY = "worker.rollout.multi_turn.env"


# ----------------------------------------------------------------------------------------------------------------------
# tools: loading and calling
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ToolResult:
    content: str | list[dict]
    """Text, or chat content parts ({"type": "text", "text": ...} / {"type": "image"}) when there are pictures."""
    error: bool = False
    timed_out: bool = False
    pictures: list = field(default_factory=list)
    """The PIL images of the image parts of ``content``, in order."""


ROW_ARGUMENT = "row"  # a tool with this parameter gets its trajectory's dataset row (not shown in the schema)


def to_content(value: Any) -> tuple[str | list[dict], list]:
    """What a tool returns (or an environment observes) -> (chat message content, its pictures). A string is text; a
    PIL image is a picture; a list or tuple mixes both, shown in its order (other items become text with str());
    anything else is str(value). Without pictures the content is plain text (list items joined by newlines)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    pictures = [item for item in items if isinstance(item, Image.Image)]
    if not pictures:
        return ("\n".join(map(str, items)) if isinstance(value, (list, tuple)) else str(value)), []
    parts = [
        {"type": "image"} if isinstance(item, Image.Image) else {"type": "text", "text": str(item)} for item in items
    ]
    return parts, pictures


def content_text(content: str | list[dict]) -> str:
    """The text of a message content (pictures left out)."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def takes_row(fn: Callable) -> bool:
    try:
        return ROW_ARGUMENT in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def tool_schema(fn: Callable) -> dict:
    """The OpenAI-style JSON schema of a tool: its ``schema`` attribute, else read from its type hints and Google-style
    docstring the way transformers' chat templates read tools (without the ``row`` argument, which the rollout
    fills)."""
    schema = getattr(fn, "schema", None)
    if schema is not None:
        return schema
    from transformers.utils import get_json_schema

    if takes_row(fn):
        shown = functools.wraps(fn)(lambda **kwargs: None)
        signature = inspect.signature(fn)
        shown.__signature__ = signature.replace(
            parameters=[p for name, p in signature.parameters.items() if name != ROW_ARGUMENT]
        )
        shown.__annotations__ = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != ROW_ARGUMENT}
        return get_json_schema(shown)
    return get_json_schema(fn)


def load_tools(path: str) -> dict[str, Callable]:
    """name -> function of the ``TOOLS`` list of the user file ``path`` (``worker.rollout.multi_turn.tools``)."""
    module = import_user_file(path, TOOLS_KEY)
    listed = getattr(module, "TOOLS", None)
    if not isinstance(listed, (list, tuple)) or not listed or not all(callable(fn) for fn in listed):
        raise ValueError(f"`{TOOLS_KEY}`: `TOOLS` in `{path}` must be a non-empty list of functions.")
    tools = {}
    for fn in listed:
        try:
            schema = tool_schema(fn)
        except Exception as err:  # transformers' DocstringParsingException, TypeHintParsingException
            raise ValueError(
                f"`{TOOLS_KEY}`: no JSON schema for `{getattr(fn, '__name__', fn)}` in `{path}`: {err}. Give it type "
                "hints and a Google-style docstring with an `Args:` line per argument, or a `schema` attribute."
            ) from None
        tools[schema.get("function", schema).get("name", fn.__name__)] = fn
    return tools


def tool_schemas(path: str) -> list[dict]:
    """The JSON schemas of the tools of ``path``, for the chat template's ``tools=`` (the prompts advertise them)."""
    return [tool_schema(fn) for fn in load_tools(path).values()]


def _call(fn: Callable, arguments: dict, row: Optional[dict] = None) -> Any:
    if takes_row(fn):
        arguments = {**arguments, ROW_ARGUMENT: row}
    result = fn(**arguments)
    return asyncio.run(result) if inspect.isawaitable(result) else result


def run_tool_calls(
    calls: list[ToolCall | str],
    tools: dict[str, Callable],
    timeout: float,
    rows: Optional[list[Optional[dict]]] = None,
) -> tuple[list[ToolResult], float]:
    """Run every call at once, each in a daemon thread, and wait at most ``timeout`` seconds for all of them; returns
    the results in order and the wall seconds. A string in ``calls`` is a parse error, answered as an error.
    ``rows[i]``: the dataset row that call i's tool gets when it takes a ``row`` argument.

    Daemon threads, not a pool: a tool that hangs forever cannot be stopped from Python, and its thread must neither
    hold a pool slot nor keep the worker process from exiting."""
    start = time.perf_counter()
    results: list[Optional[ToolResult]] = [None] * len(calls)
    threads = []

    def work(index: int, call: ToolCall) -> None:
        try:
            content, pictures = to_content(_call(tools[call.name], call.arguments, rows[index] if rows else None))
            results[index] = ToolResult(content, pictures=pictures)
        except Exception as err:  # the model reads what went wrong; the step goes on
            results[index] = ToolResult(f"Error: {call.name} raised {type(err).__name__}: {err}", error=True)

    for index, call in enumerate(calls):
        if isinstance(call, str):
            results[index] = ToolResult(call, error=True)
        elif call.name not in tools:
            known = ", ".join(sorted(tools))
            results[index] = ToolResult(f"Error: unknown tool {call.name!r}; the tools are: {known}.", error=True)
        else:
            thread = threading.Thread(target=work, args=(index, call), daemon=True, name=f"tool-{call.name}")
            thread.start()
            threads.append(thread)
    deadline = start + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()))
    for index, call in enumerate(calls):
        if results[index] is None:
            results[index] = ToolResult(
                f"Error: {call.name} took longer than {timeout:g} s and was abandoned.", error=True, timed_out=True
            )
    return results, time.perf_counter() - start


# ----------------------------------------------------------------------------------------------------------------------
# environments: loading and stepping
# ----------------------------------------------------------------------------------------------------------------------
def load_env_class(spec: str) -> type:
    """The environment class of ``path.py:ClassName`` (``worker.rollout.multi_turn.env``)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not name.isidentifier():
        raise ValueError(f"`{ENV_KEY}` is {spec!r}; give it as path/to/file.py:ClassName.")
    module = import_user_file(path, ENV_KEY)
    cls = getattr(module, name, None)
    if not isinstance(cls, type) or not all(callable(getattr(cls, m, None)) for m in ("reset", "step")):
        raise ValueError(
            f"`{ENV_KEY}`: `{name}` in `{path}` must be a class with `reset(row)` and `step(action_text)`."
        )
    return cls


@dataclass
class EnvOutcome:
    observation: Optional[str | list[dict]] = None  # message content (to_content): text, or parts with pictures
    pictures: list = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    error: Optional[str] = None  # what went wrong: the trajectory ends
    timed_out: bool = False
    env: Any = None  # the environment a reset built


def run_with_deadline(jobs: list[Callable[[], Any]], timeout: float, what: str) -> tuple[list[EnvOutcome], float]:
    """Run every job at once, each in a daemon thread (see run_tool_calls), waiting at most ``timeout`` seconds for
    all; a job returns an EnvOutcome, one that raises or is late becomes an EnvOutcome with ``error`` set."""
    start = time.perf_counter()
    results: list[Optional[EnvOutcome]] = [None] * len(jobs)

    def work(index: int, job: Callable[[], Any]) -> None:
        try:
            results[index] = job()
        except Exception as err:
            results[index] = EnvOutcome(error=f"{what} raised {type(err).__name__}: {err}")

    threads = [threading.Thread(target=work, args=(i, job), daemon=True, name="env") for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    deadline = start + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()))
    for index in range(len(jobs)):
        if results[index] is None:
            results[index] = EnvOutcome(error=f"{what} took longer than {timeout:g} s", timed_out=True)
    return results, time.perf_counter() - start


def _env_step(env: Any, action_text: str) -> EnvOutcome:
    output = env.step(action_text)
    if inspect.isawaitable(output):
        output = asyncio.run(output)
    if not isinstance(output, (tuple, list)) or len(output) != 3:
        raise TypeError(f"step must return (observation, reward, done), not {type(output).__name__}")
    observation, reward, done = output
    if observation is None:
        return EnvOutcome(None, float(reward), bool(done))
    content, pictures = to_content(observation)
    return EnvOutcome(content, pictures, float(reward), bool(done))


def _env_reset(env_class: type, row: dict) -> EnvOutcome:
    env = env_class()
    output = env.reset(row)
    if inspect.isawaitable(output):
        asyncio.run(output)
    return EnvOutcome(env=env)


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


HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@register_tool_call_parser("hermes")
def parse_hermes_tool_calls(text: str) -> list[ToolCall | str]:
    """``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``, any number per turn (Qwen2.5/Qwen3, Hermes)."""
    calls: list[ToolCall | str] = []
    for body in HERMES_CALL.findall(text):
        try:
            payload = json.loads(body.strip())
        except json.JSONDecodeError as err:
            calls.append(f"Error: the tool call is not valid JSON ({err.msg}): {body.strip()[:200]}")
            continue
        name = payload.get("name") if isinstance(payload, dict) else None
        arguments = payload.get("arguments", {}) if isinstance(payload, dict) else None
        if isinstance(arguments, str):  # some models send the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            calls.append('Error: a tool call must be {"name": "<tool>", "arguments": {...}}.')
            continue
        calls.append(ToolCall(name, arguments))
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

    def __init__(self, tokenizer: Any, tools: bool = True, processor: Any = None) -> None:
        self.tokenizer = tokenizer
        # a VLM's processor holds the template that renders pictures in messages (the dataset renders prompts with it)
        self.template_owner = processor if getattr(processor, "chat_template", None) else tokenizer
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
        text = self.template_owner.apply_chat_template(
            conversation + tool_messages, tokenize=False, add_generation_prompt=True
        )
        return text[text.rindex(_TURN_END) + len(_TURN_END) :]

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
      PictureSizing with the processor's own limits), so that vLLM and the actor cut it into the same patches;
    - ``expand``: the rendered message's tokens (one pad per picture, vLLM's form) -> the actor's form (each pad
      repeated once per vision token of its picture) and the pictures' (t, h, w) patch grids;
    - ``engine_view``: a model turn as vLLM reads it back at the next turn: a vision pad the policy sampled is not a
      picture, so it becomes the text token the actor reads it as (models/vision.py text_token_for_sampled_pads);
    - ``response_positions``: 3-D rope positions of a response with pictures, from the model's own get_rope_index.
    """

    def __init__(self, processor: Any, model_path: Optional[str] = None) -> None:
        self.processor = processor
        self.sizing = PictureSizing.from_processor(processor)
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
                "result / observation: it does not render pictures in that role. Use a template whose tool/user "
                "messages take content lists with {'type': 'image'} (data.override_chat_template)."
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
    env: Any = None  # this trajectory's environment instance (worker.rollout.multi_turn.env)
    env_reward: float = 0.0
    env_errors: int = 0
    env_timeouts: int = 0
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


def multi_turn_metrics(trajectories: list[Trajectory], tool_seconds: float, env: bool = False) -> dict[str, float]:
    turns = np.array([t.turns for t in trajectories], dtype=float)
    if env:
        rewards = np.array([t.env_reward for t in trajectories], dtype=float)
        return {
            "rollout/multi_turn/turns/mean": float(turns.mean()) if len(turns) else 0.0,
            "rollout/multi_turn/turns/max": float(turns.max()) if len(turns) else 0.0,
            "rollout/multi_turn/env_reward/mean": float(rewards.mean()) if len(rewards) else 0.0,
            "rollout/multi_turn/env_errors": float(sum(t.env_errors for t in trajectories)),
            "rollout/multi_turn/env_timeouts": float(sum(t.env_timeouts for t in trajectories)),
            "rollout/multi_turn/env_seconds": tool_seconds,
            "rollout/multi_turn/truncated": float(sum(t.truncated for t in trajectories)),
            "rollout/multi_turn/max_turns_reached": float(sum(t.max_turns_reached for t in trajectories)),
        }
    return {
        "rollout/multi_turn/turns/mean": float(turns.mean()) if len(turns) else 0.0,
        "rollout/multi_turn/turns/max": float(turns.max()) if len(turns) else 0.0,
        "rollout/multi_turn/tool_calls": float(sum(t.tool_calls for t in trajectories)),
        "rollout/multi_turn/tool_errors": float(sum(t.tool_errors for t in trajectories)),
        "rollout/multi_turn/tool_timeouts": float(sum(t.tool_timeouts for t in trajectories)),
        "rollout/multi_turn/tool_seconds": tool_seconds,
        "rollout/multi_turn/truncated": float(sum(t.truncated for t in trajectories)),
        "rollout/multi_turn/max_turns_reached": float(sum(t.max_turns_reached for t in trajectories)),
    }


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
        if config.tools and config.env:
            raise ValueError(f"`{TOOLS_KEY}` and `{ENV_KEY}` are both set; give one of them.")
        self.env_class = load_env_class(config.env) if config.env else None
        self.tools = load_tools(config.tools) if config.tools else {}  # first: it may register its own parser
        if config.parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"`worker.rollout.multi_turn.parser` is {config.parser!r}; registered: {', '.join(TOOL_CALL_PARSERS)}."
            )
        self.parse = TOOL_CALL_PARSERS[config.parser]
        self.renderer = ToolMessageRenderer(engine.tokenizer, tools=self.env_class is None, processor=processor)
        self.tools_take_row = any(takes_row(fn) for fn in self.tools.values())
        vlm = processor is not None and getattr(processor, "image_token_id", None) is not None
        self.pictures = PictureTokens(processor, model_path) if vlm else None

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
        trajectories = [
            Trajectory(
                ids,
                multi_modal[i] if multi_modal is not None else None,
                row={key: values[i] for key, values in fields.items()} if self.tools_take_row else None,
            )
            for i, ids in enumerate(prompt_token_lists(prompts, engine.pad_token_id))
            for _ in range(settings.engine_n)
        ]
        one_sample = replace(settings, n=1)
        tool_seconds = 0.0
        with GenerationTimer() as timer:
            if self.env_class is not None:
                tool_seconds += self._reset_envs(trajectories, prompts, settings.engine_n)
            for turn in range(self.multi_turn.max_turns):
                active = [t for t in trajectories if not t.done]
                if not active:
                    break
                self._generate_turn(active, one_sample, budget, request, turn)
                if self.env_class is not None:
                    tool_seconds += self._step_envs(active, budget, turn)
                    continue
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
                results, seconds = run_tool_calls(flat, self.tools, self.multi_turn.tool_timeout, rows)
                tool_seconds += seconds
                position = 0
                for t, calls in calling:
                    mine = results[position : position + len(calls)]
                    position += len(calls)
                    self._append_tool_results(t, calls, mine, budget)
        response_ids = repeat_greedy([t.response_ids for t in trajectories], settings)
        data = build_rollout_output(
            prompts,
            response_ids,
            repeat_greedy([t.log_probs for t in trajectories], settings),
            n=settings.n,
            response_length=budget,
            pad_token_id=engine.pad_token_id,
        )
        # every token is attended to (attention_mask); only the model's are trained on (response_mask)
        model_mask = repeat_greedy([t.model_mask for t in trajectories], settings)
        response_mask = torch.zeros_like(data.batch["response_mask"])
        for i, mask in enumerate(model_mask):
            response_mask[i, : len(mask)] = torch.tensor(mask, dtype=response_mask.dtype)
        data.batch["response_mask"] = response_mask
        data.non_tensor_batch["messages"] = _object_array(repeat_greedy([t.messages for t in trajectories], settings))
        if any(t.pictures for t in trajectories):
            self._add_pictures(data, repeat_greedy(trajectories, settings), budget)
        if self.env_class is not None:
            rewards = repeat_greedy([t.env_reward for t in trajectories], settings)
            data.non_tensor_batch["env_reward"] = np.array(rewards, dtype=np.float64)
        metrics = generation_metrics(response_mask, timer.seconds)
        metrics.update(multi_turn_metrics(trajectories, tool_seconds, env=self.env_class is not None))
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
            t.stopped = bool(token_ids) and token_ids[-1] in engine.stop_token_ids
            if len(t.response_ids) >= budget and not t.stopped:
                t.truncated, t.done = True, True  # cut mid-answer at the response budget

    def _reset_envs(self, trajectories: list[Trajectory], prompts: Any, engine_n: int) -> float:
        """One new environment per trajectory, reset with its prompt's row (all at once, with the deadline). A failed
        reset ends the trajectory after its first turn (a response is never empty), with no step taken."""
        fields = prompts.non_tensor_batch
        rows = [{key: values[i // engine_n] for key, values in fields.items()} for i in range(len(trajectories))]
        jobs = [lambda row=row: _env_reset(self.env_class, row) for row in rows]
        outcomes, seconds = run_with_deadline(jobs, self.multi_turn.tool_timeout, "reset")
        for t, outcome in zip(trajectories, outcomes):
            if not self._count_env_failure(t, outcome):
                t.env = outcome.env
        return seconds

    def _count_env_failure(self, t: Trajectory, outcome: EnvOutcome) -> bool:
        if outcome.error is None:
            return False
        t.env_errors += 1
        t.env_timeouts += outcome.timed_out
        t.env = None  # abandoned: a hung call may still hold it
        t.messages.append({"role": "user", "content": f"Error: {self.multi_turn.env} {outcome.error}."})
        logger.warning("Environment %s: %s; the trajectory ends.", self.multi_turn.env, outcome.error)
        return True

    def _step_envs(self, active: list[Trajectory], budget: int, turn: int) -> float:
        """Step every active trajectory's environment on its turn's text; append the observations of those that go on."""
        stepping = [t for t in active if t.env is not None]
        for t in active:
            if t.env is None:
                t.done = True  # its reset failed: the first turn is all it gets
        jobs = [lambda t=t: _env_step(t.env, t.messages[-1]["content"]) for t in stepping]
        outcomes, seconds = run_with_deadline(jobs, self.multi_turn.tool_timeout, "step")
        for t, outcome in zip(stepping, outcomes):
            if self._count_env_failure(t, outcome):
                t.done = True
                continue
            t.env_reward += outcome.reward
            try:
                pictures = self._prepare_pictures(t, outcome.pictures, "an environment observation")
            except ValueError as err:
                self._count_env_failure(t, EnvOutcome(error=f"step: {err}"))
                t.done = True
                continue
            message = {"role": "user", "content": outcome.observation or ""}
            if outcome.observation is not None:
                t.messages.append(message)
            if outcome.done or t.done:
                t.done = True  # the environment is done, or the turn used up the response budget
                continue
            if turn == self.multi_turn.max_turns - 1:
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
        t.tool_calls += len(calls)
        t.tool_errors += sum(r.error for r in results)
        t.tool_timeouts += sum(r.timed_out for r in results)
        messages = self.renderer.messages(calls, results)
        t.messages += messages
        self._append_context(t, messages, pictures, budget)

    def _prepare_pictures(self, t: Trajectory, pictures: list, source: str, already: int = 0) -> list:
        """Pictures at the size the processor keeps. ValueError (said in the log) for a text model, which cannot read
        them, and past `worker.rollout.limit_images` pictures in the trajectory (``already``: pictures of this turn
        accepted before these), which the engine would refuse."""
        if not pictures:
            return []
        limit = self.engine.config.limit_images
        held = len(((t.multi_modal_data or {}).get("images")) or []) + len(t.pictures) + already
        if 0 < limit < held + len(pictures):
            message = (
                f"{source} returned {len(pictures)} picture(s), but the trajectory already holds {held} and "
                f"worker.rollout.limit_images is {limit}; raise it to allow more pictures per trajectory."
            )
            logger.warning(message)
            raise ValueError(message)
        if self.pictures is None:
            message = (
                f"{source} returned {len(pictures)} picture(s), but the model has no multimodal processor to read "
                "them; return text, or train a vision-language model."
            )
            logger.warning(message)
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

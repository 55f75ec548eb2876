"""From a row's prompt text to the string the model sees.

    prompt text --(data.format_prompt: a Jinja file rendered with `content`)--> user message
    user message --(the chat template: the tokenizer's / processor's, or data.override_chat_template)--> prompt

The prompt file means what it means in EasyR1: the file's text is stripped of surrounding whitespace (leading and
trailing blank lines and spaces, the final newline) before Jinja compiles it with default settings, and it is
rendered with `content` only. A variable other than `content` renders as empty text, as in EasyR1; easyrl warns
once, naming the variables, because it is almost always a typo.

``<image>`` / ``<video>`` placeholders in the text mark where each image / video of the row goes; a row with
images but no placeholders gets its images before the text.

A prompt may also be a list of chat messages (verl's and TRL's conversational data): the format file then renders the
text of its last user message, and the messages go to the chat template as they are. Such a list held as JSON text (a
CSV cell, a column written with json.dumps) and a single message are read as that list (``read_prompt``).
"""

import copy
import json
import logging
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import numpy as np


logger = logging.getLogger(__name__)

PLACEHOLDER = re.compile(r"(<image>|<video>)")
# `<IMAGE>`, `<Video>`: no placeholder (they are lower case), said when a row's pictures go elsewhere for want of one
OTHER_CASE_PLACEHOLDER = re.compile(r"<(?!image>|video>)(?i:image|video)>")


def read_template_file(path: str, config_key: str) -> str:
    """The text of a template file; the error names the config key and the file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{config_key}: template file {str(file)!r} does not exist.")
    return file.read_text(encoding="utf-8")


_ENVIRONMENT = jinja2.Environment()  # the settings of EasyR1's `jinja2.Template(text)`: undefined renders empty


def _source(path: str) -> tuple[str, int]:
    """(the text EasyR1 compiles: the file without surrounding whitespace, the number of lines removed above it)."""
    text = read_template_file(path, "data.format_prompt")
    stripped = text.strip()
    return stripped, text[: len(text) - len(text.lstrip())].count("\n")


@lru_cache(maxsize=32)
def _compile(path: str) -> jinja2.Template:
    source, lines_before = _source(path)
    try:
        return _ENVIRONMENT.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        line = (error.lineno or 1) + lines_before
        raise ValueError(f"data.format_prompt: {path!r} line {line}: {error.message}") from error


@lru_cache(maxsize=32)
def _warn_undefined_variables(path: str) -> None:
    # once per file and process: the train and validation datasets share the template. Variables besides `content`
    # render as empty text (as EasyR1 renders them).
    variables = jinja2.meta.find_undeclared_variables(_ENVIRONMENT.parse(_source(path)[0]))
    if "content" not in variables:
        logger.warning(
            "data.format_prompt: %s never uses {{ content }}: every prompt is the template's own text, without the "
            "row's question. Write {{ content }} where the question goes.",
            path,
        )
    unknown = sorted(variables - {"content"})
    if unknown:
        logger.warning(
            "data.format_prompt: %s uses %s, but a prompt template is rendered with `content` only; they render "
            "as empty text (as in EasyR1). Write {{ content }} for the row's prompt text.",
            path,
            ", ".join(f"`{name}`" for name in unknown),
        )


class PromptFormatter:
    """Renders the ``data.format_prompt`` Jinja file (if any) around each prompt text."""

    def __init__(self, format_prompt: str | None):
        # Only the path is kept (compiled templates do not pickle; worker processes compile their own copy).
        self.path = str(format_prompt) if format_prompt else None
        if self.path:
            _compile(self.path)  # fail at start-up on a missing file or a syntax error
            _warn_undefined_variables(self.path)

    def __call__(self, content: str) -> str:
        if self.path is None:
            return content
        return _compile(self.path).render(content=content)


def build_messages(text: str, num_images: int = 0, num_videos: int = 0) -> list[dict[str, Any]]:
    """One user message. Text-only rows get a plain string; rows with media get typed content parts."""
    return place_media([{"role": "user", "content": text}], num_images, num_videos)


def is_chat_messages(value: Any) -> bool:
    """A prompt (or reply) column's value that is a sequence of chat messages rather than a text (how parquet and
    pandas readers hand lists over: a list, or an object array)."""
    return isinstance(value, (list, tuple, np.ndarray))


def is_chat_message(value: Any) -> bool:
    """One chat message: a mapping with a text `role` and a `content` key."""
    return isinstance(value, Mapping) and isinstance(value.get("role"), str) and "content" in value


def messages_in_json_text(value: Any, is_message: Callable[[Any], bool] = is_chat_message) -> Any:
    """``value``, or the chat messages it holds as JSON text (a CSV cell, a column written with json.dumps): text that
    parses as a JSON list of messages (each ``is_message``) is that list; any other value or text is returned as it
    is. Shared by RL prompts and SFT conversations, so a cell trains the same in both."""
    if not isinstance(value, str) or not value.lstrip().startswith("["):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if isinstance(parsed, list) and parsed and all(map(is_message, parsed)) else value


def read_prompt(value: Any) -> Any:
    """A prompt column's value as it is rendered: chat messages held as JSON text (``messages_in_json_text``) and a
    single message are a list of messages; a text, a list or anything else as stored."""
    value = messages_in_json_text(value)
    return [value] if is_chat_message(value) else value


def split_answer_turns(prompt: Any) -> tuple[Any, list]:
    """(the prompt without the assistant messages that end it, those messages): an SFT conversation ends with its
    answer, which a prompt must not hold (the model would read the answer, then be asked again). A prompt that is no
    chat-message list, or does not end so, is returned as it is, with no answer."""
    if not is_chat_messages(prompt):
        return prompt, []
    messages = list(prompt)
    end = len(messages)
    while end and isinstance(messages[end - 1], Mapping) and messages[end - 1].get("role") == "assistant":
        end -= 1
    return (messages[:end], messages[end:]) if end < len(messages) else (prompt, [])


# The rollout output's field holding what each sample's tool-environment reset added to its prompt (message content)
RESET_CONTENT = "reset_content"


def with_reset_content(messages: list, content: Any) -> list:
    """Chat ``messages`` whose last message has ``content`` (a reset's text or content parts) added at its end, as
    TRL grows the prompt it hands reward functions; text meeting parts becomes a text part. The messages are not
    changed in place."""
    if content is None or not messages:
        return messages
    last = messages[-1]
    present = last.get("content") or ""
    if isinstance(content, list) and isinstance(present, str):
        present = [{"type": "text", "text": present}] if present else []
    if isinstance(content, str) and not isinstance(present, str):
        content = [{"type": "text", "text": content}]
    return [
        *messages[:-1],
        {**last, "content": list(present) + content if isinstance(content, list) else present + content},
    ]


# Where a content part names its picture or video: Qwen's / qwen-vl-utils' {"type": "image", "image": ...},
# transformers' {"type": "image", "url" | "path": ...}, OpenAI's {"type": "image_url", "image_url": {"url": ...}}.
MEDIA_SOURCE_KEYS = {"image": ("image", "url", "path"), "video": ("video", "url", "path")}


def _part_media(part: Any) -> tuple[str, Any] | None:
    """(kind, source) of a content part that carries its own picture or video, else None."""
    if not isinstance(part, dict):
        return None
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return "image", url.get("url") if isinstance(url, dict) else url
    kind = part.get("type")
    for key in MEDIA_SOURCE_KEYS.get(kind, ()):
        if part.get(key) is not None:
            return kind, part[key]
    return None


# qwen-vl-utils' per-part sampling keys, which easyrl does not read: the data.* key that sets it for every row
PART_OPTION_KEYS = {
    "fps": "data.video_fps",
    "nframes": "data.max_frames",
    "max_frames": "data.max_frames",
    "min_frames": "data.max_frames",
    "min_pixels": "data.min_pixels",
    "max_pixels": "data.max_pixels",
    "total_pixels": "data.max_pixels",
    "resized_height": "data.max_pixels",
    "resized_width": "data.max_pixels",
    "video_start": None,
    "video_end": None,
}


@lru_cache(maxsize=32)
def _warn_part_options(keys: tuple[str, ...]) -> None:
    """Once per set of keys: data written for qwen-vl-utils' process_vision_info sets sampling per part."""
    instead = sorted({PART_OPTION_KEYS[key] for key in keys} - {None})
    logger.warning(
        "A picture or video content part sets %s, which easyrl does not read per part: every row is sampled by %s "
        "(the same for all rows).%s Logged once.",
        ", ".join(f"`{key}`" for key in keys),
        ", ".join(instead) or "its whole length",
        " A clip's start and end are not read: cut the video file to the clip."
        if {"video_start", "video_end"} & set(keys)
        else "",
    )


def media_in_messages(conversation: Any) -> tuple[list, list]:
    """(pictures, videos) that a chat-message prompt carries inside its content parts, in order (see
    ``MEDIA_SOURCE_KEYS``); empty when the media come from the row's columns instead."""
    found: dict[str, list] = {"image": [], "video": []}
    for message in conversation if is_chat_messages(conversation) else []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, (list, tuple, np.ndarray)) else []:
            media = _part_media(part)
            if media is not None:
                found[media[0]].append(media[1])
                if unread := tuple(sorted(key for key in part if key in PART_OPTION_KEYS)):
                    _warn_part_options(unread)
    return found["image"], found["video"]


def without_nulls(value: Any) -> Any:
    """``value`` without the null entries of its mappings, at any depth: a columnar file (parquet, or `datasets`)
    gives every row's mapping the union of all rows' keys, None where a row has none (an `add` tool would list a
    `city` parameter, a call to it a `"city": null` argument)."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [without_nulls(item) for item in value]
    return value


def arguments_as_object(call: Any) -> Any:
    """A tool call with its ``function.arguments`` as an object, as transformers' chat templates expect: a JSON string
    of one (OpenAI's API format) parsed (Qwen2.5's template renders a string through `tojson` once more, and the model
    would learn to write escaped JSON), an object read from a columnar file without the nulls it was filled with (a
    null written in a JSON string is the data's own and stays)."""
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(arguments, dict):
        return {**call, "function": {**function, "arguments": without_nulls(arguments)}}
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return call
    return {**call, "function": {**function, "arguments": parsed}} if isinstance(parsed, dict) else call


def conversation_messages(
    conversation: list, formatter: PromptFormatter, num_images: int = 0, num_videos: int = 0
) -> list[dict[str, Any]]:
    """A prompt given as chat messages, ``[{"role": ..., "content": ...}, ...]`` (the conversational format of verl's
    and TRL's data sets: a system turn, earlier turns), as the messages the chat template renders.
    ``data.format_prompt`` renders the text of the last user message; media go where their placeholders are, else
    before the text of the first user message. Raises ValueError for a list that is not such messages."""
    messages = []
    for i, message in enumerate(conversation):
        content = message.get("content") if isinstance(message, dict) else None
        parts_ok = not isinstance(content, list) or all(isinstance(part, dict) for part in content)
        if not (
            isinstance(message, dict) and isinstance(message.get("role"), str) and "content" in message and parts_ok
        ):
            raise ValueError(
                f"the prompt is a list, so it must be chat messages {{'role': ..., 'content': ...}}; item {i} is "
                f"{str(message)[:80]!r}"
            )
        message = copy.deepcopy(message)  # the row's own value stays as it is
        # an earlier turn's tool calls and their null content (OpenAI's format), read as `easyrl sft` reads them
        if isinstance(message.get("tool_calls"), list):
            message["tool_calls"] = [arguments_as_object(call) for call in message["tool_calls"]]
        if message["content"] is None:
            message["content"] = ""
        if isinstance(content, list):
            # a part that names its picture is a bare part for the chat template; a part read from parquet carries
            # every key of every part (None where unused), and Qwen's template takes a part with an `image` key
            # for a picture: the None keys go
            message["content"] = [
                {"type": media[0]}
                if (media := _part_media(part)) is not None
                else {key: value for key, value in part.items() if value is not None}
                for part in message["content"]
            ]
        messages.append(message)
    users = [message for message in messages if message["role"] == "user"]
    if not users:
        raise ValueError("the prompt's chat messages hold no `user` message")
    content = users[-1]["content"]
    if isinstance(content, str):
        users[-1]["content"] = formatter(content)
    elif isinstance(content, list) and (texts := [part for part in content if part.get("type") == "text"]):
        texts[-1]["text"] = formatter(texts[-1].get("text", ""))
    return text_parts_as_strings(place_media(messages, num_images, num_videos))


def text_parts_as_strings(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A message whose content is text parts alone gets it as one string: what every chat template renders (a text
    model's template adds the content to a string; Qwen-VL's writes text parts one after the other, the same text)."""
    for message in messages:
        content = message["content"]
        if isinstance(content, list) and all(part.get("type") == "text" for part in content):
            message["content"] = "".join(part.get("text") or "" for part in content)
    return messages


def placeholder_parts(text: str) -> list[dict[str, Any]]:
    """A text with ``<image>`` / ``<video>`` placeholders as typed content parts."""
    parts: list[dict[str, Any]] = []
    for piece in PLACEHOLDER.split(text):
        if piece == "<image>":
            parts.append({"type": "image"})
        elif piece == "<video>":
            parts.append({"type": "video"})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _parts(content: Any) -> list[Mapping]:
    """A message content's parts (none for a text; parquet hands a list over as an array)."""
    parts = content if isinstance(content, (list, tuple, np.ndarray)) else []
    return [part for part in parts if isinstance(part, Mapping)]


def _texts(content: Any) -> list[str]:
    """The texts of a message's content: the string, or its text parts'."""
    if isinstance(content, str):
        return [content]
    return [str(part.get("text") or "") for part in _parts(content) if part.get("type") == "text"]


def holds_media(message: Any) -> bool:
    """Whether a chat message names a picture or video: a placeholder in its text, or a picture/video content part."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if any(PLACEHOLDER.search(text) for text in _texts(content)):
        return True
    return any(part.get("type") in ("image", "image_url", "video") for part in _parts(content))


@lru_cache(maxsize=8)
def _warn_other_case_placeholder(variant: str) -> None:
    logger.warning(
        "A prompt holds `%s`, which is no placeholder (they are written `<image>` and `<video>`, in lower case): the "
        "row's pictures and videos go before the text of its first user message, and `%s` stays in the text. Write "
        "it in lower case to place them there. Said once.",
        variant,
        variant,
    )


def place_media(messages: list[dict[str, Any]], num_images: int, num_videos: int) -> list[dict[str, Any]]:
    """Typed content parts for the row's media: at their placeholders, or (none anywhere) before the text of the
    first user message. Text-only rows keep their messages as they are."""
    if num_images == 0 and num_videos == 0:
        return messages
    for message in messages:
        if isinstance(message["content"], str) and PLACEHOLDER.search(message["content"]):
            message["content"] = placeholder_parts(message["content"])
    kinds = [part.get("type") for m in messages if isinstance(m["content"], list) for part in m["content"]]
    if "image" not in kinds and "video" not in kinds:
        first = next((m for m in messages if m["role"] == "user"), None)
        if first is None:
            raise ValueError("the row has media but no user message to put them in")
        for message in messages:
            for piece in _texts(message["content"]):
                for variant in OTHER_CASE_PLACEHOLDER.findall(piece):
                    _warn_other_case_placeholder(variant)
        text = first["content"]
        rest = [{"type": "text", "text": text}] if isinstance(text, str) else list(text)
        first["content"] = [{"type": "image"}] * num_images + [{"type": "video"}] * num_videos + rest
        kinds = ["image"] * num_images + ["video"] * num_videos
    found = kinds.count("image"), kinds.count("video")
    if found != (num_images, num_videos):
        raise ValueError(
            f"the text has {found[0]} <image> and {found[1]} <video> placeholders but the row has "
            f"{num_images} images and {num_videos} videos"
        )
    return messages


class _GenerationBlock(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant's tokens), read as its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


# what transformers renders chat templates with: loop controls (`{% break %}`) and the generation block
_CHAT_ENVIRONMENT = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", _GenerationBlock])


@lru_cache(maxsize=32)
def _read_variables(sources: tuple[str, ...]) -> frozenset[str] | None:
    """The variables chat templates read; None when one uses a tag only transformers knows (unknown then). Parsed
    once per template and process: `easyrl sft` asks for every row that carries tools."""
    read: set[str] = set()
    for source in sources:
        try:
            read |= jinja2.meta.find_undeclared_variables(_CHAT_ENVIRONMENT.parse(source))
        except jinja2.TemplateSyntaxError:
            return None
    return frozenset(read)


@lru_cache(maxsize=32)
def _warn_unread_template_variables(sources: tuple[str, ...], names: tuple[str, ...]) -> None:
    """Once per template and process: a data.apply_chat_template_kwargs name the template never reads changes
    nothing (a Qwen2.5 template has no enable_thinking), which the user should know."""
    read = _read_variables(sources)
    unread = [name for name in names if read is not None and name not in read]
    if unread:
        logger.warning(
            "data.apply_chat_template_kwargs: the chat template reads no %s, so setting it changes nothing (is it "
            "the template of the model you meant?).",
            ", ".join(f"`{name}`" for name in unread),
        )


@lru_cache(maxsize=32)
def _warn_unshown_tools(unnamed: tuple[str, ...]) -> None:
    logger.warning(
        "The chat template does not read `tools`, so the model is not shown the tools of worker.rollout.multi_turn "
        "(%s), and neither data.format_prompt nor the first row's prompt names them: the model cannot know they "
        "exist or how to call them. Describe them and the call format in data.format_prompt (as "
        "format_prompt/arithmetic_tools.jinja does), or set data.override_chat_template to a template that lists "
        "tools (Qwen2.5's and Qwen3's do). If the environment's reset describes them, this can be ignored.",
        ", ".join(unnamed),
    )


class ChatTemplate:
    """Applies the chat template of the tokenizer / processor, or the ``data.override_chat_template`` file.

    ``tools`` (the JSON schemas of ``worker.rollout.multi_turn.tools``) are handed to the template as ``tools=``, the
    way transformers advertises tools: a template that reads them (Qwen2.5/Qwen3: a system block listing them) shows
    them to the model, one that does not renders as without them."""

    def __init__(
        self,
        tokenizer: Any,
        processor: Any = None,
        override_chat_template: str | None = None,
        tools: list[dict] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ):
        """``template_kwargs``: variables for the template (data.apply_chat_template_kwargs)."""
        self.renderer = processor if processor is not None else tokenizer
        self.tools = tools or None
        self.kwargs = dict(template_kwargs or {})
        self.template = (
            read_template_file(override_chat_template, "data.override_chat_template")
            if override_chat_template
            else None
        )
        if self.template is None and not getattr(self.renderer, "chat_template", None):
            raise ValueError(
                f"{type(self.renderer).__name__} has no chat template; set data.override_chat_template to a "
                "Jinja chat-template file."
            )
        source = self.template or self.renderer.chat_template
        self.sources = tuple(source.values()) if isinstance(source, dict) else (source,)
        if self.kwargs:
            _warn_unread_template_variables(self.sources, tuple(sorted(self.kwargs)))

    def warn_unshown_tools(self, tool_names: list[str], described_in: str) -> None:
        """Once per process: warn when this template does not read ``tools`` (SmolLM2's, Llama 2's: it renders as
        without them) and ``described_in`` (the prompt texts the user wrote) does not name every tool either."""
        # a whole word: "calc" is not named by a prompt that says "calculator"
        unnamed = tuple(
            name for name in sorted(set(tool_names)) if not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", described_in)
        )
        if self.reads_tools() is False and unnamed:
            _warn_unshown_tools(unnamed)

    def reads_tools(self) -> bool | None:
        """Whether the template reads ``tools`` (None: unknown, it uses a tag only transformers knows)."""
        read = _read_variables(self.sources)
        return None if read is None else "tools" in read

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> str:
        """``tools``: this prompt's schemas, in place of the template's own (a row's environment's)."""
        return self.render(messages, True, tools if tools is not None else self.tools)

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: list[dict] | None = None
    ) -> str:
        """The template's text of ``messages`` (with the template variables; ``tools`` as `tools=`, none when empty)."""
        return self.renderer.apply_chat_template(
            messages,
            chat_template=self.template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.kwargs,
            **({"tools": tools} if tools else {}),
        )

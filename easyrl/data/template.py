"""From a row's prompt text to the string the model sees.

    prompt text --(data.format_prompt: a Jinja file rendered with `content`)--> user message
    user message --(the chat template: the tokenizer's / processor's, or data.override_chat_template)--> prompt

``<image>`` / ``<video>`` placeholders in the text mark where each image / video of the row goes; a row with
images but no placeholders gets its images before the text.
"""

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2


PLACEHOLDER = re.compile(r"(<image>|<video>)")


def read_template_file(path: str, config_key: str) -> str:
    """The text of a template file; the error names the config key and the file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{config_key}: template file {str(file)!r} does not exist.")
    return file.read_text(encoding="utf-8")


@lru_cache(maxsize=32)
def _compile(path: str) -> jinja2.Template:
    source = read_template_file(path, "data.format_prompt")
    try:
        # Jinja's default drops the file's final newline, as EasyR1's templates expect.
        return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"data.format_prompt: {path!r} line {error.lineno}: {error.message}") from error


class PromptFormatter:
    """Renders the ``data.format_prompt`` Jinja file (if any) around each prompt text."""

    def __init__(self, format_prompt: str | None):
        # Only the path is kept (compiled templates do not pickle; worker processes compile their own copy).
        self.path = str(format_prompt) if format_prompt else None
        if self.path:
            _compile(self.path)  # fail at start-up on a missing file or a syntax error

    def __call__(self, content: str) -> str:
        if self.path is None:
            return content
        try:
            return _compile(self.path).render(content=content)
        except jinja2.UndefinedError as error:
            raise ValueError(
                f"data.format_prompt: {self.path!r} uses an undefined variable ({error.message}); "
                "templates are rendered with `content` only."
            ) from error


def build_messages(text: str, num_images: int = 0, num_videos: int = 0) -> list[dict[str, Any]]:
    """One user message. Text-only rows get a plain string; rows with media get typed content parts."""
    if num_images == 0 and num_videos == 0:
        return [{"role": "user", "content": text}]
    parts: list[dict[str, Any]] = []
    if not PLACEHOLDER.search(text):
        parts += [{"type": "image"}] * num_images + [{"type": "video"}] * num_videos
        parts.append({"type": "text", "text": text})
    else:
        for piece in PLACEHOLDER.split(text):
            if piece == "<image>":
                parts.append({"type": "image"})
            elif piece == "<video>":
                parts.append({"type": "video"})
            elif piece:
                parts.append({"type": "text", "text": piece})
    found = sum(p["type"] == "image" for p in parts), sum(p["type"] == "video" for p in parts)
    if found != (num_images, num_videos):
        raise ValueError(
            f"the prompt has {found[0]} <image> and {found[1]} <video> placeholders but the row has "
            f"{num_images} images and {num_videos} videos"
        )
    return [{"role": "user", "content": parts}]


class ChatTemplate:
    """Applies the chat template of the tokenizer / processor, or the ``data.override_chat_template`` file."""

    def __init__(self, tokenizer: Any, processor: Any = None, override_chat_template: str | None = None):
        self.renderer = processor if processor is not None else tokenizer
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

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        return self.renderer.apply_chat_template(
            messages, chat_template=self.template, add_generation_prompt=True, tokenize=False
        )

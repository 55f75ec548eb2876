"""Supervised fine-tuning data: conversations -> token ids with a loss mask on the assistant's tokens only.

A row is either a conversation, ``sft.messages_key`` (default ``messages``): an OpenAI-style list of
``{"role": ..., "content": ...}``, or a single exchange: ``data.prompt_key`` (the user's turn) and ``sft.response_key``
(the assistant's reply). ``data.format_prompt`` renders the text of the last user message (the prompt column's text),
as in RL, so the model learns the prompt the RL run will show it. Pictures and videos come from ``data.image_key`` /
``data.video_key`` (or from content parts that name them) and are read exactly as for RL prompts: ``<image>`` /
``<video>`` placeholders in a message's text (or ``{"type": "image"}`` / ``{"type": "video"}`` parts) mark where each
goes; with no placeholder at all they go before the first user message's text.

Where the loss falls (the labels): the chat template is rendered turn by turn. For the assistant message i,
``render(messages[:i], add_generation_prompt=True)`` is what the model reads before it answers (exactly the prompt an
RL rollout or a chat server gives it), and ``render(messages[:i + 1])`` adds the answer; the text between the two is
the model's own. Each piece is tokenized on its own, so the tokens are the ones the model reads and writes at
inference (the prompt tokenized alone, the reply token by token), and a multi-turn conversation has every assistant
reply labelled and nothing else (but one with ``"weight": 0``, OpenAI's fine-tuning format: context). Inside a reply's piece the labels stop at its last special token (the end-of-turn
token, e.g. ``<|im_end|>``, which the model must learn to write to stop); what the template adds after it (ChatML's
newline) is glue that the next prompt starts with, never generated, so not labelled. A template that renders earlier
turns differently once later turns follow (one that drops earlier reasoning) cannot be split this way: its rows are
skipped and named.

One item: ``input_ids`` (L,), ``loss_mask`` (L,) 0/1, ``position_ids`` (L,) or (3, L) for Qwen-VL, and
``multi_modal_data`` ({"images", "videos", "video_fps"} as in RL items) for datasets with media.
``collate.sft_collate`` turns items into the actor's layout: the part before the first labelled token is the "prompt"
(left-padded), the rest the "response" (right-padded) whose ``response_mask`` is the loss mask, so the actor's
padding-free forward pass and its token-mean denominator serve SFT unchanged.
"""

import json
import logging
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config.schema import DataConfig, SFTConfig
from .dataset import (
    ROWS_NAMED_IN_WARNINGS,
    UnusableRowError,
    _as_list,
    _is_missing,
    _name_rows,
    check_media_columns,
    data_folder,
    likely_column,
    load_row_media,
    process_with_media,
    skipped_row_records,
)
from .rope import make_position_id_fn
from .sources import load_rows_and_places
from .template import (
    PLACEHOLDER,
    ChatTemplate,
    PromptFormatter,
    arguments_as_object,
    conversation_messages,
    is_chat_messages,
    messages_in_json_text,
    place_media,
    placeholder_parts,
    text_parts_as_strings,
    without_nulls,
)
from .vision import PictureSizing, UnreadableMediaError


logger = logging.getLogger(__name__)


class UnusableConversationError(UnusableRowError):
    """A row that cannot be trained on as it stands; the dataset skips it, counts it and names it."""


def normalize_messages(messages: Any, num_images: int, num_videos: int = 0) -> list[dict[str, Any]]:
    """Messages with plain string content where there is no picture or video, typed parts where there are; checks that
    the places of pictures and videos match the row's ``num_images`` / ``num_videos`` (no placeholder at all: the media
    go before the first user message's text, pictures first)."""
    messages = _as_list(messages)
    if not messages:
        raise UnusableConversationError("the conversation has no messages")
    out = []
    for index, message in enumerate(messages):
        message = _as_chat_message(message)
        if not _is_message(message):
            raise UnusableConversationError(f"message {index} is not a {{role, content}} dict")
        content = "" if _is_missing(message.get("content")) else message["content"]  # a tool call's null content
        if isinstance(content, (int, float)) and not isinstance(content, bool):
            content = str(content)  # a reply written as a JSON number ({"content": 5}) is its text
        if isinstance(content, str):
            parts = placeholder_parts(content) if PLACEHOLDER.search(content) else content
        else:  # typed parts; a column read by `datasets` fills the keys a part lacks with None
            parts = []
            for part in _as_list(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    parts.extend(placeholder_parts(str(part.get("text") or "")))
                elif kind in MEDIA_PART_KINDS:  # its picture or video, if it names one, is read by `media`
                    parts.append({"type": MEDIA_PART_KINDS[kind]})
                else:
                    raise UnusableConversationError(
                        f"message {index} has a content part {part!r}: not text, image or video"
                    )
        kept = {key: message[key] for key in TEMPLATE_MESSAGE_KEYS if not _is_missing(message.get(key))}
        if "tool_calls" in kept:
            kept["tool_calls"] = [arguments_as_object(call) for call in _as_list(kept["tool_calls"])]
        out.append({"role": str(message["role"]), "content": parts, **kept})
        weight = message.get("weight")
        if not _is_missing(weight):
            if weight not in (0, 1) or isinstance(weight, str):
                raise UnusableConversationError(
                    f"message {index} has weight {weight!r}: 0 (context, not trained on) or 1 (trained on)"
                )
            if not weight:
                out[-1][UNTRAINED] = True
    for message in out:  # before counting places: a picture in the answer is that, whatever the count
        if message["role"] == "assistant" and _media_places(message["content"]):
            raise UnusableConversationError(
                "an assistant message holds an image or video; pictures and videos go in user messages"
            )
    if num_images or num_videos:
        try:
            place_media(out, num_images, num_videos)
        except ValueError as error:
            raise UnusableConversationError(str(error)) from error
    elif places := sum(_media_places(message["content"]) for message in out):
        raise UnusableConversationError(
            f"the conversation has {places} <image> / <video> places but the row has no images or videos"
        )
    return text_parts_as_strings(out)


# set on an assistant message whose `weight` is 0 (OpenAI's fine-tuning format): rendered as context, not trained on
UNTRAINED = "_untrained"


@lru_cache(maxsize=8)
def _warn_unread_tools(key: str) -> None:
    """Once per process: rows carry tools, but the chat template never reads `tools`."""
    logger.warning(
        "Rows of the data carry tools (sft.tools_key=%s), but the chat template does not read `tools`: the model is "
        "trained on its tool calls without being shown the tool list. Set data.override_chat_template to a template "
        "that lists tools (Qwen2.5's and Qwen3's do), or describe them in the system message.",
        key,
    )


def is_trained_reply(message: dict[str, Any]) -> bool:
    return message["role"] == "assistant" and not message.get(UNTRAINED)


# the keys of a message besides role and content that chat templates read (Qwen2.5/Qwen3 render tool calls, tool
# results' names and reasoning); a column read by `datasets` fills the keys a message lacks with None: those are dropped
TEMPLATE_MESSAGE_KEYS = ("tool_calls", "name", "tool_call_id", "reasoning_content", "thinking")


# ShareGPT's speakers (LLaMA-Factory's sharegpt format: {"from": "human", "value": "..."}) as chat roles
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "observation": "tool", "function_call": "assistant"}


def _as_chat_message(message: Any) -> Any:
    """A ShareGPT message ({from, value}) as a chat message ({role, content}), other keys kept; anything else as it
    is."""
    if not (isinstance(message, dict) and _is_missing(message.get("role")) and not _is_missing(message.get("from"))):
        return message
    speaker = str(message["from"])
    rest = {key: value for key, value in message.items() if key not in ("from", "value")}
    return {**rest, "role": SHAREGPT_ROLES.get(speaker.lower(), speaker), "content": message.get("value")}


def _stored_messages(value: Any) -> Any:
    """A messages column as stored; one held as JSON text (a CSV cell, a column written with json.dumps) is read as
    the list of messages it holds, as an RL prompt's is (ShareGPT's messages too)."""
    return messages_in_json_text(value, lambda message: _is_message(_as_chat_message(message)))


def _is_message(message: Any) -> bool:
    """A {role, content} dict; OpenAI's assistant message that calls tools may leave out its content."""
    return (
        isinstance(message, dict)
        and not _is_missing(message.get("role"))
        and ("content" in message or not _is_missing(message.get("tool_calls")))
    )


# content part type -> the bare part a chat template takes (OpenAI's image_url is a picture)
MEDIA_PART_KINDS = {"image": "image", "image_url": "image", "video": "video"}


def _media_places(content: str | list[dict[str, Any]]) -> int:
    return 0 if isinstance(content, str) else sum(part["type"] in ("image", "video") for part in content)


def labelled_pieces(messages: list[dict[str, Any]], render) -> list[tuple[str, bool]]:
    """The rendered conversation cut into (text, is an assistant reply) pieces, turn by turn (module docstring).
    ``render(messages, add_generation_prompt) -> str``."""
    if messages[0]["role"] == "assistant":
        raise UnusableConversationError("the conversation starts with an assistant message: nothing prompts it")
    pieces: list[tuple[str, bool]] = []
    done = ""
    for i, message in enumerate(messages):
        if not is_trained_reply(message):
            continue
        before = render(messages[:i], True)
        after = render(messages[: i + 1], False)
        if after == before:
            raise UnusableConversationError(_empty_reply(i, message))
        if not before.startswith(done) or not after.startswith(before):
            raise UnusableConversationError(
                f"the chat template renders the turns before message {i} differently once it follows (it rewrites "
                "earlier turns, e.g. drops their reasoning), so the assistant's tokens cannot be told apart; set "
                "data.override_chat_template to a template that renders each turn the same way"
            )
        pieces += [(before[len(done) :], False), (after[len(before) :], True)]
        done = after
    if not pieces:
        untrained = any(message["role"] == "assistant" for message in messages)
        raise UnusableConversationError(
            "every assistant message has weight 0: nothing to learn"
            if untrained
            else "the conversation has no assistant message (its roles: "
            + ", ".join(dict.fromkeys(str(message["role"]) for message in messages))
            + "): nothing to learn"
        )
    return [(text, labelled) for text, labelled in pieces if text]


def _empty_reply(index: int, message: dict[str, Any]) -> str:
    """Why a row whose assistant message renders with nothing to learn is skipped (it would teach empty answers)."""
    why = "its tool_calls are not rendered by this chat template" if message.get("tool_calls") else "no content"
    return f"assistant message {index} is empty ({why})"


class ConversationEncoder:
    """One row -> its SFT item (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        processor: Any,
        data: DataConfig,
        sft: SFTConfig,
        config_key: str,
        media_dirs: tuple[str, ...] = (),
        model_config: Any = None,
    ):
        self.tokenizer, self.processor, self.data, self.sft = tokenizer, processor, data, sft
        self.config_key, self.media_dirs = config_key, media_dirs
        self.chat_template = ChatTemplate(
            tokenizer, processor, data.override_chat_template, template_kwargs=data.apply_chat_template_kwargs
        )
        self.formatter = PromptFormatter(data.format_prompt)
        self.sizing = PictureSizing.from_processor(processor, data.min_pixels, data.max_pixels) if processor else None
        self.position_ids = make_position_id_fn(processor, model_config)
        # tokens that end a reply: the special tokens of the vocabulary (<|im_end|>, <|eot_id|>, eos ...)
        self.special_ids = {int(i) for i, token in tokenizer.added_tokens_decoder.items() if token.special}
        self.special_ids |= {int(i) for i in tokenizer.all_special_ids}
        # a reply made of added tokens alone (<|im_end|>, Qwen3's empty <think></think>) has nothing to learn
        self.added_ids = self.special_ids | {int(i) for i in tokenizer.added_tokens_decoder}

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: list | None = None) -> str:
        return self.chat_template.render(messages, add_generation_prompt, tools)

    def tools(self, row: dict) -> list[dict[str, Any]] | None:
        """The row's tool schemas (``sft.tools_key``), or None."""
        value = row.get(self.sft.tools_key)
        if _is_missing(value):
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise UnusableConversationError(
                    f"sft.tools_key={self.sft.tools_key!r} holds text that is not JSON ({error})"
                ) from error
        tools = [value] if isinstance(value, dict) else _as_list(value)
        if not all(isinstance(tool, dict) for tool in tools):
            raise UnusableConversationError(
                f"sft.tools_key={self.sft.tools_key!r} holds {str(value)[:80]!r}: give a list of JSON schemas"
            )
        if tools and self.chat_template.reads_tools() is False:
            _warn_unread_tools(self.sft.tools_key)
        return [without_nulls(tool) for tool in tools] or None

    def conversation(self, row: dict) -> Any:
        """The row's chat messages as stored: ``sft.messages_key``, else the prompt column."""
        conversation = _stored_messages(row.get(self.sft.messages_key))
        return row.get(self.data.prompt_key) if _is_missing(conversation) else conversation

    def messages(self, row: dict, num_images: int, num_videos: int) -> list[dict[str, Any]]:
        conversation = _stored_messages(row.get(self.sft.messages_key))
        if isinstance(conversation, str) and not _is_missing(conversation):
            raise UnusableConversationError(
                f"sft.messages_key={self.sft.messages_key!r} holds text, not a list of {{role, content}} messages (nor "
                "JSON text of one)"
            )
        if not _is_missing(conversation):
            return normalize_messages(self.format_last_user_message(conversation), num_images, num_videos)
        prompt, response = row.get(self.data.prompt_key), row.get(self.sft.response_key)
        if _is_missing(prompt) or _is_missing(response):
            raise UnusableConversationError(
                f"no value for sft.messages_key={self.sft.messages_key!r}, nor for both "
                f"data.prompt_key={self.data.prompt_key!r} and sft.response_key={self.sft.response_key!r}"
            )
        # TRL's prompt-completion data may hold chat messages in both columns
        if is_chat_messages(prompt):
            try:
                turns = conversation_messages(list(prompt), self.formatter)
            except ValueError as error:
                raise UnusableConversationError(f"data.prompt_key={self.data.prompt_key!r}: {error}") from error
        else:
            turns = [{"role": "user", "content": self.formatter(str(prompt))}]
        if is_chat_messages(response):
            turns += [dict(message) for message in response]
        else:
            turns.append({"role": "assistant", "content": str(response)})
        return normalize_messages(turns, num_images, num_videos)

    def format_last_user_message(self, conversation: Any) -> list:
        """The conversation with ``data.format_prompt`` rendered around the text of its last user message (before its
        placeholders become parts, as in RL), earlier user turns as they are."""
        # RL renders a chat-message prompt this way (`conversation_messages`), so the conversation's last question
        # reads exactly as the RL prompt holding these turns shows it, and a messages row trains as the same turns
        # split into prompt and completion columns do; formatting every user turn would change the earlier turns
        # that RL shows as written.
        messages = [_as_chat_message(message) for message in _as_list(conversation)]
        users = [
            i for i, message in enumerate(messages) if isinstance(message, dict) and message.get("role") == "user"
        ]
        if self.formatter.path is None or not users:
            return messages
        last = messages[users[-1]]
        if is_chat_messages(last.get("content")):  # typed parts, however the reader hands the list over
            last = {**last, "content": _as_list(last["content"])}
        try:
            messages[users[-1]] = conversation_messages([last], self.formatter)[0]
        except ValueError:  # not a {role, content} message: normalize_messages names what is wrong with it
            pass
        return messages

    def media(self, row: dict) -> tuple[list, list, list[float]]:
        """The row's pictures, videos (sampled frames) and each video's sampling rate, read as for RL prompts."""
        return load_row_media(
            row, self.data, self.conversation(row), self.processor, self.media_dirs, self.sizing, self.config_key
        )

    def _tokenize(self, text: str, images: list, videos: list, fps: list[float]) -> dict[str, Any]:
        if images or videos:
            out = process_with_media(self.processor, text, images, videos, fps)
            return {"input_ids": out["input_ids"][0], **{key: out[key] for key in GRID_KEYS if key in out}}
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return {"input_ids": torch.tensor(ids, dtype=torch.long)}

    def encode(self, row: dict) -> dict[str, Any]:
        images, videos, fps = self.media(row)
        messages = self.messages(row, len(images), len(videos))
        tools = self.tools(row)
        pieces = labelled_pieces(messages, lambda turns, prompt: self.render(turns, prompt, tools))
        replies = iter(i for i, message in enumerate(messages) if is_trained_reply(message))
        media_tokens = {
            kind: getattr(self.processor, f"{kind}_token", None) if items else None
            for kind, items in (("image", images), ("video", videos))
        }
        ids, labels = [], []
        grids: dict[str, list] = {key: [] for key in GRID_KEYS}
        used = {"image": 0, "video": 0}
        for text, labelled in pieces:
            # each piece is tokenized with the pictures and videos whose pads it holds, in order
            counts = {kind: text.count(token) if token else 0 for kind, token in media_tokens.items()}
            window = {kind: slice(used[kind], used[kind] + counts[kind]) for kind in counts}
            out = self._tokenize(text, images[window["image"]], videos[window["video"]], fps[window["video"]])
            used = {kind: used[kind] + counts[kind] for kind in used}
            piece_ids = out["input_ids"]
            mask = torch.zeros_like(piece_ids)
            if labelled:
                special = torch.tensor([int(t) in self.special_ids for t in piece_ids.tolist()], dtype=torch.bool)
                ends = torch.nonzero(special).flatten()
                # up to and including the last special token (the end of turn); no special token: all of it
                mask[: int(ends[-1]) + 1 if len(ends) else len(piece_ids)] = 1
                reply = next(replies)
                words = [t for t in piece_ids[mask.bool()].tolist() if int(t) not in self.added_ids]
                if not self.tokenizer.decode(words).strip():
                    raise UnusableConversationError(_empty_reply(reply, messages[reply]))
            ids.append(piece_ids)
            labels.append(mask)
            for key in GRID_KEYS:
                if key in out:
                    grids[key].append(torch.as_tensor(out[key]))
        if (used["image"], used["video"]) != (len(images), len(videos)):
            raise UnusableConversationError(
                f"the rendered conversation holds {used['image']} image and {used['video']} video blocks for "
                f"{len(images)} images and {len(videos)} videos"
            )
        input_ids, loss_mask = torch.cat(ids), torch.cat(labels)
        model_inputs = {"input_ids": input_ids[None]}
        model_inputs.update({key: torch.cat(parts) for key, parts in grids.items() if parts})
        item = {"input_ids": input_ids, "loss_mask": loss_mask, "position_ids": self.position_ids(model_inputs)}
        if images or videos:  # as RL prompts carry them
            media = {"images": images, "videos": videos, "video_fps": fps}
            item["multi_modal_data"] = {key: value for key, value in media.items() if value}
        return item


# what a processor returns beside the ids that the 3-D rope positions read
GRID_KEYS = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")


# columns that usually hold each part of SFT data (TRL's prompt/completion, ShareGPT's conversations)
LIKELY_COLUMNS = {
    "sft.messages_key": ("messages", "conversations", "conversation", "chat"),
    "data.prompt_key": ("prompt", "question", "problem", "instruction", "input", "query"),
    "sft.response_key": ("completion", "response", "output", "solution", "answer"),
}


def _check_conversation_columns(
    columns: list[str], data_path: str, data: DataConfig, sft: SFTConfig, config_key: str
) -> None:
    """No column for sft.messages_key, nor both data.prompt_key and sft.response_key: no row can be read, so refuse
    the file naming its columns and the keys that likely fit them."""
    keys = {
        "sft.messages_key": sft.messages_key,
        "data.prompt_key": data.prompt_key,
        "sft.response_key": sft.response_key,
    }
    if sft.messages_key in columns or (data.prompt_key in columns and sft.response_key in columns):
        return
    likely = {}
    for key, name in keys.items():
        near = likely_column(name, columns, LIKELY_COLUMNS[key])
        if name not in columns and near:
            likely[key] = near
    if "sft.messages_key" in likely:  # a conversation column alone is enough
        likely = {"sft.messages_key": likely["sft.messages_key"]}
    hint = f" Did you mean {' and '.join(f'{key}={near}' for key, near in likely.items())}?" if likely else ""
    raise ValueError(
        f"{config_key}: {data_path} has no column {sft.messages_key!r} (sft.messages_key), nor both "
        f"{data.prompt_key!r} (data.prompt_key) and {sft.response_key!r} (sft.response_key); its columns are "
        f"{columns}.{hint}"
    )


class SFTDataset(Dataset):
    """The conversations of one data file, every row encoded once when built: rows that cannot be used or are longer
    than ``sft.max_length`` tokens are skipped, counted and named in a warning; no usable row is an error."""

    def __init__(
        self,
        data_path: str,
        tokenizer: Any,
        processor: Any,
        data: DataConfig,
        sft: SFTConfig,
        *,
        config_key: str = "data.train_files",
        model_config: Any = None,
    ):
        self.config_key = config_key
        self.rows, self.places = load_rows_and_places(data_path, config_key)
        _check_conversation_columns(self.rows.column_names, data_path, data, sft, config_key)
        if processor is not None:  # a picture column under another name: the model would learn from the text alone
            check_media_columns(self.rows.column_names, data, config_key, self.rows)
        media_dirs = tuple(folder for folder in (data.image_dir, data_folder(data_path)) if folder)
        self.encoder = ConversationEncoder(tokenizer, processor, data, sft, config_key, media_dirs, model_config)
        # a media column, or (found while encoding) messages that name their own pictures or videos
        self.has_media = any(key in self.rows.column_names for key in (data.image_key, data.video_key))
        self.unusable_rows: list[tuple[int, str]] = []
        self.overlong_rows: list[int] = []
        self.max_length = sft.max_length
        kept, overlong_lengths = [], []
        for index in range(len(self.rows)):
            try:
                encoded = self.encoder.encode(self.rows[index])
            except (UnusableRowError, UnreadableMediaError) as error:
                self.unusable_rows.append((index, str(error)))
                continue
            length = len(encoded["input_ids"])
            self.has_media = self.has_media or "multi_modal_data" in encoded
            if length > sft.max_length:
                self.overlong_rows.append(index)
                overlong_lengths.append(length)
            else:
                kept.append(index)
        self.row_index = np.array(kept, dtype=np.int64)
        total = len(self.rows)
        if self.unusable_rows:
            by_reason: dict[str, list[int]] = {}  # each reason once, with the rows it skipped
            for i, message in self.unusable_rows:
                by_reason.setdefault(message, []).append(i)
            reasons = list(by_reason.items())
            shown = "; ".join(
                f"{_name_rows(rows, self.places)}: {message}" for message, rows in reasons[:ROWS_NAMED_IN_WARNINGS]
            )
            more = len(reasons) - ROWS_NAMED_IN_WARNINGS
            shown += f"; and {more} more reasons" if more > 0 else ""
            logger.warning("%s: skipped %d of %d rows (%s).", config_key, len(self.unusable_rows), total, shown)
        if self.overlong_rows:
            low, high = min(overlong_lengths), max(overlong_lengths)
            logger.warning(
                "%s: skipped %d of %d rows longer than sft.max_length=%d tokens (%s; %s tokens).",
                config_key, len(self.overlong_rows), total, sft.max_length, _name_rows(self.overlong_rows, self.places),
                low if low == high else f"{low} to {high}",
            )  # fmt: skip
        if not kept:
            first = (
                f" First problem: {self.places.name(self.unusable_rows[0][0])}: {self.unusable_rows[0][1]}."
                if self.unusable_rows
                else ""
            )
            within = (
                f" within sft.max_length={sft.max_length} tokens (the shortest has {min(overlong_lengths)})"
                if self.overlong_rows
                else ""
            )
            raise ValueError(
                f"{config_key}: none of the {total} rows of {data_path} is a usable conversation{within}.{first}"
            )

    def __len__(self) -> int:
        return len(self.row_index)

    def skipped_rows(self) -> list[dict[str, Any]]:
        """Every row left out when the dataset was built (see ``skipped_row_records``)."""
        limit = f"longer than sft.max_length={self.max_length} tokens"
        return skipped_row_records(self.config_key, self.places, self.unusable_rows, self.overlong_rows, limit)

    def __getitem__(self, item: int) -> dict[str, Any]:
        index = int(self.row_index[item])
        try:
            out = self.encoder.encode(self.rows[index])
        except (UnusableRowError, UnreadableMediaError) as error:
            raise type(error)(f"{self.config_key}: {self.places.name(index)}: {error}") from error
        if self.has_media:
            out.setdefault("multi_modal_data", None)
        return out

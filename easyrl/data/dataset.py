"""RLHFDataset: rows of prompts (with optional images / videos) -> left-padded model inputs for the rollout.

One item is a dict of
    input_ids       (max_prompt_length,)          left-padded; vision pads expanded the way the processor does
    attention_mask  (max_prompt_length,)
    position_ids    (max_prompt_length,) or (3, max_prompt_length) for Qwen-VL (see rope.py); 0 on padding
    raw_prompt_ids  list[int], unpadded, ONE pad token per image / video (what vLLM expects)
    multi_modal_data {"images": [PIL], "videos": [(frames, 3, H, W) uint8], "video_fps": [float]}  (datasets with
                    media columns only; None for a row without media; images already at the size every processor keeps (vision.PictureSizing); video_fps: the
                    rate each video was sampled at, which the rollout engine needs too)
    ground_truth, data_source
    extra_info      the row's `extra_info` column as stored (verl's data), when the data has one
    conversational  True where the prompt is chat messages (absent otherwise)
    row_columns     {column: value} of the row's other columns (all but the media columns), for a reward function
                    written for TRL, which gets every column of the dataset (``carry_columns=True`` only)
    prompt_messages the prompt's chat messages before the chat template, as text (``carry_prompt_messages=True``
                    only: a judge reads the question from them)

Every row is read, encoded and measured when the dataset is built (the driver builds the datasets before Ray
starts), never first when it is drawn. A file that cannot be read is an error (see sources.py). Rows that cannot be
trained on as they stand are skipped, counted and named in a warning (``unusable_rows``; rows are numbered from 0 in
the order of the source): a row without a value (null or absent) for data.prompt_key or data.answer_key, a picture or
video that cannot be read or sized, ``<image>`` / ``<video>`` placeholders that do not match the row's media, vision
tokens written into the prompt text, a prompt that is neither a text nor chat messages (a list or a mapping of
something else; a single message, or messages held as JSON text, are read as messages), and (with
data.filter_overlong_prompts=false) a prompt whose cut at max_prompt_length would fall inside its pictures. When no
row has a value for one of the two keys, that is an error naming the key (it names the wrong column). Other overlong
prompts are dropped (filter_overlong_prompts=true) or, as EasyR1 does, cut to their first max_prompt_length tokens;
either way their number is reported when the dataset is built.
"""

import dataclasses
import difflib
import json
import logging
import math
import os
import re
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import DataConfig
from ..utils.files import replace_file
from .rope import make_position_id_fn
from .sources import RowPlaces, load_rows_and_places, split_path
from .synthetic import BUILTIN_PREFIX
from .template import (
    PLACEHOLDER,
    ChatTemplate,
    PromptFormatter,
    build_messages,
    conversation_messages,
    holds_media,
    is_chat_messages,
    media_in_messages,
    messages_in_json_text,
    read_prompt,
    read_template_file,
    split_answer_turns,
)
from .vision import PictureSizing, UnreadableMediaError, describe_media, load_image, load_video


logger = logging.getLogger(__name__)

# Screening a handful of rows in parallel costs more in process start-up than it saves: rows that go through a
# processor (pictures) one by one, text rows tokenized in batches (~10k rows a second in one process).
MIN_ROWS_PER_SCREEN_PROCESS = 64
MIN_TEXT_ROWS_PER_SCREEN_PROCESS = 50_000
TEXT_ROWS_PER_SCREEN_BATCH = 1000
# Rows named in a warning about skipped rows (all of them stay in `unusable_rows`).
ROWS_NAMED_IN_WARNINGS = 5
# Tokens that belong to a picture or video block in Qwen-VL prompts; a cut must never fall at or before one.
VISION_BLOCK_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


EXTRA_INFO_KEY = "extra_info"
# the column naming each row's benchmark (else the data file's name stands for it)
SOURCE_COLUMN = "data_source"
ROW_COLUMNS_KEY = "row_columns"
PROMPT_MESSAGES_KEY = "prompt_messages"
# where an item's row is (its data key, file and row number): the warnings about a sample name its row by it
ROW_PLACE_KEY = "row_place"


def text_messages(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """``{role, content}`` messages with text content only, a picture or video part written as ``<image>`` /
    ``<video>`` (what a judge model that reads text is shown of the prompt)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(
                part.get("text") or "" if part.get("type") == "text" else f"<{part.get('type')}>" for part in content
            )
        out.append({"role": str(message["role"]), "content": "" if content is None else str(content)})
    return out


# with several environments (worker.rollout.multi_turn.env as a mapping), the column naming a row's own (TRL's name)
ENVIRONMENT_COLUMN = "environment"
# the prompt of a row whose task a tool environment's reset gives (TRL's placeholder): an empty user message
ENV_EMPTY_PROMPT = [{"role": "user", "content": ""}]
# The name (and data_source) of the prompts of a tool environment that owns the data (no data.train_files).
ENV_PROMPTS = "environment"


class UnusableRowError(ValueError):
    """A row that cannot be trained on as it stands; the dataset skips it, counts it and names it."""


class MissingValueError(UnusableRowError):
    """A row without a value for data.prompt_key or data.answer_key (``key``: "prompt_key" or "answer_key")."""

    def __init__(self, key: str, column: str):
        super().__init__(f"no value for data.{key}={column!r}")
        self.key = key


def _is_missing(value: Any) -> bool:
    """Null, or a float NaN (how a CSV reader may fill an empty cell)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def row_prompt(row: dict, prompt_key: str) -> Any:
    """The row's data.prompt_key value as it is rendered (``read_prompt``: messages held as JSON text or a single
    message are a list of messages), without the assistant messages that end a conversation (an SFT file's answers,
    announced by the dataset; ``row_prompt_and_answers``)."""
    return row_prompt_and_answers(row, prompt_key)[0]


def row_prompt_and_answers(row: dict, prompt_key: str) -> tuple[Any, list]:
    """(``row_prompt``, the assistant messages it leaves out: ``split_answer_turns``)."""
    return split_answer_turns(read_prompt(row_value(row, prompt_key)))


def row_value(row: dict, key: str) -> Any:
    """``row[key]``, or for a dotted key a field inside a column (``reward_model.ground_truth``: verl's data sets keep
    the answer there); None when absent."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:  # a row inside datasets.map is a Mapping, no dict
            return None
        value = value[part]
    return value


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, np.ndarray) and value.dtype == object:
        return list(value)
    return [value]


def _media_list(value: Any) -> list:
    """A row's data.image_key / data.video_key value as a list: an empty text is no picture (as an empty CSV cell
    is), and text holding a JSON list of names (a list written into a CSV cell) is that list. A video given as its
    frames is a list inside the list and stays one."""
    if isinstance(value, str):
        if not value.strip():
            return []
        value = messages_in_json_text(value, is_message=lambda item: isinstance(item, str))
    return [] if _is_missing(value) else _as_list(value)


def _vision_token_ids(tokenizer: Any, processor: Any) -> tuple[list[int], dict[str, int]]:
    """(ids of every vision-block token, {"image": pad id, "video": pad id}) of a multimodal processor."""
    if processor is None:
        return [], {}
    pads = {
        kind: int(token)
        for kind in ("image", "video")
        if (token := getattr(processor, f"{kind}_token_id", None)) is not None
    }
    ids = tokenizer.convert_tokens_to_ids(list(VISION_BLOCK_TOKENS))
    block = {int(i) for i in ids if i is not None and i != tokenizer.unk_token_id}
    return sorted(block | set(pads.values())), pads


@dataclass
class RowEncoder:
    """Turns one raw row into the prompt string and its (unpadded) model inputs. Picklable, so that
    ``datasets.map`` can run it in worker processes."""

    tokenizer: Any
    processor: Any
    config: DataConfig
    formatter: PromptFormatter
    chat_template: ChatTemplate
    config_key: str
    media_dirs: tuple[str, ...] = ()
    """Folders relative picture/video paths are resolved against, in order: data.image_dir, the data file's."""
    sizing: PictureSizing | None = None
    vision_block_ids: list[int] = field(default_factory=list)
    pad_ids: dict[str, int] = field(default_factory=dict)
    tools_by_env: dict[str, list[dict]] | None = None
    """With several environments: the tool schemas each one's rows advertise (the row's ENVIRONMENT_COLUMN)."""
    max_images: int = 0
    """worker.rollout.limit_images: the most pictures the rollout engine takes in one prompt (0: no limit)."""
    empty_prompts: bool = False
    """Whether an empty prompt is a task: a tool environment's reset may give it (TRL's rows that only route to one)."""

    def media(self, row: dict) -> tuple[list, list, list[float]]:
        """Loaded images, videos and each video's sampling rate; raises UnreadableMediaError / UnusableRowError."""
        return load_row_media(
            row, self.config, row_prompt(row, self.config.prompt_key), self.processor, self.media_dirs,
            self.sizing, self.config_key,
        )  # fmt: skip

    def prompt(self, row: dict, index: int, num_images: int, num_videos: int) -> str:
        return self.render(row, self.messages(row, num_images, num_videos))

    def messages(self, row: dict, num_images: int, num_videos: int) -> list[dict[str, Any]]:
        """The chat messages of the row's prompt, before the chat template (format_prompt and system_prompt applied)."""
        text, answers = row_prompt_and_answers(row, self.config.prompt_key)
        # an empty text prompt without pictures asks nothing: the model would answer data.format_prompt alone
        empty = isinstance(text, str) and not text.strip() and not (num_images or num_videos or self.empty_prompts)
        if _is_missing(text) or empty:
            raise MissingValueError("prompt_key", self.config.prompt_key)
        if any(holds_media(message) for message in answers):
            # left out with its answer, its picture would move into the question (place_media puts it there)
            raise UnusableRowError(
                "the conversation's closing assistant messages, its answer, which a prompt leaves out, hold a picture "
                "or video: give the question's pictures in its user messages"
            )
        if isinstance(text, Mapping):  # a single message is read as a list of one (read_prompt): this is none
            raise UnusableRowError(
                f"the prompt is a mapping with the keys {sorted(map(str, text))}, not a chat message "
                "{'role': ..., 'content': ...}, a list of them or a text"
            )
        try:
            if is_chat_messages(text):  # verl's / TRL's conversational data
                messages = conversation_messages(list(text), self.formatter, num_images, num_videos)
            else:
                messages = build_messages(self.formatter(str(text)), num_images, num_videos)
        except ValueError as error:  # placeholders that do not match the row's media, a list that is not messages
            raise UnusableRowError(str(error) + self._template_markers_note(str(error))) from error
        if self.config.system_prompt and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.config.system_prompt}, *messages]
        if self.processor is not None and not (num_images or num_videos):
            # a vision-language model's row that names pictures it does not have would train on the literal text
            # "<image>" (a row with fewer pictures than places is refused by place_media alike)
            places = sum(len(PLACEHOLDER.findall(m["content"])) for m in messages if isinstance(m["content"], str))
            if places:
                raise UnusableRowError(
                    f"the prompt has {places} <image> / <video> placeholder{'s' if places > 1 else ''} but the row has "
                    "no images or videos" + self._template_markers_note("placeholder")
                )
        return messages

    def _template_markers_note(self, reason: str) -> str:
        """A placeholder mismatch where data.format_prompt writes markers itself: the row's own text may have none,
        so the reason says where they came from."""
        if "placeholder" not in reason or self.formatter.path is None:
            return ""
        added = len(PLACEHOLDER.findall(self.formatter("")))
        if not added:
            return ""
        return f" ({added} of them written into every prompt by data.format_prompt {self.formatter.path})"

    def render(self, row: dict, messages: list[dict[str, Any]]) -> str:
        """The prompt text: the chat template over ``messages``, with the tools of the row's environment."""
        if self.tools_by_env is not None:
            name = row.get(ENVIRONMENT_COLUMN)
            if name not in self.tools_by_env:
                raise UnusableRowError(
                    f"its `{ENVIRONMENT_COLUMN}` is {name!r}; with several environments (worker.rollout.multi_turn.env) "
                    f"each row names its own, one of: {', '.join(self.tools_by_env)}"
                )
            return self.chat_template(messages, tools=self.tools_by_env[name])
        return self.chat_template(messages)

    def encode(self, row: dict, index: int) -> dict[str, Any]:
        """The prompt, its model inputs and media; raises UnreadableMediaError / UnusableRowError."""
        images, videos, fps = self.media(row)
        if self.max_images and len(images) > self.max_images:
            raise UnusableRowError(
                f"it has {len(images)} pictures and worker.rollout.limit_images is {self.max_images} (the rollout "
                "engine refuses more in one prompt); raise it"
            )
        messages = self.messages(row, len(images), len(videos))
        prompt = self.render(row, messages)
        if images or videos:
            model_inputs = process_with_media(self.processor, prompt, images, videos, fps)
        else:
            model_inputs = self.tokenizer([prompt], add_special_tokens=False, return_tensors="pt")
        model_inputs = dict(model_inputs)
        self._check_vision_pads(model_inputs)
        return {
            "prompt": prompt,
            "messages": messages,
            "model_inputs": model_inputs,
            "images": images,
            "videos": videos,
            "video_fps": fps,
        }

    def _check_vision_pads(self, model_inputs: dict[str, Any]) -> None:
        """Each picture / video must own exactly its pads: a prompt text that spells out a pad token (or a chat
        template that drops a picture) would leave the model with pads and features that do not pair up."""
        if not self.pad_ids:
            return
        input_ids = model_inputs["input_ids"][0]
        merge = self.processor.image_processor.merge_size**2
        for kind, grid_key in (("image", "image_grid_thw"), ("video", "video_grid_thw")):
            if kind not in self.pad_ids:
                continue
            grids = model_inputs.get(grid_key)
            needed = int(grids.prod(-1).sum()) // merge if grids is not None else 0
            found = int((input_ids == self.pad_ids[kind]).sum())
            if found != needed:
                raise UnusableRowError(
                    f"the prompt holds {found} {kind} pad tokens where its {kind}s need {needed}; does the prompt "
                    f"text contain vision tokens such as <|{kind}_pad|>? Remove them (write <{kind}> where a "
                    f"{kind} goes)"
                )

    def shortest_cut(self, input_ids: torch.Tensor) -> int:
        """The fewest leading tokens that keep every picture / video block whole (0 without media)."""
        if not self.vision_block_ids:
            return 0
        inside = torch.isin(input_ids, torch.tensor(self.vision_block_ids, dtype=input_ids.dtype))
        positions = torch.nonzero(inside).flatten()
        return int(positions[-1]) + 1 if len(positions) else 0

    def _check_answer(self, row: dict) -> None:
        if _is_missing(row_value(row, self.config.answer_key)):
            raise MissingValueError("answer_key", self.config.answer_key)

    def measure(self, row: dict, index: int) -> dict[str, Any]:
        """Prompt length in tokens (vision tokens included), the shortest cut that keeps its pictures whole, or the
        reason the row cannot be used (``missing``: the key whose value the row lacks, else "")."""
        try:
            self._check_answer(row)
            encoded = self.encode(row, index)
        except (UnreadableMediaError, UnusableRowError) as error:
            return _unusable(error)
        input_ids = encoded["model_inputs"]["input_ids"][0]
        return _measured(int(input_ids.shape[-1]), self.shortest_cut(input_ids))

    def measure_text_batch(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        """``measure`` for a batch of rows of a text-only model (no processor): the prompts are tokenized in one call,
        several times faster than one call per row."""
        rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
        results: list[dict[str, Any]] = []
        prompts, positions = [], []
        for row, index in zip(rows, indices):
            try:
                self._check_answer(row)
                self.media(row)  # rows with media are refused here: a text-only model has no processor
                prompts.append(self.prompt(row, index, 0, 0))
                positions.append(len(results))
                results.append({})
            except (UnreadableMediaError, UnusableRowError) as error:
                results.append(_unusable(error))
        if prompts:
            for position, ids in zip(positions, self.tokenizer(prompts, add_special_tokens=False)["input_ids"]):
                results[position] = _measured(len(ids), 0)
        return {key: [result[key] for result in results] for key in ("length", "shortest_cut", "unusable", "missing")}


def _measured(length: int, shortest_cut: int) -> dict[str, Any]:
    return {"length": length, "shortest_cut": shortest_cut, "unusable": "", "missing": ""}


def _unusable(error: Exception) -> dict[str, Any]:
    """The measurement of a row that cannot be used; ``missing`` names the key whose value it lacks, if that is why."""
    missing = error.key if isinstance(error, MissingValueError) else ""
    return {"length": -1, "shortest_cut": -1, "unusable": str(error), "missing": missing}


def load_row_media(
    row: dict,
    config: DataConfig,
    conversation: Any,
    processor: Any,
    media_dirs: tuple[str, ...],
    sizing: PictureSizing | None,
    config_key: str,
) -> tuple[list, list, list[float]]:
    """A row's loaded images, videos and each video's sampling rate: from ``data.image_key`` / ``data.video_key``, or
    from the content parts of ``conversation`` (the row's chat messages) that name their own (Qwen's / OpenAI's
    format); both at once is an UnusableRowError, a file that cannot be read an UnreadableMediaError. Shared by RL
    prompts and SFT conversations."""
    images, videos = _media_list(row.get(config.image_key)), _media_list(row.get(config.video_key))
    in_messages = media_in_messages(conversation)
    if any(in_messages):
        if images or videos:
            raise UnusableRowError(
                f"the messages name their own pictures/videos and the row also has some in "
                f"data.image_key={config.image_key!r} / data.video_key={config.video_key!r}; keep one of the two"
            )
        images, videos = in_messages
    if (images or videos) and processor is None:
        where = (
            "in the content parts of its messages"
            if any(in_messages)
            else f"in data.image_key={config.image_key!r} / data.video_key={config.video_key!r}"
        )
        first = describe_media((images or videos)[0])
        raise ValueError(
            f"{config_key}: rows have images/videos ({where}; the first of this row is {first}) but the model "
            "(worker.actor.model.model_path) has no processor: use a vision-language model, or drop the media from "
            "the rows."
        )
    images = [
        load_image(image, media_dirs, sizing, min_pixels=config.min_pixels, max_pixels=config.max_pixels)
        for image in images
    ]
    frames_and_fps = [
        load_video(
            video, media_dirs, config.video_fps, config.min_pixels, config.max_pixels, config.max_frames, sizing
        )
        for video in videos
    ]
    return images, [frames for frames, _ in frames_and_fps], [fps for _, fps in frames_and_fps]


def process_with_media(processor: Any, text: str, images: list, videos: list, fps: list[float]) -> Any:
    """The processor's model inputs for one text with its loaded pictures and its videos' sampled frames (which the
    processor must take as they are). Shared by RL prompts and SFT conversation pieces."""
    return processor(
        text=[text],
        images=images or None,
        videos=videos or None,
        add_special_tokens=False,
        return_tensors="pt",
        **video_kwargs(videos, fps),
    )


def video_kwargs(videos: list, fps: list[float]) -> dict[str, Any]:
    """Tell the processor the rate the frames were sampled at (it sets the temporal rope spacing from it)."""
    if not videos:
        return {}
    from transformers.video_utils import VideoMetadata

    metadata = [
        VideoMetadata(total_num_frames=len(frames), fps=rate, frames_indices=list(range(len(frames))))
        for frames, rate in zip(videos, fps)
    ]
    return {"video_metadata": metadata, "do_sample_frames": False}


def _rows_inside_a_field(rows: Any, column: str, data_path: str) -> str:
    """A hint when the data is one row holding the rows in a field (``{"data": [{"problem": ...}, ...]}``, as SQuAD
    and many exports write a .json file), which reads as a single row whose value is the whole list; else ''."""
    if len(rows) != 1:
        return ""
    for name, value in rows[0].items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value) and column in value[0]:
            return (
                f" {data_path} is one object holding {len(value)} rows in its field {name!r}, which reads as a single"
                " row: write the rows themselves, as a JSON list of row objects or a .jsonl file of one row per line"
                f" (`python -c \"import json; rows = json.load(open('{os.path.basename(data_path)}'))[{name!r}]; "
                f'print(*map(json.dumps, rows), sep=chr(10))" > rows.jsonl`).'
            )
    return ""


def _near_column(name: str, columns: list[str]) -> str | None:
    """The column whose name is close to ``name`` (a misspelt data key: ``questoin`` for ``question``), or None."""
    close = difflib.get_close_matches(name, columns, n=1, cutoff=0.8)
    if not close:  # the same name in another case or with dashes: ``Question``, ``image-path``
        folded = {column.lower().replace("-", "_"): column for column in columns}
        close = difflib.get_close_matches(name.lower().replace("-", "_"), list(folded), n=1, cutoff=0.8)
        close = [folded[close[0]]] if close else []
    return close[0] if close else None


# the names media columns usually have, beside near spellings of the configured key
LIKELY_MEDIA_COLUMNS = {
    "image_key": ("image", "images", "img", "imgs", "image_path", "image_paths", "picture", "pictures"),
    "video_key": ("video", "videos", "video_path", "video_paths"),
}


def likely_column(name: str, columns: list[str], likely: tuple[str, ...]) -> str | None:
    """The column a key naming ``name`` likely meant: a near spelling of it (``_near_column``), else the first of the
    names such columns usually have (``likely``, in its order, in any case) that the data has; or None."""
    folded = {column.lower(): column for column in columns}
    return _near_column(name, columns) or next((folded[usual] for usual in likely if usual in folded), None)


def _name_rows(rows: Any, places: RowPlaces | None = None) -> str:
    """ "row 3" / "rows 1, 4, 9 and 12 more": the first rows of a warning, all of them counted (with ``places``, rows
    of a folder of data files are named by file: "a.jsonl row 1, b.jsonl row 0")."""
    rows = [int(i) for i in rows]
    more = f" and {len(rows) - ROWS_NAMED_IN_WARNINGS} more" if len(rows) > ROWS_NAMED_IN_WARNINGS else ""
    if places is not None and len(places.names) > 1:
        return ", ".join(places.name(i) for i in rows[:ROWS_NAMED_IN_WARNINGS]) + more
    shown = ", ".join(str(i) for i in rows[:ROWS_NAMED_IN_WARNINGS])
    return f"{'row' if len(rows) == 1 else 'rows'} {shown}{more}"


def skipped_row_records(
    config_key: str, places: RowPlaces, unusable: list[tuple[int, str]], overlong: list[int], overlong_reason: str
) -> list[dict[str, Any]]:
    """Rows a dataset left out, in source order: ``{"data": config_key, "file" (rows of a folder of data files only),
    "row", "reason"}``."""
    reasons = {**{int(index): overlong_reason for index in overlong}, **dict(unusable)}
    records = []
    for index in sorted(reasons):
        file, row = places.file_and_row(index)
        records.append({"data": config_key, **({"file": file} if file else {}), "row": row, "reason": reasons[index]})
    return records


SKIPPED_ROWS_FILE = "skipped_rows.jsonl"


def write_skipped_rows(path: str, datasets_built: list[Any]) -> str | None:
    """List every row the datasets left out, each with its reason, in the JSON-lines file ``path`` (a warning names
    only the first few) and say so; returns ``path``, or None (and removes an earlier run's list) when none was left
    out. ``datasets_built``: datasets with a ``skipped_rows()`` method; None entries are passed over."""
    records = [record for dataset in datasets_built if dataset is not None for record in dataset.skipped_rows()]
    if not records:
        if os.path.exists(path):
            os.remove(path)
        return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    replace_file(path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
    counts = Counter(record["data"] for record in records)
    logger.warning(
        "%d skipped rows (%s) are listed, each with its reason, in %s.",
        len(records),
        ", ".join(f"{key}: {count}" for key, count in counts.items()),
        path,
    )
    return path


def _left_pad(values: torch.Tensor, length: int, pad_value: int) -> torch.Tensor:
    """Pad the last dim of ``values`` on the left to ``length``."""
    pad = length - values.shape[-1]
    return torch.nn.functional.pad(values, (pad, 0), value=pad_value)


def data_folder(data_path: str) -> str | None:
    """The folder of a local data file (or the dataset folder itself): relative media paths may start there."""
    if not data_path or data_path.startswith(BUILTIN_PREFIX):
        return None
    local = Path(split_path(data_path)[0]).expanduser()
    if local.is_file():
        return str(local.resolve().parent)
    if local.is_dir():
        return str(local.resolve())
    return None


MEDIA_SUFFIXES = {
    "image_key": (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff"),
    "video_key": (".mp4", ".avi", ".mov", ".webm", ".mkv"),
}
MEDIA_ROWS_LOOKED_AT = 20  # the first rows whose values tell a column of picture / video files


def _media_kind(value: Any) -> str | None:
    """ "image_key" / "video_key" for a value that names a picture / video file the way data rows do (a path or URL
    with the file's suffix, an image data URI, a {"bytes", "path"} dict, or a list of them); else None."""
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        if value.get("bytes") is not None:
            return "image_key"
        value = value.get("path")
    if not isinstance(value, str):
        return None
    if value.startswith("data:image/"):
        return "image_key"
    name = value.split("?")[0].lower()
    return next((key for key, suffixes in MEDIA_SUFFIXES.items() if name.endswith(suffixes)), None)


def check_media_columns(columns: list[str], data: Any, config_key: str, rows: Any = None) -> None:
    """For a vision-language model: no ``data.image_key`` / ``data.video_key`` column but one that likely holds the
    pictures or videos is refused, since the model would train on the text alone: a column named as such columns are
    (``image``, ``videos``, ...), or one whose values in the first rows of ``rows`` name picture / video files
    (``pics: ["a.png"]``). RL and SFT data are read with the same keys, so both ask this."""
    for key in ("image_key", "video_key"):
        name = getattr(data, key)
        if name in columns:
            continue
        near = likely_column(name, columns, LIKELY_MEDIA_COLUMNS[key]) or _column_of_media(columns, data, key, rows)
        if near:
            raise KeyError(
                f"{config_key}: no column {name!r} (data.{key}) but a column {near!r}: without data.{key}={near} the "
                f"model would see none of its {key.split('_')[0]}s. The columns are {columns}."
            )


def _column_of_media(columns: list[str], data: Any, key: str, rows: Any) -> str | None:
    """The first column (not the prompt's or the answer's) whose first non-empty value among the first rows names
    files of the ``key`` kind, or None."""
    if rows is None:
        return None
    taken = {data.prompt_key.split(".")[0], data.answer_key.split(".")[0]}
    head = rows.select(range(min(len(rows), MEDIA_ROWS_LOOKED_AT)))
    for column in columns:
        if column in taken:
            continue
        value = next((v for v in head[column] if v not in (None, "", [])), None)
        if _media_kind(value) == key:
            return column
    return None


class RLHFDataset(Dataset):
    """Prompts of one data file / dataset, every row screened once when built (values present, media usable, length
    measured against max_prompt_length)."""

    def __init__(
        self,
        data_path: str,
        tokenizer: Any,
        processor: Any,
        config: DataConfig,
        *,
        config_key: str = "data.train_files",
        model_config: Any = None,
        tools: list[dict] | dict[str, list[dict]] | None = None,
        carry_columns: bool = False,
        rows: datasets.Dataset | None = None,
        env_prompts: bool = False,
        carry_prompt_messages: bool = False,
        max_images: int = 0,
        answer_optional: bool = False,
    ):
        """``rows``: the rows themselves (``data_path`` then only names them); ``env_prompts``: a tool environment's
        reset gives each row's task, so data without a prompt (or answer) column is accepted (``_fill_env_columns``);
        ``carry_prompt_messages``: each item carries its prompt's messages as text (a judge reads them);
        ``max_images``: worker.rollout.limit_images, rows with more pictures are skipped and named;
        ``answer_optional``: the reward functions are written for TRL (no ground truth in its contract), so data
        without a data.answer_key column is accepted, each row's answer empty (TRL's prompt-only data)."""
        self.carry_prompt_messages = carry_prompt_messages
        self.config = config
        self.config_key = config_key
        self.tokenizer = tokenizer
        self.data_path = data_path
        self.rows, self.places = load_rows_and_places(data_path, config_key) if rows is None else (rows, RowPlaces())
        self.env_owned = rows is not None and data_path == ENV_PROMPTS  # loader.env_prompt_dataset's rows
        self.source_name = os.path.splitext(os.path.basename(data_path.split("@")[0].rstrip("/")))[0] or data_path
        filled = self._fill_env_columns(env_prompts) if (env_prompts or answer_optional) and len(self.rows) else []
        config = self.config
        self._check_columns(processor)
        if isinstance(tools, dict) and not env_prompts and ENVIRONMENT_COLUMN not in self.rows.column_names:
            # said once for the file, not once for each of its rows
            raise KeyError(
                f"{config_key}: no column `{ENVIRONMENT_COLUMN}`: with several environments "
                f"(worker.rollout.multi_turn.env: {', '.join(tools)}) each row names the one it runs in there. The "
                f"columns are {self.rows.column_names}."
            )
        if config.answer_key not in filled:
            self._warn_empty_answers()
        media_dirs = tuple(folder for folder in (config.image_dir, data_folder(data_path)) if folder)
        vision_block_ids, pad_ids = _vision_token_ids(tokenizer, processor)
        self.encoder = RowEncoder(
            tokenizer=tokenizer,
            processor=processor,
            config=config,
            formatter=PromptFormatter(config.format_prompt),
            chat_template=ChatTemplate(
                tokenizer,
                processor,
                config.override_chat_template,
                None if isinstance(tools, dict) else tools,
                config.apply_chat_template_kwargs,
            ),
            config_key=config_key,
            media_dirs=media_dirs,
            sizing=PictureSizing.from_processor(processor, config.min_pixels, config.max_pixels)
            if processor is not None
            else None,
            vision_block_ids=vision_block_ids,
            pad_ids=pad_ids,
            tools_by_env=tools if isinstance(tools, dict) else None,
            max_images=max_images,
            empty_prompts=env_prompts,
        )
        if tools and len(self.rows):
            self._warn_unshown_tools(tools)
        self._warn_answers_in_prompts()
        self.position_ids = make_position_id_fn(processor, model_config)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.row_index = np.arange(len(self.rows))  # dataset position -> row number in the source
        self.unusable_rows: list[tuple[int, str]] = []
        self.num_filtered_overlong = 0
        self.overlong_rows: list[int] = []  # dropped as longer than data.max_prompt_length
        self.skipped_sources: Counter = Counter()  # data source -> rows skipped (unusable or dropped)
        self.num_truncated = 0
        self.rows_with_media = 0  # kept rows with pictures / videos (set by _screen)
        self.has_media = any(
            key in self.rows.column_names for key in (config.image_key, config.video_key)
        ) or self._messages_carry_media(processor)
        # verl's data keeps a row's metadata there; a reward function written for verl is handed it
        self.has_extra_info = EXTRA_INFO_KEY in self.rows.column_names
        # a reward function written for TRL is handed every column of the row (TRL's GRPOTrainer passes them all);
        # pictures and videos stay out: they can be megabytes a row and travel with every batch
        media_columns = (config.image_key, config.video_key)
        self.carried_columns = (
            [name for name in self.rows.column_names if name not in (*media_columns, *filled)] if carry_columns else []
        )
        self._screen()

    @property
    def num_unreadable(self) -> int:
        """Rows skipped because they cannot be used (see the module docstring)."""
        return len(self.unusable_rows)

    @property
    def unreadable_rows(self) -> list[tuple[int, str]]:
        return self.unusable_rows

    # ------------------------------------------------------------------------------------------------------------------
    # set-up checks
    # ------------------------------------------------------------------------------------------------------------------
    def _warn_unshown_tools(self, tools: list[dict] | dict[str, list[dict]]) -> None:
        """A chat template that does not list tools (SmolLM2's) leaves them unknown to the model unless the user's
        own text describes them: data.format_prompt or the rows' prompts (the first row stands for them)."""
        schemas = [schema for group in tools.values() for schema in group] if isinstance(tools, dict) else tools
        names = [schema["function"]["name"] for schema in schemas if "function" in schema]
        described = str(self.rows[0])
        if self.config.format_prompt:
            described += read_template_file(self.config.format_prompt, "data.format_prompt")
        self.encoder.chat_template.warn_unshown_tools(names, described)

    def _warn_answers_in_prompts(self) -> None:
        """Chat-message prompts that end with the assistant's answer (an SFT file given as RL or eval data): row_prompt
        leaves those messages out; say how many rows had them."""
        column = self.config.prompt_key.split(".")[0]
        if column not in self.rows.column_names:
            return
        # every row (a column may mix texts and message lists), read in slices: a large column is never held whole
        prompts = (
            value for batch in self.rows.select_columns([column]).iter(batch_size=4096) for value in batch[column]
        )
        try:
            ended = [
                i
                for i, value in enumerate(prompts)
                if row_prompt_and_answers({column: value}, self.config.prompt_key)[1]
            ]
        except UnicodeDecodeError:  # a value that is not UTF-8: the screening that follows names the file
            return
        if ended:
            logger.warning(
                "%s: %d of %d prompts (data.prompt_key=%s) end with `assistant` messages, as an SFT conversation ends "
                "with its answer (%s): they are left out of those prompts, or the model would read the answer and be "
                "asked again. The reward's ground truth is data.answer_key=%s.",
                self.config_key,
                len(ended),
                len(self.rows),
                self.config.prompt_key,
                _name_rows(np.asarray(ended), self.places),
                self.config.answer_key,
            )

    def _messages_carry_media(self, processor: Any) -> bool:
        """Some chat-message prompt names its own pictures or videos in its content parts (Qwen's and OpenAI's
        format); only the prompt column is read."""
        column = self.config.prompt_key.split(".")[0]
        if processor is None or column not in self.rows.column_names:
            return False
        if not is_chat_messages(row_prompt(self.rows[0], self.config.prompt_key)):
            return False
        return any(
            any(media_in_messages(row_prompt({column: value}, self.config.prompt_key))) for value in self.rows[column]
        )

    def _fill_env_columns(self, env_prompts: bool = True) -> list[str]:
        """TRL's rows that only choose an environment (its `environment` column) or hold its reset's arguments: data
        with no column at all for data.prompt_key gets an empty user message in each row, which the reset fills
        (data.format_prompt, which formats a row's prompt, is then left out), and data with none for
        data.answer_key an empty answer; without ``env_prompts`` (reward functions written for TRL, which have no
        ground truth), the answer alone. Returns the columns added (not handed to reset or reward functions)."""
        columns, filled = self.rows.column_names, []
        keys = (("prompt_key", ENV_EMPTY_PROMPT), ("answer_key", "")) if env_prompts else (("answer_key", ""),)
        for key, value in keys:
            name = getattr(self.config, key)
            if "." in name or name in columns:  # a field inside a column is the user's to point at
                continue
            near = _near_column(name, columns)
            if near:  # a misspelt key would train on empty prompts (or answers) after a warning: refuse it
                why = (
                    "Rows that only route to the tool environment (its reset gives the task) get an empty "
                    f"{'prompt' if key == 'prompt_key' else 'answer'} only when no column's name is close to "
                    f"data.{key}: rename {near!r} if the reset reads it."
                    if env_prompts
                    else "Data without an answer column (TRL's prompt-only data) gets empty answers only when no "
                    f"column's name is close to data.{key}."
                )
                raise KeyError(
                    f"{self.config_key}: no column {name!r} (data.{key}), but {near!r} is close; set data.{key}="
                    f"{near} if that is the column meant. {why} The columns are {columns}."
                )
            self.rows = self.rows.add_column(name, [value] * len(self.rows))
            filled.append(name)
        if self.config.prompt_key in filled:
            self.config = dataclasses.replace(self.config, format_prompt=None)
        if filled and not env_prompts:
            logger.warning(
                "%s: %s has no column %r (data.answer_key): the reward functions are written for TRL, which hands "
                "them the row's columns and no ground truth, so each row's answer is empty. Set data.answer_key if "
                "the data has one under another name (the columns are %s).",
                self.config_key,
                self.data_path,
                self.config.answer_key,
                columns,
            )
        elif filled:
            logger.warning(
                "%s: %s has no column %s: the environment's reset gives each row its task (TRL's rows that only "
                "route to an environment), so each prompt is an empty user message it fills%s. If the data has them "
                "under other names, set data.prompt_key / data.answer_key to those (the columns are %s).",
                self.config_key,
                self.data_path,
                " or ".join(repr(name) for name in filled),
                ", without data.format_prompt" if self.config.prompt_key in filled else "",
                columns,
            )
        return filled

    def _warn_empty_answers(self) -> None:
        """Rows whose answer is empty text among rows that have one: a data error, almost always (a benchmark row
        whose answer was lost), which a reward that compares with the answer scores 0 in every mean. All rows empty
        is a choice (a judge or a reward that needs no answer): said nothing."""
        key = self.config.answer_key
        column = key.split(".")[0]
        values = [row_value({column: value}, key) for value in self.rows[column]]
        empty = [i for i, value in enumerate(values) if isinstance(value, str) and not value.strip()]
        if empty and len(empty) < len(values):
            logger.warning(
                "%s: %d of %d rows have an empty answer (data.answer_key=%s): %s. They are trained and validated on, "
                "and a reward that compares with the answer scores their samples 0; fill their answers or drop them.",
                self.config_key,
                len(empty),
                len(values),
                key,
                _name_rows(empty, self.places),
            )

    def _check_columns(self, processor: Any) -> None:
        if len(self.rows) == 0:
            raise ValueError(
                f"{self.config_key}: {self.data_path} has no rows; point {self.config_key} at a data file."
            )
        columns = self.rows.column_names
        for key in ("prompt_key", "answer_key"):
            name = getattr(self.config, key)
            if name not in columns and name.split(".")[0] not in columns:  # `column.field` reads inside a column
                near = _near_column(name.split(".")[0], columns)
                hint = f" Did you mean data.{key}={near}?" if near else ""
                if len(columns) == 1 and any(mark in columns[0] for mark in ";\t|"):
                    # a CSV whose header holds its column names as one: another separator (Excel in many locales)
                    hint += (
                        f" The header {columns[0]!r} is one column: the file seems separated by another character "
                        "than a comma; save it comma-separated (CSV) or tab-separated as a .tsv file."
                    )
                hint += _rows_inside_a_field(self.rows, name.split(".")[0], self.data_path)
                raise KeyError(f"{self.config_key}: no column {name!r} (data.{key}); the columns are {columns}.{hint}")
        if processor is not None:
            check_media_columns(columns, self.config, self.config_key, self.rows)

    def _no_rows_hint(self) -> str:
        """What to change when screening left no row, after the reason of the first unusable one."""
        hints = ["raise data.max_prompt_length"] if self.num_filtered_overlong else []
        reason = self.unusable_rows[0][1] if self.unusable_rows else ""
        if "placeholder" in reason:
            hints.append(
                f"check data.image_key / data.video_key (the columns are {self.rows.column_names}) and "
                "data.format_prompt, which must not add or repeat <image> / <video>"
            )
        elif "cannot read" in reason or "cannot download" in reason:
            hints.append("check where the pictures / videos are (data.image_dir, the data file's folder)")
        elif self.unusable_rows:
            hints.append("fix the rows")
        return " or ".join(hints) or "check the data"

    def _warn_skipped(self, what: str, rows: list[tuple[int, str]], total: int, with_reasons: bool = True) -> None:
        if not rows:
            return
        if with_reasons:  # the rows of one reason together: "rows 1, 7, 9: <reason>; row 4: <another>"
            by_reason: dict[str, list[int]] = {}
            for index, message in rows:
                by_reason.setdefault(message, []).append(index)
            reasons = list(by_reason.items())
            shown = "; ".join(
                f"{_name_rows(indices, self.places)}: {message}"
                for message, indices in reasons[:ROWS_NAMED_IN_WARNINGS]
            )
            left = sum(len(indices) for _, indices in reasons[ROWS_NAMED_IN_WARNINGS:])
            shown += f"; and {left} more" if left else ""
        else:
            shown = _name_rows([i for i, _ in rows], self.places)
        logger.warning("%s: skipped %d of %d rows %s (%s).", self.config_key, len(rows), total, what, shown)

    def _measure_all(self) -> datasets.Dataset:
        total = len(self.rows)
        text_only = self.encoder.processor is None
        per_process = MIN_TEXT_ROWS_PER_SCREEN_PROCESS if text_only else MIN_ROWS_PER_SCREEN_PROCESS
        workers = min(self.config.filter_overlong_prompts_workers, os.cpu_count() or 1, total // per_process)
        try:
            return self.rows.map(
                self.encoder.measure_text_batch if text_only else self.encoder.measure,
                batched=text_only,
                batch_size=TEXT_ROWS_PER_SCREEN_BATCH,
                with_indices=True,
                remove_columns=self.rows.column_names,
                num_proc=workers if workers > 1 else None,
                keep_in_memory=True,
                load_from_cache_file=False,
                new_fingerprint=f"screen-{uuid.uuid4().hex}",
                desc=f"Measuring prompts of {self.config_key}",
            )
        except UnicodeDecodeError as error:  # text files are checked when read; a parquet/arrow/hub value can be bad
            raise ValueError(
                f"{self.config_key}: {self.data_path} holds a value that is not UTF-8 ({error}); re-encode the data."
            ) from error

    def _screen(self) -> None:
        """Encode and measure every row (in parallel); drop rows without a prompt or answer, unusable rows and
        overlong prompts (dropped or, without filtering, counted here and cut when drawn; a cut that would fall inside
        a picture drops the row)."""
        total = len(self.rows)
        measured = self._measure_all()
        lengths = np.asarray(measured["length"])
        shortest_cut = np.asarray(measured["shortest_cut"])
        reasons = np.asarray(measured["unusable"], dtype=object)
        missing = np.asarray(measured["missing"], dtype=object)
        limit = self.config.max_prompt_length
        self.unusable_rows = [(int(i), str(reasons[i])) for i in np.flatnonzero(reasons != "")]
        for key in ("prompt_key", "answer_key"):
            lacking = np.flatnonzero(missing == key)
            column = getattr(self.config, key)
            if len(lacking) == total:
                raise ValueError(
                    f"{self.config_key}: no row of {self.data_path} has a value for data.{key}={column!r}; set "
                    f"data.{key} to the column that holds it (the columns are {self.rows.column_names})."
                )
            self._warn_skipped(
                f"without a value for data.{key}={column!r}",
                [(int(i), str(reasons[i])) for i in lacking],
                total,
                with_reasons=False,
            )
        self._warn_skipped(
            "whose pictures/videos or prompts cannot be used",
            [(int(i), str(reasons[i])) for i in np.flatnonzero((reasons != "") & (missing == ""))],
            total,
        )
        overlong = np.flatnonzero(lengths > limit)
        if self.config.filter_overlong_prompts:
            self.overlong_rows = [int(i) for i in overlong]
            self.num_filtered_overlong = len(overlong)
            if len(overlong):
                logger.warning(
                    "%s: dropped %d of %d prompts longer than data.max_prompt_length=%d tokens (%s).",
                    self.config_key,
                    len(overlong),
                    total,
                    limit,
                    _name_rows(overlong, self.places),
                )
            keep = (lengths >= 0) & (lengths <= limit)
        else:
            cut_inside = np.flatnonzero(shortest_cut > limit)
            refused = [
                (
                    int(i),
                    f"cutting its {int(lengths[i])}-token prompt to data.max_prompt_length={limit} would cut "
                    f"into its pictures/videos (they end at token {int(shortest_cut[i])})",
                )
                for i in cut_inside
            ]
            self._warn_skipped("that truncation would cut through a picture", refused, total)
            self.unusable_rows = sorted(self.unusable_rows + refused)
            truncated = np.setdiff1d(overlong, cut_inside)
            self.num_truncated = len(truncated)
            if self.num_truncated:
                logger.warning(
                    "%s: %d of %d prompts are longer than data.max_prompt_length=%d tokens and are cut to their "
                    "first %d tokens when drawn (data.filter_overlong_prompts=false, as EasyR1 does; %s).",
                    self.config_key,
                    self.num_truncated,
                    total,
                    limit,
                    limit,
                    _name_rows(truncated, self.places),
                )
            keep = (lengths >= 0) & (shortest_cut <= limit)
            if len(truncated) >= 2 and len(truncated) == int(keep.sum()):
                self._refuse_cuts_before_the_rows_own_text(truncated, limit)
        kept = np.flatnonzero(keep)
        if len(kept) == 0:
            first = ""
            if self.unusable_rows:
                first = f": {self.places.name(self.unusable_rows[0][0])}: {self.unusable_rows[0][1]}"
            raise ValueError(
                f"{self.config_key}: no rows left after screening ({self.num_filtered_overlong} longer than "
                f"data.max_prompt_length={limit}, {len(self.unusable_rows)} unusable{first}); {self._no_rows_hint()}."
            )
        self.rows_with_media = int((shortest_cut[kept] > 0).sum())  # the kept rows with pictures / videos
        skipped = np.setdiff1d(np.arange(total), kept)
        self.skipped_sources = self._count_sources(self.rows.select(skipped), skipped)
        if len(kept) < total:
            self.rows = self.rows.select(kept)
            self.row_index = self.row_index[kept]

    def _refuse_cuts_before_the_rows_own_text(self, truncated: np.ndarray, limit: int) -> None:
        """Every prompt is cut (``truncated``: their rows): when two different prompts keep the same first ``limit``
        tokens, the cut falls inside what all prompts share (a long system prompt or instruction) and each row's own
        question is cut off: the model would train on one prompt, repeated."""
        first, second = (int(i) for i in truncated[:2])
        encoded = [self.encoder.encode(self.rows[i], i) for i in (first, second)]
        if any(row["images"] or row["videos"] for row in encoded):
            return  # the pictures, never cut, are the row's own
        ids = [row["model_inputs"]["input_ids"][0].tolist() for row in encoded]
        if ids[0] == ids[1] or ids[0][:limit] != ids[1][:limit]:
            return
        shared = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
        raise ValueError(
            f"{self.config_key}: data.max_prompt_length={limit} cuts every prompt before its own text: "
            f"{self.places.name(first)} and {self.places.name(second)} differ only after token {shared}, and "
            f"data.filter_overlong_prompts=false keeps their first {limit} tokens, the same for both (the system "
            f"prompt, data.format_prompt or the chat template's start). Raise data.max_prompt_length well above "
            f"{shared}."
        )

    def _count_sources(self, rows: datasets.Dataset, indices: np.ndarray) -> Counter:
        """How many of ``rows`` (the rows of the source numbered ``indices``) each data source has, as items name
        it."""
        values = rows[SOURCE_COLUMN] if SOURCE_COLUMN in rows.column_names else [None] * len(rows)
        return Counter(self._source(value, int(index)) for value, index in zip(values, indices))

    def _source(self, value: Any, index: int) -> str:
        """A row's data source: its data_source column, else its file's name (in a folder of data files, the name of
        the file it is in, without a shard's ``-00000-of-00002``: one benchmark per file)."""
        if value:
            return str(value)
        file, _ = self.places.file_and_row(index)
        if file is None:
            return self.source_name
        return re.sub(r"-\d+-of-\d+$", "", os.path.splitext(os.path.basename(file))[0]) or self.source_name

    def kept_sources(self) -> Counter:
        """How many of the dataset's rows each data source has."""
        return self._count_sources(self.rows, self.row_index)

    def place(self, index: int) -> str:
        """Where row ``index`` is: ``data.train_files math.jsonl row 17`` (rows numbered from 0 in each file), or
        ``the environment's prompt 17`` when the environment owns the data (there is no data.train_files then)."""
        if self.env_owned:
            return f"the environment's prompt {index}"
        file, row = self.places.file_and_row(index)
        return f"{self.config_key} {file or os.path.basename(self.data_path.rstrip('/'))} row {row}"

    def skipped_rows(self) -> list[dict[str, Any]]:
        """Every row left out when the dataset was built (see ``skipped_row_records``)."""
        limit = f"longer than data.max_prompt_length={self.config.max_prompt_length} tokens"
        return skipped_row_records(self.config_key, self.places, self.unusable_rows, self.overlong_rows, limit)

    # ------------------------------------------------------------------------------------------------------------------
    # items
    # ------------------------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    def _truncate(
        self, index: int, input_ids: torch.Tensor, position_ids: torch.Tensor, raw_prompt_ids: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The first max_prompt_length tokens (EasyR1's right truncation), never inside a picture / video."""
        limit = self.config.max_prompt_length
        shortest = self.encoder.shortest_cut(input_ids)
        if self.config.filter_overlong_prompts or shortest > limit:
            reason = (
                "raise data.max_prompt_length or set data.filter_overlong_prompts=true"
                if not self.config.filter_overlong_prompts
                else "raise data.max_prompt_length"
            )
            raise UnusableRowError(
                f"{self.config_key}: {self.places.name(index)} has a {len(input_ids)}-token prompt, longer than "
                f"data.max_prompt_length={limit}"
                + (" and its pictures end beyond it" if shortest > limit else "")
                + f"; {reason}."
            )
        # vLLM's prompt holds one pad per picture: it is shorter by what the processor expanded, all of it kept
        expanded_by = len(input_ids) - len(raw_prompt_ids)
        kept_raw = raw_prompt_ids[: limit - expanded_by]
        text_after = limit - shortest  # the tokens after the last picture, identical in both encodings
        if text_after and kept_raw[-text_after:] != input_ids[shortest:limit].tolist():
            raise UnusableRowError(
                f"{self.config_key}: {self.places.name(index)}: the prompt's text tokenizes differently next to its pictures; "
                "it cannot be cut safely. Raise data.max_prompt_length."
            )
        return input_ids[:limit], position_ids[..., :limit], kept_raw

    def __getitem__(self, item: int) -> dict[str, Any]:
        row, index = self.rows[item], int(self.row_index[item])
        try:
            encoded = self.encoder.encode(row, index)
        except (UnreadableMediaError, UnusableRowError) as error:
            raise type(error)(f"{self.config_key}: {self.places.name(index)}: {error}") from error
        model_inputs = encoded["model_inputs"]
        input_ids = model_inputs["input_ids"][0]  # (prompt_len,)
        position_ids = self.position_ids(model_inputs)  # (prompt_len,) or (3, prompt_len)
        raw_prompt_ids = self.tokenizer.encode(encoded["prompt"], add_special_tokens=False)
        length = self.config.max_prompt_length
        if len(input_ids) > length:
            input_ids, position_ids, raw_prompt_ids = self._truncate(index, input_ids, position_ids, raw_prompt_ids)
        out: dict[str, Any] = {
            "input_ids": _left_pad(input_ids, length, self.pad_token_id),
            "attention_mask": _left_pad(torch.ones_like(input_ids), length, 0),
            "position_ids": _left_pad(position_ids, length, 0),
            "raw_prompt_ids": raw_prompt_ids,
            "ground_truth": row_value(row, self.config.answer_key),
            "data_source": self._source(row.get(SOURCE_COLUMN), index),
            ROW_PLACE_KEY: self.place(index),
        }
        if self.has_extra_info:
            out[EXTRA_INFO_KEY] = row.get(EXTRA_INFO_KEY)
        if self.carried_columns:
            out[ROW_COLUMNS_KEY] = {name: row.get(name) for name in self.carried_columns}
        if self.carry_prompt_messages:
            out[PROMPT_MESSAGES_KEY] = text_messages(encoded["messages"])
        if is_chat_messages(row_prompt(row, self.config.prompt_key)):
            out["conversational"] = True  # a reward function written for TRL gets chat-message completions
        if self.has_media:
            # every item of a dataset with media columns has the key (None for a text row): batches of text rows
            # alone then still concatenate with batches of pictures (online filtering) without losing the pictures
            media = {"images": encoded["images"], "videos": encoded["videos"], "video_fps": encoded["video_fps"]}
            out["multi_modal_data"] = {key: value for key, value in media.items() if value} or None
        return out

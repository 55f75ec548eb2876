"""RLHFDataset: rows of prompts (with optional images / videos) -> left-padded model inputs for the rollout.

One item is a dict of
    input_ids       (max_prompt_length,)          left-padded; vision pads expanded the way the processor does
    attention_mask  (max_prompt_length,)
    position_ids    (max_prompt_length,) or (3, max_prompt_length) for Qwen-VL (see rope.py); 0 on padding
    raw_prompt_ids  list[int], unpadded, ONE pad token per image / video (what vLLM expects)
    multi_modal_data {"images": [PIL], "videos": [(frames, 3, H, W) uint8], "video_fps": [float]}  (rows with media
                    only; video_fps: the rate each video was sampled at, which the rollout engine needs too)
    ground_truth, data_source
"""

import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import DataConfig
from .rope import make_position_id_fn
from .sources import load_rows
from .template import ChatTemplate, PromptFormatter, build_messages
from .vision import UnreadableMediaError, load_image, load_video


logger = logging.getLogger(__name__)

# Screening a handful of rows in parallel costs more in process start-up than it saves.
MIN_ROWS_PER_SCREEN_PROCESS = 64


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, np.ndarray) and value.dtype == object:
        return list(value)
    return [value]


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

    def media(self, row: dict) -> tuple[list, list, list[float]]:
        """Loaded images, videos and each video's sampling rate; raises UnreadableMediaError."""
        cfg = self.config
        images = [
            load_image(image, cfg.image_dir, cfg.min_pixels, cfg.max_pixels)
            for image in _as_list(row.get(cfg.image_key))
        ]
        videos, fps = [], []
        for video in _as_list(row.get(cfg.video_key)):
            frames, sample_fps = load_video(video, cfg.image_dir, cfg.video_fps, cfg.min_pixels, cfg.max_pixels)
            videos.append(frames)
            fps.append(sample_fps)
        if (images or videos) and self.processor is None:
            raise ValueError(
                f"{self.config_key}: rows have images/videos but the model has no processor; use a vision-language "
                "model or drop the media columns."
            )
        return images, videos, fps

    def prompt(self, row: dict, index: int, num_images: int, num_videos: int) -> str:
        text = row.get(self.config.prompt_key)
        if text is None:
            raise KeyError(
                f"{self.config_key}: row {index} has no value for data.prompt_key={self.config.prompt_key!r}; "
                f"its keys are {sorted(row)}."
            )
        try:
            messages = build_messages(self.formatter(str(text)), num_images, num_videos)
        except ValueError as error:
            raise ValueError(f"{self.config_key}: row {index}: {error}.") from error
        return self.chat_template(messages)

    def encode(self, row: dict, index: int) -> dict[str, Any]:
        images, videos, fps = self.media(row)
        prompt = self.prompt(row, index, len(images), len(videos))
        if images or videos:
            model_inputs = self.processor(
                text=[prompt],
                images=images or None,
                videos=videos or None,
                add_special_tokens=False,
                return_tensors="pt",
                **_video_kwargs(videos, fps),
            )
        else:
            model_inputs = self.tokenizer([prompt], add_special_tokens=False, return_tensors="pt")
        return {
            "prompt": prompt,
            "model_inputs": dict(model_inputs),
            "images": images,
            "videos": videos,
            "video_fps": fps,
        }

    def measure(self, row: dict, index: int) -> dict[str, Any]:
        """Prompt length in tokens (vision tokens included), or the reason the row's media could not be read."""
        try:
            encoded = self.encode(row, index)
        except UnreadableMediaError as error:
            return {"length": -1, "unreadable": str(error)}
        return {"length": int(encoded["model_inputs"]["input_ids"].shape[-1]), "unreadable": ""}


def _video_kwargs(videos: list, fps: list[float]) -> dict[str, Any]:
    """Tell the processor the rate the frames were sampled at (it sets the temporal rope spacing from it)."""
    if not videos:
        return {}
    from transformers.video_utils import VideoMetadata

    metadata = [
        VideoMetadata(total_num_frames=len(frames), fps=rate, frames_indices=list(range(len(frames))))
        for frames, rate in zip(videos, fps)
    ]
    return {"video_metadata": metadata, "do_sample_frames": False}


def _left_pad(values: torch.Tensor, length: int, pad_value: int) -> torch.Tensor:
    """Pad the last dim of ``values`` on the left to ``length``."""
    pad = length - values.shape[-1]
    return torch.nn.functional.pad(values, (pad, 0), value=pad_value)


class RLHFDataset(Dataset):
    """Prompts of one data file / dataset, screened once (media readable, length within max_prompt_length)."""

    def __init__(
        self,
        data_path: str,
        tokenizer: Any,
        processor: Any,
        config: DataConfig,
        *,
        config_key: str = "data.train_files",
        model_config: Any = None,
    ):
        self.config = config
        self.config_key = config_key
        self.tokenizer = tokenizer
        self.rows = load_rows(data_path, config_key)
        self.source_name = os.path.splitext(os.path.basename(data_path.split("@")[0].rstrip("/")))[0] or data_path
        self._check_columns()
        self.encoder = RowEncoder(
            tokenizer=tokenizer,
            processor=processor,
            config=config,
            formatter=PromptFormatter(config.format_prompt),
            chat_template=ChatTemplate(tokenizer, processor, config.override_chat_template),
            config_key=config_key,
        )
        self.position_ids = make_position_id_fn(processor, model_config)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.row_index = np.arange(len(self.rows))  # dataset position -> row number in the source
        self.num_unreadable = 0
        self.unreadable_rows: list[tuple[int, str]] = []
        self.num_filtered_overlong = 0
        has_media = any(key in self.rows.column_names for key in (config.image_key, config.video_key))
        if config.filter_overlong_prompts or has_media:
            self._screen()

    # ------------------------------------------------------------------------------------------------------------------
    # set-up checks
    # ------------------------------------------------------------------------------------------------------------------
    def _check_columns(self) -> None:
        if len(self.rows) == 0:
            raise ValueError(f"{self.config_key}: the dataset is empty.")
        columns = self.rows.column_names
        for key in ("prompt_key", "answer_key"):
            name = getattr(self.config, key)
            if name not in columns:
                raise KeyError(f"{self.config_key}: no column {name!r} (data.{key}); the columns are {columns}.")

    def _screen(self) -> None:
        """Measure every prompt in parallel; drop rows with unreadable media and (if enabled) overlong prompts."""
        total = len(self.rows)
        workers = min(
            self.config.filter_overlong_prompts_workers, os.cpu_count() or 1, total // MIN_ROWS_PER_SCREEN_PROCESS
        )
        measured = self.rows.map(
            self.encoder.measure,
            with_indices=True,
            remove_columns=self.rows.column_names,
            num_proc=workers if workers > 1 else None,
            keep_in_memory=True,
            load_from_cache_file=False,
            new_fingerprint=f"screen-{uuid.uuid4().hex}",
            desc=f"Measuring prompts of {self.config_key}",
        )
        lengths = np.asarray(measured["length"])
        unreadable = np.asarray(measured["unreadable"], dtype=object)
        bad = np.flatnonzero(unreadable != "")
        self.num_unreadable = len(bad)
        self.unreadable_rows = [(int(i), str(unreadable[i])) for i in bad]
        if len(bad):
            shown = "; ".join(f"row {i}: {message}" for i, message in self.unreadable_rows[:5])
            logger.warning(
                "%s: skipped %d of %d rows with unreadable media (%s).", self.config_key, len(bad), total, shown
            )
        limit = self.config.max_prompt_length
        overlong = np.flatnonzero(lengths > limit)
        if len(overlong) and not self.config.filter_overlong_prompts:
            first = int(overlong[0])
            raise ValueError(self._overlong_message(first, int(lengths[first])))
        self.num_filtered_overlong = len(overlong)
        if len(overlong):
            logger.warning(
                "%s: dropped %d of %d prompts longer than data.max_prompt_length=%d tokens.",
                self.config_key,
                len(overlong),
                total,
                limit,
            )
        keep = np.flatnonzero((lengths >= 0) & (lengths <= limit))
        if len(keep) == 0:
            raise ValueError(
                f"{self.config_key}: no rows left after filtering ({self.num_filtered_overlong} longer than "
                f"data.max_prompt_length={limit}, {self.num_unreadable} with unreadable media); raise "
                "data.max_prompt_length or check the data."
            )
        if len(keep) < total:
            self.rows = self.rows.select(keep)
            self.row_index = self.row_index[keep]

    def _overlong_message(self, row: int, length: int) -> str:
        return (
            f"{self.config_key}: row {row} has a {length}-token prompt, longer than data.max_prompt_length="
            f"{self.config.max_prompt_length}; raise data.max_prompt_length or set data.filter_overlong_prompts=true."
        )

    # ------------------------------------------------------------------------------------------------------------------
    # items
    # ------------------------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict[str, Any]:
        row, index = self.rows[item], int(self.row_index[item])
        try:
            encoded = self.encoder.encode(row, index)
        except UnreadableMediaError as error:
            raise UnreadableMediaError(f"{self.config_key}: row {index}: {error}") from error
        model_inputs = encoded["model_inputs"]
        input_ids = model_inputs["input_ids"][0]  # (prompt_len,)
        if len(input_ids) > self.config.max_prompt_length:
            raise ValueError(self._overlong_message(index, len(input_ids)))
        position_ids = self.position_ids(model_inputs)  # (prompt_len,) or (3, prompt_len)
        length = self.config.max_prompt_length
        out: dict[str, Any] = {
            "input_ids": _left_pad(input_ids, length, self.pad_token_id),
            "attention_mask": _left_pad(torch.ones_like(input_ids), length, 0),
            "position_ids": _left_pad(position_ids, length, 0),
            "raw_prompt_ids": self.tokenizer.encode(encoded["prompt"], add_special_tokens=False),
            "ground_truth": row[self.config.answer_key],
            "data_source": row.get("data_source") or self.source_name,
        }
        if encoded["images"] or encoded["videos"]:
            media = {"images": encoded["images"], "videos": encoded["videos"], "video_fps": encoded["video_fps"]}
            out["multi_modal_data"] = {key: value for key, value in media.items() if value}
        return out

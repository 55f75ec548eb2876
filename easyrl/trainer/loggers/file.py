"""JSON lines on disk: ``metrics.jsonl`` and ``generations.jsonl`` under ``trainer.save_checkpoint_path``.

Files are appended to, so a resumed run continues the same files (readers keep the last row per step).
Every line is flushed at once: a crashed run keeps everything logged before the crash.
"""

import json
import os

from .base import Logger, RunInfo, json_default
from .registry import register_logger


METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = "generations.jsonl"


@register_logger("file")
class FileLogger(Logger):
    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        os.makedirs(run.save_dir, exist_ok=True)
        self.metrics_path = os.path.join(run.save_dir, METRICS_FILE)
        self.generations_path = os.path.join(run.save_dir, GENERATIONS_FILE)
        self._metrics_file = open(self.metrics_path, "a", encoding="utf-8")
        self._generations_file = None  # opened on first use: runs without generations leave no empty file

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._metrics_file.write(json.dumps({"step": step, **metrics}, default=json_default) + "\n")
        self._metrics_file.flush()

    def log_generations(self, samples: list[dict], step: int) -> None:
        if self._generations_file is None:
            self._generations_file = open(self.generations_path, "a", encoding="utf-8")
        for sample in samples:
            line = json.dumps({"step": step, **sample}, default=json_default, ensure_ascii=False)
            self._generations_file.write(line + "\n")
        self._generations_file.flush()

    def finish(self) -> None:
        for handle in (self._metrics_file, self._generations_file):
            if handle is not None:
                handle.close()

"""JSON lines on disk: ``metrics.jsonl`` and ``generations.jsonl`` under ``trainer.save_checkpoint_path``.

Every line is flushed at once: a crashed run keeps everything logged before the crash. A resumed run continues the
same files after ``rewind_to`` made them agree with the checkpoint it resumes from, so ``metrics.jsonl`` holds
exactly one row per step however often the run was interrupted.
"""

import json
import logging
import os

from ...utils.files import replace_file
from .base import Logger, RunInfo, json_default, rewind_note
from .registry import register_logger


logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = "generations.jsonl"


def rewind_jsonl(path: str, last_step: int, restore_row: dict | None = None) -> tuple[int, int, bool]:
    """Keep the rows of ``path`` whose step is at most ``last_step``; returns (rows dropped, unreadable lines dropped,
    whether ``restore_row`` was appended).

    ``restore_row`` (a row of step ``last_step``) is appended when no row of that step is left: the run died between
    saving that step's checkpoint and writing its row. A line that does not parse (a write cut short by the crash) is
    dropped. The file is replaced atomically: a crash during the rewind leaves the old file.
    """
    kept: list[str] = []
    kept_steps: set[int] = set()
    dropped = unreadable = 0
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    continue
                try:
                    step = int(json.loads(line)["step"])
                except (ValueError, KeyError, TypeError):
                    unreadable += 1
                    continue
                if step > last_step:
                    dropped += 1
                    continue
                kept.append(line if line.endswith("\n") else line + "\n")
                kept_steps.add(step)
    restored = restore_row is not None and last_step not in kept_steps
    if restored:
        kept.append(json.dumps({**restore_row, "step": last_step}, default=json_default) + "\n")
    if dropped or unreadable or restored:
        replace_file(path, "".join(kept))
    return dropped, unreadable, restored


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

    def rewind_to(self, step: int, row: dict | None = None) -> None:
        """Drop the rows of steps after ``step`` from both files (they are trained again) and restore ``row``, the
        metrics of ``step`` kept in its checkpoint, when the crash came before it was written. Each drop is said."""
        self.finish()
        for path, restore in ((self.metrics_path, row), (self.generations_path, None)):
            dropped, unreadable, restored = rewind_jsonl(path, step, restore)
            if dropped:
                logger.warning(rewind_note(path, dropped, "row(s)", step))
            if unreadable:
                logger.warning("%s: dropped %d unreadable line(s) (a write cut short by a crash).", path, unreadable)
            if restored:
                logger.warning("%s: restored the row of step %d from its checkpoint.", path, step)
        self._metrics_file = open(self.metrics_path, "a", encoding="utf-8")

    def finish(self) -> None:
        for handle in (self._metrics_file, self._generations_file):
            if handle is not None:
                handle.close()
        self._metrics_file = self._generations_file = None

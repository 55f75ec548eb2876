"""TensorBoard event files under ``$TENSORBOARD_DIR`` or ``<trainer.save_checkpoint_path>/tensorboard``.

A run resumed from a checkpoint rewinds its own event files to the checkpoint's step and goes on writing next to
them, so TensorBoard shows one curve with one value per step.
"""

import glob
import json
import logging
import os
import uuid

from .base import Logger, RunInfo, generation_columns, import_backend, json_default, rewind_note
from .registry import register_logger


logger = logging.getLogger(__name__)

CONFIG_TAG = "config/text_summary"  # what `add_text("config", ...)` writes


def rewind_event_files(log_dir: str, suffix: str, step: int) -> tuple[int, set[str]]:
    """Drop the events of steps after ``step``, and the config text (written again by the resumed run), from the
    event files in ``log_dir`` whose names end with ``suffix`` (this run's; the folder may be shared). A file is
    replaced atomically, or removed when nothing but its header is left. Returns the number of events of steps
    after ``step`` dropped and the tags of ``step`` that are left: a kill while a step's scalars were being written
    leaves some of them (the writer's queue drains to disk every few events), and only the others need restoring."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    dropped, step_tags = 0, set()
    for path in sorted(glob.glob(os.path.join(glob.escape(log_dir), "events.out.tfevents.*" + glob.escape(suffix)))):
        records = list(RawEventFileLoader(path).Load())  # a record cut short by a crash ends the file
        kept, has_summary = [], False
        for raw in records:
            event = Event.FromString(raw)
            is_config = any(value.tag == CONFIG_TAG for value in event.summary.value)
            if event.HasField("file_version") or (event.step <= step and not is_config):
                kept.append(raw)
                has_summary = has_summary or event.HasField("summary")
                if event.step == step:
                    step_tags.update(value.tag for value in event.summary.value)
            elif not is_config:
                dropped += 1
        if not has_summary:
            os.remove(path)
        elif len(kept) < len(records):
            staging = f"{path}.rewind"
            with open(staging, "wb") as handle:
                writer = RecordWriter(handle)
                for raw in kept:
                    writer.write(raw)
                writer.flush()
                os.fsync(handle.fileno())
            os.replace(staging, path)
    return dropped, step_tags


def markdown_table(samples: list[dict]) -> str:
    """Samples as a markdown table (TensorBoard renders text summaries as markdown)."""
    columns = generation_columns(samples)

    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", "<br>")

    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    rows += ["| " + " | ".join(cell(sample.get(column, "")) for column in columns) + " |" for sample in samples]
    return "\n".join(rows)


@register_logger("tensorboard")
class TensorBoardLogger(Logger):
    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        import_backend("tensorboard", "tensorboard", "tensorboard")
        self._summary = import_backend("torch.utils.tensorboard", "tensorboard", "tensorboard")
        self.log_dir = os.environ.get("TENSORBOARD_DIR") or os.path.join(run.save_dir, "tensorboard")
        # The event files of this run (all its attempts) end with its own suffix: a rewind edits those only.
        self.suffix = run.resume.get("suffix") or f".easyrl-{uuid.uuid4().hex[:12]}"
        self._open()

    def _open(self) -> None:
        self.writer = self._summary.SummaryWriter(self.log_dir, filename_suffix=self.suffix)
        config_text = json.dumps(self.run.config, indent=2, default=json_default)
        self.writer.add_text("config", f"```\n{config_text}\n```", global_step=self.run.initial_step)
        self.writer.flush()

    def resume_state(self) -> dict:
        return {"suffix": self.suffix}

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def log_generations(self, samples: list[dict], step: int) -> None:
        self.writer.add_text("generations", markdown_table(samples), global_step=step)
        self.writer.flush()

    def rewind_to(self, step: int, row: dict | None = None) -> None:
        """Drop this run's events of steps after ``step`` (they are trained again) and restore ``row``, the metrics
        of ``step`` kept in its checkpoint, where the crash came before they were all written."""
        self.writer.close()
        dropped, step_tags = rewind_event_files(self.log_dir, self.suffix, step)
        if dropped:
            logger.warning(rewind_note(self.log_dir, dropped, "event(s)", step))
        self._open()
        missing = {name: value for name, value in (row or {}).items() if name not in step_tags}
        if missing:
            logger.warning(
                "%s: restored %d of the %d scalar(s) of step %d from its checkpoint (the run stopped before they were "
                "written).",
                self.log_dir,
                len(missing),
                len(row),
                step,
            )
            self.log(missing, step)

    def finish(self) -> None:
        self.writer.close()

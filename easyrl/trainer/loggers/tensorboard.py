"""TensorBoard event files under ``$TENSORBOARD_DIR`` or ``<trainer.save_checkpoint_path>/tensorboard``."""

import json
import os

from .base import Logger, RunInfo, generation_columns, import_backend, json_default
from .registry import register_logger


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
        summary = import_backend("torch.utils.tensorboard", "tensorboard", "tensorboard")
        self.log_dir = os.environ.get("TENSORBOARD_DIR") or os.path.join(run.save_dir, "tensorboard")
        self.writer = summary.SummaryWriter(self.log_dir)
        config_text = json.dumps(run.config, indent=2, default=json_default)
        self.writer.add_text("config", f"```\n{config_text}\n```", global_step=run.initial_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def log_generations(self, samples: list[dict], step: int) -> None:
        self.writer.add_text("generations", markdown_table(samples), global_step=step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()

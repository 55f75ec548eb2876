"""Weights & Biases. ``WANDB_MODE=offline`` keeps the run on disk (``<save_dir>/wandb``) for a later ``wandb sync``."""

import os

from .base import Logger, RunInfo, explain_start_failure, generation_columns, import_backend
from .registry import register_logger


@register_logger("wandb")
class WandbLogger(Logger):
    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        wandb = import_backend("wandb", "wandb", "wandb")
        self._wandb = wandb
        os.makedirs(run.save_dir, exist_ok=True)
        how_to_fix = "Log in (`wandb login` or WANDB_API_KEY), or set WANDB_MODE=offline to keep the run on disk"
        with explain_start_failure("wandb", how_to_fix):
            self.wandb_run = wandb.init(
                project=run.project_name, name=run.experiment_name, config=run.config, dir=run.save_dir
            )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.wandb_run.log(metrics, step=step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        columns = generation_columns(samples)
        rows = [[sample.get(column) for column in columns] for sample in samples]
        self.wandb_run.log({"generations": self._wandb.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.wandb_run.finish()
        # Stop wandb's background service too: a later run in this process then reads WANDB_* afresh.
        self._wandb.teardown()

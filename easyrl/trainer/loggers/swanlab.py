"""SwanLab. ``SWANLAB_MODE=local`` or ``offline`` keeps the run on disk (``$SWANLAB_LOGDIR`` or ``<save_dir>/swanlog``)."""

import inspect
import os

from .base import Logger, RunInfo, explain_start_failure, import_backend
from .registry import register_logger


@register_logger("swanlab")
class SwanlabLogger(Logger):
    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        swanlab = import_backend("swanlab", "swanlab", "swanlab")
        self._swanlab = swanlab
        log_dir = os.environ.get("SWANLAB_LOGDIR") or os.path.join(run.save_dir, "swanlog")
        os.makedirs(log_dir, exist_ok=True)
        # swanlab >= 0.7 names these `name` / `log_dir`; older releases `experiment_name` / `logdir`.
        params = inspect.signature(swanlab.init).parameters
        name_key = "name" if "name" in params else "experiment_name"
        dir_key = "log_dir" if "log_dir" in params else "logdir"
        how_to_fix = "Log in (`swanlab login` or SWANLAB_API_KEY), or set SWANLAB_MODE=local (or offline)"
        with explain_start_failure("swanlab", how_to_fix):
            self.swanlab_run = swanlab.init(
                project=run.project_name, config=run.config, **{name_key: run.experiment_name, dir_key: log_dir}
            )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._swanlab.log(metrics, step=step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        texts = [
            self._swanlab.Text("\n".join(f"[{key}] {value}" for key, value in sample.items()), caption=f"sample {i}")
            for i, sample in enumerate(samples)
        ]
        self._swanlab.log({"generations": texts}, step=step)

    def finish(self) -> None:
        self._swanlab.finish()

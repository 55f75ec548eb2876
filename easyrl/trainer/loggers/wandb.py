"""Weights & Biases. ``WANDB_MODE=offline`` keeps the run on disk (``<save_dir>/wandb``) for a later ``wandb sync``.

A run resumed from a checkpoint continues the W&B run of the attempt it resumes (its id, ``resume="allow"``) unless
``WANDB_RUN_ID`` names one.
"""

import os
from urllib.parse import urlparse

from .base import Logger, RunInfo, explain_start_failure, generation_columns, import_backend, netrc_has
from .registry import register_logger


HOW_TO_FIX = "Log in (`wandb login` or WANDB_API_KEY), or set WANDB_MODE=offline to keep the run on disk"


@register_logger("wandb")
class WandbLogger(Logger):
    append_only = True

    @classmethod
    def start_problem(cls) -> str | None:
        # what `wandb.init` reads, in its order: an offline/disabled mode, the API key, then the netrc login
        env = os.environ
        if env.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or env.get("WANDB_API_KEY"):
            return None
        if env.get("WANDB_DISABLED", "").lower() in ("1", "true"):
            return None
        host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
        if netrc_has(env.get("NETRC") or os.path.expanduser("~/.netrc"), host):
            return None
        return f"W&B has no login on this machine (no WANDB_API_KEY, no {host} entry in ~/.netrc). {HOW_TO_FIX}."

    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        wandb = import_backend("wandb", "wandb", "wandb")
        self._wandb = wandb
        os.makedirs(run.save_dir, exist_ok=True)
        continued = {}
        if run.resume.get("id") and not os.environ.get("WANDB_RUN_ID"):
            continued = {"id": run.resume["id"], "resume": "allow"}
        try:
            with explain_start_failure("wandb", HOW_TO_FIX):
                self.wandb_run = wandb.init(
                    project=run.project_name,
                    name=run.experiment_name,
                    config=run.config,
                    dir=run.save_dir,
                    **continued,
                )
        except BaseException:
            # a failed start leaves wandb's process-wide setup (its mode, its login) behind for the next run in
            # this process: drop it, as finish() does
            wandb.teardown()
            raise

    def resume_state(self) -> dict:
        return {"id": self.wandb_run.id}

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

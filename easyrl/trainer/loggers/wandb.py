"""Weights & Biases. ``WANDB_MODE=offline`` keeps the run on disk (``<save_dir>/wandb``) for a later ``wandb sync``.

A run resumed from a checkpoint continues the W&B run of the attempt it resumes (its id, ``resume="allow"``) unless
``WANDB_RUN_ID`` names one.

W&B's service process closes a step's row when the next step's first call comes (or at finish), writes it to the
run's transaction log (``run-<id>.wandb``) every ~15 s, and loses the rest when a SIGKILL of this process takes it
down: a step counts as held once it is in that file, and a continued online run holds what the W&B server holds.
"""

import glob
import os
from urllib.parse import urlparse

from .base import Logger, RunInfo, explain_start_failure, generation_columns, import_backend, netrc_has
from .record_log import RecordFile, read_records
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
                    dir=os.environ.get("WANDB_DIR") or run.save_dir,  # the user's own WANDB_DIR wins
                    **continued,
                )
        except BaseException:
            # a failed start leaves wandb's process-wide setup (its mode, its login) behind for the next run in
            # this process: drop it, as finish() does
            wandb.teardown()
            raise
        self._records = import_backend("wandb.proto.wandb_internal_pb2", "wandb", "wandb")
        settings = self.wandb_run.settings
        self._log = None  # the run's transaction log; none when disabled (nothing is kept) or skipped (online)
        if settings.mode != "disabled" and not settings.x_skip_transaction_log:
            self._log = RecordFile(settings.sync_file)
        self._held = self._held_before(settings)

    def _held_before(self, settings) -> int:
        """The highest step the earlier attempts at this run hold: online, what the W&B server holds (it refuses
        lower steps); offline, what their transaction logs (each attempt's own folder under ``wandb/``) hold."""
        if settings.mode not in ("offline", "dryrun"):
            return self.wandb_run.starting_step - 1
        run_id = self.wandb_run.id
        logs = glob.glob(os.path.join(settings.wandb_dir, f"*-{run_id}*", f"run-{run_id}.wandb"))
        own = os.path.abspath(settings.sync_file)
        steps = [
            self._history_step(raw) for path in logs if os.path.abspath(path) != own for raw in read_records(path)
        ]
        return max(steps, default=-1)

    def _history_step(self, raw: bytes) -> int:
        record = self._records.Record()
        record.ParseFromString(raw)
        return record.history.step.num if record.WhichOneof("record_type") == "history" else -1

    def resume_state(self) -> dict:
        return {"id": self.wandb_run.id}

    def held_through(self) -> int | None:
        if self._log is None:
            return None
        self._held = max([self._held, *(self._history_step(raw) for raw in self._log.new_records())])
        return self._held

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

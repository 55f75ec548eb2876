"""SwanLab. ``SWANLAB_MODE=offline`` or ``local`` keeps the run on disk (``$SWANLAB_LOGDIR`` or ``<save_dir>/swanlog``;
``local`` also starts SwanLab's viewer, which needs the separate ``swanboard`` package).

A run resumed from a checkpoint continues the SwanLab run of the attempt it resumes (its id, ``resume="allow"``).

SwanLab writes what it is logged to the run's store (``run-<id>.swanlab`` in the run's folder) from a background
thread, through a file buffer, and loses the rest when a SIGKILL of this process ends it: a step counts as held once
it is in that file whole.
"""

import glob
import importlib
import importlib.util
import inspect
import logging
import os

from .base import Logger, RunInfo, explain_start_failure, import_backend, netrc_has
from .record_log import RecordFile
from .registry import register_logger


logger = logging.getLogger(__name__)


HOW_TO_FIX = (
    "Log in (`swanlab login` or SWANLAB_API_KEY), or set SWANLAB_MODE=offline (or local, whose viewer needs the "
    "swanboard package)"
)
SYSTEM_KEY_PREFIX = "__swanlab__."  # SwanLab's own hardware metrics, on a step count of their own


class StoredSteps:
    """How far the steps in one SwanLab store go. SwanLab writes a record per metric, the records of a step in a row:
    a step is whole in the file once a record of a later step, or the run's finish record, follows it."""

    def __init__(self, path: str, record_type) -> None:
        self._file = RecordFile(path)
        self._record_type = record_type
        self._last = -1  # the newest step with a record in the file
        self.whole_through = -1

    def read(self) -> int:
        """Reads what was written since the last call; returns ``whole_through``."""
        for raw in self._file.new_records():
            record = self._record_type()
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "finish":
                self.whole_through = self._last
            elif kind in ("scalar", "media") and not getattr(record, kind).key.startswith(SYSTEM_KEY_PREFIX):
                step = getattr(record, kind).step
                if step > self._last:
                    self.whole_through, self._last = self._last, step
        return self.whole_through


@register_logger("swanlab")
class SwanlabLogger(Logger):
    append_only = True

    @classmethod
    def start_problem(cls) -> str | None:
        # what `swanlab.init` reads: a local/offline/disabled mode, the API key, then `swanlab login`'s netrc in
        # ./.swanlab or the user folder ($SWANLAB_ROOT, $SWANLAB_SAVE_DIR or ~/.swanlab)
        env = os.environ
        if env.get("SWANLAB_MODE", "").lower() in ("local", "offline", "disabled") or env.get("SWANLAB_API_KEY"):
            return None
        user_dir = env.get("SWANLAB_ROOT") or env.get("SWANLAB_SAVE_DIR") or os.path.expanduser("~/.swanlab")
        if any(netrc_has(os.path.join(folder, ".netrc")) for folder in (".swanlab", user_dir)):
            return None
        return f"SwanLab has no login on this machine (no SWANLAB_API_KEY, no saved login). {HOW_TO_FIX}."

    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        swanlab = import_backend("swanlab", "swanlab", "swanlab")
        self._swanlab = swanlab
        log_dir = os.environ.get("SWANLAB_LOGDIR") or os.path.join(run.save_dir, "swanlog")
        os.makedirs(log_dir, exist_ok=True)
        if os.environ.get("SWANLAB_MODE", "").lower() == "local" and importlib.util.find_spec("swanboard") is None:
            logger.warning(
                "SWANLAB_MODE=local: SwanLab's viewer needs the swanboard package, which is not installed, so SwanLab "
                "reports an error starting it; the metrics are written to %s all the same. Install swanboard for the "
                "viewer, or set SWANLAB_MODE=offline to keep the run on disk without one.",
                log_dir,
            )
        # swanlab >= 0.7 names these `name` / `log_dir`; older releases `experiment_name` / `logdir`.
        params = inspect.signature(swanlab.init).parameters
        name_key = "name" if "name" in params else "experiment_name"
        dir_key = "log_dir" if "log_dir" in params else "logdir"
        continued = {}
        if run.resume.get("id") and "resume" in params:
            continued = {"id": run.resume["id"], "resume": "allow"}
        with explain_start_failure("swanlab", HOW_TO_FIX):
            self.swanlab_run = swanlab.init(
                project=run.project_name,
                config=run.config,
                **{name_key: run.experiment_name, dir_key: log_dir},
                **continued,
            )
        self._store = None  # None: this swanlab's store is unknown (older releases) or skipped
        self._held_before = -1  # what the stores of the earlier attempts at this run hold whole
        run_id, run_dir = getattr(self.swanlab_run, "id", None), getattr(self.swanlab_run, "dir", None)
        store = os.path.join(str(run_dir), f"run-{run_id}.swanlab")
        if run_id and run_dir and os.path.isfile(store):
            try:
                record_type = importlib.import_module("swanlab.proto.swanlab.record.v1.record_pb2").Record
            except ImportError:
                return
            self._store = StoredSteps(store, record_type)
            for path in glob.glob(
                os.path.join(os.path.dirname(str(run_dir)), f"*-{run_id}*", f"run-{run_id}.swanlab")
            ):
                if os.path.abspath(path) != os.path.abspath(store):
                    self._held_before = max(self._held_before, StoredSteps(path, record_type).read())

    def resume_state(self) -> dict:
        run_id = getattr(self.swanlab_run, "id", None)
        return {"id": run_id} if run_id else {}

    def held_through(self) -> int | None:
        return None if self._store is None else max(self._held_before, self._store.read())

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

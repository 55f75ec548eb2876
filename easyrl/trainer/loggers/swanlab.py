"""SwanLab. ``SWANLAB_MODE=offline`` or ``local`` keeps the run on disk (``$SWANLAB_LOGDIR`` or ``<save_dir>/swanlog``;
``local`` also starts SwanLab's viewer, which needs the separate ``swanboard`` package).

A run resumed from a checkpoint continues the SwanLab run of the attempt it resumes (its id, ``resume="allow"``).
"""

import inspect
import os

from .base import Logger, RunInfo, explain_start_failure, import_backend, netrc_has
from .registry import register_logger


HOW_TO_FIX = (
    "Log in (`swanlab login` or SWANLAB_API_KEY), or set SWANLAB_MODE=offline (or local, whose viewer needs the "
    "swanboard package)"
)


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

    def resume_state(self) -> dict:
        run_id = getattr(self.swanlab_run, "id", None)
        return {"id": run_id} if run_id else {}

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

"""The one object the training loop logs through: fans metrics and generations out to the chosen backends."""

import dataclasses
import json
import logging
import os

from ...utils.files import replace_file
from .base import Logger, RunInfo, to_scalar
from .registry import get_logger_class


logger = logging.getLogger(__name__)

TRACKER_STATE_FILE = "tracker_state.json"
"""Under ``trainer.save_checkpoint_path``: each backend's ``resume_state`` (W&B, SwanLab and MLflow run ids,
TensorBoard's event files) and the last step logged, so that a run resumed from a checkpoint continues the same
tracker runs instead of opening new ones."""


class Tracker:
    """Builds one backend per name in ``trainer.logger`` and forwards every call to each of them.

    Only the driver process holds a Tracker. Metric values may be floats, numpy scalars or one-element
    tensors; they reach the backends as Python floats.

    ``resume``: the run continues from a checkpoint, so each backend reopens the run the earlier attempt started
    (what it kept in ``tracker_state.json``). A run that starts afresh opens new runs. After ``rewind_to`` the steps
    an append-only backend (W&B, SwanLab, MLflow) already holds are not sent to it again: it keeps the values it
    got first (a resume is deterministic, so they are those the retrained steps reproduce), while the file and
    TensorBoard backends drop the rows after the checkpoint and take the retrained ones.
    """

    def __init__(
        self,
        loggers: list[str] | tuple[str, ...] | str,
        project_name: str,
        experiment_name: str,
        config_dict: dict | None = None,
        save_dir: str = ".",
        total_steps: int | None = None,
        initial_step: int = 0,
        resume: bool = False,
    ) -> None:
        names = [loggers] if isinstance(loggers, str) else list(loggers)
        if len(set(names)) != len(names):
            raise ValueError(f"trainer.logger lists a logger twice: {names}")
        classes = [get_logger_class(name) for name in names]  # unknown names fail before any backend starts
        run = RunInfo(project_name, experiment_name, config_dict or {}, save_dir, total_steps, initial_step)
        self._state_path = os.path.join(save_dir, TRACKER_STATE_FILE)
        state = self._read_state() if resume else {}
        saved = state.get("backends", {})
        self._logged_through = int(state.get("logged_through", -1))  # the highest step any attempt logged
        self._skip_through = -1  # append-only backends are not sent steps up to this one again
        self.backends: dict[str, Logger] = {}
        try:
            for name, cls in zip(names, classes):
                self.backends[name] = cls(dataclasses.replace(run, resume=dict(saved.get(name) or {})))
        except BaseException:
            self.finish()  # close the backends already started (open runs, files) before re-raising
            raise
        self._keeps_state = any(backend.resume_state() for backend in self.backends.values())
        self._write_state()

    def _read_state(self) -> dict:
        if not os.path.isfile(self._state_path):
            return {}
        try:
            with open(self._state_path, encoding="utf-8") as file:
                state = json.load(file)
            if not isinstance(state, dict):
                raise ValueError("not a JSON object")
            return state
        except (OSError, ValueError) as error:
            logger.warning("%s is unreadable (%s): the trackers start new runs.", self._state_path, error)
            return {}

    def _write_state(self) -> None:
        if not self._keeps_state:
            return
        state = {
            "backends": {name: backend.resume_state() for name, backend in self.backends.items()},
            "logged_through": self._logged_through,
        }
        os.makedirs(os.path.dirname(self._state_path) or ".", exist_ok=True)
        replace_file(self._state_path, json.dumps(state, indent=1))

    def _receivers(self, step: int) -> list[Logger]:
        return [b for b in self.backends.values() if not (b.append_only and step <= self._skip_through)]

    def _logged(self, step: int) -> None:
        if step > self._logged_through:
            self._logged_through = step
            self._write_state()

    def log(self, metrics: dict, step: int) -> None:
        scalars = {name: to_scalar(name, value) for name, value in metrics.items()}
        for backend in self._receivers(step):
            backend.log(scalars, step)
        self._logged(step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        if not samples:
            return
        for backend in self._receivers(step):
            backend.log_generations(samples, step)
        self._logged(step)

    def rewind_to(self, step: int, row: dict | None = None) -> None:
        """The run resumes after ``step`` (-1: afresh); ``row`` is that step's metrics as its checkpoint kept them."""
        scalars = None if row is None else {name: to_scalar(name, value) for name, value in row.items()}
        for backend in self.backends.values():
            backend.rewind_to(step, scalars)
        append_only = [name for name, backend in self.backends.items() if backend.append_only]
        if not append_only:
            return
        if scalars and self._logged_through < step:
            # the checkpoint was saved and the process died before its row was logged
            for name in append_only:
                self.backends[name].log(scalars, step)
            self._logged(step)
        self._skip_through = self._logged_through
        if self._skip_through > step:
            logger.warning(
                "Steps %d-%d reached %s before the resume: the run trains them again and their new metrics go to the "
                "other loggers only (these cannot drop what they hold; a deterministic resume gives the same values).",
                step + 1,
                self._skip_through,
                ", ".join(append_only),
            )

    def finish(self) -> None:
        for backend in self.backends.values():
            backend.finish()
        self.backends = {}

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc_info) -> None:
        self.finish()

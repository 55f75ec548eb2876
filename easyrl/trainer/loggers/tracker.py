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
TensorBoard's event files) and the highest step each append-only backend holds, so that a run resumed from a
checkpoint continues the same tracker runs instead of opening new ones."""


class Tracker:
    """Builds one backend per name in ``trainer.logger`` and forwards every call to each of them.

    Only the driver process holds a Tracker. Metric values may be floats, numpy scalars or one-element
    tensors; they reach the backends as Python floats.

    ``resume``: the run continues from a checkpoint, so each backend reopens the run the earlier attempt started
    (what it kept in ``tracker_state.json``). A run that starts afresh opens new runs. After ``rewind_to`` the steps
    an append-only backend (W&B, SwanLab, MLflow) already holds are not sent to it again: it keeps the values it
    got first (on a deterministic resume the retrained steps reproduce them), while the file and TensorBoard
    backends drop the rows after the checkpoint and take the retrained ones. A backend that opens a new run (added
    to ``trainer.logger`` on resume, or its run not found) is sent every step.
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
        saved, held = state.get("backends") or {}, state.get("held_through") or {}
        self.backends: dict[str, Logger] = {}
        # per append-only backend: the highest step its run holds (from the attempts before, when it continues
        # their run), and after a rewind the steps it is not sent again
        self._held: dict[str, int] = {}
        self._skip_through: dict[str, int] = {}
        try:
            for name, cls in zip(names, classes):
                continued = dict(saved.get(name) or {})
                self.backends[name] = cls(dataclasses.replace(run, resume=continued))
                if cls.append_only:
                    # a backend that could not reopen its run (WANDB_RUN_ID, another store) starts anew
                    reopened = continued and self.backends[name].resume_state() == continued
                    self._held[name] = int(held.get(name, -1)) if reopened else -1
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
            "held_through": self._held,
        }
        os.makedirs(os.path.dirname(self._state_path) or ".", exist_ok=True)
        replace_file(self._state_path, json.dumps(state, indent=1))

    def _send(self, step: int, call) -> None:
        """``call(backend)`` for every backend but the append-only ones that already hold ``step``."""
        grown = False
        for name, backend in self.backends.items():
            if name in self._held:
                if step <= self._skip_through.get(name, -1):
                    continue
                grown = grown or step > self._held[name]
                self._held[name] = max(self._held[name], step)
            call(backend)
        if grown:
            self._write_state()

    def log(self, metrics: dict, step: int) -> None:
        scalars = {name: to_scalar(name, value) for name, value in metrics.items()}
        self._send(step, lambda backend: backend.log(scalars, step))

    def log_generations(self, samples: list[dict], step: int) -> None:
        if not samples:
            return
        self._send(step, lambda backend: backend.log_generations(samples, step))

    def rewind_to(self, step: int, row: dict | None = None) -> None:
        """The run resumes after ``step`` (-1: afresh); ``row`` is that step's metrics as its checkpoint kept them."""
        scalars = None if row is None else {name: to_scalar(name, value) for name, value in row.items()}
        for name, backend in self.backends.items():
            if name not in self._held:
                backend.rewind_to(step, scalars)  # a backend that can drop what it holds after the checkpoint
                continue
            if scalars and self._held[name] < step:
                # the checkpoint was saved and the process died before its row was logged
                backend.log(scalars, step)
                self._held[name] = step
                self._write_state()
            self._skip_through[name] = self._held[name]
            if self._held[name] > step:
                logger.warning(
                    "Steps %d-%d reached %s before the resume: the run trains them again and their new metrics go "
                    "to the other loggers only (%s cannot drop what it holds; a deterministic resume gives the same "
                    "values).",
                    step + 1,
                    self._held[name],
                    name,
                    name,
                )

    def finish(self) -> None:
        for backend in self.backends.values():
            backend.finish()
        self.backends = {}

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc_info) -> None:
        self.finish()

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
TensorBoard's event files), the highest step each append-only backend holds for good, and the rows it was sent that
it does not hold yet, so that a run resumed from a checkpoint continues the same tracker runs instead of opening new
ones, and sends them again the rows a kill took from them."""


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

    A step counts as held by a backend once it is in the backend's own store (``Logger.held_through``): W&B and
    SwanLab write what they are logged seconds later, from a process or thread that a SIGKILL of the driver takes
    down with what it still holds. Until then the Tracker keeps the step's row in ``tracker_state.json``, and a
    resume sends the rows up to the checkpoint that the kill lost again.
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
        val_only: bool = False,
    ) -> None:
        """``val_only`` (`trainer.val_only`): a look at a checkpoint, not an attempt at the run. The trackers open new
        runs, nothing the run logged is rewound (rows after the checkpoint are not trained again) and
        tracker_state.json is left as the training attempts wrote it, so that a later resume continues their runs;
        the validation's row is appended (metrics.jsonl then holds the step twice: its training row, then this)."""
        names = [loggers] if isinstance(loggers, str) else list(loggers)
        if len(set(names)) != len(names):
            raise ValueError(f"trainer.logger lists a logger twice: {names}")
        classes = [get_logger_class(name) for name in names]  # unknown names fail before any backend starts
        self._state_path = os.path.join(save_dir, TRACKER_STATE_FILE)
        self._val_only = val_only
        state = self._read_state() if resume and not val_only else {}
        saved, stored = state.get("backends") or {}, state.get("held_through") or {}
        named = state.get("names") or {}
        first = (named.get("project", project_name), named.get("experiment", experiment_name))
        if saved and first != (project_name, experiment_name):
            # W&B and SwanLab would reopen the run's id under the new names and MLflow open a new run: the history
            # would split between them; the run keeps the names its tracker runs were opened with
            logger.warning(
                "trainer.project_name / experiment_name are %s / %s, but the tracker runs this resume continues were "
                "opened as %s / %s: they keep those names. Start a new run folder (trainer.save_checkpoint_path) for "
                "runs under the new names.",
                project_name,
                experiment_name,
                *first,
            )
            project_name, experiment_name = first
        self._names = {"project": project_name, "experiment": experiment_name}
        run = RunInfo(project_name, experiment_name, config_dict or {}, save_dir, total_steps, initial_step)
        self.backends: dict[str, Logger] = {}
        # per append-only backend: the highest step its store holds (what a kill of this process leaves it; from the
        # attempts before too, when it continues their run), the highest step it holds or is given in this process,
        # and after a rewind the steps it is not sent again
        self._stored: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._skip_through: dict[str, int] = {}
        self._reopened: set[str] = set()
        # the rows (by step) that some append-only backend was sent and does not store yet
        self._unstored: dict[int, dict[str, float]] = state.get("unstored") or {}
        self._keeps_state = False
        try:
            for name, cls in zip(names, classes):
                continued = dict(saved.get(name) or {})
                backend = self.backends[name] = cls(dataclasses.replace(run, resume=continued))
                if cls.append_only:
                    self._stored[name] = -1
                    # a backend that could not reopen its run (WANDB_RUN_ID, another store) starts anew
                    if continued and backend.resume_state() == continued:
                        self._reopened.add(name)
                        found = backend.held_through()  # what its store holds; None: what the state file says
                        self._stored[name] = int(stored.get(name, -1)) if found is None else found
                    self._held[name] = self._stored[name]
        except BaseException:
            self.finish()  # close the backends already started (open runs, files) before re-raising
            raise
        self._keeps_state = not val_only and any(backend.resume_state() for backend in self.backends.values())
        self._write_state()

    def _read_state(self) -> dict:
        if not os.path.isfile(self._state_path):
            return {}
        try:
            with open(self._state_path, encoding="utf-8") as file:
                state = json.load(file)
            if not isinstance(state, dict):
                raise ValueError("not a JSON object")
            unstored = state.get("unstored") or {}
            state["unstored"] = {
                int(step): {str(k): float(v) for k, v in row.items()} for step, row in unstored.items()
            }
            return state
        except (OSError, ValueError, TypeError, AttributeError) as error:
            logger.warning("%s is unreadable (%s): the trackers start new runs.", self._state_path, error)
            return {}

    def _write_state(self) -> None:
        if not self._keeps_state:
            return
        state = {
            "backends": {name: backend.resume_state() for name, backend in self.backends.items()},
            "held_through": self._stored,
            "names": self._names,
        }
        if self._unstored:
            state["unstored"] = {str(step): row for step, row in sorted(self._unstored.items())}
        os.makedirs(os.path.dirname(self._state_path) or ".", exist_ok=True)
        replace_file(self._state_path, json.dumps(state, indent=1))

    def _send(self, step: int, call, row: dict[str, float] | None = None) -> None:
        """``call(backend)`` for every backend but the append-only ones that already hold ``step``; ``row`` (the
        step's metrics) is kept until every append-only backend stores it."""
        for name, backend in self.backends.items():
            if name in self._held and step <= self._skip_through.get(name, -1):
                continue
            call(backend)
            if name in self._held:
                self._held[name] = max(self._held[name], step)
        changed = self._read_stored()
        if row is not None and any(stored < step for stored in self._stored.values()):
            self._unstored[step] = {**self._unstored.get(step, {}), **row}
            changed = True
        if changed:
            self._write_state()

    def _read_stored(self) -> bool:
        """Moves each append-only backend's stored mark to what its store holds now and drops the rows that every
        one of them stores; True when that changed anything."""
        changed = False
        for name, stored in self._stored.items():
            found = self.backends[name].held_through()
            self._stored[name] = self._held[name] if found is None else max(stored, found)
            changed = changed or self._stored[name] != stored
        lowest = min(self._stored.values(), default=None)
        if lowest is not None and any(step <= lowest for step in self._unstored):
            self._unstored = {step: row for step, row in self._unstored.items() if step > lowest}
            changed = True
        return changed

    def log(self, metrics: dict, step: int) -> None:
        scalars = {name: to_scalar(name, value) for name, value in metrics.items()}
        self._send(step, lambda backend: backend.log(scalars, step), scalars)

    def log_generations(self, samples: list[dict], step: int) -> None:
        if not samples:
            return
        self._send(step, lambda backend: backend.log_generations(samples, step))

    def rewind_to(self, step: int, row: dict | None = None) -> None:
        """The run resumes after ``step`` (-1: afresh); ``row`` is that step's metrics as its checkpoint kept them.
        Nothing is rewound for a val_only look at a checkpoint: no step after it is trained again."""
        if self._val_only:
            return
        scalars = None if row is None else {name: to_scalar(name, value) for name, value in row.items()}
        # the rows up to the checkpoint that a backend may lack: those a kill took from it, and the checkpoint's own
        # (the process died after the save, before the row was logged)
        rows = {at: kept for at, kept in self._unstored.items() if at <= step}
        if scalars and step >= 0:
            rows.setdefault(step, scalars)
        # the rows after the checkpoint are trained again, but those a backend was sent in this process (a restart
        # of the workers) it keeps
        self._unstored = {at: kept for at, kept in self._unstored.items() if at <= max(step, *self._held.values())}
        for name, backend in self.backends.items():
            if name not in self._held:
                backend.rewind_to(step, scalars)  # a backend that can drop what it holds after the checkpoint
                continue
            # a backend that opened a new run gets the checkpoint's row only
            lost = [at for at in sorted(rows) if self._held[name] < at and (name in self._reopened or at == step)]
            for at in lost:
                backend.log(rows[at], at)
                self._unstored.setdefault(at, rows[at])
                self._held[name] = at
            if len(lost) > 1 or (lost and lost[0] < step):
                logger.warning(
                    "%s never reached %s before the resume (it writes what it is sent seconds later, and the "
                    "kill came first): their rows, kept in %s, are sent to it again.",
                    _steps_named(lost),
                    name,
                    TRACKER_STATE_FILE,
                )
            self._skip_through[name] = self._held[name]
            if self._held[name] > step:
                logger.warning(
                    "%s reached %s before the resume: the run trains them again and their new metrics go "
                    "to the other loggers only (%s cannot drop what it holds: it keeps the first attempt's values, "
                    "which the retrained steps repeat only when the resume is bitwise deterministic with an unchanged "
                    "config; metrics.jsonl holds the retrained ones).",
                    _steps_named(list(range(step + 1, self._held[name] + 1))),
                    name,
                    name,
                )
        self._read_stored()
        self._write_state()

    def finish(self) -> None:
        for backend in self.backends.values():
            backend.finish()
        if self.backends and self._read_stored():  # a backend closed holds all it was sent
            self._write_state()
        self.backends = {}

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc_info) -> None:
        self.finish()


def _steps_named(steps: list[int]) -> str:
    """``[3]`` -> ``"Step 3"``, ``[3, 4, 5, 7]`` -> ``"Steps 3-5, 7"``."""
    return f"Step{'s' if len(steps) > 1 else ''} {_step_list(steps)}"


def _step_list(steps: list[int]) -> str:
    """``[3, 4, 5, 7]`` -> ``"3-5, 7"``."""
    spans: list[list[int]] = []
    for step in steps:
        if spans and step == spans[-1][1] + 1:
            spans[-1][1] = step
        else:
            spans.append([step, step])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in spans)

"""The one object the training loop logs through: fans metrics and generations out to the chosen backends."""

from .base import Logger, RunInfo, to_scalar
from .registry import get_logger_class


class Tracker:
    """Builds one backend per name in ``trainer.logger`` and forwards every call to each of them.

    Only the driver process holds a Tracker. Metric values may be floats, numpy scalars or one-element
    tensors; they reach the backends as Python floats.
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
    ) -> None:
        names = [loggers] if isinstance(loggers, str) else list(loggers)
        if len(set(names)) != len(names):
            raise ValueError(f"trainer.logger lists a logger twice: {names}")
        classes = [get_logger_class(name) for name in names]  # unknown names fail before any backend starts
        run = RunInfo(project_name, experiment_name, config_dict or {}, save_dir, total_steps, initial_step)
        self.backends: dict[str, Logger] = {}
        try:
            for name, cls in zip(names, classes):
                self.backends[name] = cls(run)
        except BaseException:
            self.finish()  # close the backends already started (open runs, files) before re-raising
            raise

    def log(self, metrics: dict, step: int) -> None:
        scalars = {name: to_scalar(name, value) for name, value in metrics.items()}
        for backend in self.backends.values():
            backend.log(scalars, step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        if not samples:
            return
        for backend in self.backends.values():
            backend.log_generations(samples, step)

    def rewind_to(self, step: int, row: dict | None = None) -> None:
        """The run resumes after ``step`` (-1: afresh); ``row`` is that step's metrics as its checkpoint kept them."""
        scalars = None if row is None else {name: to_scalar(name, value) for name, value in row.items()}
        for backend in self.backends.values():
            backend.rewind_to(step, scalars)

    def finish(self) -> None:
        for backend in self.backends.values():
            backend.finish()
        self.backends = {}

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc_info) -> None:
        self.finish()

"""What every logger backend receives and implements."""

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar


class MissingLoggerPackage(ImportError):
    """A logger named in ``trainer.logger`` needs a package that is not installed."""


class LoggerStartError(RuntimeError):
    """A logger named in ``trainer.logger`` could not start its run (no login, unreachable server...)."""


@dataclass
class RunInfo:
    """The run a tracker reports on; every backend is built from this."""

    project_name: str
    experiment_name: str
    config: dict = field(default_factory=dict)
    save_dir: str = "."
    """Folder for local outputs (jsonl files, tensorboard events, offline runs): ``trainer.save_checkpoint_path``."""
    total_steps: int | None = None
    initial_step: int = 0
    """Step the run starts from (non-zero when resuming), so progress and rates start there."""
    resume: dict = field(default_factory=dict)
    """What this backend's ``resume_state`` returned in the attempt this one continues (the run resumes from a
    checkpoint); empty when the run starts afresh."""


class Logger:
    """One backend. ``log`` gets plain ``{name: float}`` metrics; ``log_generations`` gets sample dicts."""

    append_only: ClassVar[bool] = False
    """The backend's history cannot be rewound (a remote service): after a resume the Tracker does not send it again
    the steps it already holds, and sends it the rows it never got of the steps up to the checkpoint."""

    def __init__(self, run: RunInfo) -> None:
        self.run = run

    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def log_generations(self, samples: list[dict], step: int) -> None:
        """Sample generations (e.g. ``{"input", "output", "ground_truth", "score"}``); ignored unless overridden."""

    def rewind_to(self, step: int, row: dict | None = None) -> None:
        """The run resumes after ``step`` (a checkpoint; -1 when it starts afresh): backends that keep their own
        history forget what they hold after it, and restore ``row`` (that step's metrics) when it never arrived."""

    def resume_state(self) -> dict:
        """What a later attempt of this run needs to continue this backend's run (its run id, its files), as JSON;
        the Tracker keeps it next to the checkpoints and hands it back as ``RunInfo.resume``."""
        return {}

    def held_through(self) -> int | None:
        """For an append-only backend that writes what it is logged later, in a process or thread of its own that a
        SIGKILL of this process takes down: the highest step its run holds for good, read back from the backend's own
        files (the steps of the earlier attempts at the run included, -1 for none). None: ``log`` has stored a step
        when it returns (MLflow), so the Tracker counts it as held then."""
        return None

    def finish(self) -> None:
        """Flush and close; called once at the end of the run."""

    @classmethod
    def start_problem(cls) -> str | None:
        """Why this backend cannot start a run on this machine, when that is known without starting one (no
        credentials for a remote service); None when it may start. Read by ``easyrl check``, so it must not import
        the backend's library."""
        return None


def netrc_has(path: str, host: str | None = None) -> bool:
    """Whether the netrc file at ``path`` holds a login (for ``host`` when given)."""
    import netrc

    try:
        entries = netrc.netrc(path).hosts
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entries) if host is None else host in entries


def import_backend(module: str, logger_name: str, package: str) -> ModuleType:
    """Import a backend's library when the logger is built, with an error that says how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingLoggerPackage(
            f"trainer.logger includes '{logger_name}', which needs the `{package}` package (import of `{module}` "
            f"failed: {error}). Install it with `pip install 'easyrl[loggers]'` (or `pip install {package}`), "
            f"or remove '{logger_name}' from trainer.logger."
        ) from error


@contextmanager
def explain_start_failure(logger_name: str, how_to_fix: str) -> Iterator[None]:
    """Turn a backend's failure to start a run into an error that says how to fix it."""
    try:
        yield
    except Exception as error:
        raise LoggerStartError(
            f"trainer.logger '{logger_name}' could not start a run: {error}. {how_to_fix}, "
            f"or remove '{logger_name}' from trainer.logger."
        ) from error


def rewind_note(where: str, dropped: int, what: str, step: int) -> str:
    """What a backend says when it drops ``dropped`` ``what`` (e.g. "row(s)") of the steps after ``step``."""
    if step < 0:  # no checkpoint: the attempts before this one saved none
        return (
            f"{where}: dropped {dropped} {what} of an earlier attempt at this run, which saved no checkpoint: the run "
            "starts from the beginning and trains those steps again."
        )
    return f"{where}: dropped {dropped} {what} of steps after {step}: the run resumes after step {step} and trains them again."


def to_scalar(name: str, value: Any) -> float:
    """A metric value as a Python float: accepts numbers, numpy scalars and one-element arrays or tensors."""
    if isinstance(value, (bool, int, float)):
        return float(value)
    numel = value.numel() if hasattr(value, "numel") else getattr(value, "size", None)
    if numel == 1 and hasattr(value, "item"):
        return float(value.item())
    raise TypeError(f"metric '{name}' must be a number or a one-element array/tensor, got {type(value).__name__}")


def flatten_dict(nested: dict, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; backends whose parameters are flat (mlflow, tensorboard) need it."""
    flat = {}
    for key, value in nested.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten_dict(value, name, sep))
        else:
            flat[name] = value
    return flat


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)``: numpy/torch values become Python values, anything else its ``str``."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def generation_columns(samples: list[dict]) -> list[str]:
    """Union of the samples' keys, in order of first appearance: the columns of a generations table."""
    columns: dict[str, None] = {}
    for sample in samples:
        columns.update(dict.fromkeys(sample))
    return list(columns)

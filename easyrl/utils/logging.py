"""Where log records go: the console shows the run (one line per step, its progress bar, warnings that mean
something), the files under ``<run_dir>/logs/`` keep everything else (vLLM's INFO lines, Ray, torch, transformers).

- ``setup_driver_logging(run_dir)`` once in the driver, before Ray starts: easyrl's INFO and every WARNING+ on the
  console (written through tqdm, so they never tear the progress bar), third-party INFO only in ``logs/driver.log``.
- ``setup_worker_logging(run_dir, rank)`` once in each worker process, before vLLM is imported: every record goes to
  ``logs/worker_<rank>.log``, and so does everything else the process writes to stdout/stderr (C++ warnings of torch
  and vLLM, progress bars, prints): Ray forwards a worker's output to the driver's terminal, once per worker, so
  anything printed there repeats N times a step. Only easyrl's own WARNING+ reaches the console. A worker's crash
  still reaches the driver as the Ray actor error, with its traceback.
- Python warnings (``warnings.warn``: deprecations inside torch, transformers, torchdata...) go to the files only:
  they concern the libraries' authors, not the run.

vLLM configures its own logger when imported (a stdout handler on ``vllm``, re-applied when an engine starts) unless
``VLLM_CONFIGURE_LOGGING=0``; the worker setup sets that default, so vLLM's records reach our file handler only.
``VLLM_LOGGING_LEVEL`` (default INFO) still sets how much of vLLM goes to the file.
"""

import importlib.util
import logging
import os
import sys
from pathlib import Path


EASYRL = "easyrl"
# Libraries whose INFO chatter (and repeated warnings, in workers) belongs in the log file, not on the console. Their
# levels stay theirs (vLLM's follows VLLM_LOGGING_LEVEL); torch is absent on purpose: torch._logging manages its own
# handlers and levels (WARNING), and lowering them floods the files with compiler internals.
THIRD_PARTY_LOGGERS = (
    "vllm",
    "ray",
    "transformers",
    "datasets",
    "huggingface_hub",
    "accelerate",
    "peft",
    "filelock",
    "urllib3",
    "httpx",
    "asyncio",
    "py.warnings",
)
_FILE_FORMAT = "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"
_MARK = "_easyrl_handler"  # set on the handlers we add, so a second setup call replaces them instead of doubling


class _TqdmConsoleHandler(logging.StreamHandler):
    """Writes through ``tqdm.write`` so that a log line printed while the progress bar is shown lands above it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


class _ConsoleFormatter(logging.Formatter):
    """``message`` for easyrl's INFO, ``WARNING name: message`` for warnings and errors."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if record.levelno >= logging.WARNING:
            return f"{record.levelname} {record.name}: {message}"
        return message


def log_dir(run_dir: str | os.PathLike) -> Path:
    """``<run_dir>/logs``: created on demand."""
    path = Path(run_dir) / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _mark(handler: logging.Handler) -> logging.Handler:
    setattr(handler, _MARK, True)
    return handler


def _replace_handlers(logger: logging.Logger, *handlers: logging.Handler, keep_foreign: bool = True) -> None:
    """Drop the handlers an earlier setup added (and, unless ``keep_foreign``, every other handler) and add these."""
    for handler in list(logger.handlers):
        if getattr(handler, _MARK, False) or not keep_foreign:
            logger.removeHandler(handler)
            if getattr(handler, _MARK, False):
                handler.close()
    for handler in handlers:
        logger.addHandler(handler)


def _file_handler(path: Path) -> logging.Handler:
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    return _mark(handler)


def _console_handler(level: int, stream=None) -> logging.Handler:
    handler = _TqdmConsoleHandler(stream or sys.stderr)
    handler.setLevel(level)
    handler.setFormatter(_ConsoleFormatter())
    return _mark(handler)


_console_stream = None  # this worker's original stderr, kept open once its file descriptors point at the log file


def _redirect_process_output(path: Path):
    """Point file descriptors 1 and 2 of this process at ``path`` (C++ warnings, progress bars and prints included);
    returns a stream on the original stderr for what must still reach the console. Idempotent."""
    global _console_stream
    if _console_stream is None:
        _console_stream = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    return _console_stream


def _quiet_transformers(file_handler: logging.Handler | None) -> None:
    """transformers keeps its own stderr handler on the ``transformers`` logger (propagation off) and draws a
    progress bar when loading weights: send its records to the file like every other library's."""
    if importlib.util.find_spec("transformers") is None:
        return
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger()  # make transformers install its default handler now, so that it can be removed
    hf_logging.disable_default_handler()
    hf_logging.disable_progress_bar()
    library = logging.getLogger("transformers")
    library.propagate = file_handler is None
    if file_handler is not None:
        _replace_handlers(library, file_handler)


def setup_driver_logging(run_dir: str | os.PathLike | None, level: int = logging.INFO) -> Path | None:
    """Configure the driver process; returns the log file (``<run_dir>/logs/driver.log``), or None without a run_dir.

    Console: easyrl at ``level`` and every library's WARNING+ (meaningful on the driver, printed once). File:
    everything at INFO and above, third-party INFO included.
    """
    if importlib.util.find_spec("ray") is not None:
        import ray  # noqa: F401  (Ray installs its own stderr handler on the `ray` logger at import: replace it now)
    file_handler = _file_handler(log_dir(run_dir) / "driver.log") if run_dir is not None else None
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = _console_handler(logging.WARNING)
    _replace_handlers(root, *(h for h in (console, file_handler) if h is not None))
    easyrl_logger = logging.getLogger(EASYRL)
    easyrl_logger.setLevel(level)
    easyrl_logger.propagate = False
    easyrl_console = _console_handler(level)
    _replace_handlers(easyrl_logger, *(h for h in (easyrl_console, file_handler) if h is not None))
    for name in THIRD_PARTY_LOGGERS:  # through the root: INFO to the file, WARNING+ also on the console
        library = logging.getLogger(name)
        library.propagate = True
        _replace_handlers(library, keep_foreign=False)
    logging.captureWarnings(True)
    warnings_logger = logging.getLogger("py.warnings")
    warnings_logger.propagate = False
    _replace_handlers(warnings_logger, *(h for h in (file_handler,) if h is not None), keep_foreign=False)
    _quiet_transformers(None)
    if file_handler is None:
        return None
    path = Path(file_handler.baseFilename)
    easyrl_logger.info("Engine and library logs: %s", path.parent)
    return path


def setup_worker_logging(run_dir: str | os.PathLike, rank: int, group: str = "worker") -> Path:
    """Configure a worker process (call before vLLM is imported); returns ``<run_dir>/logs/<group>_<rank>.log``
    (one file per process: the actor and critic groups each have a rank 0).

    File: every record at INFO and above (vLLM at ``VLLM_LOGGING_LEVEL``). Console (stderr, forwarded by Ray):
    easyrl's WARNING+ only.
    """
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    path = log_dir(run_dir) / f"{group}_{rank}.log"
    console = _redirect_process_output(path)
    file_handler = _file_handler(path)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    # the root keeps no console handler: a library logging through the root (or one we do not know) goes to the file
    _replace_handlers(root, file_handler, keep_foreign=False)

    easyrl_logger = logging.getLogger(EASYRL)
    easyrl_logger.setLevel(logging.INFO)
    easyrl_logger.propagate = False
    _replace_handlers(easyrl_logger, _console_handler(logging.WARNING, console), file_handler)

    for name in THIRD_PARTY_LOGGERS:
        library = logging.getLogger(name)
        if name == "vllm":
            library.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
        library.propagate = False
        # vLLM may have installed its stdout handler already (imported before this call): it goes too
        _replace_handlers(library, file_handler, keep_foreign=False)
    logging.captureWarnings(True)
    _quiet_transformers(file_handler)
    return path

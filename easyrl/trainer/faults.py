"""How a run ends when it cannot finish: a stop signal, or a worker process that died.

SIGTERM (what SLURM and Kubernetes send before they stop a job), SIGINT (Ctrl-C) and SIGUSR1 (what SLURM jobs are
often set to send before their time limit) ask the driver to stop: the current step finishes, a checkpoint is
written, and the run exits with 128 + the signal number (143, 130, 138) and one line saying where the checkpoint is.
A second signal exits at once, without a checkpoint. The handlers replace Ray's own SIGTERM handler in the driver,
which would otherwise tear the local cluster down (workers included) at once.
Only the driver gets a signal sent to its pid. A signal sent to every process of the job (a process-group kill,
SLURM's scancel) also reaches the local Ray cluster's own processes: SIGINT is blocked in them, SIGTERM ends them.
Without its cluster the driver can save nothing, and Ray would end it only after a minute of reconnection attempts:
a watch notices the cluster's death at once and exits with the same kind of message.

Every message names the last complete checkpoint and how to resume from it.
"""

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


logger = logging.getLogger(__name__)
# SIGUSR1: what SLURM jobs are often told to send before their time limit (`--signal=B:USR1@<seconds>`, the
# convention of PyTorch Lightning's requeueing); without a handler it would end the driver without a checkpoint.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


# How often, once a stop was asked, the driver checks that the local Ray cluster survived the signal.
CLUSTER_WATCH_INTERVAL_S = 0.5


def _local_cluster_processes() -> list:
    """The GCS and raylet processes (``subprocess.Popen``) of the Ray cluster this driver started; [] when it joined
    an existing cluster, or when this Ray version keeps them elsewhere (the watch is then off)."""
    try:
        import ray
        from ray._private import ray_constants

        node = ray._private.worker._global_node
        kinds = (ray_constants.PROCESS_TYPE_GCS_SERVER, ray_constants.PROCESS_TYPE_RAYLET)
        return [info.process for kind in kinds for info in node.all_processes.get(kind, [])]
    except Exception:
        return []


class StopRequest:
    """Set by the first stop signal (``STOP_SIGNALS``) while ``installed()``; the trainer reads it between steps.

    ``resume_hint`` (set by the trainer) says where a run can resume from; the watch's message ends with it.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.resume_hint: Callable[[], str] | None = None
        self.starting = False  # the workers are starting: no step runs yet
        self._disarmed = threading.Event()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def request(self, signum: int) -> None:
        """What the first signal does (also callable directly, e.g. from a test or an embedding program)."""
        self.signum = signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            # a handler must not take locks (logging's) the interrupted code may hold: write straight to stderr
            os.write(
                2, f"\neasyrl: second {signal.Signals(signum).name}: exiting now, without a checkpoint.\n".encode()
            )
            os._exit(128 + signum)
        self.request(signum)
        doing = (
            "the run stops before its first step, with nothing to save"
            if self.starting
            else "finishing the current step, then saving a checkpoint and exiting"
        )
        os.write(
            2,
            f"\neasyrl: {signal.Signals(signum).name} received: {doing} (send it again to exit at once, without a "
            "checkpoint).\n".encode(),
        )
        processes = _local_cluster_processes()
        if processes:
            threading.Thread(target=self._watch_cluster, args=(processes,), daemon=True).start()

    def _watch_cluster(self, processes: list) -> None:
        """Exit at once, saying why, if the signal ended the local Ray cluster too (nothing can be saved then)."""
        while not self._disarmed.wait(CLUSTER_WATCH_INTERVAL_S):
            if any(process.poll() is not None for process in processes):
                hint = self.resume_hint() if self.resume_hint else ""
                message = (
                    f"easyrl: {self.signal_name} also ended the Ray cluster's own processes (it was sent to every "
                    "process of the job, not to easyrl alone), so no checkpoint could be written. "
                )
                os.write(2, f"\n{message}{hint}\n".encode())
                os._exit(128 + (self.signum or 0))

    def raise_if_requested(self) -> None:
        """While the workers wait for the cluster to grant their reservation (no step has run): a stop ends the wait."""
        if self.requested:
            hint = "Nothing was saved or lost; rerunning the same command starts where this one would have."
            raise RunStopped(self.signal_name, self.signum, 0, None, hint)

    @contextmanager
    def installed(self) -> Iterator["StopRequest"]:
        """Handle the stop signals in this (the main) thread until the block ends, then restore the handlers."""
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)
        try:
            yield self
        finally:
            self._disarmed.set()  # the run handles the stop from here on, its cluster shutdown included
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class _StoppedDuringStartup(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def stops_end_startup() -> Iterator[None]:
    """While Ray starts, a stop signal ends the process at once with one line and 128 + the signal's number: no step
    has run, so nothing is saved or lost. Ray's own SIGTERM handler, installed partway through ``ray.init``, exits
    silently with status 15 (``sys.exit(signum)``); that exit is caught and said the same way."""

    def handle(signum: int, frame: FrameType | None) -> None:
        raise _StoppedDuringStartup(signum)

    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, handle)
    try:
        yield
        return
    except _StoppedDuringStartup as stop:
        signum = stop.signum
    except KeyboardInterrupt:
        signum = signal.SIGINT
    except SystemExit as exit_:
        if exit_.code != signal.SIGTERM:
            raise
        signum = signal.SIGTERM
    finally:
        for number, handler in previous.items():
            if signal.getsignal(number) is handle:  # one Ray replaced (SIGTERM) stays Ray's
                signal.signal(number, handler)
    try:  # a cluster half started would outlive this process
        import ray

        ray.shutdown()
    except Exception:  # noqa: BLE001 - exiting anyway; what is left of a local cluster ends with its parent
        pass
    name = signal.Signals(signum).name
    print(
        f"easyrl: {name} received while Ray was starting: no step had run, so nothing was saved or lost; rerunning the same "
        "command starts where this one would have.",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    # os._exit, not SystemExit: with the cluster shut down, the interpreter's own teardown of Ray's C++ core worker can
    # abort (SIGABRT) on a loaded machine, which would turn the promised exit status into -6.
    os._exit(128 + signum)


def resume_hint(checkpoint: str | None, trainer: Any) -> str:
    """How to continue a run whose last complete checkpoint is ``checkpoint`` (``trainer``: its TrainerConfig)."""
    if checkpoint is None:
        return "No checkpoint was written yet: rerunning the same command starts from the beginning."
    if trainer.save_model_only:
        return (
            f"The last checkpoint is {checkpoint}, with model weights only (trainer.save_model_only=true): training "
            "cannot resume from it; `easyrl merge` turns it into a model."
        )
    if trainer.load_checkpoint_path:
        from .checkpoint import own_saves_root

        # once the run has saved in its own folder, a rerun goes on from its newest there (load_checkpoint_passed)
        root = own_saves_root(trainer)
        same_command_resumes = os.path.abspath(trainer.load_checkpoint_path) == checkpoint or (
            root is not None and os.path.dirname(checkpoint) == root
        )
    else:
        same_command_resumes = trainer.find_last_checkpoint
    if same_command_resumes:
        return f"The last complete checkpoint is {checkpoint}; rerun the same command to resume from it."
    return (
        f"The last complete checkpoint is {checkpoint}; resume from it with trainer.load_checkpoint_path={checkpoint}."
    )


class RunInterrupted(Exception):
    """The run ended before its last step; ``str()`` is the one message the user reads, ``exit_code`` the status."""

    exit_code = 1


class RunStopped(RunInterrupted):
    """A stop signal arrived; the checkpoint of the last trained step was written."""

    def __init__(self, signal_name: str, signum: int, step: int, checkpoint: str | None, hint: str) -> None:
        self.exit_code = 128 + signum
        self.checkpoint = checkpoint
        what = f"after step {step}" if step else "before the first step"
        super().__init__(f"easyrl: stopped by {signal_name} {what}. {hint}")


class WorkerDied(RunInterrupted):
    """A worker process died and no restart was left (``trainer.max_restarts``)."""

    def __init__(self, cause: Exception, step: int, restarts: int, max_restarts: int, hint: str) -> None:
        self.cause = cause
        if max_restarts == 0:
            tried = "; set trainer.max_restarts to have easyrl restart the workers and resume on its own"
        else:
            tried = f" after {restarts} restart(s) (trainer.max_restarts={max_restarts})"
        super().__init__(f"easyrl: in step {step}, {cause}{tried}. {hint}")


def restart_after(died: Exception, run: Any) -> int:
    """The restart count to go on with after a worker died in the current step of ``run`` (the RL or the SFT
    trainer: its global_step, restarts, last_checkpoint, restart_workers, stop and config), logged; raises
    ``WorkerDied`` when ``trainer.max_restarts`` is spent or no restart is possible (no restart function, or a stop
    signal came)."""
    step, restarts, checkpoint, trainer = run.global_step, run.restarts, run.last_checkpoint, run.config.trainer
    max_restarts = trainer.max_restarts
    can_restart = run.restart_workers is not None and not run.stop.requested
    if restarts >= max_restarts or not can_restart:
        raise WorkerDied(died, step, restarts, max_restarts, resume_hint(checkpoint, trainer)) from died
    logger.warning(
        "In step %d, %s. Restarting every worker and resuming from %s (restart %d of trainer.max_restarts=%d).",
        step,
        died,
        checkpoint or "the beginning (no checkpoint yet)",
        restarts + 1,
        max_restarts,
    )
    return restarts + 1


def print_interruption(interrupted: RunInterrupted) -> None:
    """The last line of the console: what happened and how to resume. The traceback (Ray's own error included) goes
    to the driver's log file only: the root logger's console handler shows WARNING and above."""
    logging.getLogger().info("The run was interrupted:", exc_info=interrupted)
    print(str(interrupted), file=sys.stderr, flush=True)

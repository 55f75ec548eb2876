"""Stop signals: the first asks for a checkpoint and a clean exit, the second exits at once; the messages say where
to resume from. The real trainer under SIGTERM: tests/test_faults_runs.py."""

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from easyrl.config import TrainerConfig
from easyrl.trainer.faults import RunStopped, StopRequest, WorkerDied, resume_hint


def test_the_first_signal_sets_the_request_and_the_old_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest().installed() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigusr1_before_a_time_limit_asks_for_a_checkpoint_like_sigterm():
    """SLURM's `--signal=B:USR1@<seconds>` (PyTorch Lightning's convention): without a handler, SIGUSR1 would end
    the driver at once."""
    before = signal.getsignal(signal.SIGUSR1)
    with StopRequest().installed() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested and stop.signal_name == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is before
    assert RunStopped("SIGUSR1", signal.SIGUSR1, 3, "/ckpt/global_step_3", "HINT.").exit_code == 138


def test_a_signal_while_the_workers_start_says_the_run_stops_before_its_first_step(capfd):
    """Before: it said it was finishing the current step while the workers still loaded or waited for resources."""
    with StopRequest().installed() as stop:
        stop.starting = True
        os.kill(os.getpid(), signal.SIGTERM)
    said = capfd.readouterr().err
    assert "SIGTERM received: the run stops before its first step, with nothing to save" in said
    assert "finishing the current step" not in said
    with pytest.raises(RunStopped, match="before the first step. Nothing was saved or lost"):
        stop.raise_if_requested()


def test_a_second_signal_exits_at_once_with_128_plus_its_number():
    program = (
        "import os, signal, time\n"
        "from easyrl.trainer.faults import StopRequest\n"
        "with StopRequest().installed():\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(30)\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130
    assert "SIGINT received: finishing the current step" in done.stderr
    assert "second SIGINT: exiting now, without a checkpoint" in done.stderr
    assert "not reached" not in done.stdout


def test_the_resume_hint_says_whether_the_same_command_resumes(tmp_path):
    ckpt = str(tmp_path / "global_step_4")
    assert resume_hint(ckpt, TrainerConfig()) == (
        f"The last complete checkpoint is {ckpt}; rerun the same command to resume from it."
    )
    assert f"resume from it with trainer.load_checkpoint_path={ckpt}" in resume_hint(
        ckpt, TrainerConfig(find_last_checkpoint=False)
    )
    # a command naming an older checkpoint would go back to it
    older = TrainerConfig(load_checkpoint_path=str(tmp_path / "global_step_2"))
    assert f"trainer.load_checkpoint_path={ckpt}" in resume_hint(ckpt, older)
    assert "rerun the same command" in resume_hint(ckpt, TrainerConfig(load_checkpoint_path=ckpt))
    # a warm start from another run's folder: the rerun goes on from this folder's newest
    warm = TrainerConfig(
        save_checkpoint_path=str(tmp_path), load_checkpoint_path=str(tmp_path / "other" / "global_step_6")
    )
    assert "rerun the same command" in resume_hint(ckpt, warm)
    # a rollback to an earlier step of the run's folder: once it saved, the rerun goes on from its newest save
    rollback = dataclasses.replace(warm, load_checkpoint_path=str(tmp_path / "global_step_2"))
    assert resume_hint(ckpt, rollback) == (
        f"The last complete checkpoint is {ckpt}; rerun the same command to resume from it."
    )
    assert "starts from the beginning" in resume_hint(None, TrainerConfig())
    assert "cannot resume from it" in resume_hint(ckpt, TrainerConfig(save_model_only=True))


def test_interruptions_exit_non_zero_with_one_line():
    stopped = RunStopped("SIGTERM", signal.SIGTERM, 7, "/ckpt/global_step_7", "HINT.")
    assert stopped.exit_code == 143 and str(stopped) == "easyrl: stopped by SIGTERM after step 7. HINT."
    died = WorkerDied(RuntimeError("worker actor_rollout rank 1 died"), 3, 0, 0, "HINT.")
    assert died.exit_code == 1
    assert str(died) == (
        "easyrl: in step 3, worker actor_rollout rank 1 died; set trainer.max_restarts to have easyrl restart the "
        "workers and resume on its own. HINT."
    )
    assert "after 2 restart(s) (trainer.max_restarts=2)" in str(WorkerDied(RuntimeError("x"), 3, 2, 2, "H."))


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_stop_while_ray_starts_exits_with_one_line_and_no_cluster_left(when):
    """Before ray.init, easyrl's handler; from its first line on, Ray's (which exits silently with status 15)."""
    program = (
        "import os, signal, time\n"
        "import ray\n"
        "from easyrl.trainer.faults import stops_end_startup\n"
        "with stops_end_startup():\n"
        + ("    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(30)\n" if when == "before" else "")
        + "    ray.init(address='local', num_cpus=1, include_dashboard=False)\n"
        "    print('cluster', ray._private.worker._global_node.get_session_dir_path(), flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=180)
    assert done.returncode == 143, done.stderr[-2000:]
    assert "easyrl: SIGTERM received while Ray was starting: no step had run" in done.stderr
    assert "not reached" not in done.stdout and "Traceback" not in done.stderr
    assert ("cluster" in done.stdout) == (when == "after")
    if when == "after":  # the cluster's own processes (gcs_server, raylet) ended with it
        session = done.stdout.split("cluster ", 1)[1].split()[0]
        deadline = time.monotonic() + 30
        while _processes_naming(session) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _processes_naming(session)


def _processes_naming(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if text.encode() in handle.read():
                    found.append(pid)
        except OSError:
            pass
    return found

"""A worker process that dies is named: its group, rank, the call it was in, and how large it had grown."""

import os
import re
import signal
import time

import pytest
import torch
import torch.distributed as dist

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.controller import Dispatch, RayWorkerGroup, ResourcePool, Worker, register
from easyrl.controller.worker_group import WorkerDiedError


class FragileWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def grow_then_die_on_rank_1(self, megabytes: int) -> float:
        """Rank 1 holds ``megabytes`` more memory and is SIGKILLed (what the kernel's OOM killer does) while rank 0
        waits for it in a collective."""
        if self.rank == 1:
            self.ballast = torch.ones(megabytes * 2**20, dtype=torch.uint8)
            time.sleep(3)  # the driver samples every second
            os.kill(os.getpid(), signal.SIGKILL)
        value = torch.ones(1)
        dist.all_reduce(value)
        return value.item()


@pytest.mark.timeout(180)
def test_a_killed_rank_is_named_with_its_call_and_last_memory(ray_cluster):
    pool = ResourcePool(process_on_nodes=[2])
    group = RayWorkerGroup(pool, FragileWorker, name_prefix="fragile")
    try:
        pid = group.processes[1].pid
        with pytest.raises(WorkerDiedError) as caught:
            group.grow_then_die_on_rank_1(300)
        error = caught.value
        assert (error.group, error.rank, error.method) == ("fragile", 1, "grow_then_die_on_rank_1")
        message = str(error)
        assert message.startswith(f"worker fragile rank 1 (pid {pid}) died during `grow_then_die_on_rank_1`: ")
        assert "killed by a signal (SIGKILL; the kernel's out-of-memory killer sends it) or crashed" in message
        rss_gib = float(re.search(r"its last resident memory was (\d+\.\d+) GiB", message).group(1))
        assert 0.3 <= rss_gib < 4.0  # the 300 MiB of ballast plus the interpreter, torch and Ray
        # the group is unusable afterwards: every call names the dead rank again
        with pytest.raises(WorkerDiedError, match="worker fragile rank 1"):
            group.ping()
    finally:
        group.kill(graceful_timeout_s=2.0)
        pool.release()

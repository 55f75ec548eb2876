"""The base class of every SPMD worker: one process per rank that joins the job's torch.distributed group.

The worker group starts the processes with RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE in their environment,
asks rank 0 for its node address and a free port, then has every rank call ``init_distributed``. Nothing here
assumes a single machine: the master address is the rank-0 actor's node IP.
"""

import os
import socket
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..utils import device
from .dispatch import Dispatch, register


class Worker:
    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._dispatch_info: dict[str, tuple[int, int, bool]] = {}

    def get_node_ip_and_free_port(self) -> tuple[str, int]:
        """Address other ranks reach this process at; called on rank 0 before the process group exists."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ip, port

    def init_distributed(self, master_addr: str, master_port: int, timeout_s: float) -> None:
        """Join the process group (nccl on GPU, gloo on CPU); every rank must call this."""
        os.environ["MASTER_ADDR"] = master_addr
        os.environ["MASTER_PORT"] = str(master_port)
        if device.is_cuda_available():
            import torch

            # Ray usually exposes one GPU per worker (CUDA_VISIBLE_DEVICES), so the local index is then 0.
            device.set_device(self.local_rank % max(torch.cuda.device_count(), 1))
        if not dist.is_initialized():
            dist.init_process_group(
                backend=device.get_dist_backend(),
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=timeout_s),
            )

    def register_dispatch_info(self, mesh_name: str, dp_rank: int, dp_size: int, is_collect: bool) -> None:
        """Declare this rank's place in a data-parallel layout (e.g. rollout tensor-parallel groups).

        ``Dispatch.dp_compute_proto(mesh_name)`` then sends chunk ``dp_rank`` of ``dp_size`` to this rank and keeps
        its output only where ``is_collect`` (one rank per group).
        """
        self._dispatch_info[mesh_name] = (dp_rank, dp_size, is_collect)

    def get_dispatch_info(self, mesh_name: str) -> tuple[int, int, bool]:
        if mesh_name not in self._dispatch_info:
            raise KeyError(f"Rank {self.rank} registered no dispatch info for mesh `{mesh_name}`.")
        return self._dispatch_info[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ping(self) -> dict[str, Any]:
        """Rank environment and process-group state, for health checks."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "pid": os.getpid(),
            "backend": dist.get_backend() if dist.is_initialized() else None,
        }

    def shutdown(self) -> None:
        """Leave the process group; the worker group calls this before killing the actors."""
        if dist.is_initialized():
            dist.destroy_process_group()

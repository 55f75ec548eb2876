"""The single controller's side of distributed execution: resource pools, worker groups and dispatch modes."""

from .dispatch import Dispatch, register, register_dispatch_mode
from .resource_pool import ResourcePool
from .worker import Worker
from .worker_group import PendingResult, RayWorkerGroup


__all__ = [
    "Dispatch",
    "PendingResult",
    "RayWorkerGroup",
    "ResourcePool",
    "Worker",
    "register",
    "register_dispatch_mode",
]

"""A worker group: one Ray actor per rank running a ``Worker`` subclass, driven from the single controller.

Every method the worker class tags with ``@register`` becomes a method of the group with the same name: calling
it dispatches the arguments to the ranks, runs them all (SPMD), and collects the answers (see ``dispatch.py``).
"""

import uuid
from collections.abc import Callable
from typing import Any

import ray

from .dispatch import MethodSpec, get_method_spec, resolve_dispatch_mode
from .resource_pool import ResourcePool


def _get_fail_fast(refs: list) -> list:
    """ray.get that raises as soon as ANY rank fails (the others may be stuck in a collective waiting for it)."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done)
    return ray.get(refs)


class PendingResult:
    """The answers of a non-blocking group call; ``get()`` waits and collects them."""

    def __init__(self, refs: list, collect: Callable[[list], Any]) -> None:
        self.refs = refs
        self._collect = collect

    def get(self) -> Any:
        return self._collect(_get_fail_fast(self.refs))


class RayWorkerGroup:
    def __init__(
        self,
        resource_pool: ResourcePool,
        worker_cls: type,
        *args: Any,
        name_prefix: str = "worker",
        process_group_timeout_s: float = 1800.0,
        env_vars: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Start ``worker_cls(*args, **kwargs)`` on every slot of ``resource_pool`` and form the process group.

        ``process_group_timeout_s`` bounds how long a collective waits for a missing rank before failing.
        """
        self.resource_pool = resource_pool
        self.worker_cls = worker_cls
        self.name_prefix = f"{name_prefix}_{uuid.uuid4().hex[:6]}"
        self.workers: list[ray.actor.ActorHandle] = []
        self._dispatch_info: dict[str, list[tuple[int, int, bool]]] = {}
        remote_cls = ray.remote(worker_cls)
        slots = resource_pool.worker_slots()
        try:
            for rank, (pg, bundle_index, local_rank, local_world_size) in enumerate(slots):
                env = {
                    "RANK": str(rank),
                    "WORLD_SIZE": str(len(slots)),
                    "LOCAL_RANK": str(local_rank),
                    "LOCAL_WORLD_SIZE": str(local_world_size),
                    **(env_vars or {}),
                }
                options = resource_pool.actor_options(pg, bundle_index)
                actor = remote_cls.options(
                    name=f"{self.name_prefix}_{rank}", runtime_env={"env_vars": env}, **options
                ).remote(*args, **kwargs)
                self.workers.append(actor)
            master_addr, master_port = ray.get(self.workers[0].get_node_ip_and_free_port.remote())
            _get_fail_fast(
                [w.init_distributed.remote(master_addr, master_port, process_group_timeout_s) for w in self.workers]
            )
        except BaseException:
            self.kill()
            raise
        self._bind_registered_methods()

    @property
    def world_size(self) -> int:
        return len(self.workers)

    # ------------------------------------------------------------------------------------------------------------------
    # calling the ranks
    # ------------------------------------------------------------------------------------------------------------------
    def execute_all_async(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method`` with the same arguments on every rank; return the Ray object refs in rank order."""
        return [getattr(w, method).remote(*args, **kwargs) for w in self.workers]

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method`` with the same arguments on every rank and wait; answers in rank order."""
        return _get_fail_fast(self.execute_all_async(method, *args, **kwargs))

    def apply_all(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list:
        """Run ``fn(worker, *args, **kwargs)`` inside every rank's process and wait; answers in rank order.

        For inspection and tools; ``fn`` must be importable or picklable, and collectives in it run on all ranks.
        """
        return _get_fail_fast([w.__ray_call__.remote(fn, *args, **kwargs) for w in self.workers])

    def dispatch_info(self, mesh_name: str) -> list[tuple[int, int, bool]]:
        """(dp_rank, dp_size, is_collect) of every rank for a layout the workers registered (cached)."""
        if mesh_name not in self._dispatch_info:
            self._dispatch_info[mesh_name] = self.execute_all("get_dispatch_info", mesh_name)
        return self._dispatch_info[mesh_name]

    def _call(self, method: str, spec: MethodSpec, *args: Any, **kwargs: Any) -> Any:
        mode = resolve_dispatch_mode(spec.dispatch_mode)
        per_rank_args, per_rank_kwargs, context = mode.dispatch(self, args, kwargs)
        refs = [getattr(w, method).remote(*a, **k) for w, a, k in zip(self.workers, per_rank_args, per_rank_kwargs)]
        pending = PendingResult(refs, lambda outputs: mode.collect(self, outputs, context))
        return pending.get() if spec.blocking else pending

    def _bind_registered_methods(self) -> None:
        for name in dir(self.worker_cls):
            spec = get_method_spec(getattr(self.worker_cls, name, None))
            if spec is None:
                continue
            if name in vars(RayWorkerGroup):
                raise TypeError(f"{self.worker_cls.__name__}.{name} clashes with a RayWorkerGroup attribute.")

            def method(*args: Any, _name: str = name, _spec: MethodSpec = spec, **kwargs: Any) -> Any:
                return self._call(_name, _spec, *args, **kwargs)

            method.__name__ = name
            method.__doc__ = getattr(self.worker_cls, name).__doc__
            setattr(self, name, method)

    # ------------------------------------------------------------------------------------------------------------------
    # shutdown
    # ------------------------------------------------------------------------------------------------------------------
    def kill(self, graceful_timeout_s: float = 10.0) -> None:
        """Leave the process group where the ranks still answer, then kill every actor. Safe to call twice."""
        if not self.workers:
            return
        refs = [w.shutdown.remote() for w in self.workers]
        ray.wait(refs, num_returns=len(refs), timeout=graceful_timeout_s)
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers = []

    def __enter__(self) -> "RayWorkerGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()

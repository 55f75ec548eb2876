"""A worker group: one Ray actor per rank running a ``Worker`` subclass, driven from the single controller.

Every method the worker class tags with ``@register`` becomes a method of the group with the same name: calling
it dispatches the arguments to the ranks, runs them all (SPMD), and collects the answers (see ``dispatch.py``).

A rank whose process dies (killed, out of memory, crashed) makes every call of the group raise ``WorkerDiedError``
naming the group, the rank, the call and the process's last resident memory: the group is unusable from then on
(its process group has lost a member) and must be killed and started again.
"""

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError, WorkerCrashedError

from .dispatch import MethodSpec, get_method_spec, resolve_dispatch_mode
from .resource_pool import ResourcePool


logger = logging.getLogger(__name__)

# After one rank fails, how long the others get to report: when a process dies, its peers fail too (their
# collective lost a member) and may report first; the dead one is the cause worth naming.
DEATH_REPORT_GRACE_S = 5.0
# How often the driver samples the resident memory of the ranks on its node (a process the kernel's OOM killer
# ends leaves no message of its own: its last size is the best clue).
MEMORY_SAMPLE_INTERVAL_S = 1.0
_DIED = (RayActorError, WorkerCrashedError)


class WorkerDiedError(RuntimeError):
    """A worker process died (SIGKILL, the kernel's out-of-memory killer, a segfault): its group is unusable."""

    def __init__(self, group: str, rank: int, method: str, process: "ProcessInfo | None", cause: str) -> None:
        self.group, self.rank, self.method, self.process, self.cause = group, rank, method, process, cause
        where = f"worker {group} rank {rank}" + (f" (pid {process.pid})" if process else "")
        memory = process.memory_report() if process else "its memory use is unknown"
        log = f"; its log: {process.log_file}" if process and process.log_file else ""
        super().__init__(f"{where} died during `{method}`: {cause}; {memory}{log}")


def describe_death(error: Exception) -> str:
    """Why Ray says an actor's process died, in a few words: its messages run to a paragraph of possible causes."""
    text = str(error)
    if "memory monitor" in text.lower() or "low on memory" in text.lower():
        return "Ray's memory monitor killed it because the node ran low on memory (out of memory)"
    if "exit detail:" in text.lower() and "connection error" in text.lower():
        return (
            "its process ended without a Python error: killed by a signal (SIGKILL; the kernel's out-of-memory "
            "killer sends it) or crashed (a segfault)"
        )
    detail = text.split("Worker exit detail:", 1)[-1].strip() if "Worker exit detail:" in text else ""
    return f"Ray reports it dead ({detail.split('. ')[0] if detail else type(error).__name__})"


@dataclass
class ProcessInfo:
    """A rank's process as the driver sees it, and its resident memory as last sampled (local ranks only)."""

    pid: int
    node_id: str
    log_file: str | None
    local: bool
    last_rss_bytes: int | None = None
    node_memory_used: float | None = None  # share of the node's memory in use at that sample
    sampled_at: float | None = None  # time.monotonic()

    def memory_report(self) -> str:
        if not self.local:
            return "its memory use is unknown (it ran on another node)"
        if self.last_rss_bytes is None:
            return "its memory use was never sampled"
        ago = time.monotonic() - (self.sampled_at or 0.0)
        node = f", node memory {self.node_memory_used:.0%} used" if self.node_memory_used is not None else ""
        return f"its last resident memory was {self.last_rss_bytes / 2**30:.2f} GiB ({ago:.1f} s before{node})"


def _process_identity(worker: Any) -> tuple[int, str, str | None]:
    """(pid, Ray node id, the file its root logger writes to), run inside a rank."""
    log_file = next((h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)), None)
    return os.getpid(), ray.get_runtime_context().get_node_id(), log_file


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _node_memory_used() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            fields = {line.split(":")[0]: int(line.split()[1]) for line in handle if line.strip()}
        return 1.0 - fields["MemAvailable"] / fields["MemTotal"]
    except (OSError, ValueError, KeyError, IndexError, ZeroDivisionError):
        return None


class _MemoryWatch:
    """A daemon thread sampling the resident memory of the local ranks until ``stop()``."""

    def __init__(self, processes: list[ProcessInfo], interval_s: float = MEMORY_SAMPLE_INTERVAL_S) -> None:
        self._processes = [p for p in processes if p.local]
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="easyrl-worker-memory", daemon=True)
        if self._processes:
            self.sample()
            self._thread.start()

    def sample(self) -> None:
        node = _node_memory_used()
        for process in self._processes:
            rss = _rss_bytes(process.pid)
            if rss is not None:  # a process that is gone keeps its last sample
                process.last_rss_bytes, process.node_memory_used = rss, node
                process.sampled_at = time.monotonic()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self.sample()

    def stop(self) -> None:
        self._stopped.set()


class PendingResult:
    """The answers of a non-blocking group call; ``get()`` waits and collects them."""

    def __init__(self, group: "RayWorkerGroup", method: str, refs: list, collect: Callable[[list], Any]) -> None:
        self.refs = refs
        self._group = group
        self._method = method
        self._collect = collect

    def get(self) -> Any:
        return self._collect(self._group.wait(self.refs, self._method))


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
        self.role = name_prefix
        self.name_prefix = f"{name_prefix}_{uuid.uuid4().hex[:6]}"
        self.workers: list[ray.actor.ActorHandle] = []
        self.processes: list[ProcessInfo] = []  # filled once every rank is up
        self._memory_watch: _MemoryWatch | None = None
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
            master_addr, master_port = self.wait([self.workers[0].get_node_ip_and_free_port.remote()], "__init__")[0]
            self.wait(
                [w.init_distributed.remote(master_addr, master_port, process_group_timeout_s) for w in self.workers],
                "init_distributed",
            )
            driver_node = ray.get_runtime_context().get_node_id()
            self.processes = [
                ProcessInfo(pid, node_id, log_file, local=node_id == driver_node)
                for pid, node_id, log_file in self.apply_all(_process_identity)
            ]
            self._memory_watch = _MemoryWatch(self.processes)
            # on the console only for a run over several nodes (where a rank is matters then)
            several_nodes = len({process.node_id for process in self.processes}) > 1
            logger.log(logging.INFO if several_nodes else logging.DEBUG, "%s", self.placement())
        except BaseException:
            self.kill()
            raise
        self._bind_registered_methods()

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def placement(self) -> str:
        """Which ranks run on which Ray node (the driver's marked), for the log of a run over several nodes."""
        ranks: dict[str, list[int]] = {}
        for rank, process in enumerate(self.processes):
            ranks.setdefault(process.node_id, []).append(rank)
        driver_node = ray.get_runtime_context().get_node_id()
        nodes = "; ".join(
            f"node {node[:12]}{' (the driver)' if node == driver_node else ''}: ranks {', '.join(map(str, on))}"
            for node, on in ranks.items()
        )
        return f"{self.role}: {len(self.processes)} worker(s) on {len(ranks)} node(s): {nodes}"

    # ------------------------------------------------------------------------------------------------------------------
    # calling the ranks
    # ------------------------------------------------------------------------------------------------------------------
    def execute_all_async(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method`` with the same arguments on every rank; return the Ray object refs in rank order."""
        return [getattr(w, method).remote(*args, **kwargs) for w in self.workers]

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method`` with the same arguments on every rank and wait; answers in rank order."""
        return self.wait(self.execute_all_async(method, *args, **kwargs), method)

    def apply_all(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list:
        """Run ``fn(worker, *args, **kwargs)`` inside every rank's process and wait; answers in rank order.

        For inspection and tools; ``fn`` must be importable or picklable, and collectives in it run on all ranks.
        """
        refs = [w.__ray_call__.remote(fn, *args, **kwargs) for w in self.workers]
        return self.wait(refs, getattr(fn, "__name__", "apply_all"))

    def wait(self, refs: list, method: str) -> list:
        """The answers of one call on every rank (``refs`` in rank order); raises as soon as ANY rank fails (the
        others may be stuck in a collective waiting for it), as ``WorkerDiedError`` when a rank's process died."""
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                ray.get(done)
        except _DIED as error:
            raise self._death(refs, refs.index(done[0]), method, error) from error
        except Exception as first_error:
            # a peer of a dead rank fails first (its collective lost a member): look for the dead one
            finished, _ = ray.wait(pending, num_returns=len(pending), timeout=DEATH_REPORT_GRACE_S)
            for ref in finished:
                try:
                    ray.get(ref)
                except _DIED as error:
                    raise self._death(refs, refs.index(ref), method, error) from first_error
                except Exception:
                    pass
            raise
        return ray.get(refs)

    def _death(self, refs: list, rank: int, method: str, error: Exception) -> WorkerDiedError:
        if self._memory_watch is not None:
            self._memory_watch.stop()  # keep the samples from before the death
        process = self.processes[rank] if rank < len(self.processes) else None
        return WorkerDiedError(self.role, rank, method, process, describe_death(error))

    def dispatch_info(self, mesh_name: str) -> list[tuple[int, int, bool]]:
        """(dp_rank, dp_size, is_collect) of every rank for a layout the workers registered (cached)."""
        if mesh_name not in self._dispatch_info:
            self._dispatch_info[mesh_name] = self.execute_all("get_dispatch_info", mesh_name)
        return self._dispatch_info[mesh_name]

    def _call(self, method: str, spec: MethodSpec, *args: Any, **kwargs: Any) -> Any:
        mode = resolve_dispatch_mode(spec.dispatch_mode)
        per_rank_args, per_rank_kwargs, context = mode.dispatch(self, args, kwargs)
        refs = [getattr(w, method).remote(*a, **k) for w, a, k in zip(self.workers, per_rank_args, per_rank_kwargs)]
        pending = PendingResult(self, method, refs, lambda outputs: mode.collect(self, outputs, context))
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
        if self._memory_watch is not None:
            self._memory_watch.stop()
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

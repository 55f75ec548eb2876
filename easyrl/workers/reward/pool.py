"""A pool of reward actors that scores chunks in parallel, with a timeout per call.

Each actor gets one chunk at a time, so a chunk's clock starts when it is handed over. A chunk that takes longer
than `timeout_s` scores 0; its actor is killed (`ray.kill`) and replaced, because a hung Python call cannot be
interrupted from outside. An actor that dies is replaced the same way.
"""

import time
from collections import deque
from dataclasses import dataclass

import ray
from ray.exceptions import RayActorError, RayError

from .actor import ChunkResult, RewardActor


@dataclass
class _Slot:
    actor: "ray.actor.ActorHandle"
    ready_ref: "ray.ObjectRef | None"  # set while the actor starts
    started_at: float
    busy: bool = False


def _failed(size: int, reason: str, timed_out: bool = False) -> ChunkResult:
    return ChunkResult(scores=[None] * size, num_errors=size, traceback=reason, timed_out=timed_out)


class RewardActorPool:
    def __init__(
        self,
        spec: str,
        kwargs: dict,
        num_actors: int,
        timeout_s: float,
        actor_num_cpus: float = 1.0,
        startup_timeout_s: float = 300.0,
    ):
        self.spec, self.kwargs = spec, dict(kwargs)
        self.timeout_s = timeout_s
        self.actor_num_cpus = actor_num_cpus
        self.startup_timeout_s = startup_timeout_s
        self.num_replaced = 0
        self._slots = [self._start_actor() for _ in range(max(1, num_actors))]

    @property
    def num_actors(self) -> int:
        return len(self._slots)

    def _start_actor(self) -> _Slot:
        actor = RewardActor.options(num_cpus=self.actor_num_cpus).remote(self.spec, self.kwargs)
        return _Slot(actor=actor, ready_ref=actor.ready.remote(), started_at=time.monotonic())

    def _replace(self, index: int) -> None:
        ray.kill(self._slots[index].actor, no_restart=True)
        self._slots[index] = self._start_actor()
        self.num_replaced += 1

    def wait_ready(self) -> None:
        """Block until every actor has started (raises with a clear message if they cannot)."""
        while any(slot.ready_ref is not None for slot in self._slots):
            self._wait_and_handle({}, None, [])

    def run(self, chunks: list[list[dict]]) -> list[ChunkResult]:
        """Score every chunk; the results come back in the order of `chunks`."""
        results: list[ChunkResult | None] = [None] * len(chunks)
        pending = deque(range(len(chunks)))
        running: dict = {}  # ObjectRef -> (slot index, chunk index, start time)
        while pending or running:
            for index, slot in enumerate(self._slots):
                if pending and slot.ready_ref is None and not slot.busy:
                    chunk = pending.popleft()
                    running[slot.actor.score.remote(chunks[chunk])] = (index, chunk, time.monotonic())
                    slot.busy = True
            self._wait_and_handle(running, results, chunks)
        return results  # type: ignore[return-value]

    def _wait_and_handle(self, running: dict, results, chunks) -> None:
        starting = {slot.ready_ref: i for i, slot in enumerate(self._slots) if slot.ready_ref is not None}
        now = time.monotonic()
        deadlines = [start + self.timeout_s for _, _, start in running.values()]
        deadlines += [self._slots[i].started_at + self.startup_timeout_s for i in starting.values()]
        wait_s = max(0.01, min(deadlines) - now) if deadlines else 0.01
        ready, _ = ray.wait(list(running) + list(starting), num_returns=1, timeout=wait_s)
        for ref in ready:
            if ref in running:
                index, chunk, _ = running.pop(ref)
                self._slots[index].busy = False
                try:
                    results[chunk] = ray.get(ref)
                except (RayActorError, RayError) as err:
                    results[chunk] = _failed(len(chunks[chunk]), f"the reward actor failed: {err}")
                    self._replace(index)
            else:
                self._on_started(starting[ref], ref)
        now = time.monotonic()
        for ref, (index, chunk, start) in list(running.items()):
            if now - start > self.timeout_s:
                running.pop(ref)
                reason = f"timed out after {self.timeout_s:g} s (worker.reward.timeout_s)"
                results[chunk] = _failed(len(chunks[chunk]), reason, timed_out=True)
                self._replace(index)
        for slot in self._slots:
            if slot.ready_ref is not None and now - slot.started_at > self.startup_timeout_s:
                raise RuntimeError(
                    f"A reward actor did not start within {self.startup_timeout_s:g} s. Each needs "
                    f"{self.actor_num_cpus:g} CPU of the Ray cluster (free now: "
                    f"{ray.available_resources().get('CPU', 0):g}); lower `worker.reward.num_cpus` or give Ray more CPUs."
                )

    def _on_started(self, index: int, ref) -> None:
        try:
            ray.get(ref)
        except RayError as err:
            raise RuntimeError(f"A reward actor failed to start ({self.spec}): {err}") from err
        self._slots[index].ready_ref = None

    def shutdown(self) -> None:
        for slot in self._slots:
            ray.kill(slot.actor, no_restart=True)
        self._slots = []

"""A pool of reward actors that scores the chunks of a batch concurrently, under ONE deadline for the whole batch.

Each actor takes one chunk at a time from a shared queue, so a free actor takes the next chunk while another is
stuck, and streams back the outcome of every call of the reward function as it finishes. The batch's clock starts
when the chunks are handed over (every actor ready) and runs `timeout_s`: at the deadline every sample not scored
yet (the rest of a stuck chunk, a chunk no actor was free to take) scores 0 as timed out, and the actors still busy
are killed (`ray.kill`) and replaced, because a hung Python call cannot be interrupted from outside. One hung call
therefore costs about `timeout_s` per batch, however many chunks there are. An actor whose process dies (the reward
called `os._exit`, crashed, or the OOM killer ended it) is replaced the same way, and its unscored samples score 0.

`run` may be called from a thread other than the driver's main one (the scorer overlaps scoring with the rest of the
step), one call at a time. A `cancel` event set by another thread ends a run within `CANCEL_POLL_S`: what is not
scored yet counts as timed out and the busy actors are replaced, as at the deadline.
"""

import threading
import time
from collections import deque
from dataclasses import dataclass

import ray
from ray.exceptions import RayError

from ...controller.worker_group import describe_death
from .actor import DIED, TIMED_OUT, RewardActor, SampleFailure, Scored, failed, merge


CANCEL_POLL_S = 0.1  # how often a run waiting on its actors looks at its cancel event


@dataclass
class _Slot:
    actor: "ray.actor.ActorHandle"
    ready_ref: "ray.ObjectRef | None"  # set while the actor starts
    started_at: float
    busy: bool = False


def _death_reason(err: RayError) -> str:
    return (
        "the reward actor's process died while scoring (the reward function called os._exit or crashed, or the OOM "
        f"killer ended it): {describe_death(err)}"
    )


class RewardActorPool:
    def __init__(
        self,
        spec: str,
        kwargs: dict,
        num_actors: int,
        timeout_s: float,
        actor_num_cpus: float = 1.0,
        startup_timeout_s: float = 300.0,
        weights: list[float] | None = None,
        reward_type: str | None = None,
    ):
        self.spec, self.kwargs, self.weights, self.reward_type = spec, dict(kwargs), weights, reward_type
        self.timeout_s = timeout_s
        self.actor_num_cpus = actor_num_cpus
        self.startup_timeout_s = startup_timeout_s
        self.num_replaced = 0
        self._slots = [self._start_actor() for _ in range(max(1, num_actors))]

    @property
    def num_actors(self) -> int:
        return len(self._slots)

    def _start_actor(self) -> _Slot:
        actor = RewardActor.options(num_cpus=self.actor_num_cpus).remote(
            self.spec, self.kwargs, self.weights, self.reward_type
        )
        return _Slot(actor=actor, ready_ref=actor.ready.remote(), started_at=time.monotonic())

    def _replace(self, index: int) -> None:
        ray.kill(self._slots[index].actor, no_restart=True)
        self._slots[index] = self._start_actor()
        self.num_replaced += 1

    def wait_ready(self) -> None:
        """Block until every actor has started (raises with a clear message if one cannot)."""
        while starting := {slot.ready_ref: i for i, slot in enumerate(self._slots) if slot.ready_ref is not None}:
            oldest = min(self._slots[i].started_at for i in starting.values())
            wait_s = max(0.01, oldest + self.startup_timeout_s - time.monotonic())
            ready, _ = ray.wait(list(starting), num_returns=1, timeout=wait_s)
            for ref in ready:
                self._on_started(starting[ref], ref)
            self._check_startup()

    def run(self, chunks: list[list[dict]], cancel: threading.Event | None = None) -> list[Scored]:
        """Score every chunk within `timeout_s` in all; one outcome per chunk, in the order of `chunks`. A set
        `cancel` ends the run early, its unscored samples timed out."""
        self.wait_ready()  # a replacement started after the last batch's deadline: its start-up is not scoring time
        deadline = time.monotonic() + self.timeout_s
        parts: list[list[Scored]] = [[] for _ in chunks]
        pending = deque(range(len(chunks)))
        running: dict = {}  # ObjectRefGenerator -> (slot index, chunk index)
        while pending or running:
            for index, slot in enumerate(self._slots):
                if pending and slot.ready_ref is None and not slot.busy:
                    chunk = pending.popleft()
                    running[slot.actor.score.remote(chunks[chunk])] = (index, chunk)
                    slot.busy = True
            left = deadline - time.monotonic()
            if left <= 0 or (cancel is not None and cancel.is_set()):
                break
            starting = {slot.ready_ref: i for i, slot in enumerate(self._slots) if slot.ready_ref is not None}
            wait_s = left if cancel is None else min(left, CANCEL_POLL_S)
            ready, _ = ray.wait(list(running) + list(starting), num_returns=1, timeout=wait_s)
            for ref in ready:
                if ref in starting:
                    self._on_started(starting[ref], ref)
                else:
                    self._take(ref, running, parts, chunks)
        # outcomes that arrived by the deadline count, even if this loop had not taken them yet
        while running and (ready := ray.wait(list(running), num_returns=len(running), timeout=0)[0]):
            for stream in ready:
                self._take(stream, running, parts, chunks)
        timeout = SampleFailure(TIMED_OUT, f"not scored within {self.timeout_s:g} s (worker.reward.timeout_s)")
        for index, chunk in running.values():
            parts[chunk].append(failed(len(chunks[chunk]) - sum(map(len, parts[chunk])), timeout))
            self._replace(index)
        for chunk in pending:
            parts[chunk].append(failed(len(chunks[chunk]), timeout))
        return [merge(chunk_parts) for chunk_parts in parts]

    def _take(self, stream, running: dict, parts: list[list[Scored]], chunks: list[list[dict]]) -> None:
        """Collect the next outcome of a chunk's stream; on its end or the actor's death the actor is free again."""
        index, chunk = running[stream]
        try:
            parts[chunk].append(ray.get(next(stream)))
            while stream.next_ready():  # take what has arrived without another ray.wait per sample
                parts[chunk].append(ray.get(next(stream)))
            if not stream.is_finished():
                return
        except StopIteration:
            pass
        except RayError as err:
            unscored = len(chunks[chunk]) - sum(map(len, parts[chunk]))
            parts[chunk].append(failed(unscored, SampleFailure(DIED, _death_reason(err))))
            self._replace(index)
        running.pop(stream)
        self._slots[index].busy = False

    def _on_started(self, index: int, ref) -> None:
        try:
            ray.get(ref)
        except RayError as err:
            raise RuntimeError(f"A reward actor failed to start ({self.spec}): {err}") from err
        self._slots[index].ready_ref = None

    def _check_startup(self) -> None:
        now = time.monotonic()
        if any(slot.ready_ref is not None and now - slot.started_at > self.startup_timeout_s for slot in self._slots):
            raise RuntimeError(
                f"A reward actor did not start within {self.startup_timeout_s:g} s. Each needs "
                f"{self.actor_num_cpus:g} CPU of the Ray cluster (free now: "
                f"{ray.available_resources().get('CPU', 0):g}); lower `worker.reward.num_cpus` or give Ray more CPUs."
            )

    def shutdown(self) -> None:
        for slot in self._slots:
            ray.kill(slot.actor, no_restart=True)
        self._slots = []

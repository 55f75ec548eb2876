"""Reserving devices for worker groups: one Ray placement group per node, one bundle per worker.

A bundle holds one accelerator (``get_ray_resource_name()`` is "GPU") plus CPU cores, or only CPU cores on a machine
without GPUs, so the same code places workers on a laptop, a GPU box or an existing multi-node Ray cluster.
Several worker groups can share the bundles (``max_colocate_count``): each worker then takes a fraction of the
accelerator, which is how the critic shares the actor's devices.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..utils.device import get_ray_resource_name


@dataclass
class ResourcePool:
    process_on_nodes: list[int]
    """Workers per node, e.g. [8, 8] for `trainer.nnodes=2` x `trainer.n_gpus_per_node=8`."""
    max_colocate_count: int = 1
    """Worker groups that share each bundle (each gets 1/max_colocate_count of the accelerator)."""
    cpus_per_worker: int = 1
    """CPU cores reserved for each worker of each colocated group."""
    ready_timeout_s: float = 300.0
    """How long to wait for the cluster to grant the reservation before failing with an explanation."""
    while_waiting: Callable[[], None] | None = None
    """Called about every second while the reservation waits; what it raises (a stop signal's exception) ends the
    wait, the reservation released."""
    _placement_groups: list[PlacementGroup] = field(default_factory=list, init=False, repr=False)

    @classmethod
    def from_trainer_config(cls, nnodes: int, n_gpus_per_node: int, **kwargs) -> "ResourcePool":
        return cls(process_on_nodes=[n_gpus_per_node] * nnodes, **kwargs)

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def _bundle(self) -> dict[str, float]:
        bundle = {"CPU": float(self.cpus_per_worker * self.max_colocate_count)}
        device = get_ray_resource_name()
        if device != "CPU":
            bundle[device] = 1.0
        return bundle

    def placement_groups(self) -> list[PlacementGroup]:
        """Reserve (once) and return one STRICT_PACK placement group per node, in rank order."""
        if self._placement_groups:
            return self._placement_groups
        groups = [placement_group([self._bundle()] * n, strategy="STRICT_PACK") for n in self.process_on_nodes]
        refs, deadline = [pg.ready() for pg in groups], time.monotonic() + self.ready_timeout_s
        ready: list = []
        try:  # a reservation not granted (the deadline, or what while_waiting raised) is released
            while len(ready) < len(groups) and (left := deadline - time.monotonic()) > 0:
                ready, _ = ray.wait(refs, num_returns=len(groups), timeout=min(left, 1.0))
                if len(ready) < len(groups) and self.while_waiting is not None:
                    self.while_waiting()
            if len(ready) < len(groups):
                raise RuntimeError(
                    f"The Ray cluster could not reserve {len(self.process_on_nodes)} node(s) x "
                    f"{max(self.process_on_nodes)} worker(s) of {self._bundle()} each within "
                    f"{self.ready_timeout_s:.0f} s (available: {ray.available_resources()}). Lower `trainer.nnodes` / "
                    "`trainer.n_gpus_per_node` to what the cluster has, or add nodes."
                )
        except BaseException:
            for pg in groups:
                remove_placement_group(pg)
            raise
        self._placement_groups = groups
        return groups

    def worker_slots(self) -> list[tuple[PlacementGroup, int, int, int]]:
        """(placement group, bundle index, local rank, local world size) for every rank, in rank order."""
        slots = []
        for pg, n in zip(self.placement_groups(), self.process_on_nodes):
            slots.extend((pg, index, index, n) for index in range(n))
        return slots

    def actor_options(self, pg: PlacementGroup, bundle_index: int) -> dict:
        """Ray actor options that pin one worker (of one colocated group) to a bundle."""
        options = {
            "num_cpus": self.cpus_per_worker,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=bundle_index
            ),
        }
        device = get_ray_resource_name()
        if device == "GPU":
            options["num_gpus"] = 1.0 / self.max_colocate_count
        elif device != "CPU":
            options["resources"] = {device: 1.0 / self.max_colocate_count}
        return options

    def release(self) -> None:
        for pg in self._placement_groups:
            remove_placement_group(pg)
        self._placement_groups = []

"""Worker groups on a local Ray cluster: rank environment, gloo process group, dispatch modes, shutdown."""

import time

import pytest
import torch
import torch.distributed as dist

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.controller import Dispatch, RayWorkerGroup, ResourcePool, Worker, register
from tests.fsdp_helpers import worker_group


class EchoWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sum_of_ranks_plus_one(self) -> float:
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return value.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_RANK_ZERO)
    def rank_of_answer(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def tag(self, item: str) -> str:
        return f"{self.rank}:{item}"

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def mark_rows(self, data):
        from easyrl.protocol import DataProto

        rows = len(data)
        return DataProto.from_dict(
            tensors={"value": data.batch["value"] * 10, "rank": torch.full((rows,), self.rank)},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def samples_per_row(self, data, n: int):
        """n answers per input row, adjacent (as a rollout returns n samples per prompt)."""
        from easyrl.protocol import DataProto

        value = data.batch["value"].repeat_interleave(n) * 10 + torch.arange(n).repeat(len(data))
        return DataProto.from_dict(tensors={"value": value, "rank": torch.full((len(data) * n,), self.rank)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_like(self, data):
        """Rows and engine metrics of this rank's share, as a generate call answers."""
        from easyrl.protocol import DataProto

        rows = len(data)
        metrics = {
            "rollout/gen_seconds": 1.0 + self.rank,
            "rollout/gen_tokens": 10.0 * rows,
            "rollout/gen_responses": float(rows),
            "rollout/gen_tokens_per_s": 10.0 * rows / (1.0 + self.rank),
            "rollout/response_length/mean": 10.0 + self.rank,
            "rollout/response_length/max": 10.0 + self.rank,
            "rollout/multi_turn/tool_errors": 1.0 + self.rank,
        }
        return DataProto.from_dict(tensors={"value": data.batch["value"]}, meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def declare_pairs(self) -> None:
        # ranks (0, 1) form data-parallel group 0, answered by rank 0 (like a tensor-parallel pair)
        self.register_dispatch_info("pairs", dp_rank=0, dp_size=1, is_collect=self.rank == 0)

    @register(dispatch_mode=Dispatch.dp_compute_proto("pairs"))
    def rows_seen(self, data):
        from easyrl.protocol import DataProto

        return DataProto.from_dict(tensors={"value": data.batch["value"], "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def slow_rank(self) -> int:
        return self.rank


def _rank_times(worker: Worker, factor: int) -> int:
    return worker.rank * factor


@pytest.fixture(scope="module")
def group(ray_cluster):
    with worker_group(EchoWorker, name_prefix="echo", processes=2) as echo:
        yield echo


@pytest.mark.timeout(120)
def test_each_rank_gets_its_rank_environment(group):
    answers = group.ping()
    assert [(a["rank"], a["world_size"], a["local_rank"]) for a in answers] == [(0, 2, 0), (1, 2, 1)]
    assert {a["backend"] for a in answers} == {"gloo"}
    assert answers[0]["pid"] != answers[1]["pid"]


@pytest.mark.timeout(120)
def test_ranks_share_one_process_group(group):
    assert group.sum_of_ranks_plus_one() == [3.0, 3.0]


@pytest.mark.timeout(120)
def test_apply_all_runs_a_function_inside_every_rank(group):
    assert group.apply_all(_rank_times, 10) == [0, 10]


@pytest.mark.timeout(120)
def test_rank_zero_collect_returns_only_rank_zero_answer(group):
    assert group.rank_of_answer() == 0


@pytest.mark.timeout(120)
def test_all_to_all_sends_each_rank_its_own_entry(group):
    assert group.tag(["a", "b"]) == ["0:a", "1:b"]


@pytest.mark.timeout(120)
def test_all_to_all_rejects_a_list_of_the_wrong_length(group):
    with pytest.raises(ValueError, match="one entry per rank"):
        group.tag(["only-one"])


@pytest.mark.timeout(120)
def test_non_blocking_call_returns_pending_result(group):
    pending = group.slow_rank()
    assert pending.get() == [0, 1]


@pytest.mark.timeout(120)
def test_dp_compute_proto_pads_splits_and_restores_rows(group):
    from easyrl.protocol import DataProto

    data = DataProto.from_dict(tensors={"value": torch.arange(5)})
    out = group.mark_rows(data)
    assert len(out) == 5  # the padding row added to split 5 over 2 ranks is gone
    assert out.batch["value"].tolist() == [0, 10, 20, 30, 40]
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]


@pytest.mark.timeout(120)
def test_dp_compute_proto_drops_every_answer_of_a_padding_row(group):
    """A rollout answers n samples per prompt: a prompt count the ranks do not divide (7 prompts, 2 ranks, n=3) padded
    one prompt, whose 3 samples must all go (only 1 went: "Cannot union DataProtos of lengths 21 and 23")."""
    from easyrl.protocol import DataProto

    out = group.samples_per_row(DataProto.from_dict(tensors={"value": torch.arange(7)}), 3)
    assert out.batch["value"].tolist() == [10 * row + sample for row in range(7) for sample in range(3)]
    assert out.batch["rank"].tolist() == [0] * 12 + [1] * 9


@pytest.mark.timeout(120)
def test_dp_compute_proto_combines_the_engine_metrics_of_every_rank(group):
    """A generate call's metrics were chunk 0's: with 2 workers, rollout/* described half the batch."""
    from easyrl.protocol import DataProto

    out = group.generate_like(DataProto.from_dict(tensors={"value": torch.arange(4)}))
    assert out.meta_info["metrics"] == {
        "rollout/gen_seconds": 2.0,  # the ranks ran at once: the slower one's
        "rollout/gen_tokens": 40.0,
        "rollout/gen_responses": 4.0,
        "rollout/gen_tokens_per_s": 20.0,  # all tokens over the call's seconds
        "rollout/response_length/mean": 10.5,
        "rollout/response_length/max": 11.0,
        "rollout/multi_turn/tool_errors": 3.0,
    }


@pytest.mark.timeout(120)
def test_mesh_dispatch_sends_group_chunk_to_every_member_and_collects_one(group):
    from easyrl.protocol import DataProto

    group.declare_pairs()
    out = group.rows_seen(DataProto.from_dict(tensors={"value": torch.arange(3)}))
    assert out.batch["value"].tolist() == [0, 1, 2]
    assert out.batch["rank"].tolist() == [0, 0, 0]


@pytest.mark.timeout(120)
def test_kill_removes_every_actor(ray_cluster):
    import ray

    pool = ResourcePool(process_on_nodes=[1])
    short_lived = RayWorkerGroup(pool, EchoWorker, name_prefix="short_lived")
    actor = short_lived.workers[0]
    short_lived.kill()
    pool.release()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.ping.remote(), timeout=30)
    assert short_lived.workers == []


@pytest.mark.timeout(60)
def test_resource_pool_explains_a_reservation_the_cluster_cannot_grant(ray_cluster):
    pool = ResourcePool(process_on_nodes=[64], ready_timeout_s=2)
    with pytest.raises(RuntimeError, match="trainer.n_gpus_per_node"):
        pool.placement_groups()


@pytest.mark.timeout(60)
def test_a_stop_ends_the_wait_for_a_reservation_and_releases_it(ray_cluster):
    """Before: a SIGTERM while the workers waited for resources busy elsewhere waited out the 300 s (the handler only
    sets a flag), saying it was finishing a step no one was running."""
    from ray.util import placement_group_table

    from easyrl.trainer.faults import RunStopped, StopRequest

    stop = StopRequest()
    asked_at = time.monotonic() + 1.5

    def signal_then_check() -> None:  # the signal arrives 1.5 s into the wait
        if time.monotonic() >= asked_at:
            stop.request(15)
        stop.raise_if_requested()

    pool = ResourcePool(process_on_nodes=[64], ready_timeout_s=300, while_waiting=signal_then_check)
    before = set(placement_group_table())
    start = time.monotonic()
    with pytest.raises(RunStopped) as stopped:
        pool.placement_groups()
    assert time.monotonic() - start < 10
    assert stopped.value.exit_code == 143 and str(stopped.value).startswith(
        "easyrl: stopped by SIGTERM before the first step. Nothing was saved or lost"
    )
    made = {key: entry for key, entry in placement_group_table().items() if key not in before}
    assert made and all(entry["state"] == "REMOVED" for entry in made.values())

"""`trainer.nnodes=2` on a Ray cluster of two nodes, two raylets on this machine joined the way `ray start` joins
them (Ray's own test cluster): one run places a worker on each node, forms one gloo process group across them,
trains and saves; a second run joins the same cluster and resumes from that checkpoint."""

import os
import re

import pytest

from tests.fixtures.trainer_runs import TINY_RUN_OVERRIDES, bare_run, metrics_by_step, run_training


@pytest.fixture
def two_node_cluster():
    """Two Ray nodes, each with exactly the cores one worker reserves (`cpus_per_worker` with one worker per node),
    so each node's placement group fills a node and the two workers cannot share one."""
    from ray.cluster_utils import Cluster

    cores = os.cpu_count() or 1
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cores})
    try:
        cluster.add_node(num_cpus=cores)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_over_two_nodes_trains_saves_and_resumes(two_node_cluster, tiny_model_path, tmp_path):
    save_dir = tmp_path / "run"
    args = [
        *TINY_RUN_OVERRIDES,
        *bare_run(2, save_dir),
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "trainer.save_freq=2",
        "trainer.save_model_only=false",
    ]
    run_training(args, tmp_path / "first.log", ray_address=two_node_cluster.address)
    driver_log = (save_dir / "logs" / "driver.log").read_text()
    placement = re.findall(r"actor_rollout: 2 worker\(s\) on (\d) node\(s\): (.*)", driver_log)
    assert placement and placement[0][0] == "2", driver_log[-3000:]
    assert "ranks 0;" in placement[0][1] and placement[0][1].endswith("ranks 1")
    assert (save_dir / "global_step_2" / "COMPLETE").exists()

    run_training(
        [*args, "trainer.max_steps=3", "trainer.find_last_checkpoint=true"],
        tmp_path / "second.log",
        ray_address=two_node_cluster.address,
    )
    assert f"Resuming from {save_dir / 'global_step_2'}" in (save_dir / "logs" / "driver.log").read_text()
    rows = metrics_by_step(save_dir)
    assert sorted(rows) == [1, 2, 3]
    assert all(row["reward/errors"] == 0 and row["actor/grad_norm"] > 0 for row in rows.values())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cluster_with_fewer_nodes_than_trainer_nnodes_is_refused_in_one_line(tiny_model_path, tmp_path):
    """Ray would place what fits and leave the rest waiting; a cluster of one node for trainer.nnodes=2 stops at
    once, naming the cluster and the command that adds a node. A RAY_ADDRESS where nothing listens stops too."""
    from ray.cluster_utils import Cluster

    from tests.fixtures.trainer_runs import run_easyrl

    args = [
        *TINY_RUN_OVERRIDES,
        *bare_run(1, tmp_path / "run"),
        f"worker.actor.model.model_path={tiny_model_path}",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
    ]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    address = cluster.address
    try:
        done = run_easyrl("train", *args, env={**os.environ, "RAY_ADDRESS": address})
    finally:
        cluster.shutdown()
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"trainer.nnodes=2 but the Ray cluster at {address} has 1 node(s) alive" in done.stderr
    assert "Traceback" not in done.stderr

    nowhere = run_easyrl("train", *args, env={**os.environ, "RAY_ADDRESS": "127.0.0.1:1"})
    assert nowhere.returncode == 2 and "RAY_ADDRESS=127.0.0.1:1: nothing answers at 127.0.0.1:1" in nowhere.stderr

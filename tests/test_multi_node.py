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


JOINED_CLUSTER_ENV_PROBE = """
import json, os, sys
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})  # its raylet has the environment of now
# set after the cluster started, as `easyrl train` is run in a shell of its own after `ray start`
os.environ.update(RAY_ADDRESS=cluster.address, MY_SECRET="s3", NOT_NAMED="x", PYTHONPATH=sys.argv[1])
if sys.argv[2] == "job":  # `ray job submit --runtime-env` of EasyR1's example: variables the run sets too
    os.environ["VLLM_LOGGING_LEVEL"] = "WARN"
    job_env = {"TOKENIZERS_PARALLELISM": "true", "VLLM_LOGGING_LEVEL": "WARN"}
    os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"] = json.dumps({"runtime_env": {"env_vars": job_env}})
import ray
from easyrl.config import load_run_plan
from easyrl.trainer.main import init_ray

init_ray(load_run_plan(sys.argv[3:]))
try:
    @ray.remote(num_cpus=0)
    def seen():
        names = ("MY_SECRET", "NOT_NAMED", "TOKENIZERS_PARALLELISM", "VLLM_LOGGING_LEVEL")
        try:
            import beside_the_reward  # found through the driver's PYTHONPATH only
        except ModuleNotFoundError:
            return {name: os.environ.get(name) for name in names}
        return {**{name: os.environ.get(name) for name in names}, "module": beside_the_reward.VALUE}

    print("SEEN", json.dumps(ray.get(seen.remote())))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launch", ["shell", "job"])
def test_workers_on_a_cluster_started_elsewhere_get_the_named_variables_and_the_drivers_pythonpath(
    tiny_model_path, tmp_path, launch
):
    """Before: the workers of a `ray start` cluster got neither the driver's PYTHONPATH (a reward file importing a
    module beside it failed in its actor, after the error had advised that very PYTHONPATH) nor any variable outside
    a few prefixes; and inside a Ray job whose runtime env set TOKENIZERS_PARALLELISM, ray.init was refused."""
    import json
    import subprocess
    import sys

    from tests.fixtures.trainer_runs import REPO_ROOT

    (tmp_path / "beside_the_reward.py").write_text("VALUE = 42\n")
    args = [*TINY_RUN_OVERRIDES, f"worker.actor.model.model_path={tiny_model_path}", "trainer.worker_env=[MY_SECRET]"]
    result = subprocess.run(
        [sys.executable, "-c", JOINED_CLUSTER_ENV_PROBE, str(tmp_path), launch, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("SEEN ")]
    seen = json.loads(line[5:])
    assert seen["MY_SECRET"] == "s3" and seen["NOT_NAMED"] is None
    # a Ray job's code reaches its workers through its runtime env (working_dir, py_modules), not the driver's path
    assert seen.get("module") == (None if launch == "job" else 42)
    # the job's runtime env decides what it sets; the run adds its own default elsewhere
    assert seen["TOKENIZERS_PARALLELISM"] == ("true" if launch == "job" else "false")
    assert seen["VLLM_LOGGING_LEVEL"] == ("WARN" if launch == "job" else None)


def test_a_worker_env_variable_not_set_here_is_refused_before_ray(tiny_model_path, monkeypatch):
    from easyrl.config import ConfigError, load_run_plan

    monkeypatch.delenv("EASYRL_TEST_UNSET", raising=False)
    args = [*TINY_RUN_OVERRIDES, f"worker.actor.model.model_path={tiny_model_path}"]
    with pytest.raises(
        ConfigError, match=r"`trainer.worker_env` names EASYRL_TEST_UNSET, not set in this environment"
    ):
        load_run_plan([*args, "trainer.worker_env=[EASYRL_TEST_UNSET]"])


def test_a_node_too_small_for_its_workers_is_refused_at_once_naming_the_key(tiny_model_path, monkeypatch):
    """Before: the run waited 300 s for a placement no node could grant, then stopped with a traceback."""
    from easyrl.config import load_run_plan
    from easyrl.trainer.main import RunSetupError, check_nodes_can_hold_workers, cpus_per_worker

    monkeypatch.setattr("os.cpu_count", lambda: 4)
    args = [*TINY_RUN_OVERRIDES, f"worker.actor.model.model_path={tiny_model_path}", "trainer.n_gpus_per_node=4"]
    args += [
        "worker.actor.micro_batch_size_per_device_for_update=4",
        "worker.actor.micro_batch_size_per_device_for_experience=4",
    ]
    plan = load_run_plan(args)
    assert cpus_per_worker(plan, 1) == 1  # 4 workers of 1 core: a node of 4 CPUs holds them
    check_nodes_can_hold_workers(plan, "10.0.0.5:6379", [{"CPU": 2.0}, {"CPU": 4.0}])
    with pytest.raises(RunSetupError) as refused:
        check_nodes_can_hold_workers(plan, "10.0.0.5:6379", [{"CPU": 2.0}, {"CPU": 3.0, "memory": 1e9}])
    assert str(refused.value) == (
        "trainer.nnodes=1 x trainer.n_gpus_per_node=4: each node's workers need 4 CPU on one node; 0 of the 2 node(s) "
        "of the Ray cluster at 10.0.0.5:6379 have that (the largest has 3 CPU). Lower trainer.n_gpus_per_node to "
        "what a node holds, or add nodes."
    )


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("ray://10.0.0.5:10001", "is a Ray Client address, which easyrl does not support"),
        ("http://10.0.0.5:8265", "is the dashboard's address, which `ray job submit --address` takes"),
    ],
)
def test_a_ray_client_or_dashboard_address_is_refused_in_one_line(address, said):
    """Before: ray:// trained until the first scoring, then failed on the reward actors' streaming calls; http://
    ended in Ray's traceback."""
    from easyrl.trainer.main import RunSetupError, _check_reachable

    with pytest.raises(RunSetupError, match=said):
        _check_reachable(address)


def test_inside_a_ray_job_checkpoints_in_its_working_dir_copy_are_refused_before_ray(
    tiny_model_path, tmp_path, monkeypatch
):
    """`ray job submit --runtime-env` with a working_dir runs the driver in Ray's copy of that folder, deleted with
    the session and copied anew when a file changes. Before: a relative or default save path wrote the checkpoints
    there without a word, and a resubmission after any edit started afresh."""
    import json

    from easyrl.config import ConfigError, load_run_plan

    copy = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "./"}}))
    monkeypatch.delenv("EASYRL_TEST_UNSET", raising=False)
    args = [*TINY_RUN_OVERRIDES, f"worker.actor.model.model_path={tiny_model_path}"]
    for save in ([], ["trainer.save_checkpoint_path=checkpoints/rel"]):  # the default path, a relative one
        with pytest.raises(ConfigError, match=r"inside this Ray job's copy of its working_dir, which Ray deletes"):
            load_run_plan(args + save)
    shared = tmp_path / "shared" / "ckpt"
    assert load_run_plan([*args, f"trainer.save_checkpoint_path={shared}"]).config.trainer.save_checkpoint_path
    # a variable for the workers is given to the job, not to the shell that submits it
    with pytest.raises(ConfigError, match=r"set it in the job's runtime env \(env_vars\) or before its entrypoint"):
        load_run_plan([*args, f"trainer.save_checkpoint_path={shared}", "trainer.worker_env=[EASYRL_TEST_UNSET]"])
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {}}))  # no working_dir: cwd is yours
    assert load_run_plan(args).config.trainer.save_checkpoint_path.startswith(str(copy))

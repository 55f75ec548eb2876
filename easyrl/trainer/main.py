"""`easyrl train`: read the data and complete the run plan, start (or join) Ray, build the workers and the reward,
and run the PPO loop.

Everything that can fail on the user's input (config, model path, data rows, templates) fails before Ray starts.
"""

import dataclasses
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..config import RunPlan
from ..utils import device
from ..utils.logging import log_dir, setup_driver_logging
from ..utils.runtime_env import ray_job_runtime_env
from .preflight import error_text


logger = logging.getLogger(__name__)


def colocated_groups(plan: RunPlan, generation_only: bool = False) -> int:
    """Worker groups that share each device: the hybrid engine's, and the critic's beside it (SFT plans have none)."""
    return 2 if getattr(plan, "use_critic", False) and not generation_only else 1


def ray_cpus_needed(plan: RunPlan) -> int:
    """The logical CPUs the run reserves in Ray: every worker of every colocated group, the reward actors
    (`worker.reward.num_cpus`) and a `vllm` judge's engine (one CPU)."""
    config = plan.config
    groups = colocated_groups(plan)
    workers = config.trainer.nnodes * config.trainer.n_gpus_per_node * cpus_per_worker(plan, groups) * groups
    reward = getattr(config.worker, "reward", None)
    if reward is None or not reward.reward_function:  # SFT has no reward
        return workers
    return workers + reward.num_cpus + (1 if reward.judge.kind == "vllm" else 0)


def init_ray(plan: RunPlan) -> None:
    """Join the cluster named by RAY_ADDRESS; else, for one node, start a new private local cluster every time (never
    an older one still shutting down, nor a `ray start` cluster of someone else); for several nodes, join the cluster
    `ray start` made on this node."""
    import ray

    if ray.is_initialized():
        return
    from .faults import stops_end_startup

    with stops_end_startup():
        _start_ray(plan)


def _start_ray(plan: RunPlan) -> None:
    import ray

    needed = ray_cpus_needed(plan)
    nnodes = plan.config.trainer.nnodes
    joined = bool(os.environ.get("RAY_ADDRESS")) or nnodes > 1
    runtime_env = {"env_vars": worker_env_vars(plan.config.trainer.worker_env, joined)}
    if os.environ.get("RAY_ADDRESS"):
        _check_reachable(os.environ["RAY_ADDRESS"])
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env)
    elif nnodes > 1:
        try:
            ray.init(address="auto", runtime_env=runtime_env)
        except ConnectionError as error:
            raise RunSetupError(
                f"trainer.nnodes={nnodes} needs a running Ray cluster of {nnodes} nodes, and none was found on this "
                "node: run `ray start --head` here and `ray start --address=<this node>:6379` on the others, or set "
                "RAY_ADDRESS to the cluster's address."
            ) from error
    else:
        # address="local": a plain ray.init() would join the cluster recorded by an earlier `ray start` (even a dead
        # one). Oversubscribe logical CPUs on small machines: workers, reward actors and the driver take turns. A
        # cluster smaller than the run's reservations would keep a reward actor waiting for a CPU that never frees
        # (2 cores, a critic beside the actor on 2 workers: 4 CPUs for the workers, 1 more for the reward).
        try:
            ray.init(
                address="local",
                num_cpus=max(os.cpu_count() or 1, 4, needed),
                include_dashboard=False,
                runtime_env=runtime_env,
            )
        except Exception as error:  # Ray's own start-up failures (a node that timed out) carry no type of theirs
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise RunSetupError(
                f"Ray could not start a local cluster ({first_line}). "
                "It happens on a machine under heavy load, or while the processes of a killed run are still "
                "exiting (they do within about 2 minutes): run the command again."
            ) from error
    if joined:
        address = ray.get_runtime_context().gcs_address
        alive = sum(1 for node in ray.nodes() if node.get("Alive"))
        logger.warning("Joined the Ray cluster at %s: %d node(s) alive.", address, alive)
        if alive < nnodes:
            ray.shutdown()
            raise RunSetupError(
                f"trainer.nnodes={nnodes} but the Ray cluster at {address} has {alive} node(s) alive: start the "
                f"others with `ray start --address={address}`, or lower trainer.nnodes. (With RAY_ADDRESS unset, "
                "the newest cluster started on this machine is joined, whoever started it.)"
            )
        try:
            check_nodes_can_hold_workers(
                plan, address, [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
            )
        except RunSetupError:
            ray.shutdown()
            raise
        total = ray.cluster_resources().get("CPU", 0)
        if total < needed:
            logger.warning(
                "The Ray cluster has %g CPUs and this run reserves %d (%d worker(s) x their cores, and "
                "worker.reward.num_cpus for the reward actors): what does not fit waits for a CPU, and fails after "
                "300 s unless the cluster grows. Lower trainer.n_gpus_per_node or worker.reward.num_cpus, or add "
                "nodes.",
                total,
                needed,
                plan.world_size,
            )


# what every worker gets of the driver's environment besides trainer.worker_env (a local cluster's workers inherit
# all of it; on a cluster started with `ray start` they have that command's environment)
FORWARDED_ENV_PREFIXES = ("EASYRL_", "VLLM_", "HF_", "TORCHDYNAMO_")


def worker_env_vars(names: list[str], joined: bool) -> dict[str, str]:
    """The variables the run's runtime env sets on every worker and reward actor: the forwarded prefixes, the named
    `trainer.worker_env`, and on a joined cluster the driver's PYTHONPATH ahead of the node's own (so that a reward or
    tools file importing a module beside it finds it there as here). Inside a Ray job (`ray job submit
    --runtime-env`), a variable the job's runtime env sets is the job's: Ray refuses a ray.init that sets any of the
    same variables, even to the same value."""
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES) or k in names}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    job = ray_job_runtime_env()
    if joined and os.environ.get("PYTHONPATH") and job is None:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"] + ":${PYTHONPATH}"  # Ray expands ${...} on the node
    job_env = (job or {}).get("env_vars") or {}
    return {k: v for k, v in env.items() if k not in job_env}


def check_nodes_can_hold_workers(plan: RunPlan, address: str, nodes: list[dict[str, float]]) -> None:
    """Each node's workers are one STRICT_PACK placement group: a cluster with fewer nodes able to hold
    trainer.n_gpus_per_node workers than trainer.nnodes would wait for them until the reservation times out.
    ``nodes``: the resources of each live node (``ray.nodes()``' "Resources")."""
    trainer = plan.config.trainer
    groups = colocated_groups(plan)
    per_node = {"CPU": float(trainer.n_gpus_per_node * cpus_per_worker(plan, groups) * groups)}
    if (resource := device.get_ray_resource_name()) != "CPU":
        per_node[resource] = float(trainer.n_gpus_per_node)
    fitting = sum(all(held.get(name, 0) >= amount for name, amount in per_node.items()) for held in nodes)
    if fitting < trainer.nnodes:
        largest = max(nodes, key=lambda held: tuple(held.get(name, 0) for name in per_node), default={})
        raise RunSetupError(
            f"trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node}: each node's workers "
            f"need {_resources_text(per_node)} on one node; {fitting} of the {len(nodes)} node(s) of the Ray cluster "
            f"at {address} have that (the largest has {_resources_text({n: largest.get(n, 0) for n in per_node})}). "
            "Lower trainer.n_gpus_per_node to what a node holds, or add nodes."
        )


def _resources_text(amounts: dict[str, float]) -> str:
    return ", ".join(f"{amount:g} {name}" for name, amount in amounts.items())


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """RAY_ADDRESS names a cluster that answers: Ray itself retries an address where nothing listens for minutes,
    saying only that it cannot reach it."""
    import socket

    if address in ("auto", "local"):
        return
    scheme = address.split("://", 1)[0].lower() if "://" in address else ""
    if scheme == "ray":  # Ray Client: the streaming calls of the reward actors are not supported through it
        raise RunSetupError(
            f"RAY_ADDRESS={address} is a Ray Client address, which easyrl does not support: run easyrl on a node of the "
            "cluster with RAY_ADDRESS=<head>:6379 (the GCS address), or submit it with `ray job submit`."
        )
    if scheme in ("http", "https"):
        raise RunSetupError(
            f"RAY_ADDRESS={address} is the dashboard's address, which `ray job submit --address` takes; to run easyrl "
            "on the cluster directly give the GCS address, RAY_ADDRESS=<head>:6379."
        )
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    host = host.strip("[]")  # an IPv6 address is written [::1]:6379
    if not host or not port.isdigit():
        raise RunSetupError(f"RAY_ADDRESS={address} is not an address Ray joins: give host:port, e.g. 10.0.0.5:6379.")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise RunSetupError(
            f"RAY_ADDRESS={address}: nothing answers at {host}:{port} ({error}). Check the cluster with `ray status "
            f"--address={address}`, or unset RAY_ADDRESS to start a private cluster on this machine."
        ) from error


def cpus_per_worker(plan: RunPlan, groups: int) -> int:
    """On CPU each worker computes with the cores of its share of the node; on GPU one core feeds each device.

    The ``groups`` colocated (actor + critic) take turns on the same cores, so each gets the share divided among them.
    """
    if device.is_cuda_available():
        return 1
    return max(1, (os.cpu_count() or 1) // (plan.config.trainer.n_gpus_per_node * groups))


@dataclass
class RunData:
    """What the driver reads before Ray starts: the tokenizer/processor, the loaders, and the completed plan."""

    plan: RunPlan
    tokenizer: Any
    processor: Any
    train_loader: Any
    val_loader: Any
    reward_fn: Any = None  # the loaded reward function (see load_run_reward), handed on to the scorer


def load_model_side(plan: RunPlan) -> tuple[Any, Any, Any]:
    """Resolve built-in model paths; (tokenizer, processor, the actor's HF config), read on the driver."""
    from ..config.validate import check_model_sources
    from ..data.tokenizer import load_tokenizer_and_processor
    from ..demo.builtin_models import resolve_model_path
    from ..models.hf_config import load_hf_config

    config = plan.config
    check_model_sources(config)  # a hub id with no hub in reach: an error now, not after a minute of retries
    for model in (config.worker.actor.model, config.worker.critic.model):
        model.model_path = resolve_model_path(model.model_path)
        model.tokenizer_path = resolve_model_path(model.tokenizer_path)
    model = config.worker.actor.model
    tokenizer, processor = load_tokenizer_and_processor(model.tokenizer_path, model.trust_remote_code)
    # the model's config as the workers load it: a checkpoint that needs its own code stops here, before Ray
    return tokenizer, processor, load_hf_config(model, "causal_lm")


def load_run_reward(config: Any) -> Any:
    """The run's reward function, imported once, on the driver (None without worker.reward.reward_function): the
    datasets ask it whether to carry every column of a row (a function written for TRL gets them all, as TRL's
    GRPOTrainer hands them over), and the run's scorer then uses it (a file is not imported twice)."""
    reward = config.worker.reward
    if not reward.reward_function:
        return None
    from ..workers.reward.judge import unreachable_judge
    from ..workers.reward.loader import load_reward_function

    if problem := unreachable_judge(reward.judge):  # said in a second, not after the workers' start and a rollout
        logger.warning("The judge: %s", problem)

    return load_reward_function(
        reward.reward_function, reward.reward_function_kwargs, reward.reward_weights, reward.reward_type
    )


def _takes_columns(reward_fn: Any) -> bool:
    from ..workers.reward.loader import TRL_REWARD_TYPE

    return reward_fn is not None and reward_fn.uses(TRL_REWARD_TYPE)


def _trl_only(reward_fn: Any) -> bool:
    """Every function of the reward is written for TRL (a combination with an EasyR1 or verl one reads answers)."""
    from ..workers.reward.loader import TRL_REWARD_TYPE

    parts = getattr(reward_fn, "parts", [reward_fn])
    return reward_fn is not None and all(part.reward_type == TRL_REWARD_TYPE for part in parts)


def dataset_options(config: Any, reward_fn: Any) -> dict[str, Any]:
    """The datasets' options beyond the data keys: ``tools``, the schemas the chat template advertises (multi-turn
    rollouts with tools or a tool environment's methods), ``carry_columns`` for a reward function written for TRL
    and an environment, whose reset gets the row's columns (TRL's environment_factory; a stepped one's row), and ``env_prompts`` (a
    tool environment's reset may give a row its whole task: data without a prompt column is accepted)."""
    multi_turn = config.worker.rollout.multi_turn
    tools, tool_env = None, False
    if multi_turn.tools or multi_turn.env:
        from ..workers.tool_files import has_tool_env, tool_schemas

        tool_env = has_tool_env(multi_turn.env)
        tools = tool_schemas(multi_turn.tools, multi_turn.env) or None
    return {
        "tools": tools,
        # a reward function written for TRL and an environment's reset get the row's other columns
        "carry_columns": _takes_columns(reward_fn) or bool(multi_turn.env),
        "env_prompts": tool_env,
        # the question a judge reads; an environment's reset may write or extend the prompt: the decoded one then
        "carry_prompt_messages": config.worker.reward.judge.kind != "none" and not multi_turn.env,
        "max_images": config.worker.rollout.limit_images,
        # TRL's contract has no ground truth: its prompt-only data trains with functions written for it alone
        "answer_optional": _trl_only(reward_fn),
    }


def check_reward_columns(config: Any, reward_fn: Any, loaders: dict[str, Any]) -> None:
    """A reward function written for TRL that takes a parameter the data has no column for is refused now, before
    Ray starts, not at the first batch (``loaders``: config key -> loader or None)."""
    if not _takes_columns(reward_fn):
        return
    multi_turn = config.worker.rollout.multi_turn
    rollout_fields = []  # what a multi-turn rollout hands the reward function beside the columns
    if multi_turn.enabled:
        rollout_fields.append("messages")
    if multi_turn.env:
        from ..workers.tool_files import has_tool_env

        rollout_fields += ["env_reward", *(["environments"] if has_tool_env(multi_turn.env) else [])]
    for key, loader in loaders.items():
        if loader is not None:
            reward_fn.check_columns(loader.dataset.carried_columns, config.data.answer_key, key, rollout_fields)


def check_rollout_takes_media(config: Any, loaders: dict[str, Any]) -> None:
    """`worker.rollout.name=hf` generates from text alone: data with pictures or videos is refused before Ray starts
    (``loaders``: config key -> loader or None), not at the first batch that holds one."""
    if config.worker.rollout.name != "hf":
        return
    for key, loader in loaders.items():
        count = getattr(loader and loader.dataset, "rows_with_media", 0)
        if count:
            raise ValueError(
                f"worker.rollout.name=hf generates from text prompts only, and {count} of the {len(loader.dataset)} "
                f"rows of {key} have pictures or videos. Use worker.rollout.name=vllm for a vision-language model's "
                "image / video data."
            )


def prepare_run_data(plan: RunPlan) -> RunData:
    """Resolve built-in model paths, load the tokenizer/processor and the data, and count the training steps."""
    from ..data.dataset import SKIPPED_ROWS_FILE, write_skipped_rows
    from ..data.loader import create_dataloaders
    from .preflight import check_head_splits, check_lora_targets

    config = plan.config
    tokenizer, processor, model_config = load_model_side(plan)
    check_head_splits(plan, model_config)
    check_lora_targets(plan)
    reward_fn = load_run_reward(config)
    train_loader, val_loader = create_dataloaders(
        config.data, tokenizer, processor, model_config=model_config, **dataset_options(config, reward_fn)
    )
    loaders = {"data.train_files": train_loader, "data.val_files": val_loader}
    check_reward_columns(config, reward_fn, loaders)
    check_rollout_takes_media(config, loaders)
    write_skipped_rows(
        os.path.join(config.trainer.save_checkpoint_path, SKIPPED_ROWS_FILE),
        [loader and loader.dataset for loader in (train_loader, val_loader)],
    )
    plan = plan.with_training_steps(len(train_loader))
    if val_loader is not None:
        plan = dataclasses.replace(plan, validation_prompts=len(val_loader.dataset))
    _say_rows_left_over(plan, len(train_loader.dataset))
    return RunData(plan, tokenizer, processor, train_loader, val_loader, reward_fn)


def _say_rows_left_over(plan: RunPlan, rows: int) -> None:
    """The train loader draws mini-batches (data.mini_rollout_batch_size prompts) when they are set."""
    from ..data.loader import say_rows_left_over

    config = plan.config
    key = "data.mini_rollout_batch_size" if config.data.mini_rollout_batch_size else "data.rollout_batch_size"
    say_rows_left_over(rows, plan.generation_batch_size, key, config.data.shuffle)


class RunWorkers:
    """The worker groups of a run in their resource pool: started together, killed together, and started afresh
    when a worker dies and trainer.max_restarts allows (``restart``, which the trainer calls)."""

    def __init__(self, plan: RunPlan, generation_only: bool = False, stop: Any = None) -> None:
        """``generation_only``: one group of ``plan.generation_worker_role`` (`easyrl generate` / `easyrl eval`);
        ``stop``: the run's StopRequest, which ends a wait for the cluster's resources."""
        from ..controller.resource_pool import ResourcePool

        self.plan = plan
        self.generation_only = generation_only
        groups = colocated_groups(plan, generation_only)
        self.pool = ResourcePool.from_trainer_config(
            plan.config.trainer.nnodes,
            plan.config.trainer.n_gpus_per_node,
            max_colocate_count=groups,
            cpus_per_worker=cpus_per_worker(plan, groups),
            while_waiting=stop.raise_if_requested if stop is not None else None,
        )
        self.groups: list[Any] = []

    def start(self) -> Any:
        """Start and initialise every group; returns the trainer's ``WorkerGroups``."""
        from ..controller.worker_group import RayWorkerGroup
        from ..workers.fsdp_worker import FSDPWorker
        from .ray_trainer import WorkerGroups

        plan, config = self.plan, self.plan.config
        run_dir = config.trainer.save_checkpoint_path
        try:
            # The hybrid engine: actor, rollout and reference share one process per device.
            role, prefix = (
                (plan.generation_worker_role, "rollout")
                if self.generation_only
                else (plan.worker_role, "actor_rollout")
            )
            actor_rollout = RayWorkerGroup(self.pool, FSDPWorker, config.worker, role, run_dir, name_prefix=prefix)
            self.groups.append(actor_rollout)
            actor_rollout.init_model()
            critic = None
            if plan.use_critic and not self.generation_only:
                critic = RayWorkerGroup(self.pool, FSDPWorker, config.worker, "critic", run_dir, name_prefix="critic")
                self.groups.append(critic)
                critic.init_model()
        except BaseException as error:
            self.kill()
            refusal = _worker_setup_refusal(error)
            if refusal is not None:
                logging.getLogger().info("A worker could not start:", exc_info=True)
                where = f" (traceback in {log_dir(run_dir) / 'driver.log'})" if run_dir else ""
                raise RunSetupError(f"a worker could not start: {error_text(refusal)}{where}") from error
            raise
        return WorkerGroups(
            actor_rollout=actor_rollout, ref=actor_rollout if plan.use_reference else None, critic=critic
        )

    def reward_model_group(self) -> Any:
        """The group whose workers host the reward model (the hybrid engine's; a new one after each restart)."""
        if not self.groups:
            raise RuntimeError("The workers are not running: no reward model to score with.")
        return self.groups[0]

    def reward_scorer(self, tokenizer: Any, reward_fn: Any = None) -> Any:
        """The run's `RewardScorer`, scoring with the reward model on these workers when the plan has one;
        ``reward_fn``: the reward function already loaded on the driver (None: the scorer loads it)."""
        from ..workers.reward.scorer import RewardScorer

        config = self.plan.config
        return RewardScorer(
            config.worker.reward,
            tokenizer,
            reward_fn=reward_fn,
            run_dir=config.trainer.save_checkpoint_path,
            reward_model_group=self.reward_model_group if self.plan.use_reward_model else None,
            answer_key=config.data.answer_key,
            prompt_key=config.data.prompt_key,
        )

    def kill(self, graceful_timeout_s: float = 10.0) -> None:
        for group in self.groups:
            group.kill(graceful_timeout_s)
        self.groups = []

    def restart(self) -> Any:
        # the survivors of a death are idle (their calls failed) or stuck in a collective: no long goodbye
        self.kill(graceful_timeout_s=2.0)
        return self.start()

    def release(self) -> None:
        self.kill()
        self.pool.release()


def start_tracker(config: Any, config_dict: dict, total_steps: int | None) -> Any:
    """The loggers of `trainer.logger`, writing under `trainer.save_checkpoint_path`; a run that will resume from a
    checkpoint continues the tracker runs of the attempt that wrote it."""
    from .checkpoint import resolve_resume_path
    from .loggers import Tracker

    return Tracker(
        loggers=config.trainer.logger,
        project_name=config.trainer.project_name,
        experiment_name=config.trainer.experiment_name,
        config_dict=config_dict,
        save_dir=config.trainer.save_checkpoint_path,
        total_steps=total_steps,
        resume=resolve_resume_path(config.trainer) is not None,
        val_only=config.trainer.val_only,
    )


def build_trainer(plan: RunPlan, data: RunData | None = None, stop: Any = None, tracker: Any = None) -> Any:
    """Everything a run needs, wired together; the caller owns shutdown via `trainer.on_shutdown()`.

    ``stop``: a ``StopRequest`` the trainer reads between steps (see ``easyrl.trainer.faults``); ``tracker``: the
    run's Tracker when the caller started it (`easyrl train` does, before Ray), else it is started here."""
    from .ray_trainer import PPOTrainer

    data = data or prepare_run_data(plan)
    plan, config = data.plan, data.plan.config
    # the trackers first: one that cannot start (no credentials, no network) fails in seconds, before the workers
    # spend minutes loading models and starting engines
    if tracker is None:
        tracker = start_tracker(config, _config_dict(plan), plan.training_steps)
    run_workers = RunWorkers(plan, stop=stop)
    try:
        workers = run_workers.start()
        reward = run_workers.reward_scorer(data.tokenizer, data.reward_fn)
    except BaseException:
        run_workers.release()
        tracker.finish()
        raise
    trainer = PPOTrainer(
        plan,
        data.tokenizer,
        data.train_loader,
        data.val_loader,
        workers,
        reward,
        reward,
        tracker,
        stop=stop,
        restart_workers=run_workers.restart,
    )
    trainer.on_shutdown = lambda: (run_workers.release(), reward.shutdown(), tracker.finish())
    return trainer


def _config_dict(plan: RunPlan) -> dict:
    from ..config import config_to_dict

    return config_to_dict(plan.config)


def _write_ray_timeline(path: str | None) -> None:
    """`trainer.ray_timeline`: Ray's task timeline as a chrome://tracing JSON file."""
    if not path:
        return
    import ray

    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ray.timeline(filename=path)
    print(f"Ray timeline written to {path}")


def _worker_setup_refusal(error: BaseException) -> BaseException | None:
    """The error a worker raised while setting up, when it is one that names what to change (a ValueError, KeyError or
    OSError: a model the engine cannot run, an adapter it cannot serve, a file it cannot read), else None (a bug, or
    a process that died, keeps its traceback)."""
    import ray

    if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause, (ValueError, KeyError, OSError)):
        return error.cause
    return None


class RunSetupError(RuntimeError):
    """The run cannot start with this data or model (found before Ray starts); the message names the key and fix."""


@contextmanager
def setup_errors_reported(log_file: str | None) -> Iterator[None]:
    """Data, model and tracker errors (which name their key, file and row) raised inside become one `RunSetupError`
    line; the traceback, for a bug report, goes at INFO to the log file only (as for an interrupted run)."""
    from .loggers import LoggerStartError, MissingLoggerPackage  # a tracker that cannot start its run

    try:
        yield
    except (ValueError, KeyError, OSError, LoggerStartError, MissingLoggerPackage) as error:
        logging.getLogger().info("The run could not start:", exc_info=True)
        where = f" (traceback in {log_file})" if log_file is not None else ""
        raise RunSetupError(error_text(error) + where) from error


def _say_the_checkpoint_found(plan: RunPlan) -> None:
    """Say at once which checkpoint the run will resume from: reading a large dataset comes first and can take
    minutes, and the resume is otherwise said only once Ray has started."""
    from .checkpoint import CheckpointError, passed_start_reason, resolve_resume_path

    try:
        path = resolve_resume_path(plan.config.trainer)
    except CheckpointError:
        return  # said, with what to do, once the data is read (check_resume_point)
    if path is not None:
        logger.info("Found the checkpoint %s: the run resumes from it once the data is read and checked.", path)
    load = plan.config.trainer.load_checkpoint_path
    if path is not None and load and os.path.abspath(load) != path:
        logger.warning("trainer.load_checkpoint_path=%s %s", load, passed_start_reason(plan.config.trainer, path))


def _resume_point(plan: RunPlan) -> tuple[str | None, int, str | None]:
    """(the checkpoint the run resumes from or None, the step it resumes at (0: afresh), what to say when it is at or
    past the run's last step: trainer.max_steps lowered below it leaves nothing to train, and Ray and the engine are
    not started for nothing)."""
    from .preflight import nothing_left_to_train, resume_point, start_step

    # no checkpoint to resume from, a fresh start among an earlier run's, or a checkpoint whose actor this config
    # cannot resume (LoRA or not, its rank / alpha / modules, its base model): one line, before Ray starts
    try:
        path = resume_point(plan.config)
    except ValueError as error:
        raise RunSetupError(str(error)) from error
    step = start_step(path)
    return path, step, None if path is None else nothing_left_to_train(plan, path, step)


# held by the run writing a folder (run_folder_held); it names the holder
RUN_LOCK_FILE = ".run.lock"


@contextmanager
def run_folder_held(folder: str) -> Iterator[None]:
    """One run at a time writes a run folder: a second (a job resubmitted while the first runs, two jobs of one
    config) would resume the first one's checkpoint and write its steps again. An exclusive lock on
    ``<folder>/.run.lock`` while the run lives; the kernel drops it when the process ends, by kill -9 too."""
    import fcntl
    import socket
    import time

    try:
        os.makedirs(folder, exist_ok=True)
        handle = open(os.path.join(folder, RUN_LOCK_FILE), "a+", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as error:
        raise RunSetupError(
            f"trainer.save_checkpoint_path: cannot write to {folder} ({error}); give a folder this user can write."
        ) from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RunSetupError(
                f"Another easyrl run is writing to {folder} ({holder}): two runs in one folder would train the same "
                "steps twice. Wait for it to end (or stop it), or give this run its own trainer.save_checkpoint_path."
            ) from None
        except OSError as error:  # a filesystem without locks: the run goes on unguarded
            logger.info("The run folder %s cannot be locked (%s); nothing stops a second run using it.", folder, error)
        else:
            handle.truncate(0)
            handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            handle.flush()
        yield


def run_training(plan: RunPlan) -> dict[str, float]:
    """`easyrl train`. A stop signal or a worker that died (with no restart left) ends it with one line saying what
    happened and where the last checkpoint is, and ``SystemExit`` with a non-zero status (see ``faults``)."""
    with run_folder_held(plan.config.trainer.save_checkpoint_path):
        return _run_training(plan)


def _run_training(plan: RunPlan) -> dict[str, float]:
    from ..config import config_to_yaml
    from .faults import RunInterrupted, StopRequest, print_interruption
    from .run_config import record_run_config

    # the console shows the run; the engine's and libraries' chatter goes to <run dir>/logs
    log_file = setup_driver_logging(plan.config.trainer.save_checkpoint_path)
    for note in plan.notes:
        logger.warning(note)
    _say_the_checkpoint_found(plan)
    with setup_errors_reported(log_file):
        data = prepare_run_data(plan)  # bad rows, templates or model paths fail here, before Ray starts
    plan = data.plan
    resumed_from, step, finished = _resume_point(plan)
    logger.info("Run plan:\n%s", plan.describe(step))
    if finished is not None:
        print(finished)
        return {}
    val_only = plan.config.trainer.val_only
    record_run_config(
        plan.config.trainer.save_checkpoint_path,
        config_to_yaml(plan.config),
        "validation" if val_only else "run",
        resumed_from,
        val_only,
    )
    with setup_errors_reported(log_file):  # a tracker that cannot start its run: one line, before Ray starts
        tracker = start_tracker(plan.config, _config_dict(plan), plan.training_steps)
    try:
        init_ray(plan)
    except BaseException:
        tracker.finish()
        raise
    interrupted: RunInterrupted | None = None
    # after ray.init, whose own SIGTERM handler would tear the cluster down at once
    with StopRequest().installed() as stop:
        stop.starting = True
        try:
            trainer = build_trainer(plan, data, stop, tracker)
        except RunInterrupted as error:  # a stop while the workers waited for the cluster's resources
            print_interruption(error)
            raise SystemExit(error.exit_code) from None
        stop.starting = False
        try:
            metrics = trainer.fit()
        except RunInterrupted as error:
            interrupted = error
        finally:
            try:
                _write_ray_timeline(plan.config.trainer.ray_timeline)
            finally:
                trainer.on_shutdown()
    if interrupted is not None:
        draw_curves(plan.config.trainer)  # the steps so far: a stopped run is resumed, and read before that
        print_interruption(interrupted)
        raise SystemExit(interrupted.exit_code)
    save_dir = plan.config.trainer.save_checkpoint_path
    if plan.config.trainer.val_only:
        print(f"Validated only (trainer.val_only): no checkpoint was written; the scores are in {save_dir}")
    else:
        print(f"Checkpoints are in {save_dir}")
    draw_curves(plan.config.trainer, summary=True)
    return metrics


def draw_curves(trainer: Any, summary: bool = False) -> None:
    """Draw ``curves.png`` beside ``metrics.jsonl`` (logger `file`) and say where; ``summary``: also print each score
    at the start and at the end."""
    metrics_file = os.path.join(trainer.save_checkpoint_path, "metrics.jsonl")
    if "file" not in trainer.logger or not os.path.isfile(metrics_file):
        return
    from .plot import plot_training_curves, summarize_progress

    print(f"Metrics are in {metrics_file}; curves in {plot_training_curves(metrics_file)}")
    for line in summarize_progress(metrics_file) if summary else []:
        print(f"  {line}")

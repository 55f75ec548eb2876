"""`easyrl train`: start (or join) Ray, build the data, the workers and the reward, and run the PPO loop."""

import logging
import os
from typing import Any

from ..config import PPOConfig
from ..utils import device


logger = logging.getLogger(__name__)


def init_ray(config: PPOConfig) -> None:
    """Join the cluster named by RAY_ADDRESS (multi-node), or start a local one sized for this machine."""
    import ray

    if ray.is_initialized():
        return
    env_vars = {k: v for k, v in os.environ.items() if k.startswith(("EASYRL_", "VLLM_", "HF_", "TORCHDYNAMO_"))}
    env_vars.setdefault("TOKENIZERS_PARALLELISM", "false")
    runtime_env = {"env_vars": env_vars}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env)
    else:
        # Oversubscribe logical CPUs on small machines: workers, reward actors and the driver mostly take turns.
        ray.init(num_cpus=max(os.cpu_count() or 1, 4), include_dashboard=False, runtime_env=runtime_env)


def cpus_per_worker(config: PPOConfig, colocated_groups: int) -> int:
    """On CPU each worker computes with the cores of its share of the node; on GPU one core feeds each device.

    Colocated groups (actor + critic) take turns on the same cores, so each gets the share divided among them.
    """
    if device.is_cuda_available():
        return 1
    return max(1, (os.cpu_count() or 1) // (config.trainer.n_gpus_per_node * colocated_groups))


def build_trainer(config: PPOConfig) -> Any:
    """Everything a run needs, wired together; the caller owns shutdown via `trainer.shutdown()`."""
    from ..controller.resource_pool import ResourcePool
    from ..controller.worker_group import RayWorkerGroup
    from ..data.loader import create_dataloaders
    from ..data.tokenizer import load_tokenizer_and_processor
    from ..demo.builtin_models import resolve_model_path
    from ..workers.fsdp_worker import FSDPWorker
    from ..workers.reward.scorer import RewardScorer
    from .loggers import Tracker
    from .ray_trainer import PPOTrainer, WorkerGroups

    model = config.worker.actor.model
    model.model_path = resolve_model_path(model.model_path)
    model.tokenizer_path = resolve_model_path(model.tokenizer_path)
    critic_model = config.worker.critic.model
    critic_model.model_path = resolve_model_path(critic_model.model_path)
    critic_model.tokenizer_path = resolve_model_path(critic_model.tokenizer_path)

    tokenizer, processor = load_tokenizer_and_processor(model.tokenizer_path, model.trust_remote_code)
    train_loader, val_loader = create_dataloaders(config.data, tokenizer, processor)
    steps = len(train_loader) * config.trainer.total_epochs
    if config.trainer.max_steps is not None:
        steps = min(steps, config.trainer.max_steps)
    config.worker.actor.optim.training_steps = steps
    config.worker.critic.optim.training_steps = steps

    use_critic = config.algorithm.adv_estimator == "gae"
    use_reference = not config.algorithm.disable_kl
    colocated_groups = 2 if use_critic else 1
    pool = ResourcePool.from_trainer_config(
        config.trainer.nnodes,
        config.trainer.n_gpus_per_node,
        max_colocate_count=colocated_groups,
        cpus_per_worker=cpus_per_worker(config, colocated_groups),
    )
    groups: list[Any] = []
    try:
        # The hybrid engine: actor, rollout and reference share one process per device.
        role = "actor_rollout_ref" if use_reference else "actor_rollout"
        actor_rollout = RayWorkerGroup(pool, FSDPWorker, config.worker, role, name_prefix="actor_rollout")
        groups.append(actor_rollout)
        actor_rollout.init_model()
        critic = None
        if use_critic:
            critic = RayWorkerGroup(pool, FSDPWorker, config.worker, "critic", name_prefix="critic")
            groups.append(critic)
            critic.init_model()
        reward = RewardScorer(config.worker.reward, tokenizer)
        tracker = Tracker(
            loggers=config.trainer.logger,
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            config_dict=_config_dict(config),
            save_dir=config.trainer.save_checkpoint_path,
            total_steps=steps,
        )
    except BaseException:
        for group in groups:
            group.kill()
        pool.release()
        raise
    workers = WorkerGroups(actor_rollout=actor_rollout, ref=actor_rollout if use_reference else None, critic=critic)
    trainer = PPOTrainer(config, tokenizer, train_loader, val_loader, workers, reward, reward, tracker)
    trainer.on_shutdown = lambda: (
        [g.kill() for g in groups],
        pool.release(),
        reward.shutdown(),
        tracker.finish(),
    )
    return trainer


def _config_dict(config: PPOConfig) -> dict:
    from ..config import config_to_dict

    return config_to_dict(config)


def run_training(config: PPOConfig) -> dict[str, float]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    init_ray(config)
    trainer = build_trainer(config)
    try:
        metrics = trainer.fit()
    finally:
        trainer.on_shutdown()
    save_dir = config.trainer.save_checkpoint_path
    print(f"Checkpoints are in {save_dir}")
    metrics_file = os.path.join(save_dir, "metrics.jsonl")
    if "file" in config.trainer.logger and os.path.isfile(metrics_file):
        from .plot import plot_training_curves, summarize_progress

        print(f"Metrics are in {metrics_file}; reward curves in {plot_training_curves(metrics_file)}")
        for line in summarize_progress(metrics_file):
            print(f"  {line}")
    return metrics

"""Learning: GRPO on the tiny random model raises a reward it can learn in a few steps.

The reward (tests/data/word_start_reward.py) is the share of response tokens that start a new word. Sampling from
the 8 most likely tokens (top_k=8) gives each position a handful of candidates, some word-initial and some not, so
groups differ in score from the first step and the policy can learn to prefer the word-initial candidates.
"""

import statistics

import pytest

from tests.fixtures.trainer_runs import TINY_RUN_OVERRIDES, metrics_by_step, train_args


LEARNING_OVERRIDES = TINY_RUN_OVERRIDES + [
    "trainer.n_gpus_per_node=1",
    "worker.actor.global_batch_size=2",  # two optimizer steps per batch: old log-probs come from their own pass
    "worker.actor.micro_batch_size_per_device_for_update=16",
    "worker.actor.micro_batch_size_per_device_for_experience=32",
    "worker.rollout.n=8",
    "worker.rollout.top_k=8",
    "worker.rollout.temperature=1.0",
    "worker.actor.optim.lr=5e-3",
    "worker.actor.optim.lr_warmup_steps=0",
    "data.val_files=",
    "trainer.max_steps=8",
    "trainer.val_freq=0",
    "trainer.save_freq=0",
    "trainer.find_last_checkpoint=false",
]


@pytest.mark.timeout(600)
def test_grpo_raises_a_learnable_reward_within_eight_steps(ray_cluster, tiny_model_path, tmp_path):
    from easyrl.config import load_run_plan
    from easyrl.trainer.main import build_trainer

    save_dir = tmp_path / "checkpoints"
    trainer = build_trainer(load_run_plan(train_args(tiny_model_path, save_dir, LEARNING_OVERRIDES)))
    try:
        trainer.fit()
    finally:
        trainer.on_shutdown()

    rows = [row for _, row in sorted(metrics_by_step(save_dir).items())]
    assert all(row["timing/old_log_probs"] > 0.0 and "actor/entropy" in row for row in rows)
    rewards = [row["reward/overall"] for row in rows]
    assert len(rewards) == 8
    first, last = statistics.mean(rewards[:2]), statistics.mean(rewards[-3:])
    assert last >= first + 0.15, f"reward per step: {rewards}"
    assert last >= 0.9, f"reward per step: {rewards}"

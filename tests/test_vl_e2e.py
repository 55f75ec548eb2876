"""End to end with images: `easyrl train` on the built-in shapes task with a tiny random Qwen2.5-VL (Ray, 2 FSDP2
workers on gloo, vLLM rollout with pictures), 2 GRPO steps from examples/shapes_tiny_vl_grpo.yaml.

Slow set: tests/test_vl_user_data.py makes the same checks (every step logged, finite losses, a gradient, the actor's
log-probs equal vLLM's) in the default suite, on pictures from files on disk with Qwen2.5-VL and Qwen3-VL."""

import math

import pytest

from tests.fixtures.trainer_runs import REPO_ROOT, WORD_START_REWARD, metrics_by_step, run_training, train_args


RUN_TIMEOUT = 600
VL_RUN_OVERRIDES = [
    f"config={REPO_ROOT / 'examples' / 'shapes_tiny_vl_grpo.yaml'}",
    f"data.format_prompt={REPO_ROOT / 'format_prompt' / 'r1v.jinja'}",
    # a reward that differs within every group from the first step, so that the update has a gradient
    f"worker.reward.reward_function={WORD_START_REWARD}:compute_score",
    "worker.reward.num_cpus=0",
    "worker.rollout.disable_tqdm=true",
    "worker.rollout.kv_cache_memory_bytes=67108864",
    "trainer.n_gpus_per_node=2",
    "trainer.max_steps=2",
    "trainer.val_freq=-1",
    "trainer.save_freq=-1",
]


@pytest.fixture(scope="module")
def vl_run_metrics(tmp_path_factory) -> dict[int, dict]:
    from easyrl.testing.tiny_vlms import build_tiny_vlm

    root = tmp_path_factory.mktemp("vl_grpo_run")
    model_path = build_tiny_vlm("qwen2_5_vl", root / "model")
    run_training(train_args(model_path, root / "checkpoints", VL_RUN_OVERRIDES), root / "train.log", RUN_TIMEOUT)
    return metrics_by_step(root / "checkpoints")


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_image_grpo_run_logs_every_step_with_finite_losses_and_a_gradient(vl_run_metrics):
    assert sorted(vl_run_metrics) == [1, 2]
    for step, row in vl_run_metrics.items():
        for name in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "reward/overall"):
            assert math.isfinite(row[name]), f"step {step}: {name} = {row[name]}"
        assert row["actor/grad_norm"] > 0.0, f"step {step}: no gradient reached the policy"


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_actor_log_probs_with_pictures_match_the_vllm_rollout(vl_run_metrics):
    # the actor sees each sample's pictures through the processor, vLLM through its own input pipeline (fp32)
    for step, row in vl_run_metrics.items():
        assert row["rollout/logprob_abs_diff/mean"] < 1e-4, f"step {step}: {row['rollout/logprob_abs_diff/mean']}"

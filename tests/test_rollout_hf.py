"""``worker.rollout.name=hf``: HF generate on the FSDP actor gives the same contract and the same greedy tokens."""

import pytest

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.controller import RayWorkerGroup, ResourcePool
from easyrl.workers.fsdp_worker import FSDPWorker
from easyrl.workers.rollout.base import GenerationRequest, rollout_logprob_mismatch
from tests.fsdp_helpers import load_hf_causal_lm
from tests.rollout_helpers import (
    RESPONSE_LENGTH,
    hf_greedy_responses,
    make_prompts,
    response_lists,
    rollout_worker_config,
)


@pytest.fixture(scope="module")
def two_hf_workers(ray_cluster, tiny_model_path):
    """Two ranks sharding the actor: every decoding step is a collective, so ranks must stay in step."""
    pool = ResourcePool(process_on_nodes=[2])
    config = rollout_worker_config(tiny_model_path, 2, name="hf")
    group = RayWorkerGroup(pool, FSDPWorker, config, "actor_rollout", name_prefix="hf_rollout")
    try:
        group.init_model()
        yield group
    finally:
        group.kill()
        pool.release()


@pytest.mark.timeout(300)
def test_hf_rollout_greedy_equals_plain_hf_greedy(two_hf_workers, tokenizer, tiny_model_path):
    prompts = make_prompts(tokenizer)
    out = two_hf_workers.generate_sequences(prompts, GenerationRequest(sampling_override={"temperature": 0.0}))
    expected = hf_greedy_responses(load_hf_causal_lm(tiny_model_path), prompts, tokenizer.eos_token_id)
    assert response_lists(out) == expected


@pytest.mark.timeout(300)
def test_hf_rollout_samples_n_per_prompt_with_actor_log_probs(two_hf_workers, tokenizer):
    out = two_hf_workers.generate_sequences(make_prompts(tokenizer), GenerationRequest(sampling_override={"n": 2}))
    assert out.batch["responses"].shape == (8, RESPONSE_LENGTH)
    actor = two_hf_workers.compute_log_probs(out).batch["old_log_probs"]
    mismatch = rollout_logprob_mismatch(actor, out.batch["rollout_log_probs"], out.batch["response_mask"])
    assert mismatch["rollout/logprob_abs_diff/max"] < 1e-4


@pytest.mark.timeout(300)
def test_hf_rollout_call_seed_reproduces_the_samples(two_hf_workers, tokenizer):
    prompts, seeded = make_prompts(tokenizer), GenerationRequest(sampling_override={"n": 2}, seed=[7, 0, 3, 0])
    first, again = (response_lists(two_hf_workers.generate_sequences(prompts, seeded)) for _ in range(2))
    assert first == again


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_image_data_with_the_text_only_hf_rollout_is_refused_before_ray(tmp_path):
    """The hf rollout generates from text: train and generate refuse image data when the run starts, naming the
    count and the key (it used to start Ray and the workers and stop at the first batch with a picture)."""
    from tests.fixtures.trainer_runs import REPO_ROOT, run_easyrl

    recipe = [f"config={REPO_ROOT / 'examples' / 'shapes_tiny_vl_grpo.yaml'}", "worker.rollout.name=hf"]
    train = run_easyrl("train", *recipe, f"trainer.save_checkpoint_path={tmp_path / 'run'}", timeout=240)
    assert train.returncode == 2, train.stderr[-3000:]
    assert "Traceback" not in train.stderr
    assert "easyrl train: cannot start: worker.rollout.name=hf generates from text prompts only, and " in train.stderr
    assert "rows of data.train_files have pictures or videos. Use worker.rollout.name=vllm" in train.stderr
    assert not (tmp_path / "run" / "logs" / "actor_rollout_0.log").exists()  # no worker started
    generate = run_easyrl(
        "generate", *recipe, f"generate.output={tmp_path / 'out.jsonl'}", "trainer.logger=[console]", timeout=240
    )
    assert generate.returncode == 2, generate.stderr[-3000:]
    assert "rows of data.val_files have pictures or videos" in generate.stderr and "Traceback" not in generate.stderr

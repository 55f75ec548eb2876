"""Two FSDP2 workers with AdamW, dynamic batching and padding-free packing: one-process equivalence and resume."""

import pytest
import torch

import easyrl  # noqa: F401  (process environment before Ray starts)
from easyrl.workers.fsdp_worker import FSDPWorker
from tests.fsdp_helpers import (
    add_policy_targets,
    load_hf_causal_lm,
    make_batch,
    padded_policy_loss,
    worker_config,
    worker_group,
)


LR = 1e-3


@pytest.fixture(scope="module")
def adamw_workers(ray_cluster, tiny_model_path):
    # 4 samples per worker and a token budget of 3 padded rows: a micro-batch size that does not divide the samples
    # per device, which the config check allows with dynamic batching
    config = worker_config(
        tiny_model_path, 2, strategy="adamw", lr=LR, global_batch_size=8, micro_batch_size=3, dynamic_batching=True
    )
    with worker_group(FSDPWorker, config, "actor", name_prefix="adamw", processes=2) as group:
        yield group


@pytest.mark.timeout(300)
def test_adamw_update_matches_torch_adamw_on_the_whole_batch(adamw_workers, tiny_model_path):
    adamw_workers.init_model()
    data = make_batch(batch_size=8, seed=7)
    data = add_policy_targets(data, adamw_workers.compute_log_probs(data).batch["old_log_probs"], seed=7)
    metrics = adamw_workers.update_actor(data).meta_info["metrics"]
    assert metrics["actor/lr"] == pytest.approx(LR)

    model = load_hf_causal_lm(tiny_model_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), weight_decay=0.0)
    padded_policy_loss(model, data, worker_config(tiny_model_path, 1).actor).backward()
    optimizer.step()
    state = adamw_workers.get_full_state_dict()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(state[name], tensor, atol=2e-5, rtol=0, msg=name)


@pytest.mark.timeout(300)
def test_resume_from_checkpoint_reproduces_the_next_step_exactly(adamw_workers, tmp_path):
    adamw_workers.init_model()
    data = make_batch(batch_size=8, seed=8)
    data = add_policy_targets(data, adamw_workers.compute_log_probs(data).batch["old_log_probs"], seed=8)
    adamw_workers.update_actor(data)  # non-empty Adam moments
    adamw_workers.save_checkpoint(str(tmp_path))
    first = adamw_workers.update_actor(data).meta_info["metrics"]
    after_first = adamw_workers.get_full_state_dict()

    adamw_workers.init_model()  # fresh weights and optimizer, then resume
    adamw_workers.load_checkpoint(str(tmp_path))
    second = adamw_workers.update_actor(data).meta_info["metrics"]
    after_second = adamw_workers.get_full_state_dict()
    assert second["actor/pg_loss"] == first["actor/pg_loss"]
    for name, tensor in after_first.items():
        assert torch.equal(after_second[name], tensor), name

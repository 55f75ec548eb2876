"""Padding-free packing, dynamic batching and chunked log-probs give the padded path's numbers (fp32, 1e-5)."""

import pytest
import torch

from easyrl.config import ActorConfig, CriticConfig
from easyrl.models.dynamic_batching import balanced_partitions, plan_micro_batches, restore_order, split_micro_batches
from easyrl.models.padding_free import pack_batch, response_prediction_positions, unpack
from easyrl.utils.torch_functional import entropy_from_logits, log_probs_from_logits
from easyrl.workers.actor import Actor
from easyrl.workers.critic import Critic
from tests.fsdp_helpers import make_batch, per_sequence_log_probs


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32, attn_implementation="sdpa")


def actor_config(**overrides) -> ActorConfig:
    config = ActorConfig(
        padding_free=False,
        dynamic_batching=False,
        micro_batch_size_per_device_for_experience=4,
        use_torch_compile=False,
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


# ----------------------------------------------------------------------------------------------------------------------
# packing
# ----------------------------------------------------------------------------------------------------------------------
def test_pack_batch_keeps_real_tokens_with_positions_restarting_per_sequence():
    data = make_batch(batch_size=3)
    batch = data.batch
    packed = pack_batch(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    lengths = batch["attention_mask"].sum(-1)
    assert packed.input_ids.shape == (1, int(lengths.sum()))
    assert packed.cu_seqlens.tolist() == [0, *lengths.cumsum(0).tolist()]
    expected_positions = torch.cat([torch.arange(int(n)) for n in lengths])
    assert torch.equal(packed.position_ids[0], expected_positions)
    restored = unpack(packed.input_ids[0], packed.indices, *batch["input_ids"].shape)
    assert torch.equal(restored, batch["input_ids"])


def test_response_prediction_positions_point_at_the_token_before_each_response_token():
    data = make_batch(batch_size=4)
    batch = data.batch
    packed = pack_batch(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    valid, positions = response_prediction_positions(batch["attention_mask"], batch["responses"].shape[-1])
    assert torch.equal(valid, batch["response_mask"].bool())
    assert torch.equal(packed.input_ids[0, positions + 1], batch["responses"][valid])


def test_multi_axis_position_ids_pack_per_channel():
    data = make_batch(batch_size=2)
    batch = data.batch
    mrope = torch.stack([batch["position_ids"], batch["position_ids"] * 2, batch["position_ids"] * 3], dim=1)
    packed = pack_batch(batch["input_ids"], batch["attention_mask"], mrope)
    flat = pack_batch(batch["input_ids"], batch["attention_mask"], batch["position_ids"]).position_ids
    assert packed.position_ids.shape == (3, 1, flat.shape[-1])
    assert torch.equal(packed.position_ids[2], flat * 3)


# ----------------------------------------------------------------------------------------------------------------------
# log-probs
# ----------------------------------------------------------------------------------------------------------------------
def test_padded_log_probs_equal_per_sequence_hf_forward(tiny_lm):
    data = make_batch()
    log_probs, _ = Actor(actor_config(), tiny_lm).compute_log_probs(data)
    expected = per_sequence_log_probs(tiny_lm, data, temperature=0.7)
    torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=0)


def test_padding_free_log_probs_equal_padded_log_probs(tiny_lm):
    data = make_batch(seed=1)
    padded, padded_entropy = Actor(actor_config(), tiny_lm).compute_log_probs(data, calculate_entropy=True)
    packed, packed_entropy = Actor(actor_config(padding_free=True), tiny_lm).compute_log_probs(
        data, calculate_entropy=True
    )
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed_entropy, padded_entropy, atol=1e-5, rtol=0)


def test_dynamic_batching_log_probs_equal_fixed_micro_batches_in_original_order(tiny_lm):
    data = make_batch(batch_size=8, seed=2)
    fixed, _ = Actor(actor_config(), tiny_lm).compute_log_probs(data)
    config = actor_config(padding_free=True, dynamic_batching=True, micro_batch_size_per_device_for_experience=2)
    dynamic, _ = Actor(config, tiny_lm).compute_log_probs(data)
    torch.testing.assert_close(dynamic, fixed, atol=1e-5, rtol=0)


def test_chunked_log_prob_and_gradient_match_full_log_softmax():
    logits = torch.randn(5, 3, 50, dtype=torch.float32, requires_grad=True)
    labels = torch.randint(0, 50, (5, 3))
    weights = torch.randn(5, 3)
    ours = log_probs_from_logits(logits, labels, temperature=0.6)
    (ours * weights).sum().backward()
    grad_ours = logits.grad.clone()
    logits.grad = None
    reference = torch.log_softmax(logits / 0.6, dim=-1).gather(-1, labels[..., None]).squeeze(-1)
    (reference * weights).sum().backward()
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)
    torch.testing.assert_close(grad_ours, logits.grad, atol=1e-6, rtol=0)


def test_chunked_entropy_matches_full_softmax_entropy():
    logits = torch.randn(4, 6, 30)
    probs = torch.softmax(logits / 1.3, dim=-1)
    expected = -(probs * torch.log(probs)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(logits, temperature=1.3), expected, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------------------------------------
# dynamic batching
# ----------------------------------------------------------------------------------------------------------------------
def test_balanced_partitions_cover_every_index_once_with_near_equal_loads():
    lengths = [9, 1, 8, 2, 7, 3, 6, 4]
    parts = balanced_partitions(lengths, 4)
    assert sorted(i for p in parts for i in p) == list(range(8))
    assert [sum(lengths[i] for i in p) for p in parts] == [10, 10, 10, 10]


def test_plan_micro_batches_uses_fewest_micro_batches_within_the_token_budget():
    parts = plan_micro_batches(torch.tensor([5, 5, 5, 5, 3]), max_token_len=10)
    assert len(parts) == 3
    assert all(sum([5, 5, 5, 5, 3][i] for i in p) <= 10 for p in parts)


def test_plan_micro_batches_rejects_a_sequence_longer_than_the_budget():
    with pytest.raises(ValueError, match="micro_batch_size_per_device"):
        plan_micro_batches(torch.tensor([11, 2]), max_token_len=10)


def test_restore_order_undoes_the_dynamic_permutation():
    data = make_batch(batch_size=7, seed=3)
    micro_batches, permutation = split_micro_batches(data, micro_batch_size=2, dynamic=True)
    concatenated = torch.cat([mb.batch["input_ids"] for mb in micro_batches])
    assert torch.equal(restore_order(concatenated, permutation), data.batch["input_ids"])


# ----------------------------------------------------------------------------------------------------------------------
# critic
# ----------------------------------------------------------------------------------------------------------------------
def test_critic_padding_free_values_equal_padded_values(tiny_model_path):
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(
        tiny_model_path, num_labels=1, dtype=torch.float32, attn_implementation="sdpa"
    )
    data = make_batch(seed=4)
    padded = Critic(CriticConfig(padding_free=False, dynamic_batching=False), model).compute_values(data)
    packed = Critic(CriticConfig(padding_free=True, dynamic_batching=True), model).compute_values(data)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    assert torch.all(padded[~data.batch["response_mask"].bool()] == 0)

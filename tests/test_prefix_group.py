"""Shared-prefix forward passes (models/prefix_group.py) give the unshared path's numbers (fp32, relative 1e-5).

The reference is the padding-free unshared path, itself checked against plain per-sequence HF forwards in
tests/test_padding_free.py and tests/test_vl_actor.py.
"""

import math

import pytest
import torch

import easyrl  # noqa: F401  (torchvision shim before the Qwen-VL processors import it)
from easyrl.config import ActorConfig, ConfigError, PPOConfig, derive
from easyrl.models.dynamic_batching import restore_order
from easyrl.models.prefix_group import PrefixStats, find_groups, pack_groups, split_micro_batches_by_group
from easyrl.models.vision import vision_tower
from easyrl.protocol import DataProto
from easyrl.workers.actor import Actor
from tests.fsdp_helpers import add_policy_targets, load_hf_causal_lm


TEMPERATURE = 0.7


def grouped_batch(
    group_sizes: list[int], prompt_length: int = 7, response_length: int = 6, seed: int = 0, vocab: int = 1000
) -> DataProto:
    """Rollout-shaped rows, ``group_sizes[g]`` consecutive samples sharing group g's prompt (left-padded, 2 to
    ``prompt_length`` tokens), each with its own right-padded response of 1 to ``response_length`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    seq = prompt_length + response_length
    ids, masks = [], []
    for size in group_sizes:
        n_prompt = int(torch.randint(2, prompt_length + 1, (1,), generator=gen))
        prompt = torch.randint(5, vocab, (n_prompt,), generator=gen)
        for _ in range(size):
            n_response = int(torch.randint(1, response_length + 1, (1,), generator=gen))
            row, mask = torch.zeros(seq, dtype=torch.long), torch.zeros(seq, dtype=torch.long)
            row[prompt_length - n_prompt : prompt_length] = prompt
            row[prompt_length : prompt_length + n_response] = torch.randint(5, vocab, (n_response,), generator=gen)
            mask[prompt_length - n_prompt : prompt_length + n_response] = 1
            ids.append(row)
            masks.append(mask)
    input_ids, attention_mask = torch.stack(ids), torch.stack(masks)
    tensors = {
        "prompts": input_ids[:, :prompt_length],
        "responses": input_ids[:, prompt_length:],
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": attention_mask[:, prompt_length:],
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": TEMPERATURE})


def actor_config(
    shared_prefix: bool, micro_batch_size: int = 4, dynamic: bool = False, fused: bool = False
) -> ActorConfig:
    full = PPOConfig()
    derive(full)  # the loss names as the worker gets them
    config = full.worker.actor
    config.padding_free, config.dynamic_batching, config.use_torch_compile = True, dynamic, False
    config.micro_batch_size_per_device_for_experience = micro_batch_size
    config.micro_batch_size_per_device_for_update = micro_batch_size
    config.shared_prefix = shared_prefix
    config.model.use_fused_kernels = fused  # the LM head's chunked log-probs (models/fused_head.py)
    return config


def forward_and_gradients(model, data, config, processor=None):
    """One micro-batch: (log-probs, entropies, {parameter: gradient of a fixed random mix of both}, prefix stats)."""
    model.zero_grad(set_to_none=True)
    actor = Actor(config, model, processor=processor)
    log_probs, entropy = actor._forward(data, TEMPERATURE, calculate_entropy=True)
    weights = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(1))
    ((log_probs * weights).sum() + (entropy * weights.flip(0)).sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return log_probs.detach(), entropy.detach(), grads, actor.prefix_stats


def assert_same_gradients(expected: dict, actual: dict) -> None:
    """Every parameter's gradient within relative 1e-5 of the largest entry (a key bias's gradient is zero in exact
    arithmetic, so its own scale is rounding noise)."""
    assert expected.keys() == actual.keys()
    scale = max(float(g.abs().max()) for g in expected.values())
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, rtol=1e-5, atol=1e-5 * scale, msg=name)


@pytest.fixture(scope="module")
def tiny_lm_path(tiny_model_path):
    return tiny_model_path


# ----------------------------------------------------------------------------------------------------------------------
# groups and the packed row
# ----------------------------------------------------------------------------------------------------------------------
def test_rows_group_by_identical_prompt_ids_and_media():
    input_ids = torch.tensor([[0, 7, 8, 1], [9, 7, 8, 2], [0, 7, 8, 3], [0, 5, 6, 4], [0, 7, 8, 5]])
    attention_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 1]])
    groups, unshared = find_groups(input_ids, attention_mask, response_length=1)
    assert groups == [[0, 2, 4], [1], [3]] and unshared == 0
    picture, other = object(), object()
    rows = [{"images": [picture]}, None, {"images": [picture]}, None, {"images": [other]}]
    groups, unshared = find_groups(input_ids, attention_mask, 1, rows)
    assert groups == [[0, 2], [1], [3], [4]] and unshared == 1  # row 4: the prompt ids of row 0, another picture
    groups, unshared = find_groups(input_ids, attention_mask, 1, alone=torch.tensor([0, 0, 1, 0, 0]).bool())
    assert groups == [[0, 4], [1], [2], [3]] and unshared == 1


def test_packed_row_holds_each_prompt_once_with_positions_continuing_into_each_response():
    # group [0, 1]: prompt (7, 8), responses (1, 2) and (3); group [2]: prompt (5), response (4, 6)
    input_ids = torch.tensor([[0, 7, 8, 1, 2], [0, 7, 8, 3, 0], [0, 0, 5, 4, 6]])
    attention_mask = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    pack = pack_groups(input_ids, attention_mask, position_ids, response_length=2, groups=[[0, 1], [2]])
    assert pack.input_ids.tolist() == [[7, 8, 1, 2, 3, 5, 4, 6]]
    assert pack.position_ids.tolist() == [[0, 1, 2, 3, 2, 0, 1, 2]]
    segments = [(s.start, s.end, s.prefix_start, s.prefix_end) for s in pack.layout.segments]
    assert segments == [(0, 2, 0, 0), (2, 4, 0, 2), (4, 5, 0, 2), (5, 6, 0, 0), (6, 8, 5, 6)]
    # tokens 1, 2 | 3 | 4, 6 are predicted by packed positions 1 (prompt's last), 2 | 1 | 5 (prompt's last), 6
    assert pack.positions.tolist() == [1, 2, 1, 5, 6]
    assert pack.unshared_tokens == 10 and pack.input_ids.shape[-1] == 8


def test_micro_batches_keep_groups_whole_and_restore_the_order():
    data = grouped_batch([3, 1, 2, 2], seed=4)
    stats = PrefixStats()
    micro_batches, permutation = split_micro_batches_by_group(data, micro_batch_size=4, dynamic=False, stats=stats)
    assert sorted(len(mb) for mb in micro_batches) == [4, 4]
    for mb in micro_batches:  # every group lies inside one micro-batch
        groups, _ = find_groups(mb.batch["input_ids"], mb.batch["attention_mask"], 6)
        assert sum(len(g) for g in groups) == len(mb)
    order = restore_order(torch.cat([mb.batch["input_ids"] for mb in micro_batches]), permutation)
    assert torch.equal(order, data.batch["input_ids"]) and stats.split_groups == 0
    # a group of 3 under a budget of 2 samples: cut in two parts, counted
    _, _ = split_micro_batches_by_group(grouped_batch([3, 1]), micro_batch_size=2, dynamic=False, stats=stats)
    assert stats.split_groups == 1


def test_dynamic_micro_batches_count_each_prompt_once_in_the_budget():
    data = grouped_batch([4, 4], prompt_length=7, response_length=6, seed=2)
    mask = data.batch["attention_mask"]
    prompt_tokens = mask[:, :7].sum(-1)
    response_tokens = mask[:, 7:].sum(-1)
    shared = [int(prompt_tokens[g * 4] + response_tokens[g * 4 : g * 4 + 4].sum()) for g in range(2)]
    # a budget of 4 x 13 tokens holds one shared group (<= 7 + 24 tokens), never two
    micro_batches, _ = split_micro_batches_by_group(data, micro_batch_size=4, dynamic=True)
    assert len(micro_batches) == (1 if sum(shared) <= 52 else 2)


def test_data_parallel_balancing_moves_whole_groups_when_prompts_are_shared():
    from easyrl.trainer.balance import balance_permutation, groups_by_uid

    # 4 prompts x 2 samples; tokens per group 20, 12, 10, 2 -> ranks get groups {0, 3} and {1, 2} (22 tokens each)
    attention_mask = (torch.arange(10)[None, :] < torch.tensor([10, 10, 6, 6, 5, 5, 1, 1])[:, None]).long()
    groups = groups_by_uid(["a", "a", "b", "b", "c", "c", "d", "d"])
    order, metrics = balance_permutation(attention_mask, 2, groups)
    assert order.tolist() == [0, 1, 6, 7, 2, 3, 4, 5] and metrics["perf/dp_token_imbalance"] == 1.0
    rows, _ = balance_permutation(attention_mask, 2)  # row by row, the groups would be cut over the ranks
    assert rows.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def test_groups_that_cannot_all_stay_whole_are_split_as_few_as_the_equal_chunks_force():
    """3 prompts x 4 samples over 2 ranks (6 rows each): one group must be cut, not all three (balancing row by row
    spread every prompt over both ranks, so no rank shared a prompt: 1.79x the tokens computed on a 2-worker run)."""
    from easyrl.trainer.balance import balance_permutation, groups_by_uid

    lengths = [9, 8, 9, 8, 5, 5, 5, 5, 7, 7, 6, 6]
    attention_mask = (torch.arange(10)[None, :] < torch.tensor(lengths)[:, None]).long()
    uids = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    order, _ = balance_permutation(attention_mask, 2, groups_by_uid(uids))
    ranks = [[uids[i] for i in order[:6].tolist()], [uids[i] for i in order[6:].tolist()]]
    split = [uid for uid in "abc" if uid in ranks[0] and uid in ranks[1]]
    assert len(split) == 1 and sorted(order.tolist()) == list(range(12))
    # each rank holds its groups' rows together, in batch order
    for rank in ranks:
        assert rank == sorted(rank)
    # groups of unequal sizes (online filtering keeps any) also stay whole where the chunks allow
    uneven = ["a"] * 2 + ["b"] * 4 + ["c"] * 2 + ["d"] * 4
    order, _ = balance_permutation(attention_mask, 2, groups_by_uid(uneven))
    halves = [{uneven[i] for i in order[:6].tolist()}, {uneven[i] for i in order[6:].tolist()}]
    assert not halves[0] & halves[1]


@pytest.mark.parametrize(
    ("estimator", "actor_shares", "critic_shares", "whole_groups"),
    [
        ("grpo", True, False, True),
        ("gae", False, True, True),
        ("grpo", False, True, False),
        ("gae", False, False, False),
    ],
)
def test_rank_chunks_keep_groups_whole_for_the_role_that_shares_prefixes(
    estimator, actor_shares, critic_shares, whole_groups
):
    """The actor's shared prefixes, or the critic's when the run has a critic: a prompt's samples go to one rank."""
    import numpy as np

    from easyrl.trainer.ray_trainer import PPOTrainer

    config = PPOConfig()
    config.algorithm.adv_estimator = estimator
    config.worker.actor.shared_prefix, config.worker.critic.shared_prefix = actor_shares, critic_shares
    trainer = PPOTrainer.__new__(PPOTrainer)  # only the config is read
    trainer.config = config
    batch = grouped_batch([2, 2])
    batch.non_tensor_batch["uid"] = np.array(["a", "a", "b", "b"], dtype=object)
    _, groups = trainer._rank_chunks(batch)
    assert (groups is not None) == whole_groups


# ----------------------------------------------------------------------------------------------------------------------
# equal to the unshared path: text
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fused_head"])
def test_text_log_probs_entropy_and_every_gradient_equal_the_unshared_path(tiny_lm_path, fused, monkeypatch):
    from easyrl.models import forward

    # groups of 3, 1 (n = 1) and 2 with uneven response lengths, in one micro-batch
    data = grouped_batch([3, 1, 2], seed=0)
    model = load_hf_causal_lm(tiny_lm_path)
    log_probs, entropy, grads, _ = forward_and_gradients(model, data, actor_config(False))
    heads = []  # the fused head's calls: each gets the packed row's labels (1, response tokens)
    fused_head = forward.run_with_fused_head
    monkeypatch.setattr(
        forward, "run_with_fused_head", lambda m, labels, *a: heads.append(labels.shape) or fused_head(m, labels, *a)
    )
    shared_log_probs, shared_entropy, shared_grads, stats = forward_and_gradients(
        model, data, actor_config(True, fused=fused)
    )
    assert heads == ([(1, int(data.batch["response_mask"].sum()))] if fused else [])
    torch.testing.assert_close(shared_log_probs, log_probs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shared_entropy, entropy, rtol=1e-5, atol=1e-6)
    assert_same_gradients(grads, shared_grads)
    assert (stats.samples, stats.groups) == (6, 3)
    prompt_tokens = data.batch["attention_mask"][:, :7].sum(-1)
    saved = int(prompt_tokens[[1, 2, 5]].sum())  # the repeated prompt copies
    assert stats.tokens == stats.unshared_tokens - saved


@pytest.mark.timeout(120)
def test_responses_at_least_as_long_as_their_prompt_attend_without_a_mask(tiny_lm_path, monkeypatch):
    """On sdpa a response as long as its prompt or longer runs with the prompt's queries in front and sdpa's own causal
    mask (the CPU then keeps no (response x (prompt + response)) float mask for backward); a shorter one keeps the
    mask. Both equal the unshared path."""
    # prompts of 4, 4, 4 | 2, 2 tokens; responses of 4, 6, 1 | 12, 10: one response shorter than its prompt, one as
    # long, three longer
    data = grouped_batch([3, 2], prompt_length=4, response_length=12, seed=0)
    prompts, responses = data.batch["attention_mask"][:, :4].sum(-1), data.batch["response_mask"].sum(-1)
    assert (prompts.tolist(), responses.tolist()) == ([4, 4, 4, 2, 2], [4, 6, 1, 12, 10])
    model = load_hf_causal_lm(tiny_lm_path)
    log_probs, entropy, grads, _ = forward_and_gradients(model, data, actor_config(False))
    calls = []  # (queries, keys, masked) of every sdpa call of the shared forward
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, **kwargs):
        calls.append((query.shape[2], key.shape[2], attn_mask is not None))
        return sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    shared_log_probs, shared_entropy, shared_grads, _ = forward_and_gradients(model, data, actor_config(True))
    per_layer = [(4, 4, False), (8, 8, False), (10, 10, False), (1, 5, True), (2, 2, False), (14, 14, False)]
    per_layer += [(12, 12, False)]
    assert sorted(calls) == sorted(per_layer * model.config.num_hidden_layers)
    torch.testing.assert_close(shared_log_probs, log_probs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shared_entropy, entropy, rtol=1e-5, atol=1e-6)
    assert_same_gradients(grads, shared_grads)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic"])
def test_log_probs_over_mixed_and_split_micro_batches_equal_the_unshared_path(tiny_lm_path, dynamic):
    # micro-batches of 2 samples: the group of 3 is cut, the n = 1 group shares a micro-batch with another group
    data = grouped_batch([3, 1, 1, 2, 1], seed=5)
    model = load_hf_causal_lm(tiny_lm_path)
    expected, _ = Actor(actor_config(False, 2, dynamic), model).compute_log_probs(data)
    actor = Actor(actor_config(True, 2, dynamic), model)
    log_probs, _ = actor.compute_log_probs(data)
    torch.testing.assert_close(log_probs, expected, rtol=1e-5, atol=1e-6)
    assert actor.prefix_stats.samples == len(data)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fused_head"])
def test_policy_update_with_shared_prefixes_equals_the_unshared_update(tiny_lm_path, fused):
    data = grouped_batch([3, 3, 1, 1], seed=6)
    with torch.no_grad():
        old, _ = Actor(actor_config(False), load_hf_causal_lm(tiny_lm_path)).compute_log_probs(data)
    data = add_policy_targets(data, old, seed=6)
    states, metrics = {}, {}
    for shared in (False, True):
        model = load_hf_causal_lm(tiny_lm_path)
        config = actor_config(shared, micro_batch_size=4, fused=fused and shared)
        config.max_grad_norm = 1e6
        actor = Actor(config, model, torch.optim.SGD(model.parameters(), lr=0.1), mini_batch_size=len(data))
        metrics[shared] = actor.update_policy(data)
        states[shared] = {k: v.clone() for k, v in model.state_dict().items()}
    assert metrics[True]["actor/shared_prefix/samples_per_prompt"] == 2.0  # 8 samples, 4 prompts
    assert metrics[True]["actor/shared_prefix/token_ratio"] < 1.0
    assert metrics[True]["actor/pg_loss"] == pytest.approx(metrics[False]["actor/pg_loss"], rel=1e-5)
    before = load_hf_causal_lm(tiny_lm_path).state_dict()
    assert max(float((states[False][k] - before[k]).abs().max()) for k in before) > 1e-4  # the step moved weights
    for name, tensor in states[False].items():
        torch.testing.assert_close(states[True][name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def critic_config(shared_prefix: bool, micro_batch_size: int = 4):
    from easyrl.config import CriticConfig

    full = PPOConfig()
    derive(full)
    config: CriticConfig = full.worker.critic
    config.padding_free, config.shared_prefix, config.max_grad_norm = True, shared_prefix, 1e6
    config.micro_batch_size_per_device_for_experience = micro_batch_size
    config.micro_batch_size_per_device_for_update = micro_batch_size
    return config


@pytest.mark.timeout(120)
def test_critic_values_and_update_with_shared_prefixes_equal_the_unshared_path(tiny_lm_path):
    """PPO's critic (worker.critic.shared_prefix): a token-classification model on the same packed rows."""
    from transformers import AutoModelForTokenClassification

    from easyrl.config import ModelConfig
    from easyrl.workers.critic import Critic
    from easyrl.workers.fsdp_utils import load_hf_config

    def value_model():  # with the worker's config (no dropout); the new head is drawn alike each time
        torch.manual_seed(0)
        config = load_hf_config(ModelConfig(model_path=str(tiny_lm_path)), "value")
        return AutoModelForTokenClassification.from_pretrained(
            tiny_lm_path, config=config, dtype=torch.float32, attn_implementation="sdpa"
        )

    data = grouped_batch([3, 3, 1, 2], seed=8)
    model = value_model()
    values = {shared: Critic(critic_config(shared, 3), model).compute_values(data) for shared in (False, True)}
    assert values[False].abs().sum() > 0
    torch.testing.assert_close(values[True], values[False], rtol=1e-5, atol=1e-6)

    mask = data.batch["response_mask"]
    data.batch["values"] = values[False]
    data.batch["returns"] = torch.randn(mask.shape, generator=torch.Generator().manual_seed(8)) * mask
    states, metrics = {}, {}
    for shared in (False, True):
        model = value_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        metrics[shared] = Critic(critic_config(shared), model, optimizer, mini_batch_size=len(data)).update_critic(
            data
        )
        states[shared] = {k: v.clone() for k, v in model.state_dict().items()}
    assert metrics[True]["critic/shared_prefix/samples_per_prompt"] == 2.25  # 9 samples, 4 prompts
    assert metrics[True]["critic/shared_prefix/token_ratio"] < 1.0
    assert metrics[True]["critic/vf_loss"] == pytest.approx(metrics[False]["critic/vf_loss"], rel=1e-5)
    before = value_model().state_dict()
    assert max(float((states[False][k] - before[k]).abs().max()) for k in before) > 1e-4
    for name, tensor in states[False].items():
        torch.testing.assert_close(states[True][name], tensor, rtol=1e-5, atol=1e-6, msg=name)


# ----------------------------------------------------------------------------------------------------------------------
# equal to the unshared path: a VLM with pictures in the prompt
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_qwen2_5_vl(tmp_path_factory):
    from transformers import AutoProcessor

    from easyrl.testing.tiny_vlms import build_tiny_vlm
    from easyrl.testing.vl_batch import VLSample, make_vl_batch, random_image

    path = build_tiny_vlm("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl"))
    processor = AutoProcessor.from_pretrained(path)
    counting = VLSample("Count the shapes.", images=[random_image(0)])
    text = VLSample("Hello there, how are you?")
    brighter = VLSample("Which is brighter?", images=[random_image(1, width=84, height=56)])
    # groups of 3 (picture), 2 (text) and 1 (another picture)
    data = make_vl_batch(processor, str(path), [counting] * 3 + [text] * 2 + [brighter], response_length=6, seed=1)
    data.meta_info["temperature"] = TEMPERATURE
    return path, processor, data


def _vl_model(path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fused_head"])
def test_vl_log_probs_and_gradients_equal_the_unshared_path_with_the_tower_run_once_per_prompt(tiny_qwen2_5_vl, fused):
    path, processor, data = tiny_qwen2_5_vl
    model = _vl_model(path)
    patches = []
    vision_tower(model).register_forward_pre_hook(lambda module, args: patches.append(args[0].shape[0]))
    log_probs, entropy, grads, _ = forward_and_gradients(model, data, actor_config(False, 6), processor)
    shared_log_probs, shared_entropy, shared_grads, stats = forward_and_gradients(
        model, data, actor_config(True, 6, fused=fused), processor
    )
    torch.testing.assert_close(shared_log_probs, log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared_entropy, entropy, rtol=1e-5, atol=1e-5)
    assert_same_gradients(grads, shared_grads)
    assert any(name.startswith("model.visual") for name in shared_grads)  # the tower's gradients are compared too
    # unshared: 3 copies of picture 0 and 1 of picture 1; shared: each once
    pictures = [data.non_tensor_batch["multi_modal_data"][i]["images"][0] for i in (0, 5)]
    grids = processor.image_processor(images=pictures, return_tensors="pt")["image_grid_thw"]
    first, second = (int(grid.prod()) for grid in grids)
    assert patches == [3 * first + second, first + second]
    assert (stats.samples, stats.groups, stats.unshared_rows) == (6, 3, 0)


@pytest.mark.timeout(300)
def test_a_vl_response_holding_a_vision_pad_is_not_shared_and_still_equal(tiny_qwen2_5_vl):
    path, processor, data = tiny_qwen2_5_vl
    data = DataProto.from_dict(
        tensors={k: v.clone() for k, v in data.batch.items()},
        non_tensors=dict(data.non_tensor_batch),
        meta_info=dict(data.meta_info),
    )
    response_start = data.batch["input_ids"].shape[-1] - data.batch["responses"].shape[-1]
    data.batch["input_ids"][1, response_start] = processor.image_token_id  # a pad sampled by the policy
    data.batch["responses"][1, 0] = processor.image_token_id
    model = _vl_model(path)
    expected, _ = Actor(actor_config(False, 6), model, processor=processor).compute_log_probs(data)
    actor = Actor(actor_config(True, 6), model, processor=processor)
    log_probs, _ = actor.compute_log_probs(data)
    torch.testing.assert_close(log_probs, expected, rtol=1e-5, atol=1e-5)
    assert (actor.prefix_stats.groups, actor.prefix_stats.unshared_rows) == (4, 1)


# ----------------------------------------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------------------------------------
def test_check_accepts_shared_prefix_and_the_reference_follows_the_actor(valid_args):
    from easyrl.config.plan import load_run_plan

    plan = load_run_plan([*valid_args, "worker.actor.shared_prefix=true"])
    assert plan.config.worker.actor.shared_prefix and plan.config.worker.ref.shared_prefix
    both = load_run_plan(
        [
            *valid_args,
            "worker.actor.shared_prefix=true",
            "worker.actor.model.use_fused_kernels=true",
            "worker.actor.ulysses_size=2",
        ]
    )
    assert both.config.worker.ref.shared_prefix and both.config.worker.ref.use_fused_kernels
    assert both.config.worker.ref.ulysses_size == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["worker.actor.shared_prefix=true", "worker.actor.padding_free=false"],
            r"`worker\.actor\.shared_prefix` is true.*set worker\.actor\.padding_free=true",
        ),
        (
            [
                "algorithm.adv_estimator=gae",
                "worker.critic.global_batch_size=4",
                "worker.critic.shared_prefix=true",
                "worker.critic.padding_free=false",
            ],
            r"`worker\.critic\.shared_prefix` is true.*set worker\.critic\.padding_free=true",
        ),
    ],
    ids=["actor-padded", "critic-padded"],
)
def test_check_refuses_shared_prefix_where_it_cannot_run_naming_the_key(valid_args, overrides, message):
    from easyrl.config.plan import load_run_plan

    with pytest.raises(ConfigError, match=message):
        load_run_plan([*valid_args, *overrides])


# ----------------------------------------------------------------------------------------------------------------------
# two FSDP2 ranks through the worker
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow  # ~60 s on 2 busy cores (Ray workers, two model loads); the in-process tests above are the fast ones
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fused_head"])
def test_two_rank_fsdp_update_with_shared_prefixes_equals_one_plain_process(ray_cluster, tiny_model_path, fused):
    from easyrl.workers.fsdp_worker import FSDPWorker
    from tests.fsdp_helpers import padded_policy_loss, per_sequence_log_probs, worker_config, worker_group

    lr = 0.1
    data = grouped_batch([3, 3], seed=7)  # one group per rank; micro-batches of 2 cut each group (2 + 1)
    config = worker_config(tiny_model_path, 2, lr=lr, global_batch_size=6, micro_batch_size=2)
    config.actor.shared_prefix = config.ref.shared_prefix = True
    config.actor.model.use_fused_kernels = config.ref.use_fused_kernels = fused  # as derive sets them
    with worker_group(FSDPWorker, config, "actor", processes=2, name_prefix="prefix") as group:
        group.init_model()
        old = group.compute_log_probs(data).batch["old_log_probs"]
        data = add_policy_targets(data, old, seed=7)
        metrics = group.update_actor(data).meta_info["metrics"]
        state = group.get_full_state_dict()
    reference = load_hf_causal_lm(tiny_model_path)
    torch.testing.assert_close(old, per_sequence_log_probs(reference, data, TEMPERATURE), rtol=1e-5, atol=1e-5)
    assert metrics["actor/shared_prefix/split_groups"] > 0 and metrics["actor/shared_prefix/token_ratio"] < 1.0
    # one SGD step of a plain padded model on the whole batch: theta - lr * grad(L_minibatch)
    padded_policy_loss(reference, data, worker_config(tiny_model_path, 1).actor).backward()
    before = load_hf_causal_lm(tiny_model_path).state_dict()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            expected = param - lr * param.grad
            assert float((expected - before[name]).abs().max()) > 0 or param.grad.abs().max() == 0
            torch.testing.assert_close(state[name], expected, atol=1e-6, rtol=1e-5, msg=name)


# ----------------------------------------------------------------------------------------------------------------------
# a short `easyrl train` run
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow  # two GRPO steps with vLLM, a reference model and Ray: minutes on a busy CPU
@pytest.mark.timeout(900)
def test_easyrl_train_with_shared_prefixes_matches_vllm_log_probs_and_reports_the_sharing(tiny_model_path, tmp_path):
    from tests.fixtures.trainer_runs import TINY_RUN_OVERRIDES, metrics_by_step, run_training, train_args

    overrides = TINY_RUN_OVERRIDES + [
        "trainer.n_gpus_per_node=1",
        "trainer.max_steps=2",
        "trainer.save_model_only=true",
        "trainer.find_last_checkpoint=false",
        "data.val_files=",
        "worker.actor.shared_prefix=true",
        "worker.actor.global_batch_size=2",  # two mini-batches a step: the old log-prob pass runs (shared) too
        "algorithm.use_kl_loss=true",  # and the reference's pass
        "algorithm.disable_kl=false",
    ]
    save_dir = tmp_path / "checkpoints"
    run_training(train_args(tiny_model_path, save_dir, overrides), tmp_path / "train.log")
    rows = metrics_by_step(save_dir)
    assert sorted(rows) == [1, 2]
    for row in rows.values():
        assert row["actor/shared_prefix/samples_per_prompt"] == 4.0  # 4 prompts x n = 4, each group whole
        assert row["actor/shared_prefix/token_ratio"] < 1.0 and row["actor/shared_prefix/split_groups"] == 0
        # the shared path's old log-probs against the engine's sampling log-probs (fp32 both)
        assert row["rollout/logprob_abs_diff/mean"] < 1e-3
        assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["actor/kl_loss"])

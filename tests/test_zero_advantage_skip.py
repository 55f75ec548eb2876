"""`worker.actor.skip_zero_advantage`: the update skips the passes of samples whose advantage is zero everywhere and
still takes the same optimizer step as the update that computes every sample."""

import pytest
import torch

from easyrl.algorithms.zero_advantage import skips_zero_advantage
from easyrl.workers.actor import Actor
from easyrl.workers.ppo_update import samples_to_compute
from tests.fsdp_helpers import add_policy_targets, load_hf_causal_lm
from tests.test_prefix_group import actor_config, grouped_batch


def batch_with_flat_groups(model_path, group_sizes, flat_groups, seed, off_policy=True):
    """``grouped_batch`` with old log-probs and random advantages, zero for every sample of ``flat_groups`` (a GRPO
    group whose samples all scored the same); off-policy: the old log-probs are perturbed, so ratios are not 1."""
    data = grouped_batch(group_sizes, seed=seed)
    with torch.no_grad():
        old, _ = Actor(actor_config(False), load_hf_causal_lm(model_path)).compute_log_probs(data)
    gen = torch.Generator().manual_seed(seed + 100)
    if off_policy:
        old = old + 0.3 * torch.randn(old.shape, generator=gen) * data.batch["response_mask"]
    data = add_policy_targets(data, old, seed=seed)
    start = 0
    for group, size in enumerate(group_sizes):
        if group in flat_groups:
            data.batch["advantages"][start : start + size] = 0.0
        start += size
    return data


def update(model_path, config, data, optimizer="sgd"):
    model = load_hf_causal_lm(model_path)
    if optimizer == "sgd":
        optim = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        optim = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    actor = Actor(config, model, optim, mini_batch_size=len(data))
    metrics = actor.update_policy(data)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def assert_same_states(expected, actual, before):
    assert max(float((expected[k] - before[k]).abs().max()) for k in before) > 1e-5  # the step moved weights
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


GRID = [
    # loss_type, loss_avg_mode, shared_prefix, dynamic batching
    ("ppo", "token-mean", False, False),
    ("ppo", "token-mean", True, False),
    ("ppo", "seq-mean-token-mean", True, True),
    ("gspo", "seq-mean-token-mean", False, True),
    ("cispo", "token-mean", True, False),
    ("sapo", "seq-mean-token-sum", False, False),
]


@pytest.mark.parametrize("loss_type, loss_avg_mode, shared_prefix, dynamic", GRID)
def test_skipping_flat_groups_gives_the_same_step(tiny_model_path, loss_type, loss_avg_mode, shared_prefix, dynamic):
    data = batch_with_flat_groups(tiny_model_path, [3, 2, 3, 1, 1], flat_groups={0, 3}, seed=21)
    states, metrics = {}, {}
    for skip in (False, True):
        config = actor_config(shared_prefix, micro_batch_size=3, dynamic=dynamic)
        config.loss_type, config.loss_avg_mode, config.max_grad_norm = loss_type, loss_avg_mode, 1e6
        config.skip_zero_advantage = skip
        assert skips_zero_advantage(config) == skip
        states[skip], metrics[skip] = update(tiny_model_path, config, data)
    assert metrics[True]["actor/zero_advantage_skipped"] == pytest.approx(4 / 10)
    assert "actor/zero_advantage_skipped" not in metrics[False]
    assert metrics[True]["actor/pg_loss"] == pytest.approx(metrics[False]["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert_same_states(states[False], states[True], load_hf_causal_lm(tiny_model_path).state_dict())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shared_prefix", [False, True])
def test_a_vl_update_skipping_a_flat_picture_group_gives_the_same_step(tmp_path_factory, shared_prefix):
    """Qwen2.5-VL with pictures in the prompts: the skipped group's picture is not encoded, the step is the same
    (vision tower included)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from easyrl.testing.tiny_vlms import build_tiny_vlm
    from easyrl.testing.vl_batch import VLSample, make_vl_batch, random_image

    path = build_tiny_vlm("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl"))
    processor = AutoProcessor.from_pretrained(path)
    counting = VLSample("Count the shapes.", images=[random_image(0)])
    brighter = VLSample("Which is brighter?", images=[random_image(1, width=84, height=56)])
    text = VLSample("Hello there, how are you?")
    data = make_vl_batch(processor, str(path), [counting] * 3 + [brighter] * 2 + [text] * 2, response_length=6, seed=2)
    data.meta_info["temperature"] = 0.7

    def model():
        return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")

    old, _ = Actor(actor_config(False, 7), model(), processor=processor).compute_log_probs(data)
    data = add_policy_targets(data, old, seed=25)
    data.batch["advantages"][3:5] = 0.0  # the brighter-picture group scored the same
    states, metrics = {}, {}
    for skip in (False, True):
        config = actor_config(shared_prefix, micro_batch_size=3)
        config.max_grad_norm, config.skip_zero_advantage = 1e6, skip
        module = model()
        actor = Actor(
            config,
            module,
            torch.optim.SGD(module.parameters(), lr=0.1),
            mini_batch_size=len(data),
            processor=processor,
        )
        metrics[skip] = actor.update_policy(data)
        states[skip] = {k: v.detach().clone() for k, v in module.state_dict().items()}
    assert metrics[True]["actor/zero_advantage_skipped"] == pytest.approx(2 / 7)
    before = model().state_dict()
    assert any(
        name.startswith("model.visual") and float((states[True][name] - before[name]).abs().max()) > 0
        for name in before
    )  # the tower trained, and is compared below
    assert_same_states(states[False], states[True], before)


def test_on_policy_update_skips_too_and_reports_entropy_of_the_computed_samples(tiny_model_path):
    data = batch_with_flat_groups(tiny_model_path, [2, 2, 2], flat_groups={1}, seed=22, off_policy=False)
    del data.batch["old_log_probs"]
    states, metrics = {}, {}
    for skip in (False, True):
        config = actor_config(True, micro_batch_size=2)
        config.max_grad_norm, config.skip_zero_advantage = 1e6, skip
        model = load_hf_causal_lm(tiny_model_path)
        actor = Actor(config, model, torch.optim.SGD(model.parameters(), lr=0.1), mini_batch_size=len(data))
        metrics[skip] = actor.update_policy(data, on_policy=True)
        states[skip] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert metrics[True]["actor/zero_advantage_skipped"] == pytest.approx(2 / 6)
    assert metrics[True]["actor/entropy"] > 0 and metrics[True]["actor/entropy"] != metrics[False]["actor/entropy"]
    assert_same_states(states[False], states[True], load_hf_causal_lm(tiny_model_path).state_dict())


def test_a_batch_with_no_advantage_still_takes_the_optimizer_step(tiny_model_path):
    """AdamW's weight decay moves the weights even with zero gradients: one sample is computed so the step happens
    exactly as without skipping."""
    data = batch_with_flat_groups(tiny_model_path, [2, 2], flat_groups={0, 1}, seed=23)
    config = actor_config(False, micro_batch_size=2)
    states, metrics = {}, {}
    for skip in (False, True):
        config.skip_zero_advantage = skip
        states[skip], metrics[skip] = update(tiny_model_path, config, data, optimizer="adamw")
    assert metrics[True]["actor/zero_advantage_skipped"] == pytest.approx(3 / 4)
    assert metrics[True]["actor/grad_norm"] == metrics[False]["actor/grad_norm"] == 0.0
    assert_same_states(states[False], states[True], load_hf_causal_lm(tiny_model_path).state_dict())
    # the per-token metrics would describe the one placeholder sample: left out, not passed off as the batch's
    per_token = {"actor/ppo_kl", "actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"}
    assert per_token <= set(metrics[False]) and not per_token & set(metrics[True])
    assert metrics[True]["actor/pg_loss"] == metrics[False]["actor/pg_loss"] == 0.0


@pytest.fixture
def scratch_losses():
    """Losses a test registers are gone after it (the registries are module-wide)."""
    from easyrl.algorithms import policy_loss, zero_advantage

    names, weighted = set(policy_loss._POLICY_LOSSES), set(zero_advantage.ADVANTAGE_WEIGHTED_LOSSES)
    yield
    for name in set(policy_loss._POLICY_LOSSES) - names:
        del policy_loss._POLICY_LOSSES[name]
    zero_advantage.ADVANTAGE_WEIGHTED_LOSSES.intersection_update(weighted)


@pytest.mark.parametrize(
    "setting", ["entropy_coef=0.01", "use_kl_loss=true", "loss_type=custom", "skip_zero_advantage=false"]
)
def test_the_skip_applies_only_where_zero_advantage_means_zero_loss(setting, scratch_losses):
    config = actor_config(False)
    assert skips_zero_advantage(config)
    key, value = setting.split("=")
    if key == "loss_type":
        from easyrl.algorithms.policy_loss import register_policy_loss

        @register_policy_loss("zero_adv_test_custom")
        def custom(old_log_probs, log_probs, advantages, response_mask, config):  # a loss with a term of its own
            return -advantages * log_probs + 0.1 * log_probs**2, {}

        config.loss_type = "zero_adv_test_custom"
    else:
        setattr(config, key, {"true": True, "false": False}.get(value, value if key != "entropy_coef" else 0.01))
    assert not skips_zero_advantage(config)


def test_every_loss_listed_as_advantage_weighted_is_zero_with_zero_gradient_at_zero_advantage():
    from easyrl.algorithms.policy_loss import compute_policy_loss, list_policy_losses
    from easyrl.algorithms.zero_advantage import ADVANTAGE_WEIGHTED_LOSSES

    assert {"ppo", "gspo", "gspo_token", "cispo", "sapo"} <= ADVANTAGE_WEIGHTED_LOSSES <= set(list_policy_losses())
    gen = torch.Generator().manual_seed(5)
    mask = (torch.rand(4, 6, generator=gen) > 0.2).long()
    old = -torch.rand(4, 6, generator=gen) * 3
    config = actor_config(False)
    for name in sorted(ADVANTAGE_WEIGHTED_LOSSES):
        config.loss_type = name
        log_probs = (old + torch.randn(4, 6, generator=gen)).requires_grad_()
        for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
            config.loss_avg_mode = mode
            loss, _ = compute_policy_loss(old, log_probs, torch.zeros(4, 6), mask, config, loss_denominator=7.0)
            (grad,) = torch.autograd.grad(loss, log_probs)
            assert float(loss) == 0.0 and float(grad.abs().max()) == 0.0, (name, mode)


def test_a_users_loss_registered_as_advantage_weighted_is_skipped(scratch_losses):
    from easyrl.algorithms.policy_loss import register_policy_loss

    @register_policy_loss("zero_adv_test_weighted", advantage_weighted=True)
    def weighted(old_log_probs, log_probs, advantages, response_mask, config):
        return -advantages * log_probs * 2.0, {}

    config = actor_config(False)
    config.loss_type = "zero_adv_test_weighted"
    assert skips_zero_advantage(config)


def test_samples_to_compute_keeps_order_and_at_least_one():
    data = grouped_batch([2, 2, 2], seed=3)
    keep = torch.tensor([False, True, False, False, True, True])
    part, dropped, carried = samples_to_compute(data, keep)
    assert dropped == 3 and torch.equal(part.batch["input_ids"], data.batch["input_ids"][[1, 4, 5]]) and carried
    part, dropped, carried = samples_to_compute(data, torch.zeros(6, dtype=torch.bool))
    assert dropped == 5 and torch.equal(part.batch["input_ids"], data.batch["input_ids"][[0]]) and not carried
    part, dropped, carried = samples_to_compute(data, torch.ones(6, dtype=torch.bool))
    assert dropped == 0 and part is data and carried


@pytest.mark.timeout(300)
def test_two_ranks_keeping_different_counts_run_equal_passes_and_equal_one_plain_process(ray_cluster, tiny_model_path):
    """Rank 0's samples all have zero advantage, rank 1 keeps two of four: both compute two samples (rank 0 two that
    add nothing), no collective waits forever, and the step is one plain process's step on the whole batch."""
    from easyrl.workers.fsdp_worker import FSDPWorker
    from tests.fsdp_helpers import padded_policy_loss, worker_config, worker_group

    lr = 0.1
    data = batch_with_flat_groups(tiny_model_path, [2, 2, 2, 2], flat_groups={0, 1, 2}, seed=24)
    config = worker_config(tiny_model_path, 2, lr=lr, global_batch_size=8, micro_batch_size=1)
    with worker_group(FSDPWorker, config, "actor", processes=2, name_prefix="zeroadv") as group:
        group.init_model()
        metrics = group.update_actor(data).meta_info["metrics"]
        state = group.get_full_state_dict()
    assert metrics["actor/zero_advantage_skipped"] == pytest.approx(0.5)  # 2 of 4 on each rank
    reference = load_hf_causal_lm(tiny_model_path)
    padded_policy_loss(reference, data, worker_config(tiny_model_path, 1).actor).backward()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            torch.testing.assert_close(state[name], param - lr * param.grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("skip", [True, False])
def test_actor_mfu_counts_the_samples_the_update_computed(skip):
    """Two prompts of 3 tokens, each with responses of 2 and 4 tokens; the first group has zero advantage."""
    import numpy as np

    from easyrl.config import PPOConfig, derive
    from easyrl.protocol import DataProto
    from easyrl.trainer.flops import FlopsCounter, compute_mfu
    from easyrl.trainer.ray_trainer import PPOTrainer
    from tests.test_trainer_flops import _tiny_qwen2

    attention_mask = torch.tensor([[0, 1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1, 1]] * 2)
    advantages = torch.tensor([[0.0] * 4, [0.0] * 4, [0.5] * 4, [-0.5] * 4])
    batch = DataProto.from_dict(
        tensors={"attention_mask": attention_mask, "response_mask": attention_mask[:, 4:], "advantages": advantages},
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )
    config = PPOConfig()
    derive(config)
    config.worker.actor.skip_zero_advantage = skip
    trainer = PPOTrainer.__new__(PPOTrainer)
    trainer.config, trainer._actor_flops, trainer._actor_peak_flops = config, FlopsCounter(_tiny_qwen2()), 1e9
    mfu = trainer._actor_mfu(batch, seconds=2.0)["perf/mfu/actor"]
    sequences = [5, 7] if skip else [5, 7, 5, 7]  # prompt + response tokens of each computed sample
    expected = compute_mfu(FlopsCounter(_tiny_qwen2()).flops(sequences), 2.0, config.world_size, 1e9)
    assert mfu == pytest.approx(expected)


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_the_trainer_spreads_the_computed_samples_over_the_ranks_before_the_update(shared_prefix):
    """Generation-time balancing counted every sample; the informative groups all landed on rank 0. Before the
    update each rank's chunk gets the same computed tokens (whole groups with shared prefixes)."""
    import numpy as np

    from easyrl.config import PPOConfig, derive
    from easyrl.protocol import DataProto
    from easyrl.trainer.ray_trainer import PPOTrainer

    attention_mask = torch.ones(8, 10, dtype=torch.long)
    attention_mask[:, :2] = 0
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0])[:, None].expand(8, 4).clone()
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "d"], dtype=object)
    batch = DataProto.from_dict(
        tensors={"attention_mask": attention_mask, "response_mask": attention_mask[:, 6:], "advantages": advantages},
        non_tensors={"uid": uids},
    )
    config = PPOConfig()
    config.trainer.n_gpus_per_node, config.algorithm.disable_kl = 2, True
    config.worker.actor.shared_prefix = shared_prefix
    config.worker.rollout.n, config.worker.actor.global_batch_size = 2, 4  # one optimizer step: 4 samples a rank
    derive(config)
    trainer = PPOTrainer.__new__(PPOTrainer)
    trainer.config = config
    metrics = {}
    trainer._balance_computed_samples(batch, metrics)
    computed = (batch.batch["advantages"] != 0).any(-1)
    assert computed[:4].sum() == computed[4:].sum() == 2
    assert metrics["perf/dp_token_imbalance_update"] == pytest.approx(1.0)
    rank_uids = [set(batch.non_tensor_batch["uid"][:4]), set(batch.non_tensor_batch["uid"][4:])]
    if shared_prefix:  # groups stay whole: two uids per rank
        assert all(len(uids) == 2 for uids in rank_uids)
    config.worker.actor.skip_zero_advantage = False
    metrics = {}
    trainer._balance_computed_samples(batch, metrics)
    assert metrics == {}  # nothing skipped, the generation-time balance stands


def test_the_computed_samples_trade_ranks_only_within_their_optimizer_step():
    """Two optimizer steps per update (2 samples a rank each): rank r cuts steps from its chunk in order, so the
    samples of step j are the j-th pairs of both chunks. Balancing the whole batch again moved samples between steps,
    and the update differed from the one without the skip (5-10% in pg_loss at step 1 with nothing skipped)."""
    from easyrl.config import PPOConfig, derive
    from easyrl.protocol import DataProto
    from easyrl.trainer.ray_trainer import PPOTrainer

    lengths = torch.tensor([9, 8, 3, 3, 2, 1, 7, 2])
    attention_mask = (torch.arange(10)[None, :] < lengths[:, None]).long()
    advantages = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])[:, None].expand(8, 4).clone()
    batch = DataProto.from_dict(
        tensors={
            "attention_mask": attention_mask,
            "response_mask": torch.ones(8, 4, dtype=torch.long),
            "advantages": advantages,
            "row": torch.arange(8),
        }
    )
    config = PPOConfig()
    config.trainer.n_gpus_per_node, config.algorithm.disable_kl = 2, True
    config.worker.rollout.n, config.worker.actor.global_batch_size = 2, 2
    derive(config)
    assert config.worker.actor.global_batch_size_per_device == 2
    trainer = PPOTrainer.__new__(PPOTrainer)
    trainer.config = config
    metrics = {}
    trainer._balance_computed_samples(batch, metrics)
    rows = batch.batch["row"].tolist()
    steps = [set(rows[0:2] + rows[4:6]), set(rows[2:4] + rows[6:8])]
    assert steps == [{0, 1, 4, 5}, {2, 3, 6, 7}]  # each step holds the samples it held
    computed = [int(n) for n in (batch.batch["attention_mask"].sum(-1) * (batch.batch["advantages"] != 0).any(-1))]
    # within each step the ranks' computed tokens are as even as two rows a rank allow: 9+8 | 2+1 -> 9+1 | 8+2, and
    # 0+3 | 7+2 (row 2 skipped) -> 0+7 | 3+2 or 3+2 | 0+7
    assert [computed[0] + computed[1], computed[4] + computed[5]] == [10, 10]
    assert sorted([computed[2] + computed[3], computed[6] + computed[7]]) == [5, 7]
    assert metrics["perf/dp_token_imbalance_update"] == pytest.approx(17 / 16)


def peaked_model(model_path):
    """The tiny model with its output logits scaled up: a random model's entropy is near log(vocab) on every token,
    which hides how per-token metrics are averaged; scaled, it ranges widely between tokens."""
    model = load_hf_causal_lm(model_path)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model


@pytest.mark.parametrize("off_policy", [False, True])
def test_per_token_metrics_are_the_updates_token_mean_whatever_the_micro_batches(tiny_model_path, off_policy):
    """actor/entropy, ppo_kl and the clip fractions were plain means of the micro-batches' means: micro-batches of 1
    and of 4, dynamic batching or packing moved them (0.84 vs 0.90 entropy on the same batch). Weighted by each
    micro-batch's tokens they are the token mean of the update, as computed here in one piece."""
    data = batch_with_flat_groups(tiny_model_path, [3, 2, 3, 1, 1], flat_groups=set(), seed=23, off_policy=off_policy)
    if not off_policy:
        del data.batch["old_log_probs"]
    with torch.no_grad():
        _, entropy = Actor(actor_config(False, micro_batch_size=10), peaked_model(tiny_model_path))._forward(
            data, data.meta_info["temperature"], calculate_entropy=True
        )
    mask = data.batch["response_mask"]
    per_sample = (entropy * mask).sum(-1) / mask.sum(-1)
    token_mean = float((entropy * mask).sum() / mask.sum())
    assert abs(float(per_sample.mean()) - token_mean) > 0.1  # a mean of sample means would show
    reported = {}
    for micro_batch_size, dynamic, shared_prefix in (
        (1, False, False),
        (4, False, False),
        (3, True, True),
        (10, False, False),
    ):
        config = actor_config(shared_prefix, micro_batch_size=micro_batch_size, dynamic=dynamic)
        config.max_grad_norm, config.skip_zero_advantage = 1e6, False
        if off_policy:
            config.entropy_coef = 1e-3  # the entropy is then a loss term, computed off-policy too
        model = peaked_model(tiny_model_path)
        actor = Actor(config, model, torch.optim.SGD(model.parameters(), lr=0.1), mini_batch_size=len(data))
        reported[(micro_batch_size, dynamic, shared_prefix)] = actor.update_policy(data, on_policy=not off_policy)
    entropies = [metrics["actor/entropy"] for metrics in reported.values()]
    assert entropies == pytest.approx([token_mean] * len(entropies), rel=1e-5), (entropies, token_mean)
    for key in ("actor/ppo_kl", "actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"):
        values = [metrics[key] for metrics in reported.values()]
        assert values == pytest.approx([values[-1]] * len(values), rel=1e-4, abs=1e-7), (key, values)
    assert off_policy == (reported[(10, False, False)]["actor/ppo_kl"] != 0.0)


@pytest.mark.timeout(300)
def test_two_ranks_report_the_token_mean_of_the_whole_batch(ray_cluster, tiny_model_path, tmp_path):
    """Ranks holding different numbers of response tokens: actor/entropy is the token mean over both ranks' tokens
    (each rank weighted by its tokens), not the mean of the two ranks' means."""
    from easyrl.testing.tiny_models import tiny_tokenizer
    from easyrl.workers.fsdp_worker import FSDPWorker
    from tests.fsdp_helpers import worker_config, worker_group

    peaked = peaked_model(tiny_model_path)
    peaked.save_pretrained(tmp_path / "peaked")
    tiny_tokenizer().save_pretrained(tmp_path / "peaked")
    data = batch_with_flat_groups(tiny_model_path, [2, 3, 1, 2], flat_groups=set(), seed=39, off_policy=False)
    del data.batch["old_log_probs"]
    data.meta_info["temperature"] = 0.7  # the workers score at the rollout temperature
    with torch.no_grad():
        _, entropy = Actor(actor_config(False, micro_batch_size=8), peaked)._forward(data, 0.7, calculate_entropy=True)
    mask = data.batch["response_mask"]
    token_mean = float((entropy * mask).sum() / mask.sum())
    halves = [slice(0, 4), slice(4, 8)]  # each rank's share
    rank_means = [float((entropy[h] * mask[h]).sum() / mask[h].sum()) for h in halves]
    assert abs(sum(rank_means) / 2 - token_mean) > 0.05, (rank_means, token_mean)  # the two averages differ here
    config = worker_config(tmp_path / "peaked", 2, global_batch_size=8, micro_batch_size=2)
    config.actor.skip_zero_advantage = False
    with worker_group(FSDPWorker, config, "actor", processes=2, name_prefix="tokmean") as group:
        group.init_model()
        metrics = group.update_actor(data, on_policy=True).meta_info["metrics"]
    assert metrics["actor/entropy"] == pytest.approx(token_mean, rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_workers_with_several_optimizer_steps_train_the_same_first_step_with_and_without_the_skip(
    tiny_model_path, tmp_path
):
    """`easyrl train` on 2 workers, 4 optimizer steps per update, balance_batch on: step 1 generates the same samples
    either way, and its update must be the same (the computed-token balance moved samples between optimizer steps)."""
    from tests.fixtures.trainer_runs import TINY_RUN_OVERRIDES, bare_run, train_args, train_for_metrics

    rows = {}
    for skip in (False, True):
        folder = tmp_path / str(skip)
        folder.mkdir()
        overrides = [
            *TINY_RUN_OVERRIDES,
            "trainer.n_gpus_per_node=2",
            "worker.actor.global_batch_size=1",
            "worker.actor.micro_batch_size_per_device_for_update=2",
            "algorithm.disable_kl=true",
            "worker.rollout.temperature=1.0",
            f"worker.actor.skip_zero_advantage={str(skip).lower()}",
            *bare_run(1, folder / "checkpoints"),
        ]
        rows[skip] = train_for_metrics(train_args(tiny_model_path, folder / "checkpoints", overrides), folder, 1)[1]
    assert rows[False]["reward/overall"] == rows[True]["reward/overall"]  # the same samples
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert rows[True][key] == pytest.approx(rows[False][key], rel=1e-4, abs=1e-7), key


def test_a_step_whose_every_advantage_is_zero_is_said(caplog):
    """A reward that gave every answer the same score trained whole runs for nothing: only grad_norm 0 showed it."""
    import logging

    import numpy as np

    from easyrl.config import PPOConfig, derive
    from easyrl.protocol import DataProto
    from easyrl.trainer.ray_trainer import PPOTrainer

    mask = torch.ones(4, 3, dtype=torch.long)
    config = PPOConfig()
    derive(config)
    trainer = PPOTrainer.__new__(PPOTrainer)
    trainer.config, trainer.global_step = config, 7
    for advantages, said in (
        (torch.zeros(4, 3), True),
        (torch.tensor([[0.0] * 3, [0.0] * 3, [0.5] * 3, [-0.5] * 3]), False),
    ):
        batch = DataProto.from_dict(
            tensors={"response_mask": mask, "advantages": advantages},
            non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            trainer._say_if_nothing_is_learnt(batch)
        assert ("Step 7: every sample's advantage is 0 (algorithm.adv_estimator=grpo" in caplog.text) is said
    # the critic's warmup steps do not update the actor: nothing to say
    config.trainer.critic_warmup = 7
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        trainer._say_if_nothing_is_learnt(
            DataProto.from_dict(tensors={"response_mask": mask, "advantages": torch.zeros(4, 3)})
        )
    assert not caplog.text

"""Token-balanced data-parallel assignment (`trainer.balance_batch`): which rows each rank gets, the imbalance
metric before and after, and GRPO advantages that do not depend on the order."""

import numpy as np
import pytest
import torch

from easyrl.algorithms.advantage import compute_advantage
from easyrl.config import PPOConfig
from easyrl.protocol import DataProto
from easyrl.trainer.balance import balance_permutation, equal_size_balanced_partitions, inverse_permutation
from easyrl.trainer.ray_trainer import PPOTrainer


def masks(lengths: list[int], width: int = 12) -> torch.Tensor:
    """(rows, width) left-padded attention masks with ``lengths`` real tokens."""
    return torch.stack([torch.cat([torch.zeros(width - n), torch.ones(n)]) for n in lengths]).long()


def test_equal_size_partitions_balance_tokens_with_equal_row_counts():
    # longest first, each to the least-loaded rank with room: 10 r0, 9 r1, 8 r1 (9 < 10), 7 r0 (10 < 17),
    # 4 r0 (tie 17/17: lower rank), 3 r1 (17 < 21), 2 r1 (20 < 21) -> r1 full, 1 r0; 22 tokens each
    assert equal_size_balanced_partitions([10, 9, 8, 7, 4, 3, 2, 1], 2) == [[0, 3, 4, 7], [1, 2, 5, 6]]
    # 4 ranks: each gets 2 rows, the loads are 11, 11, 11, 11
    parts = equal_size_balanced_partitions([10, 9, 8, 7, 4, 3, 2, 1], 4)
    assert [len(p) for p in parts] == [2, 2, 2, 2]
    assert sorted(sum([10, 9, 8, 7, 4, 3, 2, 1][i] for i in p) for p in parts) == [11, 11, 11, 11]
    with pytest.raises(ValueError, match="cannot split 7 rows into 2 groups"):
        equal_size_balanced_partitions([1] * 7, 2)


def test_permutation_and_imbalance_metrics_before_and_after():
    order, metrics = balance_permutation(masks([10, 9, 8, 7, 4, 3, 2, 1]), dp_size=2)
    assert order.tolist() == [0, 3, 4, 7, 1, 2, 5, 6]
    # as generated the ranks got 10+9+8+7 = 34 and 4+3+2+1 = 10 tokens: 34 / 22 = 1.5454...; after 22 and 22
    assert metrics["perf/dp_token_imbalance_before"] == pytest.approx(34 / 22)
    assert metrics["perf/dp_token_imbalance"] == 1.0
    assert inverse_permutation(order)[order].tolist() == list(range(8))
    # one rank, or rows that do not split evenly: order kept, the metric still logged
    assert balance_permutation(masks([10, 1]), dp_size=1) == (
        None,
        {"perf/dp_token_imbalance_before": 1.0, "perf/dp_token_imbalance": 1.0},
    )
    order, metrics = balance_permutation(masks([10, 1, 1]), dp_size=2)
    assert order is None and metrics["perf/dp_token_imbalance"] == pytest.approx(11 / 6)


def grpo_batch() -> DataProto:
    """4 prompts x 2 samples; response lengths vary so balancing moves samples of one group to different ranks."""
    lengths = [10, 2, 9, 3, 8, 4, 7, 5]
    rewards = torch.zeros(8, 12)
    scores = [1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 1.0]
    response_mask = masks(lengths)
    for row, score in enumerate(scores):
        rewards[row, -1] = score
    uid = np.array(["a", "a", "b", "b", "c", "c", "d", "d"], dtype=object)
    return DataProto.from_dict(
        {"attention_mask": response_mask, "response_mask": response_mask, "token_level_rewards": rewards},
        {"uid": uid},
    )


def test_grpo_advantages_are_the_same_in_the_balanced_order():
    config = PPOConfig()
    config.algorithm.adv_estimator = "grpo"
    plain = compute_advantage(grpo_batch(), config.algorithm).batch["advantages"]
    balanced = grpo_batch()
    order, _ = balance_permutation(balanced.batch["attention_mask"], dp_size=2)
    balanced.reorder(order)
    # group d (rows 6, 7) moves to rank 0 ahead of group b, which moves to rank 1
    assert order.tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    balanced = compute_advantage(balanced, config.algorithm).batch["advantages"]
    assert torch.equal(balanced[inverse_permutation(order)], plain)
    # group a scored 1 and 0: (score - 0.5) / std 0.7071 = +-0.7071 on every response token; group c (1, 1) gets 0
    assert plain[0, -1].item() == pytest.approx(0.7071, abs=1e-3) and plain[1, -1].item() == pytest.approx(
        -0.7071, abs=1e-3
    )
    assert plain[4].abs().sum().item() == 0.0


@pytest.mark.parametrize("enabled", [True, False])
def test_trainer_reorders_for_the_data_parallel_groups(enabled):
    config = PPOConfig()
    config.trainer.n_gpus_per_node, config.worker.actor.ulysses_size = 4, 2  # 2 data-parallel groups
    config.trainer.balance_batch = enabled
    trainer = PPOTrainer.__new__(PPOTrainer)  # only the config is read
    trainer.config = config
    batch, metrics = grpo_batch(), {}
    order = trainer._balance_batch(batch, metrics)
    # lengths 10 2 9 3 8 4 7 5: 10 r0, 9 r1, 8 r1, 7 r0, 5 r0 (17 = 17), 4 r1, 3 r1 (21 < 22) full, 2 r0: 24 / 24
    expected = [0, 1, 6, 7, 2, 3, 4, 5] if enabled else None
    assert (order.tolist() if order is not None else None) == expected
    assert batch.batch["attention_mask"].sum(-1).tolist() == (
        [10, 2, 7, 5, 9, 3, 8, 4] if enabled else [10, 2, 9, 3, 8, 4, 7, 5]
    )
    assert metrics["perf/dp_token_imbalance_before"] == pytest.approx(24 / 24)

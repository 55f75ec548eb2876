"""Loss aggregation modes, the critic's clipped value loss, and the entropy helpers."""

import math

import pytest
import torch

from easyrl.algorithms.aggregation import aggregate_loss, entropy_bonus, entropy_from_logits, loss_denominator
from easyrl.algorithms.value_loss import compute_value_loss


# rows of lengths 3 and 1; the padded entries hold values that must not count
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_token_mean_weighs_every_token_equally():
    # (1 + 2 + 3 + 4) / 4 tokens = 2.5
    assert aggregate_loss(LOSS, MASK, "token-mean").item() == pytest.approx(2.5)


def test_seq_mean_token_mean_weighs_every_sequence_equally():
    # row means 2 and 4 -> 3
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(3.0)


def test_seq_mean_token_sum_does_not_normalise_length():
    # row sums 6 and 4 -> 5
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(5.0)


def test_seq_mean_token_sum_norm_divides_the_token_sum_by_rows_times_a_constant_length():
    # Dr. GRPO: (6 + 4) / (2 rows x T); without a global denominator T is the matrix's width, 3
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(10 / 6)
    # with one, T is data.max_response_length whatever the padding: a micro-batch of 2 of the mini-batch's 5 rows
    denominator = loss_denominator(rows=5, tokens=17, loss_avg_mode="seq-mean-token-sum-norm", response_length=8)
    assert denominator == 40
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", denominator).item() == pytest.approx(10 / 40)
    # the other modes' counts
    assert [loss_denominator(5, 17, mode, 8) for mode in ("token-mean", "seq-mean-token-mean")] == [17, 5]
    with pytest.raises(ValueError, match="data.max_response_length, here -1"):
        loss_denominator(5, 17, "seq-mean-token-sum-norm", -1)


def test_global_denominator_replaces_the_local_count():
    # a micro-batch holding 4 of the mini-batch's 10 tokens contributes 10 / 10
    assert aggregate_loss(LOSS, MASK, "token-mean", denominator=10).item() == pytest.approx(1.0)


def test_unknown_mode_lists_the_choices():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(LOSS, MASK, "token")


def test_entropy_of_uniform_logits_is_log_vocab():
    assert entropy_from_logits(torch.zeros(2, 3, 4)).flatten().tolist() == pytest.approx([math.log(4)] * 6)


def test_entropy_bonus_is_minus_coef_times_mean_entropy():
    entropy = torch.tensor([[1.0, 3.0]], requires_grad=True)
    term, metrics = entropy_bonus(entropy, torch.ones(1, 2), entropy_coef=0.1, loss_avg_mode="token-mean")
    assert term.item() == pytest.approx(-0.2)
    assert metrics["entropy"] == pytest.approx(2.0)
    zero, _ = entropy_bonus(entropy, torch.ones(1, 2), entropy_coef=0.0, loss_avg_mode="token-mean")
    assert zero.item() == 0.0 and not zero.requires_grad


def test_value_loss_takes_the_larger_of_clipped_and_unclipped():
    # V_old = 0.5, c = 0.2 -> V_clip = 0.7 for both tokens
    # t0: V 1.0, R 1.2: (1.0 - 1.2)^2 = 0.04 vs (0.7 - 1.2)^2 = 0.25 -> 0.25 (clipped term larger)
    # t1: V 2.0, R 0.0: 4.0 vs 0.49 -> 4.0
    # loss = 0.5 * (0.25 + 4.0) / 2 = 1.0625
    vpreds = torch.tensor([[1.0, 2.0]])
    loss, metrics = compute_value_loss(
        vpreds, torch.tensor([[1.2, 0.0]]), torch.full((1, 2), 0.5), torch.ones(1, 2), 0.2, "token-mean"
    )
    assert loss.item() == pytest.approx(1.0625)
    assert metrics["vf_clipfrac"] == pytest.approx(0.5)
    assert metrics["vpred_mean"] == pytest.approx(1.5)

"""Micro-batches by a token budget instead of a fixed sample count (``dynamic_batching``).

Sequences in an RL batch vary a lot in length; fixed-size micro-batches either waste compute on padding or run out
of memory on the longest ones. Here every device cuts its samples into the fewest micro-batches whose real-token
counts stay within ``max_token_len`` (the budget of ``micro_batch_size x padded sequence length``), balancing the
loads with the longest-processing-time greedy rule (Graham 1969). All ranks then use the same number of
micro-batches, because every FSDP forward is a collective. Outputs are put back in the original order.
"""

import heapq
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..utils import device


if TYPE_CHECKING:
    from ..protocol import DataProto


def balanced_partitions(lengths: list[int], num_parts: int) -> list[list[int]]:
    """Split item indices into ``num_parts`` non-empty groups with near-equal length sums (LPT greedy).

    Each group lists its indices in ascending order; groups are ordered by their smallest index.
    """
    if not 1 <= num_parts <= len(lengths):
        raise ValueError(f"Cannot split {len(lengths)} sequences into {num_parts} non-empty micro-batches.")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    heap = [(0, part) for part in range(num_parts)]  # (load, part id)
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    for i in order:
        load, part = heapq.heappop(heap)
        parts[part].append(i)
        heapq.heappush(heap, (load + lengths[i], part))
    parts = [sorted(p) for p in parts]
    return sorted(parts, key=lambda p: p[0])


def max_over_ranks(value: int) -> int:
    """The largest ``value`` of all ranks, on every rank (the value itself without a process group): ranks that must
    run the same number of collective passes agree on it this way."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend() == "nccl":  # nccl moves device tensors only
        tensor = tensor.to(device.get_torch_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def _fits(lengths: list[int], num_parts: int, max_token_len: int) -> bool:
    return max(sum(lengths[i] for i in p) for p in balanced_partitions(lengths, num_parts)) <= max_token_len


def plan_micro_batches(seq_lengths: torch.Tensor, max_token_len: int) -> list[list[int]]:
    """Index groups, one per micro-batch, for sequences of ``seq_lengths`` real tokens under a token budget.

    The count is the smallest that fits the budget on this rank, raised to the largest count of any rank when a
    process group is active (so that every rank runs the same number of forward passes).
    """
    lengths = [int(n) for n in seq_lengths.tolist()]
    if max(lengths) > max_token_len:
        raise ValueError(
            f"A sequence of {max(lengths)} tokens exceeds the dynamic-batching budget of {max_token_len} tokens per "
            "micro-batch; raise the micro_batch_size_per_device_* setting."
        )
    num_parts = max(1, -(-sum(lengths) // max_token_len))
    while num_parts < len(lengths) and not _fits(lengths, num_parts, max_token_len):
        num_parts += 1
    return balanced_partitions(lengths, max_over_ranks(num_parts))


def split_micro_batches(
    data: "DataProto", micro_batch_size: int, dynamic: bool
) -> tuple[list["DataProto"], torch.Tensor | None]:
    """Micro-batches of ``data`` and, for dynamic ones, the permutation their concatenation follows.

    Fixed: consecutive slices of ``micro_batch_size`` samples. Dynamic: token budget ``micro_batch_size`` x the
    padded sequence length, balanced. Use ``restore_order`` on the concatenated outputs.
    """
    if not dynamic:
        return data.split(micro_batch_size), None
    attention_mask = data.batch["attention_mask"]
    max_token_len = micro_batch_size * attention_mask.shape[-1]
    groups = plan_micro_batches(attention_mask.sum(-1), max_token_len)
    permutation = torch.tensor([i for group in groups for i in group], dtype=torch.long)
    return [data[group] for group in groups], permutation


def restore_order(values: torch.Tensor, permutation: torch.Tensor | None) -> torch.Tensor:
    """Undo ``split_micro_batches``' reordering on outputs concatenated along dim 0."""
    if permutation is None:
        return values
    restored = torch.empty_like(values)
    restored[permutation.to(values.device)] = values
    return restored

"""Token-balanced assignment of a training batch to the data-parallel ranks (``trainer.balance_batch``).

The driver hands each data-parallel rank one contiguous, equal-sized chunk of the batch (DP_COMPUTE_PROTO), and
every FSDP step waits for the slowest rank: a rank that drew the long responses sets the pace of all. Reordering the
rows so that every chunk holds about the same number of real tokens (prompt + response) evens the work out. The
partition is the longest-processing-time greedy rule (Graham 1969, as ``models.dynamic_batching.balanced_partitions``)
with one constraint that function does not have: every rank gets exactly ``len(batch) / dp_size`` rows, because the
dispatch cuts equal chunks and every rank must run the same number of micro-batches.

The order only moves rows between ranks: GRPO/RLOO groups are found by their ``uid``, not by adjacency, so the
advantages do not depend on it; it is a pure function of the token counts (ties broken by row index), so a resumed
run reorders its batches exactly as the first run did.
"""

import heapq

import torch


def equal_size_balanced_partitions(lengths: list[int], num_parts: int) -> list[list[int]]:
    """``num_parts`` groups of exactly ``len(lengths) / num_parts`` indices with near-equal length sums: rows are
    taken longest first (ties: lower index first) and each goes to the least-loaded group that still has room
    (ties: lower group). Each group lists its indices in ascending order; groups keep their rank order."""
    if num_parts < 1 or len(lengths) % num_parts:
        raise ValueError(f"cannot split {len(lengths)} rows into {num_parts} groups of equal size")
    size = len(lengths) // num_parts
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    heap = [(0, part) for part in range(num_parts)]  # (load, part id); a full part leaves the heap
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    for i in order:
        load, part = heapq.heappop(heap)
        parts[part].append(i)
        if len(parts[part]) < size:
            heapq.heappush(heap, (load + lengths[i], part))
    return [sorted(p) for p in parts]


def imbalance(lengths: list[int], parts: list[list[int]]) -> float:
    """Most tokens on one rank over the mean per rank (1.0 is perfect balance)."""
    loads = [sum(lengths[i] for i in part) for part in parts]
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0


def groups_by_uid(uids) -> list[list[int]]:
    """Row indices per ``uid`` (the samples of one prompt), in order of first appearance."""
    groups: dict = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    return list(groups.values())


def group_keeping_partitions(lengths: list[int], groups: list[list[int]], num_parts: int) -> list[list[int]]:
    """Equal chunks of ``len(lengths) / num_parts`` rows that keep each group's rows together wherever the sizes
    allow: groups are placed largest first (rows, then tokens; ties: batch order), each whole on the least-loaded
    chunk with room for it; a group no chunk has room for is split over the chunks with the most room, so only the
    groups that must be split are (3 groups of 4 over 2 ranks split 1, not all 3). Each chunk lists its groups (and
    pieces) in batch order. ``groups`` covers every row once."""
    size = len(lengths) // num_parts
    tokens = [sum(lengths[i] for i in group) for group in groups]
    pieces: list[list[list[int]]] = [[] for _ in range(num_parts)]
    rows, loads = [0] * num_parts, [0] * num_parts
    for g in sorted(range(len(groups)), key=lambda g: (-len(groups[g]), -tokens[g], g)):
        fitting = [part for part in range(num_parts) if size - rows[part] >= len(groups[g])]
        left = list(groups[g])
        while left:
            if fitting:
                part = min(fitting, key=lambda part: (loads[part], part))
            else:  # the chunk with the most room takes what it can
                part = min(range(num_parts), key=lambda part: (rows[part] - size, loads[part], part))
            taken, left = left[: size - rows[part]], left[size - rows[part] :]
            pieces[part].append(taken)
            rows[part] += len(taken)
            loads[part] += sum(lengths[i] for i in taken)
    return [[i for piece in sorted(part, key=lambda piece: piece[0]) for i in piece] for part in pieces]


def balance_permutation(
    attention_mask: torch.Tensor, dp_size: int, groups: list[list[int]] | None = None
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The row order that gives each of ``dp_size`` contiguous equal chunks about the same number of real tokens,
    and the metrics ``perf/dp_token_imbalance_before`` (the chunks of the batch as it came) and
    ``perf/dp_token_imbalance`` (after). None (order kept, after = before) when the rows do not split into equal
    chunks, where the dispatch pads and balancing would move padding between ranks. ``groups`` (row indices per
    prompt, ``worker.actor.shared_prefix``): move whole groups, so that a prompt's samples stay together on one rank
    and compute the prompt once (models/prefix_group.py), splitting only the groups the equal chunks force apart."""
    return balance_lengths([int(n) for n in attention_mask.sum(-1).tolist()], dp_size, groups)


def balance_lengths(
    lengths: list[int], dp_size: int, groups: list[list[int]] | None = None
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """``balance_permutation`` of rows of ``lengths`` tokens."""
    count = len(lengths)
    if dp_size <= 1 or count % dp_size:
        chunk = -(-count // max(dp_size, 1))
        before = imbalance(lengths, [list(range(s, min(s + chunk, count))) for s in range(0, count, chunk)])
        return None, {"perf/dp_token_imbalance_before": before, "perf/dp_token_imbalance": before}
    chunk = count // dp_size
    before = imbalance(lengths, [list(range(s, s + chunk)) for s in range(0, count, chunk)])
    if groups is not None:
        parts = group_keeping_partitions(lengths, groups, dp_size)
    else:
        parts = equal_size_balanced_partitions(lengths, dp_size)
    metrics = {"perf/dp_token_imbalance_before": before, "perf/dp_token_imbalance": imbalance(lengths, parts)}
    return torch.tensor([i for part in parts for i in part], dtype=torch.long), metrics


def inverse_permutation(permutation: torch.Tensor) -> torch.Tensor:
    """The order that puts rows reordered by ``permutation`` back where they were."""
    inverse = torch.empty_like(permutation)
    inverse[permutation] = torch.arange(len(permutation), dtype=permutation.dtype)
    return inverse


def per_step_balance(
    lengths: list[int], dp_size: int, step_size: int, groups: list[list[int]] | None = None
) -> tuple[torch.Tensor | None, float]:
    """The row order that balances ``lengths`` (tokens per row) over ``dp_size`` contiguous equal chunks WITHOUT
    changing which rows form each optimizer step: rank r cuts its chunk into steps of ``step_size`` rows in order, so
    step j is the union over ranks of their j-th ``step_size`` rows; each such union is balanced over the ranks on
    its own (``groups``, restricted to it, stay whole where they can). The update equals the batch's own order's (the
    loss denominators are global), and the ranks compute about as much in every step. Returns (order or None when the
    rows do not split into equal chunks of whole steps, the imbalance over the ranks' chunks after it)."""
    count = len(lengths)
    if dp_size <= 1 or count % dp_size or (count // dp_size) % step_size:
        return None, 1.0
    chunk = count // dp_size
    group_of = {i: g for g, members in enumerate(groups or []) for i in members}
    per_rank: list[list[int]] = [[] for _ in range(dp_size)]
    for start in range(0, chunk, step_size):
        rows = [r * chunk + start + i for r in range(dp_size) for i in range(step_size)]
        step_groups = None
        if groups is not None:
            members: dict[int, list[int]] = {}
            for position, row in enumerate(rows):
                members.setdefault(group_of.get(row, -1 - row), []).append(position)
            step_groups = list(members.values())
        order, _ = balance_lengths([lengths[row] for row in rows], dp_size, step_groups)
        placed = [rows[i] for i in order.tolist()] if order is not None else rows
        for r in range(dp_size):
            per_rank[r].extend(placed[r * step_size : (r + 1) * step_size])
    order = torch.tensor([row for rank in per_rank for row in rank], dtype=torch.long)
    return order, imbalance(lengths, per_rank)

"""DAPO dynamic sampling (Yu et al. 2025, arXiv 2503.14476, section 3.2): drop groups that teach nothing.

A group whose n samples all score the same (all wrong, all right) has zero group-relative advantage and only
dilutes the batch. Online filtering keeps the groups whose mean `filter_key` score lies strictly between filter_low and
filter_high (EasyR1's bounds: with the defaults 0.01 / 0.99 a group of exact 0s or 1s is dropped even when the
reward is on another scale) and generates more prompts until `data.rollout_batch_size` groups are collected (at most
`trainer.max_try_make_batch` generation rounds). The trainer owns the generation loop:

    collector = GroupCollector(target_groups=config.data.rollout_batch_size, group_size=config.worker.rollout.n)
    while not collector.full:                       # the trainer stops after trainer.max_try_make_batch rounds
        batch = ...generate and score...            # with non-tensor `uid` and the `filter_key` score per sample
        collector.add(batch, filter_key=algo.filter_key, low=algo.filter_low, high=algo.filter_high)
    batch = collector.take()                        # exactly target_groups groups
    metrics.update(collector.metrics())             # filter/kept_groups, filter/surplus_groups, ...
"""

import difflib
from typing import TYPE_CHECKING

import numpy as np
import torch


if TYPE_CHECKING:
    from ..protocol import DataProto


def _first_seen_groups(uids: np.ndarray) -> list:
    """Group ids in the order they first appear."""
    seen: dict = {}
    for uid in uids.tolist():
        seen.setdefault(uid, None)
    return list(seen)


def select_groups(
    scores: np.ndarray, uids: np.ndarray, filter_low: float, filter_high: float
) -> tuple[np.ndarray, dict[str, float]]:
    """Indices of the samples whose group mean score is in the open interval (filter_low, filter_high), and metrics."""
    keep_idx, metrics, _ = _select(scores, uids, filter_low, filter_high)
    return keep_idx, metrics


def _select(
    scores: np.ndarray, uids: np.ndarray, filter_low: float, filter_high: float
) -> tuple[np.ndarray, dict[str, float], set]:
    """``select_groups``, and the kept groups whose samples all scored alike."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    uids = np.asarray(uids, dtype=object).reshape(-1)
    if scores.shape[0] != uids.shape[0]:
        raise ValueError(f"{scores.shape[0]} scores for {uids.shape[0]} samples.")
    means = {uid: float(scores[uids == uid].mean()) for uid in _first_seen_groups(uids)}
    kept = {uid for uid, mean in means.items() if filter_low < mean < filter_high}
    keep_idx = np.array([i for i, uid in enumerate(uids.tolist()) if uid in kept], dtype=np.int64)
    too_low = sum(mean <= filter_low for mean in means.values())
    # kept groups of two or more samples that all scored alike: a mean inside the bounds (a right answer scoring 0.9
    # on a reward that tops at 1) and a group-relative advantage of 0 for each, which DAPO's filter means to drop
    alike = {uid for uid in kept if (uids == uid).sum() > 1 and np.ptp(scores[uids == uid]) == 0}
    metrics = {
        "filter/kept_groups": float(len(kept)),
        "filter/kept_uniform_groups": float(len(alike)),
        "filter/dropped_groups": float(len(means) - len(kept)),
        "filter/dropped_low": float(too_low),
        "filter/dropped_high": float(len(means) - len(kept) - too_low),
    }
    return keep_idx, metrics, alike


class FilterKeyError(KeyError):
    """`algorithm.filter_key` names no score of the batch (found at the first filtered batch: the reward's score names
    are known only once it has scored)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _sample_scores(data: "DataProto", filter_key: str) -> np.ndarray:
    """One score per sample: a non-tensor array, or a tensor (summed over the response if 2-D)."""
    if filter_key in data.non_tensor_batch:
        return np.asarray(data.non_tensor_batch[filter_key], dtype=np.float64)
    if data.batch is not None and filter_key in data.batch.keys():
        value: torch.Tensor = data.batch[filter_key]
        return (value.sum(-1) if value.dim() > 1 else value).float().cpu().numpy()
    # the per-sample numbers: the reward's named scores (and token-level ones), not the model inputs
    scores = sorted(
        key
        for key, values in data.non_tensor_batch.items()
        if len(values)
        and isinstance(values[0], (float, int, np.floating, np.integer))
        and key not in ("uid", "ground_truth")
    )
    scores += [
        key
        for key in ("token_level_scores", "token_level_rewards")
        if data.batch is not None and key in data.batch.keys()
    ]
    close = difflib.get_close_matches(filter_key, scores, n=1, cutoff=0.6)
    raise FilterKeyError(
        f"`algorithm.filter_key` is `{filter_key}`, but the reward gives no such score"
        + (f": did you mean `{close[0]}`?" if close else ".")
        + f" The scores of each sample: {', '.join(scores)}."
    )


def filter_groups(
    data: "DataProto", filter_key: str, filter_low: float, filter_high: float
) -> tuple["DataProto", dict[str, float], set]:
    """Keep the groups (non-tensor `uid`) whose mean `filter_key` score lies in (filter_low, filter_high); also the
    metrics and the kept groups whose samples all scored alike."""
    if "uid" not in data.non_tensor_batch:
        raise KeyError("Online filtering groups samples by the non-tensor `uid`, which the batch does not have.")
    keep_idx, metrics, alike = _select(
        _sample_scores(data, filter_key), data.non_tensor_batch["uid"], filter_low, filter_high
    )
    return data[keep_idx], metrics, alike


class GroupCollector:
    """Accumulates the surviving groups of successive generation rounds until `target_groups` are collected."""

    def __init__(self, target_groups: int, group_size: int | None = None):
        self.target_groups = target_groups
        self.group_size = group_size
        self._parts: list[DataProto] = []
        self._groups: list = []
        self._uniform: set = set()  # kept groups of 2+ samples whose filter scores are all the same
        self._metrics: dict[str, float] = {}

    @property
    def num_groups(self) -> int:
        return len(self._groups)

    @property
    def full(self) -> bool:
        return self.num_groups >= self.target_groups

    def add(
        self,
        data: "DataProto",
        filter_key: str | None = None,
        low: float = float("-inf"),
        high: float = float("inf"),
    ) -> None:
        """Keep `data`'s groups whose mean `filter_key` score is in (low, high) (all groups without a filter_key)."""
        if filter_key is not None:
            data, metrics, alike = filter_groups(data, filter_key, low, high)
            for key, value in metrics.items():
                self._metrics[key] = self._metrics.get(key, 0.0) + value
            self._uniform |= alike
        if len(data) == 0:
            return
        self._parts.append(data)
        known = set(self._groups)
        self._groups.extend(g for g in _first_seen_groups(data.non_tensor_batch["uid"]) if g not in known)

    def metrics(self) -> dict[str, float]:
        """Group counts over the rounds so far: ``filter/kept_groups`` the groups the batch takes (at most
        target_groups) and ``filter/surplus_groups`` those that passed the filter beyond them (the last round's
        extra groups, generated and dropped); ``filter/kept_uniform_groups`` counts among the kept. The dropped
        counts are of the filter, summed."""
        metrics = dict(self._metrics)
        filtered = "filter/kept_groups" in metrics
        kept = self._groups[: self.target_groups]
        # without a filter too when rounds overshoot (a mini_rollout_batch_size that does not divide the batch)
        if filtered or len(self._groups) > len(kept):
            metrics["filter/kept_groups"] = float(len(kept))
            metrics["filter/surplus_groups"] = float(len(self._groups) - len(kept))
        if filtered:
            metrics["filter/kept_uniform_groups"] = float(sum(uid in self._uniform for uid in kept))
        return metrics

    def take(self) -> "DataProto":
        """The first `target_groups` groups collected, all their samples, in the order they came."""
        from ..protocol import DataProto

        wanted = set(self._groups[: self.target_groups])
        data = DataProto.concat(self._parts)
        uids = data.non_tensor_batch["uid"].tolist()
        keep_idx = np.array([i for i, uid in enumerate(uids) if uid in wanted], dtype=np.int64)
        if self.group_size is not None and len(keep_idx) != len(wanted) * self.group_size:
            raise ValueError(
                f"Collected groups hold {len(keep_idx)} samples, not {len(wanted)} groups x {self.group_size}: "
                "a group was split across generation rounds or lost samples."
            )
        return data[keep_idx]

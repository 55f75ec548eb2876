"""Metrics of one training step: lengths, rewards, advantages and values of the batch; phase timings; throughput.

Metric names (EasyR1/verl spelling for these training metrics; validation's val/reward/<score> and the timings'
timing/<phase> are easyrl's, docs/config.md lists the difference under trainer.logger):

- ``response_length/{mean,max,min,clip_ratio}`` and ``prompt_length/{mean,max,min,clip_ratio}`` (tokens;
  clip_ratio = share of sequences that reached the maximum length)
- ``critic/score/{mean,max,min}``: sequence score (``token_level_scores`` summed over the response)
- ``critic/rewards/{mean,max,min}``: sequence reward after the KL penalty (``token_level_rewards`` summed)
- ``critic/advantages/*``, ``critic/returns/*``, ``critic/values/*`` over response tokens, and
  ``critic/vf_explained_var`` when the batch has values
- ``timing/<phase>`` (seconds) and ``timing_per_token_ms/<phase>``
- ``perf/total_num_tokens``, ``perf/time_per_step``, ``perf/throughput`` (tokens per second per device)
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch

from easyrl.algorithms.masked import masked_var

from .balance import groups_by_uid


if TYPE_CHECKING:
    from easyrl.protocol import DataProto


# Phases that process only the response tokens; every other phase processes prompt + response.
RESPONSE_TOKEN_PHASES = frozenset({"gen"})


def _min_max_mean(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def _response_mask(batch: "DataProto") -> torch.Tensor:
    """(batch, response_len) mask of real response tokens."""
    tensors = batch.batch
    if "response_mask" in tensors.keys():
        return tensors["response_mask"]
    response_len = tensors["responses"].shape[-1]
    return tensors["attention_mask"][:, -response_len:]


def prompt_groups(batch: "DataProto") -> list[tuple[int, list[int]]]:
    """(prompt length, response lengths) of each prompt's samples (rows sharing a ``uid``), padding excluded: what
    shared-prefix packing computes (each prompt once; a group cut over micro-batches computes it again, which this
    does not count)."""
    response_mask = _response_mask(batch)
    prompt_lengths = batch.batch["attention_mask"][:, : -response_mask.shape[-1]].sum(-1).tolist()
    response_lengths = response_mask.sum(-1).tolist()
    return [
        (int(prompt_lengths[rows[0]]), [int(response_lengths[i]) for i in rows])
        for rows in groups_by_uid(batch.non_tensor_batch["uid"])
    ]


def compute_data_metrics(
    batch: "DataProto",
    use_critic: bool = True,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
) -> dict[str, float]:
    """Length, score, reward, advantage, return and value statistics of a batch after the advantage step.

    Value statistics need ``use_critic`` and ``values`` in the batch. Maximum lengths default to the padded widths of ``prompts`` / ``responses`` (the rollout pads to
    ``data.max_prompt_length`` / ``data.max_response_length``); pass them when the batch is padded differently.
    """
    tensors = batch.batch
    keys = set(tensors.keys())
    response_mask = _response_mask(batch).bool()  # (batch, response_len)
    response_width = response_mask.shape[-1]
    prompt_mask = tensors["attention_mask"][:, :-response_width].bool()  # (batch, prompt_len)
    response_length = response_mask.sum(-1).float()  # (batch,)
    prompt_length = prompt_mask.sum(-1).float()  # (batch,)
    max_response_length = max_response_length or response_width
    max_prompt_length = max_prompt_length or prompt_mask.shape[-1]

    # a response is cut when its whole span reaches the limit: in a multi-turn trajectory that span holds the tool
    # results and observations too, which the response mask (the model's own tokens, what response_length counts)
    # leaves out, so the clip ratio read 0 when every trajectory was cut
    span = tensors["attention_mask"][:, -response_width:].sum(-1).float()
    metrics = {
        **_min_max_mean("response_length", response_length),
        "response_length/clip_ratio": (span >= max_response_length).float().mean().item(),
        **_min_max_mean("prompt_length", prompt_length),
        "prompt_length/clip_ratio": (prompt_length >= max_prompt_length).float().mean().item(),
    }
    for key, name in (("token_level_scores", "critic/score"), ("token_level_rewards", "critic/rewards")):
        if key in keys:
            metrics.update(_min_max_mean(name, tensors[key].sum(-1)))  # (batch,) per-sequence totals
    if not use_critic:
        keys.discard("values")
    for key in ("advantages", "returns", "values"):
        if key in keys:
            metrics.update(_min_max_mean(f"critic/{key}", tensors[key][response_mask]))
    if {"values", "returns"} <= keys:
        # 1 - Var[R - V] / Var[R]: share of the return variance the critic explains (1 is perfect, <= 0 useless).
        returns, values, mask = tensors["returns"], tensors["values"], response_mask.float()
        explained = 1.0 - masked_var(returns - values, mask) / (masked_var(returns, mask) + 1e-5)
        metrics["critic/vf_explained_var"] = explained.item()
    return metrics


def _token_counts(batch: "DataProto") -> tuple[float, float]:
    """(response tokens, all tokens) in the batch, padding excluded."""
    response_tokens = _response_mask(batch).sum().item()
    all_tokens = batch.batch["attention_mask"].sum().item()
    return response_tokens, all_tokens


def compute_timing_metrics(batch: "DataProto | None", timing_raw: dict[str, float]) -> dict[str, float]:
    """``timing/<phase>`` in seconds and, given the batch (None skips them), ``timing_per_token_ms/<phase>``."""
    metrics = {f"timing/{name}": seconds for name, seconds in timing_raw.items()}
    if batch is not None:
        response_tokens, all_tokens = _token_counts(batch)
        for name, seconds in timing_raw.items():
            tokens = response_tokens if name in RESPONSE_TOKEN_PHASES else all_tokens
            metrics[f"timing_per_token_ms/{name}"] = 1000.0 * seconds / max(tokens, 1)
    return metrics


def compute_throughput_metrics(batch: "DataProto", timing_raw: dict[str, float], n_devices: int) -> dict[str, float]:
    """Tokens (prompt + response, no padding) processed per second per device over the whole step."""
    if "step" not in timing_raw:
        raise KeyError("compute_throughput_metrics needs timing_raw['step']: time the step with timer('step', ...)")
    _, all_tokens = _token_counts(batch)
    step_seconds = timing_raw["step"]
    return {
        "perf/total_num_tokens": all_tokens,
        "perf/time_per_step": step_seconds,
        "perf/throughput": all_tokens / (step_seconds * n_devices),
    }


@contextmanager
def timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block to ``timing_raw[name]`` (repeated phases, e.g. refill rounds, add up)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start


def append_metrics(accumulated: dict[str, list], metrics: dict) -> None:
    """Collect one micro-batch's metrics: ``accumulated[name]`` grows by the new value(s)."""
    for name, value in metrics.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        accumulated.setdefault(name, []).extend(values)


def reduce_metrics(metrics: dict[str, list]) -> dict[str, float]:
    """The mean of each metric's values; metrics with no values this step are left out."""
    reduced = {}
    for name, values in metrics.items():
        values = values if isinstance(values, (list, tuple)) else [values]
        if len(values) > 0:
            reduced[name] = float(np.mean([float(value) for value in values]))
    return reduced

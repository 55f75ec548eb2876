"""What every rollout engine promises: prompts in, padded responses with masks and log-probs out.

Input (one rank's share of the prompts, a DataProto):
    input_ids       (batch, prompt_len)  left-padded prompt tokens
    attention_mask  (batch, prompt_len)
    position_ids    (batch, prompt_len), or (batch, rows, prompt_len) for Qwen-VL multimodal rope
    raw_prompt_ids  non-tensor: list[int] per row, unpadded, ONE pad token per image (what vLLM expects)
    multi_modal_data non-tensor, optional: {"images": [...], "videos": [...]} per row
How to sample is a typed parameter of the call, ``GenerationRequest`` (validation settings, an override such as
ReMax's greedy baseline, this call's seed), never a loose key of the batch.

Output (batch * n rows, the n samples of a prompt next to each other):
    prompts            (batch*n, prompt_len)            the left-padded prompt
    responses          (batch*n, response_len)          right-padded with the pad id
    response_mask      (batch*n, response_len)          1 on generated tokens (the eos included)
    input_ids          (batch*n, prompt_len + response_len)  prompts ++ responses
    attention_mask     (batch*n, prompt_len + response_len)
    position_ids       (batch*n, [rows,] prompt_len + response_len)  the prompt's, continued
    rollout_log_probs  (batch*n, response_len)          the engine's log-prob of each sampled token, 0 on padding
    every non-tensor of the input, repeated n times; meta_info["metrics"] with generation metrics.
"""

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

import torch

from ...config import RolloutConfig


WeightBuckets = Iterable[list[tuple[str, torch.Tensor]]]


@dataclass(frozen=True)
class GenerationRequest:
    """How one generate call samples, on top of ``worker.rollout``."""

    validate: bool = False
    """Sample with ``worker.rollout.val_override_config`` applied (validation)."""
    sampling_override: Optional[dict] = None
    """Sampling keys replaced for this call (applied last), e.g. {"temperature": 0, "n": 1} for a greedy baseline."""
    seed: Any = None
    """This call's sampling seed (an int or a list of ints, e.g. the trainer's (rollout.seed, kind, step, round)):
    a resumed run samples what the uninterrupted run sampled. None: the engine's running generator."""


class BaseRollout(ABC):
    """A generation engine living in the worker process next to the actor (the hybrid engine)."""

    @abstractmethod
    def generate_sequences(self, prompts: Any, request: Optional[GenerationRequest] = None) -> Any:
        """DataProto of prompts -> DataProto of responses (see the module docstring for the keys)."""

    @abstractmethod
    def update_weights(self, buckets: WeightBuckets) -> None:
        """Load new policy weights given as buckets of (Hugging Face name, full tensor). A collective when the
        buckets come from a sharded model: every rank consumes them in step."""

    def sleep(self) -> None:
        """Release device memory between generations (GPU engines); a no-op by default."""
        return None

    def wake_up(self) -> None:
        """Take the memory back before the next weight sync / generation; a no-op by default."""
        return None


# ----------------------------------------------------------------------------------------------------------------------
# sampling settings
# ----------------------------------------------------------------------------------------------------------------------
# vLLM sampling settings validation may set beside easyrl's own (EasyR1 and verl pass any SamplingParams attribute of
# val_override_config to vLLM); training samples without them, since the actor's log-probs assume plain temperature
# sampling. HuggingFace generate takes repetition_penalty alone (check refuses the others with worker.rollout.name=hf).
VAL_ENGINE_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p")


@dataclass(frozen=True)
class SamplingSettings:
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    ignore_eos: bool
    engine: tuple = ()  # (name, value) pairs of VAL_ENGINE_KEYS, validation only

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def engine_n(self) -> int:
        """Samples to ask the engine for: greedy decoding gives one answer, copied ``n`` times afterwards (vLLM and
        HF both refuse n > 1 without sampling)."""
        return 1 if self.greedy else self.n


def repeat_greedy(rows: list, settings: SamplingSettings) -> list:
    """Copy each greedy answer ``n`` times so that every prompt still has ``n`` consecutive samples."""
    times = settings.n // settings.engine_n
    return [row for row in rows for _ in range(times)]


def _apply_overrides(
    settings: SamplingSettings, overrides: dict, source: str, engine_keys: tuple = ()
) -> SamplingSettings:
    known = {f.name for f in fields(SamplingSettings)} - {"max_tokens", "engine"}
    unknown = sorted(set(overrides) - known - set(engine_keys))
    if unknown:
        raise ValueError(
            f"`{source}` has unknown sampling key(s) {unknown}; allowed keys are {sorted([*known, *engine_keys])} "
            "(the response length is `data.max_response_length`)."
        )
    engine = tuple(sorted((key, value) for key, value in overrides.items() if key in engine_keys))
    own = {key: value for key, value in overrides.items() if key not in engine_keys}
    return replace(settings, **own, engine=engine) if engine else replace(settings, **own)


def resolve_sampling(config: RolloutConfig, request: Optional[GenerationRequest] = None) -> SamplingSettings:
    """Sampling settings of one generate call: the rollout config, then ``val_override_config`` when
    ``request.validate``, then ``request.sampling_override``."""
    request = request or GenerationRequest()
    if config.response_length <= 0:
        raise ValueError(
            f"`worker.rollout.response_length` is {config.response_length}: it is copied from "
            "`data.max_response_length` by PPOConfig.post_init(); set data.max_response_length > 0."
        )
    settings = SamplingSettings(
        n=config.n,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        max_tokens=config.response_length,
        ignore_eos=config.ignore_eos,
    )
    if request.validate:
        settings = _apply_overrides(
            settings, config.val_override_config, "worker.rollout.val_override_config", VAL_ENGINE_KEYS
        )
    if request.sampling_override:
        settings = _apply_overrides(settings, request.sampling_override, "GenerationRequest.sampling_override")
    return settings


# ----------------------------------------------------------------------------------------------------------------------
# the output contract
# ----------------------------------------------------------------------------------------------------------------------
def prompt_token_lists(prompts: Any, pad_token_id: int) -> list[list[int]]:
    """Unpadded prompt ids per row: ``raw_prompt_ids`` when the data provides them (one pad per image), else the
    attended part of the left-padded ``input_ids``."""
    raw = prompts.non_tensor_batch.get("raw_prompt_ids")
    if raw is not None:
        return [list(map(int, ids)) for ids in raw]
    input_ids, attention_mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    return [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]


def continue_position_ids(position_ids: torch.Tensor, response_length: int) -> torch.Tensor:
    """Positions of the response tokens: each row of the prompt's positions goes on counting from its last value.

    position_ids: (batch, prompt_len) for text, or (batch, rows, prompt_len) for multimodal rope (Qwen2-VL's 3 rows
    of temporal/height/width positions; text after the vision tokens advances all rows together, so "last + k" holds
    for every row). Returns (batch, [rows,] response_length).
    """
    delta = torch.arange(1, response_length + 1, dtype=position_ids.dtype, device=position_ids.device)
    return position_ids[..., -1:] + delta  # broadcasts over any leading dims


def _pad_right(rows: list[list], length: int, value: float, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), length), value, dtype=dtype)
    for i, row in enumerate(rows):
        row = row[:length]
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def build_rollout_output(
    prompts: Any,
    response_ids: list[list[int]],
    response_log_probs: list[list[float]],
    *,
    n: int,
    response_length: int,
    pad_token_id: int,
    metrics: dict[str, float] | None = None,
) -> Any:
    """Assemble the output DataProto from per-sample token lists (``n`` consecutive samples per prompt)."""
    from ...protocol import DataProto

    batch_size = len(prompts)
    if len(response_ids) != batch_size * n:
        raise ValueError(f"Expected {batch_size} prompts x {n} samples responses, got {len(response_ids)}.")
    repeated = prompts.repeat(n, interleave=True)
    prompt_ids = repeated.batch["input_ids"]  # (batch*n, prompt_len)
    prompt_mask = repeated.batch["attention_mask"]
    prompt_positions = repeated.batch["position_ids"]

    responses = _pad_right(response_ids, response_length, pad_token_id, prompt_ids.dtype)  # (batch*n, resp_len)
    lengths = torch.tensor([min(len(r), response_length) for r in response_ids])
    response_mask = (torch.arange(response_length) < lengths[:, None]).to(prompt_mask.dtype)
    log_probs = _pad_right(response_log_probs, response_length, 0.0, torch.float32)

    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=-1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
        "position_ids": torch.cat([prompt_positions, continue_position_ids(prompt_positions, response_length)], -1),
        "rollout_log_probs": log_probs,
    }
    return DataProto.from_dict(
        tensors=tensors, non_tensors=repeated.non_tensor_batch, meta_info={"metrics": metrics or {}}
    )


def finish_rollout(
    prompts: Any,
    response_ids: list[list[int]],
    response_log_probs: list[list[float]],
    settings: SamplingSettings,
    pad_token_id: int,
    seconds: float,
) -> Any:
    """Every engine's last step: greedy answers copied to ``n`` samples, the padded output, generation metrics."""
    data = build_rollout_output(
        prompts,
        repeat_greedy(response_ids, settings),
        repeat_greedy(response_log_probs, settings),
        n=settings.n,
        response_length=settings.max_tokens,
        pad_token_id=pad_token_id,
    )
    data.meta_info["metrics"] = generation_metrics(data.batch["response_mask"], seconds)
    return data


# ----------------------------------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------------------------------
class GenerationTimer:
    """Wall time of one generate call, for tokens/s."""

    def __enter__(self) -> "GenerationTimer":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.start


def format_turns(messages: Any) -> str:
    """A multi-turn trajectory's messages (the model's turns, tool results, observations) as text for a generations
    table: each message's text after `[role]` (`[tool name]` for a tool's), a picture written `<image>`."""
    lines = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(
                part.get("text", "") if part.get("type") == "text" else f"<{part.get('type')}>" for part in content
            )
        who = f"{message['role']} {message['name']}" if message.get("name") else message["role"]
        lines.append(f"[{who}] {content}")
    return "\n".join(lines)


def generation_metrics(
    response_mask: torch.Tensor, seconds: float, attended: torch.Tensor | None = None
) -> dict[str, float]:
    """Throughput and response-length statistics of one generate call.

    response_mask: (batch*n, response_len), the model's tokens. The clip ratio is the share of responses cut at the
    length limit, measured on ``attended`` (the response part of the attention mask) when given: a multi-turn
    trajectory's span holds tool results too, which the response mask leaves out.
    """
    lengths = response_mask.sum(-1).float()
    spans = lengths if attended is None else attended.sum(-1).float()
    max_length = response_mask.shape[-1]
    total_tokens = float(lengths.sum())
    return {
        "rollout/gen_tokens_per_s": total_tokens / max(seconds, 1e-9),
        "rollout/gen_seconds": seconds,
        "rollout/gen_tokens": total_tokens,
        "rollout/gen_responses": float(len(lengths)),
        "rollout/response_length/mean": float(lengths.mean()) if len(lengths) else 0.0,
        "rollout/response_length/max": float(lengths.max()) if len(lengths) else 0.0,
        "rollout/response_length/clip_ratio": float((spans >= max_length).float().mean()) if len(lengths) else 0.0,
    }


def rollout_logprob_mismatch(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the actor's on the sampled tokens.

    All inputs (batch, response_len). A large gap means the engine and the trainer disagree (stale weights, dtype,
    kernels) and the samples are more off-policy than the algorithm assumes.
    """
    mask = response_mask.bool()
    diff = (old_log_probs.float() - rollout_log_probs.float()).abs()[mask]
    if diff.numel() == 0:
        return {"rollout/logprob_abs_diff/mean": 0.0, "rollout/logprob_abs_diff/max": 0.0}
    return {"rollout/logprob_abs_diff/mean": float(diff.mean()), "rollout/logprob_abs_diff/max": float(diff.max())}

"""Rollout with Hugging Face ``generate`` on the actor itself (``worker.rollout.name=hf``), for where vLLM is absent.

Slower than vLLM but needs no second copy of the weights and no sync: the engine IS the (FSDP-sharded) actor.
Every rank runs the decoding loop for as many steps as the slowest rank (``synced_gpus``), because each forward
of a sharded model is a collective.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ...config import RolloutConfig
from ...utils import device
from .base import (
    BaseRollout,
    GenerationRequest,
    GenerationTimer,
    SamplingSettings,
    WeightBuckets,
    finish_rollout,
    resolve_sampling,
)


def _generate_kwargs(settings: SamplingSettings, eos_token_id: Any, pad_token_id: int) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "max_new_tokens": settings.max_tokens,
        "num_return_sequences": settings.engine_n,  # samples of a prompt come out next to each other
        "eos_token_id": None if settings.ignore_eos else eos_token_id,
        "pad_token_id": pad_token_id,
        "use_cache": True,
        "return_dict_in_generate": True,
        "output_logits": True,
        "synced_gpus": dist.is_initialized() and dist.get_world_size() > 1,
        **dict(settings.engine),  # check lets validation set only what generate takes (HF_ENGINE_KEYS)
    }
    if settings.greedy:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(
            do_sample=True,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k if settings.top_k > 0 else None,
        )
    return kwargs


def _response_lists(
    sequences: torch.Tensor, logits: tuple[torch.Tensor, ...], prompt_len: int, eos_ids: set[int], settings: Any
) -> tuple[list[list[int]], list[list[float]]]:
    """Cut each generated row after its first eos; log-probs at the sampling temperature (as vLLM reports them)."""
    generated = sequences[:, prompt_len:]  # (batch*n, steps)
    scale = 1.0 if settings.greedy else settings.temperature
    # one step at a time: the stacked (batch*n, steps, vocab) fp32 tensor would be large
    log_probs = torch.stack(
        [
            torch.log_softmax(step.float() / scale, dim=-1).gather(-1, generated[:, t, None]).squeeze(-1)
            for t, step in enumerate(logits)
        ],
        dim=1,
    )  # (batch*n, steps)
    response_ids, response_log_probs = [], []
    for tokens, token_log_probs in zip(generated.tolist(), log_probs.tolist()):
        length = len(tokens)
        if not settings.ignore_eos:
            length = next((i + 1 for i, token in enumerate(tokens) if token in eos_ids), length)
        response_ids.append(tokens[:length])
        response_log_probs.append(token_log_probs[:length])
    return response_ids, response_log_probs


@contextlib.contextmanager
def _seeded(seed: Any) -> Iterator[None]:
    """Sample from the request's seed (an int or a list of ints; mixed with the rank) when given, leaving the
    process RNG of the actor as it was; else from the process RNG."""
    if seed is None:
        yield
        return
    rank = dist.get_rank() if dist.is_initialized() else 0
    derived = int(np.random.default_rng([*np.atleast_1d(seed), rank]).integers(0, 2**63 - 1))
    devices = [device.get_torch_device()] if device.is_cuda_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(derived)
        yield


class HFRollout(BaseRollout):
    def __init__(self, module: torch.nn.Module, config: RolloutConfig, tokenizer: Any) -> None:
        self.module = module
        self.config = config
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = module.generation_config.eos_token_id if module.generation_config is not None else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_token_id = eos
        self.eos_ids = set(eos) if isinstance(eos, list) else {eos}

    def update_weights(self, buckets: WeightBuckets) -> None:
        """Nothing to copy: generation runs on the actor's own parameters (the buckets are never pulled, so no
        collective runs on any rank)."""

    @torch.no_grad()
    def generate_sequences(self, prompts: Any, request: GenerationRequest | None = None) -> Any:
        if prompts.non_tensor_batch.get("multi_modal_data") is not None:
            raise NotImplementedError(
                "`worker.rollout.name=hf` generates text only; use `worker.rollout.name=vllm` for image/video prompts."
            )
        request = request or GenerationRequest()
        settings = resolve_sampling(self.config, request)
        input_ids = prompts.batch["input_ids"].to(device.get_torch_device())  # (batch, prompt_len), left-padded
        attention_mask = prompts.batch["attention_mask"].to(input_ids.device)
        was_training = self.module.training
        self.module.eval()
        try:
            with _seeded(request.seed), GenerationTimer() as timer:
                out = self.module.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    **_generate_kwargs(settings, self.eos_token_id, self.pad_token_id),
                )
        finally:
            self.module.train(was_training)
        response_ids, response_log_probs = _response_lists(
            out.sequences.cpu(), tuple(x.cpu() for x in out.logits), input_ids.shape[1], self.eos_ids, settings
        )
        return finish_rollout(prompts, response_ids, response_log_probs, settings, self.pad_token_id, timer.seconds)

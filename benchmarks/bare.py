"""The baselines easyrl is measured against: bare vLLM generation and a bare single-process torch training loop.

Both redo work recorded from an easyrl run (same prompt ids, same sampling settings, same update batches and
micro-batch sizes) in this process, with nothing of easyrl in the way: no Ray, no worker groups, no DataProto.
"""

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Generated:
    seconds: float
    response_tokens: int
    token_ids: list[list[int]] = field(default_factory=list)  # per sample, prompt-major (n consecutive per prompt)
    log_probs: list[list[float]] = field(default_factory=list)  # the sampled tokens' log-probs, same layout


class BareVLLM:
    """One in-process vLLM engine with the engine settings easyrl's rollout uses (from its RolloutConfig)."""

    def __init__(self, model_path: str, rollout: Any, max_model_len: int) -> None:
        # the same two CPU fixes easyrl's rollout applies: no torch.compile of the log-prob gather (4-20 s on the
        # first call, identical numbers) and an explicit KV-cache size (vLLM reads gpu_memory_utilization as a share
        # of host RAM on CPU)
        os.environ["TORCHDYNAMO_DISABLE"] = "1"
        # easyrl's single worker gets OMP_NUM_THREADS = all cores from Ray, and vLLM keeps that many torch threads
        # for serving; without it vLLM drops to one thread
        os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
        from transformers import GenerationConfig
        from vllm import LLM

        from easyrl.utils import device
        from easyrl.workers.rollout.vllm_rollout import CPU_KV_BLOCK_SIZE

        self.rollout = rollout
        kwargs: dict[str, Any] = {}
        if rollout.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = rollout.kv_cache_memory_bytes
        if not device.is_cuda_available():  # the block size easyrl's engine gets on CPU (its prompts share blocks)
            kwargs["block_size"] = CPU_KV_BLOCK_SIZE
        self.llm = LLM(
            model=model_path,
            dtype={"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[rollout.dtype],
            seed=rollout.seed,
            max_model_len=max_model_len,
            max_num_batched_tokens=rollout.max_num_batched_tokens,
            enable_chunked_prefill=rollout.enable_chunked_prefill,
            enforce_eager=rollout.enforce_eager,
            disable_log_stats=True,
            logprobs_mode="processed_logprobs",
            **kwargs,
        )
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        self.stop_token_ids = sorted(set(eos if isinstance(eos, list) else [eos])) if eos is not None else []

    def generate(
        self, prompt_ids: list[list[int]], max_tokens: int, seed: int = 0, seeds: list[int] | None = None
    ) -> Generated:
        """n samples per prompt with the rollout's sampling settings and the sampled tokens' log-probs.

        ``seeds``: one per prompt (e.g. the seeds easyrl's engine used for the same call, so that both sample the same
        tokens); else prompt i gets ``seed + i``."""
        from vllm import SamplingParams

        rollout = self.rollout
        seeds = seeds if seeds is not None else [seed + i for i in range(len(prompt_ids))]
        params = [
            SamplingParams(
                n=rollout.n,
                temperature=rollout.temperature,
                top_p=rollout.top_p,
                top_k=rollout.top_k if rollout.top_k > 0 else 0,
                max_tokens=max_tokens,
                ignore_eos=rollout.ignore_eos,
                stop_token_ids=self.stop_token_ids,
                logprobs=0,
                detokenize=False,
                seed=prompt_seed,
            )
            for prompt_seed in seeds
        ]
        start = time.perf_counter()
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        samples = [c for o in outputs for c in sorted(o.outputs, key=lambda c: c.index)]
        token_ids = [list(c.token_ids) for c in samples]
        log_probs = [[step[t].logprob for step, t in zip(c.logprobs or [], c.token_ids)] for c in samples]
        return Generated(seconds, sum(map(len, token_ids)), token_ids, log_probs)


# ----------------------------------------------------------------------------------------------------------------------
# a bare GRPO update: the same forward/backward work as the actor's, written as plainly as possible
# ----------------------------------------------------------------------------------------------------------------------
def response_log_probs(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """(batch, response_len) log-probs of the response tokens."""
    responses = batch["responses"]  # (batch, response_len)
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    ).logits  # (batch, prompt_len + response_len, vocab)
    logits = logits[:, -responses.shape[1] - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def split(batch: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    total = next(iter(batch.values())).shape[0]
    return [{k: v[i : i + size] for k, v in batch.items()} for i in range(0, total, size)]


class BareTrainer:
    """Plain torch: HF model, AdamW, one no-grad log-prob pass then clipped-ratio updates in micro-batches."""

    KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages")

    def __init__(self, model_path: str, actor: Any, temperature: float, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=actor.optim.lr, betas=tuple(actor.optim.betas), weight_decay=0.0
        )
        self.actor, self.temperature, self.dtype = actor, temperature, dtype

    def _autocast(self):
        return torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype != torch.float32)

    def step(self, batch: dict[str, torch.Tensor], old_log_prob_pass: bool = True) -> float:
        """One rollout batch: [old log-probs,] then one optimizer step over it; returns the seconds it took.

        Without the old-log-prob pass (on-policy: one epoch, one mini-batch) the ratio is 1 and the update's own
        detached log-probs stand in for the old ones, as the trainer does."""
        batch = {k: batch[k] for k in self.KEYS}
        actor, clip_low, clip_high = self.actor, self.actor.clip_ratio_low, self.actor.clip_ratio_high
        start = time.perf_counter()
        if old_log_prob_pass:
            self.model.eval()
            with torch.no_grad(), self._autocast():
                batch["old_log_probs"] = torch.cat(
                    [
                        response_log_probs(self.model, mb, self.temperature)
                        for mb in split(batch, actor.micro_batch_size_per_device_for_experience)
                    ]
                )
        self.model.train()
        tokens = batch["response_mask"].sum()
        for mb in split(batch, actor.micro_batch_size_per_device_for_update):
            with self._autocast():
                log_probs = response_log_probs(self.model, mb, self.temperature)
            old_log_probs = mb["old_log_probs"] if old_log_prob_pass else log_probs.detach()
            ratio = torch.exp(log_probs - old_log_probs)  # (micro, response_len)
            advantages = mb["advantages"]
            loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_low, 1 + clip_high))
            ((loss * mb["response_mask"]).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), actor.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start


def trim_padding(batch: dict[str, torch.Tensor], prompt_width: int) -> dict[str, torch.Tensor]:
    """Drop the padding columns every row shares: prompt columns left of the longest prompt and response columns
    right of the longest response (what a loop that pads to the batch's longest sequence computes on)."""
    mask = batch["attention_mask"]  # (batch, prompt_width + response_width)
    first = int(mask[:, :prompt_width].any(0).nonzero().min())  # first prompt column any row uses
    last = int(batch["response_mask"].any(0).nonzero().max()) + 1  # response columns any row uses
    out = {}
    for key, value in batch.items():
        if value.shape[1] == mask.shape[1]:  # full sequence
            out[key] = value[:, first : prompt_width + last]
        else:  # response only
            out[key] = value[:, :last]
    return out


def update_batch_tensors(data: Any) -> dict[str, torch.Tensor]:
    """The tensors of a recorded ``update_actor`` DataProto, on CPU."""
    return {k: data.batch[k].cpu() for k in BareTrainer.KEYS}

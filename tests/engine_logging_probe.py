"""Run as ``python -m tests.engine_logging_probe RUN_DIR``: one worker-like process (logging set up as a worker does,
a vLLM engine in the process, a weight sync of perturbed weights, then the compiled log-prob kernels). Writes its
findings to RUN_DIR/probe_report.json; the console output itself is what the calling test inspects."""

import json
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist

from easyrl.utils.logging import setup_worker_logging
from easyrl.workers.rollout.base import GenerationRequest


RESPONSE_LENGTH = 8


def main(run_dir: str) -> dict:
    setup_worker_logging(run_dir, rank=0)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)

    from transformers import AutoModelForCausalLM

    from easyrl.config import RolloutConfig
    from easyrl.protocol import DataProto
    from easyrl.testing.tiny_models import build_tiny_causal_lm, tiny_tokenizer
    from easyrl.utils.torch_functional import (
        compiled_kernel_calls,
        select_logprob_kernels,
        torch_compile_unavailable_reason,
    )
    from easyrl.workers.rollout.vllm_rollout import VLLMRollout

    tokenizer = tiny_tokenizer()
    path = build_tiny_causal_lm(os.path.join(run_dir, "tiny"), tie_word_embeddings=True)
    config = RolloutConfig(
        dtype="fp32",
        tensor_parallel_size=1,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        prompt_length=32,
        response_length=RESPONSE_LENGTH,
        disable_tqdm=True,
    )
    rollout = VLLMRollout(str(path), config, tokenizer, rank=0, world_size=1)
    engine_model = rollout.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
    rotary = next(m for m in engine_model.modules() if type(m).__name__.endswith("RotaryEmbedding"))
    rotary_cache = rotary.cos_sin_cache.clone()

    # the actor after an update: every weight moved; streamed one decoder layer per bucket, as the actor does
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in actor.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.2)
    buckets: dict[str, list] = {}
    for name, param in actor.named_parameters():  # a tied lm_head is the embedding: named once
        key = name.split(".")[2] if name.startswith("model.layers.") else "rest"
        buckets.setdefault(key, []).append((name, param.detach()))
    rollout.update_weights(iter(buckets.values()))

    ids = tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]
    raw = np.empty(1, dtype=object)
    raw[:] = [ids]
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": torch.tensor([ids]),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "position_ids": torch.arange(len(ids))[None],
        },
        non_tensors={"raw_prompt_ids": raw},
    )
    output = rollout.generate_sequences(prompts, GenerationRequest(sampling_override={"temperature": 0.0}))
    with torch.no_grad():
        hf_greedy = actor.generate(
            torch.tensor([ids]), max_new_tokens=RESPONSE_LENGTH, do_sample=False, eos_token_id=None
        )[0, len(ids) :].tolist()
    vllm_greedy = output.batch["responses"][0][output.batch["response_mask"][0].bool()].tolist()

    embedding = engine_model.model.embed_tokens.weight
    log_probs_fn, _ = select_logprob_kernels(True)
    logits = torch.randn(16, 128)
    log_probs_fn(logits, torch.randint(0, 128, (16,)), 1.0)
    return {
        "vllm_greedy": vllm_greedy,
        "hf_greedy": hf_greedy,
        "embedding_max_diff": (embedding - actor.model.embed_tokens.weight).abs().max().item(),
        "lm_head_is_embedding": engine_model.lm_head.weight is embedding,
        "rotary_cache_unchanged": bool(torch.equal(rotary.cos_sin_cache, rotary_cache)),
        "compiled_calls": compiled_kernel_calls(),
        "compile_unavailable": torch_compile_unavailable_reason(),
    }


if __name__ == "__main__":
    report = main(sys.argv[1])
    dist.destroy_process_group()
    # stdout is the worker log file now: the findings go to a file of their own
    with open(os.path.join(sys.argv[1], "probe_report.json"), "w") as out:
        json.dump(report, out)

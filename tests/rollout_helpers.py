"""Shared builders for the rollout tests: prompt batches, worker configs, and plain HF greedy references."""

import numpy as np
import torch


PROMPT_LENGTH = 16
RESPONSE_LENGTH = 12
PROMPT_TEXTS = ["What is 2 + 3?", "Tell me a story about a cat", "Hello", "Name three colours."]


def make_prompts(tokenizer, texts=PROMPT_TEXTS):
    """A prompt DataProto as the data pipeline produces it: left-padded ids, masks, positions, raw ids."""
    token_lists = [tokenizer(text, add_special_tokens=False)["input_ids"][:PROMPT_LENGTH] for text in texts]
    return padded_prompts(token_lists, PROMPT_LENGTH, tokenizer.pad_token_id)


def padded_prompts(token_lists: list[list[int]], width: int, pad_token_id: int, **non_tensors):
    """The prompt DataProto of unpadded ``token_lists``: left-padded to ``width``, masks, positions from 0, raw ids,
    and ``non_tensors`` (one value per prompt each) as object arrays."""
    from easyrl.protocol import DataProto

    input_ids = torch.full((len(token_lists), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(token_lists), width), dtype=torch.long)
    for i, ids in enumerate(token_lists):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention_mask[i, width - len(ids) :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    arrays = {}
    for key, values in {"raw_prompt_ids": token_lists, **non_tensors}.items():
        arrays[key] = np.empty(len(token_lists), dtype=object)
        arrays[key][:] = list(values)
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors=arrays,
    )


def rollout_worker_config(model_path, n_workers: int, *, name: str = "vllm", tensor_parallel_size: int = 1):
    """An fp32 actor_rollout WorkerConfig (exact comparisons) with a small engine."""
    from tests.fsdp_helpers import worker_config

    config = worker_config(model_path, n_workers, strategy="sgd", lr=1.0, global_batch_size=4, micro_batch_size=2)
    rollout = config.rollout
    rollout.name = name
    rollout.dtype = "fp32"
    rollout.tensor_parallel_size = tensor_parallel_size
    rollout.enforce_eager = True
    rollout.kv_cache_memory_bytes = 64 << 20
    rollout.prompt_length = PROMPT_LENGTH
    rollout.response_length = RESPONSE_LENGTH
    rollout.max_model_len = PROMPT_LENGTH + RESPONSE_LENGTH
    rollout.disable_tqdm = True
    rollout.seed = 7
    return config


def hf_greedy_responses(model, prompts, eos_token_id: int) -> list[list[int]]:
    """Greedy continuation of each prompt alone (no padding), cut after the first eos."""
    out = []
    for ids in prompts.non_tensor_batch["raw_prompt_ids"]:
        with torch.no_grad():
            generated = model.generate(
                torch.tensor([ids]),
                max_new_tokens=RESPONSE_LENGTH,
                do_sample=False,
                eos_token_id=eos_token_id,
                pad_token_id=eos_token_id,
            )[0, len(ids) :].tolist()
        if eos_token_id in generated:
            generated = generated[: generated.index(eos_token_id) + 1]
        out.append(generated)
    return out


def response_lists(output) -> list[list[int]]:
    """The generated tokens of each output row, without padding."""
    responses, mask = output.batch["responses"], output.batch["response_mask"].bool()
    return [row[m].tolist() for row, m in zip(responses, mask)]


def update_actor_once(group, seed: int = 0) -> None:
    """One large SGD step on a random batch, streamed into the engine: the policy's greedy answers change."""
    from tests.fsdp_helpers import add_policy_targets, make_batch

    data = make_batch(batch_size=4, prompt_length=7, response_length=6, seed=seed)
    data = add_policy_targets(data, group.compute_log_probs(data).batch["old_log_probs"], seed=seed)
    group.update_actor(data)
    group.sync_rollout_weights()

"""Shared builders for the FSDP worker and padding-free tests: rollout-shaped batches, configs, references."""

from contextlib import contextmanager

import torch


def make_batch(
    batch_size: int = 6, prompt_length: int = 7, response_length: int = 6, vocab: int = 1000, seed: int = 0
):
    """A rollout-shaped DataProto: left-padded prompts ++ right-padded responses of varied lengths."""
    from easyrl.protocol import DataProto

    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(5, vocab, (batch_size, prompt_length), generator=gen)
    responses = torch.randint(5, vocab, (batch_size, response_length), generator=gen)
    prompt_lengths = torch.randint(1, prompt_length + 1, (batch_size,), generator=gen)
    response_lengths = torch.randint(1, response_length + 1, (batch_size,), generator=gen)
    prompt_mask = (torch.arange(prompt_length)[None, :] >= prompt_length - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(response_length)[None, :] < response_lengths[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.cat([prompts, responses], dim=1) * attention_mask  # pad id 0 where masked
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    tensors = {
        "prompts": prompts * prompt_mask,
        "responses": responses * response_mask,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 0.7})


def per_sequence_log_probs(model, data, temperature: float) -> torch.Tensor:
    """Reference: each sequence alone through a plain HF forward, full log-softmax."""
    batch = data.batch
    response_length = batch["responses"].shape[-1]
    out = torch.zeros(batch["responses"].shape)
    for i in range(len(data)):
        real = batch["input_ids"][i][batch["attention_mask"][i].bool()]
        n_response = int(batch["attention_mask"][i, -response_length:].sum())
        with torch.no_grad():
            logits = model(real[None]).logits[0].float() / temperature
        log_probs = torch.log_softmax(logits, dim=-1)
        n_prompt = len(real) - n_response
        for r in range(n_response):
            out[i, r] = log_probs[n_prompt + r - 1, real[n_prompt + r]]
    return out


def worker_config(
    model_path,
    n_workers: int,
    *,
    strategy: str = "sgd",
    lr: float = 0.1,
    global_batch_size: int = 6,
    micro_batch_size: int = 2,
    padding_free: bool = True,
    dynamic_batching: bool = False,
    fsdp_size: int = -1,
):
    """An fp32 WorkerConfig (no mixed precision, no clipping) so that results compare exactly with one process."""
    from easyrl.config import PPOConfig, derive

    config = PPOConfig()
    config.trainer.nnodes = 1
    config.trainer.n_gpus_per_node = n_workers
    config.data.rollout_batch_size = global_batch_size
    config.worker.rollout.n = 1
    config.worker.rollout.temperature = 0.7  # workers score at the rollout temperature, make_batch's 0.7
    config.worker.actor.use_torch_compile = False  # eager kernels: compiled ones are tested on their own
    for role in (config.worker.actor, config.worker.critic):
        role.model.model_path = str(model_path)
        role.global_batch_size = global_batch_size
        role.micro_batch_size_per_device_for_update = micro_batch_size
        role.micro_batch_size_per_device_for_experience = micro_batch_size
        role.padding_free = padding_free
        role.dynamic_batching = dynamic_batching
        role.max_grad_norm = 1e6
        role.optim.strategy = strategy
        role.optim.lr = lr
        role.optim.weight_decay = 0.0
        role.fsdp.torch_dtype = "fp32"
        role.fsdp.mp_param_dtype = "fp32"
        role.fsdp.fsdp_size = fsdp_size
    config.worker.ref.fsdp.torch_dtype = "fp32"
    config.worker.ref.fsdp.mp_param_dtype = "fp32"
    derive(config)
    return config.worker


def add_policy_targets(data, log_probs: torch.Tensor, seed: int = 0):
    """Attach old log-probs and random advantages (zero past each response) for a policy update."""
    gen = torch.Generator().manual_seed(seed)
    mask = data.batch["response_mask"]
    data.batch["old_log_probs"] = log_probs
    data.batch["advantages"] = torch.randn(mask.shape, generator=gen) * mask
    return data


def padded_policy_loss(model, data, actor_config) -> torch.Tensor:
    """The mini-batch policy loss of a plain HF model on the whole batch (full log-softmax, padded forward)."""
    from easyrl.algorithms.policy_loss import compute_policy_loss

    batch = data.batch
    response_length = batch["responses"].shape[-1]
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits[:, -response_length - 1 : -1]
    log_probs = torch.log_softmax(logits.float() / data.meta_info["temperature"], dim=-1)
    log_probs = log_probs.gather(-1, batch["responses"][..., None]).squeeze(-1)
    loss, _ = compute_policy_loss(
        batch["old_log_probs"], log_probs, batch["advantages"], batch["response_mask"], actor_config
    )
    return loss


def load_hf_causal_lm(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


@contextmanager
def worker_group(worker_cls, *args, processes: int = 1, **kwargs):
    """A Ray worker group of ``processes`` workers on one node (``RayWorkerGroup``'s arguments after the pool), killed
    and its resources released on exit, also when a step inside fails."""
    from easyrl.controller import RayWorkerGroup, ResourcePool

    pool = ResourcePool(process_on_nodes=[processes])
    group = None
    try:
        group = RayWorkerGroup(pool, worker_cls, *args, **kwargs)
        yield group
    finally:
        if group is not None:
            group.kill()
        pool.release()

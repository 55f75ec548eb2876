"""The fused LM head (no (tokens x vocab) logits) and Liger's kernels on CUDA: same log-probs, less memory.

Liger patches transformers' classes for the whole process, so its test runs last in this file and loads its
reference model before patching.
"""

import torch

from easyrl.testing.single_rank import build_actor
from tests.gpu.test_compute_path import BF16, log_probs, rollout


def peak_update_bytes(actor, data) -> tuple[int, torch.Tensor]:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    actor.update_policy(data)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def test_fused_head_gives_the_same_log_probs_without_the_logits_tensor(process_group, small_qwen2_path):
    # one micro-batch of 16 x 1024 response tokens: its bf16 logits are 16k x 32k x 2 B = 1 GiB, their fp32 gradient
    # chunks aside
    settings = [*BF16, "worker.actor.micro_batch_size_per_device_for_update=16", "worker.actor.optim.lr=1e-4"]
    data = rollout(batch_size=16, prompt_length=64, response_length=1024, seed=5)
    mask = data.batch["response_mask"].bool()
    response_tokens = int(mask.sum())
    results = {}
    for fused in (False, True):
        actor, _, _ = build_actor(
            small_qwen2_path, [*settings, f"worker.actor.model.use_fused_kernels={fused}"], batch_size=16
        )
        lp = log_probs(actor, data)
        actor.update_policy(data)  # optimizer states exist before measuring
        results[fused] = (lp, peak_update_bytes(actor, data))
        del actor
        torch.cuda.empty_cache()
    diff = (results[True][0] - results[False][0])[mask].abs()
    assert diff.mean() < 0.01 and diff.max() < 0.2, (diff.mean().item(), diff.max().item())
    logits_bytes = response_tokens * 32000 * 2
    saved = results[False][1] - results[True][1]
    print(f"peak update memory: unfused {results[False][1] / 2**30:.2f} GiB, fused {results[True][1] / 2**30:.2f} GiB")
    assert saved > 0.8 * logits_bytes, (saved, logits_bytes)


def test_liger_kernels_replace_the_layers_and_keep_log_probs(process_group, small_qwen2_path):
    data = rollout(seed=7)
    plain, _, _ = build_actor(small_qwen2_path, BF16, batch_size=16, trainable=False)
    expected = log_probs(plain, data)
    del plain
    actor, module, _ = build_actor(small_qwen2_path, [*BF16, "worker.actor.model.use_liger=true"], batch_size=16)
    kinds = {type(m).__name__ for m in module.modules()}
    assert any(name.startswith("Liger") for name in kinds), kinds
    got = log_probs(actor, data)
    mask = data.batch["response_mask"].bool()
    diff = (got - expected)[mask].abs()
    assert diff.mean() < 0.03 and diff.max() < 0.3, (diff.mean().item(), diff.max().item())
    metrics = actor.update_policy(data)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))

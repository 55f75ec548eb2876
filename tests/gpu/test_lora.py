"""LoRA on CUDA: the bf16 update moves the adapters only, the reference (adapters off) is the base model, the fused
LM head gives the same log-probs with adapters, and the update holds far less optimizer state than full training."""

import gc

import torch

from easyrl.models import lora
from easyrl.testing.single_rank import build_actor
from tests.gpu.test_compute_path import BF16, log_probs, rollout


LORA = [*BF16, "worker.actor.model.lora.rank=16", "worker.actor.model.lora.alpha=32", "worker.actor.optim.lr=1e-3"]


def _full(module) -> dict[str, torch.Tensor]:
    return {name: p.detach().full_tensor().clone() for name, p in module.named_parameters()}


def test_bf16_lora_update_moves_only_the_adapters(process_group, small_qwen2_path):
    actor, module, optimizer = build_actor(small_qwen2_path, LORA, batch_size=16)
    assert lora.has_lora(module)
    before = _full(module)
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable), sorted(trainable)[:5]
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in module.parameters() if p.requires_grad}

    data = rollout()
    for _ in range(2):  # B starts at zero: the first step moves B, the second moves A through B
        metrics = actor.update_policy(data)
        assert all(torch.isfinite(torch.tensor(v)).all() for v in metrics.values() if isinstance(v, float)), metrics
    after = _full(module)
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    assert moved == trainable, (sorted(moved - trainable)[:5], sorted(trainable - moved)[:5])
    assert all(after[name].dtype == torch.float32 for name in trainable)  # fp32 adapters under bf16 compute


def test_adapters_off_is_the_base_model(process_group, small_qwen2_path):
    data = rollout(seed=11)
    base, _, _ = build_actor(small_qwen2_path, BF16, batch_size=16, trainable=False)
    expected = log_probs(base, data)
    del base
    actor, module, _ = build_actor(small_qwen2_path, LORA, batch_size=16)
    for _ in range(2):
        actor.update_policy(data)
    with lora.adapter_disabled(module):
        reference = log_probs(actor, data)
    trained = log_probs(actor, data)
    mask = data.batch["response_mask"].bool()
    # the same bf16 kernels on the same base weights: equal up to bf16 rounding of the (zero) adapter path
    off = (reference - expected)[mask].abs()
    assert off.mean() < 1e-3 and off.max() < 0.05, (off.mean().item(), off.max().item())
    on = (trained - expected)[mask].abs()
    assert on.mean() > 10 * off.mean() + 1e-4, (on.mean().item(), off.mean().item())  # the adapters do act


def test_fused_head_with_lora_gives_the_same_log_probs(process_group, small_qwen2_path):
    data = rollout(batch_size=16, prompt_length=64, response_length=512, seed=13)
    mask = data.batch["response_mask"].bool()
    results = {}
    for fused in (False, True):
        torch.manual_seed(0)  # the same A initialisation in both builds
        actor, module, _ = build_actor(
            small_qwen2_path, [*LORA, f"worker.actor.model.use_fused_kernels={fused}"], batch_size=16
        )
        actor.update_policy(data)
        results[fused] = (log_probs(actor, data), _full(module))
        del actor, module
        torch.cuda.empty_cache()
    diff = (results[True][0] - results[False][0])[mask].abs()
    assert diff.mean() < 0.01 and diff.max() < 0.2, (diff.mean().item(), diff.max().item())
    # the step each took is the same step up to bf16 noise: Adam's first step moves every B entry by about lr, so a
    # few entries whose gradient is near zero may differ in sign; the matrices as a whole agree
    for name, value in results[False][1].items():
        if "lora_B" in name:
            relative = (results[True][1][name] - value).norm() / value.norm()
            assert value.norm() > 0 and relative < 0.05, (name, relative.item())


def test_lora_update_holds_less_memory_than_full_training(process_group, small_qwen2_path):
    data = rollout(seed=17)
    held = {}
    for settings in (BF16, LORA):
        gc.collect()  # earlier tests' actors hold GPU memory until their reference cycles are collected
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        actor, module, optimizer = build_actor(small_qwen2_path, settings, batch_size=16)
        actor.update_policy(data)  # optimizer states exist
        torch.cuda.synchronize()
        states = sum(
            v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
        )
        held[settings is LORA] = (torch.cuda.memory_allocated() - start, states)
        del actor, module, optimizer
    (full_held, full_states), (lora_held, lora_states) = held[False], held[True]
    print(f"held after a step: full {full_held / 2**20:.1f} MiB, LoRA {lora_held / 2**20:.1f} MiB")
    assert lora_states < 0.1 * full_states, (lora_states, full_states)
    # the base weights are resident in both; full training adds two fp32 Adam moments per weight
    assert lora_held < full_held - 0.8 * (full_states - lora_states), (lora_held, full_held)

"""bf16 actor update, log-probs, padding-free varlen attention and offload on CUDA, one rank, nccl, no Ray."""

import pytest
import torch

from easyrl.models import attention
from easyrl.testing.single_rank import build_actor
from tests.fsdp_helpers import make_batch


BF16 = [
    "worker.actor.fsdp.torch_dtype=fp32",
    "worker.actor.fsdp.mp_param_dtype=bf16",
    "worker.actor.fsdp.mp_reduce_dtype=fp32",
    "worker.actor.use_torch_compile=false",
    "worker.actor.dynamic_batching=false",
    "worker.actor.micro_batch_size_per_device_for_update=8",
    "worker.actor.micro_batch_size_per_device_for_experience=8",
]
FP32 = [*BF16[:1], "worker.actor.fsdp.mp_param_dtype=fp32", *BF16[2:]]


def rollout(batch_size=16, prompt_length=128, response_length=256, seed=0):
    data = make_batch(batch_size, prompt_length, response_length, vocab=32000, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    mask = data.batch["response_mask"].float()
    data.batch["old_log_probs"] = -torch.rand(mask.shape, generator=gen) * 5 * mask
    data.batch["advantages"] = torch.randn(mask.shape, generator=gen) * mask
    return data.to("cuda")


def log_probs(actor, data):
    return actor.compute_log_probs(data)[0] * data.batch["response_mask"]


def test_models_load_with_a_varlen_attention(process_group, small_qwen2_path):
    actor, module, _ = build_actor(small_qwen2_path, BF16, batch_size=16, trainable=False)
    assert module.config._attn_implementation in ("flash_attention_2", attention.NAME)
    assert next(module.parameters()).is_cuda


def test_bf16_update_changes_every_weight_and_stays_finite(process_group, small_qwen2_path):
    actor, module, _ = build_actor(small_qwen2_path, [*BF16, "worker.actor.optim.lr=1e-4"], batch_size=16)
    before = {name: p.detach().full_tensor().clone() for name, p in module.named_parameters()}
    data = rollout()
    metrics = actor.update_policy(data)
    assert all(torch.isfinite(torch.tensor(v)).all() for v in metrics.values() if isinstance(v, float)), metrics
    after = {name: p.detach().full_tensor() for name, p in module.named_parameters()}
    assert after.keys() == before.keys()
    unchanged = [name for name in before if torch.equal(before[name], after[name])]
    assert not unchanged, f"not updated: {unchanged}"
    assert all(p.dtype == torch.float32 for p in after.values())  # fp32 master weights under bf16 compute


def test_bf16_log_probs_match_an_fp32_reference(process_group, small_qwen2_path):
    data = rollout()
    reference, _, _ = build_actor(small_qwen2_path, FP32, batch_size=16, trainable=False)
    expected = log_probs(reference, data)
    del reference
    actor, _, _ = build_actor(small_qwen2_path, BF16, batch_size=16, trainable=False)
    got = log_probs(actor, data)
    mask = data.batch["response_mask"].bool()
    diff = (got - expected)[mask].abs()
    # bf16 has an 8-bit mantissa: per-token log-probs of a random 32k-vocabulary model move by ~1e-2
    assert diff.mean() < 0.03 and diff.max() < 0.3, (diff.mean().item(), diff.max().item())
    assert expected[mask].std() > 0.1  # the comparison is not between constants


def test_padding_free_equals_padded_in_bf16(process_group, small_qwen2_path):
    data = rollout(batch_size=24, prompt_length=96, response_length=320, seed=3)
    packed, _, _ = build_actor(small_qwen2_path, BF16, batch_size=24, trainable=False)
    padded, _, _ = build_actor(
        small_qwen2_path, [*BF16, "worker.actor.padding_free=false"], batch_size=24, trainable=False
    )
    got, expected = log_probs(packed, data), log_probs(padded, data)
    mask = data.batch["response_mask"].bool()
    diff = (got - expected)[mask].abs()
    assert diff.mean() < 0.02 and diff.max() < 0.3, (diff.mean().item(), diff.max().item())


def test_varlen_kernel_equals_per_sequence_sdpa(monkeypatch):
    if not attention.varlen_available():
        pytest.skip("this PyTorch has no varlen_attn")
    kernel, calls = attention._varlen_attn(), []
    monkeypatch.setattr(attention, "_varlen_attn", lambda: lambda *a, **k: calls.append(1) or kernel(*a, **k))
    torch.manual_seed(0)
    lengths = [1, 37, 512, 300, 1024, 5]
    total, heads, kv_heads, dim = sum(lengths), 8, 2, 64
    q = torch.randn(1, heads, total, dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, kv_heads, total, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    module = torch.nn.Module()
    out, _ = attention.varlen_attention_forward(
        module, q, k, v, None, **attention.packed_attention_kwargs(cu_seqlens, max(lengths))
    )
    pieces = []
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        qs, ks, vs = (t[:, :, start:end].double() for t in (q, k, v))
        ks, vs = ks.repeat_interleave(heads // kv_heads, 1), vs.repeat_interleave(heads // kv_heads, 1)
        pieces.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True))
    expected = torch.cat(pieces, dim=2).transpose(1, 2)
    relative = (out.double() - expected).norm() / expected.norm()
    assert out.shape == expected.shape and relative < 1e-2, relative.item()
    assert calls == [1]  # the varlen kernel ran, not a fallback


def test_varlen_kernel_builds_no_token_by_token_mask():
    """32k packed tokens: a (tokens x tokens) mask would be 1 GiB; the varlen path allocates only its inputs' size."""
    if not attention.varlen_available():
        pytest.skip("this PyTorch has no varlen_attn")
    total, heads, dim = 32768, 8, 64
    q, k, v = (torch.randn(1, heads, total, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu_seqlens = torch.arange(0, total + 1, 4096, dtype=torch.int32, device="cuda")
    module = torch.nn.Module()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    attention.varlen_attention_forward(module, q, k, v, None, **attention.packed_attention_kwargs(cu_seqlens, 4096))
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - start
    assert extra < 4 * q.numel() * q.element_size(), extra  # output + transposed copies, not tokens^2


def test_offload_round_trip_keeps_weights_and_optimizer_state(process_group, small_qwen2_path):
    from easyrl.workers.fsdp_utils import load_model, load_optimizer, offload_model, offload_optimizer

    actor, module, optimizer = build_actor(small_qwen2_path, [*BF16, "worker.actor.optim.lr=1e-4"], batch_size=16)
    data = rollout()
    actor.update_policy(data)  # optimizer states exist
    params = {n: p.detach().to_local().clone() for n, p in module.named_parameters()}
    states = {id(p): {k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for p, s in optimizer.state.items()}
    expected = log_probs(actor, data)
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()

    offload_model(module)
    offload_optimizer(optimizer)
    torch.cuda.synchronize()
    assert all(not p.to_local().is_cuda for p in module.parameters())
    assert all(
        not v.is_cuda for s in optimizer.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step"
    )
    weights_and_states = sum(t.numel() * t.element_size() for t in params.values()) * 3  # params + 2 Adam moments
    assert resident - torch.cuda.memory_allocated() > 0.9 * weights_and_states

    load_model(module)
    load_optimizer(optimizer)
    for name, p in module.named_parameters():
        assert p.to_local().is_cuda and torch.equal(p.detach().to_local(), params[name]), name
    for p, s in optimizer.state.items():
        for key, value in states[id(p)].items():
            assert torch.equal(s[key].to(value.device), value), key
    torch.testing.assert_close(log_probs(actor, data), expected, rtol=0, atol=0)
    actor.update_policy(data)  # and training goes on

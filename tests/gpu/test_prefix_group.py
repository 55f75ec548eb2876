"""Shared-prefix attention on CUDA: PyTorch's varlen flash kernel (one call, bottom-right causal) equals per-segment
attention, and a bf16 actor with `worker.actor.shared_prefix` gives the unshared log-probs."""

import time

import pytest
import torch

from easyrl.models import attention, prefix_group
from easyrl.models.prefix_group import PrefixLayout, Segment
from easyrl.testing.single_rank import build_actor
from tests.gpu.test_compute_path import BF16, log_probs


def _grouped_rollout(prompts: int, n: int, prompt_length: int, response_length: int, seed: int = 0):
    """``prompts`` prompts of ``prompt_length`` tokens, each sampled ``n`` times (responses of 1..response_length)."""
    from easyrl.protocol import DataProto

    gen = torch.Generator().manual_seed(seed)
    rows, masks = [], []
    for _ in range(prompts):
        prompt = torch.randint(5, 32000, (prompt_length,), generator=gen)
        for _ in range(n):
            length = int(torch.randint(1, response_length + 1, (1,), generator=gen))
            response = torch.zeros(response_length, dtype=torch.long)
            response[:length] = torch.randint(5, 32000, (length,), generator=gen)
            rows.append(torch.cat([prompt, response]))
            masks.append(torch.cat([torch.ones(prompt_length), torch.arange(response_length) < length]).long())
    input_ids, attention_mask = torch.stack(rows), torch.stack(masks)
    mask = attention_mask[:, prompt_length:]
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, prompt_length:],
        "response_mask": mask,
        "old_log_probs": -torch.rand(mask.shape, generator=gen) * 5 * mask,
        "advantages": torch.randn(mask.shape, generator=gen) * mask,
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0}).to("cuda")


def test_varlen_prefix_attention_equals_per_segment_attention_in_fp64():
    if not attention.varlen_available():
        pytest.skip("this PyTorch has no varlen_attn")
    torch.manual_seed(0)
    # group 1: prompt of 300, responses of 1, 50, 513; group 2: prompt of 5, response of 7
    segments = [Segment(0, 300), Segment(300, 301, 0, 300), Segment(301, 351, 0, 300), Segment(351, 864, 0, 300)]
    segments += [Segment(864, 869), Segment(869, 876, 864, 869)]
    layout = PrefixLayout(segments)
    total, heads, kv_heads, dim = 876, 8, 2, 64
    q = torch.randn(1, heads, total, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (
        torch.randn(1, kv_heads, total, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "kv"
    )
    module = torch.nn.Module()
    assert prefix_group._varlen_fits(q, 0.0)
    out, _ = prefix_group.prefix_attention_forward(module, q, k, v, None, inner=None, prefix_layout=layout)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    pieces = []
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    for s in segments:
        keys = torch.cat([torch.arange(s.prefix_start, s.prefix_end), torch.arange(s.start, s.end)]).cuda()
        ks, vs = (t[:, :, keys].repeat_interleave(heads // kv_heads, 1) for t in (k64, v64))
        length, prefix = s.end - s.start, s.prefix_end - s.prefix_start
        mask = torch.ones(length, prefix + length, dtype=torch.bool, device="cuda").tril(prefix)
        pieces.append(torch.nn.functional.scaled_dot_product_attention(q64[:, :, s.start : s.end], ks, vs, mask))
    expected = torch.cat(pieces, dim=2).transpose(1, 2)
    (expected * weights.double()).sum().backward()
    for got, want in ((out, expected), (q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        relative = (got.double() - want).norm() / want.norm()
        assert got.shape == want.shape and relative < 1e-2, relative.item()


def test_bf16_shared_prefix_log_probs_and_update_equal_the_unshared_ones(process_group, small_qwen2_path, capsys):
    # 8 prompts of 512 tokens x n = 6, responses up to 256 tokens: one optimizer step over the 48 samples
    data = _grouped_rollout(prompts=8, n=6, prompt_length=512, response_length=256)
    overrides = [*BF16[:-2], "worker.actor.micro_batch_size_per_device_for_update=12"]
    overrides.append("worker.actor.micro_batch_size_per_device_for_experience=12")
    results = {}
    for shared in (False, True):
        actor, module, _ = build_actor(
            small_qwen2_path, [*overrides, f"worker.actor.shared_prefix={str(shared).lower()}"], batch_size=48
        )
        got = log_probs(actor, data)
        actor.update_policy(data)  # warm-up (kernels, allocator)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            metrics = actor.update_policy(data)
        torch.cuda.synchronize()
        results[shared] = (got, (time.perf_counter() - start) / 3, metrics)
        del actor, module
    mask = data.batch["response_mask"].bool()
    diff = (results[True][0] - results[False][0])[mask].abs()
    assert diff.mean() < 0.02 and diff.max() < 0.3, (diff.mean().item(), diff.max().item())
    ratio = results[True][2]["actor/shared_prefix/token_ratio"]
    with capsys.disabled():
        print(
            f"\nshared-prefix update, 8 x 6 samples, prompt 512, responses <= 256, bf16: unshared "
            f"{results[False][1]:.3f} s, shared {results[True][1]:.3f} s per update, token ratio {ratio:.3f}"
        )

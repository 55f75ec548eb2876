"""A frozen vision tower's cache on CUDA (nccl decides hit or miss for the world): a VL actor in bf16 encodes each
picture and video once over two log-prob passes and an update, and gives the numbers of the uncached actor."""

import torch

from easyrl.models import vision_encoder
from easyrl.testing.single_rank import build_actor
from tests.test_vision_cache import _patches_per_call, _samples


def _passes(path: str, cache_mb: int) -> dict:
    from transformers import AutoProcessor

    from easyrl.testing.vl_batch import make_vl_batch

    overrides = [
        "worker.actor.model.freeze_vision_tower=true",
        f"worker.actor.model.vision_cache_mb={cache_mb}",
        "worker.actor.fsdp.torch_dtype=fp32",
        "worker.actor.fsdp.mp_param_dtype=bf16",
        "worker.actor.optim.lr=1e-4",
        "worker.actor.dynamic_batching=false",
        "worker.actor.use_torch_compile=false",
        "worker.actor.micro_batch_size_per_device_for_update=2",
        "worker.actor.micro_batch_size_per_device_for_experience=4",
        "worker.actor.global_batch_size=6",
        "algorithm.disable_kl=true",
        "algorithm.use_kl_loss=false",
    ]
    processor = AutoProcessor.from_pretrained(path)
    data = make_vl_batch(processor, path, _samples(), response_length=5, seed=2).to("cuda")
    data.meta_info["temperature"] = 1.0
    torch.manual_seed(0)
    actor, module, _ = build_actor(path, overrides, batch_size=6)
    actor.processor = processor
    calls = _patches_per_call(module)
    old, _ = actor.compute_log_probs(data)
    again, _ = actor.compute_log_probs(data)
    data.batch["old_log_probs"] = old
    data.batch["advantages"] = torch.linspace(-1.0, 1.0, 6, device="cuda")[:, None].expand_as(old).contiguous()
    actor.update_policy(data)
    after, _ = actor.compute_log_probs(data)
    metrics = vision_encoder.take_cache_metrics(module)
    return {"old": old, "again": again, "after": after, "calls": calls, "metrics": metrics}


def test_the_frozen_tower_cache_on_cuda_encodes_once_and_changes_no_number(process_group, tmp_path):
    from tests.test_ulysses import _vl_model_path

    path = _vl_model_path("qwen2_5_vl", tmp_path)
    cached, plain = _passes(path, 64), _passes(path, 0)
    assert sum(cached["calls"]) == 24 + 64 + 24 + 24, cached["calls"]  # the 4 distinct media once (test_vision_cache)
    assert len(plain["calls"]) == 2 + 2 + 3 + 2  # every micro-batch of every pass without it
    assert cached["metrics"]["perf/vision_cache_misses"] == 4.0
    # the first passes encode the same micro-batches either way: a cached feature is the tower's own output, stored
    for key in ("old", "again"):
        torch.testing.assert_close(cached[key], plain[key], rtol=0, atol=1e-5, msg=key)
    # the update's micro-batches of 2 re-encode without the cache: other shapes, other bf16 rounding in the tower
    diff = (cached["after"] - plain["after"]).abs()
    assert diff.mean() < 0.01 and diff.max() < 0.2, (diff.mean().item(), diff.max().item())
    assert not torch.equal(cached["after"], cached["old"])

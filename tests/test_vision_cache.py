"""A frozen vision tower's cached outputs (models/vision_encoder.py, worker.actor.model.vision_cache_mb).

One training step of the actor on one rank, built as the worker builds it (FSDP2, the config's cache budget): old
log-probs, a second log-prob pass (the reference when it is the same model), two PPO epochs of updates. With the
cache, every picture and the video go through the tower once in the whole step, and every number equals the run
without the cache.
"""

import pytest
import torch

from easyrl.models import vision_encoder


pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def tiny_qwen2_5_vl(tmp_path_factory) -> str:
    """The tiny Qwen2.5-VL with 2 key/value heads (ulysses 2 gives each rank one)."""
    from tests.test_ulysses import _vl_model_path

    return _vl_model_path("qwen2_5_vl", tmp_path_factory.mktemp("vl"))


def _samples():
    from easyrl.testing.vl_batch import VLSample, random_image, random_video

    picture, video = random_image(0), random_video(3, frames=8)
    # two samples per prompt (rollout.n = 2): the copies share one picture object, as the rollout's samples do
    return [
        VLSample("Count the shapes.", images=[picture]),
        VLSample("Count the shapes.", images=[picture]),
        VLSample("Hello there, how are you?"),
        VLSample("What happens?", videos=[video]),
        VLSample("What happens?", videos=[video]),
        VLSample("Which is brighter?", images=[random_image(1), random_image(2, width=84, height=56)]),
    ]


def _patches_per_call(module) -> list[int]:
    from easyrl.models.vision import vision_tower

    calls: list[int] = []
    vision_tower(module).patch_embed.register_forward_pre_hook(lambda _, args: calls.append(int(args[0].shape[0])))
    return calls


def _one_step(path: str, cache_mb: int, lora_rank: int = 0) -> dict:
    """Old log-probs, a reference-like pass, 2 PPO epochs (micro-batches of 2, then 4 for the log-probs), on one
    rank; returns the log-probs, the updated weights, the tower's patches per call and the cache metrics.
    ``lora_rank``: LoRA adapters on the language model instead of freeze_vision_tower (the tower is frozen all the
    same), and the reference pass is the actor with its adapters off (the run plan's ref_from_actor)."""
    from contextlib import nullcontext

    from transformers import AutoProcessor

    from easyrl.models.lora import adapter_disabled
    from easyrl.testing.single_rank import build_actor, one_rank_process_group
    from easyrl.testing.vl_batch import make_vl_batch

    frozen = (
        [f"worker.actor.model.lora.rank={lora_rank}"] if lora_rank else ["worker.actor.model.freeze_vision_tower=true"]
    )
    overrides = [
        *frozen,
        f"worker.actor.model.vision_cache_mb={cache_mb}",
        "worker.actor.model.enable_gradient_checkpointing=false",
        "worker.actor.fsdp.torch_dtype=fp32",
        "worker.actor.fsdp.mp_param_dtype=fp32",
        "worker.actor.optim.strategy=adamw",
        "worker.actor.optim.lr=1e-3",
        "worker.actor.ppo_epochs=2",
        "worker.actor.dynamic_batching=false",
        "worker.actor.use_torch_compile=false",
        "worker.actor.micro_batch_size_per_device_for_update=2",
        "worker.actor.micro_batch_size_per_device_for_experience=4",
        "worker.actor.global_batch_size=6",
        "algorithm.disable_kl=true",
        "algorithm.use_kl_loss=false",
    ]
    processor = AutoProcessor.from_pretrained(path)
    samples = _samples()
    data = make_vl_batch(processor, path, samples, response_length=5, seed=2)
    data.meta_info["temperature"] = 1.0
    with one_rank_process_group():
        torch.manual_seed(0)
        actor, module, _ = build_actor(path, overrides, batch_size=6)
        actor.processor = processor
        calls = _patches_per_call(module)
        old, _ = actor.compute_log_probs(data)
        with adapter_disabled(module) if lora_rank else nullcontext():
            ref, _ = actor.compute_log_probs(data)
        data.batch["old_log_probs"] = old
        data.batch["advantages"] = torch.linspace(-1.0, 1.0, 6)[:, None].expand_as(old).contiguous()
        actor.update_policy(data)
        after, _ = actor.compute_log_probs(data)
        weights = {name: p.full_tensor().detach().clone() for name, p in module.named_parameters()}
        metrics = vision_encoder.take_cache_metrics(module)
    return {"old": old, "ref": ref, "after": after, "weights": weights, "calls": calls, "metrics": metrics}


def test_a_frozen_tower_encodes_each_picture_once_per_step_and_changes_no_number(tiny_qwen2_5_vl):
    cached, plain = _one_step(tiny_qwen2_5_vl, 64), _one_step(tiny_qwen2_5_vl, 0)
    # the media: a 56x84 picture (4 x 6 patches of 14 px: 24) shared by samples 0 and 1, an 8-frame 56x56 video
    # (4 temporal x 4 x 4: 64) shared by samples 3 and 4, the 56x84 and 84x56 pictures of sample 5 (24 each)
    unique_patches = 24 + 64 + 24 + 24
    per_pass = 2 * 24 + 2 * 64 + 24 + 24
    # with the cache the first pass encodes each of them once (a repeat in its micro-batch too), then never again
    assert sum(cached["calls"]) == unique_patches, cached["calls"]
    # without: 3 log-prob passes of 2 micro-batches (old, ref, after) and 2 epochs of 3, every sample's media again
    assert len(plain["calls"]) == 3 * 2 + 2 * 3 and sum(plain["calls"]) == 5 * per_pass
    # 5 passes (old, ref, 2 epochs, after) look up the 6 media of the 6 samples: the 4 distinct ones miss once
    assert cached["metrics"] == {"perf/vision_cache_hits": 5 * 6 - 4.0, "perf/vision_cache_misses": 4.0}
    assert plain["metrics"] == {}
    for key in ("old", "ref", "after"):
        torch.testing.assert_close(cached[key], plain[key], rtol=0, atol=1e-6, msg=key)
    assert torch.equal(cached["old"], cached["ref"])
    assert not torch.equal(cached["after"], cached["old"])  # the update moved the policy
    for name, weight in plain["weights"].items():
        torch.testing.assert_close(cached["weights"][name], weight, rtol=0, atol=1e-6, msg=name)


def _unique_patches(path: str) -> int:
    from transformers import AutoProcessor

    from easyrl.models.vision import _pixels_once

    processor = AutoProcessor.from_pretrained(path)
    media = {id(item): (kind, item) for sample in _samples() for kind, items in (("image", sample.images),
             ("video", sample.videos)) for item in items or []}  # fmt: skip
    return sum(int(grid.prod()) for kind, item in media.values() for _, grid in _pixels_once(processor, kind, [item]))


def _assert_relative(actual: torch.Tensor, expected: torch.Tensor, bound: float, what: str) -> None:
    error = float((actual - expected).abs().max() / expected.abs().max().clamp(min=1e-12))
    assert error <= bound, f"{what}: relative error {error:.2e}"


@pytest.mark.slow
def test_qwen3_vl_deepstack_features_come_from_the_cache_exactly(tmp_path):
    from easyrl.testing.tiny_vlms import build_tiny_vlm

    path = str(build_tiny_vlm("qwen3_vl", tmp_path / "qwen3_vl"))
    cached, plain = _one_step(path, 64), _one_step(path, 0)
    assert sum(cached["calls"]) == _unique_patches(path)
    # Qwen3-VL's tower rounds differently when it encodes the video beside one copy of the picture instead of two
    # (fp32, measured 2.9e-6 absolute on log-probs of magnitude ~10): equal to 1e-6 relative before the update
    for key in ("old", "ref"):
        _assert_relative(cached[key], plain[key], 1e-6, key)
    # Adam divides each gradient coordinate by its own scale, so that rounding in near-zero coordinates moves those
    # weights by up to lr: after 6 steps at lr 1e-3 the two runs agree to 1e-4 relative, not 1e-6
    _assert_relative(cached["after"], plain["after"], 1e-4, "after the update")
    for name, weight in plain["weights"].items():
        _assert_relative(cached["weights"][name], weight, 1e-4, name)


@pytest.mark.slow
def test_lora_without_tower_adapters_caches_and_the_reference_pass_reuses_it(tiny_qwen2_5_vl):
    cached, plain = _one_step(tiny_qwen2_5_vl, 64, lora_rank=4), _one_step(tiny_qwen2_5_vl, 0, lora_rank=4)
    assert sum(cached["calls"]) == _unique_patches(tiny_qwen2_5_vl)
    assert cached["metrics"]["perf/vision_cache_misses"] == 4.0
    for key in ("old", "ref", "after"):
        torch.testing.assert_close(cached[key], plain[key], rtol=0, atol=1e-6, msg=key)


def test_the_cache_keeps_the_most_recent_items_within_its_budget():
    cache = vision_encoder.EmbeddingCache(budget_bytes=3 * 4 * 4)  # three (1, 4) fp32 entries
    for i in range(4):
        cache.put(bytes([i]), (torch.full((1, 4), float(i)),))
    assert [k[0] for k in cache.entries] == [1, 2, 3] and cache.bytes == 48
    cache.get(bytes([1]), torch.device("cpu"))  # used: now the most recent
    cache.put(bytes([4]), (torch.zeros(1, 4),))
    assert [k[0] for k in cache.entries] == [3, 1, 4]
    cache.put(bytes([5]), (torch.zeros(2, 4), torch.zeros(2, 4)))  # 64 bytes: larger than the budget, not kept
    assert bytes([5]) not in cache


def test_equal_pixels_give_equal_keys_and_any_change_another():
    pixels, grid = torch.arange(12.0).reshape(3, 4), torch.tensor([1, 1, 3])
    key = vision_encoder.content_key(pixels, grid)
    assert vision_encoder.content_key(pixels.clone(), grid.clone()) == key
    changed = pixels.clone()
    changed[2, 3] += 1e-6
    assert vision_encoder.content_key(changed, grid) != key
    assert vision_encoder.content_key(pixels.clone(), torch.tensor([1, 3, 1])) != key


# ----------------------------------------------------------------------------------------------------------------------
# two ranks: the hit/miss decision is the world's, and the cache works inside a Ulysses group
# ----------------------------------------------------------------------------------------------------------------------
def _two_rank_cache(rank: int, path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from easyrl.config import ActorConfig, FSDPConfig
    from easyrl.models import ulysses
    from easyrl.models.vision import freeze_vision_tower
    from easyrl.testing.vl_batch import VLSample, make_vl_batch, random_image
    from easyrl.workers.actor import Actor
    from easyrl.workers.fsdp_utils import apply_fsdp2

    processor = AutoProcessor.from_pretrained(path)

    def model(cache_mb: int):
        module = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        freeze_vision_tower(module, "worker.actor.model.freeze_vision_tower")
        apply_fsdp2(module, init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",)), FSDPConfig(mp_param_dtype="fp32"))
        vision_encoder.install(module, cache_bytes=cache_mb * 2**20)
        return module

    def batch(samples, seed):
        data = make_vl_batch(processor, path, samples, response_length=5, seed=seed)
        data.meta_info["temperature"] = 1.0
        return data

    config = ActorConfig(padding_free=True, dynamic_batching=False, use_torch_compile=False)
    config.micro_batch_size_per_device_for_experience = 2
    # data parallel: each rank its own samples; in the second pass rank 0 sees its batch again (all hits) while
    # rank 1 sees new pictures (misses): both must run the tower, rank 0 on a blank picture, or FSDP hangs
    first = batch([VLSample(f"Picture {rank}?", images=[random_image(10 + rank)]), VLSample("Text only.")], rank)
    second = first if rank == 0 else batch([VLSample("New?", images=[random_image(20)])] * 2, 7)
    cached, plain = Actor(config, model(64), processor=processor), Actor(config, model(0), processor=processor)
    calls = _patches_per_call(cached.module)
    for data in (first, second):
        got, _ = cached.compute_log_probs(data)
        expected, _ = plain.compute_log_probs(data)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    # rank 0: its picture (24 patches), then a blank picture (4 patches: one merged token) in step with rank 1
    assert calls == ([24, 4] if rank == 0 else [24, 24]), calls
    metrics = vision_encoder.take_cache_metrics(cached.module)
    # rank 0: its picture missed, then hit; rank 1: its picture missed, then the new one missed once and its copy in
    # the same micro-batch hit
    assert metrics == {"perf/vision_cache_hits": 1.0, "perf/vision_cache_misses": 1.0 if rank == 0 else 2.0}

    # Ulysses 2 with the cache: both ranks hold the same micro-batch, split its items, cache all of them
    sp = ulysses.build_sequence_parallel(2)
    shared = batch([VLSample("A?", images=[random_image(30)]), VLSample("B?", images=[random_image(31)])], 9)
    reference, _ = plain.compute_log_probs(shared)
    group = Actor(config, cached.module, processor=processor, sp=sp)
    calls.clear()
    for _ in range(2):
        got, _ = group.compute_log_probs(shared)
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-6)
    assert calls == [24], calls  # one picture each in the first pass, none in the second
    dist.barrier()


@pytest.mark.slow
def test_ranks_decide_together_and_a_ulysses_group_shares_the_cached_pictures(tiny_qwen2_5_vl):
    from tests.test_ulysses import _run_two_ranks

    _run_two_ranks(_two_rank_cache, tiny_qwen2_5_vl)

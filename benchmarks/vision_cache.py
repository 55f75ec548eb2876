"""Seconds per training step with and without the frozen vision tower's cache (worker.actor.model.vision_cache_mb).

One actor step on one rank, built as the worker builds it (FSDP2, fp32, ``freeze_vision_tower=true``): old
log-probs, the reference's log-probs from the same model (as LoRA's reference is: a second pass over the batch), and
``--epochs`` PPO epochs of updates. Each prompt holds one ``--frames``-frame video and is sampled ``--n`` times, so
without the cache the tower encodes every video n times in each of the 2 + epochs passes; with it, once per step
(models/vision_encoder.py). Every step brings new videos (the cache never serves one step from another's). The
model is a small random Qwen2.5-VL (vision tower depth 4, width 128; language model 2 layers, width 128).

    .venv/bin/python -m benchmarks.vision_cache                  # 4 prompts x n=4, 64-frame 112x112 videos
    .venv/bin/python -m benchmarks.vision_cache --steps 1 --prompts 2 --no-record

Also reported: the seconds spent inside the vision tower (a forward hook pair on it) and the cache's hits / misses.
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

import easyrl  # noqa: F401  (process environment)

from .common import append_result, print_table


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (rollout.n)")
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--size", type=int, default=112, help="frame width and height in pixels")
    parser.add_argument("--epochs", type=int, default=2, help="PPO epochs")
    parser.add_argument("--steps", type=int, default=2, help="measured steps per setting")
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--no-record", action="store_true", help="do not append to benchmarks/results.jsonl")
    return parser.parse_args(argv)


def build_small_qwen2_5_vl(path: Path) -> str:
    """The tiny Qwen2.5-VL's layout, widened: tower depth 4 / width 128, language model 2 layers / width 128."""
    from transformers import AutoConfig, AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from easyrl.testing.tiny_vlms import build_tiny_vlm, save_random_model

    base = build_tiny_vlm("qwen2_5_vl", path / "base")
    config = AutoConfig.from_pretrained(base)
    config.vision_config.update({"depth": 4, "hidden_size": 128, "intermediate_size": 256, "out_hidden_size": 128})
    config.vision_config.fullatt_block_indexes = [1, 3]
    config.text_config.update(
        {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
    )
    processor = AutoProcessor.from_pretrained(base)
    return str(save_random_model(Qwen2_5_VLForConditionalGeneration, config, path / "small", 0, processor))


def _batch(processor, path: str, args: argparse.Namespace, step: int):
    from easyrl.testing.vl_batch import VLSample, make_vl_batch, random_video

    samples = []
    for prompt in range(args.prompts):
        video = random_video(1000 * step + prompt, frames=args.frames, width=args.size, height=args.size)
        samples += [VLSample("What happens in the video?", videos=[video])] * args.n  # n samples share the video
    data = make_vl_batch(processor, path, samples, response_length=args.response_length, seed=step)
    data.meta_info["temperature"] = 1.0
    return data


def _tower_timer(module) -> list[float]:
    from easyrl.models.vision import vision_tower

    spent, started = [0.0], []
    tower = vision_tower(module)
    tower.register_forward_pre_hook(lambda *_: started.append(time.perf_counter()))
    tower.register_forward_hook(lambda *_: spent.__setitem__(0, spent[0] + time.perf_counter() - started.pop()))
    return spent


def measure(path: str, cache_mb: int, args: argparse.Namespace) -> dict:
    """Seconds per step (mean over ``args.steps`` after one warm-up step) at a cache budget of ``cache_mb``."""
    from transformers import AutoProcessor

    from easyrl.models import vision_encoder
    from easyrl.testing.single_rank import build_actor, one_rank_process_group

    rows = args.prompts * args.n
    overrides = [
        "worker.actor.model.freeze_vision_tower=true",
        f"worker.actor.model.vision_cache_mb={cache_mb}",
        "worker.actor.model.enable_gradient_checkpointing=false",
        "worker.actor.fsdp.torch_dtype=fp32",
        "worker.actor.fsdp.mp_param_dtype=fp32",
        f"worker.actor.ppo_epochs={args.epochs}",
        "worker.actor.dynamic_batching=false",
        "worker.actor.use_torch_compile=false",
        f"worker.actor.micro_batch_size_per_device_for_update={args.n}",
        f"worker.actor.micro_batch_size_per_device_for_experience={2 * args.n}",
        f"worker.actor.global_batch_size={rows}",
        "algorithm.disable_kl=true",
        "algorithm.use_kl_loss=false",
    ]
    processor = AutoProcessor.from_pretrained(path)
    seconds, tower_seconds = [], []
    with one_rank_process_group():
        torch.manual_seed(0)
        actor, module, _ = build_actor(path, overrides, batch_size=rows)
        actor.processor = processor
        tower = _tower_timer(module)
        for step in range(args.steps + 1):
            data = _batch(processor, path, args, step)
            tower[0] = 0.0
            start = time.perf_counter()
            old, _ = actor.compute_log_probs(data)  # old log-probs
            actor.compute_log_probs(data)  # the reference, same model
            data.batch["old_log_probs"] = old
            data.batch["advantages"] = torch.linspace(-1.0, 1.0, rows)[:, None].expand_as(old).contiguous()
            actor.update_policy(data)
            if step:  # step 0 warms up
                seconds.append(time.perf_counter() - start)
                tower_seconds.append(tower[0])
        metrics = vision_encoder.take_cache_metrics(module)
    return {
        "cache_mb": cache_mb,
        "s_per_step": sum(seconds) / len(seconds),
        "tower_s_per_step": sum(tower_seconds) / len(tower_seconds),
        "cache_hits": metrics.get(vision_encoder.HITS_METRIC, 0.0),
        "cache_misses": metrics.get(vision_encoder.MISSES_METRIC, 0.0),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as folder:
        path = build_small_qwen2_5_vl(Path(folder))
        without, cached = measure(path, 0, args), measure(path, 2048, args)
    rows = [without, cached]
    print_table(rows, title=f"{args.prompts} prompts x n={args.n}, {args.frames}-frame videos, {args.epochs} epochs")
    results = {
        "prompts": args.prompts,
        "n": args.n,
        "frames": args.frames,
        "size": args.size,
        "epochs": args.epochs,
        "steps": args.steps,
        "without_cache": without,
        "with_cache": cached,
        "speedup": without["s_per_step"] / cached["s_per_step"],
    }
    print(f"speedup with the cache: {results['speedup']:.2f}x")
    if not args.no_record:
        append_result("vision_cache", results)
    return results


if __name__ == "__main__":
    main()

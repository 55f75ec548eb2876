"""Actor-update tokens/s and MFU on one GPU: a ~0.5B random Qwen2 model, bf16 compute, padding-free on and off.

    .venv/bin/python -m benchmarks.actor_update_gpu [--batch 64 --prompt-length 512 --response-length 1024]

The update is easyrl's own: the model built by ``build_fsdp_model`` (FSDP2 on a one-rank group, fp32 master weights,
bf16 compute, fp32 gradient reduction) and ``Actor.update_policy`` (PPO clipped loss, token mean, one optimizer step
over the batch in micro-batches). The batch is rollout-shaped: left-padded prompts and right-padded responses of
random lengths, so padding-free packing has padding to skip. Variants: padded, padding-free, and padding-free with
Liger kernels (``apply_liger_kernel_to_qwen2``) when liger-kernel is installed (applied last: it patches the model
classes for the rest of the process).

Tokens/s counts real (non-padding) tokens; MFU uses easyrl.trainer.flops (PaLM's 6N + attention formula) against
the GPU's dense bf16 peak. Needs an NVIDIA GPU: on a CPU-only machine it stops with a message.
"""

import argparse
import importlib.util
import os
import sys
import tempfile
import time

import easyrl  # noqa: F401  (process environment)


# Qwen2.5-0.5B's architecture (random weights): 24 layers, hidden 896, 14 query / 2 key-value heads, MLP 4864
QWEN2_0_5B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="sequences per optimizer step")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward pass")
    parser.add_argument("--prompt-length", type=int, default=512, help="prompt padding width")
    parser.add_argument("--response-length", type=int, default=1024, help="response padding width")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per variant (after one warm-up)")
    parser.add_argument("--variants", nargs="+", default=["padded", "padding_free", "padding_free+liger"])
    return parser.parse_args(argv)


def build_model_folder(folder: str) -> str:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN2_0_5B), dtype=torch.float32)
    model.save_pretrained(folder)
    return folder


def rollout_batch(args: argparse.Namespace, vocab: int, seed: int = 0):
    """Left-padded prompts ++ right-padded responses with uniform random lengths, plus PPO targets."""
    import torch

    from easyrl.protocol import DataProto

    gen = torch.Generator().manual_seed(seed)
    b, p, r = args.batch, args.prompt_length, args.response_length
    prompt_lengths = torch.randint(p // 4, p + 1, (b,), generator=gen)
    response_lengths = torch.randint(r // 8, r + 1, (b,), generator=gen)
    prompt_mask = (torch.arange(p)[None, :] >= p - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(r)[None, :] < response_lengths[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(5, vocab, (b, p + r), generator=gen) * attention_mask
    responses = input_ids[:, p:]
    tensors = {
        "prompts": input_ids[:, :p],
        "responses": responses,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "old_log_probs": -torch.rand(b, r, generator=gen) * 5 * response_mask,
        "advantages": torch.randn(b, r, generator=gen) * response_mask,
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def run_variant(args: argparse.Namespace, model_path: str, padding_free: bool, data) -> dict:
    import torch

    from easyrl.config import load_config
    from easyrl.trainer.flops import FlopsCounter, compute_mfu, peak_flops_per_device
    from easyrl.utils import device
    from easyrl.workers.actor import Actor
    from easyrl.workers.fsdp_utils import build_device_mesh, build_fsdp_model
    from easyrl.workers.optim import build_optimizer

    # through load_config so that aliases (loss_avg_mode=token, loss_type=default) resolve as in a real run
    actor_config = load_config(
        [
            f"worker.actor.model.model_path={model_path}",
            f"worker.actor.global_batch_size={args.batch}",
            f"worker.actor.micro_batch_size_per_device_for_update={args.micro_batch}",
            f"worker.actor.padding_free={padding_free}",
            "worker.actor.dynamic_batching=false",
            "worker.actor.use_torch_compile=false",
            "worker.actor.fsdp.torch_dtype=fp32",
            "worker.actor.fsdp.mp_param_dtype=bf16",
            "worker.actor.fsdp.mp_reduce_dtype=fp32",
        ],
        validate=False,
    ).worker.actor
    fsdp = actor_config.fsdp
    module = build_fsdp_model(
        actor_config.model,
        fsdp,
        build_device_mesh(1, -1),
        kind="causal_lm",
        trainable=True,
        default_dtype=torch.float32,
    )
    optimizer = build_optimizer(module, actor_config.optim, "worker.actor.optim")
    actor = Actor(actor_config, module, optimizer, mini_batch_size=args.batch)
    batch = data.to(device.get_torch_device())
    actor.update_policy(batch)  # warm-up: kernels, allocator, optimizer states
    device.synchronize()
    start = time.perf_counter()
    for _ in range(args.repeats):
        actor.update_policy(batch)
    device.synchronize()
    seconds = (time.perf_counter() - start) / args.repeats
    seq_lens = data.batch["attention_mask"].sum(-1).tolist()
    flops = FlopsCounter(module.config).flops(seq_lens)
    peak = peak_flops_per_device(torch.bfloat16)
    accelerator = torch.get_device_module(device.get_device_name())
    result = {
        "s/update": seconds,
        "tokens/s": sum(seq_lens) / seconds,
        "MFU_%": 100 * compute_mfu(flops, seconds, 1, peak) if peak else None,
        "peak_mem_GiB": accelerator.max_memory_allocated() / 2**30
        if hasattr(accelerator, "max_memory_allocated")
        else None,
    }
    del actor, optimizer, module
    device.empty_cache()
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from easyrl.utils import device

    if not device.is_cuda_available():
        sys.exit(
            "actor_update_gpu needs an NVIDIA GPU (none is visible here); it measures bf16 actor-update throughput "
            "and MFU. Run it on a GPU machine."
        )
    import torch.distributed as dist

    from .common import append_result, describe_machine, print_table

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group(device.get_dist_backend(), rank=0, world_size=1)
    device.set_device(0)
    has_liger = importlib.util.find_spec("liger_kernel") is not None
    table = []
    try:
        with tempfile.TemporaryDirectory(prefix="easyrl_bench_qwen2_") as folder:
            model_path = build_model_folder(folder)
            data = rollout_batch(args, QWEN2_0_5B["vocab_size"])
            for variant in args.variants:
                if "liger" in variant:
                    if not has_liger:
                        print(f"{variant}: skipped, liger-kernel is not installed")
                        continue
                    from liger_kernel.transformers import apply_liger_kernel_to_qwen2

                    apply_liger_kernel_to_qwen2()
                result = run_variant(args, model_path, padding_free=variant.startswith("padding_free"), data=data)
                table.append({"variant": variant, **result})
    finally:
        dist.destroy_process_group()
    print_table(
        table,
        title=f"Actor update, Qwen2.5-0.5B shape (random), bf16 compute: {args.batch} sequences, prompts <= "
        f"{args.prompt_length}, responses <= {args.response_length}, micro-batch {args.micro_batch} "
        f"({describe_machine()})",
    )
    append_result("actor_update_gpu", {"args": vars(args), "variants": table})


if __name__ == "__main__":
    main()

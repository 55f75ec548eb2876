"""Actor-update tokens/s and MFU on one GPU: a ~0.5B random Qwen2 model, bf16 compute, in several variants.

    python -m benchmarks.actor_update_gpu [--batch 64 --micro-batch 64 --variants padding_free+fused+liger --profile]

The update is easyrl's own, built as a worker builds it (``easyrl.testing.single_rank.build_actor``: FSDP2 on a
one-rank group, fp32 master weights, bf16 compute, fp32 gradient reduction, then ``Actor.update_policy``: PPO clipped
loss, token mean, one optimizer step over the batch in micro-batches), in a plain process without Ray. The batch is
rollout-shaped: left-padded prompts and right-padded responses of random lengths, so padding-free packing has padding
to skip. Variants (``VARIANTS``): padded, padding-free, without gradient checkpointing, with the fused LM head
(``use_fused_kernels``) and with Liger's kernels (``use_liger``, when liger-kernel is installed; its patch is
process-wide, so the Liger variants come last). ``use_liger`` runs Liger's RoPE and SwiGLU beside the model's own
RMSNorm compiled by torch.compile (`fsdp_utils.LIGER_RMS_NORM`); ``--rms-norm liger`` takes Liger's RMSNorm kernel
instead, to compare.

Tokens/s counts real (non-padding) tokens; MFU uses easyrl.trainer.flops (PaLM's 6N + attention formula) against
the GPU's dense bf16 peak. With ``--n`` > 1 and a ``shared`` variant both count the work of the unshared batch
(every sample's prompt), so they measure samples delivered, not the FLOPs the GPU ran. Needs an NVIDIA GPU: on a CPU-only machine it stops with a message.
"""

import argparse
import importlib.util
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


# variant -> worker.actor overrides
VARIANTS = {
    "padded": ["worker.actor.padding_free=false"],
    "padding_free": ["worker.actor.padding_free=true"],
    "padding_free-ckpt": ["worker.actor.padding_free=true", "worker.actor.model.enable_gradient_checkpointing=false"],
    "padding_free+fused": ["worker.actor.padding_free=true", "worker.actor.model.use_fused_kernels=true"],
    "padding_free+liger": ["worker.actor.padding_free=true", "worker.actor.model.use_liger=true"],
    "padding_free+fused+liger": [
        "worker.actor.padding_free=true",
        "worker.actor.model.use_fused_kernels=true",
        "worker.actor.model.use_liger=true",
    ],
    "padding_free-ckpt+fused+liger": [
        "worker.actor.padding_free=true",
        "worker.actor.model.enable_gradient_checkpointing=false",
        "worker.actor.model.use_fused_kernels=true",
        "worker.actor.model.use_liger=true",
    ],
    # LoRA rank 64 on every linear layer (EasyR1's LoRA recipes): MFU counts 4N per token, no base weight gradients
    "padding_free+fused+liger+lora": [
        "worker.actor.padding_free=true",
        "worker.actor.model.use_fused_kernels=true",
        "worker.actor.model.use_liger=true",
        "worker.actor.model.lora.rank=64",
        "worker.actor.model.lora.alpha=64",
    ],
    # Prefix Grouper (arXiv 2506.05433): each group of --n samples computes its prompt once
    "padding_free+shared": ["worker.actor.padding_free=true", "worker.actor.shared_prefix=true"],
    "padding_free+liger+shared": [
        "worker.actor.padding_free=true",
        "worker.actor.model.use_liger=true",
        "worker.actor.shared_prefix=true",
    ],
    "padding_free-ckpt+fused+liger+lora": [
        "worker.actor.padding_free=true",
        "worker.actor.model.enable_gradient_checkpointing=false",
        "worker.actor.model.use_fused_kernels=true",
        "worker.actor.model.use_liger=true",
        "worker.actor.model.lora.rank=64",
        "worker.actor.model.lora.alpha=64",
    ],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="sequences per optimizer step")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward pass")
    parser.add_argument("--prompt-length", type=int, default=512, help="prompt padding width")
    parser.add_argument("--response-length", type=int, default=1024, help="response padding width")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per variant (after one warm-up)")
    parser.add_argument(
        "--n", type=int, default=1, help="samples per prompt: groups of n rows share one prompt, as GRPO's rollout.n"
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--profile", action="store_true", help="print the top GPU kernels of one timed update")
    parser.add_argument(
        "--rms-norm",
        choices=["liger", "compiled"],
        default="compiled",
        help="with use_liger: the model's own RMSNorm compiled (what easyrl does), or Liger's RMSNorm kernel",
    )
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
    if b % args.n:
        sys.exit(f"--batch {b} is not a multiple of --n {args.n}")
    # one length and one set of token ids per group of n samples (their prompt), drawn before the responses
    prompt_lengths = torch.randint(p // 4, p + 1, (b // args.n,), generator=gen).repeat_interleave(args.n)
    prompt_ids = torch.randint(5, vocab, (b // args.n, p), generator=gen).repeat_interleave(args.n, dim=0)
    response_lengths = torch.randint(r // 8, r + 1, (b,), generator=gen)
    prompt_mask = (torch.arange(p)[None, :] >= p - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(r)[None, :] < response_lengths[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.cat([prompt_ids, torch.randint(5, vocab, (b, r), generator=gen)], dim=1) * attention_mask
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


# GPU kernel name (lower case) -> kind, first match wins; the rest is "other"
KERNEL_KINDS = [
    ("attention", ("flash", "fmha", "varlen", "attention")),
    ("matrix products", ("gemm", "cutlass", "cublas", "nvjet", "xmma", "matmul", "splitk")),
    ("optimizer", ("multi_tensor", "adam")),
    ("liger", ("rms_norm", "swiglu", "rope", "liger")),
    ("log-prob kernels (Triton)", ("_partial_logsumexp_kernel", "_merge_kernel", "_log_probs_grad_kernel")),
    ("torch.compile (RMSNorm, entropy)", ("triton_",)),
    ("copies and casts", ("copy", "memcpy", "memset", "fill", "cat", "cast")),
    ("reductions", ("reduce", "softmax", "sum", "max")),
    ("element-wise", ("elementwise", "vectorized", "unrolled")),
]


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    for kind, needles in KERNEL_KINDS:
        if any(needle in lowered for needle in needles):
            return kind
    return "other"


def print_gpu_time_by_kind(events, seconds: float) -> None:
    """Sum the profiled GPU kernels' own time by kind: where an update's GPU time goes, against its wall time."""
    totals: dict[str, float] = {}
    for event in events:
        own = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
        kernel = "CUDA" in str(getattr(event, "device_type", "")) and not getattr(event, "is_user_annotation", False)
        if own and kernel and not event.key.startswith(("Optimizer.", "ProfilerStep")):  # ranges, not kernels
            totals[kernel_kind(event.key)] = totals.get(kernel_kind(event.key), 0.0) + own / 1e6
    busy = sum(totals.values())
    print(f"GPU busy {busy:.3f} s of a {seconds:.3f} s update ({100 * busy / seconds:.0f}%)")
    for kind, total in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"  {kind:<28} {1000 * total:8.1f} ms  {100 * total / busy:5.1f}%")


def run_variant(args: argparse.Namespace, model_path: str, overrides: list[str], data) -> dict:
    import torch

    from easyrl.testing.single_rank import build_actor
    from easyrl.trainer.flops import FlopsCounter, compute_mfu, peak_flops_per_device
    from easyrl.utils import device

    actor, module, optimizer = build_actor(
        model_path,
        [
            f"worker.actor.global_batch_size={args.batch}",
            f"worker.actor.micro_batch_size_per_device_for_update={args.micro_batch}",
            "worker.actor.dynamic_batching=false",
            "worker.actor.fsdp.torch_dtype=fp32",
            "worker.actor.fsdp.mp_param_dtype=bf16",
            "worker.actor.fsdp.mp_reduce_dtype=fp32",
            *overrides,
        ],
        batch_size=args.batch,
    )
    accelerator = torch.get_device_module(device.get_device_name())
    if hasattr(accelerator, "reset_peak_memory_stats"):
        accelerator.reset_peak_memory_stats()
    batch = data.to(device.get_torch_device())
    actor.update_policy(batch)  # warm-up: kernels, allocator, optimizer states
    device.synchronize()
    start = time.perf_counter()
    for _ in range(args.repeats):
        actor.update_policy(batch)
    device.synchronize()
    seconds = (time.perf_counter() - start) / args.repeats
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            actor.update_policy(batch)
            device.synchronize()
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))
        print_gpu_time_by_kind(prof.key_averages(), seconds)
    seq_lens = data.batch["attention_mask"].sum(-1).tolist()
    frozen = any(o.startswith("worker.actor.model.lora.rank=") and not o.endswith("=0") for o in overrides)
    flops = FlopsCounter(module.config).flops(seq_lens, frozen_weights=frozen)
    peak = peak_flops_per_device(torch.bfloat16)
    accelerator = torch.get_device_module(device.get_device_name())
    result = {
        "attention": module.config._attn_implementation,
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
    from easyrl.testing.single_rank import one_rank_process_group

    from .common import append_result, describe_machine, print_table

    table = []
    if args.rms_norm == "liger":
        from easyrl.workers import fsdp_utils

        fsdp_utils.LIGER_RMS_NORM = True
    with one_rank_process_group(), tempfile.TemporaryDirectory(prefix="easyrl_bench_qwen2_") as folder:
        model_path = build_model_folder(folder)
        data = rollout_batch(args, QWEN2_0_5B["vocab_size"])
        for variant in args.variants:
            if variant not in VARIANTS:
                sys.exit(f"--variants: unknown {variant!r}; choose from {', '.join(VARIANTS)}")
            if "liger" in variant and importlib.util.find_spec("liger_kernel") is None:
                print(f"{variant}: skipped, liger-kernel is not installed")
                continue
            try:
                result = run_variant(args, model_path, VARIANTS[variant], data=data)
            except Exception as error:  # one variant failing (e.g. out of memory) leaves the others' numbers
                print(f"{variant}: failed: {type(error).__name__}: {error}")
                continue
            table.append({"variant": variant, **result})
    print_table(
        table,
        title=f"Actor update, Qwen2.5-0.5B shape (random), bf16 compute: {args.batch} sequences ({args.n} per "
        f"prompt), prompts <= {args.prompt_length}, responses <= {args.response_length}, micro-batch {args.micro_batch}"
        f"{', Liger RMSNorm' if args.rms_norm == 'liger' else ''} ({describe_machine()})",
    )
    append_result("actor_update_gpu", {"args": vars(args), "variants": table})


if __name__ == "__main__":
    main()

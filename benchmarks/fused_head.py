"""The LM head's log-probs (+ entropy) forward and backward: logits path vs fused head (models/fused_head.py).

Measures, for hidden states (tokens, hidden) and a head (vocab, hidden): seconds of forward + backward, the bytes
autograd keeps for the backward pass (inputs and weight left out), and the peak memory of the whole pass (GPU: the
allocator's peak; CPU: the process's peak RSS, each variant in a fresh process).

    .venv/bin/python -m benchmarks.fused_head                              # CPU default: 4096 x 576 x 49152 fp32
    .venv/bin/python -m benchmarks.fused_head --tokens 16384 --hidden 896 --vocab 151936 --dtype bf16   # GPU
"""

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

import easyrl  # noqa: F401  (process environment)
from easyrl.models.fused_head import FusedHeadRequest, fused_log_probs_and_entropy
from easyrl.utils import device
from easyrl.utils.torch_functional import select_chunk_kernels, select_logprob_kernels

from .common import append_result, print_table


TEMPERATURE = 0.7
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _inputs(args):
    gen = torch.Generator().manual_seed(0)
    dtype, where = DTYPES[args.dtype], device.get_torch_device()
    hidden = (torch.randn(args.tokens, args.hidden, generator=gen) * 0.5).to(where, dtype).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden, generator=gen) * 0.05).to(where, dtype).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(where)
    return hidden, weight, labels


def _loss(variant: str, hidden, weight, labels, entropy: bool, use_torch_compile: bool) -> torch.Tensor:
    """sum of log-probs (+ 0.01 x sum of entropies): the terms of the policy loss and the entropy bonus."""
    if variant == "fused":
        request = FusedHeadRequest(TEMPERATURE, select_chunk_kernels(use_torch_compile), entropy)
        out = fused_log_probs_and_entropy(hidden, weight, None, labels, request)
        return out[:, 0].sum() + (0.01 * out[:, 1].sum() if entropy else 0.0)
    log_probs_fn, entropy_fn = select_logprob_kernels(use_torch_compile)
    logits = hidden @ weight.t()  # (tokens, vocab), what the model's head returns today
    loss = log_probs_fn(logits, labels, TEMPERATURE).sum()
    return loss + (0.01 * entropy_fn(logits, TEMPERATURE).sum() if entropy else 0.0)


def _saved_bytes(variant: str, args) -> tuple[int, int]:
    """(largest, total) bytes autograd keeps for backward, leaves (hidden, weight) left out."""
    hidden, weight, labels = _inputs(args)
    leaves = {hidden.untyped_storage().data_ptr(), weight.untyped_storage().data_ptr()}
    sizes = []

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in leaves:
            sizes.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        _loss(variant, hidden, weight, labels, args.entropy, args.compile)
    return max(sizes, default=0), sum(sizes)


def measure(variant: str, args) -> dict:
    hidden, weight, labels = _inputs(args)
    seconds = []
    for _ in range(args.warmup + args.repeats):
        hidden.grad = weight.grad = None
        device.synchronize()
        if device.is_cuda_available():
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        _loss(variant, hidden, weight, labels, args.entropy, args.compile).backward()
        device.synchronize()
        seconds.append(time.perf_counter() - start)
    largest, total = _saved_bytes(variant, args)
    if device.is_cuda_available():
        peak_gb = torch.cuda.max_memory_allocated() / 1e9
    else:
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB -> GB, the whole process
    timed = seconds[args.warmup :]
    return {
        "variant": variant,
        "best_s": round(min(timed), 4),
        "median_s": round(sorted(timed)[len(timed) // 2], 4),
        "saved_largest_mb": round(largest / 1e6, 3),
        "saved_total_mb": round(total / 1e6, 3),
        "peak_gb": round(peak_gb, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--entropy", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variant", choices=["plain", "fused"], help="measure one variant here (internal)")
    args = parser.parse_args()
    if args.variant:  # one variant in this process: print its row for the parent
        print(json.dumps(measure(args.variant, args)))
        return
    rows = []
    for variant in ("plain", "fused"):  # fresh processes: the CPU peak RSS is per process
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.fused_head", *sys.argv[1:], "--variant", variant],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    plain, fused = rows
    shape = {k: getattr(args, k) for k in ("tokens", "hidden", "vocab", "dtype", "entropy", "compile")}
    print_table(rows, title=f"LM head log-probs forward + backward, {shape}")
    ratio = fused["best_s"] / plain["best_s"]
    print(f"time fused / plain: {ratio:.2f}; peak {plain['peak_gb']} GB -> {fused['peak_gb']} GB")
    append_result("fused_head", {**shape, "plain": plain, "fused": fused, "time_ratio_fused_over_plain": ratio})


if __name__ == "__main__":
    main()

"""Padding-free attention without a varlen kernel (CPU, fp32): one block-diagonal mask vs one sdpa call a sequence.

A packed row of ``--sequences`` sequences (lengths drawn from [L/2, L]) goes forward and backward through a
SmolLM2-135M-shaped model with random weights (``--layers`` of its 30 layers) twice: under transformers' ``sdpa``,
which separates the packed sequences with a (tokens x tokens) mask built from the restarting position ids, and
under easyrl's ``easyrl_varlen`` (models/attention.py), which on a device without PyTorch's varlen flash kernel runs
sdpa once per sequence. Both give the same logits; measured are the seconds of forward + backward (best of
``--repeats``, the two alternating in one process, so load hits both alike), the bytes autograd keeps for the
backward pass (parameters left out) and the peak RSS of each variant in a fresh process.

    .venv/bin/python -m benchmarks.packed_attention                           # 8 x 100, 16 x 256, 16 x 512 tokens
    .venv/bin/python -m benchmarks.packed_attention --shapes 16x256 --layers 30
"""

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

import easyrl  # noqa: F401  (process environment)
from easyrl.models import attention

from .common import append_result, print_table, saved_bytes


VARIANTS = {"mask": "sdpa", "per_sequence": attention.NAME}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8x100", "16x256", "16x512"], help="SEQUENCESxLONGEST")
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variant", choices=sorted(VARIANTS), help="peak RSS of one variant, one shape (internal)")
    parser.add_argument("--no-record", action="store_true", help="do not append to benchmarks/results.jsonl")
    return parser.parse_args(argv)


def _model(implementation: str, layers: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    )
    if implementation == attention.NAME:
        attention.register()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=implementation)


def _packed_row(shape: str) -> dict:
    sequences, longest = (int(x) for x in shape.split("x"))
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(longest // 2, longest + 1, (sequences,), generator=gen)
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
    return {
        "input_ids": torch.randint(0, 49152, (1, int(lengths.sum())), generator=gen),
        "position_ids": torch.cat([torch.arange(int(n)) for n in lengths])[None],
        **attention.packed_attention_kwargs(cu_seqlens, int(lengths.max())),
    }


def _forward(model, inputs: dict) -> torch.Tensor:
    # the LM head over the last quarter only, as the actor keeps the response positions' logits
    logits = model(**inputs, use_cache=False, logits_to_keep=inputs["input_ids"].shape[1] // 4).logits
    return logits.pow(2).mean()


def _high_water_rss_kb() -> int:
    """This process's peak RSS in kB. ``VmHWM`` belongs to the process's own memory map, which ``ru_maxrss`` does not:
    Linux carries a parent's ``ru_maxrss`` into a child it forks, so a big parent would hide the child's peak."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_rss_gb(variant: str, shape: str, layers: int) -> float:
    """One forward + backward in this (fresh) process; its peak RSS above the model's, in GB."""
    model = _model(VARIANTS[variant], layers)
    inputs = _packed_row(shape)
    before = _high_water_rss_kb()
    _forward(model, inputs).backward()
    return (_high_water_rss_kb() - before) / 1e6  # kB -> GB


def measure(shape: str, args: argparse.Namespace) -> dict:
    # first, in fresh processes (the CPU's peak RSS is per process), while this one is still small
    peaks = {}
    for variant in VARIANTS:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.packed_attention", "--shapes", shape, "--layers", str(args.layers)]
            + ["--variant", variant],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        peaks[variant] = round(json.loads(out.strip().splitlines()[-1]), 3)
    models = {variant: _model(name, args.layers) for variant, name in VARIANTS.items()}
    inputs = _packed_row(shape)
    seconds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    losses = {}
    for repeat in range(args.repeats + 1):  # the first round warms both up and is not counted
        for variant, model in models.items():
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            loss = _forward(model, inputs)
            loss.backward()
            if repeat:
                seconds[variant].append(time.perf_counter() - start)
            losses[variant] = loss.item()
    row = {"shape": shape, "tokens": inputs["input_ids"].shape[1]}
    for variant, model in models.items():
        row[f"{variant}_s"] = round(min(seconds[variant]), 3)
        row[f"{variant}_saved_mb"] = round(saved_bytes(model, lambda m=model: _forward(m, inputs)) / 1e6, 1)
    row["speedup"] = round(row["mask_s"] / row["per_sequence_s"], 3)
    row["loss_relative_difference"] = abs(losses["mask"] - losses["per_sequence"]) / abs(losses["mask"])
    row.update({f"{variant}_peak_gb": round(peak, 3) for variant, peak in peaks.items()})
    return row


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.variant:
        print(json.dumps(_peak_rss_gb(args.variant, args.shapes[0], args.layers)))
        return []
    rows = [measure(shape, args) for shape in args.shapes]
    print_table(rows, title=f"packed row forward + backward, SmolLM2-135M shape with {args.layers} layers, fp32")
    if not args.no_record:
        append_result("packed_attention", {"layers": args.layers, "threads": torch.get_num_threads(), "rows": rows})
    return rows


if __name__ == "__main__":
    main()

"""Activation memory per rank for one long sequence at ulysses_size 1 and 2 (models/ulysses.py, arXiv 2309.14509).

One packed sequence (prompt + response, ``--tokens`` in all) goes through the actor's log-prob forward pass
(``Actor._forward``: packing, the Ulysses slice and all-to-alls, log-probs and entropies of the response tokens) on
a tiny grouped-query model in fp32 on the CPU. Measured: the bytes autograd keeps for the backward pass (every tensor
saved by a ``torch.autograd.graph.saved_tensors_hooks`` pack hook, each storage counted once, parameters left out:
they are the same at any ulysses_size), on each of 2 gloo ranks. Ulysses 1 runs on one rank of the same processes
(the other idles), so both numbers come from the same model and input.

    .venv/bin/python -m benchmarks.ulysses_memory                 # 16k tokens, 2 layers, hidden 256, 8 / 4 heads
    .venv/bin/python -m benchmarks.ulysses_memory --tokens 4096   # quicker
    .venv/bin/python -m benchmarks.ulysses_memory --tokens 8192 --samples 4   # GRPO-shaped, with shared prefixes

The bar: at ulysses_size 2 each rank keeps at most 0.6x of what one rank keeps at ulysses_size 1.

``--samples n`` scores n sequences that share their prompt (the first half; each has its own response, as GRPO's n
samples of a prompt do) and also measures ulysses_size 2 with ``worker.actor.shared_prefix``, whose packed row holds
the prompt once: then a long prompt (a video) is kept once for the n samples, and split over the group.
"""

import argparse
import os
import socket
import time

import torch

import easyrl  # noqa: F401  (process environment)
from easyrl.workers.fsdp_utils import attention_implementation  # what the workers load models with

from .common import append_result, print_table, saved_bytes


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384, help="length of the one sequence (prompt + response)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=1, help="sequences sharing the prompt (the first half)")
    parser.add_argument("--no-record", action="store_true", help="do not append to benchmarks/results.jsonl")
    return parser.parse_args(argv)


def _model(args: argparse.Namespace):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=args.tokens,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation=attention_implementation()
    )


def _sequences(tokens: int, vocab: int, samples: int = 1):
    """A rollout-shaped batch of ``samples`` rows with the same prompt (the first half of each) and their own
    responses (the second half)."""
    from easyrl.protocol import DataProto

    prompt, response = tokens // 2, tokens - tokens // 2
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, vocab, (samples, tokens), generator=gen)
    input_ids[1:, :prompt] = input_ids[0, :prompt]
    ones = torch.ones(samples, tokens, dtype=torch.long)
    tensors = {
        "input_ids": input_ids,
        "attention_mask": ones,
        "position_ids": torch.arange(tokens)[None].expand(samples, -1),
        "responses": input_ids[:, prompt:],
        "response_mask": ones[:, :response],
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def _rank_main(rank: int, port: int, args: argparse.Namespace, results) -> None:
    import torch.distributed as dist

    from easyrl.config import ActorConfig
    from easyrl.models import ulysses
    from easyrl.workers.actor import Actor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        data = _sequences(args.tokens, args.vocab, args.samples)

        def measure(sp, shared: bool = False) -> tuple[int, float]:
            model = _model(args)
            config = ActorConfig(
                padding_free=True, dynamic_batching=False, use_torch_compile=False, shared_prefix=shared
            )
            config.micro_batch_size_per_device_for_experience = args.samples
            actor = Actor(config, model, sp=sp)
            start = time.perf_counter()
            size = saved_bytes(model, lambda: actor._forward(data, 1.0, calculate_entropy=True))
            return size, time.perf_counter() - start

        if rank == 0:
            results["ulysses_1"] = measure(None)
        dist.barrier()
        size, seconds = measure(ulysses.build_sequence_parallel(2))
        results[f"ulysses_2_rank{rank}"] = (size, seconds)
        if args.samples > 1:
            dist.barrier()
            results[f"ulysses_2_shared_rank{rank}"] = measure(ulysses.build_sequence_parallel(2), shared=True)
    finally:
        dist.destroy_process_group()


def main(argv=None) -> dict:
    import torch.multiprocessing as mp

    args = parse_args(argv)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.start_processes(_rank_main, (port, args, results), nprocs=2, join=True, start_method="spawn")
    one, _ = results["ulysses_1"]
    two = max(results["ulysses_2_rank0"][0], results["ulysses_2_rank1"][0])
    record = {
        "tokens": args.tokens,
        "samples": args.samples,
        "model": {
            "layers": args.layers,
            "hidden": args.hidden,
            "heads": args.heads,
            "kv_heads": args.kv_heads,
            "vocab": args.vocab,
            "dtype": "fp32",
        },
        "saved_for_backward_mib_ulysses_1": round(one / 2**20, 1),
        "saved_for_backward_mib_ulysses_2_per_rank": round(two / 2**20, 1),
        "ratio_2_over_1": round(two / one, 3),
        "forward_s_ulysses_1": round(results["ulysses_1"][1], 2),
        "forward_s_ulysses_2": round(max(results["ulysses_2_rank0"][1], results["ulysses_2_rank1"][1]), 2),
    }
    rows = [
        {"ulysses_size": 1, "saved MiB per rank": record["saved_for_backward_mib_ulysses_1"]},
        {"ulysses_size": 2, "saved MiB per rank": record["saved_for_backward_mib_ulysses_2_per_rank"]},
    ]
    if args.samples > 1:
        shared = [results[f"ulysses_2_shared_rank{rank}"] for rank in (0, 1)]
        record["saved_for_backward_mib_ulysses_2_shared_per_rank"] = round(max(s for s, _ in shared) / 2**20, 1)
        record["ratio_shared_over_unshared_ulysses_2"] = round(max(s for s, _ in shared) / two, 3)
        record["forward_s_ulysses_2_shared"] = round(max(t for _, t in shared), 2)
        rows.append(
            {
                "ulysses_size": "2, shared prefix",
                "saved MiB per rank": record["saved_for_backward_mib_ulysses_2_shared_per_rank"],
            }
        )
    print_table(
        rows,
        title=f"activation memory, {args.samples} sequence(s) of {args.tokens} tokens sharing the first half: ratio "
        f"{record['ratio_2_over_1']}",
    )
    if not args.no_record:
        append_result("ulysses_memory", record)
    return record


if __name__ == "__main__":
    main()

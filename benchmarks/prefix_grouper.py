"""The actor update and log-prob pass with and without shared prefixes (`worker.actor.shared_prefix`, Prefix Grouper,
arXiv 2506.05433), in one process, alternating the two so both see the same machine load.

    .venv/bin/python -m benchmarks.prefix_grouper                 # text (demo shape) and VL cases
    .venv/bin/python -m benchmarks.prefix_grouper --case text --repeats 3
    python -m benchmarks.prefix_grouper --case gpu --prompt-tokens 512 --response-min 1 --response-max 512 \
        --micro-batch-size 48 --repeats 3                          # GPU: Qwen2.5-0.5B shape, bf16

text: the demo's shape: SmolLM2-135M-Instruct (the demo's builder), 8 prompts of 55 tokens x n=6, responses of
20-40 tokens, fp32, micro-batches of 8 samples (examples/smollm2_arithmetic_grpo.yaml), one optimizer step (SGD with
lr 0, so the weights stay put across repeats). vl: the small Qwen2.5-VL (builtin://Small-Qwen2.5-VL), 4 prompts with
one 448 x 448 picture (256 vision tokens) x n=6, responses of 1-40 tokens.

Reports per variant the tokens the update runs (each shared prompt once), the median seconds of one update and of
one log-prob pass over the batch, and the shared / unshared ratios; prints a table and appends one JSON line to
benchmarks/results.jsonl.
"""

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import easyrl  # noqa: F401  (process environment)
from easyrl.config import PPOConfig, derive
from easyrl.protocol import DataProto
from easyrl.workers.actor import Actor
from easyrl.workers.fsdp_utils import attention_implementation  # what the workers load models with

from .common import append_result, describe_machine, print_table


TEMPERATURE = 0.7


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=["text", "vl", "both", "gpu"], default="both", help="gpu: see run_gpu")
    parser.add_argument("--prompts", type=int, default=8, help="text case: prompts per update (VL: half)")
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--prompt-tokens", type=int, default=55)
    parser.add_argument("--response-min", type=int, default=20)
    parser.add_argument("--response-max", type=int, default=40)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    return parser.parse_args(argv)


def actor_config(shared: bool, micro_batch_size: int):
    config = PPOConfig()
    derive(config)
    actor = config.worker.actor
    actor.padding_free, actor.dynamic_batching, actor.use_torch_compile = True, False, False
    actor.micro_batch_size_per_device_for_update = actor.micro_batch_size_per_device_for_experience = micro_batch_size
    actor.max_grad_norm = 1e9
    actor.shared_prefix = shared
    return actor


def add_targets(data: DataProto, seed: int = 0) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    mask = data.batch["response_mask"]
    data.batch["old_log_probs"] = -torch.rand(mask.shape, generator=gen) * mask
    data.batch["advantages"] = torch.randn(mask.shape, generator=gen) * mask
    data.meta_info["temperature"] = TEMPERATURE
    return data


def text_batch(args, vocab: int) -> DataProto:
    """``prompts`` random prompts of ``prompt_tokens`` tokens, each sampled ``n`` times with its own response."""
    gen = torch.Generator().manual_seed(0)
    prompt_length, response_length = args.prompt_tokens, args.response_max
    rows, masks = [], []
    for _ in range(args.prompts):
        prompt = torch.randint(10, vocab, (prompt_length,), generator=gen)
        for _ in range(args.n):
            length = int(torch.randint(args.response_min, args.response_max + 1, (1,), generator=gen))
            response = torch.zeros(response_length, dtype=torch.long)
            response[:length] = torch.randint(10, vocab, (length,), generator=gen)
            rows.append(torch.cat([prompt, response]))
            masks.append(torch.cat([torch.ones(prompt_length), torch.arange(response_length) < length]).long())
    input_ids, attention_mask = torch.stack(rows), torch.stack(masks)
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, prompt_length:],
        "response_mask": attention_mask[:, prompt_length:],
    }
    return add_targets(DataProto.from_dict(tensors=tensors))


def vl_batch(args, path, processor) -> DataProto:
    from PIL import Image

    from easyrl.testing.vl_batch import VLSample, make_vl_batch

    samples = []
    for p in range(max(args.prompts // 2, 1)):
        gen = torch.Generator().manual_seed(p)
        pixels = (torch.rand(448, 448, 3, generator=gen) * 255).to(torch.uint8).numpy()
        sample = VLSample(f"Describe picture {p}.", images=[Image.fromarray(pixels)])
        samples.extend([sample] * args.n)
    return add_targets(make_vl_batch(processor, str(path), samples, response_length=args.response_max, seed=0))


def measure(model, data: DataProto, args, processor=None) -> list[dict]:
    """Alternate unshared and shared updates / log-prob passes ``repeats`` times; one row per variant."""
    timings = {False: {"update": [], "log_probs": []}, True: {"update": [], "log_probs": []}}
    tokens = {}
    for _ in range(args.repeats):
        for shared in (False, True):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
            config = actor_config(shared, args.micro_batch_size)
            actor = Actor(config, model, optimizer, mini_batch_size=len(data), processor=processor)
            start = time.perf_counter()
            metrics = actor.update_policy(data)
            timings[shared]["update"].append(time.perf_counter() - start)
            start = time.perf_counter()
            actor.compute_log_probs(data)
            timings[shared]["log_probs"].append(time.perf_counter() - start)
            print(
                f"{'shared' if shared else 'unshared'}: update {timings[shared]['update'][-1]:.1f} s, "
                f"log-probs {timings[shared]['log_probs'][-1]:.1f} s",
                flush=True,
            )
            if shared:
                ratio = metrics["actor/shared_prefix/token_ratio"]
                tokens[True] = round(ratio * int(data.batch["attention_mask"].sum()))
            else:
                tokens[False] = int(data.batch["attention_mask"].sum())
    rows = []
    for shared in (False, True):
        rows.append(
            {
                "variant": "shared" if shared else "unshared",
                "samples": len(data),
                "update_tokens": tokens[shared],
                "update_s": statistics.median(timings[shared]["update"]),
                "log_probs_s": statistics.median(timings[shared]["log_probs"]),
            }
        )
    plain, shared = rows
    shared["token_ratio"] = shared["update_tokens"] / plain["update_tokens"]
    shared["update_speedup"] = plain["update_s"] / shared["update_s"]
    shared["log_probs_speedup"] = plain["log_probs_s"] / shared["log_probs_s"]
    return rows


def run_text(args) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from easyrl.demo.smollm2 import ensure_smollm2

    path = ensure_smollm2()
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=attention_implementation()
    )
    data = text_batch(args, model.config.vocab_size)
    return [{"case": "text SmolLM2-135M", **row} for row in measure(model, data, args)]


def run_vl(args) -> list[dict]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from easyrl.demo.small_vlm import ensure_small_qwen2_5_vl
    from easyrl.testing.tiny_vlms import set_pixel_limits

    with tempfile.TemporaryDirectory() as folder:
        # a copy whose processor keeps 448 x 448 pictures whole (256 vision tokens; the builtin caps them lower)
        path = set_pixel_limits(shutil.copytree(ensure_small_qwen2_5_vl(), Path(folder) / "vl"), 3136, 448 * 448)
        processor = AutoProcessor.from_pretrained(path)
        model = AutoModelForImageTextToText.from_pretrained(
            path, dtype=torch.float32, attn_implementation=attention_implementation()
        )
        data = vl_batch(args, path, processor)
    pads = int((data.batch["input_ids"][0] == processor.image_token_id).sum())
    prompt = int(data.batch["attention_mask"][0, : -args.response_max].sum())
    return [
        {"case": f"vl Small-Qwen2.5-VL ({pads} of {prompt} prompt tokens are picture)", **row}
        for row in measure(model, data, args, processor)
    ]


def run_gpu(args) -> list[dict]:
    """A Qwen2.5-0.5B-shaped model (random weights, benchmarks/actor_update_gpu.py) on one GPU, FSDP2 bf16 as the
    worker builds it, micro-batches of ``--micro-batch-size``; prompts of ``--prompt-tokens``, responses of
    ``--response-min``..``--response-max`` tokens."""
    from easyrl.testing.single_rank import build_actor, one_rank_process_group
    from easyrl.utils import device

    from .actor_update_gpu import QWEN2_0_5B, build_model_folder

    data = text_batch(args, QWEN2_0_5B["vocab_size"]).to(device.get_torch_device())
    overrides = [
        f"worker.actor.micro_batch_size_per_device_for_update={args.micro_batch_size}",
        f"worker.actor.micro_batch_size_per_device_for_experience={args.micro_batch_size}",
        "worker.actor.dynamic_batching=false",
        "worker.actor.use_torch_compile=false",
        "worker.actor.fsdp.torch_dtype=fp32",
        "worker.actor.fsdp.mp_param_dtype=bf16",
        "worker.actor.fsdp.mp_reduce_dtype=fp32",
        "worker.actor.optim.lr=0",
    ]
    rows = []
    with tempfile.TemporaryDirectory() as folder, one_rank_process_group():
        path = build_model_folder(folder)
        for shared in (False, True):
            actor, module, _ = build_actor(
                path, [*overrides, f"worker.actor.shared_prefix={str(shared).lower()}"], batch_size=len(data)
            )
            actor.update_policy(data)  # warm-up: kernels, allocator, optimizer states
            timings = {"update": [], "log_probs": []}
            for _ in range(args.repeats):
                device.synchronize()
                start = time.perf_counter()
                metrics = actor.update_policy(data)
                device.synchronize()
                timings["update"].append(time.perf_counter() - start)
                start = time.perf_counter()
                actor.compute_log_probs(data)
                device.synchronize()
                timings["log_probs"].append(time.perf_counter() - start)
            ratio = metrics.get("actor/shared_prefix/token_ratio", 1.0)
            rows.append(
                {
                    "case": "gpu Qwen2.5-0.5B shape, bf16",
                    "variant": "shared" if shared else "unshared",
                    "samples": len(data),
                    "update_tokens": round(ratio * int(data.batch["attention_mask"].sum())),
                    "update_s": statistics.median(timings["update"]),
                    "log_probs_s": statistics.median(timings["log_probs"]),
                }
            )
            del actor, module
            device.empty_cache()
    plain, shared = rows
    shared["token_ratio"] = shared["update_tokens"] / plain["update_tokens"]
    shared["update_speedup"] = plain["update_s"] / shared["update_s"]
    shared["log_probs_speedup"] = plain["log_probs_s"] / shared["log_probs_s"]
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(0)
    print(describe_machine())
    rows = []
    if args.case in ("text", "both"):
        rows += run_text(args)
    if args.case in ("vl", "both"):
        rows += run_vl(args)
    if args.case == "gpu":
        rows += run_gpu(args)
    print_table(
        rows, title=f"shared prefixes: n={args.n}, micro-batches of {args.micro_batch_size} (CPU fp32, GPU bf16)"
    )
    append_result("prefix_grouper", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()

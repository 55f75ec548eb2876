"""The SFT update on CUDA (one rank, nccl, no Ray): multi-turn loss masks through padding-free varlen attention."""

import pytest
import torch

from easyrl.data.collate import sft_collate
from easyrl.testing.single_rank import build_actor


BF16 = [
    "worker.actor.fsdp.torch_dtype=fp32",
    "worker.actor.fsdp.mp_param_dtype=bf16",
    "worker.actor.use_torch_compile=false",
    "worker.actor.micro_batch_size_per_device_for_update=4",
    "worker.actor.optim.lr=1e-3",
]
FP32 = [*BF16[:1], "worker.actor.fsdp.mp_param_dtype=fp32", *BF16[2:]]


def conversations(count: int = 8, seed: int = 0) -> list[dict]:
    """Token sequences of 3 turns whose replies (the labelled spans) sit at different places in each row."""
    gen = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(count):
        lengths = torch.randint(8, 64, (4,), generator=gen).tolist()  # prompt, reply, user turn, reply
        ids = torch.randint(10, 32000, (sum(lengths),), generator=gen)
        mask = torch.cat([torch.full((n,), i % 2) for i, n in enumerate(lengths)])
        items.append({"input_ids": ids, "loss_mask": mask, "position_ids": torch.arange(len(ids))})
    return items


def plain_token_mean_nll(module, items) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for item in items:
            ids = item["input_ids"].cuda()
            logits = module(input_ids=ids[None]).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[1:], reduction="none")
            mask = item["loss_mask"][1:].cuda().bool()
            total, count = total + float(nll[mask].sum()), count + int(mask.sum())
    return total / count


def test_sft_first_step_loss_is_the_plain_token_mean_and_bf16_training_memorises(process_group, small_qwen2_path):
    items = conversations()
    batch = sft_collate(items, pad_token_id=0).to("cuda")
    actor, module, _ = build_actor(str(small_qwen2_path), FP32, batch_size=len(items))
    expected = plain_token_mean_nll(module, items)
    metrics = actor.update_sft(batch)
    assert metrics["sft/loss"] == pytest.approx(expected, rel=1e-4)

    actor, module, _ = build_actor(str(small_qwen2_path), BF16, batch_size=len(items))
    losses = [actor.update_sft(batch)["sft/loss"] for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0], losses

"""Loaders: seeded shuffling, exact mid-epoch resume from state_dict, full validation coverage."""

import torch

from easyrl.config import DataConfig
from easyrl.data.loader import create_dataloaders
from easyrl.protocol import DataProto


def arithmetic_config(**overrides) -> DataConfig:
    values = {
        "train_files": "builtin://arithmetic@train",
        "val_files": "builtin://arithmetic@test",
        "prompt_key": "problem",
        "answer_key": "answer",
        "max_prompt_length": 64,
        "rollout_batch_size": 8,
        "filter_overlong_prompts": False,
        "seed": 3,
    }
    return DataConfig(**{**values, **overrides})


def answers(batch: DataProto) -> list[str]:
    return list(batch.non_tensor_batch["ground_truth"])


def test_resumed_loader_yields_the_same_next_batch(tokenizer):
    config = arithmetic_config()
    loader, _ = create_dataloaders(config, tokenizer, None)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = loader.state_dict()
    expected = [next(iterator) for _ in range(2)]

    resumed, _ = create_dataloaders(config, tokenizer, None)
    resumed.load_state_dict(state)
    got = iter(resumed)
    for want in expected:
        batch = next(got)
        assert torch.equal(batch.batch["input_ids"], want.batch["input_ids"])
        assert answers(batch) == answers(want)


def test_shuffle_follows_the_seed(tokenizer):
    first = next(iter(create_dataloaders(arithmetic_config(), tokenizer, None)[0]))
    again = next(iter(create_dataloaders(arithmetic_config(), tokenizer, None)[0]))
    other = next(iter(create_dataloaders(arithmetic_config(seed=4), tokenizer, None)[0]))
    assert answers(first) == answers(again) and answers(first) != answers(other)


def test_validation_loader_covers_the_whole_set_in_one_batch(tokenizer):
    train_loader, val_loader = create_dataloaders(arithmetic_config(), tokenizer, None)
    batches = list(val_loader)
    assert len(batches) == 1 and len(batches[0]) == 128
    assert len(train_loader) == 4096 // 8


def test_validation_batches_keep_the_remainder(tokenizer):
    _, val_loader = create_dataloaders(arithmetic_config(val_batch_size=50), tokenizer, None)
    assert [len(batch) for batch in val_loader] == [50, 50, 28]

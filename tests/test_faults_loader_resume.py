"""The train loader's position, stored as JSON in a checkpoint, brings back the exact next batches in any epoch:
in a new process (a rerun) and in the same one (a worker restart reloads the loader it was iterating)."""

import json

import pytest

from easyrl.config import DataConfig
from easyrl.data.loader import create_dataloaders
from easyrl.utils.state_file import from_json_value, to_json_value


BATCHES_PER_EPOCH = 3


@pytest.fixture
def config(tmp_path) -> DataConfig:
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4 * BATCHES_PER_EPOCH)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return DataConfig(
        train_files=str(path),
        val_files="",
        prompt_key="problem",
        answer_key="answer",
        max_prompt_length=64,
        rollout_batch_size=4,
        filter_overlong_prompts=False,
        seed=11,
    )


def _answers(loader, count: int) -> list[list[str]]:
    """The ground truths of the next ``count`` batches, across epochs as the trainer draws them."""
    out = []
    while len(out) < count:
        for batch in loader:
            out.append(list(batch.non_tensor_batch["ground_truth"]))
            if len(out) == count:
                break
    return out


def _through_json(state: dict) -> dict:
    return from_json_value(json.loads(json.dumps(to_json_value(state))))


def test_a_position_in_the_second_epoch_resumes_in_a_new_loader_and_in_the_same_one(config, tokenizer):
    reference = _answers(create_dataloaders(config, tokenizer, None)[0], 3 * BATCHES_PER_EPOCH)
    assert reference[:BATCHES_PER_EPOCH] != reference[BATCHES_PER_EPOCH : 2 * BATCHES_PER_EPOCH]  # reshuffled

    loader, _ = create_dataloaders(config, tokenizer, None)
    iterator = iter(loader)
    for _ in range(BATCHES_PER_EPOCH):
        next(iterator)
    iterator = iter(loader)  # the second epoch
    next(iterator)
    saved = _through_json(loader.state_dict())  # after 4 batches
    next(iterator)  # the run goes on, then a worker dies

    rerun, _ = create_dataloaders(config, tokenizer, None)
    rerun.load_state_dict(saved)
    assert _answers(rerun, 4) == reference[4:8]

    loader.load_state_dict(saved)
    assert _answers(loader, 4) == reference[4:8]

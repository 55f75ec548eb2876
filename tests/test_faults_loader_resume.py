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


def test_the_epoch_a_reward_reads_counts_passes_and_a_changed_data_file_is_said(caplog):
    """`trainer_state.epoch` is the passes over the data (the loader's batches drawn in the pass under way, after a
    resume too), and a checkpoint of other rows than the data has now is said at the resume."""
    import logging
    from types import SimpleNamespace

    from torchdata.stateful_dataloader import StatefulDataLoader

    from easyrl.data.loader import batches_drawn, restore_position
    from easyrl.trainer.ray_trainer import PPOTrainer

    for workers in (0, 2):
        loader = StatefulDataLoader(list(range(10)), batch_size=2, num_workers=workers)
        batches = iter(loader)
        for _ in range(3):
            next(batches)
        assert batches_drawn(loader.state_dict()) == 3, workers
        del batches
    trainer = SimpleNamespace(train_loader=loader, training_steps=8, epoch=1, _epoch_batches=3)
    # mini-batches of 2 of 10 rows: 3 drawn in the second pass
    assert PPOTrainer._trainer_state(trainer, 4) == {"global_step": 4, "max_steps": 8, "epoch": 1.6}
    state = loader.state_dict()
    with caplog.at_level(logging.WARNING, logger="easyrl.data.loader"):
        restore_position(loader, state, 10, "ckpt/global_step_4")
        restore_position(loader, state, None, "ckpt/global_step_4")  # saved before the rows were kept
        assert not caplog.records
        restore_position(loader, state, 6, "ckpt/global_step_4")
    (record,) = caplog.records
    assert record.getMessage().startswith(
        "data.train_files has 10 usable rows and had 6 when ckpt/global_step_4 was saved: the data changed."
    )


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_position_past_the_end_of_fewer_rows_ends_the_epoch_under_way(caplog, shuffle):
    """A checkpoint saved 16 rows into its epoch, resumed on data that now has 13 (rows cleaned out of the file, the
    same command rerun): torchdata stopped the resume with a bare StopIteration while skipping to the position."""
    import logging

    from easyrl.data.loader import batches_drawn, restore_position, stateful_train_loader

    for workers in (0, 2):
        data = DataConfig(shuffle=shuffle, seed=5, dataloader_num_workers=workers)
        loader = stateful_train_loader(list(range(16)), 4, data, None)
        batches = iter(loader)
        for _ in range(4):
            next(batches)
        saved = _through_json(loader.state_dict())
        before = json.dumps(to_json_value(saved))
        smaller = stateful_train_loader(list(range(13)), 4, data, None)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="easyrl.data.loader"):
            loaded = restore_position(smaller, saved, 16, "ckpt/global_step_4")
        said = [record.getMessage() for record in caplog.records]
        assert said[0].startswith("data.train_files has 13 usable rows and had 16 when ckpt/global_step_4")
        assert said[1] == (
            "ckpt/global_step_4 was saved 16 rows into its epoch, past the end of the 13 usable rows "
            "data.train_files has now: that epoch ends here and the next one starts."
        )
        assert batches_drawn(loaded) == 3 and json.dumps(to_json_value(saved)) == before  # the saved state is kept
        assert list(smaller) == []  # the rest of the epoch under way
        epoch = [batch.tolist() for batch in smaller]  # the next one: whole batches of the new rows
        rows = [row for batch in epoch for row in batch]
        assert len(epoch) == 3 and len(set(rows)) == 12 and set(rows) <= set(range(13)), (shuffle, workers)
        if not shuffle:
            assert rows == list(range(12))


def test_rows_that_never_fill_a_batch_are_said_and_warned_of_when_unshuffled(caplog):
    import logging

    from easyrl.config import load_run_plan
    from easyrl.trainer.main import _say_rows_left_over

    def said(*overrides: str) -> list[tuple[int, str]]:
        batching = ["worker.rollout.n=2", "worker.actor.micro_batch_size_per_device_for_update=2"]
        plan = load_run_plan(["config=examples/smollm2_arithmetic_grpo.yaml", *batching, *overrides])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="easyrl.data.loader"):
            _say_rows_left_over(plan, 10)
        return [(record.levelno, record.getMessage()) for record in caplog.records]

    ((level, message),) = said("data.rollout_batch_size=4", "worker.actor.global_batch_size=4", "data.shuffle=false")
    assert level == logging.WARNING and message == (
        "data.train_files: 10 usable rows make 2 batches of data.rollout_batch_size=4 per epoch, and with "
        "data.shuffle=false the last 2 rows are never drawn. Make data.rollout_batch_size divide the rows, or set "
        "data.shuffle=true."
    )
    ((level, message),) = said("data.rollout_batch_size=4", "worker.actor.global_batch_size=4")
    assert level == logging.INFO and "2 rows, other ones each epoch (data.shuffle=true), are not drawn" in message
    # the loader draws mini-batches: what it leaves over is what they do not fill
    ((_, message),) = said(
        "data.rollout_batch_size=6",
        "worker.actor.global_batch_size=6",
        "data.mini_rollout_batch_size=3",
        "data.shuffle=false",
    )
    assert "make 3 batches of data.mini_rollout_batch_size=3 per epoch" in message and "the last 1 rows" in message
    assert said("data.rollout_batch_size=5", "worker.actor.global_batch_size=5") == []

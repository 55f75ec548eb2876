"""Overlapped reward scoring in real `easyrl train` runs (tiny model, one worker, vLLM rollout, a reference model for
the KL loss): the same seeds give the same samples, scores, losses and gradients with and without
`worker.reward.overlap`; with it, the step waits for a slow reward for less than the reward takes; online filtering
keeps waiting for the scores at once, as it must.

Each step generates in two rounds (`data.mini_rollout_batch_size=3` of 4 prompts; the second round's surplus
groups are dropped), so the overlapped path also puts the scores of several rounds back on the collected batch. The
reward (tests/data/sleepy_word_start_reward.py) sleeps 1 s per call. Three runs of 1-2 minutes each: marked slow; the
default suite covers overlapped scoring in test_reward_overlap.py and in the shared run of test_trainer_e2e.py
(overlap is the default).
"""

import math

import pytest

from tests.fixtures.trainer_runs import REPO_ROOT, TINY_RUN_OVERRIDES, metrics_by_step, run_training, train_args
from tests.test_trainer_resume import TIME_DEPENDENT_PREFIXES, _same


SLEEP_S = 1.0
ROUNDS = 2
SLEEPY_REWARD = REPO_ROOT / "tests" / "data" / "sleepy_word_start_reward.py"

OVERLAP_RUN_OVERRIDES = [arg for arg in TINY_RUN_OVERRIDES if not arg.startswith("worker.reward.reward_function=")] + [
    f"worker.reward.reward_function={SLEEPY_REWARD}:compute_score",
    f"worker.reward.reward_function_kwargs={{sleep_s: {SLEEP_S}}}",
    "algorithm.use_kl_loss=true",  # a reference pass for the scoring to overlap with
    "algorithm.disable_kl=false",
    "data.mini_rollout_batch_size=3",
    "worker.rollout.temperature=1.0",
    "worker.rollout.seed=3",
    "data.seed=5",
    "data.val_files=",
    "trainer.max_steps=2",
    "trainer.save_freq=0",
    "trainer.find_last_checkpoint=false",
    "trainer.logger=[file]",
]

# decoding, hand-overs between threads and Ray calls: what a step may wait beyond the scoring it could not hide
WAIT_SLACK_S = 0.5


def _run(model_path, root, extra: list[str]) -> dict[int, dict]:
    save_dir = root / "checkpoints"
    run_training(train_args(model_path, save_dir, OVERLAP_RUN_OVERRIDES + extra), root / "train.log")
    return metrics_by_step(save_dir)


@pytest.fixture(scope="module")
def sync_run(tiny_model_path, tmp_path_factory) -> dict[int, dict]:
    return _run(tiny_model_path, tmp_path_factory.mktemp("reward_sync"), ["worker.reward.overlap=false"])


@pytest.fixture(scope="module")
def overlap_run(tiny_model_path, tmp_path_factory) -> dict[int, dict]:
    return _run(tiny_model_path, tmp_path_factory.mktemp("reward_overlap"), ["worker.reward.overlap=true"])


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_scores_and_updates_are_the_same_with_and_without_overlap(sync_run, overlap_run):
    assert sorted(sync_run) == sorted(overlap_run) == [1, 2]
    for step in (1, 2):
        sync, overlap = sync_run[step], overlap_run[step]
        compared = sorted(name for name in sync if not name.startswith(TIME_DEPENDENT_PREFIXES))
        assert set(compared) == {name for name in overlap if not name.startswith(TIME_DEPENDENT_PREFIXES)}
        different = {
            name: (sync[name], overlap[name]) for name in compared if not _same(name, sync[name], overlap[name])
        }
        assert not different, f"step {step} differs with overlapped scoring: {different}"
        for name in ("reward/overall", "reward/word_share", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
            assert name in compared and math.isfinite(sync[name])
        assert sync["filter/rounds"] == ROUNDS and sync["reward/errors"] == sync["reward/timeouts"] == 0


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_step_waits_for_a_slow_reward_only_where_it_could_not_overlap(sync_run, overlap_run):
    for step in (1, 2):
        sync, overlap = sync_run[step], overlap_run[step]
        # both score two rounds of 1 s calls; without overlap the step waits for all of it
        for row in (sync, overlap):
            assert ROUNDS * SLEEP_S <= row["timing/reward"] < ROUNDS * SLEEP_S + 2.0
        assert sync["timing/reward_wait"] >= sync["timing/reward"] - 0.05
        # with it, the scoring runs behind the second round's generation and the reference pass; the step waits at
        # most for what the reference pass did not cover
        hidden = min(overlap["timing/ref_log_probs"], overlap["timing/reward"])
        assert overlap["timing/reward_wait"] <= overlap["timing/reward"] - hidden + WAIT_SLACK_S
        assert overlap["timing/reward_wait"] < overlap["timing/reward"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_online_filtering_waits_for_the_scores_before_the_log_prob_passes(tiny_model_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("reward_filtering")
    rows = _run(tiny_model_path, root, ["algorithm.online_filtering=true", "trainer.max_steps=1"])
    row = rows[1]
    # the groups were kept by their scores in the round that made them: scoring could not overlap anything
    assert row["timing/reward_wait"] >= row["timing/reward"] - 0.05 >= ROUNDS * SLEEP_S - 0.05
    assert row["filter/rounds"] >= ROUNDS
    counted = row["filter/kept_groups"] + row["filter/surplus_groups"] + row["filter/dropped_groups"]
    assert row["filter/kept_groups"] == 4 and counted == 3 * row["filter/rounds"]
    assert 0.0 <= row["reward/overall"] <= 1.0 and row["reward/errors"] == 0

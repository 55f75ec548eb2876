"""End to end: `easyrl train` on the tiny random model (Ray, 2 FSDP2 workers on gloo, vLLM rollout, reference model,
KL loss), 3 GRPO steps. What the run logged, what it saved, and that it trained."""

import json
import math
import re
from pathlib import Path

import pytest
import torch


RUN_TIMEOUT = 900  # the first test to ask for the shared run waits for it

# Every step logs these (the reward function scores `overall` and `word_share`).
STEP_METRICS = [
    "step",
    "reward/overall",
    "reward/word_share",
    "response_length/mean",
    "response_length/clip_ratio",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "timing/step",
    *(f"timing/{phase}" for phase in ("gen", "reward", "ref_log_probs", "adv", "update_actor")),
    "perf/throughput",
    "perf/mfu/actor",
    "rollout/logprob_abs_diff/mean",
    "rollout/gen_tokens_per_s",
    "rollout/response_length/max",
]
VALIDATION_METRICS = ["val/reward/overall", "val/reward/word_share", "val/response_length/mean"]


@pytest.mark.timeout(RUN_TIMEOUT)
def test_every_step_logs_rewards_losses_timings_and_throughput(tiny_grpo_run):
    metrics = tiny_grpo_run.metrics
    assert sorted(metrics) == [1, 2, 3]
    for step, row in metrics.items():
        missing = [name for name in STEP_METRICS if name not in row]
        assert not missing, f"step {step} lacks {missing}"
        assert row["step"] == step and type(row["step"]) is int  # "step": 1, not 1.0 (tools join on the text)
        assert row["actor/kl_coef"] == pytest.approx(1e-3)  # the KL loss's coefficient (algorithm.kl_coef)
    # no name is another's folder: MLflow's file store keeps `a/b` as a file, and cannot also hold `a/b/c`
    names = set().union(*metrics.values())
    assert not sorted((a, b) for a in names for b in names if b.startswith(a + "/"))


@pytest.mark.timeout(RUN_TIMEOUT)
def test_validation_runs_every_val_freq_steps_and_after_the_last_step(tiny_grpo_run):
    metrics = tiny_grpo_run.metrics  # val_freq=2, max_steps=3
    assert not any(name.startswith("val/") for name in metrics[1])
    for step in (2, 3):
        missing = [name for name in [*VALIDATION_METRICS, "timing/validation"] if name not in metrics[step]]
        assert not missing, f"step {step} lacks {missing}"
        assert 0.0 <= metrics[step]["val/reward/overall"] <= 1.0
        # one data source: its mean is the overall mean, the same number (not a float32 rounding of it)
        (source,) = [
            name
            for name in metrics[step]
            if name.startswith("val/") and name.count("/") == 2 and name.endswith("/reward")
        ]
        assert metrics[step][source] == metrics[step]["val/reward/overall"], source


@pytest.mark.timeout(RUN_TIMEOUT)
def test_each_validation_logs_the_same_samples_drawn_over_the_whole_set(tiny_grpo_run):
    import random

    from easyrl.data.synthetic import load_builtin
    from easyrl.trainer.ray_trainer import VAL_SAMPLES_SEED
    from tests.fixtures.trainer_runs import VAL_SAMPLES_LOGGED

    rows = [json.loads(line) for line in (tiny_grpo_run.save_dir / "generations.jsonl").read_text().splitlines()]
    problems = [row["problem"] for row in load_builtin("builtin://arithmetic_small@test")]  # one greedy sample each
    drawn = sorted(random.Random(VAL_SAMPLES_SEED).sample(range(len(problems)), VAL_SAMPLES_LOGGED))
    assert max(drawn) >= VAL_SAMPLES_LOGGED  # not the first rows: the draw spans the set
    for step in (2, 3):
        logged = [row for row in rows if row["step"] == step]
        assert len(logged) == VAL_SAMPLES_LOGGED, [row["step"] for row in rows]
        for row, position in zip(logged, drawn):
            assert problems[position] in row["prompt"], (step, position, row["prompt"])


@pytest.mark.timeout(RUN_TIMEOUT)
def test_the_engine_metrics_cover_both_workers_generations(tiny_grpo_run):
    """Each of the 2 workers generates for half the prompts; the rollout/* metrics were worker 0's half alone."""
    for step, row in tiny_grpo_run.metrics.items():
        assert row["rollout/gen_responses"] == 4 * 4, step  # data.rollout_batch_size x worker.rollout.n
        assert row["rollout/response_length/mean"] == pytest.approx(row["response_length/mean"]), step
        assert row["rollout/gen_tokens"] == pytest.approx(16 * row["response_length/mean"]), step
        assert row["rollout/gen_tokens_per_s"] == pytest.approx(row["rollout/gen_tokens"] / row["rollout/gen_seconds"])


def test_losses_gradients_and_rates_are_finite_and_in_range(tiny_grpo_run):
    vocab_entropy = math.log(49152)  # the tiny model shares SmolLM2's vocabulary
    for step, row in tiny_grpo_run.metrics.items():
        for name in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            assert math.isfinite(row[name]), f"step {step}: {name} = {row[name]}"
        assert row["actor/grad_norm"] > 0.0
        assert 0.0 < row["actor/entropy"] <= vocab_entropy + 1e-3
        assert 0.0 <= row["reward/overall"] <= 1.0
        assert 0.0 < row["response_length/mean"] <= 16
        assert 0.0 <= row["response_length/clip_ratio"] <= 1.0
        assert row["perf/throughput"] > 0.0
        assert 0.0 < row["perf/mfu/actor"] < 1.0
        assert all(row[f"timing/{phase}"] > 0.0 for phase in ("step", "gen", "update_actor"))
        # one optimizer step per batch (on-policy): no separate old-log-prob pass; vLLM and the actor agree in fp32
        assert "timing/old_log_probs" not in row
        assert 0.0 <= row["rollout/logprob_abs_diff/mean"] < 1e-3
        assert row["rollout/gen_tokens_per_s"] > 0.0
    # the engine starts from the checkpoint; from step 2 on a weight sync precedes each generation
    for step in (2, 3):
        assert tiny_grpo_run.metrics[step]["rollout/weight_sync_s"] > 0.0
        assert tiny_grpo_run.metrics[step]["rollout/weight_sync_gb"] > 0.0
    # lr warms up over lr_warmup_steps=2 (the recipe) to worker.actor.optim.lr=1e-3
    metrics = tiny_grpo_run.metrics
    assert metrics[1]["actor/lr"] == pytest.approx(5e-4)
    assert metrics[3]["actor/lr"] == pytest.approx(1e-3)


@pytest.mark.timeout(RUN_TIMEOUT)
def test_training_changes_the_actor_weights(tiny_grpo_run):
    from safetensors.torch import load_file

    from tests.fixtures.trainer_runs import checkpoint_weights

    initial = load_file(str(tiny_grpo_run.model_path / "model.safetensors"))
    trained = checkpoint_weights(tiny_grpo_run.save_dir / "global_step_3" / "actor")
    assert set(initial) <= set(trained)
    assert all(torch.isfinite(tensor).all() for tensor in trained.values())
    changed = [name for name in initial if not torch.equal(initial[name], trained[name])]
    # GRPO advantages are non-zero here (the word-share reward varies inside groups): every layer moves
    assert len(changed) >= len(initial) // 2, f"only {changed} changed"
    assert "model.embed_tokens.weight" in changed


@pytest.mark.timeout(RUN_TIMEOUT)
def test_save_limit_keeps_only_the_newest_checkpoints(tiny_grpo_run):
    root = Path(tiny_grpo_run.save_dir)  # save_freq=1, save_limit=2, 3 steps
    entries = {path.name for path in root.iterdir() if path.is_dir()}
    assert entries == {"global_step_2", "global_step_3", "logs"}
    assert (root / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    for step in (2, 3):
        folder = root / f"global_step_{step}"
        assert {"COMPLETE", "actor", "dataloader_state.json", "trainer_state.json", "config.yaml"} <= {
            p.name for p in folder.iterdir()
        }
        # the config it was trained with (a resume compares with it), the rows its data position counts
        assert (folder / "config.yaml").read_text() == (root / "config.yaml").read_text()
        rows = json.loads((folder / "trainer_state.json").read_text())["train_rows"]
        assert isinstance(rows, int) and rows >= 4


@pytest.mark.timeout(RUN_TIMEOUT)
def test_the_run_folder_keeps_the_config_it_ran_with(tiny_grpo_run):
    import yaml

    kept = yaml.safe_load((Path(tiny_grpo_run.save_dir) / "config.yaml").read_text())
    assert kept["worker"]["actor"]["model"]["model_path"] == str(tiny_grpo_run.model_path)
    assert (kept["trainer"]["max_steps"], kept["worker"]["rollout"]["n"], kept["algorithm"]["use_kl_loss"]) == (
        3,
        4,
        True,
    )


def test_ray_timeline_is_written_when_the_run_ends(tiny_grpo_run):
    import json

    events = json.loads((tiny_grpo_run.save_dir.parent / "timeline.json").read_text())
    # chrome://tracing events of the worker tasks the trainer dispatched
    names = {event.get("name", "") for event in events}
    assert any("update_actor" in name for name in names), sorted(names)[:20]
    assert any("generate_sequences" in name for name in names)


def test_console_shows_the_run_and_the_engine_logs_go_to_files(tiny_grpo_run):
    console = tiny_grpo_run.log_path.read_text()
    logs = tiny_grpo_run.save_dir / "logs"
    # one line per step on the console (the progress bar redraws with carriage returns between them), vLLM's INFO
    # chatter only in the workers' files
    assert re.findall(r"step (\d)/3 \|", console) == ["1", "2", "3"]
    assert not [line for line in re.split(r"[\r\n]", console) if " INFO " in line and "vllm" in line]
    worker_logs = sorted(logs.glob("actor_rollout_ref_*.log"))
    assert [path.name for path in worker_logs] == ["actor_rollout_ref_0.log", "actor_rollout_ref_1.log"]
    assert "vllm" in worker_logs[0].read_text()
    assert (logs / "driver.log").is_file()

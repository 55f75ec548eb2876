"""Reward curves drawn from metrics.jsonl."""

import json

import pytest
from PIL import Image

from easyrl.trainer.plot import (
    FIGURE_DPI,
    FIGURE_SIZE_INCHES,
    curve_panels,
    plot_training_curves,
    read_metrics,
    summarize_progress,
)


def _write_metrics(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_curves_png_has_the_figure_size(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{"step": 0, "val/reward/overall": 0.1, "val/reward/accuracy": 0.05}]
    rows += [{"step": s, "critic/score/mean": 0.1 * s, "response_length/mean": 40 + s} for s in range(1, 6)]
    rows += [{"step": 5, "val/reward/overall": 0.4, "val/reward/accuracy": 0.3}]
    metrics_path = tmp_path / "metrics.jsonl"
    _write_metrics(metrics_path, rows)

    png = plot_training_curves(str(metrics_path))
    assert png == str(tmp_path / "curves.png")
    with Image.open(png) as image:
        assert image.format == "PNG"
        assert image.size == (FIGURE_SIZE_INCHES[0] * FIGURE_DPI, FIGURE_SIZE_INCHES[1] * FIGURE_DPI)
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_read_metrics_merges_rows_of_a_step_and_keeps_the_latest(tmp_path):
    metrics_path = tmp_path / "metrics.jsonl"
    rows = [{"step": 2, "a": 1.0}, {"step": 1, "a": 0.5}, {"step": 2, "a": 3.0, "b": 4.0}]  # a resumed run re-logs 2
    _write_metrics(metrics_path, rows)
    assert read_metrics(str(metrics_path)) == {1: {"a": 0.5}, 2: {"a": 3.0, "b": 4.0}}


def test_progress_summary_compares_first_and_last_validation_and_train_windows(tmp_path):
    metrics_path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "val/reward/accuracy": 0.25}]
    rows += [{"step": s, "reward/overall": 0.1 * s, "reward/accuracy": 0.05 * s} for s in range(1, 9)]
    rows += [{"step": 8, "val/reward/accuracy": 0.5}]
    _write_metrics(metrics_path, rows)
    lines = summarize_progress(str(metrics_path))
    assert "val/reward/accuracy: 0.250 (step 0) -> 0.500 (step 8)" in lines
    # train windows: mean of steps 1-3 = 0.2, mean of steps 6-8 = 0.7
    assert "reward/overall: 0.200 (steps 1-3) -> 0.700 (steps 6-8)" in lines
    assert "reward/accuracy: 0.100 (steps 1-3) -> 0.350 (steps 6-8)" in lines


def test_progress_summary_leaves_out_failure_counts(tmp_path):
    metrics_path = tmp_path / "metrics.jsonl"
    counts = {"val/reward/errors": 1.0, "val/reward/timeouts": 0.0, "val/reward/judge_errors": 2.0}
    rows = [{"step": 0, "val/reward/overall": 0.1, **counts}, {"step": 4, "val/reward/overall": 0.3, **counts}]
    _write_metrics(metrics_path, rows)
    lines = summarize_progress(str(metrics_path))
    assert lines == ["val/reward/overall: 0.100 (step 0) -> 0.300 (step 4)"]


def test_an_sft_run_draws_its_losses_and_an_rl_run_the_scores_of_the_samples_generated(tmp_path):
    rows = [{"step": 0, "val/loss": 1.65}]
    rows += [{"step": s, "sft/loss": 1.5 / s, "actor/lr": 5e-5, "sft/tokens": 220.0} for s in range(1, 5)]
    rows += [{"step": 4, "val/loss": 0.9}]
    _write_metrics(tmp_path / "metrics.jsonl", rows)
    panels = curve_panels(read_metrics(str(tmp_path / "metrics.jsonl")))
    assert [title for title, _ in panels] == ["train loss", "validation loss", "learning rate"]
    assert panels[0][1] == {"sft/loss": ([1, 2, 3, 4], [1.5, 0.75, 0.5, 0.375])}
    assert panels[1][1] == {"val/loss": ([0, 4], [1.65, 0.9])}
    lines = summarize_progress(str(tmp_path / "metrics.jsonl"))
    assert lines == ["val/loss: 1.650 (step 0) -> 0.900 (step 4)", "sft/loss: 1.125 (steps 1-2) -> 0.438 (steps 3-4)"]

    # the train panel's lines cover the same samples, every one generated (critic/score/* covers the kept groups)
    rl = [
        {
            "step": s,
            "reward/overall": 0.1 * s,
            "reward/accuracy": 0.2,
            "critic/score/mean": 0.9,
            "response_length/mean": 4,
        }
        for s in range(1, 3)
    ]
    _write_metrics(tmp_path / "rl.jsonl", rl)
    panels = curve_panels(read_metrics(str(tmp_path / "rl.jsonl")))
    titles = ["train reward (every sample generated)", "validation", "mean response length (tokens)"]
    assert [title for title, _ in panels] == titles
    assert list(panels[0][1]) == ["reward/overall", "reward/accuracy"] and panels[1][1] == {}

"""Training curves as a PNG, from the ``metrics.jsonl`` the file logger writes: an RL run's rewards, validation
scores and response length; an SFT run's train loss, validation loss and learning rate.

python -m easyrl.trainer.plot checkpoints/<project>/<experiment>/metrics.jsonl [out.png]
"""

import json
import os
import sys


# Train curves drawn when present: the reward function's overall score and named scores, all over the same samples
# (every sample a step generated: with online filtering critic/score/* covers only the groups kept, so it is not
# drawn beside them), as the end-of-run summary reports them.
TRAIN_CURVE_KEYS = ("reward/overall", "reward/accuracy", "reward/format")
TRAIN_PANEL_TITLE = "train reward (every sample generated)"
RESPONSE_LENGTH_KEY = "response_length/mean"
# an SFT run's metrics (easyrl sft): its panels are losses, not rewards
SFT_LOSS_KEY = "sft/loss"
SFT_PANELS = (((SFT_LOSS_KEY,), "train loss"), (("val/loss",), "validation loss"), (("actor/lr",), "learning rate"))
# Validation metrics whose names contain one of these are drawn in the validation panel.
VAL_CURVE_WORDS = ("reward", "score", "acc", "loss")
FIGURE_SIZE_INCHES = (15, 4)
FIGURE_DPI = 100


def read_metrics(metrics_path: str) -> dict[int, dict[str, float]]:
    """``{step: metrics}`` merged over all rows of a step; a later row wins (a resumed run re-logs its steps)."""
    by_step: dict[int, dict[str, float]] = {}
    with open(metrics_path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                by_step.setdefault(int(row.pop("step")), {}).update(row)
    return dict(sorted(by_step.items()))


def _series(by_step: dict[int, dict[str, float]], key: str) -> tuple[list[int], list[float]]:
    points = [(step, row[key]) for step, row in by_step.items() if isinstance(row.get(key), (int, float))]
    return [step for step, _ in points], [value for _, value in points]


def _val_keys(by_step: dict[int, dict[str, float]]) -> list[str]:
    keys = {key for row in by_step.values() for key in row}
    scores = (key for key in keys if key.startswith("val/") and any(word in key for word in VAL_CURVE_WORDS))
    return sorted(key for key in scores if not key.endswith(("errors", "/timeouts")))  # counts, not scores


# Train scores summarised at the end of a run, averaged over this many first and last steps (one step is noisy).
SUMMARY_WINDOW = 3


def summarize_progress(metrics_path: str) -> list[str]:
    """One line per score: validation scores at their first and last evaluation, train scores averaged over the
    first and last ``SUMMARY_WINDOW`` steps. What a user reads to see whether the run learned."""
    by_step = read_metrics(metrics_path)
    lines = []
    for key in _val_keys(by_step):
        steps, values = _series(by_step, key)
        if len(values) >= 2:
            lines.append(f"{key}: {values[0]:.3f} (step {steps[0]}) -> {values[-1]:.3f} (step {steps[-1]})")
    for key in (*TRAIN_CURVE_KEYS, SFT_LOSS_KEY):
        steps, values = _series(by_step, key)
        window = min(SUMMARY_WINDOW, len(values) // 2)
        if window:
            first, last = sum(values[:window]) / window, sum(values[-window:]) / window
            lines.append(
                f"{key}: {first:.3f} (steps {steps[0]}-{steps[window - 1]}) -> {last:.3f} "
                f"(steps {steps[-window]}-{steps[-1]})"
            )
    return lines


def curve_panels(by_step: dict[int, dict[str, float]]) -> list[tuple[str, dict[str, tuple[list, list]]]]:
    """The three panels' (title, {legend label: (steps, values)}): train reward, validation scores, mean response
    length; for an SFT run, train loss, validation loss, learning rate. A panel may be empty (no data yet)."""
    if any(SFT_LOSS_KEY in row for row in by_step.values()):
        layout = [(title, keys) for keys, title in SFT_PANELS]
    else:
        layout = [
            (TRAIN_PANEL_TITLE, TRAIN_CURVE_KEYS),
            ("validation", _val_keys(by_step)),
            ("mean response length (tokens)", [RESPONSE_LENGTH_KEY]),
        ]
    panels = []
    for title, keys in layout:
        series = {key: _series(by_step, key) for key in keys}
        panels.append((title, {label: points for label, points in series.items() if points[0]}))
    return panels


def plot_training_curves(metrics_path: str, output_path: str | None = None) -> str:
    """Draw ``curve_panels`` side by side; returns the PNG path (``curves.png`` beside the metrics by default)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    output_path = output_path or os.path.join(os.path.dirname(os.path.abspath(metrics_path)), "curves.png")
    fig, axes = plt.subplots(1, 3, figsize=FIGURE_SIZE_INCHES, dpi=FIGURE_DPI)
    for ax, (title, series) in zip(axes, curve_panels(read_metrics(metrics_path))):
        for label, (steps, values) in series.items():
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
        if series:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    fig.savefig(output_path)
    plt.close(fig)
    return output_path


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m easyrl.trainer.plot METRICS_JSONL [OUTPUT_PNG]")
    print(plot_training_curves(*sys.argv[1:]))

"""One compact line per step on stdout, under a progress bar over all steps."""

from .base import Logger, RunInfo
from .registry import register_logger


# (label, metric) pairs shown when present, in this order; every `val/` metric is shown too.
CONSOLE_METRICS = (
    ("score", "critic/score/mean"),
    ("reward", "critic/rewards/mean"),
    ("acc", "reward/accuracy"),
    ("format", "reward/format"),
    ("resp_len", "response_length/mean"),
    ("len_cut", "response_length/clip_ratio"),  # share of responses cut at max_response_length, not PPO clipping
    ("sft_loss", "sft/loss"),
    ("pg_loss", "actor/pg_loss"),
    ("kl", "actor/kl_loss"),
    ("entropy", "actor/entropy"),
    ("grad_norm", "actor/grad_norm"),
    ("grad_norm", "sft/grad_norm"),
    ("vf_loss", "critic/vf_loss"),
    ("mfu", "perf/mfu/actor"),
    ("tok/s/dev", "perf/throughput"),
    ("step_s", "timing/step"),
)
# Characters of each field shown when printing a sample generation.
_SAMPLE_FIELD_CHARS = 240


def format_console_line(metrics: dict[str, float], step: int, total_steps: int | None = None) -> str:
    """``step 3/100 | score 0.25 | resp_len 45.2 | ... | val/accuracy 0.31``."""
    parts = [f"step {step}/{total_steps}" if total_steps else f"step {step}"]
    filtered = "filter/kept_groups" in metrics
    if filtered:
        # kept: the groups trained; surplus passed the filter beyond the batch (generated and dropped)
        seen = sum(metrics.get(f"filter/{key}", 0) for key in ("kept_groups", "surplus_groups", "dropped_groups"))
        parts.append(f"kept {metrics['filter/kept_groups']:.0f}/{seen:.0f} groups")
    # online filtering: score and reward (critic/*) cover the kept groups only, acc and format (reward/*) every
    # sample generated; the labels say which, or a kept score of 0.5 beside an acc of 0.1 reads as a contradiction
    parts += [
        f"{'kept_' if filtered and key.startswith('critic/') else ''}{label} {metrics[key]:.4g}"
        for label, key in CONSOLE_METRICS
        if key in metrics
    ]
    parts += [f"{key} {value:.4g}" for key, value in metrics.items() if key.startswith("val/")]
    return " | ".join(parts)


def _shorten(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _SAMPLE_FIELD_CHARS else text[: _SAMPLE_FIELD_CHARS - 3] + "..."


@register_logger("console")
class ConsoleLogger(Logger):
    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        from tqdm import tqdm

        self._tqdm = tqdm
        # Started when the first step is logged, at that step: the rate and time left count only the steps timed by
        # the bar (the first step also pays for engine start and compilation; a resumed run starts mid-way).
        self.bar = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._tqdm.write(format_console_line(metrics, step, self.run.total_steps))
        if self.bar is None:
            self.bar = self._tqdm(
                total=self.run.total_steps,
                initial=step,
                desc=self.run.experiment_name,
                unit="step",
                dynamic_ncols=True,
            )
        if step > self.bar.n:
            self.bar.update(step - self.bar.n)

    def log_generations(self, samples: list[dict], step: int) -> None:
        # The first sample only: enough to watch the outputs change without flooding the terminal.
        fields = " | ".join(f"{key}: {_shorten(value)}" for key, value in samples[0].items())
        self._tqdm.write(f"[generation, step {step}] {fields}")

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.close()
